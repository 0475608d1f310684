"""``eval.schedule=kl``: evaluate when the policy's KL to its reference crosses evenly spaced levels of √KL.

Gao et al. 2022 read over-optimisation against √KL (their d = √KL(π‖π_ref)); a schedule in steps puts few
evaluations where KL rises fast (the peak of gold is often there) and many on the plateau. This one decides as
training goes: step s ≥ 1 is an evaluation step when the KL of its rollouts (PPO's ``objective/kl``, the batch mean
of the configured estimator per response, the same on every rank) has reached a level ⌊√KL / spacing⌋ above every
level evaluated before, at most ``eval.n_points`` times; the start and the end of training are evaluated as with
every schedule. Several levels crossed in one step make one evaluation, so a run whose KL jumps is evaluated less
often than its levels; a run that reaches more levels than ``n_points`` stops being evaluated between its last
level and the end (choose ``eval.sqrt_kl_spacing`` for the range the study's runs cover).
"""

from __future__ import annotations

import math
from typing import Callable


def sqrt_kl_level(kl: float | None, spacing: float) -> int:
    """The level a KL of `kl` nats per response has reached on a grid of √KL spaced `spacing`: ⌊√kl / spacing⌋;
    no estimate, or a negative or NaN one (k1 over a few rollouts can be negative), is level 0."""
    if kl is None or not kl > 0:
        return 0
    return int(math.floor(math.sqrt(kl) / spacing))


class KLSchedule:
    """The evaluation steps of ``eval.schedule=kl``, decided as training goes (module docstring). ``step in
    schedule`` decides step `step` at its first query, from `kl()` (the KL of that step's rollouts), and gives the
    same answer to every later query (:class:`~rlhf_lab.evaluation.callbacks.PeriodicEval` asks)."""

    def __init__(self, kl: Callable[[], float | None], spacing: float, n_points: int):
        if not spacing > 0:
            raise ValueError(f"eval.sqrt_kl_spacing must be > 0, got {spacing}")
        self.kl, self.spacing, self.n_points = kl, float(spacing), int(n_points)
        self.level = 0  # the highest level evaluated so far
        self.due: dict[int, bool] = {}  # step -> evaluated there

    def __contains__(self, step: int) -> bool:
        step = int(step)
        if step not in self.due:
            level = sqrt_kl_level(self.kl(), self.spacing) if step > 0 else 0
            due = level > self.level and sum(self.due.values()) < self.n_points
            if due:
                self.level = level
            self.due[step] = due
        return self.due[step]

    def steps(self) -> list[int]:
        """The evaluation steps decided so far."""
        return sorted(s for s, due in self.due.items() if due)

    def state_dict(self) -> dict:
        return {"level": self.level, "due": {str(s): d for s, d in self.due.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.level, self.due = int(state["level"]), {int(s): bool(d) for s, d in state["due"].items()}
