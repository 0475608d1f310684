"""Anytime-valid inference on the mean of paired per-seed differences (issue 42, point 3: optional stopping).

A fixed-n t interval is valid only if n was fixed before the data were seen. Seeds added after looking at the
results (continue while the interval straddles 0, stop once it does not) make the chance of ever excluding a
true null far larger than α (tests/test_sequential.py measures about 0.26 for α = 0.05 when a t test is looked
at after every seed from 3 to 30). A *confidence sequence* (CS) is a sequence of intervals CI_n with
P(∀n ≥ 1: μ ∈ CI_n) ≥ 1 − α, so the interval at a data-dependent n (any stopping rule, even one that is not a
stopping time) still covers μ with probability ≥ 1 − α (Howard, Ramdas, McAuliffe & Sekhon 2021, "Time-uniform,
nonparametric, nonasymptotic confidence sequences", Ann. Statist. 49(2), arXiv:1810.08240, their (1) and Lemma 3).

The construction, :func:`anytime_t`, is by the method of mixtures plus Ville's inequality P(∃n: E_n ≥ 1/α) ≤ α for
a nonnegative (super)martingale E with E_0 = 1, for an **unknown variance** (seed differences do not come with one; a
normal mixture with a known σ, Howard et al. 2021 eq. (14), would need it). See its docstring.

Conventions follow :mod:`rlhf_lab_research.stats`: NaNs are dropped (a crashed run is not a value), a paired
difference is a − b, direction = +1 / −1 means the claim is effect > 0 / < 0. Where a CS is not yet finite the
bounds are (−inf, +inf), which :func:`rlhf_lab_research.stats.verdict` reads as inconclusive.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import optimize

N_OPT = 10          # the number of seeds at which the boundaries are tightest (see anytime_t)
ALPHA_OPT = 0.05    # the α for which the mixture width is tuned; fixed, so that p = 1/E is one family for all α

__all__ = [
    "ALPHA_OPT", "N_OPT", "anytime_t", "t_mixture_c", "t_mixture_log_e", "t_mixture_multiplier",
]


def _sample(values: Any) -> np.ndarray:
    """values as a 1-D float array in the given (run) order, NaNs dropped."""
    v = np.asarray(values, dtype=float).reshape(-1)
    return v[~np.isnan(v)]


def _check(alpha: float, direction: int) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if direction not in (-1, 0, 1):
        raise ValueError(f"direction must be -1, 0 or +1, got {direction}")


def _p(log_e: float, estimate: float, direction: int) -> float:
    """min(1, 1/E); one-sided (direction ±1): the same p when the estimate lies on the claimed side, else 1.

    The one-sided p is valid for the composite null "effect ≤ 0" (resp. ≥ 0): p ≤ α means the α-level CS lies
    wholly on the claimed side of 0, so it misses every μ of that null, which happens with probability ≤ α.
    """
    if direction and not direction * estimate > 0:
        return 1.0
    return float(min(1.0, math.exp(-log_e)))


# ---------------------------------------------------------------- unknown variance: the t mixture

def t_mixture_log_e(s: Any, q: Any, n: Any, c: float) -> Any:
    """log E_n of the scale-invariant t-mixture martingale at null mean 0, from S_n = Σxᵢ, Q_n = Σxᵢ², n:

        E_n = √(c/(c + n)) · (1 − S_n²/((n + c)·Q_n))^(−n/2)          (E_n = 1 where Q_n = 0; E_1 = 1)

    Derivation (Wang & Ramdas 2023, the Gaussian-mixture replacement of Lai's 1976 flat mixture): under
    Xᵢ ~ N(μ, σ²), mix the likelihood over μ/σ ~ N(0, 1/c) and over σ with the right-Haar measure dσ/σ, and divide
    by the same Haar mixture under μ = 0. The σ-integrals give Q^(−n/2) under the null and
    (det(I + 11ᵀ/c))^(−1/2)·(Q − S²/(n + c))^(−n/2) under the mixture. By Wijsman's representation this ratio is
    the likelihood ratio of the maximal scale invariant (x/|x₁|), so it is a test martingale in that reduced
    filtration under the null for every σ (and under any spherically symmetric law, e.g. a common random σ), and
    Ville's inequality applies. It equals the Bayes factor of Gönen, Johnson, Lu & Westfall (2005) for the one-
    sample t test with δ ~ N(0, 1/c): (1 + n/c)^(−1/2)·[(1 + t²/ν)/(1 + t²/(ν(1 + n/c)))]^(n/2), ν = n − 1.
    S² ≤ nQ (Cauchy–Schwarz) keeps the bracket ≥ c/(n + c) > 0. Arrays broadcast; for the path of a run-ordered
    sample x use t_mixture_log_e(np.cumsum(x), np.cumsum(x**2), np.arange(1, len(x) + 1), c).
    """
    s, q, n = (np.asarray(a, dtype=float) for a in (s, q, n))
    ratio = np.divide(s ** 2, (n + c) * q, out=np.zeros(np.broadcast(s, q, n).shape), where=q > 0)
    # E_1 = 1 exactly (one value carries no evidence about the mean at unknown scale): its two logs cancel only up to
    # rounding, which left a p of 0.9999999999999999 with some numpy builds
    return np.where((q > 0) & (n > 1), 0.5 * np.log(c / (c + n)) - 0.5 * n * np.log1p(-ratio), 0.0)


def t_mixture_multiplier(n: Any, c: float, alpha: float) -> Any:
    """k_n such that the t-mixture CS at n is X̄_n ± k_n·s_n/√n (s_n the ddof = 1 sd), +inf where it is unbounded.

    Solving E_n(μ) ≥ 1/α (E_n of :func:`t_mixture_log_e` with xᵢ − μ in place of xᵢ) for T = √n(X̄_n − μ)/s_n,
    using Q = (n − 1)s² + n(X̄ − μ)² and S = n(X̄ − μ): with a_n = 1 − (α²c/(c + n))^(1/n),

        T² ≥ k_n² = (n − 1)(n + c)·a_n / (n − (n + c)·a_n)      when n > (n + c)·a_n,

    and no μ is ever excluded otherwise, which is the case exactly when (c/(c + n))^(n−1) ≥ α². This is the
    one-line closed form of the CS for Wang & Ramdas's (2023) Gaussian mixture (Lai 1976 mixes μ flat instead).
    For α = 0.05 and c = t_mixture_c() it is unbounded for n ≤ 4.
    """
    n = np.asarray(n, dtype=float)
    a = -np.expm1(np.log(alpha ** 2 * c / (c + n)) / n)
    d = n - (n + c) * a
    with np.errstate(divide="ignore", invalid="ignore"):
        k2 = np.where(d > 0, (n - 1) * (n + c) * a / np.where(d > 0, d, 1.0), np.inf)
    return np.sqrt(k2)


@lru_cache(maxsize=None)
def t_mixture_c(n_opt: int = N_OPT, alpha_opt: float = ALPHA_OPT) -> float:
    """The mixture precision c that makes the t-mixture CS narrowest at n = n_opt for α = alpha_opt:
    argmin_c t_mixture_multiplier(n_opt, c, alpha_opt), found numerically over log c inside the region where the
    CS is bounded, c < n·α^(2/(n−1))/(1 − α^(2/(n−1))). n_opt = 10, α = 0.05 gives c ≈ 0.7224 (k₁₀ ≈ 3.853,
    against t₀.₉₇₅,₉ = 2.262). This is the analogue of Howard et al.'s Proposition 3 for the t boundary; their
    normal-mixture ρ with σ = 1, ρ = 10/8.212 ≈ 1.218, is nearly as narrow at n = 10 (k ≈ 3.90) but much wider
    at n = 5 (11.95 against 6.61), so the exact optimum is used.
    """
    if n_opt < 2:
        raise ValueError(f"n_opt must be ≥ 2, got {n_opt}")
    g = alpha_opt ** (2.0 / (n_opt - 1))
    log_c_max = math.log(n_opt * g / (1.0 - g))
    res = optimize.minimize_scalar(lambda lc: float(t_mixture_multiplier(n_opt, math.exp(lc), alpha_opt)),
                                   bounds=(log_c_max - 30.0, log_c_max - 1e-9), method="bounded",
                                   options={"xatol": 1e-10})
    return float(math.exp(res.x))


def anytime_t(values: Any, alpha: float = 0.05, direction: int = 0, null: float = 0.0, n_opt: int = N_OPT,
              alpha_opt: float = ALPHA_OPT) -> tuple[float, float, float, float, int]:
    """(estimate, lo, hi, p_anytime, n): anytime-valid CS and p value for the mean of per-seed values of unknown
    variance (normally paired differences a − b, one per seed, in the order the seeds were run).

    Which construction, and why. Seed differences have unknown variance and n is 3 to 30, so a plug-in σ in the
    normal mixture (Howard et al. 2021, eq. (14)) is not valid at these n. We use the sequential t test, the
    t-mixture of Lai (1976, "On confidence sequences", Ann. Statist. 4(2)), in the form of Wang & Ramdas (2023,
    "Anytime-valid t-tests and confidence sequences for Gaussian means with unknown variance", arXiv:2310.03722),
    who replace Lai's improper flat mixture over μ by a Gaussian mixture over μ/σ: the result is a proper test
    martingale (Ville's inequality as usual, no extended Ville needed, and 1/E is a p value) with a closed-form
    CS, X̄_n ± k_n·s_n/√n (:func:`t_mixture_multiplier`, :func:`t_mixture_log_e`).

    Tuning. The mixture precision c = t_mixture_c(n_opt, alpha_opt) makes the CS narrowest at n_opt = 10 seeds
    (the geometric middle of the 3 to 30 seeds studies run) for α = 0.05, giving k_n = ∞ (n ≤ 4), 6.61 (5),
    4.47 (7), 3.85 (10), 3.56 (15), 3.46 (20), 3.39 (30); the fixed-n t quantile at n = 10 is 2.26. c depends on
    alpha_opt, not on `alpha`, so the p value is one family valid for every α at once; the interval at another
    `alpha` uses the same c. The price of anytime validity at 3 or 4 seeds at 95% is an unbounded interval: with
    this c, E_n ≤ ((n + c)/c)^((n−1)/2) < 20 for n ≤ 4, so no data can reach 1/α there.

    p value. p = min(1, 1/E_n) at the current n, E_n computed from xᵢ − null: the smallest α whose CS at n excludes
    `null`, so p ≤ α exactly when [lo, hi] excludes it (a verdict from the interval and one from p agree). It is
    anytime valid, since P(∃n: 1/E_n ≤ α) = P(∃n: E_n ≥ 1/α) ≤ α: valid at any data-dependent n, usable in Holm.
    The running version 1/max_{k≤n} E_k is valid too and never larger, but we do not use it: it would let an
    early fluke (say at seed 5) carry a claim the full set of seeds no longer supports, it would disagree with
    the reported interval, and it depends on the run order. E_n itself depends only on Σxᵢ, Σxᵢ² and n, so the
    result does not depend on the order of the seeds (which need not be recorded exactly). Do not use E at a
    data-dependent n as an e-value (say, multiplied across studies): E is a martingale in the reduced (scale-
    invariant) filtration only, where a rule that looks at the raw values is not a stopping time; 1/E as a p value
    is unaffected, since Ville's inequality bounds the whole path.

    direction = 0 gives the two-sided p; ±1 the one-sided p (the same p when the estimate lies on that side of
    `null`, else 1; see _p): p ≤ α when the two-sided (1 − α) CS lies wholly on that side, so at the verdicts'
    one-sided 0.025 it corresponds to the 97.5% CS, not the 95% one (stats.one_sided_p's pairing); halving it is
    not justified without a one-sided mixture. Assumes Gaussian (or spherically symmetric)
    differences; the tests measure it conservative for symmetric heavy tails (t₃), but strongly skewed
    differences at small n break it, as they break the fixed-n t test.
    """
    _check(alpha, direction)
    x = _sample(values)
    n = int(x.size)
    if n == 0:
        return math.nan, -math.inf, math.inf, 1.0, 0
    c = t_mixture_c(n_opt, alpha_opt)
    est, y = float(x.mean()), x - null
    p = _p(float(t_mixture_log_e(y.sum(), float(np.dot(y, y)), n, c)), est - null, direction)
    k = float(t_mixture_multiplier(n, c, alpha)) if n > 1 else math.inf
    if math.isinf(k):
        return est, -math.inf, math.inf, p, n
    r = k * float(x.std(ddof=1)) / math.sqrt(n)
    return est, est - r, est + r, p, n
