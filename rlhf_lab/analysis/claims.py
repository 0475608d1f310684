"""``reports/claims.md``: a verdict on each claim of docs/claims.md, from the runs of the canned studies.

The claims, the studies that test them and the effects they are judged on are data
(:mod:`~rlhf_lab.analysis.registry`). Each effect has its 95% t interval and a one-sided p-value (its t statistic,
on the side of the null value its estimate lies). The judged effects of the whole report form one family, and
their verdicts use Holm's step-down correction at a family-wise 2.5 % per side (:func:`judge_all`): **holds** when
the Holm-adjusted p is below 0.025 on the claimed side; **does not hold** when it is below 0.025 on the other side
or the unadjusted interval lies inside the equivalence margin; **inconclusive** otherwise (also when fewer than two
seeds give the interval), with the units that 80 % power would need (:func:`needs`). A claim holds when all its
judged effects hold and does not hold when one of them does not, even when a precondition fails if that effect
goes against the claim; a precondition (judged on its unadjusted interval) that is not shown to hold makes it
inconclusive otherwise. An RM claim whose arms have fewer than ``Claim.min_rms`` distinct RMs is inconclusive
("not replicated").
A claim whose studies have no runs is **not run yet** (with the command), one that is no effect is
**not testable**. Only FINISHED runs count, and policy runs (PPO, GRPO, RLOO, DPO, best-of-n) need :data:`MIN_EVALS` evaluations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from rlhf_lab.analysis.effects import Measured, count
from rlhf_lab.analysis.markdown import fmt, md_table
from rlhf_lab.analysis.quantities import CLAIM_HISTORY_KEYS, EVAL_GOLD, final_gold_source, half_curves
from rlhf_lab.analysis.registry import CLAIMS, JUDGED, PRECONDITION, SHOWN, SUITE_VERSIONS, Claim, Part
from rlhf_lab.analysis.runs import POLICY_STAGES, RunData, load_study, store_uri
from rlhf_lab.analysis.snapshot import FILE_NAME, merge, merge_commands, read_snapshot, write_snapshot
from rlhf_lab.analysis.stats import DOES_NOT_HOLD, HOLDS, INCONCLUSIVE, Effect, holm, units_for_power, verdict
from rlhf_lab.runtime import write_atomic

NOT_RUN = "not run yet"
NOT_TESTABLE = "not testable"
MIN_EVALS = 5  # evaluations a PPO or DPO run needs to count (shorter runs are smoke tests)
LEVEL = 0.95
ALPHA = 0.025  # one-sided, per side: Holm's family-wise level (the 2.5 % a side of the 95% intervals)
POWER = 0.8    # the power "needs about N seeds" is computed for
CLAIM_STAGES = (*POLICY_STAGES, "rm")
NAN = float("nan")


@dataclass
class PartResult:
    part: Part
    measured: Measured
    verdict: str | None  # None for a shown part
    side: int = 0        # the side of the null value the estimate lies on (+1 / −1), 0 without a p-value
    p: float = NAN       # one-sided p on that side (unadjusted)
    p_adj: float = NAN   # Holm-adjusted over the report's judged effects (judged parts only)
    needs: int | None = None  # units for 80 % power, for an inconclusive effect with a spread
    alpha: float = ALPHA  # the level `needs` was computed for

    @property
    def against(self) -> bool:
        """The effect is shown on the side opposite to the claim (after Holm's correction for a judged part)."""
        return self.verdict == DOES_NOT_HOLD and self.side == -(self.part.direction or 0) and not negligible(
            self.part, self.measured.effect)


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
    p_for, p_other = e.p_value(part.direction, null), e.p_value(-part.direction, null)
    if p_for != p_for:  # NaN
        return 0, NAN
    return (part.direction, p_for) if p_for <= p_other else (-part.direction, p_other)


def negligible(part: Part, e: Effect | None) -> bool:
    """A superiority part whose (unadjusted) interval lies inside ±margin: the effect is shown to be negligible."""
    return (e is not None and not part.noninferiority and part.margin is not None and e.lo == e.lo and e.hi == e.hi
            and -part.margin <= e.lo and e.hi <= part.margin)


def decide(part: Part, e: Effect | None, side: int, p: float, alpha: float = ALPHA) -> str | None:
    """A part's verdict from the one-sided `p` on `side` (adjusted or not): holds when p < alpha on the claimed side,
    does not hold when p < alpha on the other side or the effect is negligible (:func:`negligible`), else
    inconclusive. Without a p-value (an exact config value) the interval decides (:func:`stats.verdict`)."""
    if part.role == SHOWN:
        return None
    if e is None:
        return INCONCLUSIVE
    if p != p:
        null = null_value(part)
        return verdict(e.lo - null, e.hi - null, part.direction, None if part.noninferiority else part.margin)
    if negligible(part, e):
        return DOES_NOT_HOLD
    if p < alpha:
        return HOLDS if side == part.direction else DOES_NOT_HOLD
    return INCONCLUSIVE


def part_result(part: Part, m: Measured) -> PartResult:
    """A part's result before the correction: its p-value and its verdict at the unadjusted level."""
    side, p = side_p(part, m.effect)
    return PartResult(part, m, decide(part, m.effect, side, p), side, p)


def needs(part: Part, e: Effect | None, alpha: float, power: float = POWER) -> int | None:
    """The units (seeds) an inconclusive effect would need for `power` at one-sided level `alpha`, from its
    observed spread (sd of the per-unit values): to detect a true effect of the observed estimate's size, or of the
    margin when that is larger (:func:`stats.units_for_power`). None without a spread or a size to detect."""
    if e is None or e.n < 2 or e.method == "config value":
        return None
    delta = max(abs(e.estimate - null_value(part)), part.margin or 0.0)
    return units_for_power(delta, e.sd, alpha, power)


def needs_text(r: PartResult) -> str:
    """'needs about 23 seeds' (for 80 % power at the level it was computed for), or '' when there is no figure."""
    if r.needs is None:
        return ""
    return f"needs about {count(r.needs, r.measured.n_of)}"


def why_open(r: PartResult) -> str:
    """Why an effect has no verdict either way."""
    m = r.measured
    if m.missing:
        return m.missing
    if m.effect is not None and m.effect.n < 2:
        return f"{count(m.effect.n, m.n_of)}: no interval"
    what = "Holm-adjusted p" if r.part.role == JUDGED else "p"
    text = f"{what} = {fmt_p(r.p_adj if r.part.role == JUDGED else r.p)}, not below {ALPHA:g}"
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
                return DOES_NOT_HOLD, (f"shown against the claim: " + "; ".join(f"\"{a.part.says}\"" for a in against)
                                       + f" (although \"{r.part.says}\" is not shown: {why})")
            return INCONCLUSIVE, f"cannot be tested on these runs: \"{r.part.says}\" is not shown ({why})"
    failed = [r.part.says for r in judged if r.verdict == DOES_NOT_HOLD]
    if failed:
        return DOES_NOT_HOLD, "shown not to hold: " + "; ".join(f"\"{s}\"" for s in failed)
    if judged and all(r.verdict == HOLDS for r in judged):
        return HOLDS, "every judged effect holds"
    open_ = [f"\"{r.part.says}\" ({why_open(r)})" for r in judged if r.verdict != HOLDS]
    return INCONCLUSIVE, "not shown: " + "; ".join(open_)


def rm_of(r: RunData) -> str:
    """The RM a run measures or is scored by: an rm run itself, else its upstream RM (tag ``rlhf_lab.upstream.rm``,
    else the RM run the loader attached); '' when unknown."""
    if r.stage == "rm":
        return r.run_id
    return r.tags.get("rlhf_lab.upstream.rm") or str(r.rm.get("run_id") or "")


def sft_of(r: RunData) -> str:
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
    """Which upstream factors vary within each arm of the judged effects' runs (distinct ``rlhf_lab.upstream.*``
    per arm): replicated (more than one), or held fixed (one: the verdict is conditional on it)."""
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
    return "**Upstream factors** (distinct `rlhf_lab.upstream.*` per arm of the judged effects): " + "; ".join(parts) + "." + cond


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
          commands: dict[str, list[str]] | None = None) -> ClaimResult:
    """One claim's effects and its verdict at the unadjusted level (each judged effect on its own): `studies` holds
    the runs that count, `present` how many runs each study has. :func:`judge_all` corrects across claims."""
    commands = commands or {}
    cmds = [c for s in claim.studies + claim.also for c in (commands.get(s) or [default_command(s)])]
    if claim.untestable:
        return ClaimResult(claim, NOT_TESTABLE, claim.untestable)
    missing = [s for s in claim.studies if not present.get(s)]
    if missing:
        return ClaimResult(claim, NOT_RUN, "no runs of " + ", ".join(f"`{s}`" for s in missing) + "; run "
                           + " and ".join(f"`{default_command(s)}`" for s in missing), commands=cmds)
    results = []
    for part in claim.parts:
        try:
            m = part.compute(studies)
        except Exception as err:  # an effect that cannot be computed is no evidence either way
            m = Measured(None, missing=f"could not compute: {type(err).__name__}: {err}")
        results.append(part_result(part, m))
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


