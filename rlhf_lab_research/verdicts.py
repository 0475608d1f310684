"""The verdicts of the claims from their effects: one-sided p-values, Holm's correction across every judged effect
of a report, the units an inconclusive effect would need, and the upstream factors (RM, SFT policy) replicated per
arm. :mod:`~rlhf_lab_research.claims` reads the runs and writes the report.

A part's p-value is one-sided: for a judged part or precondition with per-unit values, its anytime-valid sequence's p
from the first look (:mod:`~rlhf_lab_research.anytime`; under the earlier rule, ``rule=EARLIER``, only when its runs
include seeds added after looking, else its t statistic's), on the
side of the null value (0, or −margin for a non-inferiority part) its estimate lies (:func:`side_p`); a superiority
part with a margin also has an equivalence (TOST) p against ±margin (:func:`equivalence_p`). The judged parts and
the preconditions of all the claims judged together are one family, with their equivalence p-values: :func:`correct`
adjusts them all with Holm's step-down method and decides each part at :data:`ALPHA` per side (:func:`decide`: holds
on the claimed side, does not hold on the other, or negligible when its adjusted equivalence p is below ALPHA;
inconclusive otherwise). A
claim holds when every judged part holds and does not hold when one does not; a precondition that is not shown makes
it inconclusive unless a judged part is shown against the claim (:func:`combine`); an RM claim without
``Claim.min_rms`` distinct RMs per arm is inconclusive (:func:`replication_gap`). A shown part is not judged:
:func:`reading` words it from its unadjusted interval and margin (:func:`~rlhf_lab_research.wording.word_effect`)
and says so ("(unadjusted)"): it is outside the family, and no verdict rests on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from rlhf_lab_research.anytime import (EARLIER, FIRST_LOOK, added_run_ids, anytime_needs, anytime_p, is_anytime,
                                      is_refused, judged_anytime, refusal_text, with_anytime)
from rlhf_lab_research.effects import Measured, count
from rlhf_lab.analysis.quantities import EVAL_GOLD
from rlhf_lab_research.claims_registry import CLAIMS, JUDGED, PRECONDITION, SHOWN, Claim, Part
from rlhf_lab.analysis.study_runs import POLICY_STAGES, RunData
from rlhf_lab_research.stats import DOES_NOT_HOLD, HOLDS, INCONCLUSIVE, Effect, holm, units_for_power, verdict
from rlhf_lab_research.wording import word_effect

NOT_RUN = "not run yet"
NOT_TESTABLE = "not testable"
MIN_EVALS = 5  # evaluations a PPO or DPO run needs to count (shorter runs are smoke tests)
ALPHA = 0.025  # one-sided, per side: Holm's family-wise level (the 2.5 % a side of the 95% intervals)
POWER = 0.8    # the power "needs about N seeds" is computed for
NAN = float("nan")


@dataclass
class PartResult:
    part: Part
    measured: Measured
    verdict: str | None  # None for a shown part
    side: int = 0        # the side of the null value the estimate lies on (+1 / −1), 0 without a p-value
    p: float = NAN       # one-sided p on that side (unadjusted)
    p_adj: float = NAN   # Holm-adjusted over the report's family (judged parts and preconditions)
    p_eq: float = NAN    # the equivalence (TOST) p against ±margin, unadjusted (superiority parts with a margin)
    p_eq_adj: float = NAN  # the same, Holm-adjusted in the family
    needs: int | None = None  # units for 80 % power, for an inconclusive effect with a spread
    alpha: float = ALPHA  # the level `needs` was computed for

    @property
    def label(self) -> str:
        """What the part tests, its arms named as the runs gave them (:meth:`Part.label`)."""
        return self.part.label(self.measured)

    @property
    def against(self) -> bool:
        """The effect is shown on the side opposite to the claim (after Holm's correction for a judged part)."""
        return self.verdict == DOES_NOT_HOLD and self.side == -(self.part.direction or 0) and not self.negligible

    @property
    def negligible(self) -> bool:
        """Shown to lie inside ±margin: its (adjusted) equivalence p is below ALPHA."""
        return self.p_eq_adj < ALPHA


@dataclass
class ClaimResult:
    claim: Claim
    verdict: str
    reason: str
    parts: list[PartResult] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)


def study_names(claims: Iterable[Claim] = CLAIMS) -> list[str]:
    return list(dict.fromkeys(s for c in claims for s in c.studies + c.also))


