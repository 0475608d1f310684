"""rlhf_lab_research.studies.gao: pooled Gao et al. fits over seeds, their bootstrap, the trend against RM size, and the
report from a runs file (``rlhf-lab-report gao_rm_scaling``)."""

import math

import numpy as np
import pytest

from rlhf_lab_research.stats import percentile_ci
from rlhf_lab_research.studies import gao
from rlhf_lab.analysis.fits import gao_bon, gao_rl
from rlhf_lab.analysis.study_runs import RunData

D = np.array([0.0, 0.3, 0.5, 0.8, 1.1, 1.5, 1.9, 2.4, 2.9, 3.4])


def seeds(alpha, beta, form, n=5, sd=0.02, seed=0):
    rng = np.random.default_rng(seed)
    f = gao_rl if form == "rl" else gao_bon
    return [(D.copy(), f(D, alpha, beta) + rng.normal(0, sd, D.size) * (D > 0)) for _ in range(n)]


def test_pooled_fit_is_one_fit_to_all_points():
    curves = seeds(0.8, 0.5, "rl", sd=0.0)
    f = gao.pooled_fit(curves, "rl")
    assert f.alpha == pytest.approx(0.8) and f.beta == pytest.approx(0.5)
    assert f.n == 5 * 9  # the d = 0 points are not fitted
    # two seeds with different curves: the pooled fit lies between them (least squares on r/d is linear)
    a, b = seeds(0.6, 0.5, "rl", 1, 0.0)[0], seeds(1.0, 0.5, "rl", 1, 0.0)[0]
    assert gao.pooled_fit([a, b], "rl").alpha == pytest.approx(0.8)


def test_bon_form_recovered_with_its_peak():
    f = gao.pooled_fit(seeds(1.2, 0.3, "bon", sd=0.0), "bon")
    assert (f.alpha, f.beta) == (pytest.approx(1.2), pytest.approx(0.3))
    assert f.d_star == pytest.approx(2.0) and f.r_star == pytest.approx(1.2**2 / 1.2)
    assert f.peak_in_data


def test_bootstrap_interval_covers_the_truth_and_narrows_with_less_noise():
    noisy = gao.fit_group(seeds(0.8, 0.5, "rl", sd=0.05), "rl", n_boot=300)
    quiet = gao.fit_group(seeds(0.8, 0.5, "rl", sd=0.005), "rl", n_boot=300)
    lo, hi = noisy.ci("alpha")
    assert lo < 0.8 < hi
    qlo, qhi = quiet.ci("alpha")
    assert qhi - qlo < (hi - lo) / 3
    assert noisy.n_seeds == 5 and len(noisy.boot) == 300


def test_r2_of_seed_means_exceeds_r2_of_all_points_when_seeds_scatter():
    g = gao.fit_group(seeds(0.8, 0.5, "rl", sd=0.1), "rl", n_boot=10)
    assert g.r2_means > g.fit.r2


def test_percentile_ci_keeps_infinite_peaks_and_refuses_mostly_missing():
    lo, hi = percentile_ci([1.0, 2.0, 3.0, math.inf] * 25)
    assert lo == pytest.approx(1.0) and hi == math.inf
    assert all(math.isnan(x) for x in percentile_ci([1.0] + [math.nan] * 9))


def test_trend_finds_a_rising_alpha_and_no_trend_in_beta():
    sizes = [1e4, 1e5, 1e6]
    groups = [gao.fit_group(seeds(0.5 + 0.2 * k, 0.5, "rl", sd=0.01, seed=k), "rl", n_boot=200) for k in range(3)]
    b, lo, hi = gao.trend(sizes, groups, "alpha")
    assert b == pytest.approx(0.2, abs=0.02) and lo > 0
    b, lo, hi = gao.trend(sizes, groups, "beta")
    assert lo < 0 < hi


def test_slope_needs_two_distinct_sizes():
    assert math.isnan(gao.slope([1.0, 1.0], [2.0, 3.0]))
    assert gao.slope([0.0, 1.0, 2.0], [1.0, 3.0, 5.0]) == pytest.approx(2.0)