def correct(results: Sequence[ClaimResult], alpha: float = ALPHA) -> int:
    """Holm's correction across every judged effect with a p-value in `results` (the family), in place: each judged
    part gets its adjusted p and verdict, each inconclusive part the units 80 % power would need (judged: at
    alpha / m, Holm's strictest step, which makes it hold after the correction whatever the others; precondition:
    at alpha), and each claim its verdict again. Returns m, the size of the family."""
    family = [p for r in results for p in r.parts if p.part.role == JUDGED and p.p == p.p]
    m = len(family)
    for p, adj in zip(family, holm([p.p for p in family])):
        p.p_adj = adj
        p.verdict = decide(p.part, p.measured.effect, p.side, adj, alpha)
    for r in results:
        for p in r.parts:
            if p.verdict == INCONCLUSIVE:
                p.alpha = alpha / max(m, 1) if p.part.role == JUDGED else alpha
                p.needs = needs(p.part, p.measured.effect, p.alpha)
    return m


SEED_UNITS = ("seeds", "RM seeds")  # units that are one seed each: more seeds give more of them


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
              commands: dict[str, list[str]] | None = None) -> list[ClaimResult]:
    """Every claim's verdict, with Holm's correction across all judged effects of these claims (:func:`correct`)."""
    results = [judge(c, studies, present, commands) for c in claims]
    correct(results)
    for r in results:
        if r.parts:
            conclude(r, studies, present)
    return results


