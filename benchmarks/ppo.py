"""PPO step-time breakdown: our ``PPOModule`` (in a Lightning Trainer, as the ``ppo`` stage runs it) against a lower
bound made of the bare model calls the step needs, on the same shapes.

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
from unittest.mock import patch
import copy
import tempfile
import time
from dataclasses import dataclass

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from benchmarks.common import PhaseTimer, Section, StepClock, WorldModel, load_tokenizer, table
from benchmarks.train_sides import LightningClock

# ------------------------------------------------------------------------------------------------
# shared setup


@contextlib.contextmanager
def lm_head_hook(model, hook):
    """While active, `hook` is a forward hook on the model's LM head (it may edit the logits in place)."""
    from rlhf_lab.models.adapters import unwrap

    h = unwrap(model).get_output_embeddings().register_forward_hook(hook)
    try:
        yield
    finally:
        h.remove()


@contextlib.contextmanager
def suppress_eos(model, eos_id: int):
    """While active, the LM head's output has logit −inf at EOS: every sampled response runs to full length."""
    def hook(_module, _inputs, out):
        out[..., eos_id] = float("-inf")
        return out

    with lm_head_hook(model, hook):
        yield


@contextlib.contextmanager
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

    with lm_head_hook(model, hook):
        yield


def world_lengths(cfg: DictConfig, tok, prompts: list[str]) -> dict[str, int]:
    """Tokens (before EOS) of a world response to each prompt, drawn with a seed of the prompt's text: the length
    distribution a trained policy's responses have (world texts share the SFT data's grammar and lengths)."""
    import zlib

    from rlhf_lab.config import world as W
    from rlhf_lab.world import ReviewGenerator

    spec = W.world_spec(cfg)
    return {p: len(tok(" " + ReviewGenerator(zlib.crc32(p.encode()), spec).response(p),
                       add_special_tokens=False).input_ids) for p in prompts}


@dataclass
class Models:
    tok: object
    scorer: object
    policy: object
    reference: object
    critic: object


def build(cfg: DictConfig, wm: WorldModel) -> Models:
    """Policy, reference, critic (``stages.ppo.build_models``) and the RM scorer, from the benchmark's folders."""
    from rlhf_lab.stages.ppo import build_models
    from rlhf_lab.models import families as Fm
    from rlhf_lab.models.reward import RewardScorer

    tok = load_tokenizer(wm.lm_dir)
    rm = Fm.load_sequence_scorer(wm.rm_dir, tok).eval()
    scorer = RewardScorer([rm], tok, normalize=True, max_len=int(cfg.reward_model.max_len))
    torch.manual_seed(0)
    policy, reference, critic = build_models(cfg.algo, wm.lm_dir, tok, scorer)
    return Models(tok, scorer, policy, reference, critic)


def prompt_fn(cfg: DictConfig):
    from rlhf_lab.config import world as W
    from rlhf_lab.world import streams as D

    n = int(cfg.algo.batch_size) // int(cfg.algo.samples_per_prompt)
    return lambda step: D.prompts(W.world_settings(cfg), f"ppo/{int(cfg.seed)}/{step}", n)


_MLFLOW_DIR: list[str] = []


def mlflow_setup() -> None:
    """A throw-away sqlite MLflow store for this process (as the jobs' default ``sqlite:///mlflow.db``)."""
    import mlflow

    if not _MLFLOW_DIR:
        _MLFLOW_DIR.append(tempfile.mkdtemp(prefix="bench_mlflow_"))
        mlflow.set_tracking_uri(f"sqlite:///{_MLFLOW_DIR[0]}/mlflow.db")
        mlflow.set_experiment("benchmarks")


def mlflow_cleanup() -> None:
    """Remove the throw-away MLflow store of :func:`mlflow_setup` (if this process made one)."""
    import shutil

    while _MLFLOW_DIR:
        shutil.rmtree(_MLFLOW_DIR.pop(), ignore_errors=True)


