"""What every stage shares: the cache, seeds and steps, the Lightning trainer, evaluation, model sizes,
and the two entry points :func:`ensure` (an upstream artifact) and :func:`run_job` (the job stage).

Seeds: the job uses the top-level ``seed``; an upstream stage uses its own group's ``seed`` (e.g.
``sft.seed``), so that a sweep over ``seed`` shares one SFT model and one RM. Steps: ``trainer.max_steps``
sets the job's steps; upstream stages use their group's ``steps``.
"""

from __future__ import annotations

import copy
import importlib
import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from rlhf_lab.models.batching import collate_right
from rlhf_lab.world import streams as D
from rlhf_lab.runs import distributed, tracking
from rlhf_lab.runs.cache import ArtifactCache, announce_reuse, write_json_atomic
from rlhf_lab.data.errors import data_errors
from rlhf_lab.runs.identity import source_digest  # the code's digest, part of the start evaluation's key
from rlhf_lab.runs.process import NOT_COMPUTED, drop_keys, launch_path, to_plain
from rlhf_lab.runs.states import lightning_sigterm_as_interrupted

STAGES = ("pretrain", "sft", "prefs", "rm", "ppo", "dpo", "grpo", "rloo", "bon")
JOBS = ("pretrain", "sft", "rm", "ppo", "dpo", "grpo", "rloo", "bon")  # the stages `algo` can name


def stage_module(stage: str):
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}")
    return importlib.import_module(f"rlhf_lab.stages.{stage}")


def cache_for(cfg: DictConfig) -> ArtifactCache:
    """The artifact cache at ``cache_dir`` (a relative one is the launch folder's: runtime.launch_path)."""
    return ArtifactCache(launch_path(cfg.cache_dir))


def job_stage(cfg: DictConfig) -> str:
    return str(cfg.algo.name)


def stage_seed(cfg: DictConfig, stage: str, group: str | None = None) -> int:
    return int(cfg.seed) if job_stage(cfg) == stage else int(cfg[group or stage].seed)


def job_steps(cfg: DictConfig, stage: str, default: int) -> int:
    if job_stage(cfg) == stage and cfg.trainer.get("max_steps") is not None:
        return cfg.trainer.max_steps
    return int(default)


def eval_steps(cfg: DictConfig, total_steps: int) -> list[int]:
    """The job's evaluation steps after step 0 from ``eval.schedule`` (callbacks.evaluation_steps)."""
    from rlhf_lab.evaluation.callbacks import evaluation_steps

    e = cfg.eval
    return evaluation_steps(e.schedule, total_steps, e.every_n_steps, e.n_points)


def generation_spec(cfg: DictConfig) -> dict:
    """The ``generation`` settings that determine sampled text, for an artifact's spec: all but ``sampler`` (both
    samplers draw the same tokens, so the choice does not change an artifact)."""
    return {k: v for k, v in to_plain(cfg.generation).items() if k != "sampler"}


def upstream_run(cfg: DictConfig, path) -> str:
    """The MLflow run that built a cached artifact (its folder when it was not built by a run)."""
    p = Path(str(path))
    return cache_for(cfg).meta(p).get("run_id", str(path)) if p.exists() else str(path)


TRAINED_STAGES = ("pretrain", "sft", "rm")  # the upstream stages whose artifact a trainer fits
FULL_PRECISION = ("32", "32-true")  # trainer.precision of the keys cached before it was part of them


def ensure(stage: str, cfg: DictConfig) -> Path:
    """The cached artifact of `stage` for this config; built first (as its own MLflow run) when missing.

    ``pretrain`` builds the base model of ``cfg.policy`` (a reward-model backbone passes a config whose
    ``policy`` is the backbone); a ``policy.name_or_path`` checkpoint is used as it is. ``sft.steps=0``: no
    SFT stage, the base model (that checkpoint) is the SFT policy."""
    mod = stage_module(stage)
    if stage == "pretrain" and cfg.policy.get("name_or_path"):
        p = str(cfg.policy.name_or_path)
        return Path(p) if Path(p).exists() else p
    if stage == "sft" and job_stage(cfg) != "sft" and int(cfg.sft.steps) == 0:  # no SFT: the base is the policy
        return ensure("pretrain", cfg)
    spec = mod.spec(cfg)
    if stage in TRAINED_STAGES and str(cfg.trainer.precision) not in FULL_PRECISION:
        spec["precision"] = str(cfg.trainer.precision)  # bf16 and fp32 builds are different models
    cache = cache_for(cfg)
    t0 = time.time()

    def build(tmp: Path):
        if job_stage(cfg) != stage:  # an upstream stage: say why this job is doing something else first
            print(f"[rlhf-lab] {stage}: building the {mod.WHAT} that this {job_stage(cfg)} job needs (no cached "
                  f"artifact for its config yet) -> {cache.path(stage, spec)}", flush=True)
        return mod.build(cfg, tmp, spec)

    with tracking.status_after_writes():  # the stage's run ends FINISHED only once its artifact is in the cache
        path, built = cache.get_or_build(stage, spec, build)
    if not built:
        announce_reuse(stage, mod.WHAT, path)
    elif job_stage(cfg) != stage:
        print(f"[rlhf-lab] {stage}: built and cached in {time.time() - t0:.0f} s", flush=True)
    return path


