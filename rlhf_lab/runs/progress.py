"""The training progress bar of a stage: labelled with the stage, counting the stage's own steps.

Lightning's default bar reads ``Epoch 3/-2`` and counts batches against ``max_steps`` (PPO's optimizer steps:
``200/3200``, a 40-minute ETA for 200 PPO steps). :class:`StageBar` counts what the user configured (``algo.steps``,
``sft.steps``, ...) from ``trainer.global_step``, so it is also right after a resume, and is labelled with the
stage (``sft``, ``rm member 2/3``, ``ppo``); :func:`work_bar` is a bar of the same look for ``prefs``.
"""

from __future__ import annotations

import sys
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm


def work_bar(label: str, total: int, unit: str, enabled: bool = True) -> Tqdm:
    """A bar like :class:`StageBar`'s for a stage that runs no Lightning trainer (``prefs``): labelled with the
    stage, counting `total` `unit`s as the caller calls ``update(n)``; a bar that draws nothing when not
    `enabled` (``trainer.progress_bar=false``). Close it (or use it as a context manager)."""
    return Tqdm(desc=label, total=int(total), unit=unit, disable=not enabled, leave=True, dynamic_ncols=True,
                file=sys.stdout, smoothing=0, bar_format=TQDMProgressBar.BAR_FORMAT)


class StageBar(TQDMProgressBar):
    def __init__(self, label: str, total: int, steps_per_unit: int = 1, unit: str = "step"):
        super().__init__(leave=True)
        self.label, self.total, self.steps_per_unit, self.unit = label, int(total), max(1, int(steps_per_unit)), unit

    def done(self, trainer: L.Trainer) -> int:
        """Units finished: optimizer steps ÷ optimizer steps per unit."""
        return min(self.total, trainer.global_step // self.steps_per_unit)

    def init_train_tqdm(self) -> Tqdm:
        return Tqdm(desc=self.label, total=self.total, unit=self.unit, position=2 * self.process_position,
                    disable=self.is_disabled, leave=True, dynamic_ncols=True, file=sys.stdout, smoothing=0,
                    bar_format=self.BAR_FORMAT)

    def on_train_start(self, trainer: L.Trainer, *_: Any) -> None:
        self.train_progress_bar = self.init_train_tqdm()
        n = self.done(trainer)  # > 0 after a resume
        if n:
            self.train_progress_bar.n = n
            self.train_progress_bar.refresh()

    def on_train_epoch_start(self, trainer: L.Trainer, *_: Any) -> None:
        """One bar for the whole stage: no reset and no ``Epoch N`` per epoch."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx):
        n = self.done(trainer)
        if self.train_progress_bar is not None and n != self.train_progress_bar.n and self._should_update(n, self.total):
            self.train_progress_bar.n = n
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.train_progress_bar is not None and not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items
