"""The statistics of the claims' verdicts (numpy and scipy only): effects with their intervals, paired
differences, the three-way verdict, one-sided p-values, Holm's adjustment, the power of a t test; and the
percentile interval of bootstrap values the studies' reports give (:func:`percentile_ci`).

The conventions of :mod:`rlhf_lab.analysis.stats` hold here (NaNs dropped, NaN bounds for too little data,
two-sided intervals at `level`), and:

* A paired difference is a − b, so a positive effect means "a is larger".
* p-values are one-sided, from the t statistic of an :class:`Effect` (mean over n units, df = n − 1), so that
  p < 0.025 on a side exactly when the 95% interval excludes the null value on that side.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats as _st

from rlhf_lab.analysis.stats import check_level, sample, t_ci

def percentile_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the bootstrap values; ±inf kept (a resample without a peak has d* = inf), NaN
    (no fit) dropped; (nan, nan) when fewer than half the resamples have a value."""
    v = np.asarray([x for x in values if not math.isnan(x)], dtype=float)
    if v.size < max(1, len(values) // 2):
        return float("nan"), float("nan")
    tail = (1 - level) / 2 * 100
    # order statistics, not interpolation (which turns an infinite neighbour into NaN); outward at each end
    return float(np.percentile(v, tail, method="lower")), float(np.percentile(v, 100 - tail, method="higher"))


HOLDS = "holds"
DOES_NOT_HOLD = "does not hold"
INCONCLUSIVE = "inconclusive"
VERDICTS = (HOLDS, DOES_NOT_HOLD, INCONCLUSIVE)


@dataclass(frozen=True)
class Effect:
    """An estimated effect with its two-sided `level` interval [lo, hi] from `n` observations (seeds)."""

    estimate: float
    lo: float
    hi: float
    n: int
    method: str
    level: float = 0.95
    values: tuple[float, ...] = field(default=(), compare=False, repr=False)  # the per-unit values (t intervals)
    bounds: tuple[float, float] | None = None  # hard bounds of each value: a betting sequence's (anytime.py)

    def verdict(self, direction: int, margin: float | None = None) -> str:
        """verdict(self.lo, self.hi, direction, margin)."""
        return verdict(self.lo, self.hi, direction, margin)

    @property
    def se(self) -> float:
        """The standard error behind a t interval: (hi − lo) / (2·t_{(1+level)/2, n−1}); NaN without one."""
        if self.n < 2 or not (math.isfinite(self.lo) and math.isfinite(self.hi)):
            return math.nan
        return (self.hi - self.lo) / (2 * float(_st.t.ppf((1 + self.level) / 2, self.n - 1)))

    @property
    def sd(self) -> float:
        """The spread of the per-unit values (or paired differences): their sd when the effect keeps them, else
        se·√n (an interval that is not a t interval, such as an anytime-valid one, keeps them)."""
        if len(self.values) == self.n >= 2:
            return float(np.std(self.values, ddof=1))
        return self.se * math.sqrt(self.n)

    def p_value(self, direction: int, null: float = 0.0) -> float:
        """one_sided_p of this effect against `null`, toward `direction` (t statistic, df = n − 1)."""
        return one_sided_p(self.estimate, self.se, self.n - 1, direction, null)


def t_effect(x: Any, level: float = 0.95, method: str = "t") -> Effect:
    """t_ci as an Effect."""
    m, lo, hi, n = t_ci(x, level)
    return Effect(m, lo, hi, n, method, level, tuple(float(v) for v in sample(x)))


def bootstrap_ci(x: Any, level: float = 0.95, n_boot: int = 10_000, seed: int = 0,
                 stat: Callable[..., Any] = np.mean) -> tuple[float, float, float, int]:
    """(stat(x), lo, hi, n): percentile bootstrap, NaNs dropped, deterministic for a given seed. (Not
    scipy.stats.bootstrap: it draws other resamples, so the committed gold-validation report would change.)

    Draw n_boot resamples of size n with replacement (numpy Generator seeded with `seed`), compute stat on each,
    and take the (1−level)/2 and (1+level)/2 quantiles of those values. `stat` is called as stat(array, axis=1)
    on a block of resamples if it accepts `axis`, else once per resample. n < 2 → (stat, nan, nan, n).
    Percentile intervals undercover for few observations (measured on normal data at level 0.95: ≈ 0.83 for
    n = 5, 0.91 for n = 10, 0.93 for n = 30); prefer t_ci for the mean of a handful of seeds.
    """
    check_level(level)
    v = sample(x)
    n = v.size
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    est = float(stat(v))
    if n < 2:
        return est, math.nan, math.nan, n
    rng = np.random.default_rng(seed)
    block = max(1, min(n_boot, 2_000_000 // n))  # bounded memory: block × n indices at a time
    out = []
    for start in range(0, n_boot, block):
        res = v[rng.integers(0, n, size=(min(block, n_boot - start), n))]
        try:
            vals = np.asarray(stat(res, axis=1), dtype=float)
        except TypeError:
            vals = np.array([stat(r) for r in res], dtype=float)
        out.append(vals)
    lo, hi = np.quantile(np.concatenate(out), [(1 - level) / 2, (1 + level) / 2])
    return est, float(lo), float(hi), n


def paired_differences(a: Mapping[Any, float] | Sequence[float] | np.ndarray,
                       b: Mapping[Any, float] | Sequence[float] | np.ndarray) -> tuple[np.ndarray, list]:
    """(d, seeds): dᵢ = a[seedᵢ] − b[seedᵢ] for the seeds both settings ran.

    Dicts (seed → value): only seeds present in both, in sorted order (insertion order if the keys do not sort).
    Arrays: aligned by position (must have the same length); `seeds` are then the positions.
    Either way a pair with a NaN on either side is dropped (that seed has no result for one of the settings).
    """
    if isinstance(a, Mapping) != isinstance(b, Mapping):
        raise TypeError("a and b must both be dicts (seed → value) or both be aligned arrays")
    if isinstance(a, Mapping):
        common = [k for k in a if k in b]
        try:
            common = sorted(common)
        except TypeError:
            pass
        va = np.array([a[k] for k in common], dtype=float)
        vb = np.array([b[k] for k in common], dtype=float)
        keys = list(common)
    else:
        va, vb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        if va.ndim != 1 or va.shape != vb.shape:
            raise ValueError(f"aligned arrays must be 1-D of the same length, got {va.shape} and {vb.shape}")
        keys = list(range(va.size))
    ok = ~(np.isnan(va) | np.isnan(vb))
    return va[ok] - vb[ok], [k for k, good in zip(keys, ok) if good]


def paired_ci(a: Any, b: Any, level: float = 0.95) -> Effect:
    """Effect of a − b over shared seeds: t interval of the mean paired difference (t_ci of paired_differences)."""
    d, _ = paired_differences(a, b)
    return t_effect(d, level, method="paired t")


def verdict(lo: float, hi: float, direction: int, margin: float | None = None) -> str:
    """Three-way decision on a claimed effect from its interval [lo, hi] (normally the 95% CI).

    direction = +1: the claim is effect > 0; −1: effect < 0.
      HOLDS          when the interval excludes 0 on the claimed side   (lo > 0 for +1, hi < 0 for −1);
      DOES_NOT_HOLD  when it lies inside the equivalence margin (−margin ≤ lo and hi ≤ margin: the effect
                     is shown to be negligible, checked first: a tiny effect measured precisely does not
                     make a claim hold), or excludes 0 on the other side;
      INCONCLUSIVE   otherwise, including NaN bounds.
    An interval touching 0 (lo == 0) does not exclude it.
    """
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction}")
    if margin is not None and not margin >= 0:
        raise ValueError(f"margin must be ≥ 0, got {margin}")
    if math.isnan(lo) or math.isnan(hi):
        return INCONCLUSIVE
    if lo > hi:
        raise ValueError(f"lo > hi: [{lo}, {hi}]")
    if margin is not None and -margin <= lo and hi <= margin:
        return DOES_NOT_HOLD  # shown to be negligible, even where it excludes 0
    if lo > 0:
        return HOLDS if direction == 1 else DOES_NOT_HOLD
    if hi < 0:
        return HOLDS if direction == -1 else DOES_NOT_HOLD
    return INCONCLUSIVE


def one_sided_p(estimate: float, se: float, df: float, direction: int, null: float = 0.0) -> float:
    """One-sided p of H0 "the effect is on the other side of `null` (or at it)" against "it is on `direction`'s side":

        t = direction·(estimate − null) / se,   p = P(T_df ≥ t)   (the normal tail when df = inf).

    se = 0: p = 0 when the estimate lies on `direction`'s side of null, 1 otherwise. NaN in, NaN out.
    p < α exactly when the two-sided (1 − 2α) t interval excludes `null` on that side.
    """
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction}")
    if not (math.isfinite(estimate) and math.isfinite(se) and df > 0):
        return math.nan
    if se == 0:
        return 0.0 if direction * (estimate - null) > 0 else 1.0
    t = direction * (estimate - null) / se
    return float(_st.norm.sf(t)) if math.isinf(df) else float(_st.t.sf(t, df))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given; NaN stays NaN and is not counted in the family.

    With the m finite p sorted, p₍₁₎ ≤ … ≤ p₍ₘ₎:  p̃₍ᵢ₎ = min(1, max_{j ≤ i} (m − j + 1)·p₍ⱼ₎).
    Rejecting every hypothesis with p̃ < α keeps the chance of any false rejection in the family at most α
    (Holm 1979), whatever the dependence between the tests.
    """
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, math.nan)
    ok = np.flatnonzero(~np.isnan(p))
    if ok.size == 0:
        return out.tolist()
    if (p[ok] < 0).any() or (p[ok] > 1).any():
        raise ValueError(f"p-values must lie in [0, 1], got {p[ok].tolist()}")
    m = ok.size
    order = ok[np.argsort(p[ok], kind="stable")]
    running = 0.0
    for i, k in enumerate(order):
        running = max(running, min(1.0, (m - i) * float(p[k])))
        out[k] = running
    return out.tolist()


def t_power(n: int, delta: float, sd: float, alpha: float) -> float:
    """Power of the one-sided one-sample (or paired) t test at level α with n units when the true mean is `delta`
    (> 0 on the tested side) and the per-unit sd is `sd`: P(T' > t_{1−α, n−1}), T' noncentral t with n − 1 degrees
    of freedom and noncentrality δ·√n / sd."""
    if n < 2:
        return 0.0
    df = n - 1
    return float(_st.nct.sf(_st.t.ppf(1 - alpha, df), df, delta * math.sqrt(n) / sd))


def units_for_power(delta: float, sd: float, alpha: float = 0.025, power: float = 0.8, n_max: int = 10_000) -> int | None:
    """The smallest n (≥ 2) whose one-sided t test at level α has at least `power` (:func:`t_power`) to detect a
    true mean `delta` with per-unit spread `sd`; None when delta ≤ 0, sd is not finite, or n_max is not enough.

    Starts from the normal approximation n₀ = ((z_{1−α} + z_{power})·sd/δ)² and steps up: the t test needs a
    little more (heavier tails, fewer degrees of freedom)."""
    if not (0 < alpha < 1 and 0 < power < 1):
        raise ValueError(f"alpha and power must be in (0, 1), got {alpha}, {power}")
    if not (math.isfinite(delta) and math.isfinite(sd)) or delta <= 0 or sd < 0:
        return None
    if sd == 0:
        return 2
    z = float(_st.norm.ppf(1 - alpha) + _st.norm.ppf(power))
    n = max(2, int(math.floor((z * sd / delta) ** 2)))
    if n > n_max:
        return None
    while t_power(n, delta, sd, alpha) < power:
        n += 1
        if n > n_max:
            return None
    while n > 2 and t_power(n - 1, delta, sd, alpha) >= power:  # the floor of n₀ can already be enough
        n -= 1
    return n
