"""``reports/claims.md``: a verdict on each claim of docs/claims.md, from the runs of the canned studies.

The claims, the studies that test them and the effects they are judged on are data
(:mod:`~rlhf_lab.analysis.registry`). Here each effect gets its verdict from its 95% interval
(:func:`stats.verdict`): **holds** when the interval excludes 0 in the claimed direction; **does not hold** when it
excludes 0 the other way or lies inside the equivalence margin; **inconclusive** otherwise (also when fewer than
two seeds give the interval). A claim holds when all its judged effects hold and does not hold when one of them
does not; a precondition that is not shown to hold makes it inconclusive (nothing to test on these runs).
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
from rlhf_lab.analysis.stats import DOES_NOT_HOLD, HOLDS, INCONCLUSIVE, verdict

NOT_RUN = "not run yet"
NOT_TESTABLE = "not testable"
MIN_EVALS = 5  # evaluations a PPO or DPO run needs to count (shorter runs are smoke tests)
LEVEL = 0.95
CLAIM_STAGES = (*POLICY_STAGES, "rm")


@dataclass
class PartResult:
    part: Part
    measured: Measured
    verdict: str | None  # None for a shown part


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


def part_verdict(part: Part, m: Measured) -> str | None:
    if part.role == SHOWN:
        return None
    if m.effect is None:
        return INCONCLUSIVE
    return verdict(m.effect.lo, m.effect.hi, part.direction, part.margin)


def why_open(m: Measured) -> str:
    """Why an effect has no verdict either way."""
    if m.missing:
        return m.missing
    if m.effect is not None and m.effect.n < 2:
        return f"{count(m.effect.n, m.n_of)}: no interval"
    return "the interval includes 0 and leaves the margin"


def combine(results: Sequence[PartResult]) -> tuple[str, str]:
    """(verdict, reason) of a claim from its parts' verdicts."""
    for r in results:
        if r.part.role == PRECONDITION and r.verdict != HOLDS:
            why = "it does not hold" if r.verdict == DOES_NOT_HOLD else why_open(r.measured)
            return INCONCLUSIVE, f"cannot be tested on these runs: \"{r.part.says}\" is not shown ({why})"
    judged = [r for r in results if r.part.role == JUDGED]
    failed = [r.part.says for r in judged if r.verdict == DOES_NOT_HOLD]
    if failed:
        return DOES_NOT_HOLD, "shown not to hold: " + "; ".join(f"\"{s}\"" for s in failed)
    if judged and all(r.verdict == HOLDS for r in judged):
        return HOLDS, "every judged effect holds"
    open_ = [f"\"{r.part.says}\" ({why_open(r.measured)})" for r in judged if r.verdict != HOLDS]
    return INCONCLUSIVE, "not shown: " + "; ".join(open_)


def default_command(study: str) -> str:
    return f"rlhf-lab -m sweep={study}"


def judge(claim: Claim, studies: dict[str, list[RunData]], present: dict[str, int],
          commands: dict[str, list[str]] | None = None) -> ClaimResult:
    """The verdict on one claim: `studies` holds the runs that count, `present` how many runs each study has."""
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
        results.append(PartResult(part, m, part_verdict(part, m)))
    v, reason = combine(results)
    unusable = [s for s in claim.studies if not studies.get(s)]
    if unusable:
        reason += "; " + ", ".join(f"`{s}` has {present[s]} runs, none FINISHED with ≥ {MIN_EVALS} evaluations"
                                   for s in unusable)
    return ClaimResult(claim, v, reason, results, cmds)


def load_claim_studies(uri: str | None = None, names: Sequence[str] | None = None
                       ) -> tuple[dict[str, list[RunData]], dict[str, int], dict[str, list[str]]]:
    """({study: runs that count}, {study: all its runs}, {study: the commands of its sweep parents})."""
    studies, present, commands = {}, {}, {}
    for name in names or study_names():
        runs, parents = [], []
        if name in SUITE_VERSIONS:  # the claims suite's 5-seed rerun, when it has runs
            runs, parents = load_study(SUITE_VERSIONS[name], uri, stages=CLAIM_STAGES, history_keys=CLAIM_HISTORY_KEYS)
        if not any(counts(r) for r in runs):
            runs, parents = load_study(name, uri, stages=CLAIM_STAGES, history_keys=CLAIM_HISTORY_KEYS)
        present[name] = len(runs)
        studies[name] = [r for r in runs if counts(r)]
        commands[name] = sorted({p.data.tags["rlhf_lab.command"] for p in parents
                                 if p.data.tags.get("rlhf_lab.command")})
    return studies, present, commands


