"""``reports/claims.md``: a verdict on each claim of docs/claims.md, from the runs of the canned studies.

The claims, the studies that test them and the effects they are judged on are data
(:mod:`~rlhf_lab_research.claims_registry`); their verdicts, with Holm's correction across every judged effect of the
report, the units an inconclusive effect would need and the RM replication rule, are
:mod:`~rlhf_lab_research.verdicts`' (:func:`verdicts.judge_all`). Here: reading the runs (the store, runs files),
and writing the report, whose Statistics paragraph (:func:`statistics_text`) states
the rules.
A claim whose studies have no runs is **not run yet** (with the command), one that is no effect is
**not testable**. Only FINISHED runs count, and policy runs (PPO, GRPO, RLOO, DPO, best-of-n) need :data:`MIN_EVALS` evaluations.
Of a job run more than once only its newest counted run counts; the report states that rule and lists the others,
superseded, with what differs (:mod:`~rlhf_lab_research.superseded`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Sequence

from rlhf_lab_research.anytime import BET_MARK, EARLIER, FOOTNOTE, MARK, is_anytime, is_refused, mark
from rlhf_lab_research.effects import Measured, count
from rlhf_lab.analysis.markdown import fmt, md_table
from rlhf_lab_research.provenance import (
    PROVENANCE,
    PROVENANCE_HEADER,
    REPRODUCE_SUFFIX,
    provenance_rows,
    provenance_text,
    redone_text,
    reproduction_runs,
)
from rlhf_lab.analysis.quantities import final_gold_source, half_curves
from rlhf_lab_research.claim_quantities import CLAIM_HISTORY_KEYS
from rlhf_lab_research.designs import REDONE, RM_CLAIM_RMS, SUITE_VERSIONS, one_design
from rlhf_lab_research.claims_registry import CLAIMS, JUDGED, SHOWN, Claim, Part
from rlhf_lab_research.superseded import Superseded, rule_text, superseded_runs, superseded_section
from rlhf_lab.analysis.report_files import check_file
from rlhf_lab.analysis.study_runs import POLICY_STAGES, STUDY_TAG, RunData, load_study, store_uri
from rlhf_lab.analysis.snapshot import (
    FILE_NAME,
    Commands,
    commands_of,
    merge,
    newest_per_job,
    portable_command,
    read_snapshot,
    write_snapshot,
)
from rlhf_lab_research.verdicts import (
    ALPHA,
    MIN_EVALS,
    NOT_RUN,
    NOT_TESTABLE,
    POWER,
    ClaimResult,
    PartResult,
    counts,
    family,
    fmt_p,
    judge_all,
    needs_text,
    null_value,
    reading,
    study_names,
    upstream_text,
)
from rlhf_lab.runs.process import write_atomic

LEVEL = 0.95
CLAIM_STAGES = (*POLICY_STAGES, "rm")


def load_claim_runs(uri: str | None = None, names: Sequence[str] | None = None
                    ) -> tuple[dict[str, list[RunData]], dict[str, list[str]]]:
    """({study: all its runs, every design}, {study: the commands of its sweep parents}) from the store: the runs of
    the study a claim names and of its claims-suite reruns (``SUITE_VERSIONS``); :func:`counted` picks one design."""
    studies, commands = {}, {}
    for name in names or study_names():
        runs, parents = [], []
        for version in (*SUITE_VERSIONS.get(name, ()), name):
            more, more_parents = load_study(version, uri, stages=CLAIM_STAGES, history_keys=CLAIM_HISTORY_KEYS)
            runs, parents = runs + more, parents + more_parents
            reruns, _ = load_study(version + REPRODUCE_SUFFIX, uri, stages=CLAIM_STAGES, history_keys=())
            if reruns:  # the suite's check before it added seeds: kept, and shown in the provenance table
                studies[version + REPRODUCE_SUFFIX] = reruns
        studies[name] = runs
        commands[name] = sorted({portable_command(p.data.tags["rlhf_lab.command"]) for p in parents
                                 if p.data.tags.get("rlhf_lab.command")})
    return studies, commands


def counted(studies: dict[str, list[RunData]]) -> tuple[dict[str, list[RunData]], dict[str, int]]:
    """({study: the runs that count}, {study: how many runs it has}), of one design per study: its newest rerun
    (``SUITE_VERSIONS``) with a run that counts, else the study the claim names (:func:`~rlhf_lab_research.designs.one_design`); of a
    job run twice, the newer run (:func:`snapshot.newest_per_job`)."""
    studies = one_design(studies, SUITE_VERSIONS, counts)
    return ({k: [r for r in newest_per_job(v, counts) if counts(r)] for k, v in studies.items()},
            {k: len(v) for k, v in studies.items()})


def design_commands(runs: dict[str, list[RunData]], commands: dict[str, list[str]]) -> dict[str, list[str]]:
    """{study: the commands of the design its `runs` are of} (``sweep=<tag>`` naming a study tag of its runs), or all
    of its commands when none names one."""
    return {name: commands_of(cmds, {r.tags.get(STUDY_TAG) for r in runs.get(name, [])})
            for name, cmds in commands.items()}


def gather_runs(uri: str | None, runs_files: Sequence[Path | str] = (), use_store: bool = True
                ) -> tuple[dict[str, list[RunData]], dict[str, list[str]]]:
    """The claims studies' runs from the store (unless not `use_store`) and from runs files (:mod:`snapshot`),
    united by run id; where a run is in both, the store's copy."""
    runs: dict[str, list[RunData]] = {}
    commands: dict[str, list[str]] = {}
    for f in runs_files:
        s, c = read_snapshot(f)
        runs, commands = merge(runs, s), merge_commands(commands, c)
    if use_store:
        s, c = load_claim_runs(uri)
        runs, commands = merge(runs, s), merge_commands(commands, c)
    for name in study_names():
        runs.setdefault(name, [])
    return runs, commands


