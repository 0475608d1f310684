"""rlhf_lab_research.betting: the betting confidence sequence against a hand computation, and by simulation that it
keeps its level under continuous monitoring on skewed bounded values where the t-mixture sequence does not (issue 69).
Vectorised: about 1 s of CPU."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlhf_lab_research.betting import TRUNCATION, betting_bets, betting_cs, betting_log_capital
from rlhf_lab_research.sequential import t_mixture_c, t_mixture_multiplier


def test_bets_and_capital_by_hand():
    # y = (1, 0), α₀ = 0.05, 2 ln 40 = 7.37776: λ₁ = √(7.37776/(¼·1·ln 2)) = 6.52498 (σ̂²₀ = ¼);
    # μ̂₁ = (½ + 1)/2 = ¾, σ̂²₁ = (¼ + (1 − ¾)²)/2 = 0.15625, λ₂ = √(7.37776/(0.15625·2·ln 3)) = 4.63572
    y = np.array([1.0, 0.0])
    assert betting_bets(y) == pytest.approx([6.52498, 4.63572], rel=1e-5)
    # at m = ½ both bets are capped at c/m = c/(1 − m) = 1: K⁺ = (1 + ½)(1 − ½) = ¾, K⁻ = (1 − ½)(1 + ½) = ¾
    assert TRUNCATION == 0.5
    assert math.exp(betting_log_capital(y, 0.5)) == pytest.approx(0.75, rel=1e-12)
    # at m = 0.8: caps c/m = 0.625 (⁺) and c/0.2 = 2.5 (⁻): K⁺ = (1 + 0.625·0.2)(1 − 0.625·0.8) = 0.5625,
    # K⁻ = (1 − 2.5·0.2)(1 + 2.5·0.8) = 1.5, K = (0.5625 + 1.5)/2 = 1.03125
    assert math.exp(betting_log_capital(y, 0.8)) == pytest.approx(1.03125, rel=1e-12)


def test_interval_agrees_with_p_and_bounds():
    x = [0.2, 0.5, 0.4, 0.6, 0.3, 0.45, 0.5, 0.35, 0.55, 0.4] * 3
    est, lo, hi, p, n = betting_cs(x, 0.0, 1.0, alpha=0.05)
    assert n == 30 and lo < est < hi and 0 <= lo and hi <= 1
    assert betting_cs(x, 0.0, 1.0, null=lo - 0.01)[3] < 0.05 < betting_cs(x, 0.0, 1.0, null=lo + 0.01)[3]
    assert betting_cs(x, 0.0, 1.0, direction=-1, null=0.1)[3] == 1.0  # the estimate lies above the null
    with pytest.raises(ValueError, match="outside its bounds"):
        betting_cs([0.5, 1.5], 0.0, 1.0)
    assert betting_cs([0.5] * 4, -1, 1)[1:3] == (-math.inf, math.inf) or betting_cs([0.5] * 4, -1, 1)[1] < 0.5


def monitored_miss_betting(y: np.ndarray, mu: float, first: int = 5) -> float:
    """P(the 95% sequence excludes mu at some n in first..N): the capital at mu along each path."""
    lam = betting_bets(y)
    up = np.cumsum(np.log1p(np.minimum(lam, TRUNCATION / mu) * (y - mu)), axis=1)
    down = np.cumsum(np.log1p(-np.minimum(lam, TRUNCATION / (1 - mu)) * (y - mu)), axis=1)
    log_k = np.logaddexp(up, down) - math.log(2)
    return float((log_k[:, first - 1:] >= math.log(20)).any(axis=1).mean())


def monitored_miss_t(x: np.ndarray, mu: float, first: int = 5) -> float:
    n = np.arange(1, x.shape[1] + 1)
    k = t_mixture_multiplier(n, t_mixture_c(), 0.05)
    m = np.cumsum(x, 1) / n
    with np.errstate(invalid="ignore"):
        sd = np.sqrt(np.maximum(np.cumsum(x ** 2, 1) - n * m ** 2, 0) / np.maximum(n - 1, 1))
        return float((np.abs(m - mu) > k * sd / np.sqrt(n))[:, first - 1:].any(axis=1).mean())


def test_coverage_under_continuous_monitoring_on_skewed_bounded_values():
    """Beta(0.3, 3) values (skewness 2.3, mean 0.0909), watched at every n from 5 to 30 (from the first look):
    the betting sequence excludes the mean at some n in at most 5 % of 4,000 paths (+ 3 Monte Carlo SE), and the
    t-mixture sequence, on the same paths, does in more (measured: 23 % against the betting one's 0.4 %)."""
    rng = np.random.default_rng(0)
    reps, a, b = 4000, 0.3, 3.0
    y = rng.beta(a, b, size=(reps, 30))
    mu = a / (a + b)
    se = math.sqrt(0.05 * 0.95 / reps)
    miss_bet, miss_t = monitored_miss_betting(y, mu), monitored_miss_t(y, mu)
    assert miss_bet <= 0.05 + 3 * se
    assert miss_t > 0.05 + 3 * se > miss_bet


def test_betting_cs_narrows_with_n_on_a_paired_difference_scale():
    """Differences of two fractions, in [−1, 1]: 30 values around 0.3 exclude 0; 5 of them do not (the price of
    validity at every n with nothing assumed but the bounds)."""
    rng = np.random.default_rng(1)
    x = np.clip(rng.normal(0.3, 0.1, 30), -1, 1)
    assert betting_cs(x, -1, 1)[1] > 0
    assert betting_cs(x[:5], -1, 1)[1] < 0
    assert betting_cs(x, -1, 1)[2] - betting_cs(x, -1, 1)[1] < betting_cs(x[:10], -1, 1)[2] - betting_cs(x[:10], -1, 1)[1]
