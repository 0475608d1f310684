"""PPO step-time breakdown, ``python -m benchmarks.ops.ppo_steps [--quick]``: our ``PPOModule`` (in a Lightning
Trainer, as the ``ppo`` stage runs it) against a lower bound made of the bare model calls the step needs.

Ours is timed from outside, without editing ``ppo.py``: the callables a PPO step goes through are wrapped by
timers (``ppo.sample``, the scorer, ``ppo.response_logprobs``, ``PPOModule.policy_forward`` and
``manual_backward``; the tokenizer calls inside them, the gold reward, ``mlflow.log_metrics``), the step
itself by a Lightning callback, and the update total is ``PPOModule``'s own ``time/update_s``. The bare loop
runs, on models built by the same ``build_models`` from the same folders:

- generation: ``model.generate`` on pre-tokenized prompts with the same sampling arguments;
- RM: the RM backbone on the policy's token ids and the scalar head at the last token (no text round trip);
- reference: one forward and the log-probs of the response tokens;
- policy + critic: one policy forward (log-probs) and one critic forward (values);
- update: ``ppo_epochs × num_minibatches`` × (policy + critic forward, PPO losses, backward, clipping, AdamW).

Responses have exactly ``generation.max_new_tokens`` tokens on both sides (EOS is suppressed during sampling
by a hook that sets its logit to −inf), so the shapes are the same. The RM is a randomly initialised
sequence classifier of the policy's family (same tokenizer), used through ``rlhf_lab.models.reward.RewardScorer``.
Periodic evaluation (``eval_every``) is not part of the step and is not run.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import time
from unittest.mock import patch

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from benchmarks import common as C
from benchmarks.common import Section, StepClock, WorldModel, load_tokenizer, median, suppress_tokens, table


def end_at(model, eos_id: int, lengths: list[int]):
    """While active (one ``generate`` call), response i gets exactly ``lengths[i]`` tokens and then EOS: the EOS
    logit is −inf before that step and the only finite one at it (a length at or over ``max_new_tokens`` runs to
    the cap without EOS). Sampling is otherwise untouched."""
    n = torch.tensor(lengths)
    step = [0]

    def hook(_module, _inputs, out):
        t, logits = step[0], out[..., -1, :]
        step[0] += 1
        logits[n > t, eos_id] = float("-inf")
        at = n == t
        logits[at] = float("-inf")
        logits[at, eos_id] = 0.0
        return out

    return C.lm_head_hook(model, hook)


def world_lengths(cfg: DictConfig, tok, prompts: list[str]) -> dict[str, int]:
    """Tokens (before EOS) of a world response to each prompt, drawn with a seed of the prompt's text: the length
    distribution a trained policy's responses have (world texts share the SFT data's grammar and lengths)."""
    import zlib

    from rlhf_lab.config import world as W
    from rlhf_lab.world import ReviewGenerator

    spec = W.world_spec(cfg)
    return {p: len(tok(" " + ReviewGenerator(zlib.crc32(p.encode()), spec).response(p),
                       add_special_tokens=False).input_ids) for p in prompts}


class PhaseTimer:
    """Wall time per named phase within a step (`wrap(fn, phase)` times every call of fn; `phase` a name, None: not
    timed, or a callable giving it at call time); `end_step()` closes a step: its totals go to `steps` if `enabled`."""

    def __init__(self):
        self.totals: dict[str, float] = {}
        self.steps: list[dict[str, float]] = []
        self.enabled = False

    @contextlib.contextmanager
    def phase(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.enabled and name is not None:
                self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - t0

    def wrap(self, fn, phase):
        def timed(*args, **kwargs):
            with self.phase(phase() if callable(phase) else phase):
                return fn(*args, **kwargs)
        return timed

    def end_step(self, **extra: float) -> None:
        if self.enabled:
            self.steps.append({**self.totals, **extra})
        self.totals.clear()

    def medians(self) -> dict[str, float]:
        """Median over the timed steps of every phase (0 where a step lacks it): robust to a step slowed down by
        another process."""
        return {k: median(st.get(k, 0.0) for st in self.steps) for k in {k for st in self.steps for k in st}}


class Timed:
    """`obj` with its calls timed (`call`); its other attributes (``.to``, ``.members``, …) pass through."""

    def __init__(self, obj, call):
        self._obj, self._call = obj, call

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._obj, name)


OURS_PHASES = [
    ("generation", "generation (ppo.sample)"),
    ("gen/tokenize+decode", "  of which prompt tokenization + response decoding"),
    ("score/rm", "score: RM (RewardScorer: text → ids → forward)"),
    ("score/rm_tokenize", "  of which RM tokenization (encode_texts)"),
    ("score/reference", "score: reference forward + log-probs"),
    ("score/policy_critic", "score: policy + critic forward (old log-probs, entropy, values)"),
    ("update", "update (ppo_epochs × minibatches)"),
    ("update/forward", "  of which forward (policy_forward)"),
    ("update/backward", "  of which backward (manual_backward)"),
    ("update/rest", "  of which losses, clipping, AdamW step"),
    ("other", "other (gold reward, GAE, stats, MLflow logging, Lightning)"),
    ("other/gold", "  of which gold reward (the gold scorer on the decoded responses)"),
    ("other/mlflow", "  of which mlflow.log_metrics"),
    ("step", "PPO step"),
]

STAT_KEYS = ("objective/gold", "objective/scores", "objective/kl", "objective/length", "loss/policy", "loss/value")


def run_ours(cfg: DictConfig, wm: WorldModel, steps: int, warmup: int,
             lengths: dict[str, int] | None = None) -> dict[str, float]:
    """Our PPO for `steps` PPO steps, every response run to ``max_new_tokens`` (or, with `lengths`: prompt → tokens
    before EOS, :func:`world_lengths`, ended there); median seconds over the timed steps of every phase in
    :data:`OURS_PHASES`, and (``_stats``) a few of the step's metrics at every step (:data:`STAT_KEYS`)."""
    import mlflow

    from rlhf_lab.algorithms import ppo
    from rlhf_lab.models import reward as R
    from rlhf_lab.models import sampling
    from rlhf_lab.stages.ppo import model_bytes

    if warmup < 1:
        raise ValueError("run_ours needs at least one warm-up step (the first step's start is the previous one's end)")
    tok = load_tokenizer(wm.lm_dir)
    module = C.ppo_module(cfg, wm, tok)
    scorer, timer, clock, stats = module.scorer, PhaseTimer(), StepClock(warmup), []

    class Phases(L.Callback):  # after the clock: the step's end stamp is already taken
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            timer.enabled = batch_idx >= warmup

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            # the first step has no earlier end stamp (and is a warm-up step, so the timer does not keep it)
            step = clock.stamps[-1] - clock.stamps[-2] if len(clock.stamps) > 1 else float("nan")
            timer.end_step(update=module.last_stats["time/update_s"], step=step)
            stats.append({k: module.last_stats.get(k, float("nan")) for k in STAT_KEYS})

    object.__setattr__(module, "scorer", Timed(scorer, timer.wrap(scorer, "score/rm")))
    module.policy_forward = timer.wrap(module.policy_forward,
                                       lambda: "update/forward" if torch.is_grad_enabled() else "score/policy_critic")
    module.manual_backward = timer.wrap(module.manual_backward, "update/backward")
    module.reference_logprobs = timer.wrap(module.reference_logprobs, "score/reference")
    if module.gold is not None:
        module.gold = Timed(module.gold, timer.wrap(module.gold, "other/gold"))
    with contextlib.ExitStack() as stack:
        stack.enter_context(C.patched_sample(lambda model, tk, prompts: end_at(model, tk.eos_token_id, [
            lengths[p] for p in prompts]) if lengths is not None else suppress_tokens(model, tk.eos_token_id)))
        stack.enter_context(patch.object(ppo, "sample", timer.wrap(ppo.sample, "generation")))  # the patched one
        for name in ("encode_prompts", "decode_responses"):
            stack.enter_context(patch.object(sampling, name, timer.wrap(getattr(sampling, name), "gen/tokenize+decode")))
        stack.enter_context(patch.object(R, "encode_texts", timer.wrap(R.encode_texts, "score/rm_tokenize")))
        stack.enter_context(patch.object(mlflow, "log_metrics", timer.wrap(mlflow.log_metrics, "other/mlflow")))
        stack.enter_context(C.mlflow_run())
        C.fit(module, None, steps, clock, [Phases()])
    if len(timer.steps) != steps - warmup:
        raise RuntimeError(f"expected {steps - warmup} timed PPO steps, got {len(timer.steps)}")
    named = ("generation", "score/rm", "score/reference", "score/policy_critic", "update")
    for st in timer.steps:
        st["update/rest"] = st["update"] - st.get("update/forward", 0.0) - st.get("update/backward", 0.0)
        st["other"] = st["step"] - sum(st.get(k, 0.0) for k in named)
    return {**timer.medians(), "_steps": timer.steps, "_stats": stats,
            "response_tokens": float(module.last_stats["objective/length"]),
            "model_bytes": float(model_bytes(module.policy, module._reference, module.critic, *scorer.members)),
            "trainable_params": float(sum(p.numel() for p in module.parameters() if p.requires_grad)),
            "policy_bytes": float(model_bytes(module.policy)),
            "critic_trunk": float(getattr(module.critic, "backbone", None) is not None),  # a trunk of its own
            "threads": float(max(clock.threads))}


