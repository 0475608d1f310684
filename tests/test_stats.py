"""rlhf_lab.analysis.stats and rlhf_lab_research.stats: hand computations, every verdict branch; and the split-half
drop from the peak (rlhf_lab.analysis.quantities.split_half_drop) on simulated reward-hacking curves (flat: no drop
on average, where max − last of one curve finds one; rise-then-fall: the true drop)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from rlhf_lab.analysis.quantities import split_half_drop
from rlhf_lab.analysis.stats import mean_se, t_ci
from rlhf_lab_research.stats import (DOES_NOT_HOLD, HOLDS, INCONCLUSIVE, Effect, bootstrap_ci, holm, one_sided_p,
                                     paired_ci, paired_differences, t_effect, t_power, units_for_power, verdict)

X4 = [1.0, 2.0, 3.0, 4.0]
SE4 = math.sqrt(5 / 3) / 2  # s² = (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3, se = s / √4
T975_DF3 = 3.182446  # Student t, 97.5% quantile, 3 degrees of freedom (printed tables)


# -- means, standard errors, t intervals ---------------------------------------------------------------------------


def test_mean_se_by_hand():
    m, se, n = mean_se(X4)
    assert (m, n) == (2.5, 4)
    assert se == pytest.approx(0.6454972, abs=1e-7)
    assert se == pytest.approx(SE4, rel=1e-12)


def test_mean_se_drops_nans_and_handles_tiny_samples():
    assert mean_se([1.0, float("nan"), 3.0]) == (2.0, pytest.approx(1.0), 2)  # s = √2, se = √2/√2
    m, se, n = mean_se([5.0])
    assert (m, n) == (5.0, 1) and math.isnan(se)
    m, se, n = mean_se([float("nan")])
    assert n == 0 and math.isnan(m) and math.isnan(se)
    with pytest.raises(ValueError):
        mean_se([[1.0, 2.0], [3.0, 4.0]])


def test_t_ci_by_hand():
    assert st.t.ppf(0.975, 3) == pytest.approx(T975_DF3, abs=1e-6)
    m, lo, hi, n = t_ci(X4)
    half = T975_DF3 * SE4  # 2.054255
    assert (m, n) == (2.5, 4)
    assert lo == pytest.approx(2.5 - half, abs=1e-5) and hi == pytest.approx(2.5 + half, abs=1e-5)
    assert lo == pytest.approx(0.445745, abs=1e-5) and hi == pytest.approx(4.554255, abs=1e-5)
    _, lo90, hi90, _ = t_ci(X4, level=0.90)
    assert lo < lo90 < hi90 < hi


def test_t_ci_needs_two_values():
    for x, mean in (([3.0], 3.0), ([3.0, float("nan")], 3.0)):
        m, lo, hi, n = t_ci(x)
        assert (m, n) == (mean, 1) and math.isnan(lo) and math.isnan(hi)
    m, lo, hi, n = t_ci([])
    assert n == 0 and all(math.isnan(v) for v in (m, lo, hi))
    with pytest.raises(ValueError):
        t_ci(X4, level=95)


# -- paired differences ------------------------------------------------------------------------------------------


def test_paired_differences_keeps_only_shared_seeds():
    a = {0: 1.0, 1: 2.0, 2: 3.0, 5: 4.0, 7: 1.0}
    b = {7: 0.0, 1: 1.5, 2: 2.0, 3: 9.0, 5: float("nan")}  # seed 0 only in a, 3 only in b, 5 crashed in b
    d, seeds = paired_differences(a, b)
    assert seeds == [1, 2, 7]
    np.testing.assert_allclose(d, [0.5, 1.0, 1.0])


def test_paired_differences_aligned_arrays():
    d, seeds = paired_differences([1.0, 2.0, float("nan"), 4.0], np.array([0.5, 2.5, 1.0, 1.0]))
    assert seeds == [0, 1, 3]
    np.testing.assert_allclose(d, [0.5, -0.5, 3.0])
    with pytest.raises(ValueError):
        paired_differences([1.0, 2.0], [1.0])
    with pytest.raises(TypeError):
        paired_differences({0: 1.0}, [1.0])


def test_paired_ci_is_t_ci_of_the_differences():
    a = {s: v + 10 for s, v in enumerate(X4)}
    b = {s: 10.0 for s in range(6)}  # seeds 4 and 5 only in b
    e = paired_ci(a, b)
    assert isinstance(e, Effect) and e.method == "paired t" and e.n == 4 and e.estimate == pytest.approx(2.5)
    assert (e.lo, e.hi) == (pytest.approx(2.5 - T975_DF3 * SE4, abs=1e-5), pytest.approx(2.5 + T975_DF3 * SE4, abs=1e-5))
    assert e.verdict(+1) == HOLDS and e.verdict(-1) == DOES_NOT_HOLD
    # pairing removes the seed effect that an unpaired comparison would carry
    seed_effect = np.array([0.0, 5.0, -3.0, 8.0, 1.0])
    e = paired_ci(seed_effect + 0.1 + np.array([0.01, -0.01, 0.02, 0.0, -0.02]), seed_effect)
    assert e.lo > 0


# -- bootstrap ------------------------------------------------------------------------------------------------------


def test_bootstrap_is_deterministic_for_a_seed():
    x = np.random.default_rng(3).normal(size=25)
    assert bootstrap_ci(x, seed=7) == bootstrap_ci(x.copy(), seed=7)
    assert bootstrap_ci(x, seed=7) != bootstrap_ci(x, seed=8)
    # a stat without an `axis` argument takes the per-resample path and gives the same numbers
    assert bootstrap_ci(x, n_boot=500, stat=np.median) == bootstrap_ci(x, n_boot=500, stat=lambda v: np.median(v))


def test_bootstrap_ci_contains_the_mean_and_shrinks_with_n():
    rng = np.random.default_rng(11)
    widths = []
    for n in (20, 80, 320):
        x = rng.normal(1.0, 2.0, size=n)
        est, lo, hi, k = bootstrap_ci(x, n_boot=4000)
        assert k == n and est == pytest.approx(x.mean()) and lo < x.mean() < hi
        _, tlo, thi, _ = t_ci(x)
        assert (hi - lo) == pytest.approx(thi - tlo, rel=0.15)  # same scale as the t interval
        widths.append(hi - lo)
    assert widths[1] < 0.7 * widths[0] and widths[2] < 0.7 * widths[1]  # ≈ halves per 4× n
    est, lo, hi, n = bootstrap_ci([2.0, float("nan")])
    assert (est, n) == (2.0, 1) and math.isnan(lo) and math.isnan(hi)


# -- verdicts -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lo, hi, direction, margin, expected", [
    (0.1, 0.5, +1, None, HOLDS),                   # excludes 0, claimed side (+)
    (-0.5, -0.1, -1, None, HOLDS),                 # excludes 0, claimed side (−)
    (-0.5, -0.1, +1, None, DOES_NOT_HOLD),         # excludes 0, the other way
    (0.1, 0.5, -1, None, DOES_NOT_HOLD),
    (-0.02, 0.03, +1, 0.05, DOES_NOT_HOLD),        # inside the equivalence margin: negligible effect
    (-0.02, 0.03, -1, 0.05, DOES_NOT_HOLD),
    (-0.02, 0.08, +1, 0.05, INCONCLUSIVE),         # straddles 0, pokes out of the margin
    (-0.2, 0.3, +1, None, INCONCLUSIVE),           # straddles 0, no margin
    (0.0, 0.3, +1, None, INCONCLUSIVE),            # touching 0 is not excluding it
    (float("nan"), float("nan"), +1, None, INCONCLUSIVE),
    (float("nan"), 0.5, +1, 1.0, INCONCLUSIVE),
    (0.01, 0.04, +1, 0.05, DOES_NOT_HOLD),         # inside the margin: negligible, though it excludes 0
    (0.01, 0.08, +1, 0.05, HOLDS),                 # excludes 0 and reaches past the margin
])
def test_verdict_branches(lo, hi, direction, margin, expected):
    assert verdict(lo, hi, direction, margin) == expected


def test_verdict_rejects_bad_arguments_and_works_on_effects():
    with pytest.raises(ValueError):
        verdict(0.1, 0.2, 0)
    with pytest.raises(ValueError):
        verdict(0.3, 0.2, 1)
    with pytest.raises(ValueError):
        verdict(0.1, 0.2, 1, margin=-0.1)
    assert Effect(0.2, 0.1, 0.3, 5, "t").verdict(+1) == HOLDS
    assert Effect(float("nan"), float("nan"), float("nan"), 1, "t").verdict(+1) == INCONCLUSIVE


# -- drop from peak: hand examples ------------------------------------------------------------------------------------


def test_split_half_drop_by_hand():
    # peak on A at step 1, read on B: 0.9 − 0.4 = 0.5; peak on B at step 1, read on A: 1.0 − 0.5 = 0.5
    assert split_half_drop([0.0, 1.0, 0.5], [0.2, 0.9, 0.4]) == pytest.approx(0.5)
    # the halves disagree on the peak: A peaks at 2 (the last: 0), B at 0, read on A: 0.0 − 0.3 = −0.3
    assert split_half_drop([0.0, 0.1, 0.3], [0.5, 0.1, 0.2]) == pytest.approx(-0.15)
    assert split_half_drop([0.0, 0.1, 0.3], [0.1, 0.2, 0.4]) == 0.0  # both rise to the end: no drop
    for a, b in (([0.0, 1.0], [0.0]), ([0.0, float("nan")], [0.0, 1.0]), ([], [])):
        with pytest.raises(ValueError):
            split_half_drop(a, b)


# -- drop from peak: simulated curves ---------------------------------------------------------------------------------

RUNS, STEPS, SE = 2000, 11, 0.03  # 2000 simulated runs, 11 evaluations, per-point SE 0.03 on each half


def _gold(kind: str) -> np.ndarray:
    t = np.linspace(0.0, 1.0, STEPS)
    if kind == "flat":
        return np.full(STEPS, 0.5)
    # rises by 0.4 to a peak at 60% of training, then falls by 0.3 by the end
    return 0.5 + np.where(t <= 0.6, 0.4 * t / 0.6, 0.4 - 0.3 * (t - 0.6) / 0.4)


def _halves(kind: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    g = _gold(kind)
    return g + rng.normal(0, SE, (RUNS, STEPS)), g + rng.normal(0, SE, (RUNS, STEPS))


def test_split_half_finds_no_drop_on_flat_curves_where_max_minus_last_does():
    a, b = _halves("flat", seed=0)
    drops = np.array([split_half_drop(x, y) for x, y in zip(a, b)])
    assert abs(drops.mean()) < 3 * drops.std() / math.sqrt(RUNS)  # unbiased: no drop on average
    full = (a + b) / 2  # the curve on all prompts: per-point SE 0.03/√2
    old = full.max(axis=1) - full[:, -1]  # max − last of one noisy curve, which the split-half replaces
    assert old.mean() > 1.2 * SE / math.sqrt(2)  # biased upward by ≈ E[max of 11 normals] ≈ 1.59 σ


def test_split_half_measures_the_drop_of_a_rise_then_fall():
    a, b = _halves("rise_fall", seed=1)
    drops = np.array([split_half_drop(x, y) for x, y in zip(a, b)])
    assert drops.mean() == pytest.approx(0.3, abs=0.02)  # true drop from the peak (step 6) to the end is 0.3


# -- one-sided p-values, Holm's correction, power --------------------------------------------------------------------


def test_one_sided_p_by_hand_and_against_scipys_t_test():
    # X4: mean 2.5, se = √(5/3)/2 ≈ 0.645497, t = 3.872983 on 3 df; P(T₃ ≥ 3.873) = 0.015233
    e = t_effect(X4)
    assert e.se == pytest.approx(SE4, rel=1e-9) and e.sd == pytest.approx(math.sqrt(5 / 3), rel=1e-9)
    assert e.p_value(+1) == pytest.approx(0.015233, abs=1e-6)
    assert e.p_value(+1) == pytest.approx(st.ttest_1samp(X4, 0, alternative="greater").pvalue, rel=1e-9)
    assert e.p_value(-1) == pytest.approx(1 - e.p_value(+1), rel=1e-12)
    # against a shifted null (non-inferiority at margin 1: H0 mean ≤ −1): t = 3.5 / se
    assert e.p_value(+1, null=-1.0) == pytest.approx(st.t.sf(3.5 / SE4, 3), rel=1e-9)
    assert one_sided_p(1.0, 0.0, 4, +1) == 0.0 and one_sided_p(-1.0, 0.0, 4, +1) == 1.0
    assert math.isnan(one_sided_p(1.0, math.nan, 4, +1)) and math.isnan(t_effect([1.0]).p_value(+1))
    assert one_sided_p(1.96, 1.0, math.inf, +1) == pytest.approx(0.025, abs=1e-4)


@pytest.mark.parametrize("x", [[0.1, 0.5, 0.2, 0.4, 0.3], [0.01, 0.3, -0.1, 0.5, 0.2], [-0.3, -0.1, -0.2, 0.05]])
def test_p_below_2_5_percent_exactly_when_the_95_interval_excludes_0(x):
    e = t_effect(x)
    assert (e.p_value(+1) < 0.025) == (e.lo > 0)
    assert (e.p_value(-1) < 0.025) == (e.hi < 0)
    # at the boundary: a sample whose lower bound is 0 has p = 0.025 exactly
    shifted = t_effect(np.asarray(x) - e.lo)
    assert shifted.lo == pytest.approx(0, abs=1e-12) and shifted.p_value(+1) == pytest.approx(0.025, abs=1e-9)


def test_holm_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 (m = 4): 4·0.005 = 0.02, 3·0.01 = 0.03, 2·0.03 = 0.06, max(0.06, 1·0.04) = 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    out = holm([0.01, math.nan, 0.5])  # NaN is not in the family: m = 2
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1]) and out[2] == pytest.approx(0.5)
    assert holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])  # capped at 1 (2·0.6), then monotone
    assert holm([]) == [] and holm([0.3]) == pytest.approx([0.3])
    with pytest.raises(ValueError):
        holm([1.2])


def test_an_effect_with_p_0_009_holds_alone_but_not_after_holm_among_30():
    alone = holm([0.009])[0]
    among = holm([0.009] + [0.5] * 29)[0]
    assert alone < 0.025 and among == pytest.approx(0.27) and among >= 0.025
    # a very small p survives the family: 30 · 0.0001 = 0.003
    assert holm([0.0001] + [0.5] * 29)[0] == pytest.approx(0.003)


def test_power_by_hand_with_the_noncentral_t():
    # n = 10, δ/sd = 1, α = 0.025: P(T'(9, ncp √10) > t_{0.975, 9} = 2.262157) = 0.8031 (noncentral t)
    assert t_power(10, 1.0, 1.0, 0.025) == pytest.approx(st.nct.sf(2.2621572, 9, math.sqrt(10)), abs=1e-6)
    assert t_power(10, 1.0, 1.0, 0.025) == pytest.approx(0.8031, abs=5e-4)
    assert t_power(9, 1.0, 1.0, 0.025) < 0.8  # 0.7569
    assert units_for_power(1.0, 1.0) == 10  # the textbook one-sample answer for d = 1, one-sided 2.5 %, 80 %
    # d = 0.5: the normal approximation ((1.960 + 0.842) / 0.5)² = 31.4 is a little short: the t test needs 34
    assert units_for_power(0.5, 1.0) == 34
    assert t_power(34, 0.5, 1.0, 0.025) >= 0.8 > t_power(33, 0.5, 1.0, 0.025)
    # a stricter level needs more units; scale-free in δ/sd
    assert units_for_power(1.0, 1.0, alpha=0.025 / 30) > 10
    assert units_for_power(0.2, 0.4) == units_for_power(1.0, 2.0) == units_for_power(0.5, 1.0)
    assert units_for_power(0.0, 1.0) is None and units_for_power(1e-6, 1.0, n_max=100) is None


def test_power_against_simulation():
    rng = np.random.default_rng(0)
    n = units_for_power(0.8, 1.0)
    x = rng.normal(0.8, 1.0, size=(20_000, n))
    t = x.mean(1) / (x.std(1, ddof=1) / math.sqrt(n))
    assert (t > st.t.ppf(0.975, n - 1)).mean() == pytest.approx(t_power(n, 0.8, 1.0, 0.025), abs=0.01)
