"""Per-run quantities of a study report (and of the claims, :mod:`rlhf_lab_research.claim_quantities`), honest
about the data they come from (docs/metrics.md names the metrics).

- **Final gold** (:func:`final_gold`): ``test/gold_reward`` (the held-out test split, logged once at the end)
  when the run logged it, else the run's last ``eval/gold_reward`` (one evaluation on ``eval.n_prompts`` prompts,
  the same stream the evaluations during training used). :func:`final_gold_source` says which.
- **Drop from peak** (:func:`gold_drop`): the split-half estimator :func:`split_half_drop` on
  ``eval/gold_reward_a`` and ``eval/gold_reward_b``, the gold reward on two fixed halves of the evaluation
  prompts: the peak is chosen on one half and measured on the other, so its noise does not inflate the drop.
  A run without the halves has **no** drop (NaN); max − last of one noisy curve is biased upward and is never
  used.

Every function returns NaN when the run lacks what it needs; the claims turn a NaN into "missing", never into 0.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlhf_lab.analysis.study_runs import RunData

NAN = float("nan")
TEST_GOLD = "test/gold_reward"
EVAL_GOLD = "eval/gold_reward"
HALF_A, HALF_B = "eval/gold_reward_a", "eval/gold_reward_b"
MIN_DROP_STEPS = 3  # evaluations (with both halves) a drop from the peak needs: a start, a peak, an end


def finite(x: Any) -> float:
    """x as a float, NaN when it is not a finite number."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return NAN
    return v if math.isfinite(v) else NAN


def final_gold(r: RunData) -> float:
    """``test/gold_reward`` if the run logged it, else its last ``eval/gold_reward``."""
    if TEST_GOLD in r.metrics:
        return finite(r.metrics[TEST_GOLD])
    return finite(r.last(EVAL_GOLD))


def final_gold_source(r: RunData) -> str:
    """"test" or "last eval": where :func:`final_gold` comes from."""
    return "test" if TEST_GOLD in r.metrics else "last eval"


def half_curves(r: RunData) -> tuple[np.ndarray, np.ndarray]:
    """The two halves' gold curves at the evaluation steps where both are logged and finite."""
    a, b = dict(r.series(HALF_A)), dict(r.series(HALF_B))
    steps = [s for s in sorted(a) if s in b and math.isfinite(a[s]) and math.isfinite(b[s])]
    return np.asarray([a[s] for s in steps], dtype=float), np.asarray([b[s] for s in steps], dtype=float)


def split_half_drop(curve_a: Any, curve_b: Any) -> float:
    """Drop of the gold from its peak to the last evaluation, the peak picked on one half of the evaluation prompts and
    measured on the other, both ways, averaged:

        p = argmax_t a[t],  q = argmax_t b[t],   drop = ((b[p] − b[T−1]) + (a[q] − a[T−1])) / 2.

    `curve_a`, `curve_b`: the mean gold at each evaluation on two disjoint, equally sized halves of the prompts
    (finite, same length). max(curve) − curve[T−1] on one noisy curve is biased upward (the max picks the noise);
    here the noise of one half is independent of the peak chosen on the other, so E[drop] = gold[peak] − gold[T−1]
    for the peak chosen (0 when it is the last evaluation)."""
    a, b = np.asarray(curve_a, dtype=float), np.asarray(curve_b, dtype=float)
    if a.ndim != 1 or a.size == 0 or a.shape != b.shape or not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError(f"two finite curves of the same length over the evaluations, got shapes {a.shape}, {b.shape}")
    p, q = int(np.argmax(a)), int(np.argmax(b))
    return (float(b[p] - b[-1]) + float(a[q] - a[-1])) / 2


def gold_drop(r: RunData) -> float:
    """Unbiased drop of gold from its peak to the last evaluation (:func:`split_half_drop`); NaN without the
    halves at MIN_DROP_STEPS or more evaluations."""
    a, b = half_curves(r)
    return split_half_drop(a, b) if a.size >= MIN_DROP_STEPS else NAN


gold_drop.__name__ = "gold drop from peak (split-half)"
final_gold.__name__ = "final gold"