# ------------------------------------------------------------------------------------------------
# checkpoints named in config by stage and policy preset: `sft@a_tiny`

PRESET_STAGES = ("pretrain", "sft")  # stages whose artifact is a causal LM with its tokenizer


def policy_presets() -> list[str]:
    """The names of the policy presets (``conf/policy/<name>.yaml``)."""
    from importlib.resources import files

    return sorted(p.name[: -len(".yaml")] for p in files("rlhf_lab.conf").joinpath("policy").iterdir()
                  if p.name.endswith(".yaml"))


def policy_preset(name: str, key: str = "policy") -> DictConfig:
    """The policy config of a preset, as ``policy=<name>`` composes it (``conf/policy/<name>.yaml``)."""
    from importlib.resources import files

    f = files("rlhf_lab.conf").joinpath("policy", f"{name}.yaml")
    if not f.is_file():
        raise ValueError(f"{key}: no policy preset {name!r}; the presets are {', '.join(policy_presets())}")
    node = OmegaConf.create(f.read_text())
    with open_dict(node):
        node.pop("defaults", None)
    return node


def parse_preset_ref(value: Any) -> tuple[str, str] | None:
    """``(stage, preset)`` for a value ``<stage>@<policy preset>`` (e.g. ``sft@a_tiny``), else None."""
    if value is None:
        return None
    m = re.fullmatch(r"([a-z]+)@([A-Za-z0-9_.-]+)", str(value).strip())
    if m is None or m.group(1) not in PRESET_STAGES or Path(str(value)).exists():
        return None
    return m.group(1), m.group(2)


def preset_config(cfg: DictConfig, preset: str, key: str) -> DictConfig:
    """`cfg` with ``policy`` replaced by the preset, checked to share the policy's tokenizer.

    A family's tokenizer is trained on the family's corpus sample (``pretrain_<family>``: world and
    ``pretrain.n_texts``) with ``vocab_size`` tokens, whatever the size, so two presets of one family with
    the same ``vocab_size`` share it (the family-a presets all do)."""
    p, pol = policy_preset(preset, key), cfg.policy
    if pol.get("name_or_path"):
        raise ValueError(f"{key}: the preset {preset!r} is trained on the world, with the world's tokenizer, but the "
                         f"policy is the checkpoint policy.name_or_path={pol.name_or_path!r}; give {key} a checkpoint "
                         "folder with the policy's tokenizer instead")
    if (str(p.family), int(p.vocab_size)) != (str(pol.family), int(pol.vocab_size)):
        same = [n for n in policy_presets() if (str(policy_preset(n).family), int(policy_preset(n).vocab_size))
                == (str(pol.family), int(pol.vocab_size))]
        raise ValueError(f"{key}: the preset {preset!r} (family {p.family}, vocab_size {p.vocab_size}) has another "
                         f"tokenizer than the policy (family {pol.family}, vocab_size {pol.vocab_size}); the per-token "
                         f"log-ratios need one tokenizer. Presets that share it: {', '.join(same) or 'none'}")
    c = copy.deepcopy(cfg)
    with open_dict(c):
        c.policy = p
    return c


