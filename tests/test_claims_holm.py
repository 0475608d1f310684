"""The claims report across claims: Holm's correction over every judged effect of the report, the rule that an effect
shown against the claim decides it even when a precondition fails, the units an inconclusive effect would need, and
the upstream factors (RM, SFT policy) replicated or held fixed per arm, and the words of a shown effect, read off its
interval and margin. Synthetic effects and runs, no training."""

from __future__ import annotations

import math

import pytest
from scipy import stats as st

from rlhf_lab_research import claims as C
from rlhf_lab_research import verdicts as V
from rlhf_lab_research.effects import Measured
from rlhf_lab_research.claims_registry import JUDGED, PRECONDITION, Claim, Part, shown
from rlhf_lab.analysis.study_runs import RunData
from rlhf_lab_research.stats import Effect, units_for_power
from rlhf_lab_research.wording import Words, word_effect

N = 5  # units per synthetic effect


def effect_with_p(p: float, se: float = 0.1, n: int = N) -> Effect:
    """A t effect over n units whose one-sided p (toward +) is p, with standard error se."""
    est = float(st.t.isf(p, n - 1)) * se
    h = float(st.t.ppf(0.975, n - 1)) * se
    return Effect(est, est - h, est + h, n, "t")


def part(says: str, e: Effect | None, role: str = JUDGED, direction: int = 1, margin: float | None = None,
         runs: tuple = ()) -> Part:
    return Part(says, "synthetic", "gold reward", direction, margin,
                lambda studies, e=e: Measured(e, "", "" if e else "no runs", runs), role)


def claim(cid: str, *parts: Part, min_rms: int = 0) -> Claim:
    return Claim(cid, f"claim {cid}", ("s",), tuple(parts), min_rms=min_rms)


def judge(*claims: Claim) -> dict[str, V.ClaimResult]:
    return {r.claim.id: r for r in V.judge_all(claims, {"s": []}, {"s": 1})}


def test_an_effect_with_p_0_009_holds_alone_but_not_after_holm_among_30():
    alone = judge(claim("X1", part("the effect", effect_with_p(0.009))))["X1"]
    assert alone.verdict == "holds" and alone.parts[0].p == pytest.approx(0.009, rel=1e-6)
    assert alone.parts[0].p_adj == pytest.approx(0.009, rel=1e-6)
    others = [claim(f"Y{i}", part(f"other {i}", effect_with_p(0.5))) for i in range(29)]
    res = judge(claim("X1", part("the effect", effect_with_p(0.009))), *others)
    x = res["X1"].parts[0]
    assert x.p == pytest.approx(0.009, rel=1e-6) and x.p_adj == pytest.approx(30 * 0.009, rel=1e-6)
    assert x.verdict == "inconclusive" and res["X1"].verdict == "inconclusive"
    assert x.measured.effect.lo > 0  # the unadjusted interval still excludes 0: it is shown beside the verdict
    # a very small p survives: 30 · 0.0005 = 0.015 < 0.025
    res = judge(claim("X1", part("the effect", effect_with_p(0.0005))), *others)
    assert res["X1"].verdict == "holds" and res["X1"].parts[0].p_adj == pytest.approx(0.015, rel=1e-6)


def test_the_family_is_every_judged_effect_and_precondition_with_a_p_value_not_shown_or_missing():
    res = judge(claim("X1", part("pre", effect_with_p(0.001), PRECONDITION), part("a", effect_with_p(0.01)),
                      part("b", effect_with_p(0.02)), part("gone", None)),
                claim("X2", part("c", effect_with_p(0.3))))
    pre, a, b = res["X1"].parts[:3]
    # Holm over {0.001, 0.01, 0.02, 0.3}: 4·0.001 = 0.004, 3·0.01 = 0.03, max(0.03, 2·0.02) = 0.04, 0.3
    assert (a.p_adj, b.p_adj) == pytest.approx((0.03, 0.04)) and res["X2"].parts[0].p_adj == pytest.approx(0.3)
    assert pre.p_adj == pytest.approx(0.004) and pre.verdict == "holds"  # the precondition is in the family
    assert math.isnan(res["X1"].parts[3].p) and res["X1"].parts[3].verdict == "inconclusive"
    assert C.family_size(list(res.values())) == 4


