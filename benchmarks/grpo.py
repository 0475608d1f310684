"""GRPO training throughput, ours (``PPOModule`` with ``algo=grpo``, in a Lightning Trainer, as the ``grpo`` stage runs
it) against TRL's ``GRPOTrainer``, and first-step agreement of the two losses on the same completions.

Matched: the policy weights (both load the same ``save_pretrained`` folder) and the reference (a frozen copy of
them: ours a ``deepcopy``, TRL's loaded again from the folder), the prompts (the train-split world prompts of our
``prompt_stream``; TRL gets them as its dataset, in the same order, ``shuffle_dataset=False``), the reward (the
same randomly initialised reward model through ``RewardScorer`` on the decoded completions: ours as its scorer,
TRL's as ``reward_funcs=[callable]``), G = ``algo.samples_per_prompt`` completions per prompt and
``algo.batch_size`` completions per step, ``max_completion_length`` = ``generation.max_new_tokens``, sampling
(temperature, top-k, top-p), the advantage (R − group mean) / (group std + 1e-4) (``scale_rewards="group"``), β on
the k3 KL in the loss (``use_bias_correction_kl=False``: TRL's default multiplies the KL by the importance ratio),
the clip ε, the loss aggregation (``algo.loss_agg=seq_mean_token_mean`` = ``loss_type="grpo"``), one generation per
``num_minibatches`` AdamW steps (``steps_per_generation``, ``per_device_train_batch_size`` = batch ÷ minibatches,
no gradient accumulation), μ = ``ppo_epochs`` (``num_iterations``), AdamW (lr, ε 1e-5, no weight decay,
constant schedule), gradient clipping, fp32, no gradient checkpointing, dropout off, no truncated-completion
masking, no vLLM. EOS is suppressed while sampling on both sides in the timed runs (as in the PPO benchmark),
so every completion has exactly ``max_new_tokens`` tokens and both sides train on the same shapes.

Left, each side's own work: our step also computes its statistics and logs them to MLflow (sqlite, as the
jobs do), checks every weight for non-finite values, and computes the entropy without a gradient; TRL
computes log-probs and entropy with its fused, chunked LM head, its own metrics, and runs the
Trainer/accelerate loop.
"""

from __future__ import annotations

import copy
import tempfile
import time
from unittest.mock import patch

import lightning as L
import torch
from omegaconf import DictConfig

from benchmarks.common import (Section, StepClock, WorldModel, identical_rows, load_tokenizer, phase_medians,
                               table, with_rest)
from benchmarks.train_sides import LightningClock, StepPhases, alternate, grad_norm, hf_common_args, throughput

LOSS_TYPES = {"seq_mean_token_mean": "grpo", "token_mean": "bnpo", "seq_mean_token_sum_norm": "dr_grpo"}


# ------------------------------------------------------------------------------------------------
# settings


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


def make_scorer(cfg: DictConfig, wm: WorldModel, tok):
    """The reward: the randomly initialised RM of the model folder through ``RewardScorer`` (as ``benchmarks.ppo``)."""
    from rlhf_lab.models import families as Fm
    from rlhf_lab.models.reward import RewardScorer

    rm = Fm.load_sequence_scorer(wm.rm_dir, tok).eval()
    return RewardScorer([rm], tok, normalize=True, max_len=int(cfg.reward_model.max_len))


def trl_reward(scorer, eos_id: int):
    """The scorer as a TRL reward function: text as our ``decode_responses`` gives it (stripped), ended = has EOS."""

    def rm_reward(prompts, completions, completion_ids, **_):
        ended = [bool(ids) and ids[-1] == eos_id for ids in completion_ids]
        return scorer(prompts, [c.strip() for c in completions], ended).tolist()

    return rm_reward


# ------------------------------------------------------------------------------------------------
# the two sides


