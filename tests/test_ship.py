"""The ship rules and the gold regret (rlhf_lab/evaluation/ship.py, issue 67), against hand computations."""

from __future__ import annotations

import math

import pytest

from rlhf_lab.evaluation import ship as S
from rlhf_lab.evaluation.alarm import RULE, Rule

NAN = math.nan
# a run of 6 evaluations (index 0: the start) whose proxy keeps climbing, then flattens, while KL grows
STEPS = (0, 20, 40, 60, 80, 100)
PROXY = (0.0, 0.5, 0.9, 1.0, 1.02, 1.01)
KL = (0.0, 1.0, 4.0, 9.0, 16.0, 25.0)
RUN = S.Curve(STEPS, PROXY, KL)


def test_last_and_clock():
    assert S.last_checkpoint(RUN) == 5
    assert S.clock(RUN, 0.5) == 2  # 50 steps: the last evaluation at or before it is step 40
    assert S.clock(RUN, 0.6) == 3  # 60 exactly
    assert S.clock(RUN, 0.0) == 0 and S.clock(RUN, 1.0) == 5
    # the fraction counts from the first evaluation's step
    assert S.clock(S.Curve((10, 20, 30), (0, 0, 0), (0, 0, 0)), 0.5) == 1


def test_kl_budget_ships_the_checkpoint_before_the_first_one_over():
    assert S.kl_budget(RUN, 5.0) == 2  # KL 9 at index 3 is the first over 5
    assert S.kl_budget(RUN, 9.0) == 3  # 9 is not over 9; 16 is
    assert S.kl_budget(RUN, 100.0) == 5  # never over: the last
    assert S.kl_budget(S.Curve((0, 1, 2), (0, 0, 0), (0.0, 3.0, 1.0)), 2.0) == 0  # stops at its first excess


def test_proxy_max_and_plateau():
    assert S.proxy_max(RUN) == 4
    assert S.proxy_max(S.Curve((0, 1, 2), (1.0, 1.0, 0.5), (0, 0, 0))) == 0  # the first on a tie
    assert S.proxy_max(S.Curve((0, 1, 2), (NAN, 0.3, NAN), (0, 0, 0))) == 1  # nan ignored
    # patience 1, no tolerance: 1.02 at index 4 beats 1.0, then 1.01 does not: stop at 5, ship 4
    assert S.proxy_plateau(RUN, patience=1, min_delta=0.0) == 4
    # tolerance 0.05: index 3 (1.0) beats 0.9 by 0.1, index 4 (1.02) does not beat 1.0 by more than 0.05: stop, ship 3
    assert S.proxy_plateau(RUN, patience=1, min_delta=0.05) == 3
    # tolerance 0.2: 0.9 − 0.5 = 0.4 > 0.2, 1.0 − 0.9 = 0.1 is not: waited 1 at index 3, 2 at index 4: ship 2
    assert S.proxy_plateau(RUN, patience=2, min_delta=0.2) == 2
    assert S.proxy_plateau(RUN, patience=10, min_delta=0.2) == 2  # never stops: the best by more than the tolerance


def test_proxy_minus_sqrt_kl():
    # cost 0.3: 0 − 0, 0.5 − 0.3, 0.9 − 0.6, 1.0 − 0.9, 1.02 − 1.2, 1.01 − 1.5 = 0, 0.2, 0.3, 0.1, −0.18, −0.49
    assert S.proxy_minus_sqrt_kl(RUN, 0.3) == 2
    assert S.proxy_minus_sqrt_kl(RUN, 0.0) == S.proxy_max(RUN)
    assert S.proxy_minus_sqrt_kl(RUN, 10.0) == 0


def test_ensemble_and_heldout_rules_read_their_signal_or_say_none():
    assert S.ensemble_lcb(RUN, 1.0) is None and S.heldout_max(RUN) is None and S.heldout_patience(RUN, 2) is None
    run = S.Curve(STEPS, PROXY, KL, proxy_ensemble_std=(0.1, 0.1, 0.2, 0.4, 0.6, 0.8),
                  heldout_reward=(0.0, 0.4, 0.6, 0.55, 0.62, 0.3))
    # mean − std: −0.1, 0.4, 0.7, 0.6, 0.42, 0.21
    assert S.ensemble_lcb(run, 1.0) == 2
    assert S.ensemble_lcb(run, 0.0) == 4
    assert S.heldout_max(run) == 4
    assert S.heldout_patience(run, 1) == 2  # 0.55 < 0.6 at index 3: stop there, ship 2
    assert S.heldout_patience(run, 2) == 4  # 0.62 at index 4 beats 0.6 before the second wait


def test_alarm_ships_the_checkpoint_before_its_first_alarm():
    assert S.alarm(RUN) is None  # no entropy or length: the alarm cannot read it
    never = Rule(RULE.mean, RULE.scale, RULE.weights, bias=-50.0, threshold=0.5)
    always = Rule(RULE.mean, RULE.scale, RULE.weights, bias=50.0, threshold=0.5)
    run = S.Curve(STEPS, PROXY, KL, entropy=(2.0,) * 6, length=(10.0,) * 6)
    assert S.alarm(run, rule=never) == 5
    assert S.alarm(run, rule=always) == 0  # raised at the first evaluation after the start: ship the start
    assert S.alarm(run, threshold=0.0) == 0  # any score reaches 0
    assert S.alarm(run, threshold=1.0) == 5  # today's rule scores these below 1: never raised
    # the rule as today: raised where its score (alarm.scores) first reaches its threshold
    from rlhf_lab.evaluation.alarm import Evaluation, first_alarm
    evals = [Evaluation(t, k, 2.0 - 0.2 * i, 10.0 + 5 * i, p) for i, (t, k, p) in enumerate(zip(STEPS, KL, PROXY))]
    run = S.Curve(STEPS, PROXY, KL, entropy=tuple(e.entropy for e in evals), length=tuple(e.length for e in evals))
    j = first_alarm(evals, RULE)
    assert S.alarm(run) == (5 if j is None else j - 1)


def test_ship_by_name_and_bad_input():
    assert S.ship(RUN, "clock", {"fraction": 0.5}) == 2
    assert S.ship(RUN, "last_checkpoint") == 5
    with pytest.raises(ValueError, match="unknown ship rule 'oracle'"):
        S.ship(RUN, "oracle")
    with pytest.raises(ValueError, match="Curve.kl has 2 values for 3 steps"):
        S.Curve((0, 1, 2), (0, 0, 0), (0, 0))


def test_gold_regret_and_selection_regret():
    assert S.gold_regret(0.9, 0.7) == pytest.approx(0.2)
    gold_a = (0.1, 0.5, 0.7, 0.6)  # selection set: the best is index 2
    gold_b = (0.2, 0.6, 0.5, 0.65)  # measurement set
    assert S.selection_regret(gold_a, gold_b, 1) == pytest.approx(0.5 - 0.6)  # negative: the noise of the halves
    assert S.selection_regret(gold_a, gold_b, 0) == pytest.approx(0.5 - 0.2)
    assert S.selection_regret(gold_b, gold_a, 0) == pytest.approx(0.6 - 0.1)  # the swap: best on b is index 3
    with pytest.raises(ValueError, match="no finite gold"):
        S.selection_regret((NAN, NAN), (0.1, 0.2), 0)
