"""Stage ``ppo`` (the default job): PPO of the SFT policy against the frozen reward model.

Wiring only; the algorithm is :class:`rlhf_lab.algorithms.ppo.PPOModule`. This module builds the four
roles for the configured mode (:func:`build_models`), the reward (:func:`load_reward`), the prompt stream
(:func:`prompt_stream`: train-split prompts, a fresh seeded draw per PPO step, each rank its share), the
evaluation and ship-rule callbacks, runs the Lightning trainer as one MLflow run, saves the policy and
returns the summary.

``algo=grpo`` (GRPO, Shao et al. 2024: G samples per prompt, group-normalised advantages, no critic, k3 KL in the
loss) and ``algo=rloo`` (RLOO, Ahmadian et al. 2024: the leave-one-out baseline over k samples, no critic) are this
stage under their own name (``pipeline.ALIASES``; their runs are tagged ``rlhf_lab.stage=grpo`` / ``rloo``), with
their settings from ``conf/algo/grpo.yaml`` and ``conf/algo/rloo.yaml``.

Reference modes (``algo.reference``): ``kind: copy`` is a frozen copy of the SFT policy, or of the
checkpoint ``reference.path`` (same tokenizer; ``sft@<policy preset>`` names that preset's SFT artifact, e.g. a
smaller reference for claim C8), re-synced to the policy every ``sync_every`` steps when
that is > 0; ``kind: lora_disabled`` trains LoRA adapters (``algo.lora``, r > 0) on one SFT base, the
reference being that base with the adapters disabled and the critic a value head on the policy's last
hidden state (claim C6). The critic starts from the reward model (``algo.critic=rm``, InstructGPT), the
SFT policy (``policy``), is a value head on the policy's own trunk (``shared``: one forward pass for log-probs
and values, and the value loss trains the trunk too) or is absent (``none``).
"""

from __future__ import annotations

import copy
import itertools
import os
import random
import resource
import shutil
import time
import warnings
from pathlib import Path

import lightning as L
import torch
from omegaconf import DictConfig
from torch import nn

from rlhf_lab.world import streams as D
from rlhf_lab.config import world as W
from rlhf_lab.runs import active_run, distributed, tracking
from rlhf_lab.algorithms.ppo import PPOModule
from rlhf_lab.algorithms.ppo import StepTimer
from rlhf_lab.models.actor_critic import ValueModel
from rlhf_lab.evaluation.callbacks import Preemption
from rlhf_lab.evaluation.summary import metric_n, n_text, proxy_line
from rlhf_lab.config.ppo_rules import check_ppo_rules
from rlhf_lab.config.errors import ConfigError
from rlhf_lab.config.schema import GenerationConfig, KLConfig, PPOConfig, settings
from rlhf_lab.data.errors import data_errors
from rlhf_lab.models import families as F
from rlhf_lab.models.adapters import AdapterDisabled, unwrap, with_lora
from rlhf_lab.models.checkpoints import check_weights_only
from rlhf_lab.models.sharding import whole
from rlhf_lab.runs.states import defer_sigterm, lightning_sigterm_as_interrupted
from rlhf_lab.config.keys import computed_plain, to_plain
from rlhf_lab.runs.contents import with_contents
from rlhf_lab.runs.process import job_phases, launch_path, write_atomic
from rlhf_lab.stages import rm as rm_stage
from rlhf_lab.stages.evaluate import (checkpoints_summary, evaluate, gold_summary, held_out_summary, policy_evaluations,
                                      ship_callback, ship_summary)
from rlhf_lab.stages.presets import checkpoint_path
from rlhf_lab.stages.pipeline import ALIASES, run_settings, ensure, job_stage, job_steps, stage_seed, upstream_run
from rlhf_lab.stages.training import eval_steps, model_size, trainer_kwargs
from rlhf_lab.stages import gold as G, heldout
from rlhf_lab.config import data as DS
from rlhf_lab.data.preferences import external_prompts