def ours_module(cfg: DictConfig, wm: WorldModel, tok, reference_dir=None, check=None):
    """``PPOModule`` with the config's algo (grpo here; ``check``: the stage's ``check_config``, default grpo's), as
    ``stages.ppo.build`` makes it (models by ``build_models``), the RM of :func:`make_scorer`."""
    from rlhf_lab.config import world as W
    from rlhf_lab.algorithms.ppo import PPOModule
    from rlhf_lab.models import families as Fm
    from rlhf_lab.stages import grpo
    from rlhf_lab.stages.ppo import build_models, prompt_stream

    a = cfg.algo
    (check or grpo.check_config)(a)
    scorer = make_scorer(cfg, wm, tok)
    policy, reference, critic = build_models(a, wm.lm_dir, tok, scorer)
    if reference_dir is not None:
        reference = Fm.load_causal_lm(reference_dir, tok).requires_grad_(False).eval()
    prompt_fn = prompt_stream(cfg, int(cfg.seed), int(a.batch_size) // int(a.samples_per_prompt))
    return PPOModule(policy, reference, critic, tok, scorer, prompt_fn, a, cfg.kl, cfg.generation, W.gold_weights(cfg))


def lightning_run(module, n_steps: int, callbacks: list) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        L.Trainer(max_steps=n_steps * module.updates_per_step, accelerator="cpu", devices=1, precision="32-true",
                  enable_checkpointing=False, enable_model_summary=False, default_root_dir=tmp,
                  num_sanity_val_steps=0, enable_progress_bar=False, logger=False, callbacks=callbacks).fit(module)


def trl_prompts(cfg: DictConfig, steps: int) -> list[dict]:
    """TRL's dataset: the prompts our module draws at steps 0 … steps-1, in order (one row per prompt)."""
    from rlhf_lab.stages.ppo import prompt_stream

    a = cfg.algo
    fn = prompt_stream(cfg, int(cfg.seed), int(a.batch_size) // int(a.samples_per_prompt))
    return [{"prompt": p} for s in range(steps) for p in fn(s)]


def trl_trainer(cfg: DictConfig, wm: WorldModel, tok, steps: int, out_dir: str):
    """TRL's ``GRPOTrainer`` for `steps` generations (``steps × num_minibatches`` optimizer steps)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from rlhf_lab.models import families as Fm

    a = cfg.algo
    s = trl_settings(cfg)
    n_mb = int(a.num_minibatches)
    common = hf_common_args(steps * n_mb * int(a.ppo_epochs), s["per_device_train_batch_size"], float(a.lr), 0.0, 0, 0,
                            a.get("max_grad_norm"), out_dir, log_every=n_mb)
    args = GRPOConfig(**{**common, **s})
    policy = Fm.load_causal_lm(wm.lm_dir, tok)
    return GRPOTrainer(model=policy, reward_funcs=[trl_reward(make_scorer(cfg, wm, tok), tok.eos_token_id)], args=args,
                       train_dataset=Dataset.from_list(trl_prompts(cfg, steps)), processing_class=tok)


PHASES = [
    ("generation", "generation (ours: `sampling.sample` with `generation.sampler`, prompt tokenization and decoding; "
                   "TRL: `_generate_single_turn`, `model.generate`)"),
    ("reward", "reward: RewardScorer on the decoded completions"),
    ("logps", "old + reference log-probs, no grad (ours: with the entropy)"),
    ("update", "the rest: minibatch forward + backward + AdamW, advantages, metrics, logging"),
    ("step", "step"),
]


def run_ours(cfg: DictConfig, wm: WorldModel, tok, steps: int, warmup: int) -> StepClock:
    """Our GRPO for `steps` steps; the clock's ``phases``: the seconds of each phase of every timed step (the
    module's own ``time/*`` statistics)."""
    from benchmarks.ppo import mlflow_run, suppress_eos
    from rlhf_lab.algorithms import ppo

    module = ours_module(cfg, wm, tok)
    clock = StepClock(warmup)
    phases = StepPhases({"generation": "time/rollout_s", "reward": "time/score_s", "logps": "time/forward_s"})

    def sample(model, tk, *args, **kw):
        with suppress_eos(model, tk.eos_token_id):
            return base(model, tk, *args, **kw)

    base = ppo.sample
    with patch.object(ppo, "sample", sample), mlflow_run():
        lightning_run(module, steps, [LightningClock(clock), phases])
    clock.phases = with_rest(phases.stats[warmup:], clock.step_times())
    return clock


def run_trl(cfg: DictConfig, wm: WorldModel, tok, steps: int, warmup: int) -> StepClock:
    """TRL's GRPO for `steps` generations; the clock ticks after the last optimizer step of each; its ``phases``
    as for ours, from timers around the trainer's ``_generate_single_turn``, ``_calculate_rewards`` and
    no-grad ``_get_per_token_logps_and_entropies``."""
    from benchmarks.ppo import suppress_eos
    from transformers import PrinterCallback, TrainerCallback

    clock = StepClock(warmup)
    n_mb = int(cfg.algo.num_minibatches) * int(cfg.algo.ppo_epochs)
    current: dict[str, float] = {}
    stats: list[dict] = []

    def timed(fn, phase):
        def wrapped(*args, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                name = phase() if callable(phase) else phase
                if name:
                    current[name] = current.get(name, 0.0) + time.perf_counter() - t0
        return wrapped

    class GenerationClock(TrainerCallback):  # one tick per generation, after its last optimizer step
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % n_mb == 0:
                clock.tick()
                stats.append({k: current.get(k, 0.0) for k in ("generation", "reward", "logps")})
                current.clear()

    with tempfile.TemporaryDirectory() as tmp:
        tr = trl_trainer(cfg, wm, tok, steps, tmp)
        base = tr._generate_single_turn

        def generate(*args, **kw):
            with suppress_eos(tr.model, tok.eos_token_id):
                return base(*args, **kw)

        tr._generate_single_turn = timed(generate, "generation")
        tr._calculate_rewards = timed(tr._calculate_rewards, "reward")
        tr._get_per_token_logps_and_entropies = timed(tr._get_per_token_logps_and_entropies,
                                                      lambda: None if torch.is_grad_enabled() else "logps")
        tr.remove_callback(PrinterCallback)
        tr.add_callback(GenerationClock())
        tr.train()
    clock.phases = with_rest(stats[warmup:], clock.step_times())
    return clock


# ------------------------------------------------------------------------------------------------
# first-step agreement


class StepRecorder:
    """One real training step of a ``PPOModule`` (:func:`lightning_run`, inside an MLflow run), recorded from outside:
    ``rec[name]`` = (args, kwargs, result) of the first call of ``rollout``, ``score``, ``update`` and of what
    :meth:`first_call` wraps; ``rec["loss"]``: every ``manual_backward``'s loss, ``rec["grad"]``: the gradient norm
    of the models `grad_of` after it; ``rec["perm"]``: the ``torch.randperm`` permutations of the batch (`batch`)."""

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
        """The step, inside `contexts` (more patches); returns :attr:`rec`."""
        import contextlib

        from benchmarks.ppo import mlflow_run

        m, rec = self.module, self.rec
        base_backward, base_randperm = m.manual_backward, torch.randperm

        def backward(loss, *args, **kw):
            rec["loss"].append(float(loss))
            out = base_backward(loss, *args, **kw)
            rec["grad"].append(grad_norm(*self.grad_of))
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
            for c in (*contexts, patch.object(torch, "randperm", randperm), mlflow_run()):
                stack.enter_context(c)
            lightning_run(m, 1, [])
        return rec


def first_step_agreement(cfg: DictConfig, wm: WorldModel, tok) -> dict:
    """Both sides' first GRPO step on the same completions, through their own code.

    Ours: one real ``training_step`` of ``PPOModule`` in Lightning (sampling, RM scores, old and reference
    log-probs, group advantages, then ``num_minibatches`` minibatch updates); recorded from outside: the rollout,
    the scores, the ``update`` arguments, the minibatch permutation, each minibatch's loss and its gradient norm
    before clipping. TRL: ``_generate_and_score_completions`` with its sampler replaced by our completions' token
    ids (it tokenizes the prompts, decodes, calls the reward function, computes old and reference log-probs and
    the advantages itself), the batch split by the same permutation, then per minibatch ``compute_loss``,
    backward, clipping and an AdamW step (its own ``create_optimizer``). The second minibatch's loss follows one
    AdamW step on each side, so the importance ratio and the clip are no longer trivially 1. The reference has
    other random weights than the policy (``lm_ref``), so that the KL term is not 0.
    """
    a = cfg.algo
    torch.manual_seed(0)
    module = ours_module(cfg, wm, tok, reference_dir=wm.lm_dir.parent / "lm_ref")
    B = int(a.batch_size)
    rec = StepRecorder(module, B, (module.policy,)).run()
    ro = rec["rollout"][2]
    scores = rec["score"][2]
    (qr, old_logp, ref_logp, _old_values, advantages, _returns, _beta), _, _ = rec["update"]
    perm = rec["perm"][0]
    mb = B // int(a.num_minibatches)
    mask = ro.response_mask
    ours = {"reward": scores, "advantage": advantages[:, 0], "old_logp": old_logp, "ref_logp": ref_logp,
            "loss/1": rec["loss"][0], "grad_norm/1": rec["grad"][0],
            "loss/2": rec["loss"][1], "grad_norm/2": rec["grad"][1]}

    with tempfile.TemporaryDirectory() as tmp:
        tr = trl_trainer(cfg, wm, tok, 1, tmp)
        ref_state = load_state(wm.lm_dir.parent / "lm_ref", tok)
        tr.ref_model.load_state_dict(ref_state)
        completions = [ids[: int(n)] for ids, n in zip(ro.response_ids.tolist(), mask.sum(1).tolist())]
        tr._generate_single_turn = lambda *args, **kw: (completions, None)
        tr.model.train()
        out = tr._generate_and_score_completions([{"prompt": p} for p in ro.prompts])
        tr.current_gradient_accumulation_steps = 1
        opt = tr.create_optimizer()
        trl = {"reward": torch.tensor(tr._logs["rewards"]["rm_reward"]), "advantage": out["advantages"],
               "old_logp": out["old_per_token_logps"], "ref_logp": out["ref_per_token_logps"]}
        for i in range(int(a.num_minibatches)):
            idx = perm[i * mb : (i + 1) * mb]
            batch = {k: v[idx] if isinstance(v, torch.Tensor) and v.ndim > 0 else v for k, v in out.items()}
            opt.zero_grad()
            loss = tr.compute_loss(tr.model, batch)
            loss.backward()
            trl[f"loss/{i + 1}"], trl[f"grad_norm/{i + 1}"] = float(loss), grad_norm(tr.model)
            torch.nn.utils.clip_grad_norm_(tr.model.parameters(), float(a.max_grad_norm))
            opt.step()
        same = {
            "prompt ids and masks": torch.equal(out["prompt_ids"], ro.query_ids)
            and torch.equal(out["prompt_mask"], ro.query_mask),
            "completion ids and masks": torch.equal(out["completion_ids"] * out["completion_mask"],
                                                    ro.response_ids * mask)
            and torch.equal(out["completion_mask"], mask),
        }
    return {"ours": ours, "trl": trl, "same": same, "mask": mask, "n_ended": int(sum(ro.ended)),
            "mean_len": float(mask.sum(1).float().mean())}


def load_state(path, tok) -> dict:
    from rlhf_lab.models import families as Fm

    return Fm.load_causal_lm(path, tok).state_dict()


AGREE_ROWS = [
    ("reward", "reward (RM score), mean over the batch", "max"),
    ("advantage", "advantage (R − group mean) / (group std + 1e-4), mean |A|", "max"),
    ("old_logp", "old log-prob per token, mean over tokens", "max"),
    ("ref_logp", "reference log-prob per token, mean over tokens", "max"),
    ("loss/1", "loss, minibatch 1 (ratio 1)", ""),
    ("grad_norm/1", "gradient norm before clipping, minibatch 1", ""),
    ("loss/2", "loss, minibatch 2 (after one AdamW step)", ""),
    ("grad_norm/2", "gradient norm before clipping, minibatch 2", ""),
]


def agreement_rows(agree: dict, tol: float) -> tuple[list[list], bool]:
    """Table rows (quantity, ours, TRL, abs diff, check) and whether everything agrees within `tol` (relative
    above 1). Per-completion and per-token quantities: their means are shown, the check is on the largest
    element-wise difference (over the completion tokens for the log-probs)."""
    rows, ok = [], True
    m = agree["mask"].bool()
    for key, label, kind in AGREE_ROWS:
        o, t = agree["ours"][key], agree["trl"][key]
        if kind == "max":
            o, t = o.detach().float(), t.detach().float()
            if o.dim() == 2:
                o, t = o[m], t[m]
            diff = float((o - t).abs().max())
            scale = float(t.abs().max())
            o, t = (float(o.abs().mean()), float(t.abs().mean())) if key == "advantage" else (float(o.mean()),
                                                                                            float(t.mean()))
        else:
            diff, scale = abs(o - t), abs(t)
        good = diff <= tol * max(1.0, scale)
        ok &= good
        rows.append([label, o, t, diff, "ok" if good else "DIFFERS"])
    same_rows, same_ok = identical_rows(agree["same"])
    return rows + same_rows, ok and same_ok


# ------------------------------------------------------------------------------------------------
# the benchmark


def run(cfg: DictConfig, wm: WorldModel, steps: int, warmup: int, rounds: int, tol: float) -> Section:
    t_start = time.time()
    a, g = cfg.algo, cfg.generation
    trl_settings(cfg)  # fail before any work on a setting TRL has no equivalent of
    tok = load_tokenizer(wm.lm_dir)
    B = int(a.batch_size)
    agree = first_step_agreement(cfg, wm, tok)
    rows, ok = agreement_rows(agree, tol)

    compiled_cfg = copy.deepcopy(cfg)
    compiled_cfg.algo.compile = True  # the option: the trunks' packed passes through torch.compile

    def run_side(side: str) -> StepClock:
        if side == "trl":
            return run_trl(cfg, wm, tok, steps, warmup)
        return run_ours(compiled_cfg if side == "ours_compiled" else cfg, wm, tok, steps, warmup)

    clocks = alternate(rounds, run_side, ("ours", "ours_compiled", "trl"))
    tp = throughput({side: clocks[side] for side in ("ours", "trl")}, B)
    tp_compiled = throughput({"ours": clocks["ours_compiled"], "trl": clocks["trl"]}, B)
    med, phase_text = phase_medians({side: clocks[side] for side in ("ours", "trl")}, PHASES)
    sec = Section("GRPO training throughput (ours vs TRL GRPOTrainer)", __doc__.split("\n\n", 1)[1].strip())
    sec.tables.append(table(
        ["side", "completions/s", "ms/step", "timed steps", "ratio ours/TRL"],
        [["ours (PPOModule, algo=grpo, + Lightning)", tp["rate"]["ours"], tp["step_ms"]["ours"], tp["steps"]["ours"],
          tp["ratio"]],
         ["ours with `algo.compile=true` (opt-in: the trunks' packed passes through torch.compile)",
          tp_compiled["rate"]["ours"], tp_compiled["step_ms"]["ours"], tp_compiled["steps"]["ours"],
          tp_compiled["ratio"]],
         ["TRL GRPOTrainer", tp["rate"]["trl"], tp["step_ms"]["trl"], tp["steps"]["trl"], 1.0]]))
    sec.tables.append(phase_text)
    sec.tables.append(
        f"First step, same initial weights, the same {B} completions (sampled by ours: {agree['n_ended']} ended with "
        f"EOS, {agree['mean_len']:.1f} tokens on average; reference: other random weights, so the KL term is not 0); "
        f"each side through its own code:\n\n"
        + table(["quantity", "ours", "TRL", "abs diff (largest element-wise)", f"within {tol:g} (relative above 1)"],
                rows))
    sec.findings.append(
        f"a step = one generation of {B} completions ({B // int(a.samples_per_prompt)} prompts × G "
        f"{int(a.samples_per_prompt)}, {int(g.max_new_tokens)} tokens each) + rewards + {int(a.ppo_epochs)} × "
        f"{int(a.num_minibatches)} AdamW steps; β {float(cfg.kl.beta)} (k3 in the loss), ε {float(a.clip_eps)}, "
        f"loss_agg {a.loss_agg} = TRL loss_type {LOSS_TYPES[str(a.loss_agg)]!r}, lr {float(a.lr)}; policy {wm.arch}; "
        f"{steps} steps per run of which {warmup} warm-up, {rounds} round(s) alternating the order; per-round ratios "
        f"{', '.join(f'{x:.2f}' for x in tp['per_round'])}; torch threads seen during the steps: {tp['threads']}")
    target = 1.5
    sec.findings.append(f"throughput ours/TRL **{tp['ratio']:.2f}×** with the defaults (target ≥ {target}×: "
                        f"{'met' if tp['ratio'] >= target else 'NOT met'}); with `algo.compile=true` (an option, off "
                        f"by default: its float noise makes another run; compiled after the warm-up steps) "
                        f"**{tp_compiled['ratio']:.2f}×** ({'met' if tp_compiled['ratio'] >= target else 'NOT met'})")
    gen = med["ours"]["generation"] / med["ours"]["step"], med["trl"]["generation"] / med["trl"]["step"]
    sampler = ("our KV-cache sampler (`generation.sampler=lab`), TRL `model.generate`: the same tokens (see the "
               "sampling section)" if str(g.sampler) == "lab" else "the same `model.generate` call on both sides "
               "(`generation.sampler=hf`)")
    sec.findings.append(f"generation is {100 * gen[0]:.0f}% of our step and {100 * gen[1]:.0f}% of TRL's, on the same "
                        f"shapes: {sampler}; it bounds the ratio (with everything else free, ours/TRL would be at most "
                        f"TRL step / our generation = {med['trl']['step'] / med['ours']['generation']:.2f}×)")
    sec.data = {"ratio": tp["ratio"], "ratio_compiled": tp_compiled["ratio"], "agree_ok": ok, "target": target,
                "phases": med}
    sec.seconds = time.time() - t_start
    return sec
