"""Gao, Schulman & Hilton 2022 functional forms of reward against d = √KL, and the reward–KL frontier.

Gold reward against d = √KL (KL = ``eval/kl``, nats per response) is fitted with the functional forms of
Gao et al. 2022 (their eq. 1-2), on the gain over the run's first evaluation (the start policy):

    RL:         R(d) = d (α − β log d)     peak at d* = exp(α/β − 1), R(d*) = β d*
    best-of-n:  R(d) = d (α − β d)         peak at d* = α / (2β),     R(d*) = α² / (4β)

both by least squares on R/d, which is linear in (α, β). The reports fit the RL form (PPO and DPO runs);
the best-of-n form is here for the comparison with Gao et al. and has no runs of its own yet. Pure functions
of numbers: nothing here reads MLflow. See docs/metrics.md for the metrics.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np


def _clean(d: Sequence[float], r: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    d, r = np.asarray(d, dtype=float), np.asarray(r, dtype=float)
    ok = np.isfinite(d) & np.isfinite(r) & (d > 1e-8)
    return d[ok], r[ok]


def fit_gao_rl(d: Sequence[float], r: Sequence[float]) -> tuple[float, float]:
    """(α, β) of R(d) = d(α − β log d): least squares on r/d = α − β log d over the points with d > 0."""
    d, r = _clean(d, r)
    if len(d) < 2 or np.ptp(np.log(d)) < 1e-9:
        return float("nan"), float("nan")
    X = np.stack([np.ones_like(d), -np.log(d)], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(X, r / d, rcond=None)
    return float(alpha), float(beta)


def fit_gao_bon(d: Sequence[float], r: Sequence[float]) -> tuple[float, float]:
    """(α, β) of R(d) = d(α − β d): least squares on r/d = α − β d over the points with d > 0."""
    d, r = _clean(d, r)
    if len(d) < 2 or np.ptp(d) < 1e-9:
        return float("nan"), float("nan")
    X = np.stack([np.ones_like(d), -d], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(X, r / d, rcond=None)
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
