"""Sharded training (trainer=fsdp_cpu: FSDP2 on 2 CPU processes, gloo), run as a user runs it: the CLI.

With the same seed and global batch, an RM, SFT and DPO job sharded over 2 processes ends with the same weights
and logs the same losses as the single-process job, up to float rounding: the reduce-scatter averages the
gradients of the two half-batches as DDP's all-reduce does, but sums in another order (tolerance 1e-5 on the
weights, as for trainer=ddp_cpu). The saved artifact is a full Hugging Face folder that loads on one process.
"""

from __future__ import annotations

import pytest

from tests.test_ddp import _history, _max_weight_diff, _run, _runs

pytestmark = pytest.mark.slow  # trains models: deselect with -m 'not slow'

TOL = 1e-5


def _same_losses(tmp_path, stage: str, key: str, n: int) -> None:
    r1, r2 = _runs(tmp_path, "one", stage), _runs(tmp_path, "two", stage)
    assert len(r2) == 1 and r2.iloc[0]["status"] == "FINISHED"  # rank 1 opened no run of its own
    h1 = _history(tmp_path, "one", r1.iloc[0]["run_id"], key)
    h2 = _history(tmp_path, "two", r2.iloc[0]["run_id"], key)
    assert [s for s, _ in h1] == [s for s, _ in h2] and len(h1) == n
    assert [v for _, v in h1] == pytest.approx([v for _, v in h2], abs=TOL)


def _one_and_sharded(tmp_path, session_cache, args: tuple, weights: str, stage: str, key: str, n: int,
                     baseline: tuple = ()):
    """The job `args` on `baseline` (one process by default) and on trainer=fsdp_cpu: the same weights (file
    `weights` of the artifact, to TOL) and the same `n` values of `key`; returns both job folders."""
    one = _run(tmp_path, session_cache, "one", *args, *baseline)
    two = _run(tmp_path, session_cache, "two", *args, "trainer=fsdp_cpu")
    diff = _max_weight_diff(one / "artifact" / weights, two / "artifact" / weights)
    assert diff < TOL, diff
    _same_losses(tmp_path, stage, key, n)
    return one, two


def test_sharded_rm_on_two_processes_matches_one_process(tmp_path, session_cache):
    args = ("algo=rm", "reward_model.steps=4", "reward_model.batch_size=8", "reward_model.norm_samples=64")
    _, two = _one_and_sharded(tmp_path, session_cache, args, "member_0/model.safetensors", "rm", "loss/rm", 4)
    m1, m2 = (_runs(tmp_path, n, "rm").iloc[0] for n in ("one", "two"))
    for k in ("param_bytes", "grad_bytes", "optimizer_bytes"):  # each rank holds about half of the trained state
        ratio = m2[f"metrics.memory/{k}"] / m1[f"metrics.memory/{k}"]
        assert 0.45 <= ratio <= 0.6, (k, ratio)
    # rank 0 evaluated the gathered model: the same held-out accuracy
    assert m1["metrics.rm/accuracy"] == pytest.approx(m2["metrics.rm/accuracy"], abs=1e-6)
    assert not list(two.glob(".rank*"))


def test_sharded_dpo_on_two_processes_matches_one_process(tmp_path, session_cache):
    from transformers import AutoModelForCausalLM

    args = ("algo=dpo", "algo.steps=4", "algo.batch_size=8")
    _, two = _one_and_sharded(tmp_path, session_cache, args, "model.safetensors", "dpo", "loss/dpo", 4)
    h1 = _history(tmp_path, "one", _runs(tmp_path, "one", "dpo").iloc[0]["run_id"], "eval/gold_reward")
    h2 = _history(tmp_path, "two", _runs(tmp_path, "two", "dpo").iloc[0]["run_id"], "eval/gold_reward")
    assert [s for s, _ in h1] == [s for s, _ in h2]  # evaluated at the same steps, by rank 0, with the full policy
    assert [v for _, v in h1] == pytest.approx([v for _, v in h2], abs=1e-3)
    assert AutoModelForCausalLM.from_pretrained(two / "artifact") is not None  # a full folder, on one process


def test_sharded_ppo_on_two_processes_matches_one_process(tmp_path, session_cache):
    """PPO with a critic of its own: policy and critic sharded, sampled whole (sharding.gathered). Rank 1 samples
    its own stream, so the two jobs draw different responses: equality is checked against the same job on
    trainer=ddp_cpu, which splits each step's batch the same way."""
    args = ("algo=ppo", "algo.steps=2", "algo.batch_size=8", "reward_model.steps=20", "reward_model.norm_samples=64")
    ddp, two = _one_and_sharded(tmp_path, session_cache, args, "model.safetensors", "ppo", "objective/kl", 2,
                                baseline=("trainer=ddp_cpu",))
    for key in ("loss/policy", "loss/value"):
        _same_losses(tmp_path, "ppo", key, 2)
    assert not list(two.glob(".rank*"))
    import torch  # the Lightning checkpoint (PPO's resume point) holds the full weights, as trainer=ddp_cpu's does

    c1, c2 = (torch.load(d / "artifact/ppo_last.ckpt", weights_only=False)["state_dict"] for d in (ddp, two))
    assert {k: v.shape for k, v in c1.items()} == {k: v.shape for k, v in c2.items()}
    assert max((c1[k].float() - c2[k].float()).abs().max().item() for k in c1) < TOL


def test_sharded_sft_on_two_processes_matches_one_process(tmp_path, session_cache):
    """SFT's loss is a mean over the batch's response tokens, which the two halves of a batch split unevenly: each
    rank divides its token sum by the global batch's count (CausalLMModule), so the curves agree with one process."""
    args = ("algo=sft", "sft.steps=4", "sft.batch_size=8", "trainer.log_every_n_steps=1")
    _one_and_sharded(tmp_path, session_cache, args, "model.safetensors", "sft", "loss/lm", 4)


@pytest.mark.parametrize("preset", ["fsdp_cpu", "ddp_cpu"])
def test_a_distributed_preset_on_one_process_runs_as_one_process(tmp_path, session_cache, preset):
    """trainer=fsdp (or ddp) on a machine with one GPU is one process under a distributed strategy; Lightning would
    then inject its DistributedSampler into the loaders' GlobalBatchSampler and stop with a TypeError (seen on one
    H200). Here the CPU twin on one process: it runs, and trains the weights the plain single-process job trains."""
    args = ("algo=rm", "reward_model.steps=2", "reward_model.batch_size=8", "reward_model.norm_samples=64")
    one = _run(tmp_path, session_cache, "one", *args)
    single = _run(tmp_path, session_cache, "single", *args, f"trainer={preset}", "trainer.devices=1")
    weights = "member_0/model.safetensors"
    assert _max_weight_diff(one / "artifact" / weights, single / "artifact" / weights) < TOL
