"""Per-run quantities of the claims, beside those of a study report (:mod:`rlhf_lab.analysis.quantities`: the final
gold, the split-half drop from the peak), each NaN when the run lacks what it needs:

- **Change over training** (:func:`change`): the last minus the first logged value of a metric (two single
  evaluations, no running mean).
- **Per-step summaries** (:func:`step_mean`, :func:`step_median`, :func:`step_noise`, :func:`max_jump`): over
  every step at which the run logged the metric.
- The drop over the evaluations below a KL (:func:`gold_drop_upto`), the peak gold (:func:`gold_peak`), the RM's
  metrics and seed (:func:`rm_metric`, :func:`rm_seed`).
"""

from __future__ import annotations

import math

import numpy as np

from rlhf_lab.analysis.quantities import (HALF_A, HALF_B, MIN_DROP_STEPS, NAN, final_gold, finite, half_curves,
                                          split_half_drop)
from rlhf_lab.analysis.study_runs import HISTORY_KEYS, RunData

# the metrics whose per-step histories the claims read (HISTORY_KEYS are the study reports')
CLAIM_HISTORY_KEYS = tuple(dict.fromkeys(HISTORY_KEYS + (
    HALF_A, HALF_B, "eval/gold_reward_se", "eval/gold_reward_ood", "eval/unique_rate", "eval/distinct_1",
    "objective/kl_k1", "objective/kl_k3", "objective/scores", "objective/advantage_var", "policy/approxkl",
    "policy/clipfrac", "time/step_s", "eval/proxy_gold_agreement",
    "objective/beta", "objective/kl", "objective/rlhf_reward")))  # β's path and the rollouts' KL: adaptive-KL signals



def final(key: str):
    """The last logged value of `key` (the run's last evaluation for ``eval/*``) as a quantity."""
    def q(r: RunData) -> float:
        return finite(r.last(key))
    q.__name__ = f"final {key}"
    return q


def change(key: str):
    """Last minus first logged value of `key` (NaN with fewer than 2 values)."""
    def q(r: RunData) -> float:
        s = r.series(key)
        return finite(s[-1][1] - s[0][1]) if len(s) >= 2 else NAN
    q.__name__ = f"change of {key}"
    return q


def above_reference(r: RunData) -> float:
    """Final gold (:func:`final_gold`) minus the gold of the run's reference, ``reference/gold_reward`` (measured on
    the same test prompts at step 0, when the reference is another model): how far above it the policy got."""
    return final_gold(r) - finite(r.metrics.get("reference/gold_reward"))


above_reference.__name__ = "final gold − reference/gold_reward"


def _values(r: RunData, key: str) -> np.ndarray:
    v = np.asarray([x for _, x in r.series(key)], dtype=float)
    if v.size == 0 and key in r.metrics:  # no history loaded: the one (last) value
        v = np.asarray([r.metrics[key]], dtype=float)
    return v[np.isfinite(v)]


def step_mean(key: str):
    """Mean of `key` over every logged step."""
    def q(r: RunData) -> float:
        v = _values(r, key)
        return float(v.mean()) if v.size else NAN
    q.__name__ = f"mean of {key} over steps"
    return q


def step_median(key: str):
    """Median of `key` over every logged step (robust to a slow first step)."""
    def q(r: RunData) -> float:
        v = _values(r, key)
        return float(np.median(v)) if v.size else NAN
    q.__name__ = f"median of {key} over steps"
    return q


def step_noise(key: str):
    """Step-to-step noise of `key`: std of second differences / √6 (σ of white noise; a linear trend cancels).
    Needs 4 logged steps."""
    def q(r: RunData) -> float:
        v = _values(r, key)
        return float(np.std(np.diff(v, 2)) / math.sqrt(6)) if v.size >= 4 else NAN
    q.__name__ = f"step-to-step noise of {key}"
    return q


def max_jump(key: str):
    """Largest |change| of `key` between consecutive logged steps: the size of the worst spike."""
    def q(r: RunData) -> float:
        v = _values(r, key)
        return float(np.abs(np.diff(v)).max()) if v.size >= 2 else NAN
    q.__name__ = f"largest step-to-step change of {key}"
    return q


def rm_metric(key: str):
    """A metric of the run's upstream RM (``rlhf_lab.upstream.rm``), or of the run itself for an ``rm`` run."""
    def q(r: RunData) -> float:
        if r.stage == "rm":
            return finite(r.metrics.get(key, NAN))
        return finite(r.rm.get("metrics", {}).get(key, NAN))
    q.__name__ = f"RM {key}"
    return q


def gold_drop_upto(kl_max: float):
    """The split-half drop (:func:`rlhf_lab.analysis.quantities.gold_drop`) over the evaluations with ``eval/kl`` ≤ `kl_max` only: runs
    compared at a matched KL (NaN with fewer than MIN_DROP_STEPS such evaluations, or `kl_max` NaN)."""
    def q(r: RunData) -> float:
        a, b, kl = dict(r.series(HALF_A)), dict(r.series(HALF_B)), dict(r.series("eval/kl"))
        steps = [s for s in sorted(a) if s in b and s in kl and kl[s] <= kl_max
                 and math.isfinite(a[s]) and math.isfinite(b[s])]
        if len(steps) < MIN_DROP_STEPS:
            return NAN
        return split_half_drop([a[s] for s in steps], [b[s] for s in steps])
    q.__name__ = f"gold drop from peak up to KL {kl_max:.2f} (split-half)"
    return q


def gold_peak(r: RunData) -> float:
    """Gold at the peak without selection bias: the peak chosen on one half of the eval prompts and read on the
    other, both ways, averaged (the split-half of :func:`~rlhf_lab.analysis.quantities.gold_drop`); NaN without the halves."""
    a, b = half_curves(r)
    if a.size < MIN_DROP_STEPS:
        return NAN
    return float((b[int(np.argmax(a))] + a[int(np.argmax(b))]) / 2)


gold_peak.__name__ = "peak gold (split-half)"


def rm_seed(r: RunData) -> str:
    """The seed of the RM a run measures (the RM run's own ``seed`` param): several runs that share one RM are
    one unit. An RM whose seed is unknown (metadata from the artifact cache) is its own unit, named by its run id."""
    if r.stage == "rm":
        return str(r.params.get("seed", r.seed))  # the seed the stage used (an upstream RM keeps its own)
    seed = r.rm.get("params", {}).get("seed")
    return str(seed) if seed is not None else f"rm {r.rm.get('run_id', r.run_id)}"


rm_seed.n_of = "RM seeds"  # type: ignore[attr-defined]  (what effects.n_of reports)