# -- the report ----------------------------------------------------------------------------------------------------


def effect_cell(m: Measured, unit: str) -> str:
    e = m.effect
    if e is None:
        return "–"
    if e.method == "config value":
        return f"{fmt(e.estimate)} {unit}"
    sign = f" {mark(e)}" if is_anytime(e) else ""
    if is_refused(e):
        return f"{fmt(e.estimate)} {unit}, refused: skewed values (n = {e.n}){sign}"
    if not (math.isfinite(e.lo) and math.isfinite(e.hi)):
        return f"{fmt(e.estimate)} {unit}, {'unbounded' if sign else 'no CI'} (n = {e.n}){sign}"
    return f"{fmt(e.estimate)} [{fmt(e.lo)}, {fmt(e.hi)}] {unit}{sign}"


def n_cell(m: Measured) -> str:
    if m.effect is None:
        return "0"
    return count(m.effect.n, m.n_of) + (" (paired)" if m.effect.method.endswith("paired t") else "")


def margin_cell(part: Part) -> str:
    if part.role == SHOWN:
        return "–" + (f", ±{part.margin:.3g}" if part.margin is not None and part.words is not None else "")
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
    """The Holm-adjusted p, and the adjusted equivalence p beside it when it makes the effect negligible."""
    return fmt_p(r.p_adj) + (f"; inside ±margin: {fmt_p(r.p_eq_adj)}" if r.negligible else "")