def counts(run: RunData) -> bool:
    """Whether a run enters the verdicts: FINISHED, and a policy run with at least MIN_EVALS evaluations."""
    if run.status != "FINISHED":
        return False
    return run.stage not in POLICY_STAGES or len(run.series(EVAL_GOLD)) >= MIN_EVALS


def null_value(part: Part) -> float:
    """The value a judged effect is tested against: 0, or −margin on the claimed side for a non-inferiority part."""
    return -part.direction * part.margin if part.noninferiority and part.margin is not None else 0.0


def side_p(part: Part, e: Effect | None) -> tuple[int, float]:
    """(side, p): the one-sided p-value of the effect on the side of the null value its estimate lies (the claimed
    side on a tie); (0, NaN) without a t interval (n < 2, or an exact config value)."""
    if part.role == SHOWN or e is None or e.method == "config value":
        return 0, NAN
    null = null_value(part)
    if is_anytime(e):  # seeds added after looking: the anytime-valid p (rlhf_lab_research.anytime)
        p_for, p_other = anytime_p(e, part.direction, null), anytime_p(e, -part.direction, null)
    else:
        p_for, p_other = e.p_value(part.direction, null), e.p_value(-part.direction, null)
    if p_for != p_for:  # NaN
        return 0, NAN
    return (part.direction, p_for) if p_for <= p_other else (-part.direction, p_other)


def equivalence_p(part: Part, e: Effect | None) -> float:
    """The equivalence (TOST) p of a judged part or precondition tested for superiority with a margin: the larger of
    the one-sided p-values against −margin (effect above it) and +margin (effect below it); p < alpha exactly when
    the two-sided 1 − 2·alpha interval lies inside ±margin. An anytime-valid effect uses its sequence's p-values
    (:func:`anytime.anytime_p`). NaN for a shown or non-inferiority part, without a margin, or without a t interval."""
    if (part.role == SHOWN or part.noninferiority or part.margin is None or e is None or e.method == "config value"
            or e.n < 2):
        return NAN
    pf = (lambda d, null: anytime_p(e, d, null)) if is_anytime(e) else e.p_value
    p = max(pf(+1, -part.margin), pf(-1, part.margin))
    return p if p == p else NAN


def decide(part: Part, e: Effect | None, side: int, p: float, alpha: float = ALPHA, p_eq: float = NAN) -> str | None:
    """A part's verdict from the one-sided `p` on `side` and its equivalence p `p_eq` (both adjusted or both not):
    does not hold when p_eq < alpha (negligible, checked first), holds when p < alpha on the claimed side, does not
    hold when p < alpha on the other side, else inconclusive. Without a p-value (an exact config value) the interval
    decides (:func:`stats.verdict`)."""
    if part.role == SHOWN:
        return None
    if e is None:
        return INCONCLUSIVE
    if p != p:
        null = null_value(part)
        return verdict(e.lo - null, e.hi - null, part.direction, None if part.noninferiority else part.margin)
    if p_eq < alpha:
        return DOES_NOT_HOLD
    if p < alpha:
        return HOLDS if side == part.direction else DOES_NOT_HOLD
    return INCONCLUSIVE


def part_result(part: Part, m: Measured, extended: Iterable[str] = (), rule: str = FIRST_LOOK) -> PartResult:
    """A part's result before the correction: its p-values and its verdict at the unadjusted level (its adjusted p
    are its own until :func:`correct` adjusts them in a family). A judged part or precondition gets the anytime-valid
    interval and p (:func:`anytime.judged_anytime`: under `rule` FIRST_LOOK every one with per-unit values, the betting
    sequence within its :attr:`Part.value_bounds`; under EARLIER one whose runs include one of the run ids `extended`,
    seeds added after looking, with the t sequence unchecked, as issue 42 judged it)."""
    if part.role != SHOWN and judged_anytime(m, extended, rule):
        m = with_anytime(m, None if rule == EARLIER else part.value_bounds, check_skew=rule != EARLIER)
    side, p = side_p(part, m.effect)
    p_eq = equivalence_p(part, m.effect)
    return PartResult(part, m, decide(part, m.effect, side, p, ALPHA, p_eq), side, p, p, p_eq, p_eq)


def reading(r: PartResult) -> str:
    """A shown part's effect in words (:func:`word_effect`), '' without words or an effect; a conclusion drawn from
    its interval (a direction, or "no … detected") is marked "(unadjusted)": shown parts are outside Holm's family."""
    e = r.measured.effect
    if r.part.words is None or e is None:
        return ""
    return word_effect(e.lo, e.hi, r.part.margin, r.part.words, note=" (unadjusted)")


