"""Lightning callbacks shared by the policy algorithms."""

from __future__ import annotations

from typing import Callable

import lightning as L
import mlflow

from rlhf_lab.tracking import log_samples_table


class PeriodicEval(L.Callback):
    """Every `every_n_steps` optimizer steps (and at the start and end of training) call `evaluate()`,
    which returns (metrics, rows), and log the metrics with the global step as x-axis."""

    def __init__(self, evaluate: Callable[[], tuple[dict, list]], every_n_steps: int, at_start: bool = True):
        self.evaluate = evaluate
        self.every = int(every_n_steps)
        self.at_start = at_start
        self.last: dict = {}
        self.first: dict = {}
        self._done_steps: set[int] = set()

    def _run(self, trainer: L.Trainer, step: int):
        if step in self._done_steps or trainer.global_rank != 0:
            return
        self._done_steps.add(step)
        metrics, rows = self.evaluate()
        mlflow.log_metrics(metrics, step=step)
        log_samples_table([dict(r, step=step) for r in rows], f"samples/step_{step:06d}.json")
        if not self.first:
            self.first = metrics
        self.last = metrics

    def on_train_start(self, trainer, pl_module):
        if self.at_start:
            self._run(trainer, trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if self.every > 0 and step > 0 and step % self.every == 0:
            self._run(trainer, step)

    def on_train_end(self, trainer, pl_module):
        self._run(trainer, trainer.global_step)