def mlflow_run():
    """An MLflow run to log into (PPOModule logs its metrics with ``mlflow.log_metrics`` at every step)."""
    import mlflow

    mlflow_setup()
    return mlflow.start_run()


# ------------------------------------------------------------------------------------------------
# ours


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


def run_ours(cfg: DictConfig, wm: WorldModel, steps: int, warmup: int, force_full: bool = True,
             sampler=None, lengths: dict[str, int] | None = None) -> dict[str, float]:
    """Our PPO for `steps` PPO steps; median seconds over the timed steps of every phase in OURS_PHASES, and
    (``_stats``) a few of the step's metrics at every step (:data:`STAT_KEYS`).

    `sampler` replaces ``ppo.sample`` (same signature), e.g. to compare samplers; default: the project's.
    `lengths` (prompt → tokens before EOS, :func:`world_lengths`): responses end there (:func:`end_at`) instead of
    running to ``max_new_tokens`` (`force_full`).
    """
    import mlflow

    from rlhf_lab.config import world as W
    from rlhf_lab.models import reward as R
    from rlhf_lab.stages.ppo import model_bytes
    from rlhf_lab.algorithms import ppo
    from rlhf_lab.models import sampling

    if warmup < 1:
        raise ValueError("run_ours needs at least one warm-up step (the first step's start is the previous one's end)")
    m = build(cfg, wm)
    module = ppo.PPOModule(m.policy, m.reference, m.critic, m.tok, m.scorer, prompt_fn(cfg), cfg.algo, cfg.kl,
                           cfg.generation, W.gold_weights(cfg))
    timer = PhaseTimer()
    timer.enabled = False
    clock = StepClock(warmup)
    base_sample = sampler or ppo.sample

    def sample(model, tok, prompts, *a, **k):
        if lengths is not None:
            ctx = end_at(model, tok.eos_token_id, [lengths[p] for p in prompts])
        else:
            ctx = suppress_eos(model, tok.eos_token_id) if force_full else contextlib.nullcontext()
        with ctx:
            return base_sample(model, tok, prompts, *a, **k)

    class Phases(L.Callback):  # after LightningClock: the step's end stamp is already taken
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            timer.enabled = batch_idx >= warmup

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if timer.enabled:
                timer.end_step(update=module.last_stats["time/update_s"], step=clock.stamps[-1] - clock.stamps[-2])
            stats.append({k: module.last_stats.get(k, float("nan")) for k in STAT_KEYS})

    object.__setattr__(module, "scorer", timer.proxy(m.scorer, "score/rm"))
    module.policy_forward = timer.wrap(module.policy_forward,
                                       lambda: "update/forward" if torch.is_grad_enabled() else "score/policy_critic")
    module.manual_backward = timer.wrap(module.manual_backward, "update/backward")
    module.reference_logprobs = timer.wrap(module.reference_logprobs, "score/reference")
    if module.gold is not None:
        module.gold = timer.proxy(module.gold, "other/gold")
    stats: list[dict[str, float]] = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(patch.object(ppo, "sample", timer.wrap(sample, "generation")))
        for name in ("encode_prompts", "decode_responses"):
            stack.enter_context(patch.object(sampling, name, timer.wrap(getattr(sampling, name), "gen/tokenize+decode")))
        stack.enter_context(patch.object(R, "encode_texts", timer.wrap(R.encode_texts, "score/rm_tokenize")))
        stack.enter_context(patch.object(mlflow, "log_metrics", timer.wrap(mlflow.log_metrics, "other/mlflow")))
        stack.enter_context(mlflow_run())
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        trainer = L.Trainer(max_steps=steps * module.updates_per_step, accelerator="cpu", devices=1,
                            precision="32-true", enable_checkpointing=False, enable_model_summary=False,
                            default_root_dir=tmp, num_sanity_val_steps=0, enable_progress_bar=False, logger=False,
                            callbacks=[LightningClock(clock), Phases()])
        trainer.fit(module)
    if len(timer.steps) != steps - warmup:
        raise RuntimeError(f"expected {steps - warmup} timed PPO steps, got {len(timer.steps)}")
    named = ("generation", "score/rm", "score/reference", "score/policy_critic", "update")
    for st in timer.steps:
        st["update/rest"] = st["update"] - st.get("update/forward", 0.0) - st.get("update/backward", 0.0)
        st["other"] = st["step"] - sum(st.get(k, 0.0) for k in named)
    out = timer.medians()
    out["_steps"] = timer.steps
    out["_stats"] = stats
    out["response_tokens"] = float(module.last_stats["objective/length"])
    out["model_bytes"] = float(model_bytes(m.policy, m.reference, m.critic, *m.scorer.members))
    out["trainable_params"] = float(sum(p.numel() for p in module.parameters() if p.requires_grad))
    out["threads"] = float(max(clock.threads))
    return out


