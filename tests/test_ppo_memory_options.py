"""PPO's memory options for full fine-tuning (issue 70), each checked at a tiny shape against what it must keep:
``algo.critic=shared`` (the value head on the policy's trunk: the combined loss's gradient is the policy loss's plus
``vf_coef`` times the value loss's), ``algo.reference.dtype`` (a bf16 reference's log-probs near fp32's, the KL in
fp32), ``algo.activation_checkpointing`` (the same gradients, fewer saved activations) and ``algo.optimizer=adafactor``
(one step by hand). Their memory and time: ``python -m benchmarks.ops.memory --options`` (benchmarks/README.md)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from rlhf_lab.algorithms import ppo
from rlhf_lab.algorithms.kl import kl_estimators
from rlhf_lab.algorithms.rl_math import ppo_value_loss
from rlhf_lab.config.errors import ConfigError
from rlhf_lab.config.ppo_rules import check_ppo_rules
from rlhf_lab.config.world import gold_weights
from rlhf_lab.stages import ppo as ppo_stage
from tests.test_ppo_units import rollout  # random padded prompts and responses, as sample returns them


def module_for(cfg, tok, path, noise: float = 0.05):
    """PPOModule as the stage builds it (``build_models``), its trained weights moved off their init (seeded)."""
    torch.manual_seed(0)
    policy, reference, critic = ppo_stage.build_models(cfg.algo, path, tok)
    module = ppo.PPOModule(policy, reference, critic, tok, None, lambda s: [], cfg.algo, cfg.kl, cfg.generation,
                           gold_weights(cfg)).eval()
    with torch.no_grad():  # the policy away from the reference, the value head away from zero
        for p in list(module.policy.parameters()) + list((module.critic or torch.nn.Linear(1, 1)).parameters()):
            p.add_(noise * torch.randn_like(p))
    return module


def update_inputs(module, qr):
    """The no-grad pass's old log-probs (moved off so that the ratio clips), values, reference log-probs, and
    random advantages and returns: the arguments of ``minibatch_loss`` after ``qr``."""
    mask = qr[3]
    with torch.no_grad():
        old_logp, _, old_values = module.policy_forward(*qr)
        ref_logp = module.reference_logprobs(*qr)
    g = torch.Generator().manual_seed(1)
    B, T = mask.shape
    old_logp = old_logp + 0.1 * torch.randn(B, T, generator=g) * mask
    old_values = old_values if old_values is not None else torch.zeros(B, T)
    return old_logp, ref_logp, old_values, torch.randn(B, T, generator=g) * mask, torch.randn(B, T, generator=g) * mask


def grads(module, loss) -> dict[str, torch.Tensor]:
    module.zero_grad()
    loss.backward()
    return {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
            for n, p in module.named_parameters() if p.requires_grad}


QR = ([3, 7, 2, 5, 7, 4, 3, 2], [10, 4, 6, 3, 10, 5, 2, 7])
IDX = torch.tensor([5, 2, 6, 3])
BF16_LOGP_TOL = 0.01  # nats; measured at this shape: 1.2e-3 (both families). bf16 keeps 8 significant bits


def test_the_defaults_are_todays_ppo(tiny_cfg):
    a = tiny_cfg().algo
    assert (a.activation_checkpointing, str(a.optimizer), a.reference.dtype, str(a.critic)) == (
        False, "adamw", None, "policy")


def test_shared_critic_under_full_fine_tuning_adds_vf_coef_times_the_value_gradient(tiny_cfg, checkpoints):
    """``algo.critic=shared`` with full fine-tuning (``algo.lora.r=0``, a copied reference): one trunk, the value head
    on its last hidden state. The loss L = L_clip + c·L_V (CleanRL's and OpenAI Baselines' shared-network PPO): its
    gradient is L_clip's plus c times L_V's, L_V's reaches the trunk (the hidden state is not detached) and
    L_clip's never reaches the head."""
    tok, path = checkpoints["a"]
    cfg = tiny_cfg("algo.critic=shared", "algo.lora.r=0", "algo.reference.kind=copy", "algo.vf_coef=0.5",
                   "algo.packing=false", "algo.trim_minibatches=false")
    module = module_for(cfg, tok, path)
    assert module.critic.backbone is None and module.reference is not module.policy
    assert all(p.requires_grad for p in module.policy.parameters())  # full fine-tuning
    qr = rollout(tok, *QR)
    inputs = update_inputs(module, qr)
    total = grads(module, module.minibatch_loss(qr, IDX, *inputs, 0.1)[0])
    module.a.vf_coef = 0.0
    policy_only = grads(module, module.minibatch_loss(qr, IDX, *inputs, 0.1)[0])
    old_logp, ref_logp, old_values, advantages, returns = inputs
    rows = tuple(x[IDX] for x in qr)
    _, _, values = module.policy_forward(*rows)  # the value loss by hand, on the same rows
    vf, _ = ppo_value_loss(values, old_values[IDX], returns[IDX], rows[3], cfg.algo.value_clip_eps)
    value_only = grads(module, vf)
    for name, g in total.items():
        assert torch.allclose(g, policy_only[name] + 0.5 * value_only[name], atol=1e-6, rtol=1e-5), name
    trunk = "policy.model.layers.0.mlp.up_proj.weight"
    assert value_only[trunk].abs().sum() > 0 and not torch.allclose(total[trunk], policy_only[trunk])
    assert all(policy_only[n].abs().sum() == 0 for n in ("critic.head.weight", "critic.head.bias"))