def needs(part: Part, e: Effect | None, alpha: float, power: float = POWER) -> int | None:
    """The units (seeds) an inconclusive effect would need for `power` at one-sided level `alpha`, from its
    observed spread (sd of the per-unit values): to detect a true effect of the observed estimate's size, or of the
    margin when that is larger (:func:`stats.units_for_power`). None without a spread or a size to detect."""
    if e is None or e.n < 2 or e.method == "config value":
        return None
    delta = max(abs(e.estimate - null_value(part)), part.margin or 0.0)
    if is_refused(e) or (is_anytime(e) and e.bounds is not None):  # no power formula for these: no figure
        return None
    if is_anytime(e):  # the seeds its anytime-valid sequence would need (rlhf_lab_research.anytime)
        return anytime_needs(delta, e.sd, alpha, power)
    return units_for_power(delta, e.sd, alpha, power)


def needs_text(r: PartResult) -> str:
    """'needs about 23 seeds' (for 80 % power at the level it was computed for), or '' when there is no figure; a
    count of seeds above :data:`DECIDE_CAP` says so: ``rlhf-lab-suite --decide`` leaves it (not worth it here)."""
    if r.needs is None:
        return ""
    above = r.measured.n_of in SEED_UNITS and r.needs > DECIDE_CAP
    return f"needs about {count(r.needs, r.measured.n_of)}" + (
        f", more than the {DECIDE_CAP} `rlhf-lab-suite --decide` spends" if above else "")


def why_open(r: PartResult) -> str:
    """Why an effect has no verdict either way."""
    m = r.measured
    if m.missing:
        return m.missing
    if m.effect is not None and m.effect.n < 2:
        return f"{count(m.effect.n, m.n_of)}: no interval"
    if is_refused(m.effect):
        return refusal_text(m.effect)
    text = f"Holm-adjusted p = {fmt_p(r.p_adj)}, not below {ALPHA:g}"
    return text + (f"; {needs_text(r)}" if r.needs is not None else "")


def fmt_p(p: float) -> str:
    if p != p:
        return "–"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def combine(results: Sequence[PartResult]) -> tuple[str, str]:
    """(verdict, reason) of a claim from its parts' verdicts. A judged effect shown against the claim makes it
    "does not hold" even when a precondition is not shown (the rule of the Statistics paragraph)."""
    judged = [r for r in results if r.part.role == JUDGED]
    against = [r for r in judged if r.against]
    for r in results:
        if r.part.role == PRECONDITION and r.verdict != HOLDS:
            why = "it does not hold" if r.verdict == DOES_NOT_HOLD else why_open(r)
            if against:
                return DOES_NOT_HOLD, ("shown against the claim: " + "; ".join(f"\"{a.label}\"" for a in against)
                                       + f" (although \"{r.label}\" is not shown: {why})")
            return INCONCLUSIVE, f"cannot be tested on these runs: \"{r.label}\" is not shown ({why})"
    failed = [r.label for r in judged if r.verdict == DOES_NOT_HOLD]
    if failed:
        return DOES_NOT_HOLD, "shown not to hold: " + "; ".join(f"\"{s}\"" for s in failed)
    if judged and all(r.verdict == HOLDS for r in judged):
        return HOLDS, "every judged effect holds"
    open_ = [f"\"{r.label}\" ({why_open(r)})" for r in judged if r.verdict != HOLDS]
    return INCONCLUSIVE, "not shown: " + "; ".join(open_)


RM_FIGURES = ("rm/raw_mean", "rm/raw_std", "rm/accuracy")  # held-out figures: exact functions of an RM's weights


def rm_of(r: RunData) -> str:
    """The RM a run measures or is scored by, as what it computes: its held-out figures (:data:`RM_FIGURES`, to the
    last digit), so that an RM built again in another store or cache (the same config, code and CPU kernels: the same
    weights) counts once; else its run (an rm run itself, tag ``rlhf_lab.upstream.rm``, or the RM run the loader
    attached); '' when unknown."""
    m = r.metrics if r.stage == "rm" else (r.rm.get("metrics") or {})
    if all(k in m for k in RM_FIGURES):
        return "figures " + " ".join(repr(m[k]) for k in RM_FIGURES)
    if r.stage == "rm":
        return r.run_id
    return r.tags.get("rlhf_lab.upstream.rm") or str(r.rm.get("run_id") or "")