def load_claim_runs(uri: str | None = None, names: Sequence[str] | None = None
                    ) -> tuple[dict[str, list[RunData]], dict[str, list[str]]]:
    """({study: all its runs}, {study: the commands of its sweep parents}) from the store: a study's 5-seed rerun
    (``SUITE_VERSIONS``, newest first) when some of its runs count, else the study the claim names."""
    studies, commands = {}, {}
    for name in names or study_names():
        runs, parents = [], []
        for version in SUITE_VERSIONS.get(name, ()):  # the claims suite's reruns, newest design first
            runs, parents = load_study(version, uri, stages=CLAIM_STAGES, history_keys=CLAIM_HISTORY_KEYS)
            if any(counts(r) for r in runs):
                break
        if not any(counts(r) for r in runs):
            runs, parents = load_study(name, uri, stages=CLAIM_STAGES, history_keys=CLAIM_HISTORY_KEYS)
        studies[name] = runs
        commands[name] = sorted({p.data.tags["rlhf_lab.command"] for p in parents
                                 if p.data.tags.get("rlhf_lab.command")})
    return studies, commands


def counted(studies: dict[str, list[RunData]]) -> tuple[dict[str, list[RunData]], dict[str, int]]:
    """({study: the runs that count}, {study: how many runs it has})."""
    return {k: [r for r in v if counts(r)] for k, v in studies.items()}, {k: len(v) for k, v in studies.items()}


def load_claim_studies(uri: str | None = None, names: Sequence[str] | None = None
                       ) -> tuple[dict[str, list[RunData]], dict[str, int], dict[str, list[str]]]:
    """({study: runs that count}, {study: all its runs}, {study: the commands of its sweep parents})."""
    runs, commands = load_claim_runs(uri, names)
    return (*counted(runs), commands)


