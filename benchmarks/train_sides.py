"""The two trainers of a training-throughput benchmark: Lightning (ours) and a Hugging Face `Trainer` (TRL).

Both get the same number of optimizer steps; a callback stamps the wall clock at the end of every optimizer
step (Lightning ``on_train_batch_end``, transformers ``on_step_end``), and the rate is taken over the steps
after the warm-up (:class:`benchmarks.common.StepClock`).
"""

from __future__ import annotations

import tempfile

import lightning as L
import torch

from benchmarks.common import Section, StepClock, table


class LightningClock(L.Callback):
    def __init__(self, clock: StepClock):
        self.clock = clock

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.clock.tick()


class StepPhases(L.Callback):
    """After every step, the PPO module's own phase times (its ``time/*`` statistics) under the benchmark's names:
    ``names`` maps a name to a metric, e.g. ``{"generation": "time/rollout_s"}``; ``stats``: one dict per step."""

    def __init__(self, names: dict[str, str]):
        self.names = names
        self.stats: list[dict] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.stats.append({name: pl_module.last_stats[metric] for name, metric in self.names.items()})


def lightning_fit(module: L.LightningModule, loader, steps: int, warmup: int, grad_clip: float | None,
                  log_every: int = 10) -> StepClock:
    """Train `module` for `steps` optimizer steps the way the project's jobs do (``pipeline.trainer_kwargs``:
    CPU, fp32, no checkpointing), without a progress bar or a logger (TRL runs with ``report_to="none"``)."""
    clock = StepClock(warmup)
    with tempfile.TemporaryDirectory() as tmp:
        kw = dict(max_steps=steps, accelerator="cpu", devices=1, precision="32-true", log_every_n_steps=log_every,
                  enable_checkpointing=False, enable_model_summary=False, default_root_dir=tmp,
                  num_sanity_val_steps=0, enable_progress_bar=False, logger=False, callbacks=[LightningClock(clock)])
        if grad_clip:
            kw["gradient_clip_val"] = float(grad_clip)
        L.Trainer(**kw).fit(module, loader)
    return clock


def hf_common_args(steps: int, batch_size: int, lr: float, weight_decay: float, warmup_steps: int, seed: int,
                   max_grad_norm: float | None, out_dir: str, log_every: int = 10) -> dict:
    """TrainingArguments shared by the TRL trainers, set to do the same work as our side.

    TRL's own defaults that change the work are switched off: ``bf16`` (default on; ours is fp32),
    ``gradient_checkpointing`` (default on in TRL; ours has none). No evaluation, no saving, no reporting,
    batches in dataset order (ours: ``shuffle=False``), the last partial batch dropped (both).
    """
    return dict(
        output_dir=out_dir, max_steps=steps, per_device_train_batch_size=batch_size, learning_rate=lr,
        weight_decay=weight_decay, warmup_steps=warmup_steps, lr_scheduler_type="linear", seed=seed,
        max_grad_norm=float(max_grad_norm or 0.0), bf16=False, fp16=False, gradient_checkpointing=False,
        use_cpu=True, report_to="none", save_strategy="no", eval_strategy="no", logging_steps=log_every,
        disable_tqdm=True, dataloader_num_workers=0, dataloader_drop_last=True,
        train_sampling_strategy="sequential", optim="adamw_torch", adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
    )


def hf_fit(trainer, warmup: int) -> StepClock:
    """Run a transformers/TRL trainer with a step clock; the console printer of logs is removed."""
    from transformers import PrinterCallback, TrainerCallback

    clock = StepClock(warmup)

    class _Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            clock.tick()

    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(_Clock())
    trainer.train()
    return clock


def grad_norm(*models: torch.nn.Module) -> float:
    """L2 norm of all parameter gradients of `models` together (0 when none)."""
    gs = [p.grad.detach().flatten() for m in models for p in m.parameters() if p.grad is not None]
    return float(torch.cat(gs).norm()) if gs else 0.0


def throughput(clocks: dict[str, list[StepClock]], batch_size: int) -> dict:
    """Pairs/s and ms/step per side over all rounds, the per-round ratios ours/TRL, the threads seen."""
    out = {"rate": {}, "step_ms": {}, "steps": {}}
    for side, cs in clocks.items():
        secs, n = sum(c.seconds() for c in cs), sum(c.n_timed() for c in cs)
        out["rate"][side], out["step_ms"][side], out["steps"][side] = n * batch_size / secs, 1000 * secs / n, n
    out["ratio"] = out["rate"]["ours"] / out["rate"]["trl"]
    out["per_round"] = [(t.seconds() / t.n_timed()) / (o.seconds() / o.n_timed())
                        for o, t in zip(clocks["ours"], clocks["trl"])]
    out["threads"] = sorted({n for cs in clocks.values() for c in cs for n in c.threads})
    return out


def alternate(rounds: int, run_side, sides: tuple[str, ...] = ("ours", "trl")) -> dict[str, list[StepClock]]:
    """`rounds` runs of each side, the order reversed every other round (ours, TRL, TRL, ours, ...)."""
    clocks: dict[str, list[StepClock]] = {side: [] for side in sides}
    for r in range(rounds):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            torch.manual_seed(0)
            clocks[side].append(run_side(side))
    return clocks


def agreement_table(agree: dict, keys: list[str], tol: float, ids_label: str) -> str:
    """Both sides' first-batch quantities with their difference, checked against `tol` (relative above 1)."""
    from benchmarks.common import table

    rows = []
    for k in keys:
        a, b = agree["ours"][k], agree["trl"][k]
        rows.append([k, a, b, abs(a - b), "ok" if abs(a - b) <= tol * max(1.0, abs(b)) else "DIFFERS"])
    rows.append([ids_label, str(agree["same_ids"]), "", "", "ok" if agree["same_ids"] else "DIFFERS"])
    return table(["quantity", "ours", "TRL", "abs diff", f"within {tol:g} (relative above 1)"], rows)


def agreement_ok(agree: dict, keys: list[str], tol: float) -> bool:
    return agree["same_ids"] and all(
        abs(agree["ours"][k] - agree["trl"][k]) <= tol * max(1.0, abs(agree["trl"][k])) for k in keys)


def training_section(title: str, doc: str, ours_name: str, trl_name: str, tp: dict, agree: dict, keys: list[str],
                     tol: float, agree_intro: str, ids_label: str, settings: str, t_start: float) -> Section:
    """The report section of a training-throughput benchmark: the two sides' rates and their ratio, the
    first-batch agreement table, and the settings with the per-round ratios."""
    import time

    sec = Section(title, doc)
    sec.tables.append(table(
        ["side", "pairs/s", "ms/step", "timed steps", "ratio ours/TRL"],
        [[ours_name, tp["rate"]["ours"], tp["step_ms"]["ours"], tp["steps"]["ours"], tp["ratio"]],
         [trl_name, tp["rate"]["trl"], tp["step_ms"]["trl"], tp["steps"]["trl"], 1.0]]))
    sec.tables.append(f"{agree_intro}\n\n" + agreement_table(agree, keys, tol, ids_label))
    sec.findings.append(f"settings: {settings}; per-round ratios {', '.join(f'{x:.2f}' for x in tp['per_round'])}; "
                        f"torch threads seen during the steps: {tp['threads']}")
    sec.data = {"ratio": tp["ratio"], "agree_ok": agreement_ok(agree, keys, tol), "agree": agree}
    sec.seconds = time.time() - t_start
    return sec