WHAT = "PPO policy"
CACHED = False  # a PPO run is the end of the line: its artifact stays in the Hydra output folder
def check_compile(cfg: DictConfig) -> None:
    """``algo.compile`` compiles the packed passes (``algo.packing``), and on CPU inductor builds C++ kernels: a
    :class:`~rlhf_lab.config.errors.ConfigError` (one line, exit 2 from the CLI) before any model loads where either
    is missing."""
    if not cfg.algo.get("compile"):
        return
    if not cfg.algo.packing:
        raise ConfigError("algo.compile", True, "false unless algo.packing=true (it compiles the packed passes)")
    compilers = (os.environ.get("CXX") or "", "g++", "c++", "clang++")
    if str(cfg.trainer.accelerator) == "cpu" and not any(shutil.which(c) for c in compilers if c):
        raise ConfigError("algo.compile", True, "false on a CPU without a C++ compiler (g++, c++, clang++ or $CXX), "
                                                "which torch.compile needs for its kernels: install one")


def stage_name(cfg: DictConfig) -> str:
    """The name this stage runs under: the job's when it is an alias of PPO (``grpo``, ``rloo``: the pipeline's
    ``ALIASES``), else ``ppo`` (a PPO job, a ``cover``). Its run's tag, seed, steps and resume key use it."""
    name = job_stage(cfg)
    return name if ALIASES.get(name) == "ppo" else "ppo"


def spec(cfg: DictConfig) -> dict:
    """The SFT policy PPO starts from (built first, with every stage above it), and the reference checkpoint
    ``algo.reference.path`` when set (``sft@<preset>`` resolved to that preset's SFT artifact, built if missing).
    Under the job's name (:func:`stage_name`)."""
    stage = stage_name(cfg)
    check_ppo_rules(cfg.algo)  # before any model loads or upstream stage is built
    check_compile(cfg)
    sft = str(ensure("sft", cfg))
    out = {"sft": sft, "seed": stage_seed(cfg, stage), "steps": job_steps(cfg, stage, cfg.algo.steps),
           **heldout.spec(cfg)}  # reward_model.heldout: the held-out RM, built first
    if cfg.algo.reference.get("path"):
        out["reference"] = reference_path(cfg, sft)
    return out




def resume_checkpoint(cfg: DictConfig, stage: str, spec: dict) -> Path:
    """Where a pre-empted policy job leaves the checkpoint it resumes from: ``<cache_dir>/resume/<stage>/<key>.ckpt``,
    `key` a hash of the job's whole config (but :data:`~rlhf_lab.config.keys.NOT_COMPUTED`) and its `spec`, a local
    folder by its content (:func:`~rlhf_lab.runs.contents.with_contents`): the same command finds it, no other job."""
    import hashlib
    import json

    plain = computed_plain(to_plain(cfg))
    root = Path(launch_path(cfg.cache_dir)).resolve()
    blob = json.dumps(with_contents({"stage": stage, "spec": spec, "config": plain}, root), sort_keys=True, default=str)
    return root / "resume" / stage / f"{hashlib.sha256(blob.encode()).hexdigest()[:16]}.ckpt"


REFERENCE_SEED_BASE = 1000  # algo.reference.seed r builds the reference with pretrain.seed = sft.seed = 1000 + r


def reference_path(cfg: DictConfig, sft_path) -> str:
    """``algo.reference.path`` as a checkpoint folder: ``sft@a_tiny`` is the SFT artifact of the ``a_tiny`` policy
    preset (every other setting as in `cfg`; same tokenizer as the policy's SFT checkpoint, checked). With
    ``algo.reference.seed`` r, that preset is pretrained and fine-tuned with seeds :data:`REFERENCE_SEED_BASE` + r
    (its own model, never the policy's, whatever its size)."""
    ref_seed = cfg.algo.reference.get("seed")
    if ref_seed is not None:
        cfg = copy.deepcopy(cfg)
        cfg.pretrain.seed = cfg.sft.seed = REFERENCE_SEED_BASE + int(ref_seed)
    return checkpoint_path(cfg, cfg.algo.reference.path, "algo.reference.path", tokenizer_of=sft_path)


# ------------------------------------------------------------------------------------------------
# models: policy, reference, critic