def gather_runs(uri: str | None, runs_files: Sequence[Path | str] = (), use_store: bool = True
                ) -> tuple[dict[str, list[RunData]], dict[str, list[str]]]:
    """The claims studies' runs from the store (unless not `use_store`) and from runs files (:mod:`snapshot`),
    united by run id; where a run is in both, the store's copy."""
    runs: dict[str, list[RunData]] = {}
    commands: dict[str, list[str]] = {}
    for f in runs_files:
        s, c = read_snapshot(f)
        runs, commands = merge(runs, s, SUITE_VERSIONS, counts), merge_commands(commands, c)
    if use_store:
        s, c = load_claim_runs(uri)
        runs, commands = merge(runs, s, SUITE_VERSIONS, counts), merge_commands(commands, c)
    for name in study_names():
        runs.setdefault(name, [])
    return runs, commands


def evaluate_claims(uri: str | None = None, studies: dict[str, list[RunData]] | None = None,
                    claims: Sequence[Claim] = CLAIMS) -> list[ClaimResult]:
    """Every claim's verdict, from the store at `uri` or from `studies` ({study: runs}, e.g. built in memory)."""
    if studies is None:
        runs, present, commands = load_claim_studies(uri, study_names(claims))
    else:
        present = {k: len(v) for k, v in studies.items()}
        runs, commands = {k: [r for r in v if counts(r)] for k, v in studies.items()}, {}
    return judge_all(claims, runs, present, commands)


# -- the report ----------------------------------------------------------------------------------------------------


def effect_cell(m: Measured, unit: str) -> str:
    e = m.effect
    if e is None:
        return "–"
    if e.method == "config value":
        return f"{fmt(e.estimate)} {unit}"
    if not (math.isfinite(e.lo) and math.isfinite(e.hi)):
        return f"{fmt(e.estimate)} {unit}, no CI (n = {e.n})"
    return f"{fmt(e.estimate)} [{fmt(e.lo)}, {fmt(e.hi)}] {unit}"


def n_cell(m: Measured) -> str:
    if m.effect is None:
        return "0"
    return count(m.effect.n, m.n_of) + (" (paired)" if m.effect.method == "paired t" else "")


def margin_cell(part: Part) -> str:
    if part.role == SHOWN:
        return "–"
    if part.noninferiority:
        null = null_value(part)
        return f"{'>' if part.direction == 1 else '<'} {null:+.3g} (non-inferiority)"
    sign = {1: "> 0", -1: "< 0"}[part.direction]
    return sign + (f", ±{part.margin:.3g}" if part.margin is not None else "")


def p_cell(r: PartResult) -> str:
    """The unadjusted one-sided p, marked when it is on the side against the claim."""
    if r.p != r.p:
        return "–"
    return fmt_p(r.p) + (" (against)" if r.side == -r.part.direction else "")


def holm_cell(r: PartResult) -> str:
    if r.part.role == PRECONDITION and r.p == r.p:
        return "not corrected"
    return fmt_p(r.p_adj)


def verdict_cell(r: PartResult) -> str:
    if r.verdict is None:
        return "shown"
    return f"**{r.verdict}**" + (f" ({needs_text(r)})" if r.needs is not None else "")


def gold_note(results: Sequence[PartResult]) -> str:
    used = set().union(*(r.measured.gold_sources for r in results)) if results else set()
    if not used:
        return ""
    if used == {"test"}:
        return "Final gold: `test/gold_reward` (held-out test split)."
    if used == {"last eval"}:
        return "Final gold: the last `eval/gold_reward` (these runs logged no test split)."
    return "Final gold: `test/gold_reward` where logged, the last `eval/gold_reward` for the runs without a test split."


