"""Gao, Schulman & Hilton 2022 functional forms of reward against d = √KL, and the reward–KL frontier.

Gold reward against d = √KL (KL = ``eval/kl``, nats per response) is fitted with the functional forms of
Gao et al. 2022 (their eq. 1-2), on the gain over the run's first evaluation (the start policy):

    RL:         R(d) = d (α − β log d)     peak at d* = exp(α/β − 1), R(d*) = β d*
    best-of-n:  R(d) = d (α − β d)         peak at d* = α / (2β),     R(d*) = α² / (4β)

both by least squares on the reward scale, Σ (rᵢ − R(dᵢ))², which is linear in (α, β): r regressed on the
columns d and −d log d (RL) or d and −d² (best-of-n), with no intercept (R(0) = 0). (Least squares on r/d, the
earlier choice, weighs each point by 1/d²: the first evaluations, where d is small and r/d mostly noise, then
decide the fit; on the gao_rm_scaling runs it gave R² below 0 where the reward-scale fit gives 0.6–0.8.) The
study reports fit the RL form per run (PPO and DPO), the Gao report (:mod:`rlhf_lab_research.studies.gao`) both forms
pooled over seeds. Pure functions of numbers: nothing here reads MLflow. See docs/metrics.md for the metrics.

No fit is made from fewer than :data:`MIN_FIT_POINTS` points with d > 0: two parameters through two or three
noisy points fit anything. :func:`fit_rl` returns a :class:`GaoFit` that also carries the goodness of fit

    R² = 1 − Σ (rᵢ − R̂(dᵢ))² / Σ (rᵢ − r̄)²     over the fitted points, on the reward scale (not on r/d),

and whether the fitted peak d* lies inside the range of the data [min d, max d]; a peak outside it is an
extrapolation, and the reports say so instead of printing it as a peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

MIN_FIT_POINTS = 5  # points with d > 0 a fit needs


def _clean(d: Sequence[float], r: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    d, r = np.asarray(d, dtype=float), np.asarray(r, dtype=float)
    ok = np.isfinite(d) & np.isfinite(r) & (d > 1e-8)
    return d[ok], r[ok]


def fit_gao_rl(d: Sequence[float], r: Sequence[float], min_points: int = MIN_FIT_POINTS) -> tuple[float, float]:
    """(α, β) of R(d) = d(α − β log d): least squares of r on (d, −d log d) over the points with d > 0;
    (nan, nan) from fewer than `min_points` such points."""
    d, r = _clean(d, r)
    if len(d) < max(2, min_points) or np.ptp(np.log(d)) < 1e-9:
        return float("nan"), float("nan")
    X = np.stack([d, -d * np.log(d)], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(X, r, rcond=None)
    return float(alpha), float(beta)


def fit_gao_bon(d: Sequence[float], r: Sequence[float], min_points: int = MIN_FIT_POINTS) -> tuple[float, float]:
    """(α, β) of R(d) = d(α − β d): least squares of r on (d, −d²) over the points with d > 0;
    (nan, nan) from fewer than `min_points` such points."""
    d, r = _clean(d, r)
    if len(d) < max(2, min_points) or np.ptp(d) < 1e-9:
        return float("nan"), float("nan")
    X = np.stack([d, -d * d], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(X, r, rcond=None)
    return float(alpha), float(beta)


def gao_rl(d: Any, alpha: float, beta: float) -> np.ndarray:
    d = np.asarray(d, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(d > 0, d * (alpha - beta * np.log(np.where(d > 0, d, 1.0))), 0.0)


def gao_bon(d: Any, alpha: float, beta: float) -> np.ndarray:
    d = np.asarray(d, dtype=float)
    return d * (alpha - beta * d)


def peak_rl(alpha: float, beta: float) -> tuple[float, float]:
    """(d*, R(d*)) of the RL form; (inf, inf) when β ≤ 0 (no peak: still rising)."""
    if not (math.isfinite(alpha) and math.isfinite(beta)) or beta <= 0:
        return float("inf") if math.isfinite(beta) else float("nan"), float("nan")
    x = alpha / beta - 1.0
    if x > 700:
        return float("inf"), float("nan")
    d = math.exp(x)
    return d, beta * d


def peak_bon(alpha: float, beta: float) -> tuple[float, float]:
    if not (math.isfinite(alpha) and math.isfinite(beta)) or beta <= 0:
        return float("inf") if math.isfinite(beta) else float("nan"), float("nan")
    return alpha / (2 * beta), alpha**2 / (4 * beta)


def r_squared(y: Any, y_hat: Any) -> float:
    """1 − SS_res / SS_tot of predictions y_hat of y (nan when y has no spread or fewer than 2 points)."""
    y, y_hat = np.asarray(y, dtype=float), np.asarray(y_hat, dtype=float)
    if y.size < 2:
        return float("nan")
    ss_tot = float(((y - y.mean()) ** 2).sum())
    if ss_tot <= 0:
        return float("nan")
    return 1.0 - float(((y - y_hat) ** 2).sum()) / ss_tot


@dataclass(frozen=True)
class GaoFit:
    """A fit of a Gao et al. form to one run's points, with what a reader needs to trust it: the RL form
    R(d) = d(α − β log d) (``form="rl"``) or the best-of-n form R(d) = d(α − β d) (``form="bon"``).

    n: points with d > 0 (the ones fitted); alpha, beta, r2: nan when n < MIN_FIT_POINTS (see `status`);
    d_lo, d_hi: the range of the fitted d; d_star, r_star: the form's peak (peak_rl, peak_bon); status: one of
    "too few points", "no peak" (β ≤ 0: still rising), "peak beyond the data" (d* > d_hi),
    "peak before the data" (d* < d_lo), "peak in the data".
    """

    n: int
    alpha: float
    beta: float
    r2: float
    d_lo: float
    d_hi: float
    d_star: float
    r_star: float
    status: str
    form: str = "rl"

    def curve(self, d: Any) -> np.ndarray:
        """The fitted form at `d`."""
        return (gao_bon if self.form == "bon" else gao_rl)(d, self.alpha, self.beta)

    @property
    def ok(self) -> bool:
        return math.isfinite(self.alpha)

    @property
    def peak_in_data(self) -> bool:
        return self.status == "peak in the data"


def fit_rl(d: Sequence[float], r: Sequence[float], min_points: int = MIN_FIT_POINTS) -> GaoFit:
    """fit_gao_rl with R² (on the reward scale), the data range and where the peak lies relative to it."""
    return _fit("rl", d, r, min_points)


def fit_bon(d: Sequence[float], r: Sequence[float], min_points: int = MIN_FIT_POINTS) -> GaoFit:
    """fit_gao_bon likewise (best-of-n: d = √(log n − (n − 1)/n))."""
    return _fit("bon", d, r, min_points)


def _fit(form: str, d: Sequence[float], r: Sequence[float], min_points: int) -> GaoFit:
    dc, rc = _clean(d, r)
    n = int(dc.size)
    lo, hi = (float(dc.min()), float(dc.max())) if n else (float("nan"), float("nan"))
    fit, shape, peak = (fit_gao_bon, gao_bon, peak_bon) if form == "bon" else (fit_gao_rl, gao_rl, peak_rl)
    alpha, beta = fit(dc, rc, min_points)
    nan = float("nan")
    if not math.isfinite(alpha):
        return GaoFit(n, nan, nan, nan, lo, hi, nan, nan, "too few points" if n < min_points else "no fit", form)
    r2 = r_squared(rc, shape(dc, alpha, beta))
    d_star, r_star = peak(alpha, beta)
    if not (beta > 0 and math.isfinite(d_star)):
        status = "no peak"
    elif d_star > hi:
        status = "peak beyond the data"
    elif d_star < lo:
        status = "peak before the data"
    else:
        status = "peak in the data"
    return GaoFit(n, alpha, beta, r2, lo, hi, d_star, r_star, status, form)


def bon_kl(n: int) -> float:
    """KL of best-of-n to the base policy, log n − (n − 1)/n (Stiennon et al. 2020; Gao et al. 2022)."""
    return math.log(n) - (n - 1) / n


def frontier(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Upper-left envelope: the points (KL, gold) that no point with lower or equal KL beats."""
    out, best = [], -float("inf")
    for kl, g in sorted(p for p in points if all(math.isfinite(x) for x in p)):
        if g > best:
            out.append((kl, g))
            best = g
    return out
