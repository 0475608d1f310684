"""GRPO training throughput, ours (``PPOModule`` with ``algo=grpo`` in a Lightning Trainer, as the ``grpo`` stage runs
it) against TRL's ``GRPOTrainer``, and first-step agreement of the two losses on the same completions; also the
pieces the PPO comparison shares (our timed side, the step recorder).
"""

from __future__ import annotations

import contextlib
import tempfile
from unittest.mock import patch

import torch
from omegaconf import DictConfig

from benchmarks import common as C

NOTE = ("Matched as benchmarks/README.md lists (`grpo`; `trl_settings` maps our config and refuses a setting TRL has no "
        "equivalent of): policy weights and reference, the prompts in order, the reward (the same random RM through "
        "`RewardScorer`), G, batch, `max_completion_length`, sampling, the group advantage, β on the k3 KL in the loss "
        "(no bias correction), clip ε, loss aggregation, minibatches per generation, μ, AdamW, clipping, fp32, dropout "
        "off; EOS suppressed while sampling in the timed runs on both sides. Left: our statistics, MLflow logging and "
        "finite-weight check; TRL's fused LM head, metrics and Trainer loop.")

LOSS_TYPES = {"seq_mean_token_mean": "grpo", "token_mean": "bnpo", "seq_mean_token_sum_norm": "dr_grpo"}


def trl_settings(cfg: DictConfig) -> dict:
    """Our GRPO config as ``GRPOConfig`` arguments; ValueError for a setting TRL's GRPO has no equivalent of."""
    a, g, kl = cfg.algo, cfg.generation, cfg.kl
    unmatched = {
        "critic": (str(a.critic), "none"), "baseline": (str(a.baseline), "mean"),
        "kl_in": (str(a.kl_in), "loss"), "kl_estimator": (str(a.kl_estimator), "k3"), "kl": (str(kl.name), "fixed"),
        "whiten_advantages": (bool(a.whiten_advantages), False), "entropy_coef": (float(a.entropy_coef), 0.0),
        "length_penalty": (float(a.length_penalty), 0.0), "missing_eos_penalty": (float(a.missing_eos_penalty), 0.0),
        "reward_clip": (a.get("reward_clip"), None), "lora.r": (int(a.lora.r), 0),
        "reference.kind": (str(a.reference.kind), "copy"), "reference.sync_every": (int(a.reference.sync_every), 0),
    }
    bad = {k: v for k, (v, want) in unmatched.items() if v != want}
    if bad or str(a.loss_agg) not in LOSS_TYPES or str(a.advantage_scale) not in ("group_std", "none"):
        raise ValueError(f"the GRPO benchmark compares settings TRL's GRPOTrainer has too; not these: {bad}, "
                         f"loss_agg={a.loss_agg}, advantage_scale={a.advantage_scale}")
    B, n_mb = int(a.batch_size), int(a.num_minibatches)
    return dict(
        beta=float(kl.beta), num_generations=int(a.samples_per_prompt), max_completion_length=int(g.max_new_tokens),
        temperature=float(g.temperature), top_k=int(g.top_k or 0), top_p=float(g.top_p), min_p=None,
        repetition_penalty=1.0, num_iterations=int(a.ppo_epochs), epsilon=float(a.clip_eps),
        epsilon_high=None if a.get("clip_eps_high") is None else float(a.clip_eps_high),
        loss_type=LOSS_TYPES[str(a.loss_agg)], scale_rewards="group" if a.advantage_scale == "group_std" else "none",
        mask_truncated_completions=False, use_bias_correction_kl=False, importance_sampling_level="token",
        steps_per_generation=n_mb, gradient_accumulation_steps=1, per_device_train_batch_size=B // n_mb,
        shuffle_dataset=False, disable_dropout=True, use_vllm=False, log_completions=False, entropy_coef=0.0,
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, delta=None, cast_lm_head_to_fp32=False,
        use_liger_kernel=False, pad_to_multiple_of=None, sync_ref_model=False, lr_scheduler_type="constant",
        adam_epsilon=1e-5, weight_decay=0.0,
    )