def claim_section(res: ClaimResult) -> list[str]:
    c = res.claim
    lines = [f"### {c.id}: {c.statement}", "", f"**{res.verdict}**: {res.reason}.", ""]
    if c.studies:
        lines += [f"Studies: {', '.join(f'`{s}`' for s in c.studies + c.also)}. Reproduce, then "
                  "`rlhf-lab-report --claims`:", "", "```bash", *res.commands, "```", ""]
    if res.parts:
        rows = [[p.part.role, p.part.says, p.part.effect, effect_cell(p.measured, p.part.unit), n_cell(p.measured),
                 margin_cell(p.part), p_cell(p), holm_cell(p), verdict_cell(p)] for p in res.parts]
        lines += [md_table(EFFECT_HEADER, rows), ""]
        upstream = upstream_text(res.parts)
        lines += [upstream, ""] if upstream else []
        figures = [f"- {p.part.says}: " + " — ".join(x for x in (p.measured.detail, p.measured.missing) if x)
                   for p in res.parts if p.measured.detail or p.measured.missing]
        lines += (["Figures behind the effects (mean ± sd over units):", "", *figures, ""] if figures else [])
        note = gold_note(res.parts)
        lines += [note, ""] if note else []
    if c.note:
        lines += [f"Not tested or caveat: {c.note}", ""]
    return lines


def margins_text(claims: Sequence[Claim]) -> str:
    seen: dict[str, set[float]] = {}
    for c in claims:
        for p in c.parts:
            if p.role != SHOWN and p.margin is not None:
                seen.setdefault(p.unit, set()).add(p.margin)
    return "; ".join(f"{u}: ±{', ±'.join(f'{m:.3g}' for m in sorted(ms))}" for u, ms in seen.items())


def data_text(runs: Iterable[RunData]) -> str:
    policy = [r for r in runs if r.stage in POLICY_STAGES]
    if not policy:
        return "No finished policy runs (PPO, GRPO, RLOO, DPO, best-of-n) in any study."
    n_test = sum(final_gold_source(r) == "test" for r in policy)
    n_half = sum(half_curves(r)[0].size > 0 for r in policy)
    return (f"{len(policy)} finished policy runs count. Final gold is `test/gold_reward` (the held-out test split) "
            f"for {n_test} of them and the last `eval/gold_reward` (one evaluation on the eval prompts) for the "
            f"{len(policy) - n_test} that logged no test split. {n_half} logged the gold reward on two fixed halves "
            "of the eval prompts (`eval/gold_reward_a`, `_b`); only those have a drop from the peak (split-half: the "
            "peak is picked on one half and measured on the other, both ways, averaged; max − last of one noisy curve "
            "is biased upward and is not used). Changes over training are the last minus the first evaluation; "
            "nothing is a running mean.")


def provenance_rows(runs: Iterable[RunData]) -> list[list[Any]]:
    """One row per study (tag ``rlhf_lab.study``) of the counted runs: runs, the code they ran (tag
    ``rlhf_lab.git_commit``, short, with its number of runs) and when (first start to last end, UTC)."""
    import datetime

    def day(ms: int) -> str:
        return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M") if ms else "?"

    by: dict[str, list[RunData]] = {}
    for r in runs:
        by.setdefault(r.tags.get("rlhf_lab.study", "?"), []).append(r)
    rows = []
    for study, rs in sorted(by.items()):
        commits: dict[str, int] = {}
        for r in rs:
            c = r.tags.get("rlhf_lab.git_commit", "")[:7] or "?"
            commits[c] = commits.get(c, 0) + 1
        starts = [r.start_time for r in rs if r.start_time]
        ends = [r.end_time for r in rs if r.end_time]
        rows.append([f"`{study}`", len(rs), ", ".join(f"{c} ({n})" for c, n in sorted(commits.items())),
                     f"{day(min(starts)) if starts else '?'} – {day(max(ends)) if ends else '?'}"])
    return rows


VERDICT_HEADER = ["claim", "statement (seed notes)", "studies", "Holm p (judged effects)", "verdict"]
EFFECT_HEADER = ["role", "tests", "effect", "estimate [95% CI]", "n", "claimed, margin", "p (one-sided)", "Holm p",
                 "verdict"]