def evaluate_claims(uri: str | None = None, studies: dict[str, list[RunData]] | None = None,
                    claims: Sequence[Claim] = CLAIMS) -> list[ClaimResult]:
    """Every claim's verdict, from the store at `uri` or from `studies` ({study: runs}, e.g. built in memory)."""
    if studies is None:
        runs, present, commands = load_claim_studies(uri, study_names(claims))
    else:
        present = {k: len(v) for k, v in studies.items()}
        runs, commands = {k: [r for r in v if counts(r)] for k, v in studies.items()}, {}
    return [judge(c, runs, present, commands) for c in claims]


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
    sign = {1: "> 0", -1: "< 0"}[part.direction]
    return sign + (f", ±{part.margin:.3g}" if part.margin is not None else "")


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
                 margin_cell(p.part), f"**{p.verdict}**" if p.verdict else "shown"] for p in res.parts]
        lines += [md_table(["role", "tests", "effect", "estimate [95% CI]", "n", "claimed, margin", "verdict"], rows),
                  ""]
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


def render(results: Sequence[ClaimResult], uri: str, runs: Iterable[RunData]) -> str:
    lines = ["# Claims of docs/claims.md put to the canned studies", "",
             f"Computed by `rlhf-lab-report --claims` from `{uri}`. Verdicts hold for this world and these small "
             "models only.", "",
             f"**Data.** Only FINISHED runs count; policy runs (PPO, GRPO, RLOO, DPO) need at least {MIN_EVALS} evaluations. "
             + data_text(runs), "",
             "**Statistics.** An effect is a mean over units (normally seeds) with its 95% Student-t interval. Paired "
             "designs run the compared settings with the same seeds and average the per-seed differences (\"paired\" "
             "after n: the seeds both settings ran); the others take one value per unit (a change over training, a "
             "drop, one value per distinct RM). A judged effect **holds** when its interval excludes 0 on the "
             "claimed side, **does not hold** when it excludes 0 on the other side or lies inside ±margin "
             "(negligible), and is **inconclusive** otherwise, including n < 2. A claim holds when all its judged "
             "effects hold and does not hold when one does not; a precondition (what the claim presupposes, e.g. "
             "hacking to reduce) that is not shown makes it inconclusive; shown effects are reported, not judged.",
             "", f"**Margins** (equivalence, per unit): {margins_text([r.claim for r in results])}.", "",
             "## Verdicts", "",
             md_table(["claim", "statement (seed notes)", "studies", "verdict"],
                      [[r.claim.id, r.claim.statement, ", ".join(f"`{s}`" for s in r.claim.studies) or "–",
                        f"**{r.verdict}**"] for r in results]), "", "## Effects", ""]
    for r in results:
        lines += claim_section(r)
    runs = list(runs)
    if runs:
        lines += ["## Where the runs come from", "",
                  "Every run counted above, by study: the code it ran (its `rlhf_lab.git_commit` tag) and when. "
                  "Relaunching a study with `skip_finished=true` in the same folder runs only what is missing.", "",
                  md_table(["study", "runs", "commit (runs)", "first start – last end (UTC)"], provenance_rows(runs)), ""]
    return "\n".join(lines)


def write_claims_report(out_dir: Path | str = "reports", uri: str | None = None,
                        studies: dict[str, list[RunData]] | None = None) -> Path:
    if studies is None:
        studies, present, commands = load_claim_studies(uri)
        results = [judge(c, studies, present, commands) for c in CLAIMS]
    else:
        results = evaluate_claims(uri, studies)
        studies = {k: [r for r in v if counts(r)] for k, v in studies.items()}
    seen: dict[str, Any] = {r.run_id: r for rs in studies.values() for r in rs}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "claims.md"
    path.write_text(render(results, store_uri(uri), seen.values()) + "\n")
    return path
