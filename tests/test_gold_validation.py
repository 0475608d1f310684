"""The gold-RM validation report (rlhf_lab_research/studies/gold_validation.py) on synthetic runs built in memory: the
formula/gold-RM views of a run, Spearman ρ per run, its Fisher-z mean and the pooled bootstrap, the mean ± se
curves, and C1/C4 judged by the registry with each measure as the gold (agreeing when the gold RM is a monotone
image of the formula, disagreeing when it misses the hacking)."""

from __future__ import annotations

import math
from itertools import count

import numpy as np
import pytest

from rlhf_lab_research.studies import gold_validation as V
from rlhf_lab.analysis.study_runs import RunData
from rlhf_lab_research.stats import HOLDS

STEPS = 9
T = np.linspace(0.0, 1.0, STEPS)
_ids = count()


def rise_fall(drop: float = 0.5) -> np.ndarray:
    return np.where(T <= 0.6, 0.4 * T / 0.6, 0.4 - drop * (T - 0.6) / 0.4)


def run(seed: int, kl: dict, formula: np.ndarray, rm: np.ndarray, rng: np.random.Generator, sd: float = 0.02,
        test: tuple[float, float] | None = None) -> RunData:
    """A PPO run as load_study builds it: both golds with their halves (independent noise per half), the proxy
    rising, histories at steps 0, 10, …; `test`: (formula, gold RM) test-split finals."""
    curves = {"eval/proxy_reward": 1.5 * T + rng.normal(0, 0.05, STEPS), "eval/kl": 40 * T ** 1.5}
    for name, g in (("gold_reward", rm), ("formula_gold_reward", formula)):
        a, b = g + rng.normal(0, sd, STEPS), g + rng.normal(0, sd, STEPS)
        curves.update({f"eval/{name}": (a + b) / 2, f"eval/{name}_a": a, f"eval/{name}_b": b})
    history = {k: [(10 * i, float(v)) for i, v in enumerate(vals)] for k, vals in curves.items()}
    metrics = {k: s[-1][1] for k, s in history.items()}
    if test:
        metrics.update({"test/formula_gold_reward": test[0], "test/gold_reward": test[1]})
    params = {k: str(v) for k, v in kl.items()} | {"sweep.seed": str(seed)}
    return RunData(f"run{next(_ids)}", "ppo", "FINISHED", params, {}, metrics, history, {}, dict(kl), str(seed))


BETA0, BETA01, ADAPTIVE = {"kl.name": "fixed", "kl.beta": 0.0}, {"kl.name": "fixed", "kl.beta": 0.1}, {
    "kl.name": "adaptive", "kl.beta": 0.05}


def test_as_measure_puts_the_formula_under_the_gold_names_and_never_mixes_them():
    rng = np.random.default_rng(0)
    r = run(0, BETA0, rise_fall(), 3 * rise_fall() + 1, rng, test=(0.1, 0.9))
    f, g = V.as_measure(r, "formula"), V.as_measure(r, "rm")
    assert f.series("eval/gold_reward_a") == r.series("eval/formula_gold_reward_a")
    assert f.metrics["test/gold_reward"] == 0.1 and g.metrics["test/gold_reward"] == 0.9
    assert not [k for k in {**f.metrics, **g.metrics, **f.history, **g.history} if "formula" in k]
    assert f.series("eval/proxy_reward") == g.series("eval/proxy_reward") == r.series("eval/proxy_reward")
    no_formula = run(1, BETA0, rise_fall(), rise_fall(), rng)
    for k in [k for k in no_formula.history if "formula" in k]:
        del no_formula.history[k], no_formula.metrics[k]
    assert math.isnan(V.as_measure(no_formula, "formula").last("eval/gold_reward"))  # missing, never the RM's
    with pytest.raises(ValueError, match="measure"):
        V.as_measure(r, "gold")
    assert V.formula_name("eval/gold_reward_ood") == "eval/formula_gold_reward_ood"
    assert V.formula_name("objective/gold") == "objective/formula_gold" and V.formula_name("eval/kl") == "eval/kl"


def test_spearman_per_run_fisher_mean_and_pooled_bootstrap():
    rng = np.random.default_rng(1)
    f = rise_fall()
    same = [run(s, BETA0, f, np.exp(2 * f) - 3, rng, sd=0.0) for s in range(3)]  # a monotone image: ρ = 1
    assert all(V.run_rho(r) == pytest.approx(1.0) for r in same)
    flipped = run(9, BETA0, f, -f, rng, sd=0.0)
    assert V.run_rho(flipped) == pytest.approx(-1.0)
    ag = V.rank_agreement(same, n_boot=200)
    assert ag.n_points == 3 * STEPS and ag.pooled.estimate == pytest.approx(1.0)
    assert ag.pooled.lo == pytest.approx(1.0) and ag.pooled.hi == pytest.approx(1.0)
    # Fisher z by hand: mean of atanh, t interval, back with tanh
    rhos = [0.2, 0.6, 0.8]
    z = np.arctanh(rhos)
    h = 4.302652729911275 * z.std(ddof=1) / math.sqrt(3)  # t_{0.975, 2}
    e = V.fisher_mean(rhos)
    assert (e.estimate, e.lo, e.hi, e.n) == pytest.approx((math.tanh(z.mean()), math.tanh(z.mean() - h),
                                                          math.tanh(z.mean() + h), 3))
    # unrelated golds: the pooled interval covers 0
    noise = [run(s, BETA0, f, rng.normal(0, 1, STEPS), rng, sd=0.0) for s in range(8)]
    agn = V.rank_agreement(noise, n_boot=300)
    assert agn.pooled.lo < 0 < agn.pooled.hi and abs(agn.pooled.estimate) < 0.4


