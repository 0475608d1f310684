"""``generation.dtype``: the PPO family's rollouts from a low-precision copy of the policy
(:mod:`rlhf_lab.models.rollout_copy`). The copy follows the policy's updates, its samples' log-probs are near the
policy's (the off-policy gap the docs quote), a PPO step with it runs, and the key is typed and refused where it
cannot work. Tiny models (the ``checkpoints`` fixture)."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_lab.config import checks as C
from rlhf_lab.config.errors import ConfigError
from rlhf_lab.models import rollout_copy as RC
from rlhf_lab.models.sampling import response_logprobs, sample
from rlhf_lab.world import ReviewGenerator

PROMPTS = [p[:40] for p, _ in ReviewGenerator(2).reviews(16)]


def policy_of(tiny_cfg, checkpoints, *over: str):
    from rlhf_lab.stages import ppo as ppo_stage

    tok, path = checkpoints["a"]
    cfg = tiny_cfg(*over)
    torch.manual_seed(0)
    policy, reference, critic = ppo_stage.build_models(cfg.algo, path, tok)
    return cfg, tok, policy, reference, critic


@pytest.mark.parametrize("lora", [0, 4])
def test_the_copy_holds_the_bf16_cast_of_the_policy_after_an_optimizer_step(tiny_cfg, checkpoints, lora):
    _, tok, policy, _, _ = policy_of(tiny_cfg, checkpoints, f"algo.lora.r={lora}")
    rc = RC.RolloutCopy(policy, "bfloat16")
    assert rc.copy is not policy and {p.dtype for p in rc.copy.parameters()} == {torch.bfloat16}
    assert not any(p.requires_grad for p in rc.copy.parameters())
    trained = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert len(rc.pairs) == len(trained) > 0 and (lora == 0) == (len(trained) == len(list(policy.parameters())))
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=0.05)
    ids = torch.randint(4, len(tok), (2, 8))
    policy(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    stale = dict(rc.copy.named_parameters())
    assert any(not torch.equal(stale[n], p.detach().to(torch.bfloat16)) for n, p in policy.named_parameters()
               if n in trained)  # the step moved the policy away from the copy: a copy never refreshed fails below
    model = rc.model()
    for name, p in model.named_parameters():
        assert torch.equal(p, dict(policy.named_parameters())[name].detach().to(torch.bfloat16)), name
    for (name, b), (_, b0) in zip(model.named_buffers(), policy.named_buffers()):
        assert b.dtype == b0.dtype and torch.equal(b, b0), name  # buffers (rotary frequencies) as the policy's


def test_the_bf16_copys_samples_are_near_the_policys_log_probs(checkpoints):
    """The off-policy gap of ``generation.dtype=bfloat16``: mean |log π_bf16(y_t) − log π_fp32(y_t)| over the
    sampled tokens, on the tiny Llama-style policy with its weights perturbed (std 0.1, so that its distributions
    are not near uniform). Measured 0.0025 nats (max 0.011) over 331 tokens; the untrained policy's is 0.0003."""
    from rlhf_lab.models import families as F

    tok, path = checkpoints["a"]
    torch.manual_seed(0)
    policy = F.load_causal_lm(path, tok).eval()
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.1 * torch.randn_like(p))
    rc = RC.RolloutCopy(policy, "bfloat16")
    torch.manual_seed(1)
    ro = sample(rc.model(), tok, PROMPTS, 24)
    qr = (ro.query_ids, ro.query_mask, ro.response_ids, ro.response_mask)
    with torch.no_grad():
        gap = (response_logprobs(policy, *qr) - response_logprobs(rc.copy, *qr)).abs()[ro.response_mask.bool()]
    assert gap.numel() > 100
    assert 0 < float(gap.mean()) < 0.01 and float(gap.max()) < 0.1, (float(gap.mean()), float(gap.max()))


