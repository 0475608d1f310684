"""Lightning callbacks shared by the policy algorithms."""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

import lightning as L
import torch

from rlhf_lab.config.choices import EvalSchedule
from rlhf_lab.evaluation.ship_choice import OnlineShip
from rlhf_lab.evaluation.schedule import KLSchedule
from rlhf_lab.models.sharding import gathered, local

from rlhf_lab.runs import active_run
from rlhf_lab.runs.active_run import log_samples_table
from rlhf_lab.runs.states import pending_stop, raise_interrupted, stop_now


def evaluation_set(at_steps: Iterable[int] | KLSchedule) -> frozenset[int] | KLSchedule:
    """What ``step in`` asks at each step: a :class:`KLSchedule` as it is (decided as training goes), else the
    listed steps."""
    return at_steps if isinstance(at_steps, KLSchedule) else frozenset(int(s) for s in at_steps)


def evaluation_steps(schedule: str, total_steps: int, every_n_steps: int = 0, n_points: int = 0) -> list[int]:
    """The steps after step 0 at which a job evaluates (the start and the end of training are always evaluated).

    ``every``: each multiple of `every_n_steps` (none when it is 0). ``log``: `n_points` distinct steps spread evenly
    in log(step) from step 1 to `total_steps` (round(total_steps ** (i / (n_points - 1))), each at least one past
    the one before), so that a run whose KL rises fast early and then slowly (Gao et al. 2022 measure against
    √KL) is seen while it rises, with as many evaluations as the flat schedule would spend on the plateau.
    """
    if schedule not in tuple(EvalSchedule):
        raise ValueError(f"eval.schedule={schedule!r}: one of {', '.join(EvalSchedule)}")
    if schedule == "kl":
        raise ValueError("eval.schedule=kl has no steps before training: its steps follow the rollouts' KL "
                         "(rlhf_lab.evaluation.schedule.KLSchedule)")
    total = int(total_steps)
    if schedule == "every":
        every = int(every_n_steps)
        return list(range(every, total + 1, every)) if every > 0 else []
    n = min(int(n_points), total)
    if n <= 0:
        return []
    if n == 1:
        return [total]
    steps: list[int] = []
    for i in range(n):
        s = max(round(total ** (i / (n - 1))), steps[-1] + 1 if steps else 1)
        steps.append(min(s, total - (n - 1 - i)))  # room for the ones after it
    return steps


