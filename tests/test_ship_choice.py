"""The product's ship rule (rlhf_lab/evaluation/ship_choice.py, issue 67 point 5): the figures it is quoted with are
the report's, its parameters the frozen ones, the choice made online is the frozen rule's on the whole run, and the
study report's section ships by the same rule. Pure functions: nothing trains."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from rlhf_lab.analysis.study_runs import RunData
from rlhf_lab.analysis.ship_section import ship_section, shipped
from rlhf_lab.evaluation import ship as S
from rlhf_lab.evaluation.objective import interval_means
from rlhf_lab.evaluation.ship_choice import FIGURES, PARAMS, RULE, OnlineShip, gold_regret

ROOT = Path(__file__).resolve().parents[1]


def test_the_quoted_figures_and_parameters_are_the_reports():
    """FIGURES is the rule's row in the prospective test's report (its mean regret and interval, its share of runs
    shipping worse than the start, the runs), and PARAMS the frozen rules.json's."""
    assert json.loads((ROOT / "reports/ship/rules.json").read_text())["rules"][RULE] == PARAMS
    assert FIGURES.phase == "prospective" and FIGURES.source == "reports/ship/test.md"
    report = (ROOT / FIGURES.source).read_text()
    header = next(ln for ln in report.splitlines() if ln.startswith("| rule |")).strip("| ").split(" | ")
    row = next(ln for ln in report.splitlines() if ln.startswith(f"| `{RULE}` ")).strip("| ").split(" | ")
    cell = dict(zip(header, row))
    assert int(cell["runs"]) == FIGURES.runs
    assert cell["mean regret"] == f"{FIGURES.regret:.3f} [{FIGURES.regret_lo:.3f}, {FIGURES.regret_hi:.3f}]"
    assert float(cell["ships worse than the start"]) == FIGURES.worse_than_start


def feed(rng: random.Random, steps: list[int]) -> tuple[OnlineShip, list[tuple[int, float]], list[int]]:
    """An OnlineShip fed a random run as a job feeds it: a proxy per training step, an evaluation at
    each of `steps` (the first at 0, before training); returns it, the proxy's history and the steps it said to
    save at."""
    choice, history, saves, done = OnlineShip(), [], [], 0
    for i, step in enumerate(steps):
        for t in range(done + 1, step + 1):
            v = rng.gauss(0.05 * t, 1.0)
            choice.train_step(t, v)
            history.append((t, v))
        done = step
        if choice.evaluation(step, rng.uniform(0, 3) * i):
            saves.append(step)
    v = rng.gauss(0, 1)
    choice.train_step(done + 1, v)  # the step after the last evaluation: the start's proxy when it was the only one
    history.append((done + 1, v))
    return choice, history, saves


def test_the_online_choice_is_the_frozen_rule_on_the_whole_run():
    rng = random.Random(0)
    for _ in range(500):
        steps = [0, *sorted(rng.sample(range(1, 80), rng.randint(0, 9)))]
        choice, history, saves = feed(rng, steps)
        curve = S.Curve(tuple(steps), tuple(interval_means(history, steps)), tuple(choice.kl))
        assert choice.curve().proxy == curve.proxy or len(steps) == 1
        i = S.proxy_minus_sqrt_kl(curve, **PARAMS)
        assert choice.best == i and choice.step == steps[i]
        assert saves[-1] == steps[i]  # the checkpoint kept on disk is the one shipped
        assert saves == sorted(saves) and saves[0] == 0  # saved when it became the best, the start first


def test_the_gold_regret_needs_the_test_gold_of_every_evaluation():
    ev = {0: 0.1, 10: 0.6, 20: 0.5}
    assert math.isclose(gold_regret(ev, {0: 0.0, 10: 0.7, 20: 0.4}, 20), 0.7 - 0.4)  # chosen on eval, test measures
    assert gold_regret(ev, {0: 0.0, 20: 0.4}, 20) is None  # tested at the start and the end only