BARE_PHASES = [
    ("generation", "generation (model.generate on token ids)"),
    ("score/rm", "score: RM backbone + head at the last token"),
    ("score/reference", "score: reference forward + log-probs"),
    ("score/policy_critic", "score: policy + critic forward"),
    ("update", "update (same number of minibatch steps)"),
    ("step", "sum of the phases"),
]


def run_bare(cfg: DictConfig, wm: WorldModel, steps: int, warmup: int) -> dict[str, float]:
    """The same PPO step as bare model calls in a plain loop; median seconds over the timed steps of each phase."""
    from rlhf_lab.algorithms.rl_math import ppo_policy_loss, ppo_value_loss
    from rlhf_lab.models.adapters import unwrap
    from rlhf_lab.models.sampling import encode_prompts, positions, token_logprobs

    a, g = cfg.algo, cfg.generation
    tok = load_tokenizer(wm.lm_dir)
    m = C.ppo_module(cfg, wm, tok)
    policy, critic, reference = m.policy, m.critic, m.reference
    if critic is None or critic.backbone is None:
        raise ValueError("the bare PPO loop is written for a separate critic (algo.critic=policy, algo.reference.kind=copy)")
    rm = m.scorer.members[0]
    rm_backbone, rm_head = getattr(rm, rm.base_model_prefix), rm.score
    lm = unwrap(policy)
    params = [{"params": [p for p in policy.parameters() if p.requires_grad], "lr": float(a.lr)},
              {"params": list(critic.parameters()), "lr": float(a.critic_lr)}]
    opt = torch.optim.AdamW(params, eps=1e-5, weight_decay=0.0)
    policy.eval()
    critic.eval()
    prompts_of = C.prompt_fn(cfg)
    B, n_mb, T = int(a.batch_size), int(a.num_minibatches), int(g.max_new_tokens)
    mb = B // n_mb
    timer = PhaseTimer()
    gen = dict(do_sample=float(g.temperature) > 0, max_new_tokens=T, pad_token_id=tok.pad_token_id,
               eos_token_id=tok.eos_token_id)
    if float(g.temperature) > 0:
        gen.update(temperature=float(g.temperature), top_k=int(g.top_k or 0), top_p=float(g.top_p))

    def policy_logp(ids, attn, P, r_ids, r_mask):
        # the LM head only where response tokens are predicted, as the step needs
        logits = lm(input_ids=ids, attention_mask=attn, position_ids=positions(attn),
                    logits_to_keep=r_ids.shape[1] + 1).logits
        return token_logprobs(logits[:, :-1], r_ids, r_mask, float(g.temperature) or 1.0)

    for step in range(steps):
        timer.end_step()
        timer.enabled = step >= warmup
        q_ids, q_mask = encode_prompts(tok, prompts_of(step), g.get("max_prompt_len"))  # not timed
        with timer.phase("generation"), torch.no_grad(), suppress_tokens(policy, tok.eos_token_id):
            r_ids = policy.generate(input_ids=q_ids, attention_mask=q_mask, **gen)[:, q_ids.shape[1]:]
        r_mask = torch.ones_like(r_ids)
        ids, attn, P = torch.cat([q_ids, r_ids], 1), torch.cat([q_mask, r_mask], 1), q_ids.shape[1]
        with torch.no_grad():
            with timer.phase("score/rm"):
                h = rm_backbone(input_ids=ids, attention_mask=attn, position_ids=positions(attn)).last_hidden_state
                scores = rm_head(h[:, -1])[:, 0]
            with timer.phase("score/reference"):
                ref_logits = reference(input_ids=ids, attention_mask=attn, position_ids=positions(attn),
                                       logits_to_keep=r_ids.shape[1] + 1).logits
                token_logprobs(ref_logits[:, :-1], r_ids, r_mask, float(g.temperature) or 1.0)
            with timer.phase("score/policy_critic"):
                old_logp = policy_logp(ids, attn, P, r_ids, r_mask)
                old_values = critic(ids, attn, P)
        advantages = torch.randn(B, T) * r_mask  # the values do not change the work
        returns = old_values + scores[:, None]
        with timer.phase("update"):
            for _epoch in range(int(a.ppo_epochs)):
                perm = torch.randperm(B)
                for i in range(n_mb):
                    idx = perm[i * mb : (i + 1) * mb]
                    logp = policy_logp(ids[idx], attn[idx], P, r_ids[idx], r_mask[idx])
                    values = critic(ids[idx], attn[idx], P)
                    loss = ppo_policy_loss(logp, old_logp[idx], advantages[idx], r_mask[idx], float(a.clip_eps))[0]
                    loss = loss + float(a.vf_coef) * ppo_value_loss(values, old_values[idx], returns[idx], r_mask[idx],
                                                                     float(a.value_clip_eps))[0]
                    opt.zero_grad()
                    loss.backward()
                    if a.get("max_grad_norm"):
                        torch.nn.utils.clip_grad_norm_([p for grp in params for p in grp["params"]],
                                                       float(a.max_grad_norm))
                    opt.step()
    timer.end_step()
    for st in timer.steps:
        st["step"] = sum(st.get(k, 0.0) for k, _ in BARE_PHASES if k != "step")
    return {**timer.medians(), "_steps": timer.steps}


