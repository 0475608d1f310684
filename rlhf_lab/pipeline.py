"""Stages and their upstream artifacts: pretrain -> sft -> (rm) -> ppo / dpo.

Each stage's output is keyed by the config that determines it (see cache.py). ``ensure_<stage>``
returns the artifact's folder, training it first as its own tracked MLflow run when it is missing.
The stage named by ``algo`` is the job: it always runs, writes into the Hydra output folder, and
publishes its artifact to the cache when the key is not there yet.

Seeds: the job uses the top-level ``seed``; an upstream stage uses its own group's ``seed`` (e.g.
``sft.seed``), so that a sweep over ``seed`` shares one SFT model and one RM.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from rlhf_lab.runtime import to_plain
from rlhf_lab import data as D
from rlhf_lab import distributed
from rlhf_lab import tracking
from rlhf_lab.cache import ArtifactCache, announce_reuse
from rlhf_lab.models import families as F



def cache_for(cfg: DictConfig) -> ArtifactCache:
    return ArtifactCache(cfg.cache_dir)


def job_stage(cfg: DictConfig) -> str:
    return str(cfg.algo.name)


def stage_seed(cfg: DictConfig, stage: str, group: str | None = None) -> int:
    return int(cfg.seed) if job_stage(cfg) == stage else int(cfg[group or stage].seed)


def trainer_kwargs(cfg: DictConfig, out_dir: Path, steps: int, stage: str) -> dict:
    """Lightning Trainer arguments for `stage`. Only the job stage runs on ``trainer.devices`` processes
    with ``trainer.strategy``; upstream stages are built by one process (rlhf_lab/distributed.py)."""
    t = cfg.trainer
    kw = dict(
        max_steps=int(steps), accelerator=t.accelerator, devices=1, precision=t.precision,
        log_every_n_steps=int(t.log_every_n_steps), enable_checkpointing=False, enable_model_summary=False,
        default_root_dir=str(out_dir), num_sanity_val_steps=0, enable_progress_bar=bool(t.progress_bar),
    )
    if job_stage(cfg) == stage and distributed.n_processes(cfg) > 1:
        kw.update(devices=t.devices, num_nodes=int(t.get("num_nodes", 1) or 1), strategy=_strategy(t),
                  use_distributed_sampler=False)  # the loaders slice each global batch (GlobalBatchSampler)
        kw["enable_progress_bar"] = kw["enable_progress_bar"] and distributed.is_rank_zero()
    elif job_stage(cfg) == stage and t.get("strategy") not in (None, "auto"):
        kw["strategy"] = _strategy(t)
    return kw


def _strategy(t: DictConfig):
    """``trainer.strategy`` as Lightning takes it: a name, or a ``_target_`` config of a Strategy object."""
    s = t.get("strategy", "auto")
    if isinstance(s, DictConfig):
        from hydra.utils import instantiate

        return instantiate(s)
    return str(s)


def job_steps(cfg: DictConfig, stage: str, default: int) -> int:
    if job_stage(cfg) == stage and cfg.trainer.get("max_steps") is not None:
        return int(cfg.trainer.max_steps)
    return int(default)


# ------------------------------------------------------------------------------------------------
# pretrain: tokenizer + base LM of one family on the world's corpus


def pretrain_spec(cfg: DictConfig, model_cfg: DictConfig) -> dict:
    return {
        "family": model_cfg.family, "arch": to_plain(model_cfg.arch), "vocab_size": int(model_cfg.vocab_size),
        "world": D.world_generation_spec(cfg), "pretrain": to_plain(cfg.pretrain),
        "seed": stage_seed(cfg, "pretrain"), "steps": job_steps(cfg, "pretrain", cfg.pretrain.steps),
    }


def train_pretrain(cfg: DictConfig, model_cfg: DictConfig, out_dir: Path) -> dict:
    spec = pretrain_spec(cfg, model_cfg)
    family = str(model_cfg.family)
    pc = cfg.pretrain
    L.seed_everything(spec["seed"], verbose=False)
    corpus = D.reviews(cfg, f"pretrain_{family}", int(pc.n_texts))
    tok = F.train_tokenizer(family, [p + " " + r for p, r in corpus], int(model_cfg.vocab_size))
    model = F.build_model(family, model_cfg.arch, tok)
    examples = D.encode_pairs(tok, corpus, int(pc.max_len), loss_on_prompt=True)
    from rlhf_lab.algorithms.lm import CausalLMModule

    return _fit_lm(cfg, "pretrain", model, tok, examples, pc, spec["steps"], out_dir,
                   params={"family": family, "arch": to_plain(model_cfg.arch), "n_params": F.n_params(model)},
                   module_cls=CausalLMModule)


def _fit_lm(cfg, stage, model, tok, examples, sc, steps, out_dir, params, module_cls, upstream=None) -> dict:
    run_params = {"stage": stage, stage: to_plain(sc), "world": to_plain(cfg.world), "seed": stage_seed(cfg, stage),
                  "steps": steps, **params}
    tags = {f"rlhf_lab.upstream.{k}": v for k, v in (upstream or {}).items()}
    with tracking.start_run(cfg, stage, params=run_params, tags=tags) as run:
        g = torch.Generator().manual_seed(stage_seed(cfg, stage))
        loader = distributed.loader(examples, int(sc.batch_size), g, D.collate_right(tok), key=f"{stage}.batch_size")
        module = module_cls(model, lr=float(sc.lr), weight_decay=float(sc.weight_decay),
                            warmup_steps=int(sc.warmup_steps), max_steps=steps)
        from rlhf_lab.callbacks import PeriodicEval

        ev = PeriodicEval(lambda: evaluate(cfg, model, tok), every_n_steps=int(cfg.eval.every_n_steps)
                          if job_stage(cfg) == stage else 0, at_start=job_stage(cfg) == stage)
        trainer = L.Trainer(**trainer_kwargs(cfg, out_dir, steps, stage), logger=tracking.lightning_logger(cfg), callbacks=[ev])
        t0 = time.time()
        trainer.fit(module, loader)
        distributed.check_in_sync(model, stage)
        if not distributed.is_rank_zero():
            return {"stage": stage}
        model.eval()
        tok.save_pretrained(out_dir)
        model.save_pretrained(out_dir)
        tracking.log_metric("time/train_s", time.time() - t0)
        return {"run_id": run.info.run_id, "stage": stage, "eval": ev.last, "train_s": time.time() - t0,
                "n_params": F.n_params(model)}


def evaluate(cfg, policy, tok, reference=None, scorer=None, prompts=None):
    from rlhf_lab.evaluation import evaluate_policy

    return evaluate_policy(policy, tok, prompts or D.eval_prompts(cfg), cfg.generation, D.gold_weights(cfg),
                           reference=reference, scorer=scorer, n_rows=int(cfg.eval.n_samples_logged))


def ensure_pretrain(cfg: DictConfig, model_cfg: DictConfig) -> Path:
    """The base model folder for `model_cfg` (a `policy` or reward-model backbone config)."""
    if model_cfg.get("name_or_path"):
        return Path(model_cfg.name_or_path) if Path(str(model_cfg.name_or_path)).exists() else model_cfg.name_or_path
    spec = pretrain_spec(cfg, model_cfg)
    path, built = cache_for(cfg).get_or_build("pretrain", spec, lambda tmp: train_pretrain(cfg, model_cfg, tmp))
    if not built:
        announce_reuse("pretrain", "base model", path)
    return path


# ------------------------------------------------------------------------------------------------
# sft: the policy's starting point


def sft_spec(cfg: DictConfig) -> dict:
    return {
        "base": str(ensure_pretrain(cfg, cfg.policy)), "world": D.world_generation_spec(cfg), "sft": to_plain(cfg.sft),
        "seed": stage_seed(cfg, "sft"), "steps": job_steps(cfg, "sft", cfg.sft.steps),
    }


def train_sft(cfg: DictConfig, out_dir: Path, spec: dict | None = None) -> dict:
    spec = spec or sft_spec(cfg)
    sc = cfg.sft
    L.seed_everything(spec["seed"], verbose=False)
    base = spec["base"]
    tok = F.load_tokenizer(base, "policy.name_or_path")
    model = F.load_causal_lm(base, tok, "policy.name_or_path")
    pairs = D.reviews(cfg, "sft", int(sc.n_examples))
    examples = D.encode_pairs(tok, pairs, int(sc.max_len), loss_on_prompt=False)
    from rlhf_lab.algorithms.lm import CausalLMModule

    upstream = {"pretrain": cache_for(cfg).meta(Path(base)).get("run_id", str(base))}
    return _fit_lm(cfg, "sft", model, tok, examples, sc, spec["steps"], out_dir,
                   params={"base": str(base), "n_params": F.n_params(model)}, module_cls=CausalLMModule,
                   upstream=upstream)


def ensure_sft(cfg: DictConfig) -> Path:
    spec = sft_spec(cfg)
    path, built = cache_for(cfg).get_or_build("sft", spec, lambda tmp: train_sft(cfg, tmp, spec))
    if not built:
        announce_reuse("sft", "SFT policy", path)
    return path


# ------------------------------------------------------------------------------------------------
# jobs


def _job_pretrain(cfg, out_dir):
    meta = train_pretrain(cfg, cfg.policy, out_dir)
    return meta, ("pretrain", pretrain_spec(cfg, cfg.policy))


def _job_sft(cfg, out_dir):
    spec = sft_spec(cfg)  # trains upstream stages first, each as its own run
    meta = train_sft(cfg, out_dir, spec)
    return meta, ("sft", spec)


# A job takes (cfg, artifact folder) and returns (metadata, (stage, spec) to publish to the cache or None).
JOBS: dict[str, Callable[[DictConfig, Path], tuple[dict, tuple[str, dict] | None]] | str] = {
    "pretrain": _job_pretrain,
    "sft": _job_sft,
    "rm": "rlhf_lab.algorithms.rm:job",
    "ppo": "rlhf_lab.algorithms.ppo:job",
    "dpo": "rlhf_lab.algorithms.dpo:job",
}


def _resolve_job(name: str):
    fn = JOBS[name]
    if isinstance(fn, str):
        import importlib

        mod, attr = fn.split(":")
        fn = getattr(importlib.import_module(mod), attr)
    return fn


def run_job(cfg: DictConfig, out_dir: Path) -> dict:
    """Run the job named by ``algo`` (on every rank when ``trainer.devices > 1``); returns rank 0's metadata."""
    name = job_stage(cfg)
    if name not in JOBS:
        raise ValueError(f"algo={name!r} is not a known algorithm; choose one of {sorted(JOBS)}")
    out_dir = Path(out_dir)
    try:
        return distributed.launch(cfg, out_dir, _run_rank)
    finally:
        for scratch in out_dir.glob(".rank*"):  # the other ranks' throw-away outputs
            shutil.rmtree(scratch, ignore_errors=True)


def _run_rank(cfg: DictConfig, out_dir: Path) -> dict:
    art = distributed.rank_out_dir(out_dir) / "artifact"
    art.mkdir(parents=True, exist_ok=True)
    meta, publish = _resolve_job(job_stage(cfg))(cfg, art)
    if not distributed.is_rank_zero():
        return meta
    if publish is not None:
        stage, spec = publish
        meta["cache_path"] = str(cache_for(cfg).publish(stage, spec, art, meta))
    meta["artifact"] = str(art)
    (out_dir / "summary.json").write_text(json.dumps(meta, indent=2, default=str))
    return meta
