"""Multi-process training (trainer=ddp_cpu: 2 CPU processes, gloo), run as a user runs it: the CLI.

RM and DPO on 2 processes must match 1 process with the same global batch (each rank takes its half of
every batch, and DDP averages the gradients), and PPO on 2 processes must finish and log once.
"""

from __future__ import annotations

import mlflow
import pytest
import torch
from safetensors.torch import load_file

from rlhf_lab.runs.distributed import GlobalBatchSampler, loader
from tests.conftest import TINY
from tests.test_cli import cli

pytestmark = pytest.mark.slow  # trains models: deselect with -m 'not slow'


def _run(tmp_path, session_cache, name: str, *overrides: str):
    r = cli(*TINY, *overrides, f"cache_dir={session_cache}", f"tracking.uri=sqlite:///{tmp_path / name}.db",
            f"hydra.run.dir={tmp_path / name}", cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return tmp_path / name


def _runs(tmp_path, name: str, stage: str):
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / name}.db")
    runs = mlflow.search_runs(experiment_names=["rlhf-lab"])
    return runs[runs["tags.rlhf_lab.stage"] == stage]


def _history(tmp_path, name: str, run_id: str, key: str) -> list[tuple[int, float]]:
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / name}.db")
    return [(m.step, m.value) for m in mlflow.MlflowClient().get_metric_history(run_id, key)]


def _max_weight_diff(a_file, b_file) -> float:
    a, b = load_file(a_file), load_file(b_file)
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_global_batch_sampler_splits_each_batch_and_matches_a_plain_loader():
    ex = list(range(37))
    plain = torch.utils.data.DataLoader(ex, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(3),
                                        collate_fn=list)
    ours = loader(ex, 8, torch.Generator().manual_seed(3), list)
    assert [b for _ in range(2) for b in plain] == [b for _ in range(2) for b in ours]  # one process: no change
    one = list(GlobalBatchSampler(37, 8, torch.Generator().manual_seed(3), world=1, rank_=0))
    r0 = list(GlobalBatchSampler(37, 8, torch.Generator().manual_seed(3), world=2, rank_=0))
    r1 = list(GlobalBatchSampler(37, 8, torch.Generator().manual_seed(3), world=2, rank_=1))
    assert len(r0) == len(r1) == len(one)
    for b, b0, b1 in zip(one, r0, r1):
        assert sorted(b0 + b1) == sorted(b) and not set(b0) & set(b1)
    with pytest.raises(ValueError, match="algo.batch_size=7 .* multiple of the number of processes"):
        GlobalBatchSampler(37, 7, torch.Generator(), world=2, rank_=0, key="algo.batch_size")


def test_rm_on_two_processes_matches_one_process(tmp_path, session_cache):
    args = ("algo=rm", "reward_model.steps=4", "reward_model.batch_size=8", "reward_model.norm_samples=64")
    one = _run(tmp_path, session_cache, "one", *args)
    two = _run(tmp_path, session_cache, "two", *args, "trainer=ddp_cpu")
    diff = _max_weight_diff(one / "artifact/member_0/model.safetensors", two / "artifact/member_0/model.safetensors")
    assert diff < 1e-5, diff
    r1, r2 = _runs(tmp_path, "one", "rm"), _runs(tmp_path, "two", "rm")
    assert len(r2) == 1 and r2.iloc[0]["status"] == "FINISHED"  # rank 1 opened no run of its own
    h1 = _history(tmp_path, "one", r1.iloc[0]["run_id"], "loss/rm")
    h2 = _history(tmp_path, "two", r2.iloc[0]["run_id"], "loss/rm")
    assert len(h1) == len(h2) == 4
    for (s1, v1), (s2, v2) in zip(h1, h2):  # rank-mean of half-batch means = the global batch's mean
        assert s1 == s2 and v1 == pytest.approx(v2, abs=1e-5)
    assert not list(two.glob(".rank*"))  # the other rank's scratch output is cleaned up


