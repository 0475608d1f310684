"""Lightning callbacks shared by the policy algorithms."""

from __future__ import annotations

import dataclasses
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
from rlhf_lab.evaluation import alarm as A
from rlhf_lab.evaluation.schedule import KLSchedule
from rlhf_lab.models.sharding import gathered, local

from rlhf_lab.runs import active_run
from rlhf_lab.runs.active_run import log_samples_table
from rlhf_lab.runs.progress import write_line
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

    `after(step, metrics)`, when given, sees each evaluation (rank 0) as soon as it is logged (the hacking alarm,
    :class:`HackingAlarm`). `step_fn(trainer, pl_module) -> int` replaces the global step as the clock (cadence and
    x-axis), e.g. the PPO iteration when one training step makes several optimizer steps. `test()`, when given,
    is the held-out evaluation (``test/*`` and the OOD slice): run once at the start (with `at_start`) and
    once at the end of training, so no choice made during training can look at it.

    `test_each_eval` (``eval.test_each_eval``) runs `test()` at every evaluation in between too, logged under the
    same ``test/*`` names at that step (one quantity, one name: the test gold at step s is the test gold of the
    policy at step s), for a study that measures afterwards the held-out gold of the checkpoint a rule chose (its
    gold regret). No choice made during training looks at it still: `after` (the hacking alarm) sees the
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

    # the evaluations already made travel with a checkpoint: a resumed run keeps its SFT baseline (first evaluation)
    STATE = ("first", "last", "curve", "test_first", "test_last", "saved", "_done_steps", "_test_steps")

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


class RewardHackingMonitor(L.Callback):
    """Raise the alarm when the proxy reward keeps rising while the gold reward has fallen.

    After every training step `signals(trainer, pl_module)` returns (step, proxy, gold) of the latest
    batch (or None). Both are smoothed with an exponential moving average over about `window` steps.
    The alarm fires (once) after `warmup` steps when the smoothed gold is at least `gold_drop` below its
    best so far while the smoothed proxy is above its value at that best: it sets the MLflow tag
    ``rlhf_lab.reward_hacking=true``, logs ``hacking/alarm`` = 1 and an event artifact
    ``events/reward_hacking.json``, and prints one line, once, above the progress bar
    (:func:`rlhf_lab.runs.progress.write_line`). ``hacking/gold_drop`` (best − current smoothed gold) and
    ``hacking/proxy_gain`` (current − at-best smoothed proxy) are logged every step.
    """

    def __init__(self, signals: Callable, gold_drop: float = 0.2, window: int = 10, warmup: int = 10,
                 enabled: bool = True):
        self.signals = signals
        self.gold_drop, self.window, self.warmup, self.enabled = float(gold_drop), int(window), int(warmup), enabled
        self.alpha = 2.0 / (self.window + 1.0)
        self.proxy_ema = self.gold_ema = None
        self.best_gold = self.proxy_at_best = None
        self.n = 0
        self.fired_at: int | None = None

    def update(self, step: int, proxy: float, gold: float) -> bool:
        """Feed one step; returns True when the alarm fires at this step."""
        a = self.alpha
        self.proxy_ema = proxy if self.proxy_ema is None else (1 - a) * self.proxy_ema + a * proxy
        self.gold_ema = gold if self.gold_ema is None else (1 - a) * self.gold_ema + a * gold
        self.n += 1
        if self.best_gold is None or self.gold_ema > self.best_gold:
            self.best_gold, self.proxy_at_best = self.gold_ema, self.proxy_ema
        fire = (self.fired_at is None and self.n > self.warmup
                and self.best_gold - self.gold_ema >= self.gold_drop and self.proxy_ema > self.proxy_at_best)
        if fire:
            self.fired_at = step
        return fire

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("proxy_ema", "gold_ema", "best_gold", "proxy_at_best", "n", "fired_at")}

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not self.enabled or trainer.global_rank != 0:
            return
        sig = self.signals(trainer, pl_module)
        if sig is None:
            return
        step, proxy, gold = sig
        fire = self.update(step, float(proxy), float(gold))
        active_run.log_metrics({"hacking/gold_drop": self.best_gold - self.gold_ema,
                            "hacking/proxy_gain": self.proxy_ema - self.proxy_at_best,
                            "hacking/alarm": float(self.fired_at is not None)}, step=step)
        if fire:
            event = {"event": "reward_hacking", "step": step, "proxy_ema": self.proxy_ema, "gold_ema": self.gold_ema,
                     "best_gold_ema": self.best_gold, "proxy_ema_at_best_gold": self.proxy_at_best,
                     "gold_drop_threshold": self.gold_drop}
            active_run.set_tag("rlhf_lab.reward_hacking", "true")
            active_run.set_tag("rlhf_lab.reward_hacking_step", str(step))
            active_run.log_dict(event, "events/reward_hacking.json")
            msg = (f"[rlhf-lab] reward hacking suspected at step {step}: proxy {self.proxy_at_best:.3f} -> "
                   f"{self.proxy_ema:.3f} (rising) while gold fell {self.best_gold:.3f} -> {self.gold_ema:.3f}")
            write_line(msg)  # once, on a line of its own above the progress bar (no RuntimeWarning)


class HackingAlarm(L.Callback):
    """The gold-free hacking alarm (:mod:`rlhf_lab.evaluation.alarm`) at each evaluation of a policy run.

    After every training step `proxy()` gives the step's proxy reward of the training batch (``objective/scores``;
    None: none), averaged over the steps since the previous evaluation, the evaluation's own step included.
    :class:`PeriodicEval` calls :meth:`on_evaluation` (rank 0) with each evaluation's metrics; from the second evaluation on, it logs the signals
    and the score (``alarm/*``, docs/metrics.md). At the first score ≥ `threshold` the alarm is raised: the MLflow
    tags ``rlhf_lab.hacking_alarm=raised`` and ``rlhf_lab.hacking_alarm_step``, an event
    ``events/hacking_alarm.json``, one printed line. With `stop` (``algo.stop_on_alarm``) the run then stops at
    that step with the policy of the evaluation before the alarm: every evaluation that does not raise it keeps a
    copy (on CPU) of `policy`'s trainable parameters, and the raising one puts that copy back, on every process
    (the decision is broadcast from rank 0), so the saved policy, the held-out test at the end and the job summary
    are the kept checkpoint's.
    """

    def __init__(self, proxy: Callable[[], float | None], at_steps: Iterable[int],
                 step_fn: Callable[[L.Trainer, L.LightningModule], int], policy: Callable[[], torch.nn.Module],
                 rule: A.Rule = A.RULE, threshold: float | None = None, stop: bool = False):
        self.proxy, self.step_fn, self.policy, self.rule, self.stop = proxy, step_fn, policy, rule, stop
        self.at_steps = evaluation_set(at_steps)
        self.threshold = rule.threshold if threshold is None else float(threshold)
        self.evaluations: list[A.Evaluation] = []
        self.pending: list[float] = []  # proxy rewards of the steps since the last evaluation
        self.taken = 0  # the last step whose proxy reward is in `pending` (or in an evaluation)
        self.raised_at: int | None = None
        self.raised_score: float | None = None
        self.highest: tuple[float, int] | None = None  # (score, step) of the highest score so far
        self.kept_step: int | None = None  # with stop: the step of the kept parameters
        self.stopped_at: int | None = None
        self.kept: dict[str, torch.Tensor] | None = None

    def on_evaluation(self, step: int, metrics: dict) -> None:
        """Read one evaluation (``eval/kl``, ``eval/entropy``, ``eval/length``); log the alarm's signals and
        score."""
        need = ("eval/kl", "eval/entropy", "eval/length")
        if any(k not in metrics for k in need):
            return
        self.take(step)  # this step's own batch (the callbacks after PeriodicEval have not run yet)
        proxy = sum(self.pending) / len(self.pending) if self.pending else float("nan")
        self.pending = []
        self.evaluations.append(A.Evaluation(step, float(metrics["eval/kl"]), float(metrics["eval/entropy"]),
                                             float(metrics["eval/length"]), proxy))
        x = A.features(self.evaluations)
        if x is None:
            return
        s = A.score(x, self.rule)
        if self.highest is None or s > self.highest[0]:
            self.highest = (s, step)
        fire = self.raised_at is None and s >= self.threshold
        if fire:
            self.raised_at, self.raised_score = step, s
        active_run.log_metrics({**{f"alarm/{k}": v for k, v in x.items()}, "alarm/score": s,
                                "alarm/raised": float(self.raised_at is not None)}, step=step)
        if fire:
            active_run.set_tag("rlhf_lab.hacking_alarm", "raised")
            active_run.set_tag("rlhf_lab.hacking_alarm_step", str(step))
            active_run.log_dict({"event": "hacking_alarm", "step": step, "score": s, "threshold": self.threshold,
                                 "signals": x, "rule": self.rule.describe()}, "events/hacking_alarm.json")
            write_line(f"[rlhf-lab] hacking alarm raised at step {step} (score {s:.2f} >= {self.threshold:.2f}): "
                       + ", ".join(f"{k} {v:.3g}" for k, v in x.items())
                       + (" - stopping (algo.stop_on_alarm)" if self.stop else ""))

    def take(self, step: int) -> None:
        """Add step `step`'s proxy reward to the current interval, once."""
        if step > self.taken:
            p = self.proxy()
            if p is not None:
                self.pending.append(float(p))
                if len(self.evaluations) == 1 and math.isnan(self.evaluations[0].proxy):  # p_0: the start's batch
                    self.evaluations[0] = dataclasses.replace(self.evaluations[0], proxy=float(p))
            self.taken = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = self.step_fn(trainer, pl_module)
        self.take(step)
        if not self.stop or step not in self.at_steps or self.stopped_at is not None or step == self.kept_step:
            return
        raised = trainer.strategy.broadcast(self.raised_at is not None, src=0)  # rank 0 evaluated
        if raised and self.kept is not None:
            with torch.no_grad():
                for name, param in self.policy().named_parameters():
                    if name in self.kept:
                        param.copy_(self.kept[name].to(param.device))
        if raised:
            self.stopped_at, self.kept = step, None
            trainer.should_stop = True
        else:
            self.keep(step)

    def keep(self, step: int) -> None:
        """Copy the policy's trainable parameters (to CPU) as the checkpoint a later alarm goes back to."""
        self.kept_step = step
        self.kept = {n: p.detach().to("cpu", copy=True) for n, p in self.policy().named_parameters() if p.requires_grad}

    def on_train_start(self, trainer, pl_module):
        if self.stop and self.kept is None and self.stopped_at is None:  # the start: the SFT policy
            self.keep(self.step_fn(trainer, pl_module))

    def on_train_end(self, trainer, pl_module):
        if trainer.global_rank == 0 and self.raised_at is None and self.evaluations:
            active_run.set_tag("rlhf_lab.hacking_alarm", "not raised")

    def summary(self) -> str:
        """The job summary's line: where the alarm was raised, or the highest score."""
        if self.raised_at is not None:
            text = f"raised at step {self.raised_at} (score {self.raised_score:.2f}, threshold {self.threshold:.2f})"
            if self.stopped_at is not None:
                text += f"; stopped there, the saved policy is step {self.kept_step}'s (algo.stop_on_alarm)"
            return text
        if self.highest is None:
            return "no evaluation after the start"
        return (f"not raised (highest score {self.highest[0]:.2f} at step {self.highest[1]}; "
                f"threshold {self.threshold:.2f})")

    STATE = ("evaluations", "pending", "taken", "raised_at", "raised_score", "highest", "kept_step", "stopped_at")

    def state_dict(self) -> dict:
        return {k: ([vars(e) for e in v] if k == "evaluations" else v)
                for k, v in ((k, getattr(self, k)) for k in self.STATE)}

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, [A.Evaluation(**e) for e in v] if k == "evaluations" else v)


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