@pytest.mark.parametrize("fam", ["a", "b"])
def test_a_bf16_reference_gives_fp32_logprobs_near_the_fp32_references_and_the_kl_in_fp32(tiny_cfg, checkpoints, fam):
    """``algo.reference.dtype=bfloat16`` (kind=copy): the reference's weights in bf16, the policy's in fp32; its
    log-probs come from logits cast to fp32, within BF16_LOGP_TOL nats of the fp32 reference's, packed or not, and the
    per-token KL is computed in fp32 from them. With ``kind=lora_disabled`` it is refused in one line."""
    tok, path = checkpoints[fam]
    over = ("algo.critic=none", "algo.lora.r=0", "algo.reference.kind=copy")
    fp32 = module_for(tiny_cfg(*over), tok, path)
    bf16 = module_for(tiny_cfg(*over, "algo.reference.dtype=bfloat16"), tok, path)
    assert {p.dtype for p in bf16.reference.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in bf16.policy.parameters()} == {torch.float32}
    weight_bytes = lambda m: sum(p.numel() * p.element_size() for p in m.parameters())  # noqa: E731
    assert 2 * weight_bytes(bf16.reference) == weight_bytes(fp32.reference)
    qr = rollout(tok, *QR)
    mask = qr[3]
    for packing in (False, True):
        fp32.a.packing = bf16.a.packing = packing
        with torch.no_grad():
            exact, rounded = fp32.reference_logprobs(*qr), bf16.reference_logprobs(*qr)
            policy_logp = fp32.policy_forward(*qr)[0]
        assert rounded.dtype == torch.float32
        err = float(((rounded - exact) * mask).abs().max())
        assert 0 < err < BF16_LOGP_TOL, (packing, err)  # rounded, not by much
        kl = kl_estimators(policy_logp, rounded, "k3")
        assert kl.dtype == torch.float32
    cfg = tiny_cfg("algo.lora.r=16", "algo.reference.kind=lora_disabled", "algo.reference.dtype=bfloat16")
    with pytest.raises(ConfigError, match="algo.reference.dtype"):
        check_ppo_rules(cfg.algo)


@pytest.mark.parametrize("fam,critic", [("a", "policy"), ("b", "policy"), ("a", "shared")])
def test_activation_checkpointing_gives_the_same_gradients_and_keeps_fewer_activations(tiny_cfg, checkpoints, fam,
                                                                                       critic):
    """``algo.activation_checkpointing=true``: the policy's decoder layers (and the critic's own trunk's) recompute
    their activations in the backward: the update's loss and gradients as without it (float tolerance), padded and
    packed, with fewer saved tensor elements in the autograd graph; the no-grad passes are left as they were."""
    tok, path = checkpoints[fam]
    over = (f"algo.critic={critic}", "algo.lora.r=0", "algo.reference.kind=copy", "algo.entropy_coef=0.01")
    plain = module_for(tiny_cfg(*over), tok, path)
    ckpt = module_for(tiny_cfg(*over, "algo.activation_checkpointing=true"), tok, path)
    assert len(ckpt._checkpointed) == (4 if critic == "policy" else 2)  # 2 layers a trunk
    qr = rollout(tok, *QR)
    inputs = update_inputs(plain, qr)
    for packing in (False, True):
        out = {}
        for name, module in (("plain", plain), ("checkpointed", ckpt)):
            module.a.packing = packing
            module.eval()  # as training_step: the whole module in eval mode (policy_forward sets the layers' flag)
            saved = [0]

            def pack(t, saved=saved):
                saved[0] += t.numel()
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss, _ = module.minibatch_loss(qr, IDX, *inputs, 0.1)
            out[name] = (float(loss), grads(module, loss), saved[0])
        (l0, g0, s0), (l1, g1, s1) = out["plain"], out["checkpointed"]
        assert l1 == pytest.approx(l0, abs=1e-6)
        for n in g0:
            assert torch.allclose(g1[n], g0[n], atol=1e-6, rtol=1e-5), (packing, n)
        assert s1 < 0.8 * s0, (packing, s0, s1)  # the layers' activations are not kept
    assert not any(m.training for m in ckpt.modules() if all(m is not x for x in ckpt._checkpointed))  # no dropout