def run(stage, labeler, size, seed, alpha, beta, params):
    form = "rl" if stage == "ppo" else "bon"
    (d, r), = seeds(alpha, beta, form, 1, 0.01, seed)
    steps = list(range(len(d)))
    hist = {"bon/kl" if stage == "bon" else "eval/kl": [(s, float(x * x)) for s, x in zip(steps, d)],
            "bon/gold_reward" if stage == "bon" else "eval/gold_reward": [(s, float(y)) for s, y in zip(steps, r)],
            "bon/proxy_reward" if stage == "bon" else "eval/proxy_reward": [(s, float(2 * x)) for s, x in
                                                                            zip(steps, d)]}
    tags = {"rlhf_lab.study": gao.RL_STUDY if stage == "ppo" else gao.BON_STUDY}
    return RunData(f"{stage}-{labeler}-{size}-{seed}", stage, "FINISHED", {}, tags, {}, hist,
                   rm={"metrics": {"model/params_total": params}},
                   setting={"labeler": labeler, "rm_size": size}, seed=str(seed))


def test_report_from_a_runs_file_is_byte_identical_and_names_its_trend(tmp_path):
    from rlhf_lab.analysis.snapshot import write_snapshot

    runs = [run(stage, lab, size, s, 0.5 + 0.2 * k, 0.4 - 0.05 * k if stage == "bon" else 0.5, p)
            for stage in ("ppo", "bon") for lab in ("unbiased", "length_biased")
            for k, (size, p) in enumerate((("micro", 9e3), ("tiny", 4e4), ("small", 1.3e5))) for s in range(5)]
    f = tmp_path / "runs.json.gz"
    write_snapshot(f, {gao.RL_STUDY: [r for r in runs if r.stage == "ppo"],
                       gao.BON_STUDY: [r for r in runs if r.stage == "bon"]})
    one = gao.write_gao_report(tmp_path / "a", runs_files=[f], use_store=False, n_boot=100)
    two = gao.write_gao_report(tmp_path / "b", runs_files=[f], use_store=False, n_boot=100)
    text = one.read_text()
    assert text.replace(str(tmp_path / "a"), "") == two.read_text().replace(str(tmp_path / "b"), "")
    assert (one.parent / "gold_vs_sqrt_kl.png").stat().st_size > 0
    assert "## labeler=unbiased" in text and "## labeler=length_biased" in text
    assert text.index("labeler=unbiased") < text.index("labeler=length_biased")
    trend = [line for line in text.splitlines() if line.startswith("| BoN α")]
    assert len(trend) == 2 and all("| rises |" in line for line in trend)
    assert "30 PPO runs (β = 0) and 30 best-of-n runs" in text


def test_a_fit_below_r2_good_says_why_from_the_data():
    """misfit_note fits the form to the rise alone: a rise that follows it and a collapse after the peak faster than
    it allows; a convex rise (quadratic in √KL) that then turns over, which a form whose curvature has one sign cannot
    follow."""
    d = np.array([0.0, 0.3, 0.6, 0.9, 1.2, 1.5, 1.8, 2.1, 2.4, 2.7, 3.0, 3.3, 3.6, 4.0, 4.5, 5.0])
    collapse = np.where(d <= 2.1, gao_rl(d, 0.8, 0.3), gao_rl(2.1, 0.8, 0.3) - 1.5 * (d - 2.1))
    note = gao.misfit_note(gao.fit_group([(d, collapse)] * 5, "rl", n_boot=10))
    assert "the rise alone follows the form (R² 1.00 up to the mean curve's peak at √KL 2.10)" in note, note
    assert "gold falls faster after its peak" in note
    rise = np.where(d <= 3.6, 0.1 * d ** 2, 0.1 * 3.6 ** 2 - 0.5 * (d - 3.6))  # convex, then it turns over
    g = gao.fit_group([(d, rise)] * 5, "rl", n_boot=10)
    note = gao.misfit_note(g)
    assert g.r2_means < gao.R2_GOOD and "rises convexly in √KL" in note and "peak at √KL 3.60" in note, note
    assert "−β/d has one sign for every d" in note