def test_curves_are_mean_and_se_over_seeds_per_arm():
    rng = np.random.default_rng(2)
    runs = [run(s, BETA0, rise_fall() + 0.1 * s, rise_fall(), rng, sd=0.0) for s in range(3)]
    runs += [run(s, ADAPTIVE, 0.2 * T, 0.2 * T, rng, sd=0.0) for s in range(2)]
    curves = V.arm_curves(runs)
    assert set(curves) == {"fixed β = 0", "adaptive KL"}
    step, mean, se, n = curves["fixed β = 0"]["formula"][-1]
    last = rise_fall()[-1]
    assert (step, n) == (80, 3) and mean == pytest.approx(last + 0.1)
    assert se == pytest.approx(np.std([last, last + 0.1, last + 0.2], ddof=1) / math.sqrt(3))


def grid(rm_of, rng) -> list[RunData]:
    """3 seeds of β = 0 (gold rises then falls by 0.5) and β = 0.1 (gold rises and stays), the gold RM = rm_of(formula,
    β); test-split finals of both measures."""
    out = []
    for s in range(3):
        for kl, f in ((BETA0, rise_fall()), (BETA01, 0.4 * T)):
            g = rm_of(f, kl)
            out.append(run(s, kl, f, g, rng, test=(float(f[-1]) + rng.normal(0, 0.01), float(g[-1]) + rng.normal(0, 0.01))))
    return out


def test_c1_and_c4_agree_when_the_gold_rm_is_a_monotone_image_of_the_formula():
    rng = np.random.default_rng(3)
    res = V.verdicts(grid(lambda f, kl: 2.0 * f - 0.3, rng))
    for cid in ("C1", "C4"):
        agree, rows = V.agreement_of(res[cid])
        assert agree, (cid, res[cid]["formula"].reason, res[cid]["rm"].reason)
        assert all(a for *_, a in rows)
    assert res["C1"]["formula"].verdict == res["C1"]["rm"].verdict == HOLDS
    small = {p.part.says: p for p in res["C4"]["rm"].parts}["β too small hacks"]
    assert small.verdict == HOLDS  # final gold: β = 0.1 − β = 0 > 0 with both measures
    assert res["C4"]["formula"].verdict == res["C4"]["rm"].verdict  # the other parts have no runs: inconclusive


def test_c1_disagrees_when_the_gold_rm_misses_the_hacking():
    rng = np.random.default_rng(4)
    res = V.verdicts(grid(lambda f, kl: 0.5 * T if kl is BETA0 else 0.4 * T, rng))  # the RM keeps rising at β = 0
    assert res["C1"]["formula"].verdict == HOLDS
    assert res["C1"]["rm"].verdict != HOLDS
    agree, rows = V.agreement_of(res["C1"])
    parts = {says: (vf, vg, a) for says, vf, vg, a in rows}
    assert not agree and parts["the proxy reward rises"][2] and not parts["gold falls from its peak"][2]


def test_report_on_synthetic_runs_and_not_run_yet(tmp_path):
    rng = np.random.default_rng(5)
    runs = grid(lambda f, kl: 2.0 * f - 0.3, rng) + [run(s, ADAPTIVE, 0.3 * T, 0.6 * T, rng) for s in range(3)]
    path = V.write_report(runs, [], tmp_path / "r")
    text = path.read_text()
    for want in ("## Rank agreement of the two golds", "mean of the per-run ρ", "pooled over all evaluation points",
                 "## Hacking curves, both measures", "adaptive KL", "### C1:", "### C4:", "| C1 |",
                 "rlhf-lab -m sweep=gold_rm_validation"):
        assert want in text, want
    assert (tmp_path / "r" / "hacking_curves.png").stat().st_size > 0
    assert (tmp_path / "r" / "formula_vs_gold_rm.png").stat().st_size > 0
    empty = V.write_report([], [], tmp_path / "e").read_text()
    assert "Not run yet" in empty