def test_a_judged_effect_against_the_claim_decides_it_even_when_the_precondition_fails():
    against = effect_with_p(0.9999)  # estimate far below 0: p toward the claim ≈ 1, against it ≈ 0.0001
    res = judge(claim("X1", part("pre", effect_with_p(0.4), PRECONDITION), part("the effect", against)))["X1"]
    e = res.parts[1]
    assert e.side == -1 and e.p == pytest.approx(1e-4, rel=1e-3) and e.verdict == "does not hold" and e.against
    assert res.verdict == "does not hold" and res.reason.startswith("shown against the claim: \"the effect\"")
    assert "although \"pre\" is not shown" in res.reason
    # inconclusive against the claim: the failed precondition still makes the claim inconclusive
    res = judge(claim("X1", part("pre", effect_with_p(0.4), PRECONDITION), part("the effect", effect_with_p(0.9))))
    assert res["X1"].verdict == "inconclusive" and "cannot be tested" in res["X1"].reason
    # negligible (inside ±margin) is "does not hold" but not "against": the failed precondition wins
    tiny = Effect(0.001, -0.01, 0.012, N, "t")
    res = judge(claim("X1", part("pre", effect_with_p(0.4), PRECONDITION), part("tiny", tiny, margin=0.05)))["X1"]
    assert res.parts[1].verdict == "does not hold" and not res.parts[1].against and res.verdict == "inconclusive"


def test_an_inconclusive_effect_states_the_units_80_percent_power_would_need():
    e = effect_with_p(0.2, se=0.1)  # sd = se·√5 ≈ 0.224, estimate ≈ 0.094
    res = judge(claim("X1", part("open", e, margin=0.05)), claim("X2", part("other", effect_with_p(0.5))))
    r = res["X1"].parts[0]
    assert r.verdict == "inconclusive" and r.alpha == pytest.approx(0.025 / 3)  # m = 3 (with its TOST p)
    assert r.needs == units_for_power(e.estimate, e.sd, 0.025 / 3) and r.needs > N
    section = "\n".join(C.claim_section(res["X1"]))
    above = f", more than the {V.DECIDE_CAP} `rlhf-lab-suite --decide` spends"  # r.needs is 63: above the cap
    assert f"**inconclusive** (needs about {r.needs} seeds{above})" in section
    assert f"needs about {r.needs} seeds{above}" in res["X1"].reason
    # the margin when it is larger than the estimate
    small = effect_with_p(0.45, se=0.1)
    r = judge(claim("X1", part("open", small, margin=0.15)))["X1"].parts[0]
    # m = 2: its one-sided p and its TOST p
    assert r.verdict == "inconclusive" and r.needs == units_for_power(0.15, small.sd, 0.025 / 2)
    assert r.needs <= V.DECIDE_CAP and V.needs_text(r) == f"needs about {r.needs} seeds"  # within the cap: no more
    # a precondition is in the family too: its units are for 0.025 / m (m = 3)
    r = judge(claim("X1", part("pre", e, PRECONDITION), part("x", effect_with_p(0.01))),
              claim("X2", part("y", effect_with_p(0.5))))["X1"].parts[0]
    assert r.alpha == pytest.approx(0.025 / 3) and r.needs == units_for_power(e.estimate, e.sd, 0.025 / 3)


def test_the_report_shows_holm_p_beside_the_unadjusted_interval_and_states_the_family(tmp_path):
    others = [claim(f"Y{i}", part(f"other {i}", effect_with_p(0.5))) for i in range(29)]
    results = V.judge_all([claim("X1", part("the effect", effect_with_p(0.009))), *others], {"s": []}, {"s": 1})
    text = C.render(results, "`memory`", [])
    assert "m = 30" in text and "Holm's step-down correction at a family-wise level of 0.025 per side" in text
    row = next(line for line in text.splitlines() if line.startswith("| X1 "))
    assert row.endswith("| 0.270 | **inconclusive** |")
    effect_row = next(line for line in text.splitlines() if line.startswith("| judged | the effect"))
    cells = [c.strip() for c in effect_row.strip("|").split("|")]
    e = results[0].parts[0].measured.effect
    assert cells[3] == f"{e.estimate:.3f} [{e.lo:.3f}, {e.hi:.3f}] gold reward" and e.lo > 0
    assert cells[6:8] == ["0.009", "0.270"] and cells[8].startswith("**inconclusive** (needs about ")
    against = V.judge_all([claim("X1", part("e", effect_with_p(0.99995)))], {"s": []}, {"s": 1})
    text = C.render(against, "`memory`", [])
    assert "| < 0.001 against | **does not hold** |" in text and "| < 0.001 (against) | < 0.001 |" in text