def build_models(algo: DictConfig, sft_path, tok, scorer=None, resolved_reference=None, options: dict | None = None):
    """(policy, reference, critic) for the configured mode; the reference is an nn.Module or a callable.
    `resolved_reference`: ``algo.reference.path`` as a folder (:func:`reference_path`); default: the path as given.
    `options`: dtype and attention implementation of the policy and reference (``policy.dtype``, ...)."""
    options = options or {}
    critic_kind = str(algo.critic)
    policy = F.load_causal_lm(sft_path, tok, "policy.name_or_path", **options)
    hidden_size = int(policy.config.hidden_size)
    ref_cfg = algo.reference
    ref_dtype = F.load_options({"dtype": ref_cfg.get("dtype")})  # algo.reference.dtype: {} = the policy's
    if str(ref_cfg.kind) == "lora_disabled":
        policy = with_lora(policy, algo.lora, "CAUSAL_LM", key="algo.lora")
        critic = ValueModel(None, hidden_size) if critic_kind in ("policy", "shared") else None  # a head on the base
        return policy, AdapterDisabled(policy), critic
    if ref_cfg.get("path"):
        ref_path = resolved_reference or ref_cfg.path
        ref_tok = F.load_tokenizer(ref_path, "algo.reference.path")
        if not F.same_tokenizer(ref_tok, tok):
            raise ValueError(f"algo.reference.path={ref_cfg.path!r} has a different tokenizer than the policy; "
                             "the per-token KL needs the same tokenizer (same model family)")
        reference = F.load_causal_lm(ref_path, tok, "algo.reference.path", **{**options, **ref_dtype})
    elif ref_dtype:  # another dtype than the policy's: the SFT weights read again in it (no fp32 copy first)
        reference = F.load_causal_lm(sft_path, tok, "policy.name_or_path", **{**options, **ref_dtype})
    else:
        reference = copy.deepcopy(policy)
    reference.requires_grad_(False).eval()
    if critic_kind == "none":
        critic = None
    elif critic_kind == "policy":
        critic = ValueModel(copy.deepcopy(getattr(policy, policy.base_model_prefix)), hidden_size)
    elif critic_kind == "shared":  # the head reads the hidden states of the policy's own pass (PPOModule.policy_forward)
        critic = ValueModel(None, hidden_size)
    else:
        critic = critic_from_rm(scorer, tok)
    policy = with_lora(policy, algo.lora, "CAUSAL_LM", key="algo.lora")  # lora.r = 0: the policy itself
    return policy, reference, critic


def critic_from_rm(scorer, tok) -> ValueModel:
    """InstructGPT's critic: the reward model's backbone and head, the scorer's normalisation folded in."""
    members = getattr(scorer, "members", None)
    if not members:
        raise ValueError("algo.critic=rm needs a reward model (algo.reward=rm); with algo.reward=gold use "
                         "algo.critic=policy or none")
    if not F.same_tokenizer(scorer.tokenizer, tok):
        raise ValueError("algo.critic=rm initialises the critic from the reward model, which needs the RM to "
                         "share the policy's tokenizer; this RM has another tokenizer (a different-source RM). "
                         "Use algo.critic=policy or algo.critic=none")
    rm = members[0]
    rm_head = getattr(rm, "score", None)
    backbone = copy.deepcopy(getattr(rm, rm.base_model_prefix))
    backbone.requires_grad_(True)
    head = None
    if isinstance(rm_head, nn.Linear) and rm_head.in_features == int(rm.config.hidden_size):
        # value ≈ normalised reward: fold the scorer's normalisation (member 0's, then the final map) into the head
        gain, bias = float(getattr(scorer, "gain", 1.0)), float(getattr(scorer, "bias", 0.0))
        if not getattr(scorer, "normalize", True):
            gain, bias = 1.0, 0.0
        elif getattr(scorer, "member_gain", None) is not None:
            mg, mb = float(scorer.member_gain[0]), float(scorer.member_bias[0])
            gain, bias = gain * mg, gain * mb + bias
        head = nn.Linear(rm_head.in_features, 1)
        with torch.no_grad():
            head.weight.copy_(rm_head.weight[:1] * gain)
            b0 = rm_head.bias[:1] if rm_head.bias is not None else torch.zeros(1)
            head.bias.copy_(b0 * gain + bias)
    return ValueModel(backbone, int(rm.config.hidden_size), head)


def model_bytes(*objs) -> int:
    """Bytes of the distinct parameter and buffer storages of the given models (shared ones counted once)."""
    seen, total = set(), 0
    for o in objs:
        if not isinstance(o, nn.Module):
            continue
        for t in itertools.chain(o.parameters(), o.buffers()):
            key = t.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
    return total


# ------------------------------------------------------------------------------------------------
# rewards: the frozen RM or the world's gold reward


