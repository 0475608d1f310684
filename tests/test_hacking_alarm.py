"""The gold-free hacking alarm's rule (rlhf_lab/evaluation/alarm.py, which the frozen ship rule ``alarm`` reads): its
signals and score on hand-made curves."""

from __future__ import annotations

import math

import pytest

from rlhf_lab.evaluation import alarm as A

E = A.Evaluation
# a run that climbs, then over-optimises: KL grows, the training proxy peaks at the 3rd interval and falls,
# entropy collapses, responses lengthen
HACKED = [E(0, 0.0, 2.0, 10.0, 0.1), E(10, 1.0, 1.9, 11.0, 0.2), E(20, 4.0, 1.8, 12.0, 0.5), E(30, 9.0, 1.2, 20.0, 0.9),
          E(40, 16.0, 0.8, 30.0, 0.6)]
ONE = A.Rule(mean=(0.0, 0.0, 0.0, 1.0, 0.0, 0.0), scale=(1.0,) * 6, weights=(1.0, 1.0, 1.0, 1.0, 0.0, 0.0),
             bias=-3.0, threshold=0.5)


def test_the_signals_by_hand():
    assert A.features(HACKED[:1]) is None  # the start alone: nothing to compare
    x = A.features(HACKED[:2])
    assert x == pytest.approx({"sqrt_kl": 1.0, "proxy_drop": 0.1 - 0.2, "entropy_drop": 1 - 1.9 / 2.0,
                               "length_ratio": 1.1, "gain_per_sqrt_kl": 0.1 / 1.0, "length_rate": 0.1}
                              )  # the start's proxy is the earlier best: rising, negative
    assert A.features(HACKED[:4])["proxy_drop"] == pytest.approx(0.5 - 0.9)  # still rising above its best
    x = A.features(HACKED)
    assert x == pytest.approx({"sqrt_kl": 4.0, "proxy_drop": 0.9 - 0.6, "entropy_drop": 1 - 0.8 / 2.0,
                               "length_ratio": 3.0, "gain_per_sqrt_kl": (0.6 - 0.1) / 4.0,
                               "length_rate": (30.0 - 20.0) / 10.0})
    assert list(x) == list(A.FEATURES)
    assert A.features([E(0, 0.0, 2.0, 10.0), E(10, 1.0, 1.9, 11.0, 0.2)])["proxy_drop"] == 0.0  # nothing earlier
    # an interval without a proxy (nan) is skipped as "earlier" and gives no drop as "now"
    assert A.features([*HACKED[:3], E(30, 9.0, 1.2, 20.0)])["proxy_drop"] == 0.0
    assert A.features([*HACKED[:3], E(30, 9.0, 1.2, 20.0), E(40, 9.0, 1.2, 20.0, 0.1)])["proxy_drop"] == \
        pytest.approx(0.4)


def test_the_new_signals_by_hand():
    """gain_per_sqrt_kl: the proxy gained since the start per √KL, the √KL floored; length_rate: the length's change
    since the previous evaluation over the start's length (online: only the evaluations up to the current one)."""
    assert A.features(HACKED[:3])["gain_per_sqrt_kl"] == pytest.approx((0.5 - 0.1) / 2.0)
    assert A.features(HACKED[:4])["length_rate"] == pytest.approx((20.0 - 12.0) / 10.0)
    assert A.features(HACKED[:4]) == A.features([*HACKED[:4], E(40, 99.0, 0.1, 99.0, 9.0)][:4])  # causal
    # at KL ≈ 0 the gain is per SQRT_KL_FLOOR, not per ~0; an unknown proxy (now or at the start) gives no gain
    assert A.features([HACKED[0], E(10, 0.01, 1.9, 11.0, 0.2)])["gain_per_sqrt_kl"] == \
        pytest.approx(0.1 / A.SQRT_KL_FLOOR)
    assert A.features([HACKED[0], E(10, 1.0, 1.9, 11.0)])["gain_per_sqrt_kl"] == 0.0
    assert A.features([E(0, 0.0, 2.0, 10.0), E(10, 1.0, 1.9, 11.0, 0.2)])["gain_per_sqrt_kl"] == 0.0
    # a falling length gives a negative rate; an unknown start length gives none
    assert A.features([*HACKED[:4], E(40, 16.0, 0.8, 15.0, 0.6)])["length_rate"] == pytest.approx(-0.5)
    assert A.features([E(0, 0.0, 2.0, 0.0, 0.1), E(10, 1.0, 1.9, 11.0, 0.2)])["length_rate"] == 0.0