def test_dpo_on_two_processes_matches_one_process(tmp_path, session_cache):
    args = ("algo=dpo", "algo.steps=4", "algo.batch_size=8")
    one = _run(tmp_path, session_cache, "one", *args)
    two = _run(tmp_path, session_cache, "two", *args, "trainer=ddp_cpu")
    diff = _max_weight_diff(one / "artifact/model.safetensors", two / "artifact/model.safetensors")
    assert diff < 1e-5, diff
    r1, r2 = _runs(tmp_path, "one", "dpo"), _runs(tmp_path, "two", "dpo")
    assert len(r2) == 1
    h1 = _history(tmp_path, "one", r1.iloc[0]["run_id"], "loss/dpo")
    h2 = _history(tmp_path, "two", r2.iloc[0]["run_id"], "loss/dpo")
    assert [s for s, _ in h1] == [s for s, _ in h2] and len(h1) == 4
    assert [v for _, v in h1] == pytest.approx([v for _, v in h2], abs=1e-5)


def test_ppo_on_two_processes_finishes_and_logs_once(tmp_path, session_cache):
    out = _run(tmp_path, session_cache, "two", "algo=ppo", "algo.steps=3", "algo.batch_size=8",
               "reward_model.steps=20", "reward_model.norm_samples=64", "trainer=ddp_cpu")
    runs = _runs(tmp_path, "two", "ppo")
    assert len(runs) == 1 and runs.iloc[0]["status"] == "FINISHED"
    kl = _history(tmp_path, "two", runs.iloc[0]["run_id"], "objective/kl")
    assert [s for s, _ in kl] == [1, 2, 3]  # one value per PPO step: the mean over ranks, logged by rank 0
    gold = _history(tmp_path, "two", runs.iloc[0]["run_id"], "eval/gold_reward")
    assert [s for s, _ in gold] == [0, 3]  # evaluated once at the start and once at the end, by rank 0
    assert (out / "artifact/model.safetensors").exists() and (out / "summary.json").exists()
    assert not list(out.glob(".rank*"))


def test_ppo_batch_must_split_across_processes(tiny_cfg, monkeypatch):
    from rlhf_lab.algorithms.ppo import PPOModule

    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = tiny_cfg("algo=ppo", "algo.batch_size=6", "algo.samples_per_prompt=2")
    with pytest.raises(ValueError, match="times the number of processes"):
        PPOModule(None, None, None, None, None, None, cfg.algo, cfg.kl, cfg.generation, None)


def _fail_on_rank_1(cfg, out_dir):
    """A job whose rank 1 dies at once while rank 0 waits (as it would in a collective)."""
    import os
    import time

    if os.environ["RANK"] == "1":
        raise SystemExit(3)
    while True:
        time.sleep(0.05)


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_a_dead_rank_stops_the_job_instead_of_hanging(tmp_path, sigint):
    """Also where SIGINT is ignored (a process started in the background by a non-interactive shell), where
    the watchdog's interrupt would do nothing and it would end the whole process after its grace period."""
    import signal

    from omegaconf import OmegaConf

    from rlhf_lab.runs.distributed import launch

    cfg = OmegaConf.create({"trainer": {"devices": 2, "strategy": "ddp", "num_nodes": 1}})
    yaml = OmegaConf.to_yaml(cfg)
    before = signal.signal(signal.SIGINT, signal.SIG_IGN if sigint == "ignored" else signal.default_int_handler)
    try:
        with pytest.raises(RuntimeError, match=r"rank\(s\) \[\(1, 3\)\] of the job exited with an error"):
            launch(dict(cfg.trainer), tmp_path, lambda out: _fail_on_rank_1(cfg, out), f"{__name__}:_fail_on_rank_1",
                   lambda: yaml)
        assert signal.getsignal(signal.SIGINT) == (signal.SIG_IGN if sigint == "ignored" else signal.default_int_handler)
    finally:
        signal.signal(signal.SIGINT, before)
    assert not (tmp_path / ".rank_config.yaml").exists()


def test_the_rendezvous_port_is_free_and_outside_the_range_the_kernel_hands_out():
    """A port from the kernel's ephemeral range could be handed to another socket (an outgoing connection, another
    job's gloo) between its choice and rank 0's bind, seconds later: the ranks' port is drawn below that range."""
    import socket

    from rlhf_lab.runs import distributed

    ports = [distributed.rendezvous_port() for _ in range(5)]
    assert all(20000 <= p < 32768 for p in ports) and len(set(ports)) > 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))  # free: rank 0 can bind it