def run(stage: str, seed: int, setting: dict, rm: str = "", sft: str = "sft0") -> RunData:
    tags = {k: v for k, v in (("rlhf_lab.upstream.rm", rm), ("rlhf_lab.upstream.sft", sft)) if v}
    return RunData(f"{stage}-{setting}-{seed}-{rm}", stage, "FINISHED", {}, tags, {}, setting=setting, seed=str(seed))


def test_upstream_factors_are_counted_per_arm_from_the_runs():
    shared = tuple(run("ppo", s, {"x": a}, rm="rm0") for s in range(5) for a in ("1", "2"))
    replicated = tuple(run("ppo", s, {"x": a}, rm=f"rm{s}") for s in range(5) for a in ("1", "2"))
    e = effect_with_p(0.001)
    one = judge(claim("X1", part("e", e, runs=shared), min_rms=5))["X1"]
    assert one.verdict == "inconclusive" and one.reason.startswith("not replicated: 1 RM per arm")
    text = V.upstream_text(one.parts)
    assert "RM: 1 per arm (held fixed)" in text and "SFT policy: 1 per arm (held fixed)" in text
    assert "conditional on one RM and one SFT policy" in text
    five = judge(claim("X1", part("e", e, runs=replicated), min_rms=5))["X1"]
    assert five.verdict == "holds", five.reason
    text = V.upstream_text(five.parts)
    assert "RM: 5 per arm (replicated)" in text and "conditional on one SFT policy." in text
    assert "**Upstream factors**" in "\n".join(C.claim_section(five))
    # an rm run is its own RM; runs that name no RM are not counted
    rms = tuple(run("rm", s, {"r": "8"}) for s in range(5))
    assert V.per_arm(rms, V.rm_of) == {("rm", (("r", "8"),)): 5}
    untagged = tuple(run("ppo", s, {"x": "1"}) for s in range(5))
    res = judge(claim("X1", part("e", e, runs=untagged), min_rms=5))["X1"]
    assert res.verdict == "inconclusive" and "0 RMs per arm" in res.reason
    assert "RM: not logged" in V.upstream_text(res.parts)
    # a claim that is not about the RM needs no replication
    assert judge(claim("X1", part("e", e, runs=shared)))["X1"].verdict == "holds"


def test_seeds_to_decide_takes_the_largest_need_up_to_the_cap_per_study():
    a = claim("X1", part("a", effect_with_p(0.2, se=0.1)), part("b", effect_with_p(0.3, se=0.1)))
    b = claim("X2", part("c", effect_with_p(0.001)))  # holds: nothing to add
    res = V.judge_all([a, b], {"s": []}, {"s": 1})
    needs = sorted(p.needs for p in res[0].parts)
    assert needs[0] < needs[1]
    assert V.seeds_to_decide(res, cap=needs[1]) == {"s": needs[1]}
    assert V.seeds_to_decide(res, cap=needs[1] - 1) == {"s": needs[0]}  # b's effect needs more than the cap
    assert V.seeds_to_decide(res, cap=needs[0] - 1) == {}
    assert V.seeds_to_decide(res[1:], cap=1000) == {}


# -- shown effects: worded from their interval and margin, never from a hand-written conclusion (issue 42, point 6) --

GOLD_WORDS = Words("more gold with the shared base", "costs gold", "no gold cost detected")


def test_an_interval_below_zero_reads_as_a_cost_with_its_numbers():
    # C6 as the committed runs measured it: the label once said "costs no gold"
    assert word_effect(-0.078, -0.009, 0.05, GOLD_WORDS) == "costs gold"
    assert word_effect(-0.078, -0.009, 0.05, GOLD_WORDS, estimate=-0.044, unit="gold reward") == \
        "costs gold: -0.044 [-0.078, -0.009] gold reward"
    # below 0 but inside the margin: a cost, and a small one
    assert word_effect(-0.04, -0.01, 0.05, GOLD_WORDS) == "costs gold (by less than ±0.05)"


def test_an_interval_above_zero_reads_as_the_other_side():
    assert word_effect(0.093, 0.315, 0.05, GOLD_WORDS) == "more gold with the shared base"
    assert word_effect(0.01, 0.03, 0.05, GOLD_WORDS, estimate=0.02) == \
        "more gold with the shared base (by less than ±0.05): 0.020 [0.010, 0.030]"


