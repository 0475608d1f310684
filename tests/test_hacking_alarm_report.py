"""The hacking alarm's fit and its validation report (rlhf_lab/analysis/studies/alarm_fit.py, hacking_alarm.py;
issue 44)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from rlhf_lab.analysis.studies import alarm_fit as F
from rlhf_lab.analysis.studies import hacking_alarm as H
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


def test_youden_threshold_and_proxy_intervals():
    y = np.array([0, 0, 1, 1], dtype=bool)
    assert F.youden_threshold(np.array([0.1, 0.2, 0.35, 0.8]), y) == 0.35  # J = 1 − 0
    assert F.youden_threshold(np.array([0.1, 0.4, 0.35, 0.8]), y) == 0.8  # J = ½ at 0.8 and at 0.35: the higher
    assert F.interval_means([(1, 1.0), (2, 3.0), (3, 5.0), (5, 7.0)], [0, 2, 4, 6]) == [
        pytest.approx(x) for x in (1.0, 2.0, 5.0, 7.0)]  # p_0: the first step's (the start policy's batch)


def test_row_scores_are_the_alarms_scores():
    x = np.array([[1.0, 0.0, 0.1, 1.2], [3.0, 0.05, 0.4, 2.0]])
    got = F.row_scores(x, RULE)
    want = [score(dict(zip(FEATURES, row)), RULE) for row in x]
    assert got == pytest.approx(want)


def test_stopping_keeps_the_evaluation_before_the_first_alarm():
    evals = [Evaluation(0, 0.0, 1.0, 10.0), Evaluation(10, 1.0, 0.9, 10.0, 1.0),
             Evaluation(20, 16.0, 0.5, 30.0, 1.2), Evaluation(30, 25.0, 0.2, 40.0, 1.1)]
    c = F.Case("s", "r", 0, "ppo", "unbiased", evals, np.zeros((3, 4)), np.array([False, True, True]),
               np.array([0.0, 1.0, 0.5, 0.2]), 1)
    rule = F.Rule((0.0,) * 4, (1.0,) * 4, (1.0, 0.0, 0.0, 0.0), -3.5, 0.5)  # raised once √KL reaches 3.5: at step 20
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


def test_leave_one_study_out_scores_each_run_with_the_rule_fitted_without_its_study():
    rng = np.random.default_rng(3)
    cases = []
    for k in range(12):
        n = 6
        evals = [Evaluation(10 * i, float(i * i), 2.0 - 0.2 * i, 10.0 + i, 0.1 * i) for i in range(n)]
        x = np.asarray([[features(evals[: j + 1])[f] for f in FEATURES] for j in range(1, n)]) + rng.normal(
            size=(n - 1, 4))
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