def checkpoint_path(cfg: DictConfig, value: Any, key: str, tokenizer_of=None) -> str:
    """A checkpoint named in config. ``<stage>@<policy preset>`` (``sft@a_tiny``, ``pretrain@a_medium``) is that
    preset's artifact of `stage`, built first (as its own MLflow run) or reused through :func:`ensure` with every
    other setting of `cfg`; any other value (a folder, a hub name) is returned as it is. With `tokenizer_of` (a
    checkpoint folder, e.g. the policy's SFT) the resolved checkpoint must have the same tokenizer."""
    ref = parse_preset_ref(value)
    if ref is None:
        return str(value)
    stage, preset = ref
    path = str(ensure(stage, preset_config(cfg, preset, key)))
    if tokenizer_of is not None:
        from rlhf_lab.models import families as F

        if not F.same_tokenizer(F.load_tokenizer(path, key), F.load_tokenizer(tokenizer_of, key)):
            raise ValueError(f"{key}={value}: the checkpoint {path} has another tokenizer than {tokenizer_of}; "
                             "the per-token log-ratios need one tokenizer")
    return path


def trainer_kwargs(cfg: DictConfig, out_dir: Path, steps: int, stage: str, callbacks: list | tuple = (),
                   steps_per_unit: int = 1, label: str | None = None) -> dict:
    """Lightning Trainer arguments for `stage`: `steps` units of `steps_per_unit` optimizer steps each (a PPO
    step is several), its `callbacks` and, when ``trainer.progress_bar``, a bar named `label` (default: the
    stage) that counts units (:class:`rlhf_lab.runs.progress.StageBar`). Only the job stage runs on
    ``trainer.devices`` processes with ``trainer.strategy``; upstream stages are built by one process
    (rlhf_lab/runs/distributed.py)."""
    from rlhf_lab.runs.progress import StageBar

    t = cfg.trainer
    show_bar = bool(t.progress_bar)
    kw = dict(
        max_steps=int(steps) * int(steps_per_unit), accelerator=t.accelerator, devices=1, precision=t.precision,
        log_every_n_steps=t.log_every_n_steps, enable_checkpointing=False, enable_model_summary=False,
        default_root_dir=str(out_dir), num_sanity_val_steps=0,
    )
    if job_stage(cfg) == stage and distributed.n_processes(cfg) > 1:
        kw.update(devices=t.devices, num_nodes=int(t.get("num_nodes", 1) or 1), strategy=strategy(t),
                  use_distributed_sampler=False)  # the loaders slice each global batch (GlobalBatchSampler)
        show_bar = show_bar and distributed.is_rank_zero()
    elif job_stage(cfg) == stage and t.get("strategy") not in (None, "auto"):
        kw["strategy"] = strategy(t)
    bar = [StageBar(label or stage, int(steps), steps_per_unit)] if show_bar else []
    kw.update(enable_progress_bar=show_bar, callbacks=[*bar, *callbacks])
    return kw


def strategy(t: DictConfig):
    """``trainer.strategy`` as Lightning takes it: a name, or a ``_target_`` config of a Strategy object."""
    s = t.get("strategy", "auto")
    if isinstance(s, DictConfig):
        from hydra.utils import instantiate

        return instantiate(s)
    return str(s)


OOD_NAMES = {"gold_reward": "gold_reward_ood", "gold_reward_se": "gold_reward_ood_se",
             "formula_gold_reward": "formula_gold_reward_ood", "formula_gold_reward_se": "formula_gold_reward_ood_se",
             "proxy_reward": "proxy_reward_ood", "proxy_reward_se": "proxy_reward_ood_se"}


def world_gold(cfg: DictConfig):
    """The world's formula as a scorer (:class:`rlhf_lab.evaluation.policy.GoldScorer`) with ``data=world``; None with
    external data. The job's gold (the formula or a gold RM, config group ``gold``) is
    :func:`rlhf_lab.stages.gold.load_gold`."""
    from rlhf_lab.evaluation.policy import GoldScorer

    return GoldScorer(D.gold_weights(cfg)) if cfg.data.source == "world" else None


def evaluation_prompts(cfg: DictConfig, split: str) -> list[str]:
    """The fixed prompts of an evaluation split. World data: :func:`rlhf_lab.world.streams.eval_prompts`. External data
    (``data=jsonl|hf``): the first ``eval.n_prompts`` of the dataset's eval-split prompts, or the first
    ``eval.n_test_prompts`` of its test-split ones (all of them when it has fewer;
    :func:`rlhf_lab.data.preferences.external_prompts`: split by prompt, never a training prompt, eval and test
    disjoint), no ``ood``."""
    if cfg.data.source == "world":
        return D.eval_prompts(cfg, split)
    from rlhf_lab.data.preferences import external_prompts

    if split == "ood":
        return []
    with data_errors():
        _, eval_prompts, test_prompts = external_prompts(cfg)
    n = int(cfg.eval[D.EVAL_SIZE_KEYS[split]])
    return (eval_prompts if split == "eval" else test_prompts)[:n]