def _pooled(runs: list[dict]) -> dict[str, float]:
    """Medians over the timed steps of all rounds; the other (non-phase) numbers from the last round."""
    steps = [st for r in runs for st in r["_steps"]]
    keys = {k for st in steps for k in st}
    return {**{k: v for k, v in runs[-1].items() if k not in ("_steps", "_stats")},
            **{k: median(st.get(k, 0.0) for st in steps) for k in keys}}


OPTIONS = [  # (name, label, overrides): the step before v2, with the v2 defaults, with the shared critic
    ("before", "before v2: `algo.packing=false algo.trim_minibatches=false`",
     {"algo.packing": False, "algo.trim_minibatches": False}),
    ("default", "now: the defaults (`algo.packing`, `algo.trim_minibatches`)", {}),
    ("shared", "the defaults + `algo.critic=shared`", {"algo.critic": "shared"}),
]
OPTIONS_NOTE = """Our PPO step (as above, same weights, prompts and seed on every side) with the settings before v2
(no packing, untrimmed minibatches), with today's defaults (packed passes, trimmed minibatches: the same losses
and gradients to float noise), and with the shared-trunk critic (an option: it changes the training). Here the
responses are not forced to full length: each one ends, with EOS, after as many tokens as a world response to
its prompt has (``end_at`` + ``world_lengths``: the lengths a trained policy's responses have; the random-weight
policy here would rarely sample EOS), so the padding is what a real run has. The sides alternate (the order
reversed every round); ``Δ vs before`` is the largest difference, over the steps of a round, of a step's metric
between the variant and the settings before v2, same round and seed. (v2's AdamW with ``foreach``, bit for bit the
same numbers, has no setting and runs in all three: against the code before v2 the gain is a little larger.)"""