def run_ours(cfg: DictConfig, wm: C.WorldModel, tok, steps: int, warmup: int, names: dict, suppress,
             keys=None) -> C.StepClock:
    """Our module for `steps` steps, ``suppress(tok)`` token ids at −inf while sampling; the clock's ``phases``: each
    timed step's seconds per phase, `names` {phase: the module's ``time/*`` statistic}."""
    import lightning as L

    module, clock, stats = C.ppo_module(cfg, wm, tok), C.StepClock(warmup), []

    class Phases(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            stats.append({name: pl_module.last_stats[metric] for name, metric in names.items()})

    with C.patched_sample(lambda model, tk, _p: C.suppress_tokens(model, *suppress(tk))), C.mlflow_run():
        C.fit(module, None, steps, clock, [Phases()])
    clock.phases = C.with_rest(stats[warmup:], clock.step_times(), keys)
    return clock


def trl_trainer(cfg: DictConfig, wm: C.WorldModel, tok, steps: int, out_dir: str):
    """TRL's ``GRPOTrainer`` for `steps` generations (``steps × num_minibatches`` optimizer steps), its dataset the
    prompts our module draws at steps 0 … steps-1, in order."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from benchmarks.vs_trl.train import hf_args
    from rlhf_lab.models import families as Fm

    a, s, scorer, eos = cfg.algo, trl_settings(cfg), C.make_scorer(cfg, wm, tok), tok.eos_token_id
    n_mb = int(a.num_minibatches)

    def rm_reward(prompts, completions, completion_ids, **_):  # text as our decode_responses gives it
        return scorer(prompts, [c.strip() for c in completions], [bool(i) and i[-1] == eos for i in completion_ids]).tolist()

    common = hf_args(steps * n_mb * int(a.ppo_epochs), s["per_device_train_batch_size"], float(a.lr), 0.0, 0,
                     a.get("max_grad_norm"), out_dir, log_every=n_mb)
    prompts = C.prompt_fn(cfg)
    return GRPOTrainer(model=Fm.load_causal_lm(wm.lm_dir, tok), reward_funcs=[rm_reward], args=GRPOConfig(**{**common, **s}),
                       train_dataset=Dataset.from_list([{"prompt": p} for i in range(steps) for p in prompts(i)]),
                       processing_class=tok)


def run_trl(cfg: DictConfig, wm: C.WorldModel, tok, steps: int, warmup: int) -> C.StepClock:
    """TRL's GRPO for `steps` generations, the clock ticking after the last optimizer step of each; its ``phases``
    from timers around the trainer's ``_generate_single_turn``, ``_calculate_rewards`` and no-grad
    ``_get_per_token_logps_and_entropies``."""
    from benchmarks.ops.ppo_steps import PhaseTimer
    from benchmarks.vs_trl.train import hf_fit

    clock, timer, stats = C.StepClock(warmup), PhaseTimer(), []
    timer.enabled, n_mb = True, int(cfg.algo.num_minibatches) * int(cfg.algo.ppo_epochs)

    class Clock(C.StepClock):  # one tick per generation: its phases, then start again
        def tick(self):
            clock.tick()
            stats.append({k: timer.totals.get(k, 0.0) for k in ("generation", "reward", "logps")})
            timer.totals.clear()

    with tempfile.TemporaryDirectory() as tmp:
        tr = trl_trainer(cfg, wm, tok, steps, tmp)
        base = tr._generate_single_turn

        def generate(*args, **kw):
            with C.suppress_tokens(tr.model, tok.eos_token_id):
                return base(*args, **kw)

        tr._generate_single_turn = timer.wrap(generate, "generation")
        tr._calculate_rewards = timer.wrap(tr._calculate_rewards, "reward")
        tr._get_per_token_logps_and_entropies = timer.wrap(tr._get_per_token_logps_and_entropies,
                                                           lambda: None if torch.is_grad_enabled() else "logps")
        hf_fit(tr, Clock(warmup), every=n_mb)
    clock.phases = C.with_rest(stats[warmup:], clock.step_times())
    return clock


class StepRecorder:
    """One real training step of a ``PPOModule`` (inside an MLflow run), recorded from outside: ``rec[name]`` = (args,
    kwargs, result) of the first call of ``rollout``, ``score``, ``update`` and of what :meth:`first_call` wraps;
    ``rec["loss"]``: every ``manual_backward``'s loss, ``rec["grad"]``: the gradient norm of `grad_of` after it;
    ``rec["perm"]``: the ``torch.randperm`` permutations of the batch (`batch`)."""

    def __init__(self, module, batch: int, grad_of: tuple):
        self.module, self.batch, self.grad_of = module, batch, grad_of
        self.rec: dict = {"loss": [], "grad": [], "perm": []}

    def first_call(self, name: str, fn):
        def wrapped(*args, **kw):
            out = fn(*args, **kw)
            self.rec.setdefault(name, (args, kw, out))
            return out
        return wrapped

    def run(self, *contexts) -> dict:
        m, rec = self.module, self.rec
        base_backward, base_randperm = m.manual_backward, torch.randperm

        def backward(loss, *args, **kw):
            rec["loss"].append(float(loss))
            out = base_backward(loss, *args, **kw)
            rec["grad"].append(C.grad_norm(*self.grad_of))
            return out

        def randperm(n, *args, **kw):
            p = base_randperm(n, *args, **kw)
            if n == self.batch:
                rec["perm"].append(p.clone())
            return p

        m.manual_backward = backward
        for name in ("rollout", "score", "update"):
            setattr(m, name, self.first_call(name, getattr(m, name)))
        with contextlib.ExitStack() as stack:
            for c in (*contexts, patch.object(torch, "randperm", randperm), C.mlflow_run()):
                stack.enter_context(c)
            C.fit(m, None, 1)
        return rec


def first_step_agreement(cfg: DictConfig, wm: C.WorldModel, tok) -> dict:
    """Both sides' first GRPO step on the same completions, each through its own code (benchmarks/README.md, "First-step
    loss agreement"): ours one real ``training_step``, recorded; TRL ``_generate_and_score_completions`` with our
    completions' ids as its sampler's, the batch split by our permutation, per minibatch ``compute_loss``, backward,
    clipping and an AdamW step. The reference has other random weights (``lm_ref``), so the KL term is not 0."""
    from rlhf_lab.models import families as Fm

    a = cfg.algo
    B, n_mb = int(a.batch_size), int(a.num_minibatches)
    module = C.ppo_module(cfg, wm, tok, reference_dir=wm.ref_dir)
    rec = StepRecorder(module, B, (module.policy,)).run()
    ro, scores = rec["rollout"][2], rec["score"][2]
    (_qr, old_logp, ref_logp, _values, advantages, _returns, _beta), _, _ = rec["update"]
    perm, mask, mb = rec["perm"][0], ro.response_mask, B // n_mb
    with tempfile.TemporaryDirectory() as tmp:
        tr = trl_trainer(cfg, wm, tok, 1, tmp)
        tr.ref_model.load_state_dict(Fm.load_causal_lm(wm.ref_dir, tok).state_dict())
        completions = [ids[: int(n)] for ids, n in zip(ro.response_ids.tolist(), mask.sum(1).tolist())]
        tr._generate_single_turn = lambda *args, **kw: (completions, None)
        tr.model.train()
        out = tr._generate_and_score_completions([{"prompt": p} for p in ro.prompts])
        tr.current_gradient_accumulation_steps = 1
        opt, losses = tr.create_optimizer(), []
        for i in range(n_mb):
            idx = perm[i * mb: (i + 1) * mb]
            opt.zero_grad()
            loss = tr.compute_loss(tr.model, {k: v[idx] if isinstance(v, torch.Tensor) and v.ndim > 0 else v
                                              for k, v in out.items()})
            loss.backward()
            losses.append((float(loss), C.grad_norm(tr.model)))
            torch.nn.utils.clip_grad_norm_(tr.model.parameters(), float(a.max_grad_norm))
            opt.step()
        same = {"prompt ids and masks": torch.equal(out["prompt_ids"], ro.query_ids)
                and torch.equal(out["prompt_mask"], ro.query_mask),
                "completion ids and masks": torch.equal(out["completion_ids"] * out["completion_mask"],
                                                        ro.response_ids * mask)
                and torch.equal(out["completion_mask"], mask)}
        rewards = torch.tensor(tr._logs["rewards"]["rm_reward"])
    rows = [("reward (RM score), mean over the batch", scores, rewards),
            ("advantage (R − group mean) / (group std + 1e-4), mean |A|", advantages[:, 0], out["advantages"]),
            ("old log-prob per token, mean over tokens", old_logp, out["old_per_token_logps"]),
            ("reference log-prob per token, mean over tokens", ref_logp, out["ref_per_token_logps"]),
            ("loss, minibatch 1 (ratio 1)", rec["loss"][0], losses[0][0]),
            ("gradient norm before clipping, minibatch 1", rec["grad"][0], losses[0][1]),
            ("loss, minibatch 2 (after one AdamW step)", rec["loss"][1], losses[1][0]),
            ("gradient norm before clipping, minibatch 2", rec["grad"][1], losses[1][1])]
    agree, ok = C.agreement(rows, same, mask=mask)
    return {"rows": agree, "ok": ok, "n_ended": int(sum(ro.ended)), "mean_len": float(mask.sum(1).float().mean())}


PHASES = [
    ("generation", "generation (ours: `sampling.sample` with `generation.sampler`, prompt tokenization and decoding; "
                   "TRL: `_generate_single_turn`, `model.generate`)"),
    ("reward", "reward: RewardScorer on the decoded completions"),
    ("logps", "old + reference log-probs, no grad (ours: with the entropy)"),
    ("update", "the rest: minibatch forward + backward + AdamW, advantages, metrics, logging"),
    ("step", "step"),
]
TARGET = 1.5


COMPILE, SHARED_PROMPT = "algo.compile=true", "algo.shared_prompt=true"
OPTIONS = {  # an option a third side times: what it does
    COMPILE: "the trunks' packed passes through torch.compile; its float noise makes another run; compiled after the "
             "warm-up steps",
    SHARED_PROMPT: "each prompt's prefill, old and reference log-prob passes and RM pass run once for its G "
                   "completions (its KV cache serves them); the same numbers to float noise",
}


def run(cfg: DictConfig, wm: C.WorldModel, work, steps: int, warmup: int, rounds: int,
        option: str | None = COMPILE) -> C.Section:
    """`option` (a key of :data:`OPTIONS`, or None): also time ours with that override, off by default (a third side);
    unless it is ``algo.compile``, its first step is checked against TRL's too."""
    cfg = C.compose(["algo=grpo"])
    a, g = cfg.algo, cfg.generation
    sec = C.Section("GRPO training throughput (ours vs TRL GRPOTrainer)", NOTE)
    trl_settings(cfg)  # fail before any work on a setting TRL has no equivalent of
    tok = C.load_tokenizer(wm.lm_dir)
    B = int(a.batch_size)
    agree = first_step_agreement(cfg, wm, tok)
    opted = C.compose(["algo=grpo", option]) if option else None
    agree_opt = first_step_agreement(opted, wm, tok) if option and option != COMPILE else None
    names = {"generation": "time/rollout_s", "reward": "time/score_s", "logps": "time/forward_s"}

    def run_side(side: str) -> C.StepClock:
        if side == "trl":
            return run_trl(cfg, wm, tok, steps, warmup)
        return run_ours(opted if side == "option" else cfg, wm, tok, steps, warmup, names,
                        lambda tk: [tk.eos_token_id])

    clocks = C.alternate(rounds, run_side, ("ours", "option", "trl") if option else ("ours", "trl"))
    o, oo, t = (C.rate(clocks.get(s) or clocks["ours"], B) for s in ("ours", "option", "trl"))
    ratio, ratio_o = o["rate"] / t["rate"], (oo["rate"] / t["rate"] if option else float("nan"))
    sides = {"ours": "ours", **({"option": f"ours with `{option}`"} if option else {}), "trl": "TRL"}
    med, phase_text = C.phase_table({s: clocks[s] for s in sides}, PHASES, sides)
    sec.tables.append(C.table(["side", "completions/s", "ms/step", "timed steps", "ratio ours/TRL"], [
        ["ours (PPOModule, algo=grpo, + Lightning)", o["rate"], o["ms"], o["n"], ratio],
        *[[f"ours with `{option}` (opt-in: {OPTIONS[option]})", oo["rate"], oo["ms"], oo["n"], ratio_o]
          ][:int(bool(option))],
        ["TRL GRPOTrainer", t["rate"], t["ms"], t["n"], 1.0]]))
    sec.tables.append(phase_text)
    sec.tables.append(
        f"First step, same initial weights, the same {B} completions (sampled by ours: {agree['n_ended']} ended with "
        f"EOS, {agree['mean_len']:.1f} tokens on average; reference: other random weights, so the KL term is not 0); "
        f"each side through its own code:\n\n" + C.agreement_table(agree["rows"]))
    if agree_opt is not None:
        sec.tables.append(f"The same first step, ours with `{option}`:\n\n" + C.agreement_table(agree_opt["rows"]))
    sec.findings.append(
        f"a step = one generation of {B} completions ({B // int(a.samples_per_prompt)} prompts × G "
        f"{int(a.samples_per_prompt)}, {int(g.max_new_tokens)} tokens each) + rewards + {int(a.ppo_epochs)} × "
        f"{int(a.num_minibatches)} AdamW steps; β {float(cfg.kl.beta)} (k3 in the loss), ε {float(a.clip_eps)}, "
        f"loss_agg {a.loss_agg} = TRL loss_type {LOSS_TYPES[str(a.loss_agg)]!r}, lr {float(a.lr)}; policy {wm.arch}; "
        + C.runs_line(steps, warmup, rounds, C.per_round(clocks["ours"], clocks["trl"]), clocks)
        + ("; with the option: " + ", ".join(f"{x:.2f}" for x in C.per_round(clocks["option"], clocks["trl"]))
           if option else ""))
    ok = agree["ok"] and (agree_opt is None or agree_opt["ok"])
    met, met_o = ("met" if r >= TARGET else "NOT met" for r in (ratio, ratio_o))
    sec.findings.append(f"throughput ours/TRL **{ratio:.2f}×** with the defaults (target ≥ {TARGET}×: {met})"
                        + (f"; with `{option}` (an option, off by default: {OPTIONS[option]}) **{ratio_o:.2f}×** "
                           f"({met_o})" if option else ""))
    gen = med["ours"]["generation"] / med["ours"]["step"], med["trl"]["generation"] / med["trl"]["step"]
    sampler = ("our KV-cache sampler (`generation.sampler=lab`), TRL `model.generate`: the same tokens (see the "
               "sampling section)" if str(g.sampler) == "lab" else "the same `model.generate` call on both sides "
               "(`generation.sampler=hf`)")
    sec.findings.append(f"generation is {100 * gen[0]:.0f}% of our step and {100 * gen[1]:.0f}% of TRL's, on the same "
                        f"shapes: {sampler}; it bounds the ratio (with everything else free, ours/TRL would be at most "
                        f"TRL step / our generation = {med['trl']['step'] / med['ours']['generation']:.2f}×)")
    sec.summary = ["GRPO throughput, ours/TRL (completions/s)",
                   f"{ratio:.2f}×" + (f"; {option} {ratio_o:.2f}×" if option else ""),
                   f"{'loss agrees' if ok else 'LOSS DIFFERS'}; target ≥ {TARGET}×: {met}"
                   + (f"; with {option}: {met_o}" if option else "")]
    sec.ok, sec.data = ok, {"ratio": ratio, "option": option, "ratio_option": ratio_o, "phases": med}
    return sec