def test_a_ppo_step_samples_from_the_bf16_copy_and_logs_finite_metrics(tiny_cfg, checkpoints, monkeypatch):
    """Two PPO steps of the module (Lightning, no job) with ``generation.dtype=bfloat16``: the rollouts come from the
    copy, every other pass from the fp32 policy, and the logged metrics are finite."""
    import lightning as L

    from rlhf_lab.algorithms import ppo
    from rlhf_lab.runs import active_run

    cfg, tok, policy, reference, critic = policy_of(tiny_cfg, checkpoints, "generation.dtype=bfloat16",
                                                    "algo.batch_size=4", "algo.num_minibatches=2",
                                                    "generation.max_new_tokens=8")
    logged, sampled = [], []
    monkeypatch.setattr(active_run, "log_metrics", lambda m, step=None, synchronous=True: logged.append(m))
    real_sample = ppo.sample
    monkeypatch.setattr(ppo, "sample", lambda model, *a, **k: sampled.append(model) or real_sample(model, *a, **k))
    scorer = lambda prompts, responses, ended: torch.tensor([len(r) / 10.0 for r in responses])  # noqa: E731
    module = ppo.PPOModule(policy, reference, critic, tok, scorer, lambda step: PROMPTS[:4], cfg.algo, cfg.kl,
                           cfg.generation, None)
    L.Trainer(max_steps=2 * module.updates_per_step, accelerator="cpu", devices=1, logger=False,
              enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False).fit(module)
    assert len(logged) == 2 and len(sampled) == 2
    assert all(m is module.rollout_copy.copy for m in sampled)
    assert {p.dtype for p in sampled[0].parameters()} == {torch.bfloat16}
    assert {p.dtype for p in module.policy.parameters()} == {torch.float32}
    assert all(p.dtype == torch.float32 for p in module.parameters())  # the copy: no submodule, not in a checkpoint
    assert all(math.isfinite(v) for v in logged[-1].values()) and "loss/policy" in logged[-1]


def test_the_key_is_typed_and_refused_where_it_cannot_work(monkeypatch):
    from rlhf_lab.stages.pipeline import generation_spec
    from tests.conftest import compose_cfg

    assert compose_cfg([]).generation.dtype is None  # the default: the policy itself, today's tokens
    with pytest.raises(Exception) as exc:
        compose_cfg(["generation.dtype=bf16"])
    assert C.composition_error_line(exc.value).startswith("generation.dtype must be one of auto, float32, bfloat16")
    bf16 = compose_cfg(["generation.dtype=bfloat16"])
    C.validate(bf16)
    assert generation_spec(bf16) == generation_spec(compose_cfg([]))  # no upstream artifact rebuilt for it
    for over, why in ((["generation.dtype=auto"], "null (the policy's own dtype)"),
                      (["generation.dtype=bfloat16", "trainer=fsdp_cpu"], "null with trainer=fsdp / fsdp_cpu"),
                      (["generation.dtype=bfloat16", "algo=dpo", "algo.online=true"],
                       "null with algo=dpo algo.online=true")):
        with pytest.raises(ConfigError) as err:
            C.validate(compose_cfg(over))
        assert str(err.value).startswith("generation.dtype") and why in str(err.value), str(err.value)
    monkeypatch.setattr(RC, "is_sharded", lambda model: True)  # a policy sharded by a caller of the API
    with pytest.raises(ConfigError, match="generation.dtype.*trainer=fsdp"):
        RC.RolloutCopy(torch.nn.Linear(2, 2), "bfloat16")
    with pytest.raises(ConfigError, match="generation.dtype"):
        RC.torch_dtype("auto")


def test_a_jobs_rollout_dtype_is_not_its_golds_covers(tiny_cfg):
    """The covers of a gold RM (``gold=rm_world``) are one per study: a job's ``generation.dtype`` does not reach
    them."""
    from rlhf_lab.config.keys import NOT_COMPUTED, drop_keys, to_plain
    from rlhf_lab.stages import gold as G
    from tests.test_gold import COVERED

    plain, bf16 = tiny_cfg(*COVERED), tiny_cfg("generation.dtype=bfloat16", *COVERED)
    cover = plain.gold.build.covers[0]
    assert bf16.generation.dtype == "bfloat16" and G.cover_config(bf16, cover).generation.dtype is None
    assert drop_keys(to_plain(G.cover_config(bf16, cover)), NOT_COMPUTED) == drop_keys(
        to_plain(G.cover_config(plain, cover)), NOT_COMPUTED)