# ------------------------------------------------------------------------------------------------
# the lower bound


BARE_PHASES = [
    ("generation", "generation (model.generate on token ids)"),
    ("score/rm", "score: RM backbone + head at the last token"),
    ("score/reference", "score: reference forward + log-probs"),
    ("score/policy_critic", "score: policy + critic forward"),
    ("update", "update (same number of minibatch steps)"),
    ("step", "sum of the phases"),
]


def _values(critic, ids, attn, P):
    return critic(ids, attn, P)


@torch.no_grad()
def _generate(policy, tok, q_ids, q_mask, g, max_new_tokens: int, force_full: bool):
    kw = dict(do_sample=float(g.temperature) > 0, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
              eos_token_id=tok.eos_token_id)
    if float(g.temperature) > 0:
        kw.update(temperature=float(g.temperature), top_k=int(g.top_k or 0), top_p=float(g.top_p))
    ctx = suppress_eos(policy, tok.eos_token_id) if force_full else contextlib.nullcontext()
    with ctx:
        out = policy.generate(input_ids=q_ids, attention_mask=q_mask, **kw)
    return out[:, q_ids.shape[1]:]


def run_bare(cfg: DictConfig, wm: WorldModel, steps: int, warmup: int, force_full: bool = True) -> dict[str, float]:
    """The same PPO step as bare model calls in a plain loop; median seconds over the timed steps of each phase."""
    from rlhf_lab.algorithms.rl_math import ppo_policy_loss, ppo_value_loss
    from rlhf_lab.models.adapters import unwrap
    from rlhf_lab.models.sampling import encode_prompts, positions, token_logprobs

    a, g = cfg.algo, cfg.generation
    m = build(cfg, wm)
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
    prompts_of = prompt_fn(cfg)
    B, n_mb, T = int(a.batch_size), int(a.num_minibatches), int(g.max_new_tokens)
    mb = B // n_mb
    timer = PhaseTimer()
    timer.enabled = False

    def policy_logp(ids, attn, P, r_ids, r_mask):
        # the LM head only where response tokens are predicted, as the step needs
        logits = lm(input_ids=ids, attention_mask=attn, position_ids=positions(attn),
                    logits_to_keep=r_ids.shape[1] + 1).logits
        return token_logprobs(logits[:, :-1], r_ids, r_mask, float(g.temperature) or 1.0)

    for step in range(steps):
        timer.end_step()
        timer.enabled = step >= warmup
        q_ids, q_mask = encode_prompts(m.tok, prompts_of(step), g.get("max_prompt_len"))  # not timed
        with timer.phase("generation"):
            r_ids = _generate(policy, m.tok, q_ids, q_mask, g, T, force_full)
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
                old_values = _values(critic, ids, attn, P)
        advantages = torch.randn(B, T) * r_mask  # the values do not change the work
        returns = old_values + scores[:, None]
        with timer.phase("update"):
            for _epoch in range(int(a.ppo_epochs)):
                perm = torch.randperm(B)
                for i in range(n_mb):
                    idx = perm[i * mb : (i + 1) * mb]
                    logp = policy_logp(ids[idx], attn[idx], P, r_ids[idx], r_mask[idx])
                    values = _values(critic, ids[idx], attn[idx], P)
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