class PeriodicEval(L.Callback):
    """At the steps `at_steps` (and at the start and end of training) call `evaluate()`, which returns
    (metrics, rows), and log the metrics with the global step as x-axis (`evaluation_steps` makes the list).

    `after(step, metrics)`, when given, sees each evaluation (rank 0, the policy whole) as soon as it is logged (the
    ship rule, :class:`ShipCheckpoint`). `step_fn(trainer, pl_module) -> int` replaces the global step as the clock
    (cadence and x-axis), e.g. the PPO iteration when one training step makes several optimizer steps. `test()`, when
    given, is the held-out evaluation (``test/*`` and the OOD slice): run once at the start (with `at_start`) and
    once at the end of training, so no choice made during training can look at it.

    `test_each_eval` (``eval.test_each_eval``) runs `test()` at every evaluation in between too, logged under the
    same ``test/*`` names at that step (one quantity, one name: the test gold at step s is the test gold of the
    policy at step s), for a study that measures afterwards the held-out gold of the checkpoint a rule chose (its
    gold regret). No choice made during training looks at it still: `after` (the ship rule) sees the
    evaluation's ``eval/*`` metrics only, nothing in training reads ``test/*``, and a ship rule must not either (it
    is what the rule is measured with). `save(step) -> path` (``eval.save_checkpoints``), when given, saves the
    policy of each evaluation (rank 0, with its full parameters); `saved` maps each step to its folder.
    """

    def __init__(self, evaluate: Callable[[], tuple[dict, list]], at_steps: Iterable[int], at_start: bool = True,
                 step_fn: Callable[[L.Trainer, L.LightningModule], int] | None = None,
                 test: Callable[[], tuple[dict, list]] | None = None,
                 start: Callable[[str, Callable[[], tuple[dict, list]]], tuple[dict, list]] | None = None,
                 after: Callable[[int, dict], None] | None = None, test_each_eval: bool = False,
                 save: Callable[[int], str] | None = None):
        self.evaluate = evaluate
        self.test_each_eval, self.save = test_each_eval, save
        self.saved: dict[int, str] = {}  # step -> the policy's folder (with `save`)
        self.after = after  # (step, metrics) after each evaluation is logged, before the end's held-out one
        self.start = start  # (split, compute) -> (metrics, rows) for the evaluations at the start (a cache of them)
        self.test = test
        self.at_steps = evaluation_set(at_steps)
        self.at_start = at_start
        self.step_fn = step_fn or (lambda trainer, pl_module: trainer.global_step)
        self.last: dict = {}
        self.first: dict = {}
        self.curve: list[tuple[int, float]] = []  # (step, eval/gold_reward) of each evaluation with a gold
        self.test_curve: dict[int, float] = {}  # step -> test/gold_reward of each test evaluation with a gold
        self.test_first: dict = {}
        self.test_last: dict = {}
        self._done_steps: set[int] = set()
        self._test_steps: set[int] = set()
        self.seconds = 0.0  # wall time spent in evaluate() and test() (this process; a job's time/eval_s)

    def _run(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, at_start: bool = False):
        if step in self._done_steps:
            return
        self._done_steps.add(step)
        with gathered(pl_module):  # every rank: a sharded model is evaluated with its full parameters
            if trainer.global_rank == 0:
                self._evaluate(step, at_start)
                if self.save is not None:
                    self.saved[step] = self.save(step)
        if self.test_each_eval and not at_start:  # at the start: on_train_start runs it after this
            self._run_test(trainer, pl_module, step)

    def _evaluate(self, step: int, at_start: bool):
        t0 = time.time()
        metrics, rows = self.start("eval", self.evaluate) if at_start and self.start else self.evaluate()
        self.seconds += time.time() - t0
        active_run.log_metrics(metrics, step=step)
        log_samples_table([dict(r, step=step) for r in rows], f"samples/step_{step:06d}.json")
        if not self.first:
            self.first = metrics
        self.last = metrics
        if "eval/gold_reward" in metrics:
            self.curve.append((step, float(metrics["eval/gold_reward"])))
        if self.after is not None:
            self.after(step, metrics)

    def _run_test(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, at_start: bool = False):
        if self.test is None or step in self._test_steps:
            return
        self._test_steps.add(step)
        with gathered(pl_module):
            if trainer.global_rank == 0:
                self._test(step, at_start)

    def _test(self, step: int, at_start: bool):
        t0 = time.time()
        metrics, rows = self.start("test", self.test) if at_start and self.start else self.test()
        self.seconds += time.time() - t0
        active_run.log_metrics(metrics, step=step)
        log_samples_table([dict(r, step=step) for r in rows], f"samples/test_step_{step:06d}.json")
        if not self.test_first:
            self.test_first = metrics
        self.test_last = metrics
        if "test/gold_reward" in metrics:
            self.test_curve[step] = float(metrics["test/gold_reward"])

    # the evaluations already made travel with a checkpoint: a resumed run keeps its SFT baseline (first evaluation)
    STATE = ("first", "last", "curve", "test_curve", "test_first", "test_last", "saved", "_done_steps", "_test_steps")

    def state_dict(self) -> dict:
        state = {k: sorted(v) if isinstance(v, set) else v for k, v in ((k, getattr(self, k)) for k in self.STATE)}
        if isinstance(self.at_steps, KLSchedule):  # eval.schedule=kl: the levels reached and the steps decided
            state["schedule"] = self.at_steps.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        if "schedule" in state:
            self.at_steps.load_state_dict(state.pop("schedule"))
        for k, v in state.items():
            setattr(self, k, set(v) if k.startswith("_") else v)

    def on_train_start(self, trainer, pl_module):
        if self.at_start and not self.first:  # not when resumed: the start was evaluated before the checkpoint
            step = self.step_fn(trainer, pl_module)
            self._run(trainer, pl_module, step, at_start=True)
            self._run_test(trainer, pl_module, step, at_start=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = self.step_fn(trainer, pl_module)
        if step > 0 and step in self.at_steps:
            self._run(trainer, pl_module, step)

    def on_train_end(self, trainer, pl_module):
        step = self.step_fn(trainer, pl_module)
        self._run(trainer, pl_module, step)
        self._run_test(trainer, pl_module, step)


def nbytes(tensors) -> float:
    """Bytes of this rank's part of `tensors` (the local shard of a sharded one; None and non-tensors skipped)."""
    return float(sum(local(t).numel() * local(t).element_size() for t in tensors if isinstance(t, torch.Tensor)))


class TrainedStateBytes(L.Callback):
    """What training holds per rank, logged by rank 0 at the end of training (at step 0, beside ``model/*``):
    ``memory/param_bytes`` (the optimised parameters), ``memory/grad_bytes`` (their gradients, at the first
    optimizer step) and ``memory/optimizer_bytes`` (the optimizer's state). With ``trainer=fsdp``/``fsdp_cpu``
    each of N ranks holds about 1/N of each; with one process or ``ddp`` every rank holds all of it."""

    def __init__(self):
        self.grad_bytes = 0.0

    @staticmethod
    def params(optimizer) -> list:
        return [p for group in optimizer.param_groups for p in group["params"]]

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if not self.grad_bytes:
            self.grad_bytes = nbytes(p.grad for p in self.params(optimizer))

    def on_train_end(self, trainer, pl_module):
        if trainer.global_rank != 0 or not trainer.optimizers:
            return
        opts = trainer.optimizers
        active_run.log_metrics({
            "memory/param_bytes": sum(nbytes(self.params(o)) for o in opts),
            "memory/grad_bytes": self.grad_bytes,
            "memory/optimizer_bytes": sum(nbytes(v for st in o.state.values() for v in st.values()) for o in opts),
        }, step=0)


class ShipCheckpoint(L.Callback):
    """The checkpoint to ship (:mod:`rlhf_lab.evaluation.ship_choice`), chosen while the run trains: after every
    training step `proxy()` gives its proxy reward (``objective/scores``; None: none); :class:`PeriodicEval` calls
    :meth:`on_evaluation` (rank 0, the policy whole) with each evaluation's metrics, which logs ``ship/value``
    (proxy − c·√KL) and, when that evaluation is the best so far, saves the policy with `save()` (one folder, written
    beside it and renamed over the earlier one; None: not saved) and logs ``ship/step`` and the tags
    ``rlhf_lab.ship.step`` and ``rlhf_lab.ship.path``."""

    def __init__(self, proxy: Callable[[], float | None], step_fn: Callable[[L.Trainer, L.LightningModule], int],
                 save: Callable[[], str] | None = None):
        self.proxy, self.step_fn, self.save = proxy, step_fn, save
        self.choice = OnlineShip()
        self.path: str | None = None
        self.start_logged = False

    def on_evaluation(self, step: int, metrics: dict) -> None:
        if "eval/kl" not in metrics:
            return
        self.take(step)  # this step's own batch (the callbacks after PeriodicEval have not run yet)
        new = self.choice.evaluation(step, float(metrics["eval/kl"]))
        value = self.choice.value(len(self.choice.steps) - 1)
        if math.isfinite(value):
            active_run.log_metrics({"ship/value": value}, step=step)
        if new:
            if self.save is not None:
                self.path = self.save()
            active_run.log_metrics({"ship/step": float(step)}, step=step)
            active_run.set_tag("rlhf_lab.ship.step", str(step))
            if self.path:
                active_run.set_tag("rlhf_lab.ship.path", self.path)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_rank != 0:
            return
        self.take(self.step_fn(trainer, pl_module))

    def take(self, step: int) -> None:
        """Step `step`'s training proxy, once; the start's value is logged when the first one makes it known."""
        self.choice.train_step(step, self.proxy())
        if not self.start_logged and self.choice.steps and math.isfinite(self.choice.value(0)):
            self.start_logged = True
            active_run.log_metrics({"ship/value": self.choice.value(0)}, step=self.choice.steps[0])

    def state_dict(self) -> dict:
        return {**self.choice.state_dict(), "path": self.path, "start_logged": self.start_logged}

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        self.path, self.start_logged = state.pop("path", None), state.pop("start_logged", True)
        self.choice.load_state_dict(state)


class Preemption(L.Callback):
    """Pre-emption: when a SIGTERM arrived during training (:func:`rlhf_lab.runs.states.defer_sigterm`), at the end
    of the training step save a Lightning checkpoint to `path` (written beside it, then renamed), then stop the run
    (:class:`~rlhf_lab.runs.states.Interrupted`: KILLED, exit 143). Add it last: it saves what the other callbacks
    did at that step. The same job started again resumes from it (:func:`rlhf_lab.stages.ppo.resume_checkpoint`)."""

    def __init__(self, path: Path | str, step_fn: Callable[[L.Trainer, L.LightningModule], int]):
        self.path, self.step_fn = Path(path), step_fn

    def on_train_start(self, trainer, pl_module):
        # several ranks: Lightning's SIGTERM handler broadcasts from rank 0 inside the handler, a collective the other
        # ranks never join (rlhf-lab signals rank 0 only) or join mid-step: ours defers the stop to the step's end
        if trainer.world_size > 1 and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, raise_interrupted)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # every rank stops at the same step, if any rank got the signal: saving the checkpoint is collective
        if not trainer.strategy.reduce_boolean_decision(pending_stop() is not None, all=False):
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        trainer.save_checkpoint(str(tmp))
        if trainer.global_rank == 0:
            os.replace(tmp, self.path)
            print(f"[rlhf-lab] pre-empted (SIGTERM) after step {self.step_fn(trainer, pl_module)}: checkpoint saved to "
                  f"{self.path}; the same command resumes from it", flush=True)
        stop_now()