def with_overrides(cfg: DictConfig, overrides: dict) -> DictConfig:
    c = copy.deepcopy(cfg)
    for key, value in overrides.items():
        OmegaConf.update(c, key, value, merge=False)
    return c


def run_options(cfg: DictConfig, wm: WorldModel, steps: int, warmup: int, rounds: int) -> dict:
    """:data:`OPTIONS`, alternating, `rounds` runs each: {name: pooled medians}, per-round step ratios and
    trajectory differences against ``before``."""
    tok = load_tokenizer(wm.lm_dir)
    prompts_of = C.prompt_fn(cfg)
    lengths = world_lengths(cfg, tok, [p for s in range(steps) for p in prompts_of(s)])
    over = {name: o for name, _, o in OPTIONS}
    runs = C.alternate(rounds, lambda n: run_ours(with_overrides(cfg, over[n]), wm, steps, warmup, lengths=lengths),
                       tuple(over), seed_round=True)
    out = {"pooled": {n: _pooled(rs) for n, rs in runs.items()}, "per_round": {}, "delta": {}, "means": {}}
    for name in runs:
        out["per_round"][name] = [b["step"] / v["step"] for b, v in zip(runs["before"], runs[name])]
        out["delta"][name] = {k: max(abs(sv[k] - sb[k]) for b, v in zip(runs["before"], runs[name])
                                     for sb, sv in zip(b["_stats"], v["_stats"])) for k in STAT_KEYS}
        out["means"][name] = {k: sum(st[k] for rr in runs[name] for st in rr["_stats"])
                              / sum(len(rr["_stats"]) for rr in runs[name]) for k in STAT_KEYS}
    return out