PROVENANCE = "## Where the runs come from"
PROVENANCE_HEADER = ["study", "runs", "commit (runs)", "first start – last end (UTC)"]
PROVENANCE_TEXT = ("Every run counted above, by study: the code it ran (its `rlhf_lab.git_commit` tag) and when. "
                   "Relaunching a study with `skip_finished=true` in the same folder runs only what is missing. Every "
                   f"run read is also kept beside this file, in `{FILE_NAME}`: `rlhf-lab-report --claims --runs "
                   f"reports/{FILE_NAME}` adds them to the store's (on a new machine, say), and with `--no-store` "
                   "recomputes the verdicts from that file alone.")
UPDATES = "**Updates.**"


def holm_summary(r: ClaimResult) -> str:
    """The Holm-adjusted p of each judged effect with one, in registry order ('against' on the other side)."""
    cells = [fmt_p(p.p_adj) + (" against" if p.side == -p.part.direction else "")
             for p in r.parts if p.part.role == JUDGED and p.p_adj == p.p_adj]
    return ", ".join(cells) or "–"


def verdict_rows(results: Sequence[ClaimResult]) -> list[list[Any]]:
    return [[r.claim.id, r.claim.statement, ", ".join(f"`{s}`" for s in r.claim.studies) or "–", holm_summary(r),
             f"**{r.verdict}**"] for r in results]


def statistics_text(m: int) -> str:
    """The Statistics paragraph: the interval, the p-values, Holm's family (m judged effects), the verdict rules."""
    return ("**Statistics.** An effect is a mean over units (normally seeds) with its 95% Student-t interval. Paired "
            "designs run the compared settings with the same seeds and average the per-seed differences (\"paired\" "
            "after n: the seeds both settings ran); the others take one value per unit (a change over training, a "
            "drop, one value per distinct RM). Each judged effect has a one-sided p-value from its t statistic "
            "(df = n − 1), on the side of 0 its estimate lies (\"against\": the side opposite to the claim); p < 0.025 "
            "exactly when the 95% interval excludes 0 on that side. **Multiplicity:** the family is every judged "
            f"effect of this report with a p-value (m = {m}); verdicts use Holm's step-down correction at a family-wise "
            f"level of {ALPHA:g} per side (the 95% intervals' 2.5 % a side; 5 % for any wrong verdict either way), "
            "and the tables show the unadjusted interval and p beside the Holm-adjusted p and verdict. A judged "
            f"effect **holds** when its Holm-adjusted p is below {ALPHA:g} on the claimed side, **does not hold** when "
            f"it is below {ALPHA:g} on the other side or its (unadjusted) interval lies inside ±margin (negligible), "
            "and is **inconclusive** otherwise, including n < 2. A non-inferiority effect (\"at least as well, "
            "within the margin\") is tested against −margin instead of 0 and has no negligible zone. A claim holds "
            "when all its judged effects hold and does not hold when one does not. A precondition (what the claim "
            "presupposes, e.g. hacking to reduce) is judged on its unadjusted interval, outside the family; one that "
            "is not shown makes the claim inconclusive, **except** that a judged effect shown against the claim "
            "(Holm-adjusted) makes it \"does not hold\" all the same. Shown effects are reported, not judged. "
            f"**Power:** an inconclusive effect states the units that {POWER:.0%} power would need (one-sided t test, "
            "noncentral t) to detect a true effect the size of its estimate, or of the margin if larger, with its "
            f"observed spread, at level {ALPHA:g}/m for a judged effect (Holm's strictest step: an effect reaching "
            f"it holds after the correction whatever the others) and {ALPHA:g} for a precondition. **Replication:** "
            "each section counts the distinct upstream RMs and SFT policies per arm (`rlhf_lab.upstream.*` tags); "
            "a factor with one per arm is held fixed, and the verdict is conditional on it. A claim about the RM "
            "needs at least 5 distinct RMs per arm, else it is inconclusive (\"not replicated\").")


def family_size(results: Sequence[ClaimResult]) -> int:
    return sum(1 for r in results for p in r.parts if p.part.role == JUDGED and p.p_adj == p.p_adj)


