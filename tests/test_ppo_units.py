"""PPO's passes and update without training anything upstream: packed rows (``algo.packing``) and minibatches
trimmed to their own longest prompt and response (``algo.trim_minibatches``) give the padded log-probs, values,
losses and gradients, and the shared-trunk critic (``algo.critic=shared``) reads the policy's own pass. Tiny
random models of both families."""

from __future__ import annotations

import shutil

import pytest
import torch

from rlhf_lab.algorithms import ppo
from rlhf_lab.models.actor_critic import lm_forward
from rlhf_lab.algorithms.ppo import StepTimer
from rlhf_lab.config.world import gold_weights
from rlhf_lab.models.sampling import trim_padding
from rlhf_lab.models.batching import prompt_groups
from rlhf_lab.stages import ppo as ppo_stage


def test_trim_padding_by_hand():
    q_ids = torch.tensor([[0, 0, 0, 5, 6], [0, 0, 7, 8, 9], [0, 0, 0, 0, 4]])
    q_mask = (q_ids != 0).long()
    r_ids = torch.tensor([[1, 2, 0, 0], [3, 0, 0, 0], [4, 5, 6, 0]])
    r_mask = (r_ids != 0).long()
    qi, qm, ri, rm = trim_padding(q_ids, q_mask, r_ids, r_mask)
    assert qi.tolist() == [[0, 5, 6], [7, 8, 9], [0, 0, 4]] and qm.tolist() == [[0, 1, 1], [1, 1, 1], [0, 0, 1]]
    assert ri.tolist() == [[1, 2, 0], [3, 0, 0], [4, 5, 6]] and rm.tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1]]
    full = trim_padding(q_ids[1:2], q_mask[1:2], r_ids[2:3], r_mask[2:3])  # nothing to trim
    assert [t.shape for t in full] == [(1, 3), (1, 3), (1, 3), (1, 3)]


def _module(cfg, tok, path):
    policy, reference, critic = ppo_stage.build_models(cfg.algo, path, tok)
    module = ppo.PPOModule(policy, reference, critic, tok, None, lambda s: [], cfg.algo, cfg.kl, cfg.generation,
                           gold_weights(cfg))
    return module.eval()


def rollout(tok, q_len: list[int], r_len: list[int], seed: int = 0):
    """Left-padded prompts and right-padded responses of these lengths (random tokens), as ``sample`` returns them."""
    g = torch.Generator().manual_seed(seed)
    q_len, r_len = torch.tensor(q_len), torch.tensor(r_len)
    B, P, T = len(q_len), int(q_len.max()), int(r_len.max())
    q_mask = (torch.arange(P)[None, :] >= P - q_len[:, None]).long()
    r_mask = (torch.arange(T)[None, :] < r_len[:, None]).long()
    q_ids = torch.where(q_mask.bool(), torch.randint(4, len(tok), (B, P), generator=g), tok.pad_token_id)
    r_ids = torch.where(r_mask.bool(), torch.randint(4, len(tok), (B, T), generator=g), tok.pad_token_id)
    return q_ids, q_mask, r_ids, r_mask


@pytest.mark.parametrize("fam,critic,kl_in", [("a", "policy", "reward"), ("b", "policy", "loss"),
                                              ("a", "shared", "reward"), ("b", "rm", "reward"), ("a", "none", "loss")])