def test_rho_by_setting_separates_where_the_golds_part(tmp_path):
    """The gold RM agrees with the formula at β = 0.1 but keeps rising while the formula falls at β = 0: the
    per-setting ρ shows it (about 1 at β = 0.1, near 0 at β = 0), where the pooled ρ mixes the two."""
    rng = np.random.default_rng(6)
    runs = grid(lambda f, kl: 0.5 * T if kl is BETA0 else 2.0 * f, rng)
    by = {name: e for name, e in V.rho_by_setting(runs).items()}
    beta0 = [e for name, e in by.items() if "kl.beta=0.0" in name]
    rest = [e for name, e in by.items() if "kl.beta=0.0" not in name]
    assert len(beta0) == 1 and abs(beta0[0].estimate) < 0.5 and beta0[0].n == 3
    assert rest and all(e.estimate > 0.9 for e in rest)
    assert "By setting" in V.write_report(runs, [], tmp_path / "r").read_text()


def test_report_from_its_runs_file_alone_is_the_report_of_its_runs(tmp_path, capsys):
    """The evidence travels with the report: the runs kept in a runs file (the format a store-read report writes
    beside itself) give the same report, from the command line with --no-store, as the runs themselves."""
    from rlhf_lab.entry import report as cli
    from rlhf_lab.analysis import snapshot

    rng = np.random.default_rng(7)
    runs = grid(lambda f, kl: 2.0 * f - 0.3, rng)
    for r in runs:
        r.tags["rlhf_lab.study"] = V.STUDY
    cmd = "rlhf-lab -m sweep=gold_rm_validation hydra/launcher=parallel hydra.launcher.n_jobs=2"
    f = snapshot.write_snapshot(tmp_path / "runs.json.gz", {V.STUDY: runs}, {V.STUDY: [cmd]})
    direct = V.write_report(runs, [cmd], tmp_path / "direct").read_text().split("\n")
    assert cli.main([V.STUDY, "--no-store", "--runs", str(f), "--out", str(tmp_path / "o")]) == 0
    again = (tmp_path / "o" / V.STUDY / "README.md").read_text().split("\n")
    assert again[:-2] == direct[:-2] and cmd in again
    assert f"Runs read from `{f}`; generated by `rlhf-lab-report {V.STUDY} --no-store --runs {f}`" in again[-2]
    assert cli.main([V.STUDY, "--no-store", "--runs", str(tmp_path / "none.json.gz"), "--out", str(tmp_path / "n")]) != 0


def test_the_report_says_whether_beta0_clears_the_bar_stated_before_the_runs(tmp_path):
    """The primary effect, ρ at β = 0 per run (Fisher-z mean over ≥ 5 runs), against the bar: a gold RM that is a
    monotone image of the formula meets it; one that keeps rising while the formula falls at β = 0 does not."""
    rng = np.random.default_rng(8)
    good = [run(s, BETA0, rise_fall(), 2.0 * rise_fall() - 0.3, rng) for s in range(5)]
    assert V.meets_bar(V.fisher_mean([V.run_rho(r) for r in good]))
    assert "**meets the bar**" in V.write_report(good, [], tmp_path / "g").read_text()
    bad = [run(s, BETA0, rise_fall(), 0.5 * T, rng) for s in range(5)]
    text = V.write_report(bad, [], tmp_path / "b").read_text()
    assert "**does not meet the bar**" in text and "at β = 0 the mean per-run ρ" in text
    assert not V.meets_bar(V.fisher_mean([V.run_rho(r) for r in good[:4]]))  # fewer than 5 runs: never


def test_seeds_added_after_looking_get_the_anytime_valid_interval(tmp_path):
    """Seeds beyond the study file's (0-4) were added after its report was seen: every mean ρ whose runs include one
    is judged with the anytime-valid interval of the same z values (wider than the t interval), marked †."""
    from rlhf_lab_research.anytime import EARLIER_FOOTNOTE as FOOTNOTE, is_anytime  # its runs' rule (issue 42)

    rng = np.random.default_rng(9)
    runs = [run(s, BETA0, rise_fall(), 2.0 * rise_fall() + rng.normal(0, 0.1, STEPS), rng, sd=0.05)
            for s in range(10)]
    for r in runs:
        r.tags["rlhf_lab.study"] = V.STUDY
    late = V.added_run_ids({V.STUDY: runs})
    assert late == {r.run_id for r in runs[5:]}
    seq, fixed = V.rho_mean(runs, late), V.rho_mean(runs)
    assert is_anytime(seq) and not is_anytime(fixed) and seq.lo < fixed.lo and seq.estimate == fixed.estimate
    assert not is_anytime(V.rho_mean(runs[:5], late))  # the file's own seeds alone: the fixed-n interval
    assert V.rank_agreement(runs, n_boot=20, late=late).mean == seq  # the same rule for the agreement's mean
    text = V.write_report(runs, [], tmp_path / "r").read_text()
    assert FOOTNOTE in text and "seeds 5, 6, 7, 8, 9" in text and "†" in text.split("The primary effect")[1][:80]
