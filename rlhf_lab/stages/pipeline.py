"""The stage pipeline: which module builds a stage, its seed and steps, the artifact cache, and the two entry
points :func:`ensure` (an upstream artifact, built first when missing) and :func:`run_job` (the job stage).

Seeds: the job uses the top-level ``seed``; an upstream stage uses its own group's ``seed`` (e.g.
``sft.seed``), so that a sweep over ``seed`` shares one SFT model and one RM. Steps: ``trainer.max_steps``
sets the job's steps; upstream stages use their group's ``steps``.
"""

from __future__ import annotations

import importlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlhf_lab.runs import distributed, tracking
from rlhf_lab.runs.cache import ArtifactCache, announce_reuse
from rlhf_lab.runs.contents import absolute_if_local
from rlhf_lab.data.errors import data_errors
from rlhf_lab.config.keys import configured_uri, experiment_name, to_plain
from rlhf_lab.config.ppo_rules import PPO_FAMILY
from rlhf_lab.runs.jobs import RunSettings
from rlhf_lab.runs.process import launch_path, release_memory
from rlhf_lab.runs.tracking_server import tracking_uri


STAGES = ("pretrain", "sft", "prefs", "rm", "cover", "ppo", "dpo", "bon")  # a module of stages/ each
# the jobs that run another stage's module under their own name (GRPO and RLOO: the PPO stage with their settings,
# conf/algo/<name>.yaml; rlhf_lab.config.ppo_rules has what defines them): their runs, seeds and steps are theirs
ALIASES = {name: "ppo" for name in PPO_FAMILY if name != "ppo"}
JOBS = ("pretrain", "sft", "rm", "ppo", "dpo", *ALIASES, "bon")  # what `algo` can name


def run_settings(cfg: DictConfig) -> RunSettings:
    """Where this config's runs go and what they record of the job (:class:`rlhf_lab.runs.jobs.RunSettings`)."""
    job = cfg.algo.get("name") if cfg.get("algo") is not None else None
    return RunSettings(uri=tracking_uri(configured_uri(cfg)), experiment=experiment_name(cfg),
                       study=str(cfg.study) if cfg.get("study") else None,
                       job=str(job) if job is not None else None, config=to_plain(cfg),
                       all_authors=bool(OmegaConf.select(cfg, "tracking.all_authors", default=False)))


def stage_module(stage: str):
    """The module that builds `stage` (an alias's: the stage it runs)."""
    if stage not in STAGES and stage not in ALIASES:
        raise ValueError(f"unknown stage {stage!r}; the stages are {', '.join((*STAGES, *ALIASES))}")
    return importlib.import_module(f"rlhf_lab.stages.{ALIASES.get(stage, stage)}")


def cache_for(cfg: DictConfig) -> ArtifactCache:
    """The artifact cache at ``cache_dir`` (a relative one is the launch folder's: runs.process.launch_path)."""
    return ArtifactCache(launch_path(cfg.cache_dir))


def job_stage(cfg: DictConfig) -> str:
    return str(cfg.algo.name)


def stage_seed(cfg: DictConfig, stage: str, group: str | None = None) -> int:
    return int(cfg.seed) if job_stage(cfg) == stage else int(cfg[group or stage].seed)


def job_steps(cfg: DictConfig, stage: str, default: int) -> int:
    if job_stage(cfg) == stage and cfg.trainer.get("max_steps") is not None:
        return cfg.trainer.max_steps
    return int(default)


def generation_spec(cfg: DictConfig) -> dict:
    """The ``generation`` settings that determine sampled text, for an artifact's spec: all but ``sampler`` (both
    samplers draw the same tokens, so the choice does not change an artifact) and ``dtype`` (it acts on the PPO
    family's rollouts only, and a PPO run is not cached: preference pairs and DPO sample the policy itself)."""
    return {k: v for k, v in to_plain(cfg.generation).items() if k not in ("sampler", "dtype")}


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
        p = str(absolute_if_local(str(cfg.policy.name_or_path)))  # absolute: a key sees its content (runs.contents)
        return Path(p) if Path(p).exists() else p
    if stage == "sft" and job_stage(cfg) != "sft" and int(cfg.sft.steps) == 0:  # no SFT: the base is the policy
        return ensure("pretrain", cfg)
    spec = mod.spec(cfg)
    if stage in TRAINED_STAGES and str(cfg.trainer.precision) not in FULL_PRECISION:
        spec["precision"] = str(cfg.trainer.precision)  # bf16 and fp32 builds are different models
    cache = cache_for(cfg)
    t0 = time.time()

    def build(tmp: Path):
        if job_stage(cfg) == stage:
            return mod.build(cfg, tmp, spec)
        # an upstream stage: say why this job is doing something else first; built by one process (rank 0)
        print(f"[rlhf-lab] {stage}: building the {mod.WHAT} that this {job_stage(cfg)} job needs (no cached "
              f"artifact for its config yet) -> {cache.path(stage, spec)}", flush=True)
        with distributed.single_process():
            return mod.build(cfg, tmp, spec)

    with tracking.status_after_writes():  # the stage's run ends FINISHED only once its artifact is in the cache
        path, built = cache.get_or_build(stage, spec, build)
    if built:  # its models, gradients and optimizer states, before the job loads its own
        release_memory()
    if not built:
        announce_reuse(stage, mod.WHAT, path)
    elif job_stage(cfg) != stage:
        print(f"[rlhf-lab] {stage}: built and cached in {time.time() - t0:.0f} s", flush=True)
    return path


def run_job(cfg: DictConfig, out_dir: Path) -> dict:
    """Run the job named by ``algo`` (on every rank when ``trainer.devices > 1``); returns rank 0's metadata.
    External data (``data=jsonl|hf``) is read and split first, so its errors come before any training."""
    name = job_stage(cfg)
    if name not in JOBS:
        raise ValueError(f"algo={name!r} is not a known algorithm; choose one of {', '.join(JOBS)}")
    if cfg.data.source != "world" and name not in ("pretrain", "sft"):
        from rlhf_lab.config import data as DS
        from rlhf_lab.data.preferences import load_examples

        # read, check and split the data as the job will (PPO's family: a prompt-only dataset will do) before any
        # upstream stage trains: a bad row or too few prompts for a held-out split fails in seconds, not after training
        with data_errors():  # one line naming the file and line, or how many prompts a held-out split needs
            load_examples(DS.external_data(cfg), prompt_only=name in PPO_FAMILY)
    out_dir = Path(out_dir)
    try:
        return distributed.launch(to_plain(cfg.trainer), out_dir, lambda d: run_rank(cfg, d),
                                  f"{__name__}:run_rank", lambda: OmegaConf.to_yaml(cfg, resolve=True))
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