def test_packed_and_trimmed_passes_give_the_padded_losses_and_gradients(tiny_cfg, checkpoints, fam, critic, kl_in):
    from rlhf_lab.models import families as F_

    tok, path = checkpoints[fam]
    over = [f"algo.critic={critic}", f"algo.kl_in={kl_in}", "algo.entropy_coef=0.01"]
    if kl_in == "loss":
        over += ["algo.kl_estimator=k3", "algo.loss_agg=seq_mean_token_sum_norm"]
    torch.manual_seed(0)
    cfg = tiny_cfg(*over)
    scorer = None
    if critic == "rm":  # the critic's trunk is the RM's
        from rlhf_lab.models.reward import RewardScorer

        scorer = RewardScorer([F_.load_sequence_scorer(path, tok)], tok)
    policy, reference, crit = ppo_stage.build_models(cfg.algo, path, tok, scorer)
    module = ppo.PPOModule(policy, reference, crit, tok, None, lambda s: [], cfg.algo, cfg.kl, cfg.generation,
                           gold_weights(cfg)).eval()
    with torch.no_grad():  # the policy moves away from the reference, the value head from zero
        for p in list(module.policy.parameters()) + list((module.critic or torch.nn.Linear(1, 1)).parameters()):
            p.add_(0.05 * torch.randn_like(p))
    B, T = 8, 10
    qr = rollout(tok, [3, 7, 2, 5, 7, 4, 3, 2], [10, 4, 6, 3, 10, 5, 2, 7])
    mask = qr[3]
    passes = {}
    for packing in (False, True):
        module.a.packing = packing
        with torch.no_grad():
            passes[packing] = (*module.policy_forward(*qr), module.reference_logprobs(*qr))
    assert module._packing_checked
    for padded, packed in zip(passes[False], passes[True]):
        if padded is not None:
            assert torch.allclose(packed * mask, padded * mask, atol=1e-5)
    old_logp, _, old_values, ref_logp = passes[False]
    old_logp = old_logp + 0.1 * torch.randn(B, T) * mask  # ratios away from 1: clipping acts
    old_values = old_values if old_values is not None else torch.zeros(B, T)
    advantages, returns = torch.randn(B, T) * mask, torch.randn(B, T) * mask
    idx = torch.tensor([5, 2, 6, 3])  # prompts of at most 5 tokens of 7, responses of at most 6 of 10
    assert [t.shape[1] for t in trim_padding(*(x[idx] for x in qr))] == [5, 5, 6, 6]
    params = [p for p in module.parameters() if p.requires_grad]
    out = {}
    for packing, trim in ((False, False), (False, True), (True, False), (True, True)):
        module.a.packing, module.a.trim_minibatches = packing, trim
        module.zero_grad()
        loss, st = module.minibatch_loss(qr, idx, old_logp, ref_logp, old_values, advantages, returns, 0.1)
        loss.backward()
        out[packing, trim] = (st, [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params])
    base_st, base_g = out[False, False]
    assert any(g.abs().sum() > 0 for g in base_g)
    for key, (st, grads) in out.items():
        assert st.keys() == base_st.keys()
        for k in base_st:
            assert float(st[k]) == pytest.approx(float(base_st[k]), abs=1e-6), (key, k)
        for g, g0 in zip(grads, base_g):
            assert torch.allclose(g, g0, atol=1e-6, rtol=1e-5), key


def test_prompt_groups_by_hand():
    q_ids = torch.tensor([[0, 5, 6], [7, 8, 9], [0, 5, 6], [0, 5, 6], [7, 8, 9], [5, 5, 6]])
    first, group = prompt_groups(q_ids, (q_ids != 0).long())
    assert sorted(first.tolist()) == [0, 1, 5]
    assert [first[g].item() for g in group] == [0, 1, 0, 0, 1, 5]  # each row points at the first row of its prompt


@pytest.mark.parametrize("fam,over", [
    ("a", ["algo.critic=policy"]), ("b", ["algo.critic=shared"]),
    ("a", ["algo.critic=none", "algo.reference.kind=lora_disabled", "algo.lora.r=8"])])