def evaluate(cfg: DictConfig, policy, tok, reference=None, scorer=None, split: str = "eval", gold=None,
             ood: bool = True):
    """Metrics and a samples table of `policy` on fixed evaluation prompts.

    `gold` (:class:`rlhf_lab.evaluation.policy.Gold`): the job's gold, :func:`rlhf_lab.stages.gold.load_gold` (with a gold
    RM also the ``formula_gold_reward`` metrics); None is the world's formula (the upstream pretrain and SFT runs,
    whose models every gold shares).

    ``eval`` (every evaluation during training): ``eval/*`` on ``eval.n_prompts`` eval-split prompts, with
    the SEs and the halves A/B. ``test`` (the start and the end of a policy job only): ``test/*`` on
    ``eval.n_test_prompts`` test-split prompts, plus the OOD slice (``eval/gold_reward_ood``, ``_se``, and
    the proxy's) on ``eval.n_ood_prompts`` prompts when that is > 0 and `ood` (rewards only, no forward passes).
    Each prompt list samples with its own fixed seed (common random numbers across evaluations and runs)."""
    from rlhf_lab.evaluation.policy import Gold, evaluate_policy

    e = cfg.eval
    g = gold if gold is not None else Gold(world_gold(cfg))
    kw = dict(gen=cfg.generation, gold=g.scorer, formula_gold=g.formula, scorer=scorer, batch_size=int(e.batch_size),
              samples_per_prompt=int(e.samples_per_prompt))
    seed = lambda s: D.stream_seed(cfg.world.seed, f"{s}/sampling")  # noqa: E731
    if split == "eval":
        return evaluate_policy(policy, tok, evaluation_prompts(cfg, "eval"), reference=reference,
                               n_rows=e.n_samples_logged, prefix="eval/", halves=True, seed=seed("eval"), **kw)
    if split != "test":
        raise ValueError(f"evaluate(split={split!r}): choose eval or test")
    metrics, rows = evaluate_policy(policy, tok, evaluation_prompts(cfg, "test"), reference=reference,
                                    n_rows=e.n_samples_logged, prefix="test/", seed=seed("test"), **kw)
    ood_prompts = evaluation_prompts(cfg, "ood") if ood and int(e.n_ood_prompts) > 0 else []
    if ood_prompts:
        ood, _ = evaluate_policy(policy, tok, ood_prompts, prefix="", seed=seed("ood"),
                                 details=False, **kw)
        metrics.update({f"eval/{OOD_NAMES[k]}": v for k, v in ood.items() if k in OOD_NAMES})
    return metrics, rows


# The config keys that cannot change a policy job's evaluations at its start, where the policy is still the SFT
# policy: its seed (every evaluation samples with the world's own seeds), the KL controller, when later evaluations
# run, and the settings of the rollouts and updates. Every other key (and the code) is part of the start's key.
START_EVAL_IGNORES = (
    "seed", "kl", "trainer.max_steps", "eval.every_n_steps", "eval.schedule", "eval.n_points", "algo.steps",
    "algo.batch_size", "algo.samples_per_prompt", "algo.ppo_epochs", "algo.num_minibatches", "algo.lr",
    "algo.critic_lr", "algo.clip_eps", "algo.clip_eps_high", "algo.loss_agg", "algo.value_clip_eps", "algo.vf_coef",
    "algo.entropy_coef", "algo.gamma", "algo.lam", "algo.whiten_advantages", "algo.max_grad_norm", "algo.packing",
    "algo.trim_minibatches", "algo.compile", "algo.kl_estimator", "algo.kl_in", "algo.baseline", "algo.advantage_scale",
    "algo.length_penalty", "algo.missing_eos_penalty", "algo.reward_clip", "algo.checkpoint_every",
    "algo.hacking_monitor", "algo.max_kl", "algo.min_entropy", "algo.max_approxkl", "algo.max_entropy_ratio",
    "algo.reference.sync_every")
START_EVAL_FILE = "start_evaluation.json"