def run(stage: str, scores, kl, steps=(0, 10, 20), run_id="a", seed="0", halves=None) -> RunData:
    history = {"objective/scores": [(t, v) for t, v in zip(range(1, 100), scores)],
               "eval/kl": list(zip(steps, kl)), "eval/proxy_reward": [(t, 0.0) for t in steps]}
    if halves:
        history["eval/gold_reward_a"] = list(zip(steps, halves[0]))
        history["eval/gold_reward_b"] = list(zip(steps, halves[1]))
        history["eval/gold_reward"] = [(t, (a + b) / 2) for t, a, b in zip(steps, *halves)]
    return RunData(run_id, stage, "FINISHED", {}, {}, {}, history=history, seed=seed)


def test_the_study_report_ships_by_the_same_rule_and_says_whose_gold_is_beside_it():
    scores = [0.0] + [2.0] * 9 + [1.9] * 10  # the start's 0 (step 1), then 1.8 and 1.9 over the two intervals
    r = run("ppo", scores, [0.0, 0.1, 9.0], halves=([0.0, 0.5, 0.4], [0.0, 0.45, 0.5]))
    s = shipped(r)
    assert s.step == 10 and s.steps == 3  # 1.9 − 0.2·3 < 1.8 − 0.2·√0.1
    assert math.isclose(s.regret, ((0.45 - 0.45) + (0.4 - 0.5)) / 2)  # A picks 10 (B measures), B picks 20 (A)
    lines = "\n".join(ship_section([r, run("dpo", [], [], run_id="d")]))
    assert "**Ship** " in lines and "(run `a`), step 10" in lines and FIGURES.text() in lines
    assert "The gold's own choice, which a user without a gold cannot see" in lines
    assert shipped(run("dpo", scores, [0.0, 0.1, 9.0])) is None  # the rule was measured on PPO/GRPO/RLOO only
    none = "\n".join(ship_section([run("ppo", [], [0.0, 0.1, 9.0])]))
    assert "kept its training proxy (`objective/scores`): the rule cannot be applied" in none
    assert ship_section([run("dpo", [], [])]) == []


def test_the_ship_callback_saves_each_new_best_and_resumes_from_its_checkpoint_state(monkeypatch, tmp_path):
    """The callback saves when the choice moves (the start first), logs ship/value, and its state survives a
    Lightning checkpoint (torch.load with weights_only=True, as a resumed job reads it)."""
    from types import SimpleNamespace

    import torch

    from rlhf_lab.evaluation import callbacks as C

    logged, saved = [], []
    monkeypatch.setattr(C.active_run, "log_metrics", lambda m, step=None, **_: logged.append((step, dict(m))))
    monkeypatch.setattr(C.active_run, "set_tag", lambda k, v: None)
    state = {"step": 0}
    proxies = {1: 0.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 0.0, 6: 0.0}
    make = lambda: C.ShipCheckpoint(lambda: proxies.get(state["step"]), lambda t, m: state["step"],  # noqa: E731
                                    save=lambda: saved.append(state["step"]) or f"ship@{state['step']}")
    ship = make()
    trainer = SimpleNamespace(global_rank=0)
    ship.on_evaluation(0, {"eval/kl": 0.0})
    for state["step"] in (1, 2):
        ship.on_train_batch_end(trainer, None, None, None, None)
    ship.on_evaluation(2, {"eval/kl": 0.25})  # proxy 0.5 - 0.2 * 0.5 = 0.4 > the start's 0.0
    assert saved == [0, 2] and ship.path == "ship@2" and ship.choice.step == 2
    assert [s for s, m in logged if "ship/value" in m] == [0, 2]  # the start's once the first step made it known
    torch.save(ship.state_dict(), tmp_path / "cb.pt")
    again = make()
    again.load_state_dict(torch.load(tmp_path / "cb.pt", weights_only=True))
    for cb in (ship, again):
        for state["step"] in (3, 4):
            cb.on_train_batch_end(trainer, None, None, None, None)
        cb.on_evaluation(4, {"eval/kl": 100.0})  # 1.0 - 2.0: not better
    assert ship.choice.state_dict() == again.choice.state_dict() and again.path == "ship@2" and saved == [0, 2]
