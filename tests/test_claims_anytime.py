"""Optional stopping in the claims report (issue 42, point 3): an effect that reads runs of seeds added to its study
after looking (seeds beyond its study file's own) is judged with the anytime-valid t sequence (interval and p, in
Holm's family); every other effect keeps its fixed-n t interval and p; the tables mark the former. Synthetic runs,
no training."""

from __future__ import annotations

import pytest

from rlhf_lab_research import anytime as A
from rlhf_lab_research import claims as C
from rlhf_lab_research import verdicts as V
from rlhf_lab_research.effects import Measured
from rlhf_lab_research.claims_registry import JUDGED, SHOWN, Claim, Part
from rlhf_lab.analysis.runs import STUDY_TAG, RunData
from rlhf_lab_research.sequential import anytime_t
from rlhf_lab.analysis.stats import t_ci
from rlhf_lab_research.stats import holm, t_effect, units_for_power

VALUES = [0.5, 0.62, 0.41, 0.7, 0.55, 0.47, 0.66]  # one per seed 0–6
FILE_SEEDS = {"ext": (0, 1, 2, 3, 4), "plain": (0, 1, 2, 3, 4, 5, 6)}  # ext ran seeds 5 and 6 after looking


@pytest.fixture(autouse=True)
def study_files(monkeypatch):
    monkeypatch.setattr(A, "file_seeds", FILE_SEEDS.get)


def runs(study: str, seeds=range(7)) -> tuple[RunData, ...]:
    return tuple(RunData(f"{study}-{s}", "ppo", "FINISHED", {}, {STUDY_TAG: study}, {}, seed=str(s)) for s in seeds)


def part(study: str, role: str = JUDGED, values=VALUES, seeds=range(7)) -> Part:
    return Part(f"effect of {study}", "synthetic", "gold reward", 1, None,
                lambda studies: Measured(t_effect(values), "", "", runs(study, seeds)), role)


def judge(*parts: Part) -> list[V.PartResult]:
    studies = {"ext": list(runs("ext")), "plain": list(runs("plain"))}
    res = V.judge_all([Claim("X1", "claim X1", ("ext", "plain"), tuple(parts))], studies, {"ext": 7, "plain": 7})
    return res[0].parts


def test_a_study_with_seeds_beyond_its_study_files_is_extended():
    studies = {"ext": list(runs("ext")), "plain": list(runs("plain"))}
    added = A.added_run_ids(studies)
    assert added == {"ext-5", "ext-6"}
    # an effect over runs of which one was added takes the anytime interval
    assert A.includes_added(studies["ext"], added) and not A.includes_added(studies["ext"][:5], added)
    # the runs' study tag decides, not the key they are read under (a claim's study read from a rerun's design)
    assert A.added_run_ids({"plain": list(runs("ext"))}) == added
    assert A.added_run_ids({"x": list(runs("unknown"))}) == frozenset()  # no study file: no record of a look


def test_an_extended_studys_effect_uses_the_anytime_interval_and_p_and_another_keeps_the_t_interval():
    ext, plain = judge(part("ext"), part("plain"))
    est, lo, hi, _, n = anytime_t(VALUES)
    e = ext.measured.effect
    assert A.is_anytime(e) and (e.estimate, e.lo, e.hi, e.n) == pytest.approx((est, lo, hi, n))
    assert ext.p == pytest.approx(anytime_t(VALUES, direction=1)[3]) and ext.side == 1
    m, tlo, thi, _ = t_ci(VALUES)
    f = plain.measured.effect
    assert f.method == "t" and (f.lo, f.hi) == pytest.approx((tlo, thi))
    assert plain.p == pytest.approx(f.p_value(1))
    assert hi - lo > thi - tlo  # the anytime sequence is wider
    # one Holm family holds both p-values
    assert [ext.p_adj, plain.p_adj] == pytest.approx(holm([ext.p, plain.p]))


def test_only_effects_reading_added_seeds_and_only_judged_ones_or_preconditions_change():
    own, shown = judge(part("ext", seeds=range(5), values=VALUES[:5]), part("ext", role=SHOWN))
    assert own.measured.effect.method == "t"  # the study file's own seeds only: its n was fixed
    assert shown.measured.effect.method == "t"  # a shown effect is not judged


def test_an_anytime_effect_needs_more_seeds_than_a_fixed_n_t_test():
    assert A.anytime_needs(0.1, 0.2, 0.025, 0.8) > units_for_power(0.1, 0.2, 0.025, 0.8)
    assert A.anytime_needs(0.0, 0.2, 0.025, 0.8) is None


def test_the_report_marks_the_anytime_rows_and_says_why():
    studies = {"ext": list(runs("ext")), "plain": list(runs("plain"))}
    results = V.judge_all([Claim("X1", "claim X1", ("ext",), (part("ext"),)),
                           Claim("X2", "claim X2", ("plain",), (part("plain"),))], studies, {"ext": 7, "plain": 7})
    text = C.render(results, "`memory`", [])
    lines = text.splitlines()
    x1 = next(x for x in lines if x.startswith("| X1 "))
    x2 = next(x for x in lines if x.startswith("| X2 "))
    assert A.MARK in x1 and A.MARK not in x2
    e1 = next(x for x in lines if x.startswith("| judged | effect of ext"))
    e2 = next(x for x in lines if x.startswith("| judged | effect of plain"))
    assert f"gold reward {A.MARK} |" in e1 and A.MARK not in e2
    assert text.count(A.FOOTNOTE) == 2  # below the verdict table and below X1's effects, not X2's
    assert "Wang & Ramdas 2023" in text.split("## Verdicts")[0] and "conservative by up to 2×" in text
