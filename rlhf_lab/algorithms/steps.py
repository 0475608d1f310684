"""The plumbing of the PPO family's training step: an endless loader (the loop draws its own prompts; Lightning only
needs a clock), the per-phase step timer (``time/<phase>_s``) and the finiteness check that stops a run at the first
non-finite tensor."""

from __future__ import annotations

import contextlib
import itertools
import time

import torch


def check_finite(name: str, x: torch.Tensor, step: int, mask: torch.Tensor | None = None) -> None:
    bad = ~torch.isfinite(x)
    if mask is not None:
        bad = bad & mask.bool()
    if bad.any():
        raise FloatingPointError(
            f"non-finite {name} at PPO step {step} ({int(bad.sum())} values, e.g. "
            f"{x[bad].flatten()[0].item()}); the run is stopped. Lower algo.lr, check the reward model's "
            "scores and the KL coefficient, or enable algo.reward_clip")


class Forever(torch.utils.data.IterableDataset):
    """The PPO loop draws its own prompts; Lightning only needs a clock."""

    def __iter__(self):
        return itertools.count()


class StepTimer:
    """Wall-clock seconds of one PPO step's :attr:`PHASES` (each logged as ``time/<phase>_s``): ``with timer("rollout"):
    ...`` adds the block's time to ``seconds["rollout"]``; ``elapsed()`` is the time since the step's start."""

    PHASES = {"rollout": "generation", "score": "scoring", "forward": "no-grad passes (old, reference, values)",
              "update": "update"}  # {phase: what the job summary calls it}

    def __init__(self):
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t

    def elapsed(self) -> float:
        return time.perf_counter() - self.start
