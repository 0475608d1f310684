"""The gold recipes report (rlhf_lab_research/studies/gold_recipes.py) on synthetic runs built in memory: runs grouped
by recipe and β, the bar on the Fisher-z mean at β = 0, C1 judged with each gold per recipe, each gold's cost read
from the runs that built it (and kept in the runs file), and the report regenerated from that file alone."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from rlhf_lab.analysis import snapshot
from rlhf_lab.analysis.study_runs import RunData
from rlhf_lab_research.studies import gold_recipes as GR
from tests.test_gold_validation import BETA0, BETA01, T, rise_fall, run

STUDY_TAG = {"rlhf_lab.study": GR.STUDY}


def recipe_run(name: str, seed: int, kl: dict, rm: np.ndarray, rng, gold_id: str) -> RunData:
    f = rise_fall() if kl is BETA0 else 0.4 * T
    r = run(seed, kl, f, rm, rng)
    return dataclasses.replace(r, params={**r.params, "sweep.gold_recipe": name},
                               tags={**STUDY_TAG, GR.GOLD_TAG: gold_id}, setting={"gold_recipe": name, **r.setting})


def built(rid: str, stage: str, seconds: float, tags: dict | None = None, **kw) -> RunData:
    return RunData(rid, stage, "FINISHED", kw.get("params", {}), {**STUDY_TAG, **(tags or {})}, kw.get("metrics", {}),
                   start_time=1_000_000, end_time=1_000_000 + int(seconds * 1000))


def study(rng) -> tuple[list[RunData], list[RunData]]:
    """`good`: a gold RM that falls with the formula (a monotone image); `blind`: one that keeps rising at β = 0."""
    ppo = []
    for s in range(5, 10):
        f = rise_fall()
        ppo += [recipe_run("good", s, BETA0, 2 * f - 0.3 + rng.normal(0, 0.01, T.size), rng, "g1"),
                recipe_run("blind", s, BETA0, 0.5 * T + rng.normal(0, 0.05, T.size), rng, "g2"),
                recipe_run("good", s, BETA01, 0.8 * T, rng, "g1")]
    golds = [built("g1", "rm", 120, {"rlhf_lab.upstream.prefs": "p1", "rlhf_lab.upstream.rm_backbone": "b1"},
                   params={"reward_model.ensemble": "3", "data.n_train": "40000"},
                   metrics={"model/params_total": 853248.0, "rm/accuracy": 0.9}),
             built("p1", "prefs", 30), built("b1", "sft", 100, {"rlhf_lab.upstream.pretrain": "t1"}),
             built("t1", "pretrain", 200)]
    return ppo, golds


def test_cells_bar_c1_and_cost(tmp_path):
    rng = np.random.default_rng(0)
    ppo, golds = study(rng)
    by = GR.cells(ppo)
    assert list(by) == [("blind", 0.0), ("good", 0.0), ("good", 0.1)] and all(len(v) == 5 for v in by.values())
    rho0 = {name: GR.fisher_mean([GR.run_rho(r) for r in rs]) for (name, b), rs in by.items() if b == 0}
    assert GR.meets_bar(rho0["good"]) and not GR.meets_bar(rho0["blind"])
    assert not GR.meets_bar(dataclasses.replace(rho0["good"], lo=0.4))  # the lower end must reach 0.5 too
    assert not GR.meets_bar(dataclasses.replace(rho0["good"], n=4))  # and over at least 5 runs
    c1 = {row[0]: row for row in GR.c1_rows(by)}
    assert c1["`good`"][2] == c1["`good`"][4] == "**holds**" and c1["`good`"][-1] == "yes"
    assert c1["`blind`"][2] == "**holds**" and c1["`blind`"][4] != "**holds**" and c1["`blind`"][-1] == "**no**"
    rows, backbone = GR.cost_rows(by, golds)
    assert backbone == pytest.approx(300.0)
    assert {r[0]: r for r in rows}["`good`"] == ["`good`", "0.85M", 3, "40000", "30", "120", "0.900"]
    assert {r[0]: r for r in rows}["`blind`"][1:] == ["–"] * 6  # its gold was built against another store
    # the closure follows only what built the gold, each run once
    found = {r.run_id: r for r in golds}
    assert {r.run_id for r in GR.gold_closure(["g1", "g1", "gx"], found.get)} == {"g1", "p1", "b1", "t1"}
    assert math.isnan(GR.wall_s(None))
    alone = dataclasses.replace(ppo[0], params={}, setting={}, tags={"rlhf_lab.overrides": "+gold_recipe=covers seed=5"})
    assert GR.recipe(alone) == "covers"  # a sweep of one recipe: from the overrides it was launched with


def test_report_and_its_runs_file(tmp_path):
    rng = np.random.default_rng(1)
    ppo, golds = study(rng)
    text = GR.write_report(ppo, golds, [], ["rlhf-lab -m sweep=gold_recipes"], tmp_path / "a", "`x`").read_text()
    assert "| `good` |" in text and "**meets the bar**" in text and "Recipes that meet the bar: `good`." in text
    assert "ρ at β = 0.1" in text and "took 300 s" in text and "15 finished PPO runs; seeds 5, 6, 7, 8, 9." in text
    blind_only = [r for r in ppo if r.value("gold_recipe") == "blind"]
    assert "**No recipe meets the bar**" in GR.write_report(blind_only, golds, [], [], tmp_path / "b", "`x`").read_text()
    assert "**Not run yet**" in GR.write_report([], [], [], [], tmp_path / "c", "`x`").read_text()
    # from a runs file alone: the PPO runs and the golds' runs it keeps give the same report
    f = snapshot.write_snapshot(tmp_path / "runs.json.gz", {GR.STUDY: [*ppo, *golds]},
                                {GR.STUDY: ["rlhf-lab -m sweep=gold_recipes"]})
    again = GR.write_gold_recipes_report(tmp_path / "out", runs_files=[f], use_store=False, require_runs=True)
    first = GR.write_report(ppo, golds, [], ["rlhf-lab -m sweep=gold_recipes"], tmp_path / "d", f"`{f}`",
                            flags=f" --no-store --runs {f}")
    assert again.read_text() == first.read_text()


def test_a_runs_file_keeps_each_studys_commands(tmp_path):
    """The report keeps its cover policies' runs beside its own in one file: writing the second study's runs must
    keep the first's reproduce commands (they were lost once)."""
    from rlhf_lab.analysis.study_report import write_runs_file

    rng = np.random.default_rng(2)
    ppo, _ = study(rng)
    f = tmp_path / "runs.json.gz"
    write_runs_file(f, GR.STUDY, ppo[:3], ["rlhf-lab -m sweep=gold_recipes seed=5"])
    cover = dataclasses.replace(ppo[3], run_id="cover", tags={"rlhf_lab.study": GR.COVER_STUDY})
    write_runs_file(f, GR.COVER_STUDY, [cover], ["rlhf-lab study=gold_cover seed=200"])
    studies, commands = snapshot.read_snapshot(f)
    assert commands == {GR.STUDY: ["rlhf-lab -m sweep=gold_recipes seed=5"],
                        GR.COVER_STUDY: ["rlhf-lab study=gold_cover seed=200"]}
    assert [r.run_id for r in studies[GR.COVER_STUDY]] == ["cover"] and len(studies[GR.STUDY]) == 3