def load_reward(cfg: DictConfig, gold=None):
    """(scorer, upstream RM run id or None) for ``algo.reward``; `gold` (:class:`rlhf_lab.evaluation.policy.Gold`, default
    :func:`rlhf_lab.stages.gold.load_gold`) is the reward of ``algo.reward=gold``: the formula or the gold RM."""
    kind = str(cfg.algo.reward)
    if kind == "gold":
        gold = gold if gold is not None else G.load_gold(cfg)
        if gold.scorer is None:
            raise ValueError("algo.reward=gold is the world's gold reward, which external data (data=jsonl|hf) "
                             "does not have; use algo.reward=rm, or a gold RM (gold=rm gold.path=<folder>)")
        return gold.scorer, (upstream_run(cfg, G.rm_path(cfg)) if gold.source == "rm" else None)
    if kind != "rm":
        raise ValueError(f"algo.reward={kind!r}; choose rm (the trained reward model) or gold (oracle)")
    path = rm_stage.rm_path(cfg)
    return rm_stage.load_scorer(cfg, path), upstream_run(cfg, path)


# ------------------------------------------------------------------------------------------------
# the run


def time_summary(phases: dict[str, float], train_s: float, eval_s: float, stage: str,
                 step_totals: dict[str, float] | None = None) -> str:
    """The job summary's ``time`` line: start-up, setup (when the CLI ran the job), the training steps and the
    evaluations within the fit (``time/train_s`` − ``time/eval_s`` and ``time/eval_s``). With `step_totals` (the
    module's ``phase_totals``: the per-step ``time/*`` metrics summed over the steps), the steps' time split into
    generation, scoring, the no-grad passes, the update and the rest (statistics, gold, logging, Lightning)."""
    parts = []
    if "time/startup_s" in phases:
        parts.append(f"start-up {phases['time/startup_s']:.0f} s")
    if "time/setup_s" in phases:
        parts.append(f"setup {phases['time/setup_s']:.0f} s (upstream stages, models)")
    steps = f"{stage.upper()} steps {train_s - eval_s:.0f} s"
    keys = {f"time/{p}_s": name for p, name in StepTimer.PHASES.items()}
    if step_totals and all(k in step_totals for k in keys):
        split = [f"{name} {step_totals[k]:.1f} s" for k, name in keys.items()]
        rest = (train_s - eval_s) - sum(step_totals[k] for k in keys)
        steps += f" ({', '.join(split)}, the rest {max(rest, 0.0):.1f} s)"
    parts += [steps, f"evaluations {eval_s:.0f} s"]
    return ", ".join(parts)


def evaluate_reference(cfg: DictConfig, reference, tok, scorer, gold) -> dict[str, float]:
    """A reference that is another model than the SFT policy (``algo.reference.path``), evaluated once like the
    policy's held-out evaluation (``test/*``: the same test prompts and sampling seed), logged at step 0 as
    ``reference/*`` (``reference/gold_reward``, its ``_se``, ``reference/length``, …): what the policy is pulled
    towards (C8). The OOD slice and the KL (zero, to itself) are left out."""
    metrics, _ = evaluate(cfg, reference, tok, scorer=scorer, split="test", gold=gold, ood=False)
    return {"reference/" + k[len("test/"):]: v for k, v in metrics.items() if not k.startswith("test/kl")}


def prompt_stream(cfg: DictConfig, seed: int, n_prompts: int, rank: int = 0, world: int = 1):
    """PPO's prompts: `step -> prompts`, a fresh seeded draw of `n_prompts` **train-split** prompts per PPO
    step (never an eval, test or OOD prompt); each of `world` ranks takes its share. With ``data=jsonl|hf``
    the draw is from the dataset's training prompts (:func:`rlhf_lab.data.preferences.external_prompts`; a
    prompt-only dataset will do), without replacement within a step when there are enough."""
    if cfg.data.source != "world":
        with data_errors():  # one line naming file and line, exit 2 (the CLI); no run has started yet
            pool = external_prompts(DS.external_data(cfg))[0]

        def external_fn(step: int) -> list[str]:
            rng = random.Random(f"ppo/{seed}/{step}")
            draw = rng.sample(pool, n_prompts) if n_prompts <= len(pool) else rng.choices(pool, k=n_prompts)
            return draw[rank::world]

        return external_fn

    def prompt_fn(step: int) -> list[str]:
        return D.prompts(W.world_settings(cfg), f"ppo/{seed}/{step}", n_prompts, split="train")[rank::world]

    return prompt_fn