def verdict_cell(r: PartResult) -> str:
    if r.verdict is None:  # a shown part: worded from its interval, not judged
        words = reading(r)
        return f"shown: {words}" if words else "shown"
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
    if c.earlier:
        lines += [f"**Redesigned** (the parts below read the new design once it has runs, the old runs until then). "
                  f"Earlier design: {c.earlier[1]}.", ""]
    if c.studies:
        lines += [f"Studies: {', '.join(f'`{s}`' for s in c.studies + c.also)}. Reproduce, then "
                  "`rlhf-lab-report --claims`:", "", "```bash", *res.commands, "```", ""]
    if res.parts:
        rows = [[p.part.role, p.label, p.part.effect, effect_cell(p.measured, p.part.unit), n_cell(p.measured),
                 margin_cell(p.part), p_cell(p), holm_cell(p), verdict_cell(p)] for p in res.parts]
        lines += [md_table(EFFECT_HEADER, rows), "", *footnote(res.parts)]
        upstream = upstream_text(res.parts)
        lines += [upstream, ""] if upstream else []
        figures = [f"- {p.part.label(p.measured, ran=False)}: "  # the detail names the arms as they ran
                   + " — ".join(x for x in (p.measured.detail, p.measured.missing) if x)
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
            if p.margin is not None and (p.role != SHOWN or p.words is not None):
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


VERDICT_HEADER = ["claim", "statement (seed notes)", "studies", "Holm p (judged effects)", "verdict"]
EFFECT_HEADER = ["role", "tests", "effect", "estimate [95% CI]", "n", "claimed, margin", "p (one-sided)", "Holm p",
                 "verdict"]
UPDATES = "**Updates.**"


def holm_summary(r: ClaimResult) -> str:
    """The Holm-adjusted p of each judged effect with one, in registry order ('against' on the other side)."""
    cells = [fmt_p(p.p_adj) + (" against" if p.side == -p.part.direction else "") + mark(p.measured.effect)
             for p in r.parts if p.part.role == JUDGED and p.p_adj == p.p_adj]
    return ", ".join(cells) or "–"


def anytime(r: PartResult) -> bool:
    """Whether a part was judged with the anytime-valid interval (its study was extended after looking)."""
    return is_anytime(r.measured.effect)


def footnote(results: Sequence[PartResult]) -> list[str]:
    """The marker's footnote (and a blank line) when one of `results` is marked, else nothing."""
    return [FOOTNOTE, ""] if any(map(anytime, results)) else []


def verdict_rows(results: Sequence[ClaimResult], earlier: Sequence[ClaimResult] = ()) -> list[list[Any]]:
    """The verdict table's rows; a verdict that the earlier rule gave otherwise (`earlier`, the same claims judged
    under :data:`anytime.EARLIER`) says what it was."""
    before = {r.claim.id: r.verdict for r in earlier}
    return [[r.claim.id, r.claim.statement, ", ".join(f"`{s}`" for s in r.claim.studies) or "–", holm_summary(r),
             f"**{r.verdict}**" + (f" (redesigned; earlier design: {r.claim.earlier[0]})" if r.claim.earlier else
                                   f" (earlier: {before[r.claim.id]})" if before.get(r.claim.id, r.verdict) != r.verdict
                                   else "")] for r in results]


CHANGED = "## Changed by the sequences from the first look (issue 69)"
CHANGED_HEADER = ["claim: tests", "role", "earlier: estimate [95% CI]", "earlier Holm p", "earlier verdict",
                  "now: estimate [95% CI]", "now Holm p", "now verdict"]


def changed_section(results: Sequence[ClaimResult], earlier: Sequence[ClaimResult]) -> list[str]:
    """Every judged effect or precondition whose interval, Holm p or verdict the rule of issue 69 changed, with its
    earlier result (issue 42's rule, :data:`anytime.EARLIER`) beside the new one; nothing when `earlier` is empty."""
    if not earlier:
        return []
    old = {(r.claim.id, p.part.says): p for r in earlier for p in r.parts}
    rows = []
    for r in results:
        for p in r.parts:
            q = old.get((r.claim.id, p.part.says))
            if p.part.role == SHOWN or q is None:
                continue
            now = (effect_cell(p.measured, p.part.unit), holm_cell(p), verdict_cell(p))
            then = (effect_cell(q.measured, q.part.unit), holm_cell(q), verdict_cell(q))
            if now != then:
                rows.append([f"{r.claim.id}: {p.label}", p.part.role, *then, *now])
    text = ("Every judged effect and precondition with per-unit values is now judged with an anytime-valid sequence "
            "from its first look; earlier (issue 42's rule) a fixed-n t interval was used unless the effect read a seed "
            f"added after looking (then the t-mixture sequence, {MARK}). Each effect whose interval, Holm p or "
            "verdict changed, the earlier result first (both computed from the same runs files):")
    return [CHANGED, "", text, "", md_table(CHANGED_HEADER, rows) if rows else "None changed.", ""]


def family_size(results: Sequence[ClaimResult]) -> int:
    """The size of Holm's family (:func:`verdicts.family`)."""
    return len(family(results))


def render(results: Sequence[ClaimResult], source: str, runs: Iterable[RunData],
           reruns: dict[str, list[RunData]] | None = None, earlier: Sequence[ClaimResult] = (),
           superseded: Sequence[Superseded] = ()) -> str:
    """The whole report; `source` names where the runs were read (markdown); `reruns`: {study tag: the reruns of its
    stored seed-0 run} (:func:`rlhf_lab_research.provenance.reproduction_runs`); `earlier`: the same claims judged
    under issue 42's rule, shown beside every result the rule of issue 69 changed (:func:`changed_section`);
    `superseded`: the runs the rule of which run of a job counts left out (:mod:`rlhf_lab_research.superseded`)."""
    lines = ["# Claims of docs/claims.md put to the canned studies", "",
             f"Computed by `rlhf-lab-report --claims` from {source}. Verdicts hold for this world and these small "
             "models only.", "",
             f"**Data.** Only FINISHED runs count; policy runs (PPO, GRPO, RLOO, DPO) need at least {MIN_EVALS} evaluations. "
             + data_text(runs), "",
             rule_text(len(superseded), len({s.old.tags.get(STUDY_TAG, s.study) for s in superseded})), "",
             statistics_text(family_size(results)),
             "", f"**Margins** (equivalence, or non-inferiority where the table says so, per unit): {margins_text([r.claim for r in results])}.", "",
             "## Verdicts", "", md_table(VERDICT_HEADER, verdict_rows(results, earlier)), "",
             *footnote([p for r in results for p in r.parts if p.part.role == JUDGED]), "## Effects", ""]
    for r in results:
        lines += claim_section(r)
    lines += changed_section(results, earlier)
    runs = list(runs)
    if runs:
        lines += [PROVENANCE, "", provenance_text(FILE_NAME), "",
                  md_table(PROVENANCE_HEADER, provenance_rows(runs, reruns)), "",
                  redone_text(REDONE), ""]
        lines += superseded_section(superseded)
    return "\n".join(lines)


def statistics_text(m: int) -> str:
    """The Statistics paragraph: the interval, the p-values, Holm's family (m judged effects), the verdict rules."""
    return ("**Statistics.** An effect is a mean over units (normally seeds) with its 95% Student-t interval. Paired "
            "designs run the compared settings with the same seeds and average the per-seed differences (\"paired\" "
            "after n: the seeds both settings ran); the others take one value per unit (a change over training, a "
            "drop, one value per distinct RM). Each judged effect has a one-sided p-value from its t statistic "
            "(df = n − 1), on the side of 0 its estimate lies (\"against\": the side opposite to the claim); p < 0.025 "
            "exactly when the 95% interval excludes 0 on that side. **Sequences from the first look** (issue 69): since "
            "`rlhf-lab-suite --decide` may give any study more seeds after its intervals were seen, a fixed-n t "
            "interval is not valid at its n, nor at the first look of a study that may be extended (a t test at the "
            "first look and a sequence at the later ones runs above its level). Every judged effect and precondition "
            "with per-unit values is therefore judged with an anytime-valid confidence sequence from its first look, "
            "valid at any n however the seeds were chosen: where each value has hard bounds from its definition (a "
            "difference of two fractions, accuracies or |ρ|: [−1, 1]; C10's RM length preference, itself a "
            f"difference: [−2, 2]), the betting sequence of Waudby-Smith & Ramdas 2023 ({BET_MARK}; hedged capital, "
            "predictable plug-in bets, values in seed order), valid for any law on those bounds; for the others "
            "(gold, which its formula bounds only loosely, [−15.6, 1] at 48 new tokens; tokens, 0 to 48; RM scores, KL, "
            f"log ratios, %), the t-mixture sequence ({MARK}; Wang & Ramdas 2023, \"Anytime-valid t-tests and "
            "confidence sequences for Gaussian means with unknown variance\"; tuned to be narrowest at 10 seeds, "
            "unbounded below 5), which assumes symmetric values and is **refused** (no interval, inconclusive, and "
            "the reason given) when the adjusted sample skewness |G1| exceeds what 5 % of normal samples of its n "
            "exceed (1.79 at 5 values, 1.36 at 10); the check cannot "
            "detect skew that has not shown in the sample, so these verdicts rest on roughly symmetric per-seed "
            "values. Each sequence's p is its own (1/K_n or 1/E_n), used as is as the one-sided p at "
            f"{ALPHA:g} (it is the two-sided sequence's p, so it is conservative by up to 2×), in the same Holm "
            "family as the others; an exact config value keeps its exact interval. The section after the effects "
            "gives each result this changed beside its earlier one (issue 42's rule: a fixed-n t interval "
            "unless the effect read a seed added after looking). "
            "**Multiplicity:** every p-value a verdict rests on is in one family (m = "
            f"{m}): each judged effect's and each precondition's one-sided p, and, for each of them tested for "
            "superiority with a margin, its equivalence p (TOST: the larger of the one-sided p-values against −margin "
            "and +margin; for a sequence, its own p-values). Preconditions are in the family, not "
            "beside it, because a verdict rests on them as much as on a judged effect: a precondition wrongly shown "
            "makes a claim testable that is not. Verdicts use Holm's step-down correction at a family-wise level of "
            f"{ALPHA:g} per side (the 95% intervals' 2.5 % a side; 5 % for any wrong verdict either way), and the "
            "tables show the unadjusted interval and p beside the Holm-adjusted p and verdict. A judged effect or "
            f"precondition **holds** when its Holm-adjusted p is below {ALPHA:g} on the claimed side, **does not "
            f"hold** when it is below {ALPHA:g} on the other side or its Holm-adjusted equivalence p is below "
            f"{ALPHA:g} (negligible: shown inside ±margin; the Holm p cell then gives it), and is **inconclusive** "
            "otherwise, including n < 2; an unadjusted 95% interval inside ±margin is not enough. A non-inferiority "
            "effect (\"at least as well, within the margin\") is tested against −margin instead of 0 and has no "
            "negligible zone. A claim holds when all its judged effects hold and does not hold when one does not. A "
            "precondition (what the claim presupposes, e.g. hacking to reduce) that is not shown makes the claim "
            "inconclusive, **except** that a judged effect shown against the claim makes it \"does not hold\" all "
            "the same. Shown effects are reported, not judged, and stay outside the family (no verdict rests on "
            "them; correcting them would only widen intervals nobody decides on): each is worded from its unadjusted "
            "95% interval alone, a direction when it excludes 0, \"no … detected\" only when it lies inside ±margin, "
            "inconclusive otherwise, and a direction or a \"no … detected\" says \"(unadjusted)\": a description "
            "of these runs, not a finding the report stands behind. "
            f"**Power:** an inconclusive effect states the units that {POWER:.0%} power would need (one-sided t test, "
            "noncentral t) to detect a true effect the size of its estimate, or of the margin if larger, with its "
            f"observed spread (for a {MARK} effect: the n at which its sequence at that level, widened by 0.84 standard errors, would exclude 0 for such an effect, the spread taken as known; a {BET_MARK} or refused effect states none), at level {ALPHA:g}/m (Holm's strictest step: an effect reaching "
            "it holds after the correction whatever the others). **Replication:** "
            "each section counts the distinct upstream RMs and SFT policies per arm (`rlhf_lab.upstream.*` tags); "
            "a factor with one per arm is held fixed, and the verdict is conditional on it. A claim about the RM "
            f"needs at least {RM_CLAIM_RMS} distinct RMs per arm, else it is inconclusive (\"not replicated\").")


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


# Where a report written from a store or runs files says its runs are: the file beside it, which keeps every run it
# read (write_snapshot), so the line is the same wherever it was made and names no folder of that machine.
KEPT_SOURCE = (f"`{FILE_NAME}` (beside this file; it keeps every run this report read, and `rlhf-lab-report --claims "
               f"--no-store --runs <this folder>/{FILE_NAME}` recomputes the report from it alone)")


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
    check_file(path)  # never over files rlhf-lab-report did not write
    check_file(out / FILE_NAME)
    out.mkdir(parents=True, exist_ok=True)
    kept = out / FILE_NAME
    if only and kept.is_file() and not any(Path(f).resolve() == kept.resolve() for f in runs_files):
        runs_files = [*runs_files, kept]  # the runs behind the sections --only keeps: the file must keep them too
    if studies is None:
        if not use_store and not runs_files:
            raise ValueError("--no-store needs --runs FILE: there is nothing else to read")
        all_runs, commands = gather_runs(uri, runs_files, use_store)
        source = KEPT_SOURCE
    else:
        all_runs, commands, source = studies, {}, f"`{store_uri(uri)}`"
    runs, present = counted(all_runs)
    results = judge_all(CLAIMS, runs, present, design_commands(runs, commands))
    earlier = judge_all(CLAIMS, runs, present, design_commands(runs, commands), rule=EARLIER)
    seen = list({r.run_id: r for name in study_names() for r in runs.get(name, [])}.values())
    text = render(results, source, seen, reproduction_runs(all_runs), earlier, superseded_runs(all_runs)) + "\n"
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


def merge_commands(*all_commands: Commands) -> Commands:
    """The union of several {study: commands}, each study's commands sorted."""
    out: Commands = {}
    for commands in all_commands:
        for name, cmds in commands.items():
            out[name] = sorted(set(out.get(name, [])) | set(cmds))
    return out
