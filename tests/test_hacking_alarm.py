"""The gold-free hacking alarm (rlhf_lab/evaluation/alarm.py, the HackingAlarm callback): its signals and score on
hand-made curves, the callback's raise/stop logic, and a PPO job that stops at the alarm keeping the policy of the
evaluation before it."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_lab.evaluation import alarm as A
from rlhf_lab.evaluation import callbacks as CB

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


class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(3))
        self.frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)


class Trainer:
    global_rank = 0
    should_stop = False

    class strategy:  # noqa: N801 - Lightning's attribute name
        @staticmethod
        def broadcast(obj, src=0):
            return obj


def test_the_callback_raises_once_tags_the_run_and_stops_with_the_policy_before_the_alarm(monkeypatch):
    logged, tags = [], {}
    monkeypatch.setattr(CB.active_run, "log_metrics", lambda m, step=None, **k: logged.append((step, m)))
    monkeypatch.setattr(CB.active_run, "set_tag", lambda k, v: tags.__setitem__(k, v))
    monkeypatch.setattr(CB.active_run, "log_dict", lambda obj, name: tags.__setitem__(name, obj))
    monkeypatch.setattr(CB, "write_line", lambda msg: tags.__setitem__("line", msg))
    policy, trainer, state = Policy(), Trainer(), {"step": 0, "proxy": None}
    alarm = CB.HackingAlarm(lambda: state["proxy"], at_steps=[10, 20, 30, 40], step_fn=lambda t, m: state["step"],
                            policy=lambda: policy, rule=ONE, threshold=0.9, stop=True)
    alarm.on_train_start(trainer, None)
    alarm.on_evaluation(0, {"eval/kl": 0.0, "eval/entropy": 2.0, "eval/length": 10.0})
    fed = []
    for e in HACKED[1:]:
        for step in range(e.step - 9, e.step + 1):  # ten training steps, each with the interval's proxy
            state["step"], state["proxy"] = step, e.proxy + (0.01 if step == 1 else 0.0)  # step 1: the start's
            fed.append(state["proxy"])
            with torch.no_grad():
                policy.w.fill_(step)  # the policy moves at every step
            if step == e.step:  # PeriodicEval runs first at an evaluation step, then the alarm's batch end
                alarm.on_evaluation(step, {"eval/kl": e.kl, "eval/entropy": e.entropy, "eval/length": e.length})
            alarm.on_train_batch_end(trainer, None, None, None, 0)
            if trainer.should_stop:
                break
        if trainer.should_stop:
            break
    # what the alarm should have read: p_0 = step 1's proxy, p_i = the mean over the interval's ten steps
    want = [E(0, 0.0, 2.0, 10.0, fed[0])] + [E(e.step, e.kl, e.entropy, e.length, sum(fed[10 * i:10 * i + 10]) / 10)
                                             for i, e in enumerate(HACKED[1:len(fed) // 10 + 1])]
    s = A.scores(want, ONE)
    raised = next(j for j, v in enumerate(s, start=1) if v >= 0.9)
    got = alarm.evaluations
    assert [(e.step, e.kl, e.entropy, e.length) for e in got] == \
        [(e.step, e.kl, e.entropy, e.length) for e in want[:raised + 1]]
    assert [e.proxy for e in got] == pytest.approx([e.proxy for e in want[:raised + 1]])
    assert alarm.raised_at == want[raised].step and alarm.stopped_at == alarm.raised_at and trainer.should_stop
    assert alarm.kept_step == want[raised - 1].step
    assert torch.equal(policy.w, torch.full((3,), float(want[raised - 1].step)))  # put back: the evaluation before
    assert tags["rlhf_lab.hacking_alarm"] == "raised" and tags["rlhf_lab.hacking_alarm_step"] == str(alarm.raised_at)
    assert tags["events/hacking_alarm.json"]["score"] == pytest.approx(s[raised - 1])
    assert f"hacking alarm raised at step {alarm.raised_at}" in tags["line"]
    assert [st for st, _ in logged] == [e.step for e in want[1:raised + 1]]  # one log per evaluation after the start
    assert logged[-1][1]["alarm/raised"] == 1.0 and logged[0][1]["alarm/raised"] == 0.0
    assert logged[-1][1]["alarm/score"] == pytest.approx(s[raised - 1])
    assert {f"alarm/{k}" for k in A.FEATURES} <= set(logged[0][1])  # every signal logged, the new two included
    assert logged[-1][1]["alarm/length_rate"] == pytest.approx(
        (want[raised].length - want[raised - 1].length) / want[0].length)
    assert alarm.summary().startswith(f"raised at step {alarm.raised_at} (score ")
    assert f"the saved policy is step {alarm.kept_step}'s (algo.stop_on_alarm)" in alarm.summary()
    state_ = alarm.state_dict()  # a resumed run keeps its evaluations and its alarm
    again = CB.HackingAlarm(lambda: None, [], lambda t, m: 0, lambda: policy, rule=ONE)
    again.load_state_dict(state_)
    assert again.evaluations == alarm.evaluations and again.raised_at == alarm.raised_at


def test_without_stop_the_alarm_only_reports(monkeypatch):
    monkeypatch.setattr(CB.active_run, "log_metrics", lambda *a, **k: None)
    monkeypatch.setattr(CB.active_run, "set_tag", lambda *a: None)
    monkeypatch.setattr(CB.active_run, "log_dict", lambda *a: None)
    monkeypatch.setattr(CB, "write_line", lambda msg: None)
    policy, trainer = Policy(), Trainer()
    alarm = CB.HackingAlarm(lambda: 0.5, [10, 20], lambda t, m: 20, lambda: policy, rule=ONE, threshold=0.999999)
    alarm.on_evaluation(0, {"eval/kl": 0.0, "eval/entropy": 2.0, "eval/length": 10.0})
    alarm.on_evaluation(20, {"eval/kl": 1.0, "eval/entropy": 2.0, "eval/length": 10.0})
    alarm.on_train_batch_end(trainer, None, None, None, 0)
    assert alarm.raised_at is None and not trainer.should_stop and alarm.kept is None
    assert alarm.summary().startswith("not raised (highest score ") and "at step 20; threshold 1.00)" in alarm.summary()
    alarm.on_evaluation(30, {"eval/kl": 1.0})  # an evaluation without the signals (another stage's): ignored
    assert len(alarm.evaluations) == 2


@pytest.mark.slow
def test_a_ppo_job_stops_at_the_alarm_and_saves_the_policy_before_it(tiny_cfg, tmp_path):
    import mlflow

    from rlhf_lab import stages
    from rlhf_lab.models import families as F
    from tests.test_ppo import PPO_TINY

    db = tmp_path / "mlflow.db"
    cfg = tiny_cfg(*PPO_TINY, "algo.reward=rm", "reward_model.steps=10", "data.n_train=64", "data.n_eval=32",
                   "reward_model.norm_samples=64", "algo.steps=4", "eval.every_n_steps=2", "algo.stop_on_alarm=true",
                   "algo.alarm.threshold=1e-9", mlflow_db=db)
    meta = stages.run_job(cfg, tmp_path / "out")
    assert meta["ppo_steps"] == 2 and meta["alarm_step"] == 2  # raised at the first evaluation after the start
    assert "the saved policy is step 0's (algo.stop_on_alarm)" in meta["summary"]["hacking alarm"]
    # with a gold (the world's), one line: the gold-free alarm and the gold's own verdict, no "gold monitor" beside it
    assert "by gold" in meta["summary"]["hacking alarm"] and "gold monitor" not in meta["summary"]
    sft = F.load_causal_lm(stages.ensure("sft", cfg))
    saved = F.load_causal_lm(tmp_path / "out" / "artifact")
    for (n, a), (_, b) in zip(sft.state_dict().items(), saved.state_dict().items()):
        assert torch.equal(a, b), n  # the policy of the evaluation before the alarm: the start's, untouched
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    runs = mlflow.search_runs(experiment_names=["rlhf-lab"])
    run = runs[runs["run_id"] == meta["run_id"]].iloc[0]
    assert run["status"] == "FINISHED" and run["tags.rlhf_lab.hacking_alarm"] == "raised"
    assert run["tags.rlhf_lab.hacking_alarm_step"] == "2" and run["metrics.alarm/raised"] == 1.0