def build(cfg: DictConfig, out_dir: Path, spec: dict) -> dict:
    stage = stage_name(cfg)
    warnings.filterwarnings("ignore", message=".*module\\(s\\) in eval mode.*")  # intentional: no dropout in PPO
    a = cfg.algo
    check_ppo_rules(a)
    out_dir = Path(out_dir)
    sft_path, steps, seed = spec["sft"], spec["steps"], spec["seed"]
    gold = G.load_gold(cfg)  # the formula, or a gold RM with the formula beside it
    scorer, rm_run = load_reward(cfg, gold)
    L.seed_everything(seed, verbose=False)
    tok = F.load_tokenizer(sft_path, "policy.name_or_path")
    policy, reference, critic = build_models(a, sft_path, tok, scorer, resolved_reference=spec.get("reference"),
                                            options=F.load_options(cfg.policy))
    prompt_fn = prompt_stream(cfg, seed, a.batch_size // a.samples_per_prompt, distributed.rank(),
                              distributed.world_size())
    module = PPOModule(policy, reference, critic, tok, scorer, prompt_fn, settings(a, PPOConfig),  # typed settings
                       settings(cfg.kl, KLConfig), settings(cfg.generation, GenerationConfig), gold.scorer,
                       checkpoint_dir=out_dir, formula_gold=gold.formula)
    if module.compiled and distributed.is_rank_zero():
        print(f"[rlhf-lab] {stage}: algo.compile=true: the first steps compile the trunks' passes (tens of seconds "
              "on CPU, once per process; a sweep's warm workers reuse it)", flush=True)
    size = model_size(policy, critic)
    mem = {"memory/model_bytes": model_bytes(policy, reference, critic, *(getattr(scorer, "members", None) or []))}
    params = {"stage": stage, "algo": to_plain(a), "kl": to_plain(cfg.kl), "generation": to_plain(cfg.generation),
              "world": to_plain(cfg.world), "labeler": to_plain(cfg.labeler), "seed": seed, "steps": steps,
              "sft": str(sft_path), "gold": to_plain(cfg.gold) if cfg.get("gold") is not None else None}
    if spec.get("reference"):
        params["reference"] = spec["reference"]
    if cfg.get("reward_model") is not None:
        params["reward_model"] = to_plain(cfg.reward_model)
    tags = {"rlhf_lab.upstream.sft": upstream_run(cfg, sft_path)}
    if rm_run:
        tags["rlhf_lab.upstream.rm"] = rm_run
    if gold.source == "rm":
        params["gold_rm"] = str(G.rm_path(cfg))
        tags["rlhf_lab.upstream.gold_rm"] = upstream_run(cfg, G.rm_path(cfg))
    if spec.get("reference"):
        tags["rlhf_lab.upstream.reference"] = upstream_run(cfg, spec["reference"])
    resume = resume_checkpoint(cfg, stage, spec)  # pre-empted before: continue from its checkpoint, in its run
    run_file = resume.with_suffix(".run")  # the MLflow run the checkpoint belongs to
    resume_run = run_file.read_text().strip() if resume.is_file() and run_file.is_file() else None
    given = Path(str(a.resume_from)).expanduser() if a.get("resume_from") else None
    if given is not None or resume.is_file():  # either is unpickled only as tensors and plain values, never code
        check_weights_only(given or resume, "algo.resume_from" if given is not None else "cache_dir")
    with tracking.start_run(run_settings(cfg), stage, params=params, tags=tags, resume_run_id=resume_run) as run:
        if distributed.is_rank_zero() and run.info.run_id:
            resume.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(run_file, run.info.run_id)
        eval_scorer = scorer if a.reward == "rm" else None
        at_steps = eval_steps(cfg, steps, kl=lambda: module.last_stats.get("objective/kl"))  # a list, or KL-led
        # the checkpoint to ship, chosen by the ship rule at each evaluation from the proxy (none training on gold)
        ship = ship_callback(cfg, policy, tok, out_dir, lambda: module.last_stats.get("objective/scores"),
                             step_fn=lambda trainer, m: m.ppo_step) if a.reward == "rm" else None
        ev = policy_evaluations(cfg, spec, policy, tok, out_dir, at_steps, stage, reference=reference,
                                scorer=eval_scorer, gold=gold, step_fn=lambda trainer, m: m.ppo_step,
                                after=ship.on_evaluation if ship else None)  # and what a ship study turns on
        ckpt = str(given) if given is not None else (str(resume) if resume.is_file() else None)
        if ckpt and ckpt == str(resume):
            print(f"[rlhf-lab] {stage}: resuming from {resume} (this job was pre-empted before)", flush=True)
            active_run.set_tag("rlhf_lab.resumed_from", str(resume))
        preempt = Preemption(resume, step_fn=lambda trainer, m: m.ppo_step)  # last: saves what the others did
        callbacks = [ev, *([ship] if ship else []), preempt]  # the ship rule reads ev's evaluations
        trainer = L.Trainer(**trainer_kwargs(cfg, out_dir, steps, stage, callbacks=callbacks,
                                             steps_per_unit=module.updates_per_step),
                            logger=tracking.lightning_logger(run_settings(cfg)))
        active_run.log_metrics({**mem, **size}, step=0)
        ref_metrics = {}
        if spec.get("reference") and ckpt is None and distributed.is_rank_zero():  # another model: its own gold
            ref_metrics = evaluate_reference(cfg, reference, tok, eval_scorer, gold)
            active_run.log_metrics(ref_metrics, step=0)
        phases = job_phases()  # time/startup_s, time/setup_s: what the job spent before training (rlhf-lab only)
        active_run.log_metrics(phases, step=0)
        t0 = time.time()
        # a SIGTERM stops at the step's end, after a checkpoint to resume from
        with defer_sigterm(), lightning_sigterm_as_interrupted():
            trainer.fit(module, ckpt_path=ckpt, weights_only=True)  # Lightning's default for a URL was False
        resume.unlink(missing_ok=True)  # finished: nothing left to resume
        run_file.unlink(missing_ok=True)
        train_s = time.time() - t0
        trainer.save_checkpoint(str(out_dir / "ppo_last.ckpt"))  # every rank: Lightning synchronises, rank 0 writes
        distributed.check_in_sync(module, "PPO policy and critic")
        trained = whole(policy)  # trainer=fsdp / fsdp_cpu: the whole policy on rank 0, None on the others
        if not distributed.is_rank_zero():  # rank 0 saves and logs
            return {"stage": stage, "train_s": train_s}
        final = unwrap(trained.merge_and_unload()) if hasattr(trained, "merge_and_unload") else trained
        tok.save_pretrained(out_dir)
        final.save_pretrained(out_dir)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        active_run.log_metrics({"time/train_s": train_s, "time/eval_s": ev.seconds, "memory/peak_rss_mb": peak},
                             step=module.ppo_step)
        first, last = ev.first, ev.last
        summary = {
            **gold_summary(ev.test_first, ev.test_last, "SFT", f"{stage.upper()} step {module.ppo_step}"),
            "kl": f"{last.get('eval/kl', float('nan')):.2f} nats/response (eval"
                  + (f", {n_text(metric_n(last, 'eval/'), 'eval prompt')})" if metric_n(last, "eval/") else ")"),
            "beta": f"{cfg.kl.beta:.4g} -> {module.kl_ctl.beta:.4g} ({cfg.kl.name})",
            "memory": f"models {mem['memory/model_bytes'] / 2**20:.1f} MiB, peak RSS {peak:.0f} MiB",
            "time": time_summary(phases, train_s, ev.seconds, stage, module.phase_totals),
        }
        summary.update({**held_out_summary(ev), **checkpoints_summary(ev)})
        t0, t1 = ev.test_first, ev.test_last
        if "test/formula_gold_reward" in t1:
            summary["formula"] = (f"{t0['test/formula_gold_reward']:.3f} -> {t1['test/formula_gold_reward']:.3f} "
                                  "(test prompts; the world's formula beside the gold RM)")
        if gold.source == "rm":
            summary["gold is"] = G.describe(cfg)
        if "reference/gold_reward" in ref_metrics:
            summary["reference"] = (f"its own test gold {ref_metrics['reference/gold_reward']:.3f} "
                                    f"({cfg.algo.reference.path})")
        if "test/proxy_reward" in t1:
            summary["proxy"] = proxy_line(t0, t1)
        if ship:  # last, one line: the checkpoint to ship, and the gold's own best beside it where a gold exists
            summary.update(ship_summary(ship, ev))
        return {"run_id": run.info.run_id, "stage": stage, "eval": last, "eval_start": first, "summary": summary,
                "test": ev.test_last, "test_start": ev.test_first,
                "ppo_steps": module.ppo_step, "beta": module.kl_ctl.beta, "global_step": trainer.global_step,
                "train_s": train_s, **mem, **size, "memory/peak_rss_mb": peak,
                "ship_step": ship.choice.step if ship else None, "ship_path": ship.path if ship else None}
