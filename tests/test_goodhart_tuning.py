"""Goodhart's law in tuning (issue 67, item 6; rlhf_lab_research/goodhart_tuning.py): each objective's pick and its
gold regret against the gold-tuned pick, on a made-up runs file of the three studies."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from rlhf_lab.analysis.study_runs import RunData
from rlhf_lab.analysis.snapshot import write_snapshot
from rlhf_lab_research import goodhart_tuning as G

STEPS = (0, 20, 40)


def rd(run_id: str, objective: float, step: int, test_gold, beta="0.1", status="FINISHED", start=0,
       se=0.01) -> RunData:
    """A trial: `test_gold` at each of STEPS (SE `se`), eval gold 0.1 below it, KL = step / 10."""
    history = {G.TEST: [(s, float(g)) for s, g in zip(STEPS, test_gold)],
               G.TEST_SE: [(s, se) for s in STEPS],
               "eval/gold_reward": [(s, float(g) - 0.1) for s, g in zip(STEPS, test_gold)],
               "eval/kl": [(s, s / 10) for s in STEPS]}
    params = {"kl.beta": beta, "algo.steps": "40", "algo.lr": "0.00010000000000000002"}
    return RunData(run_id, "ppo", status, params, {}, {G.OBJECTIVE: objective, G.STEP: float(step)}, history,
                   start_time=start)


def studies() -> dict[str, list[RunData]]:
    # the proxy study: its best objective (2.0) is the trial with β = 0, whose last checkpoint's test gold fell to 0.2
    proxy = [rd("p1", 2.0, 40, [0.3, 0.6, 0.2], beta="0"), rd("p2", 1.0, 40, [0.3, 0.5, 0.55], beta="0.2"),
             rd("p3", 3.0, 40, [0.3, 0.6, 0.7], status="FAILED")]
    # the ship study: a tie at 0.9, the earlier started wins (s2); it ships step 20 (test gold 0.5)
    ship = [rd("s1", 0.9, 40, [0.3, 0.4, 0.45], start=2), rd("s2", 0.9, 20, [0.3, 0.5, 0.4], beta="0.05", start=1),
            rd("s3", 0.1, 20, [0.3, 0.35, 0.3])]
    # the gold study: its pick ships step 20 with test gold 0.65
    gold = [rd("g1", 0.55, 20, [0.3, 0.65, 0.5], beta="0.03"), rd("g2", 0.2, 40, [0.3, 0.4, 0.3]),
            RunData("g3", "ppo", "FINISHED", {}, {}, {}, {})]
    return {G.STUDIES["proxy"]: proxy, G.STUDIES["ship"]: ship, G.STUDIES["gold"]: gold}


def test_the_pick_is_the_best_objective_and_the_earliest_on_a_tie(tmp_path):
    trials, left_out = G.load([str(write_snapshot(tmp_path / "r.json.gz", studies()))])
    assert [t.run_id for t in trials["proxy"]] == ["p1", "p2"]
    assert left_out == Counter({("status FAILED", "tune_goodhart_proxy"): 1,
                                ("no `tune/objective` and `tune/step` logged", "tune_goodhart_gold"): 1})
    picks = {obj: G.pick(ts) for obj, ts in trials.items()}
    assert (picks["proxy"].run_id, picks["ship"].run_id, picks["gold"].run_id) == ("p1", "s2", "g1")
    assert picks["proxy"].params == {"kl.beta": "0", "algo.steps": "40", "algo.lr": "0.00010000000000000002"}
    assert (picks["proxy"].step, picks["proxy"].test_gold, picks["proxy"].eval_gold) == (40, 0.2, pytest.approx(0.1))
    assert G.pick([]) is None


def test_the_gold_regret_is_measured_on_the_test_prompts_with_the_two_ses():
    ref = G.Trial("g", 0, {}, 1.0, 20, 0.65, 0.03, 0.55, 2.0)
    chosen = G.Trial("p", 0, {}, 2.0, 40, 0.2, 0.04, 0.1, 4.0)
    diff, lo, hi = G.regret(ref, chosen)
    assert diff == pytest.approx(0.45)
    assert (hi - diff) == pytest.approx(1.959964 * 0.05, rel=1e-6) and (diff - lo) == pytest.approx(hi - diff)


def test_rank_agreement_needs_three_trials_that_differ():
    ts = [G.Trial(str(i), 0, {}, o, 0, g, 0.0, 0.0, 0.0) for i, (o, g) in enumerate([(1, 0.3), (2, 0.2), (3, 0.1)])]
    assert G.rank_agreement(ts) == pytest.approx(-1.0)  # the higher the objective, the lower the gold: Goodhart
    assert math.isnan(G.rank_agreement(ts[:2]))


def test_the_report_shows_each_pick_and_its_regret_and_regenerates(tmp_path):
    f = str(write_snapshot(tmp_path / "r.json.gz", studies()))
    out = tmp_path / "goodhart.md"
    G.main(["--runs", f, "--out", str(out)])
    text = out.read_text()
    assert f"python -m rlhf_lab_research.goodhart_tuning --runs {f}" in text
    # the proxy's pick: β 0, its last checkpoint (step 40, KL 4), test gold 0.2, regret 0.65 − 0.2 = 0.45 ± 1.96·√2·0.01
    assert ("| `proxy` | `tune_goodhart_proxy` | 2 | 0 | 40 | 0.0001 | 2.0000 | 40 | 4.00 | 0.200 [0.180, 0.220] | "
            "0.450 [0.422, 0.478] |") in text
    assert "| `ship` | `tune_goodhart_ship` | 3 | 0.05 |" in text and "0.150 [0.122, 0.178] |" in text
    assert "| `gold` | `tune_goodhart_gold` | 2 | 0.03 |" in text and "| 0 (the reference) |" in text
    # ρ over the ship study's 3 trials: objective ranks 2.5, 2.5, 1 against test gold ranks 2, 3, 1: 1.5/√3
    assert "| `ship` | 3 | 0.866 |" in text
    G.main(["--runs", f, "--out", str(out)])
    assert out.read_text() == text


def test_without_a_gold_study_there_is_no_regret_and_a_missing_file_is_one_line(tmp_path, capsys):
    only_proxy = {G.STUDIES["proxy"]: studies()[G.STUDIES["proxy"]]}
    trials, left_out = G.load([str(write_snapshot(tmp_path / "p.json.gz", only_proxy))])
    text = G.report(trials, left_out, ["p.json.gz"])
    assert "– (no gold-tuned pick)" in text and "| `gold` | `tune_goodhart_gold` | 0 |" in text
    with pytest.raises(SystemExit) as e:
        G.main(["--runs", str(tmp_path / "none.json.gz"), "--out", str(tmp_path / "g.md")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "--store" in err


def test_the_runs_file_keeps_the_objective_and_the_test_gold(tmp_path):
    asked = []

    def load(study, uri, stages, history_keys):
        asked.append((study, tuple(history_keys)))
        return studies()[study], []
    path = G.store_runs(tmp_path / "runs.json.gz", None, load)
    assert [a[0] for a in asked] == list(G.STUDIES.values())
    assert {G.TEST, G.TEST_SE, "eval/gold_reward", "eval/kl"} <= set(asked[0][1])
    trials, _ = G.load([str(path)])
    assert trials["gold"][0].objective == 0.55 and trials["gold"][0].test_gold == 0.65


def test_the_committed_report_regenerates_byte_for_byte_from_its_runs_file(tmp_path, monkeypatch):
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)  # the report names its runs file as the command line gave it: relative to the clone
    out = tmp_path / "goodhart.md"
    G.main(["--runs", str(G.RUNS_OUT), "--out", str(out)])
    assert out.read_text() == (root / G.OUT).read_text()