def start_evaluation(cfg: DictConfig, stage: str, spec: dict):
    """For ``eval.reuse_start`` (default true): the policy job's evaluations at its start (``eval/*`` and ``test/*``
    of the SFT policy, before any update), kept in the artifact cache (``start_eval/``) and reused by every job that
    would compute the same ones: the same SFT policy, reference, reward, gold and evaluation settings, and the same
    code, whatever its seed, β or update settings (:data:`START_EVAL_IGNORES`). Reused, the metrics and sample rows
    are the computed ones to the last digit (the evaluations sample under their own seeds, outside the training's
    random stream, so skipping them changes nothing else). Returns `(split, compute) -> (metrics, rows)` for
    :class:`rlhf_lab.evaluation.callbacks.PeriodicEval`, or None (``eval.reuse_start=false``: computed by every job)."""
    if not cfg.eval.get("reuse_start", False):
        return None
    config = drop_keys(to_plain(cfg), (*NOT_COMPUTED, *START_EVAL_IGNORES))
    base = {"job": stage, "sft": str(spec["sft"]), "reference": spec.get("reference"), "config": config,
            "code": source_digest()}
    cache = cache_for(cfg)

    def start(split: str, compute):
        done: list = []

        def build(tmp: Path):
            done.append(compute())
            write_json_atomic(tmp / START_EVAL_FILE, {"metrics": done[0][0], "rows": done[0][1]})
            return {"split": split}

        try:
            path, built = cache.get_or_build("start_eval", {**base, "split": split}, build)
        except OSError as err:  # a read-only or full cache: the job computes its own, as with reuse_start=false
            print(f"[rlhf-lab] {stage}: could not keep the start-of-run evaluation in the cache ({err}); computed "
                  "by this job (eval.reuse_start=false silences this)", flush=True)
            return done[0] if done else compute()
        if not built:
            announce_reuse(stage, f"start-of-run evaluation ({split}/*) of the SFT policy", path)
        tracking.set_tag(f"rlhf_lab.start_eval.{split}", str(path))
        data = json.loads((path / START_EVAL_FILE).read_text())
        return data["metrics"], data["rows"]

    return start


def model_size(model, *also_trained) -> dict[str, float]:
    """``model/params_total``: the parameters of the model the stage produces (LoRA adapters included);
    ``model/params_trainable``: those the optimiser updates, in it and in `also_trained` (e.g. PPO's critic)."""
    def trainable(m) -> int:
        return sum(p.numel() for p in m.parameters() if p.requires_grad) if m is not None else 0

    return {"model/params_total": float(sum(p.numel() for p in model.parameters())),
            "model/params_trainable": float(trainable(model) + sum(trainable(m) for m in also_trained))}


def fit_lm(cfg: DictConfig, stage: str, model, tok, examples: list[dict], sc: DictConfig, steps: int,
           out_dir: Path, params: dict, upstream: dict[str, str] | None = None, gold=None) -> dict:
    """Train a causal LM with next-token cross-entropy (pretrain and sft) as one MLflow run; save it. `gold`: the
    job's gold for its evaluations (:func:`evaluate`; None: the formula, as for an upstream stage)."""
    import time

    import lightning as L
    import torch

    from rlhf_lab.algorithms.lm import CausalLMModule
    from rlhf_lab.evaluation.callbacks import PeriodicEval

    run_params = {"stage": stage, stage: to_plain(sc), "world": to_plain(cfg.world), "seed": stage_seed(cfg, stage),
                  "steps": steps, **params}
    tags = {f"rlhf_lab.upstream.{k}": v for k, v in (upstream or {}).items()}
    with tracking.start_run(cfg, stage, params=run_params, tags=tags) as run:
        g = torch.Generator().manual_seed(stage_seed(cfg, stage))
        loader = distributed.loader(examples, sc.batch_size, g, collate_right(tok), key=f"{stage}.batch_size")
        module = CausalLMModule(model, lr=sc.lr, weight_decay=sc.weight_decay,
                                warmup_steps=sc.warmup_steps, max_steps=steps)
        is_job = job_stage(cfg) == stage
        ev = PeriodicEval(lambda: evaluate(cfg, model, tok, gold=gold),
                          at_steps=eval_steps(cfg, steps) if is_job else (), at_start=is_job,
                          test=(lambda: evaluate(cfg, model, tok, split="test", gold=gold)) if is_job else None)
        trainer = L.Trainer(**trainer_kwargs(cfg, out_dir, steps, stage, callbacks=[ev]),
                            logger=tracking.lightning_logger(cfg))
        size = model_size(model)
        tracking.log_metrics(size, step=0)
        t0 = time.time()
        with lightning_sigterm_as_interrupted():
            trainer.fit(module, loader)
        distributed.check_in_sync(model, stage)
        if not distributed.is_rank_zero():
            return {"stage": stage}
        model.eval()
        tok.save_pretrained(out_dir)
        model.save_pretrained(out_dir)
        tracking.log_metric("time/train_s", time.time() - t0)
        meta = {"run_id": run.info.run_id, "stage": stage, "eval": ev.last, "train_s": time.time() - t0, **size}
        if ev.test_last:
            test_gold = gold_summary(ev.test_first, ev.test_last, "start", f"{stage} step {steps}")
            meta.update(test=ev.test_last, test_start=ev.test_first, summary={"test gold": test_gold})
        return meta