def options_tables(opt: dict) -> tuple[list[str], list[str], float]:
    """The options' tables, findings and the headline ratio (step before v2 ÷ step with today's defaults)."""
    P, base = opt["pooled"], opt["pooled"]["before"]
    rows = []
    for name, label, _ in OPTIONS:
        v = P[name]
        score = sum(v.get(k, 0.0) for k in ("score/rm", "score/reference", "score/policy_critic"))
        rows.append([label, 1000 * v["step"], 1000 * v["generation"], 1000 * score, 1000 * v["update"],
                     base["step"] / v["step"], base["update"] / v["update"],
                     ", ".join(f"{x:.2f}" for x in opt["per_round"][name])])
    speed = table(["settings", "ms/step", "generation ms", "scoring ms", "update ms", "step before ÷ this",
                   "update before ÷ this", "step ratio per round"], rows)
    traj = table(["settings", "objective/gold (mean)", "Δ gold vs before (max)", "objective/kl (mean)",
                  "Δ kl vs before (max)", "loss/value (mean)", "response tokens (mean)"],
                 [[label, opt["means"][n]["objective/gold"], opt["delta"][n]["objective/gold"],
                   opt["means"][n]["objective/kl"], opt["delta"][n]["objective/kl"], opt["means"][n]["loss/value"],
                   opt["means"][n]["objective/length"]] for n, label, _ in OPTIONS])
    ratio = base["step"] / P["default"]["step"]
    tables = ["### Today's settings vs the v2 options\n\n" + OPTIONS_NOTE + "\n\nMedian over the timed steps:\n\n"
              + speed, "The same runs' metrics, every step (random-weight policy and RM):\n\n" + traj]
    findings = [
        f"options: the default PPO step is **{ratio:.2f}×** as fast as before v2 (update "
        f"{base['update'] / P['default']['update']:.2f}×; target ≥ 1.3×); with `algo.critic=shared` "
        f"{base['step'] / P['shared']['step']:.2f}×",
        "options: the defaults follow the same trajectory as before v2: the largest difference of a step's "
        f"objective/kl is {opt['delta']['default']['objective/kl']:.2g} nats (objective/gold "
        f"{opt['delta']['default']['objective/gold']:.2g}, but a random-weight policy's gold is flat, so the KL "
        "and the losses are what tell); `algo.critic=shared` trains otherwise (the value loss moves the policy's "
        "trunk): its gold curve needs training runs of a trained policy, which this benchmark does not make",
    ]
    return tables, findings, ratio