def sft_of(r: RunData) -> str:
    """The SFT policy a run starts from, as what it computes: its evaluation at step 0 (``eval/gold_reward``, the SFT
    policy on the evaluation prompts, to the last digit), so that one built again elsewhere counts once; else its
    run (tag ``rlhf_lab.upstream.sft``)."""
    start = r.series("eval/gold_reward")[:1] if r.stage != "bon" else []
    if start and start[0][0] == 0:
        return f"start gold {start[0][1]!r}"
    return r.tags.get("rlhf_lab.upstream.sft", "")


UPSTREAM: tuple[tuple[str, Any], ...] = (("RM", rm_of), ("SFT policy", sft_of))


def per_arm(runs: Iterable[RunData], factor: Any) -> dict[tuple, int]:
    """{arm: distinct values of `factor` (a function of a run; '' = unknown, not counted)}; an arm is a run's stage
    and swept setting, seed excluded (``RunData.setting``)."""
    seen: dict[tuple, set] = {}
    for r in runs:
        arm = (r.stage, tuple(sorted(r.setting.items())))
        seen.setdefault(arm, set())
        v = factor(r)
        if v:
            seen[arm].add(v)
    return {k: len(v) for k, v in seen.items()}


def judged_runs(results: Sequence[PartResult]) -> list[RunData]:
    return list({r.run_id: r for p in results if p.part.role != SHOWN for r in p.measured.runs}.values())


def upstream_text(results: Sequence[PartResult]) -> str:
    """Which upstream factors vary within each arm of the judged effects' runs (distinct RMs and SFT policies per arm,
    :func:`rm_of`, :func:`sft_of`): replicated (more than one), or held fixed (one: the verdict is conditional on
    it)."""
    runs = judged_runs(results)
    if not runs:
        return ""
    parts, fixed = [], []
    for name, factor in UPSTREAM:
        counts_ = [n for n in per_arm(runs, factor).values()]
        if not any(counts_):
            parts.append(f"{name}: not logged")
            continue
        lo, hi = min(counts_), max(counts_)
        n = f"{lo}" if lo == hi else f"{lo}–{hi}"
        if hi <= 1:
            fixed.append(name)
            parts.append(f"{name}: 1 per arm (held fixed)")
        else:
            parts.append(f"{name}: {n} per arm ({'replicated' if lo > 1 else 'partly replicated'})")
    cond = f" The verdict is conditional on one {' and one '.join(fixed)}." if fixed else ""
    return ("**Upstream factors** (distinct RMs and SFT policies per arm of the judged effects, told apart by what "
            "they compute: an RM's held-out figures, the policy's gold at step 0): " + "; ".join(parts) + "." + cond)


def replication_gap(claim: Claim, results: Sequence[PartResult]) -> str:
    """'' when the claim needs no replicated RM or its arms have enough distinct RMs; else why not."""
    if not claim.min_rms:
        return ""
    per = per_arm(judged_runs(results), rm_of)
    if not per:
        return ""
    fewest = min(per.values())
    if fewest >= claim.min_rms:
        return ""
    return (f"not replicated: {count(fewest, 'RMs')} per arm (a claim about the RM needs ≥ {claim.min_rms} distinct "
            "RMs per arm; these intervals cover the other seeds' randomness only)")


def default_command(study: str) -> str:
    return f"rlhf-lab -m sweep={study}"


def judge(claim: Claim, studies: dict[str, list[RunData]], present: dict[str, int],
          commands: dict[str, list[str]] | None = None, extended: frozenset[str] | None = None,
          rule: str = FIRST_LOOK) -> ClaimResult:
    """One claim's effects and its verdict at the unadjusted level (each judged effect on its own): `studies` holds
    the runs that count, `present` how many runs each study has. :func:`judge_all` corrects across claims.
    `extended`: the run ids of seeds added after looking (:func:`anytime.added_run_ids` of `studies`, read here
    when not given); `rule`: which effects take a sequence (:func:`part_result`)."""
    commands = commands or {}
    cmds = [c for s in claim.studies + claim.also for c in (commands.get(s) or [default_command(s)])]
    if claim.untestable:
        return ClaimResult(claim, NOT_TESTABLE, claim.untestable)
    missing = [s for s in claim.studies if not present.get(s)]
    if missing:
        return ClaimResult(claim, NOT_RUN, "no runs of " + ", ".join(f"`{s}`" for s in missing) + "; run "
                           + " and ".join(f"`{default_command(s)}`" for s in missing), commands=cmds)
    results = []
    extended = added_run_ids(studies) if extended is None else extended
    for part in claim.parts:
        try:
            m = part.compute(studies)
        except Exception as err:  # an effect that cannot be computed is no evidence either way
            m = Measured(None, missing=f"could not compute: {type(err).__name__}: {err}")
        results.append(part_result(part, m, extended, rule))
    return conclude(ClaimResult(claim, "", "", results, cmds), studies, present)