def gold_summary(first: dict, last: dict, start: str, end: str) -> str:
    """The job summary's gold figure: test-split gold (± its SE) at the start and at the end of the job."""
    def fmt(m: dict) -> str:
        return f"{m.get('test/gold_reward', float('nan')):.3f} ± {m.get('test/gold_reward_se', float('nan')):.3f}"

    if "test/gold_reward" not in (last or {}):
        return "no gold reward (external data: data=jsonl|hf)"
    return f"{fmt(first)} -> {fmt(last)} ({start} -> {end}; test prompts, ± SE)"


def held_out_summary(ev) -> dict[str, str]:
    """The job summary's gold on the eval prompts (first -> last evaluation, the last one's SE) and on the held-out
    products (start -> end of the job, ± SE), where they were logged."""
    out = {}
    g0, g1 = ev.first.get("eval/gold_reward", float("nan")), ev.last.get("eval/gold_reward")
    if g1 is not None:
        out["eval gold"] = (f"{g0:.3f} -> {g1:.3f} (eval prompts, SE "
                            f"{ev.last.get('eval/gold_reward_se', float('nan')):.3f})")
    t0, t1 = ev.test_first, ev.test_last
    if "eval/gold_reward_ood" in t1:
        out["ood gold"] = (f"{t0['eval/gold_reward_ood']:.3f} ± {t0['eval/gold_reward_ood_se']:.3f} -> "
                           f"{t1['eval/gold_reward_ood']:.3f} ± {t1['eval/gold_reward_ood_se']:.3f} "
                           "(held-out products)")
    return out


# ------------------------------------------------------------------------------------------------
# the job: the stage named by `algo`


def run_job(cfg: DictConfig, out_dir: Path) -> dict:
    """Run the job named by ``algo`` (on every rank when ``trainer.devices > 1``); returns rank 0's metadata.
    External data (``data=jsonl|hf``) is read and split first, so its errors come before any training."""
    name = job_stage(cfg)
    if name not in JOBS:
        raise ValueError(f"algo={name!r} is not a known algorithm; choose one of {', '.join(JOBS)}")
    if cfg.data.source != "world" and name not in ("pretrain", "sft"):
        from rlhf_lab.config.checks import PPO_FAMILY
        from rlhf_lab.data.preferences import load_examples

        # read, check and split the data as the job will (PPO's family: a prompt-only dataset will do) before any
        # upstream stage trains: a bad row or too few prompts for a held-out split fails in seconds, not after training
        with data_errors():  # one line naming the file and line, or how many prompts a held-out split needs
            load_examples(cfg, prompt_only=name in PPO_FAMILY)
    out_dir = Path(out_dir)
    try:
        return distributed.launch(cfg, out_dir, run_rank)
    finally:
        for scratch in out_dir.glob(".rank*"):  # the other ranks' throw-away outputs
            shutil.rmtree(scratch, ignore_errors=True)


def run_rank(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """One rank of the job: build the job stage into ``<out_dir>/artifact``; rank 0 publishes it."""
    stage = job_stage(cfg)
    mod = stage_module(stage)
    art = distributed.rank_out_dir(out_dir) / "artifact"
    art.mkdir(parents=True, exist_ok=True)
    spec = mod.spec(cfg)  # ensures the upstream stages first, each as its own run
    with tracking.status_after_writes():  # the job's run ends FINISHED only after its last write (cache, summary)
        meta = mod.build(cfg, art, spec)
        if not distributed.is_rank_zero():
            return meta
        if getattr(mod, "CACHED", True):
            meta["cache_path"] = str(cache_for(cfg).publish(stage, spec, art, meta))
        meta["artifact"] = str(art)
        (out_dir / "summary.json").write_text(json.dumps(meta, indent=2, default=str))
    return meta
