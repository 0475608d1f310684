"""The guards of the policy algorithms (PPO, GRPO, RLOO): stop a run at the first non-finite tensor
(:func:`check_finite`), or whose policy has left the region where its numbers mean anything, on signals that need no
gold reward (:func:`check_divergence`):

- collapse: the policy's entropy (``objective/entropy``, nats per token) below ``algo.min_entropy``;
- drift: the KL to the reference (``objective/kl``, nats per response) above ``algo.max_kl``;
- destruction: one step's updates moved the policy far (``policy/approxkl``, the k2 estimate of KL(π_old‖π_θ),
  nats per token, mean over the step's minibatch updates) above ``algo.max_approxkl``, or its samples became near
  noise (``objective/entropy`` above ``algo.max_entropy_ratio`` × log(vocabulary size), the uniform distribution's,
  where the policy's first step was below it: a barely trained checkpoint that starts near uniform is not stopped).

Each bound is off with null. The defaults sit above what the committed studies logged (the largest
``policy/approxkl`` of any step in ``reports/claims_runs.json.gz`` is about 1.8 nats per token, the largest entropy
about 0.22 × log V; ``tests/test_guards.py`` replays those runs) and below what a destroyed policy shows (the default
model with ``algo.lr=1e6``: 11.8 at its first step; the tiny model with ``algo.lr=1``: about 3·10⁵). A leaf module
(it imports no torch: the tensors' own methods do).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class Diverged(RuntimeError):
    """The policy left the region where PPO's numbers mean anything (``algo.max_kl``, ``algo.min_entropy``,
    ``algo.max_approxkl``, ``algo.max_entropy_ratio``)."""


FIX = "lower algo.lr or raise kl.beta"


def check_finite(name: str, x: torch.Tensor, step: int, mask: torch.Tensor | None = None) -> None:
    """Raise FloatingPointError at a non-finite value of the tensor `x` (where `mask` is 1, if given). Unmasked, one
    reduction first: a sum is finite unless a value is not (or the sum overflows), so only a tensor whose sum is not
    finite is checked value by value (at 0.5b, checking the trained weights after each update this way reads them
    once instead of allocating and reading two boolean copies: about 10× less time)."""
    if mask is None and x.is_floating_point() and bool(x.sum().isfinite()):
        return
    bad = ~x.isfinite()
    if mask is not None:
        bad = bad & mask.bool()
    if bad.any():
        raise FloatingPointError(
            f"non-finite {name} at PPO step {step} ({int(bad.sum())} values, e.g. "
            f"{x[bad].flatten()[0].item()}); the run is stopped. Lower algo.lr, check the reward model's "
            "scores and the KL coefficient, or enable algo.reward_clip")


def divergence(stats: dict[str, float], step: int, *, max_kl: float | None = None, min_entropy: float | None = None,
               max_approxkl: float | None = None, max_entropy_ratio: float | None = None,
               vocab_size: int | None = None, start_entropy: float | None = None) -> str | None:
    """Why the step's statistics show a diverged policy (one line naming the key), or None. `start_entropy`: the
    entropy of the run's first step; the noise bound applies only when it was below the bound."""
    kl, ent, akl = stats.get("objective/kl"), stats.get("objective/entropy"), stats.get("policy/approxkl")
    if max_kl is not None and kl is not None and kl > max_kl:
        return (f"KL to the reference {kl:.4g} nats per response > algo.max_kl={max_kl} at PPO step {step}; "
                f"the policy diverged: {FIX} (or raise algo.max_kl)")
    if min_entropy is not None and ent is not None and ent < min_entropy:
        return (f"policy entropy {ent:.4g} nats per token < algo.min_entropy={min_entropy} at PPO step {step}; "
                f"the policy collapsed: {FIX} (or lower algo.min_entropy)")
    if max_approxkl is not None and akl is not None and akl > max_approxkl:
        return (f"one step's updates moved the policy {akl:.4g} nats per token (policy/approxkl) > "
                f"algo.max_approxkl={max_approxkl} at PPO step {step}; the policy was destroyed: {FIX} "
                "(or raise algo.max_approxkl)")
    if max_entropy_ratio is not None and ent is not None and vocab_size and vocab_size > 1:
        uniform = math.log(vocab_size)
        started_below = start_entropy is None or start_entropy <= max_entropy_ratio * uniform
        if ent > max_entropy_ratio * uniform and started_below:
            return (f"policy entropy {ent:.4g} nats per token > algo.max_entropy_ratio={max_entropy_ratio} × "
                    f"{uniform:.3g} (uniform over {vocab_size} tokens) at PPO step {step}; the policy samples noise: "
                    f"{FIX} (or raise algo.max_entropy_ratio)")
    return None


def check_divergence(stats: dict[str, float], step: int, **bounds) -> None:
    """Raise :class:`Diverged` with :func:`divergence`'s line when the step's statistics show a diverged policy."""
    why = divergence(stats, step, **bounds)
    if why:
        raise Diverged(why)