def test_no_cost_is_said_only_when_the_interval_lies_inside_the_margin():
    assert word_effect(-0.012, 0.016, 0.05, GOLD_WORDS) == "no gold cost detected (inside ±0.05)"
    assert word_effect(-0.05, 0.05, 0.05, GOLD_WORDS) == "no gold cost detected (inside ±0.05)"  # the bounds count
    assert word_effect(0.0, 0.0, 0.01, Words("KL above 0", "KL below 0", "KL ≡ 0")) == "KL ≡ 0 (inside ±0.01)"
    # without a margin nothing is negligible
    assert word_effect(-0.012, 0.016, None, GOLD_WORDS) == "inconclusive (the interval spans 0)"


def test_an_interval_straddling_zero_beyond_the_margin_is_inconclusive():
    # C11 as the committed runs measured it: the label once said "at no cost in gold"
    assert word_effect(-1.685, 0.882, 0.05, GOLD_WORDS) == \
        "inconclusive (the interval spans 0 and reaches past ±0.05)"
    assert word_effect(-0.03, 0.08, 0.05, GOLD_WORDS, estimate=0.025) == \
        "inconclusive (the interval spans 0 and reaches past ±0.05): 0.025 [-0.030, 0.080]"
    assert word_effect(math.nan, math.nan, 0.05, GOLD_WORDS, estimate=0.3) == "no interval: 0.300"


def test_a_shown_part_reads_its_words_off_the_interval_in_the_report():
    def shown_result(e: Effect | None) -> V.PartResult:
        p = shown("gold with the shared base instead of the copy", "synthetic", "gold reward",
                  lambda studies: Measured(e, "", "" if e else "no runs"), GOLD_WORDS, 0.05)
        res = judge(claim("X1", part("j", effect_with_p(0.001)), p))["X1"]
        return res.parts[1]

    cost = shown_result(Effect(-0.044, -0.078, -0.009, 5, "paired t"))
    assert cost.verdict is None and C.verdict_cell(cost) == "shown: costs gold (unadjusted)"
    assert C.margin_cell(cost.part) == "–, ±0.05"
    assert C.verdict_cell(shown_result(Effect(0.002, -0.012, 0.016, 5, "t"))) == \
        "shown: no gold cost detected (inside ±0.05) (unadjusted)"
    assert C.verdict_cell(shown_result(Effect(0.002, -0.1, 0.1, 5, "t"))) == \
        "shown: inconclusive (the interval spans 0 and reaches past ±0.05)"  # no conclusion: nothing to qualify
    assert C.verdict_cell(shown_result(None)) == "shown"  # nothing measured: nothing to word


def test_a_label_names_the_only_value_that_ran_when_largest_and_smallest_coincide():
    """C11: only α ∈ {0, 0.1} ran, so "the largest α" and "the smallest α > 0" are one arm; the label says so."""
    runs = [RunData(f"r{a}-{s}", "ppo", "FINISHED", {"sweep.algo.length_penalty": str(a)}, {},
                    {"test/gold_reward": 0.5 + 0.01 * s}, {}, {}, {"algo.length_penalty": str(a)}, str(s))
            for a in (0.0, 0.1) for s in range(5)]
    studies = {"length_penalty": runs}
    c11 = {p.part.effect: p for p in judge_c11(studies).parts}
    largest, smallest = (c11[f"final gold: {w} − α = 0, per seed"] for w in ("largest α", "smallest α > 0"))
    only = "the only α > 0 that ran, 0.1 (algo.length_penalty ran: 0, 0.1)"
    assert largest.label == smallest.label == f"gold with the penalty at {only}"
    assert largest.part.label(largest.measured, ran=False) == "gold with the penalty at largest α"
    # with several values above 0, each arm names its own
    more = runs + [RunData(f"r0.01-{s}", "ppo", "FINISHED", {"sweep.algo.length_penalty": "0.01"}, {},
                           {"test/gold_reward": 0.5}, {}, {}, {"algo.length_penalty": "0.01"}, str(s))
                   for s in range(5)]
    c11 = {p.part.effect: p for p in judge_c11({"length_penalty": more}).parts}
    assert c11["final gold: largest α − α = 0, per seed"].label == \
        "gold with the penalty at largest α (algo.length_penalty = 0.1)"
    assert c11["final gold: smallest α > 0 − α = 0, per seed"].label == \
        "gold with the penalty at smallest α (algo.length_penalty = 0.01)"


def judge_c11(studies: dict) -> V.ClaimResult:
    from rlhf_lab_research.claims_registry import BY_ID

    return V.judge(BY_ID["C11"], studies, {k: len(v) for k, v in studies.items()})