def run(cfg: DictConfig, wm: WorldModel, work, steps: int, warmup: int, rounds: int) -> Section:
    sec = Section("PPO step-time breakdown (ours vs bare model calls)", __doc__.split("\n\n", 1)[1].strip())
    runs = C.alternate(rounds, lambda side: (run_ours if side == "ours" else run_bare)(cfg, wm, steps, warmup),
                       ("ours", "bare"), seed_round=True)
    ours, bare = _pooled(runs["ours"]), _pooled(runs["bare"])
    rows = []
    for key, label in OURS_PHASES:
        o, b = ours.get(key, 0.0), bare.get(key) if key in dict(BARE_PHASES) else None
        rows.append([label, 1000 * o, 1000 * b if b is not None else float("nan"), o / b if b else float("nan")])
    overhead = ours["step"] / bare["step"] - 1
    a, g = cfg.algo, cfg.generation
    sec.tables.append("Median over the timed steps (the phases' medians need not add up to the step's):\n\n" + table(
        ["phase", "ours ms/step", "bare ms/step", "ratio ours/bare"], rows))
    sec.findings += [
        f"total overhead ours/bare − 1 = **{100 * overhead:+.0f}%** (target ≤ +30%)",
        f"generation is {100 * ours['generation'] / ours['step']:.0f}% of our step; the update "
        f"{100 * ours['update'] / ours['step']:.0f}%",
        f"settings: policy {wm.arch}, batch {int(a.batch_size)}, {int(a.ppo_epochs)} PPO epochs × "
        f"{int(a.num_minibatches)} minibatches, {int(g.max_new_tokens)} response tokens (measured "
        f"{ours['response_tokens']:.0f}), critic={a.critic}; {steps} PPO steps per run of which {warmup} warm-up, "
        f"{rounds} round(s) alternating the order; torch threads {int(ours['threads'])}",
    ]
    opt = run_options(cfg, wm, steps, warmup, rounds)
    tables, findings, ratio = options_tables(opt)
    sec.tables += tables
    sec.findings += findings
    check = "target ≤ +30%: " + ("met" if overhead <= 0.30 else "NOT met") + "; target ≥ 1.3×: " + (
        "met" if ratio >= 1.3 else "NOT met")
    sec.summary = ["PPO step, ours/bare − 1; settings before v2 ÷ today's",
                   f"{100 * overhead:+.0f}%; before v2 ÷ now {ratio:.2f}×", check]
    sec.data = {"overhead": overhead, "options_ratio": ratio}
    return sec


SIZES = {"full": {"ppo_steps": dict(steps=8, warmup=2, rounds=3)},
         "quick": {"ppo_steps": dict(steps=3, warmup=1, rounds=1)}}

if __name__ == "__main__":
    sys.exit(C.main("python -m benchmarks.ops.ppo_steps", {"ppo_steps": run}, SIZES))