def test_shared_prompt_passes_give_the_packed_logprobs_and_values(tiny_cfg, checkpoints, fam, over):
    """algo.shared_prompt: each distinct prompt run once for its rows in the passes without gradients (policy,
    critic, reference) gives the packed passes' log-probs, entropies and values to float noise."""
    tok, path = checkpoints[fam]
    torch.manual_seed(0)
    cfg = tiny_cfg(*over, "algo.entropy_coef=0.01", "algo.kl_in=loss", "algo.kl_estimator=k3")
    policy, reference, crit = ppo_stage.build_models(cfg.algo, path, tok)
    module = ppo.PPOModule(policy, reference, crit, tok, None, lambda s: [], cfg.algo, cfg.kl, cfg.generation,
                           gold_weights(cfg)).eval()
    with torch.no_grad():
        for p in [p for p in module.parameters() if p.requires_grad]:
            p.add_(0.05 * torch.randn_like(p))
    q_ids, q_mask, r_ids, r_mask = rollout(tok, [7, 4], [10, 10])  # two prompts, each sampled 4 times
    r_ids, r_mask = rollout(tok, [1] * 8, [10, 4, 6, 3, 10, 5, 2, 7], seed=1)[2:]
    qr = (q_ids.repeat_interleave(4, 0), q_mask.repeat_interleave(4, 0), r_ids, r_mask)
    passes = {}
    for shared in (False, True):
        module.a.shared_prompt = shared
        with torch.no_grad():
            assert (module.shared_prompts(*qr[:2]) is not None) == shared
            passes[shared] = (*module.policy_forward(*qr), module.reference_logprobs(*qr))
    for packed, one_prompt_pass in zip(passes[False], passes[True]):
        if packed is not None:
            assert torch.allclose(one_prompt_pass * r_mask, packed * r_mask, atol=1e-5)
    with torch.enable_grad():  # the update's passes run packed
        assert module.shared_prompts(*qr[:2]) is None
    module.a.compile = True  # the compiled trunk takes packed rows
    with torch.no_grad():
        assert module.shared_prompts(*qr[:2]) is None
    module.a.compile = False
    distinct = rollout(tok, [3, 5, 2], [4, 4, 4])  # no prompt shared: the packed passes
    with torch.no_grad():
        assert module.shared_prompts(*distinct[:2]) is None


def test_shared_critic_reads_the_policy_trunk_in_one_pass(tiny_cfg, checkpoints):
    """algo.critic=shared: a value head (no backbone of its own) on the hidden states of the policy's pass; the
    value loss reaches the policy's trunk; the optimiser's critic group is the head alone."""
    tok, path = checkpoints["a"]
    cfg = tiny_cfg("algo.critic=shared")
    module = _module(cfg, tok, path)
    separate = _module(tiny_cfg("algo.critic=policy"), tok, path)
    assert module.critic.backbone is None and separate.critic.backbone is not None
    assert ppo_stage.model_bytes(module.policy, module.critic) < 0.6 * ppo_stage.model_bytes(separate.policy,
                                                                                             separate.critic)
    with torch.no_grad():
        module.critic.head.weight.normal_(0, 1.0)
    qr = rollout(tok, [3, 5, 2, 4], [6, 2, 5, 1])
    assert module.packing()  # checks the trunk once (three passes of its own), before the count
    calls = []
    h = module.policy.model.register_forward_hook(lambda *a: calls.append(1))
    logp, _, values = module.policy_forward(*qr)
    h.remove()
    assert len(calls) == 1  # one trunk pass for the log-probs and the values
    _, hidden = lm_forward(module.policy, torch.cat(qr[0::2], 1), torch.cat(qr[1::2], 1), qr[0].shape[1])
    assert torch.allclose(values * qr[3], module.critic.head(hidden).squeeze(-1) * qr[3], atol=1e-5)
    (values * qr[3]).sum().backward()  # a value loss alone
    assert module.policy.model.layers[0].mlp.up_proj.weight.grad.abs().sum() > 0
    groups = module.configure_optimizers().param_groups
    assert [len(g["params"]) for g in groups][1] == 2 and groups[1]["lr"] == cfg.algo.critic_lr  # weight, bias
    assert all(g["fused"] for g in groups)  # lm.adamw: torch's fused kernel on plain CPU tensors


def test_adamw_is_the_fused_kernel_and_the_loops_update_to_float32_rounding():
    from rlhf_lab.algorithms.lm import adamw

    torch.manual_seed(0)
    start = [torch.randn(30, 20), torch.randn(20)]
    grads = [[torch.randn_like(p) for p in start] for _ in range(5)]
    out = {}
    for name, make in (("fused", lambda ps: adamw([{"params": ps, "lr": 1e-3}], eps=1e-5, weight_decay=0.0)),
                       ("loop", lambda ps: torch.optim.AdamW(ps, lr=1e-3, eps=1e-5, weight_decay=0.0, foreach=False))):
        ps = [torch.nn.Parameter(p.clone()) for p in start]
        opt = make(ps)
        for g in grads:
            for p, gg in zip(ps, g):
                p.grad = gg.clone()
            opt.step()
        out[name] = (opt, ps)
    assert out["fused"][0].param_groups[0]["fused"] and not out["loop"][0].param_groups[0]["fused"]
    moved = [(a - s).abs().max() for a, s in zip(out["loop"][1], start)]
    assert all(m > 1e-3 for m in moved)  # five steps of lr 1e-3 moved every parameter
    assert all(torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(out["fused"][1], out["loop"][1]))


@pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
                    reason="torch.compile on CPU needs a C++ compiler (algo.compile refuses to run without one)")
def test_compiled_passes_give_the_eager_losses_and_gradients(tiny_cfg, checkpoints):
    """algo.compile=true: the packed passes' trunks through torch.compile (dynamic shapes) give the eager log-probs,
    values, reference log-probs, losses and gradients to float noise, for rollouts of two different shapes."""
    tok, path = checkpoints["a"]
    cfg = tiny_cfg("algo.critic=policy")
    module = _module(cfg, tok, path)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # the policy moves away from the reference, the value head from zero
        for p in list(module.policy.parameters()) + list(module.critic.parameters()):
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    params = [p for p in module.parameters() if p.requires_grad]
    rollouts = [rollout(tok, [3, 7, 2, 5], [10, 4, 6, 3], seed=0), rollout(tok, [6, 2, 4, 4, 3], [5, 8, 2, 7, 3], 1)]
    for qr in rollouts:
        B, T = qr[2].shape
        mask = qr[3]
        out = {}
        for compiled in (False, True):
            module.a.compile = compiled
            assert module.compiled is compiled
            with torch.no_grad():
                passes = (*module.policy_forward(*qr), module.reference_logprobs(*qr))
            old_logp, _, old_values, ref_logp = passes
            g = torch.Generator().manual_seed(2)
            adv, ret = torch.randn(B, T, generator=g) * mask, torch.randn(B, T, generator=g) * mask
            module.zero_grad()
            loss, st = module.minibatch_loss(qr, torch.arange(B), old_logp.detach() - 0.05 * mask, ref_logp,
                                             old_values, adv, ret, 0.1)
            loss.backward()
            out[compiled] = (passes, st, [p.grad.clone() for p in params if p.grad is not None])
        (p0, st0, g0), (p1, st1, g1) = out[False], out[True]
        for a, b in zip(p0, p1):
            assert torch.allclose(a * mask, b * mask, atol=1e-5)
        for k in st0:
            assert float(st1[k]) == pytest.approx(float(st0[k]), abs=1e-5), k
        assert len(g0) == len(g1) and all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(g0, g1))


def test_compile_needs_packing_and_a_cpp_compiler(tiny_cfg, monkeypatch):
    from rlhf_lab.config.errors import ConfigError

    ppo_stage.check_compile(tiny_cfg("algo.compile=false", "algo.packing=false"))  # off: nothing to check
    with pytest.raises(ConfigError, match="algo.compile must be false unless algo.packing=true"):
        ppo_stage.check_compile(tiny_cfg("algo.compile=true", "algo.packing=false"))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(ppo_stage.shutil, "which", lambda name: None)
    with pytest.raises(ConfigError, match="C\\+\\+ compiler"):
        ppo_stage.check_compile(tiny_cfg("algo.compile=true"))
    ppo_stage.check_compile(tiny_cfg("algo.compile=true", "trainer=gpu"))  # inductor builds no C++ kernels there


def test_the_job_summarys_time_line_splits_the_steps_by_the_timed_phases():
    """Every StepTimer phase is summed into phase_totals under its time/<phase>_s key and named in the summary's
    time line; the rest of the steps is what the phases leave of the fit's training time."""
    time_summary = ppo_stage.time_summary
    totals = {f"time/{p}_s": float(i + 1) for i, p in enumerate(StepTimer.PHASES)}  # 1 + 2 + 3 + 4 = 10 s
    line = time_summary({"time/startup_s": 3.0}, train_s=14.5, eval_s=2.0, stage="ppo", step_totals=totals)
    assert line == ("start-up 3 s, PPO steps 12 s (generation 1.0 s, scoring 2.0 s, no-grad passes (old, reference, "
                    "values) 3.0 s, update 4.0 s, the rest 2.5 s), evaluations 2 s")
    del totals["time/update_s"]  # a phase missing: no split rather than a wrong one
    assert time_summary({}, train_s=14.5, eval_s=2.0, stage="ppo", step_totals=totals) == (
        "PPO steps 12 s, evaluations 2 s")