def test_adafactor_steps_as_by_hand_and_keeps_factored_state(tiny_cfg, checkpoints):
    """``algo.optimizer=adafactor``: ``configure_optimizers`` gives torch's Adafactor with the policy's and the
    critic's learning rates. Two steps on a 2-parameter problem by hand (torch's algorithm: no first moment; the
    second moment v_t = (1 − t^−0.8)·v_{t−1} + t^−0.8·g_t², so v_1 = g_1²; u = g/√v, divided by max(1, RMS(u));
    w −= min(lr, 1/√t)·max(1e-3, RMS(w))·u); and a weight matrix keeps a row and a column vector, not a matrix."""
    tok, path = checkpoints["a"]
    module = module_for(tiny_cfg("algo.optimizer=adafactor", "algo.critic=policy"), tok, path)
    opt = module.configure_optimizers()
    assert type(opt).__name__ == "Adafactor" and [g["lr"] for g in opt.param_groups] == [
        module.a.lr, module.a.critic_lr]
    w = torch.nn.Parameter(torch.tensor([0.3, -2.0]))
    hand = type(opt)([w], lr=0.05, **{k: opt.defaults[k] for k in ("beta2_decay", "eps", "d", "weight_decay")})
    target = torch.tensor([1.0, 0.5])
    expect, v = w.detach().clone(), torch.zeros(2)
    for t in (1, 2):
        g = 2 * (expect - target) * torch.tensor([1.0, 10.0])  # ∇ of Σ c_i (w_i − target_i)², c = (1, 10)
        hand.zero_grad()
        ((w - target) ** 2 * torch.tensor([1.0, 10.0])).sum().backward()
        assert torch.allclose(w.grad, g)
        hand.step()
        beta = t ** -0.8
        v = (1 - beta) * v + beta * g**2
        u = g / v.sqrt()
        u = u / max(1.0, float(u.norm() / math.sqrt(2)))
        expect = expect - min(0.05, t ** -0.5) * max(1e-3, float(expect.norm() / math.sqrt(2))) * u
        assert torch.allclose(w.detach(), expect, atol=1e-6), (t, w, expect)
    qr = rollout(tok, *QR)
    loss, _ = module.minibatch_loss(qr, IDX, *update_inputs(module, qr), 0.1)
    opt.zero_grad()
    loss.backward()
    opt.step()
    up = module.policy.model.layers[0].mlp.up_proj.weight  # [64, 16] at this shape
    state = opt.state[up]
    assert sum(x.numel() for k, x in state.items() if k != "step" and x is not None) == sum(up.shape)


def test_adafactor_on_a_torch_without_it_is_one_config_line(tiny_cfg, monkeypatch):
    import importlib.metadata

    cfg = tiny_cfg("algo.optimizer=adafactor")
    check_ppo_rules(cfg.algo)  # this torch has it
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.4.1+cpu")
    with pytest.raises(ConfigError, match="algo.optimizer.*adamw"):
        check_ppo_rules(cfg.algo)


@pytest.mark.slow  # a worker process of two PPO steps and one stopped at its start: about 30 s of CPU
def test_the_options_benchmark_runs_end_to_end_at_the_tiny_shape(monkeypatch, capsys):
    """``python -m benchmarks.ops.memory --options --shape tiny --only 8``: row 8 (every option at once: the shared
    critic, a bf16 reference, a bf16 RM, activation checkpointing, Adafactor) measured in its worker, with the trained
    parameters of one trunk and a value head: more than the model's, fewer than twice (row 1, today's, trains a
    critic trunk of the model's size besides the policy: 2n + head). Each option's own effect is checked by the tests
    above; the worker runs every row with the same code, its overrides aside. A low --limit-gb stops a row (the
    options' main called in this process, its world model not built: the worker is stopped before it reads one)."""
    import subprocess
    import sys

    from benchmarks import common as C
    from benchmarks.ops import memory

    p = subprocess.run([sys.executable, "-m", "benchmarks.ops.memory", "--options", "--shape", "tiny", "--only", "8"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:-1]] for ln in p.stdout.splitlines()
            if ln.startswith("| full fine-tuning") or ln.startswith("| all |")}
    assert set(rows) == {"all"}  # the rows asked for, no other
    every = rows["all"]
    n = int(re.search(r"\(([\d,]+) parameters\)", p.stdout).group(1).replace(",", ""))
    assert float(every[0]) > 0 and float(every[2]) > 0 and n < int(every[3]) < 2 * n, (n, every)
    monkeypatch.setattr(C, "make_world_model", lambda *a, **k: C.WorldModel(Path("unbuilt/lm"), Path("unbuilt/rm"),
                                                                           0, {}))
    capsys.readouterr()
    assert memory.options_main(["--shape", "tiny", "--only", "1", "--limit-gb", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "| full fine-tuning (today) | > 0.01 GiB (stopped) |" in out, out[-2000:]