def render(results: Sequence[ClaimResult], source: str, runs: Iterable[RunData]) -> str:
    """The whole report; `source` names where the runs were read (markdown)."""
    lines = ["# Claims of docs/claims.md put to the canned studies", "",
             f"Computed by `rlhf-lab-report --claims` from {source}. Verdicts hold for this world and these small "
             "models only.", "",
             f"**Data.** Only FINISHED runs count; policy runs (PPO, GRPO, RLOO, DPO) need at least {MIN_EVALS} evaluations. "
             + data_text(runs), "",
             statistics_text(family_size(results)),
             "", f"**Margins** (equivalence, or non-inferiority where the table says so, per unit): {margins_text([r.claim for r in results])}.", "",
             "## Verdicts", "", md_table(VERDICT_HEADER, verdict_rows(results)), "", "## Effects", ""]
    for r in results:
        lines += claim_section(r)
    runs = list(runs)
    if runs:
        lines += [PROVENANCE, "", PROVENANCE_TEXT, "", md_table(PROVENANCE_HEADER, provenance_rows(runs)), ""]
    return "\n".join(lines)


# -- updating some claims of a written report (--only) -----------------------------------------------------------


def only_claims(ids: Iterable[str]) -> list[Claim]:
    """The claims `ids` names, in registry order. ValueError for an unknown id, or when a study of theirs is read by
    a claim left out too (its section would then describe other runs than the provenance table)."""
    ids = {i.strip().upper() for i in ids if i.strip()}
    unknown = sorted(ids - {c.id for c in CLAIMS})
    if unknown or not ids:
        raise ValueError(f"--only: unknown claim {', '.join(unknown) or '(none given)'}; the claims are "
                         f"{CLAIMS[0].id}–{CLAIMS[-1].id}")
    chosen = [c for c in CLAIMS if c.id in ids]
    studies = set(study_names(chosen))
    others = [c.id for c in CLAIMS if c.id not in ids and studies & set(c.studies + c.also)]
    if others:
        raise ValueError(f"--only {','.join(c.id for c in chosen)}: their studies are also read by "
                         f"{', '.join(others)}; add {'it' if len(others) == 1 else 'them'} to --only")
    return chosen


def claims_of_studies(names: Iterable[str]) -> list[str]:
    """The ids of the claims that read any of these studies (a registry study, or its 5-seed rerun's name), with
    every claim that shares a study with them (:func:`only_claims`' rule): what ``--only`` recomputes after they ran."""
    names = set(names)
    reads = names | {k for k, v in SUITE_VERSIONS.items() if set(v) & names}
    ids: set[str] = set()
    while True:
        grown = {c.id for c in CLAIMS if reads & set(c.studies + c.also)}
        if grown == ids:
            return [c.id for c in CLAIMS if c.id in ids]
        ids, reads = grown, reads | set(study_names([c for c in CLAIMS if c.id in grown]))


def old_verdicts(text: str) -> dict[str, str]:
    """{claim id: verdict} of a written claims.md's verdict table (the last cell of each claim row)."""
    return {cells[0]: cells[-1].strip("*") for line in text.split("## Effects", 1)[0].splitlines()
            if line.startswith("| C") for cells in [[c.strip() for c in line.strip().strip("|").split("|")]]}


def kept_without_runs(old: str, results: Sequence[ClaimResult], ids: Iterable[str]) -> list[str]:
    """The claims outside `ids` whose section in `old` has a verdict from runs, but whose runs were not read now."""
    before, ids = old_verdicts(old), set(ids)
    return [r.claim.id for r in results if r.claim.id not in ids and r.verdict == NOT_RUN
            and before.get(r.claim.id, NOT_RUN) not in (NOT_RUN, NOT_TESTABLE)]


def with_updates(old: str, new: str, ids: Sequence[str], note: str) -> str:
    """`new` (a whole report) with the Updates paragraph of `old` carried over: its notes, less those on the claims
    `ids` or a subset of them, and `note` last, after the Data paragraph."""
    notes: list[str] = []
    lines = old.split("\n")
    if UPDATES in lines:
        j = lines.index(UPDATES)
        while j + 1 < len(lines) and lines[j + 1].startswith("- "):
            j += 1
            notes.append(lines[j])
    notes = [n for n in notes if not set(n[2:].split(":", 1)[0].split(", ")) <= set(ids)] + [note]
    out = new.split("\n")
    i_data = next((k for k, line in enumerate(out) if line.startswith("**Data.**")), 0)
    out[i_data + 1:i_data + 1] = ["", UPDATES, *notes]
    return "\n".join(out)