def test_a_rule_has_one_number_per_signal():
    """A Rule whose tuples do not have one entry per signal is refused (zip would drop the extra signals)."""
    assert len(A.RULE.mean) == len(A.RULE.scale) == len(A.RULE.weights) == len(A.FEATURES) == 6
    n = len(A.FEATURES)
    for field in ("mean", "scale", "weights"):
        for k in (n - 2, n + 1):
            kw = {"mean": (0.0,) * n, "scale": (1.0,) * n, "weights": (1.0,) * n, field: (1.0,) * k}
            with pytest.raises(ValueError, match=f"Rule.{field} has {k} entries"):
                A.Rule(**kw, bias=0.0, threshold=0.5)


def test_the_score_is_the_logistic_of_the_standardised_signals():
    x = {"sqrt_kl": 4.0, "proxy_drop": 0.3, "entropy_drop": 0.6, "length_ratio": 3.0, "gain_per_sqrt_kl": 0.7,
         "length_rate": 0.2}
    z = -3.0 + 4.0 + 0.3 + 0.6 + (3.0 - 1.0)
    assert A.score(x, ONE) == pytest.approx(1 / (1 + math.exp(-z)))
    r = A.Rule(mean=(1.0, 0.0, 0.0, 1.0, 0.0, 0.0), scale=(2.0, 1.0, 1.0, 1.0, 1.0, 1.0),
               weights=(0.5, 0.0, 0.0, 0.0, 0.0, 0.0), bias=0.0, threshold=0.5)
    assert A.score(x, r) == pytest.approx(1 / (1 + math.exp(-0.5 * (4.0 - 1.0) / 2.0)))
    assert A.score({**x, "sqrt_kl": -1e4}, ONE) == pytest.approx(0.0, abs=1e-300)  # no overflow either way
    assert A.score({**x, "sqrt_kl": 1e4}, ONE) == 1.0
    both = A.Rule(mean=(0.0,) * 6, scale=(1.0, 1.0, 1.0, 1.0, 0.5, 0.1), weights=(0.0,) * 4 + (1.0, -1.0), bias=0.0,
                  threshold=0.5)  # the new signals enter the score
    assert A.score(x, both) == pytest.approx(1 / (1 + math.exp(-(0.7 / 0.5 - 0.2 / 0.1))))


def test_first_alarm_is_causal_and_follows_the_threshold():
    s = A.scores(HACKED, ONE)
    assert len(s) == 4 and s == sorted(s)  # this run only gets worse
    assert [A.scores(HACKED[:j + 1], ONE)[-1] for j in range(1, 5)] == s  # each reads only what came before
    j = A.first_alarm(HACKED, ONE)
    assert j == next(i for i, v in enumerate(s, start=1) if v >= 0.5)
    assert A.first_alarm(HACKED, ONE, threshold=0.999999) is None
    flat = [E(0, 0.0, 2.0, 10.0)] + [E(10 * i, 0.01, 2.0, 10.0, 0.1) for i in range(1, 5)]
    assert A.first_alarm(flat, ONE) is None  # a run that stays at its start never raises it


def test_the_fitted_rule_reads_more_risk_from_each_signal():
    """The committed rule's weights point the way the evidence says: more KL, a larger drop of the training proxy,
    a larger entropy drop each raise the score (reports/hacking_alarm/README.md)."""
    w = dict(zip(A.FEATURES, A.RULE.weights))
    assert w["sqrt_kl"] > 0 and w["proxy_drop"] > 0 and w["entropy_drop"] > 0 and 0 < A.RULE.threshold < 1
    assert w["gain_per_sqrt_kl"] > 0 and w["length_rate"] > 0  # more proxy per √KL, faster lengthening