def conclude(res: ClaimResult, studies: dict[str, list[RunData]], present: dict[str, int]) -> ClaimResult:
    """Set a measured claim's verdict and reason from its parts' verdicts (:func:`combine`), the replication of its
    RM (:func:`replication_gap`) and its studies' unusable runs."""
    v, reason = combine(res.parts)
    gap = replication_gap(res.claim, res.parts)
    if gap:
        v, reason = INCONCLUSIVE, f"{gap}; {reason}"
    unusable = [s for s in res.claim.studies if not studies.get(s)]
    if unusable:
        reason += "; " + ", ".join(f"`{s}` has {present[s]} runs, none FINISHED with ≥ {MIN_EVALS} evaluations"
                                   for s in unusable)
    res.verdict, res.reason = v, reason
    return res


def family(results: Sequence[ClaimResult]) -> list[tuple[PartResult, str]]:
    """Holm's family of `results`: (part, "p" or "p_eq") for the one-sided p of every judged part and precondition
    with one, and the equivalence p of every such part with one (:func:`equivalence_p`)."""
    return [(p, k) for r in results for p in r.parts if p.part.role != SHOWN for k in ("p", "p_eq")
            if getattr(p, k) == getattr(p, k)]


def correct(results: Sequence[ClaimResult], alpha: float = ALPHA) -> int:
    """Holm's correction across the family of `results` (:func:`family`: judged parts and preconditions, their
    one-sided and equivalence p-values), in place: each part gets its adjusted p-values and verdict, each
    inconclusive one the units 80 % power would need (at alpha / m, Holm's strictest step, which makes it hold after
    the correction whatever the others), and each claim its verdict again. Returns m, the size of the family."""
    fam = family(results)
    m = len(fam)
    for (p, k), adj in zip(fam, holm([getattr(p, k) for p, k in fam])):
        setattr(p, k + "_adj", adj)
    for r in results:
        for p in r.parts:
            if p.part.role == SHOWN:
                continue
            p.verdict = decide(p.part, p.measured.effect, p.side, p.p_adj, alpha, p.p_eq_adj)
            if p.verdict == INCONCLUSIVE:
                p.alpha = alpha / max(m, 1)
                p.needs = needs(p.part, p.measured.effect, p.alpha)
    return m


SEED_UNITS = ("seeds", "RM seeds")  # units that are one seed each: more seeds give more of them
DECIDE_CAP = 30  # the most seeds per study `rlhf-lab-suite --decide` spends by default: more is not worth it here


def seeds_to_decide(results: Sequence[ClaimResult], cap: int) -> dict[str, int]:
    """{study a claim names: the seeds that would give 80 % power to its inconclusive judged effects}: for each
    inconclusive claim, the largest `needs` among its judged effects counted in seeds that need at most `cap`
    (an effect that needs more is left to the report's "needs about N seeds"), for each of its studies; the largest
    over the claims that name a study."""
    out: dict[str, int] = {}
    for r in results:
        if r.verdict != INCONCLUSIVE:
            continue
        ns = [p.needs for p in r.parts if p.part.role == JUDGED and p.verdict == INCONCLUSIVE and p.needs is not None
              and p.measured.n_of in SEED_UNITS and p.needs <= cap]
        if ns:
            for s in r.claim.studies:
                out[s] = max(out.get(s, 0), max(ns))
    return out


def judge_all(claims: Sequence[Claim], studies: dict[str, list[RunData]], present: dict[str, int],
              commands: dict[str, list[str]] | None = None, rule: str = FIRST_LOOK) -> list[ClaimResult]:
    """Every claim's verdict, with Holm's correction across all judged effects of these claims (:func:`correct`);
    `rule`: which effects take a sequence (:func:`part_result`; EARLIER gives the results of issue 42's rule)."""
    extended = added_run_ids(studies)  # once for every claim: it reads each study's file
    results = [judge(c, studies, present, commands, extended, rule) for c in claims]
    correct(results)
    for r in results:
        if r.parts:
            conclude(r, studies, present)
    return results
