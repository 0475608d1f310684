"""Issue 42, point 7: every p-value a verdict rests on is in Holm's family (judged effects, preconditions, and the
equivalence (TOST) p of a negligible call); a shown effect's words say they read an unadjusted interval; the
provenance table's note names the designs redone after their results were seen. Hand-computed, no training."""

from __future__ import annotations

import math

import pytest
from scipy import stats as st

from rlhf_lab_research import claims as C
from rlhf_lab_research import verdicts as V
from rlhf_lab_research.designs import REDONE
from rlhf_lab_research.effects import Measured
from rlhf_lab_research.provenance import redone_text
from rlhf_lab_research.claims_registry import JUDGED, PRECONDITION, Claim, Part
from rlhf_lab.analysis.study_runs import RunData
from rlhf_lab_research.stats import Effect

T4 = float(st.t.ppf(0.975, 4))


def effect(est: float, se: float, n: int = 5) -> Effect:
    return Effect(est, est - T4 * se, est + T4 * se, n, "t")


def part(says: str, e: Effect, role: str = JUDGED, margin: float | None = None) -> Part:
    return Part(says, "synthetic", "gold reward", +1, margin, lambda studies, e=e: Measured(e, "", ""), role)


def judge(*parts_per_claim: tuple[Part, ...]) -> list[V.ClaimResult]:
    claims = [Claim(f"X{i}", f"claim {i}", ("s",), ps) for i, ps in enumerate(parts_per_claim)]
    return V.judge_all(claims, {"s": []}, {"s": 1})


def test_a_precondition_is_judged_on_its_holm_adjusted_p():
    # one-sided p: precondition 0.01, judged 0.004 and 0.3 (effects built from the t quantiles of 4 df)
    pre, a, b = (effect(float(st.t.isf(p, 4)) * 0.1, 0.1) for p in (0.01, 0.004, 0.3))
    res = judge((part("pre", pre, PRECONDITION), part("a", a)), (part("b", b),))
    r_pre, r_a = res[0].parts
    # Holm over {0.004, 0.01, 0.3}: 3·0.004 = 0.012, max(0.012, 2·0.01) = 0.02, 0.3
    assert r_a.p_adj == pytest.approx(0.012) and r_pre.p_adj == pytest.approx(0.02)
    assert r_pre.verdict == "holds" and res[0].verdict == "holds"
    assert C.family_size(res) == 3 and C.holm_cell(r_pre) == "0.020"
    # a fourth member pushes the precondition past 0.025: 3·0.01 = 0.03, and the claim cannot be tested
    res = judge((part("pre", pre, PRECONDITION), part("a", a)), (part("b", b),), (part("c", b),))
    assert res[0].parts[0].p_adj == pytest.approx(0.03) and res[0].parts[0].verdict == "inconclusive"
    assert res[0].verdict == "inconclusive" and "cannot be tested" in res[0].reason
    assert res[0].parts[0].alpha == pytest.approx(0.025 / 4)  # its power figure is at Holm's strictest step too


def test_the_equivalence_p_of_a_negligible_call_is_tost_and_in_the_family():
    # estimate 0.01, se 0.01, n = 5 (df 4), margin 0.05:
    #   against −0.05: t = (0.01 + 0.05) / 0.01 = 6;  against +0.05: t = (0.05 − 0.01) / 0.01 = 4
    #   TOST p = max(P(T4 ≥ 6), P(T4 ≥ 4)) = P(T4 ≥ 4); with F(t) = 1/2 + (3/8)·u·(1 − t²/(12·(1 + t²/4))),
    #   u = t/√(1 + t²/4): F(4) = 0.5 + 0.375 · 1.78885 · 0.73333 = 0.99193, so p = 0.00807
    #   its one-sided p toward + against 0: t = 1, F(1) = 0.5 + 0.375 · 0.89443 · 0.93333 = 0.81305, p = 0.18695
    e = effect(0.01, 0.01)
    p = part("tiny", e, margin=0.05)
    assert V.equivalence_p(p, e) == pytest.approx(0.00807, abs=1e-5)
    assert e.lo > -0.05 and e.hi < 0.05  # the unadjusted 95% interval lies inside ±margin
    (r,) = judge((p,))[0].parts
    # Holm over {0.00807, 0.18695}: 2·0.00807 = 0.0161 < 0.025, negligible: does not hold (not against)
    assert r.p == pytest.approx(0.18695, abs=1e-5) and r.p_eq_adj == pytest.approx(2 * 0.00807, abs=2e-5)
    assert r.verdict == "does not hold" and r.negligible and not r.against
    assert C.holm_cell(r) == "0.187; inside ±margin: 0.016"
    # among three more effects (m = 5): 5·0.00807 = 0.0403, not below 0.025: no longer negligible, inconclusive,
    # though its unadjusted interval is still inside ±margin
    others = [(part(f"o{i}", effect(0.0, 0.1)),) for i in range(3)]
    res = judge((p,), *others)
    (r,) = res[0].parts
    assert C.family_size(res) == 5 and r.p_eq_adj == pytest.approx(5 * 0.00807, abs=5e-5)
    assert r.verdict == "inconclusive" and not r.negligible
    # a non-inferiority part has no equivalence test, nor a shown one
    ni = Part("ni", "x", "gold reward", +1, 0.05, lambda s: Measured(e, "", ""), noninferiority=True)
    assert math.isnan(V.equivalence_p(ni, e)) and math.isnan(V.equivalence_p(part("no margin", e), e))


def test_the_provenance_table_names_the_designs_redone_after_their_results_were_seen():
    note = redone_text(REDONE)
    assert note.startswith("**Designs redone after their results were seen:**")
    for new, old in (("ref_size", "ref_small"), ("gao_rm_scaling", "rm_size_hacking"),
                     ("rm_source_matched", "rm_source"), ("ppo_beta_grid_wide", "ppo_beta_grid")):
        assert new in REDONE and old in REDONE[new][0]
        assert f"`{new}` replaced `{old}`" in note
    run = RunData("r1", "ppo", "FINISHED", {}, {"rlhf_lab.study": "ref_size", "rlhf_lab.git_commit": "abc1234"},
                  {}, {}, {}, {}, "0")
    report = C.render([], "a runs file", [run])
    table_end = report.index("| `ref_size` |")
    assert report.index(note) > table_end  # under the provenance table, written from designs.REDONE
