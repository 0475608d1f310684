"""Anytime-valid confidence sequence for the mean of bounded per-seed values, by betting (issue 69).

The t-mixture sequence (:mod:`rlhf_lab_research.sequential`) assumes symmetric (Gaussian-like) values; with skewed
ones it miscovers (tests/test_betting.py measures 23 % against its 5 % on Beta(0.3, 3) values watched at every n from 5
to 30; this sequence 0.4 %). Where a quantity has hard bounds [lo, hi] fixed by its definition (a fraction, an accuracy, a Spearman
|ρ|, and their differences), the betting confidence sequence of Waudby-Smith & Ramdas (2023, "Estimating means of
bounded random variables by betting", JRSS-B 86(1), arXiv:2010.09686) needs nothing else: it is valid for every
distribution on [lo, hi] at every n, however n was chosen.

Construction (their Theorem 3, the hedged capital process with the predictable plug-in bets of their eq. (26)–(27)).
Rescale y = (x − lo)/(hi − lo) ∈ [0, 1] and a candidate mean m ∈ (0, 1). With bets λ_i fixed before y_i is seen,

    K⁺_n(m) = Π_{i≤n} (1 + min(λ_i, c/m)·(y_i − m)),   K⁻_n(m) = Π_{i≤n} (1 − min(λ_i, c/(1 − m))·(y_i − m)),
    K_n(m) = ½K⁺_n(m) + ½K⁻_n(m),

each factor > 0 (c = ½), so K(μ) is a nonnegative martingale with K_0 = 1 at the true mean μ and, by Ville's
inequality, P(∃n: K_n(μ) ≥ 1/α) ≤ α: the set {m : K_n(m) < 1/α} is a (1 − α) confidence sequence and
p_n = min(1, 1/K_n(null)) an anytime-valid p value, the smallest α whose sequence at n excludes `null` (so the interval
and p agree, as with :func:`sequential.anytime_t`). The bets: λ_i = √(2 log(2/α₀) / (σ̂²_{i−1}·i·log(1 + i))) (capped at c/m and
c/(1 − m) above), σ̂²_i = (¼ + Σ_{j≤i}(y_j − μ̂_j)²)/(i + 1), σ̂²_0 = ¼, μ̂_i = (½ + Σ_{j≤i} y_j)/(i + 1), tuned for α₀ = ALPHA_OPT whatever the α
asked, so that p is one family for every α (as the t mixture's c is). Unlike the t sequence the result depends on the
order of the values: they are taken in seed order, which the study files fix before any run.

Neither maintained implementation installs here (2026-12-06, Python 3.11, a fresh venv): ``confseq`` 0.0.11 (its
betting module is Python, but the package is a C++ extension built with scikit-build and CMake: the build fails, and
it pulls matplotlib, multiprocess, pandas and pytest at run time) and ``expectation`` 0.6.1 (requires Python ≥ 3.12;
GPL-3.0 with an AI-training prohibition). These 40 lines are checked against a hand computation and by simulation.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

ALPHA_OPT = 0.05   # the α the bets are tuned for (fixed: p = 1/K is then one family for every α)
TRUNCATION = 0.5   # c: the largest fraction of the capital a bet may risk (their recommended ½)
GRID = 4001        # candidate means over [lo, hi] at which the capital is computed for the interval

__all__ = ["ALPHA_OPT", "betting_bets", "betting_cs", "betting_log_capital"]


def betting_bets(y: np.ndarray, alpha_opt: float = ALPHA_OPT) -> np.ndarray:
    """The predictable plug-in bets λ_1..λ_n (before their caps c/m, c/(1 − m)) for values y in [0, 1], along the last axis:
    λ_i uses y_1..y_{i−1} only."""
    y = np.asarray(y, dtype=float)
    n = y.shape[-1]
    i = np.arange(1, n + 1)
    mu_hat = (0.5 + np.cumsum(y, axis=-1)) / (i + 1)                       # μ̂_i, after y_i
    var = (0.25 + np.cumsum((y - mu_hat) ** 2, axis=-1)) / (i + 1)      # σ̂²_i
    prev_var = np.concatenate([np.full(y.shape[:-1] + (1,), 0.25), var[..., :-1]], axis=-1)   # σ̂²_{i−1}
    return np.sqrt(2 * math.log(2 / alpha_opt) / (prev_var * i * np.log1p(i)))


def betting_log_capital(y: Any, m: Any, alpha_opt: float = ALPHA_OPT) -> np.ndarray:
    """log K_n(m) of the hedged capital (the module docstring) for values y ∈ [0, 1] (last axis: the values in order)
    at candidate means m ∈ (0, 1) (broadcast against y's leading axes; a trailing axis of m is added). Returns an
    array of shape broadcast(y[..., 0], m)."""
    y = np.asarray(y, dtype=float)
    m = np.asarray(m, dtype=float)[..., None]
    lam = betting_bets(y, alpha_opt)
    with np.errstate(divide="ignore"):
        up = np.log1p(np.minimum(lam, TRUNCATION / m) * (y - m)).sum(axis=-1)
        down = np.log1p(-np.minimum(lam, TRUNCATION / (1 - m)) * (y - m)).sum(axis=-1)
    return np.logaddexp(up, down) - math.log(2)


def betting_cs(values: Any, lo: float, hi: float, alpha: float = 0.05, direction: int = 0, null: float = 0.0,
               alpha_opt: float = ALPHA_OPT) -> tuple[float, float, float, float, int]:
    """(estimate, lo, hi, p, n) for the mean of `values` (NaNs dropped, in the given order), each in [lo, hi]:
    the (1 − alpha) betting confidence sequence at n, read on a grid of GRID means (widened by one grid step, so
    it never claims more than the grid shows), and p = min(1, 1/K_n(null)); one-sided (direction ±1): the same p
    when the estimate lies on that side of `null`, else 1. ValueError for a value outside [lo, hi]."""
    if not (0 < alpha < 1 and hi > lo and direction in (-1, 0, 1)):
        raise ValueError(f"betting_cs needs 0 < alpha < 1, hi > lo and direction in -1, 0, 1; got {alpha}, "
                         f"[{lo}, {hi}], {direction}")
    x = np.asarray(values, dtype=float).reshape(-1)
    x = x[~np.isnan(x)]
    n = int(x.size)
    if n == 0:
        return math.nan, -math.inf, math.inf, 1.0, 0
    if x.min() < lo or x.max() > hi:
        raise ValueError(f"a value outside its bounds [{lo}, {hi}]: {x.min()!r} .. {x.max()!r}")
    width = hi - lo
    y, est = (x - lo) / width, float(x.mean())
    grid = np.linspace(0, 1, GRID)[1:-1]
    inside = grid[betting_log_capital(y, grid, alpha_opt) < math.log(1 / alpha)]
    step = 1 / (GRID - 1)
    lo_m = lo + width * max(0.0, float(inside.min()) - step) if inside.size else -math.inf
    hi_m = lo + width * min(1.0, float(inside.max()) + step) if inside.size else math.inf
    m0 = min(max((null - lo) / width, step / 2), 1 - step / 2)  # the null inside (0, 1): K at the bounds is not finite
    p = float(min(1.0, math.exp(-float(betting_log_capital(y, m0, alpha_opt)))))
    if direction and not direction * (est - null) > 0:
        p = 1.0
    return est, lo_m, hi_m, p, n
