"""What the trained stages share: the Lightning trainer's arguments and its fit (:func:`fit`), the evaluation steps,
model sizes, and the causal-LM training run of ``pretrain`` and ``sft`` (:func:`fit_lm`)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from omegaconf import DictConfig

from rlhf_lab.models.batching import collate_right
from rlhf_lab.models.sharding import shards, whole
from rlhf_lab.runs import active_run, distributed, tracking
from rlhf_lab.config.keys import to_plain
from rlhf_lab.runs.states import lightning_sigterm_as_interrupted
from rlhf_lab.stages.evaluate import evaluate, gold_summary
from rlhf_lab.stages.pipeline import run_settings, job_stage, stage_seed


def eval_steps(cfg: DictConfig, total_steps: int, kl: Callable[[], float | None] | None = None):
    """The job's evaluation steps after step 0 from ``eval.schedule``: a list (callbacks.evaluation_steps), or with
    ``schedule=kl`` a :class:`~rlhf_lab.evaluation.schedule.KLSchedule` that reads `kl()`, the KL of each step's
    rollouts (only PPO-family jobs have one; config.checks refuses the schedule for the others)."""
    from rlhf_lab.evaluation.callbacks import evaluation_steps
    from rlhf_lab.evaluation.schedule import KLSchedule

    e = cfg.eval
    if e.schedule == "kl":
        if kl is None:
            raise ValueError("eval.schedule=kl follows the rollouts' KL: only algo=ppo, grpo or rloo have one")
        return KLSchedule(kl, float(e.sqrt_kl_spacing), int(e.n_points))
    return evaluation_steps(e.schedule, total_steps, e.every_n_steps, e.n_points)


class FileCheckpointIO(TorchCheckpointIO):
    """The trainer's checkpoint writer: Lightning's ``torch.save`` checkpoint, written straight to a temporary file
    beside the target and then renamed over it (a reader never sees half a file). Lightning's own writer serialises
    the whole checkpoint into memory first (``io.BytesIO``, then one write): a copy of every saved model and optimizer
    state on top of the live ones. At the end of a full-fine-tuning PPO job (policy, critic and reference, two AdamW
    states) that was +2.3 GiB of peak RSS for an 89.6M-parameter Qwen2 and, 4x that, about 9 GiB for the 0.5B shape:
    the job the out-of-memory killer ended on a 24 GiB machine. The same bytes in the file. A URL (``s3://...``) goes
    to Lightning's writer."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        if "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options=storage_options)
        if storage_options is not None:
            raise TypeError("FileCheckpointIO.save_checkpoint takes no storage_options")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.writing")
        try:
            with open(tmp, "wb") as f:  # a file object: the archive's records named as in Lightning's buffer
                torch.save(checkpoint, f)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


def trainer_kwargs(cfg: DictConfig, out_dir: Path, steps: int, stage: str, callbacks: list | tuple = (),
                   steps_per_unit: int = 1, label: str | None = None) -> dict:
    """Lightning Trainer arguments for `stage`: `steps` units of `steps_per_unit` optimizer steps each (a PPO
    step is several), its `callbacks` and, when ``trainer.progress_bar``, a bar named `label` (default: the
    stage) that counts units (:class:`rlhf_lab.runs.progress.StageBar`). Only the job stage runs on
    ``trainer.devices`` processes with ``trainer.strategy``; upstream stages are built by one process
    (rlhf_lab/runs/distributed.py)."""
    from rlhf_lab.evaluation.callbacks import TrainedStateBytes
    from rlhf_lab.runs.progress import StageBar

    t = cfg.trainer
    show_bar = bool(t.progress_bar)
    kw = dict(
        max_steps=int(steps) * int(steps_per_unit), accelerator=t.accelerator, devices=1, precision=t.precision,
        log_every_n_steps=t.log_every_n_steps, enable_checkpointing=False, enable_model_summary=False,
        default_root_dir=str(out_dir), num_sanity_val_steps=0,
        use_distributed_sampler=False,  # the loaders slice each global batch (GlobalBatchSampler), also on one
        plugins=[FileCheckpointIO()],  # checkpoints streamed to the file, never whole in memory
    )  # process under a distributed strategy (trainer=fsdp or ddp on one GPU), where Lightning's would not fit them
    if job_stage(cfg) == stage and distributed.n_processes(to_plain(cfg.trainer)) > 1:
        kw.update(devices=t.devices, num_nodes=int(t.get("num_nodes", 1) or 1), strategy=strategy(t))
        show_bar = show_bar and distributed.is_rank_zero()
    elif job_stage(cfg) == stage and t.get("strategy") not in (None, "auto"):
        kw["strategy"] = strategy(t)
    bar = [StageBar(label or stage, int(steps), steps_per_unit)] if show_bar else []
    kw.update(enable_progress_bar=show_bar, callbacks=[*bar, *callbacks, TrainedStateBytes()])
    return kw


def strategy(t: DictConfig):
    """``trainer.strategy`` as Lightning takes it: a name, or a ``_target_`` config of a Strategy object."""
    s = t.get("strategy", "auto")
    if isinstance(s, DictConfig):
        from hydra.utils import instantiate

        extra = {}
        if shards(s.get("_target_")) and s.get("data_parallel_size") is None:
            extra["data_parallel_size"] = distributed.n_processes(to_plain(t))  # trainer=fsdp: shard over all ranks
        return instantiate(s, **extra)
    return str(s)


def fit(cfg: DictConfig, stage: str, module, loader, model, out_dir: Path, steps: int, what: str,
        callbacks: list | tuple = (), label: str | None = None, gradient_clip_val: float | None = None):
    """Train `module` on `loader` with `stage`'s Lightning trainer (:func:`trainer_kwargs`), logging to the open run;
    SIGTERM interrupts it. Returns its `model`, checked in sync across ranks (`what` names it in the error) and whole
    on rank 0 (None on the others with trainer=fsdp / fsdp_cpu), and the seconds the fit took."""
    import lightning as L

    trainer = L.Trainer(**trainer_kwargs(cfg, out_dir, steps, stage, callbacks=callbacks, label=label),
                        gradient_clip_val=gradient_clip_val, logger=tracking.lightning_logger(run_settings(cfg)))
    t0 = time.time()
    with lightning_sigterm_as_interrupted():
        trainer.fit(module, loader)
    seconds = time.time() - t0
    distributed.check_in_sync(model, what)
    return whole(model), seconds


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
    import torch

    from rlhf_lab.algorithms.lm import CausalLMModule
    from rlhf_lab.evaluation.callbacks import PeriodicEval

    run_params = {"stage": stage, stage: to_plain(sc), "world": to_plain(cfg.world), "seed": stage_seed(cfg, stage),
                  "steps": steps, **params}
    tags = {f"rlhf_lab.upstream.{k}": v for k, v in (upstream or {}).items()}
    with tracking.start_run(run_settings(cfg), stage, params=run_params, tags=tags) as run:
        g = torch.Generator().manual_seed(stage_seed(cfg, stage))
        loader = distributed.loader(examples, sc.batch_size, g, collate_right(tok), key=f"{stage}.batch_size")
        module = CausalLMModule(model, lr=sc.lr, weight_decay=sc.weight_decay,
                                warmup_steps=sc.warmup_steps, max_steps=steps)
        is_job = job_stage(cfg) == stage
        ev = PeriodicEval(lambda: evaluate(cfg, model, tok, gold=gold),
                          at_steps=eval_steps(cfg, steps) if is_job else (), at_start=is_job,
                          test=(lambda: evaluate(cfg, model, tok, split="test", gold=gold)) if is_job else None)
        size = model_size(model)
        active_run.log_metrics(size, step=0)
        model, train_s = fit(cfg, stage, module, loader, model, out_dir, steps, stage, callbacks=[ev])
        if not distributed.is_rank_zero():
            return {"stage": stage}
        model.eval()
        tok.save_pretrained(out_dir)
        model.save_pretrained(out_dir)
        active_run.log_metric("time/train_s", train_s)
        meta = {"run_id": run.info.run_id, "stage": stage, "eval": ev.last, "train_s": train_s, **size}
        if ev.test_last:
            test_gold = gold_summary(ev.test_first, ev.test_last, "start", f"{stage} step {steps}")
            meta.update(test=ev.test_last, test_start=ev.test_first, summary=test_gold)
        return meta
