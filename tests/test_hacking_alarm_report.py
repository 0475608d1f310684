"""The hacking alarm's fit and its validation report (rlhf_lab_research/studies/alarm_fit.py, hacking_alarm.py;
issue 44)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from rlhf_lab_research.studies import alarm_fit as F
from rlhf_lab_research.studies import hacking_alarm as H
from rlhf_lab.evaluation.alarm import FEATURES, RULE, Evaluation, features, score, scores

ROOT = Path(__file__).resolve().parents[1]


def test_the_logistic_fit_recovers_known_weights():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(20_000, 3))
    bias, w = -0.5, np.array([1.5, -2.0, 0.0])
    y = rng.random(len(z)) < F.sigmoid(bias + z @ w)
    b_hat, w_hat = F.fit_logistic(z, y)
    assert b_hat == pytest.approx(bias, abs=0.08)
    assert w_hat == pytest.approx(w, abs=0.08)


def test_auc_against_a_hand_computation():
    # pairs (positive, negative): (0.35, 0.1) right, (0.35, 0.4) wrong, (0.8, 0.1) right, (0.8, 0.4) right: 3/4
    assert F.auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert F.auc([0.5, 0.5], [0, 1]) == pytest.approx(0.5)  # a tie counts half
    assert F.auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1], [1, 0, 1, 1]) == pytest.approx(1.0)  # 0.4 weighted out
    assert math.isnan(F.auc([0.1, 0.2], [1, 1]))
    # the bootstrap ranks once and reweights (F.ranked_auc): against every weighted pair counted by brute force, with
    # ties, zero weights, a top score that is a negative, and no rows at all
    rng = np.random.default_rng(0)
    s, y = np.round(rng.normal(size=200), 1), rng.random(200) < 0.3
    s[np.argmax(s)], y[np.argmax(s)] = 9.0, False
    w = rng.integers(0, 3, 200).astype(float)
    pw = np.outer(w[y], w[~y])
    diff = s[y][:, None] - s[~y][None, :]
    brute = ((diff > 0) * pw + 0.5 * (diff == 0) * pw).sum() / pw.sum()
    assert F.ranked_auc(F.ranks(s), y, w) == pytest.approx(brute, rel=1e-12) and 0.3 < brute < 0.7
    assert math.isnan(F.ranked_auc(F.ranks(np.zeros(0)), np.zeros(0, dtype=bool)))


def test_youden_threshold_and_proxy_intervals():
    y = np.array([0, 0, 1, 1], dtype=bool)
    assert F.youden_threshold(np.array([0.1, 0.2, 0.35, 0.8]), y) == 0.35  # J = 1 − 0
    assert F.youden_threshold(np.array([0.1, 0.4, 0.35, 0.8]), y) == 0.8  # J = ½ at 0.8 and at 0.35: the higher
    assert F.interval_means([(1, 1.0), (2, 3.0), (3, 5.0), (5, 7.0)], [0, 2, 4, 6]) == [
        pytest.approx(x) for x in (1.0, 2.0, 5.0, 7.0)]  # p_0: the first step's (the start policy's batch)


def test_row_scores_are_the_alarms_scores():
    x = np.array([[1.0, 0.0, 0.1, 1.2, 0.3, 0.05], [3.0, 0.05, 0.4, 2.0, 1.1, -0.2]])
    got = F.row_scores(x, RULE)
    want = [score(dict(zip(FEATURES, row)), RULE) for row in x]
    assert got == pytest.approx(want)


def test_stopping_keeps_the_evaluation_before_the_first_alarm():
    evals = [Evaluation(0, 0.0, 1.0, 10.0), Evaluation(10, 1.0, 0.9, 10.0, 1.0),
             Evaluation(20, 16.0, 0.5, 30.0, 1.2), Evaluation(30, 25.0, 0.2, 40.0, 1.1)]
    c = F.Case("s", "r", 0, "ppo", "unbiased", evals, np.zeros((3, 6)), np.array([False, True, True]),
               np.array([0.0, 1.0, 0.5, 0.2]), 1)
    rule = F.Rule((0.0,) * 6, (1.0,) * 6, (1.0,) + (0.0,) * 5, -3.5, 0.5)  # raised once √KL reaches 3.5: at step 20
    o = F.outcome(c, rule)
    assert o.alarm == 2 and o.lead == 10.0 and o.raised.tolist() == [False, True, True]
    assert o.kept_vs_peak == 0.0 and o.kept_vs_last == pytest.approx(0.8)


def test_the_committed_rule_is_the_fit_on_the_committed_runs_files():
    runs = F.read_runs([ROOT / f for f in F.RUNS_FILES])
    cases = [F.case_of(s, r) for s, r in runs if F.exclusion(r) is None]
    assert len({c.study for c in cases}) >= 10
    assert F.fit_rules([c for c in cases if F.frozen(c)])["rule"] == RULE  # runs added later do not refit it


def test_runs_started_after_the_freeze_are_judged_apart_by_the_frozen_rule():
    n = 6
    evals = [Evaluation(10 * i, float(i * i), 2.0 - 0.3 * i, 10.0 + 3 * i, 0.1 * i) for i in range(n)]
    x = np.asarray([[features(evals[: j + 1])[f] for f in FEATURES] for j in range(1, n)])
    late = [F.Case("new", f"r{k}", F.FROZEN_AT_MS + 1, "ppo", "unbiased", evals, x, np.arange(1, n) > 1 + k,
                   np.zeros(n), 1 + k) for k in range(3)]
    assert not any(F.frozen(c) for c in late) and F.frozen(late[0].__class__(**{**vars(late[0]), "start_time": 0}))
    rules = {m: RULE for m in F.METHODS}
    text = "\n".join(H.prospective(late, rules, "then", 50))
    assert "3 runs started after then UTC (new (3))" in text and "| rule |" in text
    assert "None yet" in "\n".join(H.prospective([], rules, "then", 50))


def test_kl_regime_from_the_runs_params():
    from rlhf_lab.analysis.study_runs import RunData

    def run(**params):
        return RunData("r", "ppo", "FINISHED", {k.replace("_", "."): v for k, v in params.items()}, {}, {})
    assert F.kl_regime(run(kl_name="adaptive", kl_beta="0.1")) == "adaptive KL"
    assert F.kl_regime(run(kl_name="adaptive", kl_beta="0.0")) == "adaptive KL"  # the controller moves β
    assert F.kl_regime(run(kl_name="fixed", kl_beta="0.03")) == "fixed β > 0"
    assert F.kl_regime(run(kl_name="fixed", kl_beta="0.0")) == "β = 0"
    assert F.kl_regime(run()) == "?"


def late_cases(n_cases: int, study: str = "new", job=lambda k: None) -> list:
    n = 6
    evals = [Evaluation(10 * i, float(i * i), 2.0 - 0.3 * i, 10.0 + 3 * i, 0.1 * i) for i in range(n)]
    x = np.asarray([[features(evals[: j + 1])[f] for f in FEATURES] for j in range(1, n)])
    return [F.Case(study, f"{study}{k}", F.FROZEN_AT_MS + 1, "ppo", "unbiased", evals, x, np.arange(1, n) > 1 + k,
                   np.zeros(n), 1 + k, job(k)) for k in range(n_cases)]


def test_a_later_rerun_of_a_fitted_job_is_not_prospective_evidence():
    job = lambda k: ("old", "ppo", (("seed", str(k)),))  # noqa: E731
    fitted = [dataclasses.replace(c, start_time=0) for c in late_cases(2, "old", job)]  # seeds 0, 1
    later = late_cases(3, "old", job) + late_cases(2, "new")  # seeds 0-2 of "old" again; "new" untagged
    new, reruns = F.split_new(later, fitted)
    assert [c.run_id for c in reruns] == ["old0", "old1"] and [c.run_id for c in new] == ["old2", "new0", "new1"]
    rules = {m: RULE for m in F.METHODS}
    text = "\n".join(H.prospective(new, rules, "then", 50, reruns))
    assert "3 runs started after then UTC (new (2), old (1))" in text
    assert "2 runs started later rerun a job the rule was fitted on" in text and "left out (old (2))" in text
    text = "\n".join(H.prospective([], rules, "then", 50, reruns))
    assert "None yet" in text and "2 runs started later rerun a job" in text


def test_within_study_auc_compares_only_pairs_of_the_same_study():
    cases = late_cases(4)
    cases = [dataclasses.replace(c, study=f"s{k // 2}") for k, c in enumerate(cases)]
    # study s0 ranks its evaluations right, s1 wrong; s1's scores all sit above s0's
    outs = []
    for k, c in enumerate(cases):
        s = np.where(c.labels, 0.2, 0.1) if k < 2 else np.where(c.labels, 0.8, 0.9)
        outs.append(F.Outcome(s, s > 0, s > 0, None, math.nan, 0.0, 0.0))
    w = np.ones(4)
    p0, n0 = sum(int(c.labels.sum()) for c in cases[:2]), sum(int((~c.labels).sum()) for c in cases[:2])
    p1, n1 = sum(int(c.labels.sum()) for c in cases[2:]), sum(int((~c.labels).sum()) for c in cases[2:])
    assert F.within_auc_stat(cases, outs)(w) == pytest.approx(p0 * n0 / (p0 * n0 + p1 * n1))
    assert F.within_auc_stat(cases, outs)(np.array([1.0, 1.0, 0.0, 0.0])) == 1.0  # s1 resampled away
    assert F.auc_stat(cases, outs)(w) != pytest.approx(F.within_auc_stat(cases, outs)(w))  # cross pairs differ


def test_the_headline_says_where_the_rule_does_not_beat_the_plateau():
    aucs = {"rule": (0.85, 0.8, 0.9), "KL threshold": (0.6, 0.5, 0.7), "proxy plateau": (0.7, 0.65, 0.75)}
    diffs = {"KL threshold": (0.25, 0.2, 0.3), "proxy plateau": (0.15, 0.1, 0.2)}
    by = {"adaptive KL": (-0.05, -0.08, -0.01), "fixed β > 0": (0.02, -0.01, 0.05), "β = 0": (0.3, 0.25, 0.35)}
    text = " ".join(H.headline(100, 5, aucs, diffs, by, {"adaptive KL": 40, "fixed β > 0": 40, "β = 0": 20},
                               {m: (0.8, 0.7, 0.9) for m in F.METHODS}))
    assert "the rule's ROC AUC is 0.850 [0.800, 0.900]" in text and "0.700 for the proxy plateau" in text
    assert "adaptive KL (40 runs) -0.050 [-0.080, -0.010]: the rule is **below** it" in text
    assert "fixed β > 0 (40 runs) 0.020 [-0.010, 0.050]: the rule does **not** beat it" in text
    assert "does **not** beat the proxy plateau in adaptive KL or fixed β > 0 runs" in text
    assert "its pooled lead over it comes from β = 0 runs" in text


def test_leave_one_study_out_scores_each_run_with_the_rule_fitted_without_its_study():
    rng = np.random.default_rng(3)
    cases = []
    for k in range(12):
        n = 6
        evals = [Evaluation(10 * i, float(i * i), 2.0 - 0.2 * i, 10.0 + i, 0.1 * i) for i in range(n)]
        x = np.asarray([[features(evals[: j + 1])[f] for f in FEATURES] for j in range(1, n)]) + rng.normal(
            size=(n - 1, len(FEATURES)))
        y = np.arange(1, n) > 2 + k % 3
        cases.append(F.Case(f"s{k % 3}", f"r{k}", 0, "ppo", "unbiased", evals, x, y, np.zeros(n), 2 + k % 3))
    folds, outs = F.leave_one_study_out(cases)
    assert sorted(folds) == ["s0", "s1", "s2"]
    for s, rules in folds.items():
        assert rules["rule"] == F.fit_rules([c for c in cases if c.study != s])["rule"]
    for c, o in zip(cases, outs["rule"]):
        assert o.scores.tolist() == pytest.approx(scores(c.evals, folds[c.study]["rule"]))


def test_the_committed_report_regenerates_byte_for_byte(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the report names the runs files as given: relative to the repository
    path = H.write_hacking_alarm_report(tmp_path, runs_files=F.RUNS_FILES, use_store=False)
    committed = ROOT / "reports" / H.STUDY / "README.md"
    assert path.read_text() == committed.read_text()
    assert "generated by `rlhf-lab-report hacking_alarm --no-store --runs reports/claims_runs.json.gz" \
        in path.read_text().rstrip("\n").split("\n")[-1]
