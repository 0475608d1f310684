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
from rlhf_lab.analysis.report_files import check_file
from rlhf_lab.analysis.runs import POLICY_STAGES, RunData, load_study, store_uri
from rlhf_lab.analysis.snapshot import FILE_NAME, merge, merge_commands, read_snapshot, write_snapshot
from rlhf_lab.analysis.stats import DOES_NOT_HOLD, HOLDS, INCONCLUSIVE, verdict
from rlhf_lab.runtime import write_atomic

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


def load_claim_runs(uri: str | None = None, names: Sequence[str] | None = None
                    ) -> tuple[dict[str, list[RunData]], dict[str, list[str]]]:
    """({study: all its runs}, {study: the commands of its sweep parents}) from the store: a study's 5-seed rerun
    (``SUITE_VERSIONS``) when some of its runs count, else the older study."""
    studies, commands = {}, {}
    for name in names or study_names():
        runs, parents = [], []
        if name in SUITE_VERSIONS:  # the claims suite's 5-seed rerun, when it has runs
            runs, parents = load_study(SUITE_VERSIONS[name], uri, stages=CLAIM_STAGES, history_keys=CLAIM_HISTORY_KEYS)
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


VERDICT_HEADER = ["claim", "statement (seed notes)", "studies", "verdict"]
PROVENANCE = "## Where the runs come from"
PROVENANCE_HEADER = ["study", "runs", "commit (runs)", "first start – last end (UTC)"]
PROVENANCE_TEXT = ("Every run counted above, by study: the code it ran (its `rlhf_lab.git_commit` tag) and when. "
                   "Relaunching a study with `skip_finished=true` in the same folder runs only what is missing. Every "
                   f"run read is also kept beside this file, in `{FILE_NAME}`: `rlhf-lab-report --claims --runs "
                   f"reports/{FILE_NAME}` adds them to the store's (on a new machine, say), and with `--no-store` "
                   "recomputes the verdicts from that file alone.")
UPDATES = "**Updates.**"


def verdict_rows(results: Sequence[ClaimResult]) -> list[list[Any]]:
    return [[r.claim.id, r.claim.statement, ", ".join(f"`{s}`" for s in r.claim.studies) or "–", f"**{r.verdict}**"]
            for r in results]


def render(results: Sequence[ClaimResult], source: str, runs: Iterable[RunData]) -> str:
    """The whole report; `source` names where the runs were read (markdown)."""
    lines = ["# Claims of docs/claims.md put to the canned studies", "",
             f"Computed by `rlhf-lab-report --claims` from {source}. Verdicts hold for this world and these small "
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
    reads = names | {k for k, v in SUITE_VERSIONS.items() if v in names}
    ids: set[str] = set()
    while True:
        grown = {c.id for c in CLAIMS if reads & set(c.studies + c.also)}
        if grown == ids:
            return [c.id for c in CLAIMS if c.id in ids]
        ids, reads = grown, reads | set(study_names([c for c in CLAIMS if c.id in grown]))


def table_rows(table: str) -> list[str]:
    return table.split("\n")[2:]


def splice(old: str, results: Sequence[ClaimResult], runs: Iterable[RunData], note: str) -> str:
    """`old` (a claims.md) with the verdict rows, effect sections and provenance rows of `results`' claims and
    studies replaced by theirs (`runs`: the runs they counted), and `note` in its Updates paragraph, where it
    replaces an earlier note on the same claims or a subset of them."""
    lines = old.rstrip("\n").split("\n")
    if "## Effects" not in lines:
        raise ValueError("not a claims report written by rlhf-lab-report --claims (it has no '## Effects')")
    i_eff = lines.index("## Effects")
    i_prov = lines.index(PROVENANCE) if PROVENANCE in lines else len(lines)
    head, body, tail = lines[:i_eff], lines[i_eff + 1:i_prov], lines[i_prov:]
    ids = [r.claim.id for r in results]

    rows = dict(zip(ids, table_rows(md_table(VERDICT_HEADER, verdict_rows(results)))))
    head = [rows.get(line.split("|")[1].strip(), line) if line.startswith("| C") else line for line in head]
    notes: list[str] = []
    if UPDATES in head:  # take the Updates paragraph out: its notes, then the paragraph itself
        i = j = head.index(UPDATES)
        while j + 1 < len(head) and head[j + 1].startswith("- "):
            j += 1
            notes.append(head[j])
        head = head[:i - 1] + head[j + 1:] if i > 0 and head[i - 1] == "" else head[:i] + head[j + 1:]
    notes = [n for n in notes if not set(n[2:].split(":", 1)[0].split(", ")) <= set(ids)] + [note]
    i_data = next((k for k, line in enumerate(head) if line.startswith("**Data.**")), 0)
    head[i_data + 1:i_data + 1] = ["", UPDATES, *notes]

    sections: dict[str, list[str]] = {}
    lead: list[str] = []
    current = None
    for line in body:
        if line.startswith("### C"):
            current = line[4:].split(":", 1)[0]
            sections[current] = []
        (sections[current] if current else lead).append(line)
    for r in results:
        sections[r.claim.id] = claim_section(r)
    body = lead + [line for c in CLAIMS if c.id in sections for line in sections[c.id]]
    while body and body[-1] == "":
        body.pop()

    redone = {t for name in study_names([r.claim for r in results]) for t in (name, SUITE_VERSIONS.get(name))}
    prov = {line.split("`")[1]: line for line in tail if line.startswith("| `") and line.split("`")[1] not in redone}
    prov.update({line.split("`")[1]: line for line in table_rows(md_table(PROVENANCE_HEADER, provenance_rows(runs)))})
    header = md_table(PROVENANCE_HEADER, []).split("\n")
    tail = [PROVENANCE, "", PROVENANCE_TEXT, "", *header, *(prov[k] for k in sorted(prov)), ""] if prov else []
    return "\n".join([*head, "## Effects", *body, "", *tail]).rstrip("\n") + "\n"


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
            f"{source}, on {len(policy)} finished policy runs ({sum(final_gold_source(r) == 'test' for r in policy)} "
            "with the test split); the Data paragraph above is the full report's, the provenance table names these "
            "claims' runs.")


def write_claims_report(out_dir: Path | str = "reports", uri: str | None = None,
                        studies: dict[str, list[RunData]] | None = None, runs_files: Sequence[Path | str] = (),
                        use_store: bool = True, only: Iterable[str] | None = None) -> Path:
    """Write ``<out_dir>/claims.md`` from the store (unless not `use_store`) and the `runs_files`, or from
    `studies` ({study: runs}, built in memory). From a store or files, every run read is also written to
    ``<out_dir>/claims_runs.json.gz`` (:mod:`~rlhf_lab.analysis.snapshot`). With `only` (claim ids), only those
    claims are recomputed and spliced into the existing claims.md (:func:`splice`), and the runs file already beside
    it is read too, so that the rewritten file still holds the runs of the sections left as they were."""
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
        write_snapshot(out / FILE_NAME, all_runs, commands)
        source = sources_text(uri, runs_files, use_store, out)
    else:
        all_runs, commands, source = studies, {}, f"`{store_uri(uri)}`"
    runs, present = counted(all_runs)
    results = [judge(c, runs, present, commands) for c in claims]
    seen = list({r.run_id: r for name in study_names(claims) for r in runs.get(name, [])}.values())
    if only:
        text = splice(path.read_text(), results, seen, update_note(claims, source, seen))
    else:
        text = render(results, source, seen) + "\n"
    write_atomic(path, text)
    return path