# ------------------------------------------------------------------------------------------------
# the benchmark


def _pooled(runs: list[dict]) -> dict[str, float]:
    """Medians over the timed steps of all rounds; the other (non-phase) numbers from the last round."""
    from benchmarks.common import median

    steps = [st for r in runs for st in r["_steps"]]
    keys = {k for st in steps for k in st}
    out = {k: v for k, v in runs[-1].items() if k not in ("_steps", "_stats")}
    out.update({k: median(st.get(k, 0.0) for st in steps) for k in keys})
    return out


# ------------------------------------------------------------------------------------------------
# today's settings vs the v2 options


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
    prompts_of = prompt_fn(cfg)
    lengths = world_lengths(cfg, tok, [p for s in range(steps) for p in prompts_of(s)])
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in OPTIONS}
    for r in range(rounds):
        for name, _, over in (OPTIONS if r % 2 == 0 else OPTIONS[::-1]):
            torch.manual_seed(r)
            runs[name].append(run_ours(with_overrides(cfg, over), wm, steps, warmup, lengths=lengths))
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


def run(cfg: DictConfig, wm: WorldModel, steps: int, warmup: int, rounds: int) -> Section:
    t_start = time.time()
    ours_runs, bare_runs = [], []
    for r in range(rounds):  # alternate which side goes first
        for side in (("ours", "bare") if r % 2 == 0 else ("bare", "ours")):
            torch.manual_seed(r)
            if side == "ours":
                ours_runs.append(run_ours(cfg, wm, steps, warmup))
            else:
                bare_runs.append(run_bare(cfg, wm, steps, warmup))
    ours, bare = _pooled(ours_runs), _pooled(bare_runs)
    rows = []
    for key, label in OURS_PHASES:
        b = bare.get(key) if key in dict(BARE_PHASES) else None
        o = ours.get(key, 0.0)
        rows.append([label, 1000 * o, 1000 * b if b is not None else float("nan"), o / b if b else float("nan")])
    overhead = ours["step"] / bare["step"] - 1
    a, g = cfg.algo, cfg.generation
    sec = Section("PPO step-time breakdown (ours vs bare model calls)", __doc__.split("\n\n", 1)[1].strip())
    sec.tables.append("Median over the timed steps (the phases' medians need not add up to the step's):\n\n" + table(
        ["phase", "ours ms/step", "bare ms/step", "ratio ours/bare"], rows))
    gen_share = ours["generation"] / ours["step"]
    sec.findings += [
        f"total overhead ours/bare − 1 = **{100 * overhead:+.0f}%** (target ≤ +30%)",
        f"generation is {100 * gen_share:.0f}% of our step; the update {100 * ours['update'] / ours['step']:.0f}%",
        f"settings: policy {wm.arch}, batch {int(a.batch_size)}, {int(a.ppo_epochs)} PPO epochs × "
        f"{int(a.num_minibatches)} minibatches, {int(g.max_new_tokens)} response tokens (measured "
        f"{ours['response_tokens']:.0f}), critic={a.critic}; {steps} PPO steps per run of which {warmup} warm-up, "
        f"{rounds} round(s) alternating the order; torch threads {int(ours['threads'])}",
    ]
    opt = run_options(cfg, wm, steps, warmup, rounds)
    tables, findings, ratio = options_tables(opt)
    sec.tables += tables
    sec.findings += findings
    sec.seconds = time.time() - t_start
    sec.data = {"overhead": overhead, "ours": ours, "bare": bare, "options_ratio": ratio}
    return sec