def sources_text(uri: str | None, runs_files: Sequence[Path | str], use_store: bool, out: Path | None = None) -> str:
    """Where the runs were read, in markdown; the runs file beside the report (in `out`) by its name alone."""
    def name(f: Path | str) -> str:
        beside = out is not None and Path(f).resolve() == (out / FILE_NAME).resolve()
        return f"`{FILE_NAME}` (beside this file)" if beside else f"`{f}`"

    return " and ".join(([f"`{store_uri(uri)}`"] if use_store else []) + [name(f) for f in runs_files])


def update_note(claims: Sequence[Claim], source: str, runs: Sequence[RunData]) -> str:
    import datetime

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    policy = [r for r in runs if r.stage in POLICY_STAGES]
    ids = ", ".join(c.id for c in claims)
    return (f"- {ids}: recomputed on {now} UTC by `rlhf-lab-report --claims --only {ids.replace(', ', ',')}` from "
            f"{source}, on {len(policy)} finished policy runs of theirs ({sum(final_gold_source(r) == 'test' for r in policy)} "
            "with the test split); every other section was recomputed from the same files, since Holm's correction "
            "spans the report.")


def write_claims_report(out_dir: Path | str = "reports", uri: str | None = None,
                        studies: dict[str, list[RunData]] | None = None, runs_files: Sequence[Path | str] = (),
                        use_store: bool = True, only: Iterable[str] | None = None) -> Path:
    """Write ``<out_dir>/claims.md`` from the store (unless not `use_store`) and the `runs_files`, or from
    `studies` ({study: runs}, built in memory). From a store or files, every run read is also written to
    ``<out_dir>/claims_runs.json.gz`` (:mod:`~rlhf_lab.analysis.snapshot`).

    With `only` (claim ids: the claims whose runs are new), the runs file already beside the existing claims.md is
    read too, and since Holm's correction spans every judged effect of the report, every section is recomputed from
    the runs read; the Updates paragraph names `only`. ValueError (nothing written) when a section of the existing
    report that had a verdict from runs would become "not run yet": its runs are in none of the files read."""
    out = Path(out_dir)
    path = out / "claims.md"
    claims = only_claims(only) if only else list(CLAIMS)
    if only and not path.is_file():
        raise FileNotFoundError(f"--only updates {path}, which does not exist: write it first with "
                                "rlhf-lab-report --claims")
    out.mkdir(parents=True, exist_ok=True)
    kept = out / FILE_NAME
    if only and kept.is_file() and not any(Path(f).resolve() == kept.resolve() for f in runs_files):
        runs_files = [*runs_files, kept]  # the runs behind the sections --only keeps: the file must keep them too
    if studies is None:
        if not use_store and not runs_files:
            raise ValueError("--no-store needs --runs FILE: there is nothing else to read")
        all_runs, commands = gather_runs(uri, runs_files, use_store)
        source = sources_text(uri, runs_files, use_store, out)
    else:
        all_runs, commands, source = studies, {}, f"`{store_uri(uri)}`"
    runs, present = counted(all_runs)
    results = judge_all(CLAIMS, runs, present, commands)
    seen = list({r.run_id: r for name in study_names() for r in runs.get(name, [])}.values())
    text = render(results, source, seen) + "\n"
    if only:
        old = path.read_text()
        lost = kept_without_runs(old, results, [c.id for c in claims])
        if lost:
            raise ValueError(f"--only {','.join(c.id for c in claims)}: the runs of {', '.join(lost)} are in none of "
                             f"the files read, and their sections cannot be kept (Holm's correction spans the report): "
                             "pass their runs file with --runs, or rerun their studies")
        mine = [r for name in study_names(claims) for r in runs.get(name, [])]
        text = with_updates(old, text, [c.id for c in claims], update_note(claims, source, mine))
    if studies is None:
        write_snapshot(out / FILE_NAME, all_runs, commands)
    write_atomic(path, text)
    return path
