"""Which run of a job the claims report counts, and the runs it does not: the superseded ones, each beside the run
that replaced it and what their recorded identities say differs.

The rule is :func:`rlhf_lab.analysis.snapshot.newest_per_job`'s (the claims report applies it in
:func:`rlhf_lab_research.claims.counted`, after :func:`~rlhf_lab_research.designs.one_design` picked one design per
study): of the runs that count of one job (:func:`~rlhf_lab.analysis.study_runs.job_key`: study, stage and the
overrides that change what it computes), only the newest by MLflow start time. Here: :data:`RULE` states it for the
report, :func:`superseded_runs` lists the runs it leaves out, :func:`differences` reads why two runs of one job may
differ from what each recorded (commit, the SFT artifact's cache key, the upstream RM run, the job's digests, the
CPU kernels, the study file's digest, the logged config), and :func:`superseded_section` writes the table.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

from rlhf_lab.analysis.markdown import fmt, md_table
from rlhf_lab.analysis.quantities import final_gold, gold_drop
from rlhf_lab.analysis.snapshot import newest_per_job
from rlhf_lab.analysis.study_runs import POLICY_STAGES, RunData, job_key
from rlhf_lab.runs.code import CPU_TAG
from rlhf_lab.runs.identity import CODE_TAG, CONFIG_TAG, INPUTS_TAG
from rlhf_lab.runs.jobs import STUDY_DIGEST_TAG
from rlhf_lab_research.designs import SUITE_VERSIONS, one_design
from rlhf_lab_research.verdicts import counts

SECTION = "## Superseded runs"
COMMIT_TAG = "rlhf_lab.git_commit"
# where a run names the artifacts it started from: a cache folder <root>/<stage>/<key>, the key a digest of what
# built it (rlhf_lab.runs.cache.artifact_key: spec, cache version, the stage's code); the root is the machine's
ARTIFACT_PARAMS = ("sft", "backbone", "reference")  # a policy's SFT start, an RM run's backbone, a reference model
UPSTREAM_RM_TAG = "rlhf_lab.upstream.rm"


def rule_text(n: int, studies: int) -> str:
    """The rule of which run of a job counts, for the report's header (`n` superseded runs in `studies` studies)."""
    return ("**Which run of a job counts.** A job is a study, a stage and the launch overrides that change what it "
            "computes (seed included). Of a job's runs that count (FINISHED, with enough evaluations) only the newest "
            "by start time counts: a job run again (at another commit, on another machine, after a fix) replaces its "
            "earlier run instead of being pooled with it, whether or not the two agree. The earlier runs are "
            f"superseded: they stay in the runs file, so the reports made from them regenerate, and {SECTION[3:]} "
            f"at the end lists each ({n} runs of {studies} studies) beside the run that replaced it, with what their "
            "recorded identities say differs.")


class Superseded(NamedTuple):
    study: str  # the claims study (key of the runs file) whose chosen design holds the job
    old: RunData  # the run that no longer counts
    kept: RunData  # the newest run of the same job, which counts


def superseded_runs(studies: Mapping[str, Sequence[RunData]]) -> list[Superseded]:
    """The runs that count but are not the newest of their job, in the design each study reads (``one_design``),
    each with the kept run of its job; ordered by study, job, start time."""
    out = []
    for name, runs in sorted(one_design(dict(studies), SUITE_VERSIONS, counts).items()):
        kept = {job_key(r): r for r in newest_per_job(runs, counts) if counts(r) and job_key(r) is not None}
        for r in runs:
            if counts(r) and job_key(r) is not None and kept[job_key(r)] is not r:
                out.append(Superseded(name, r, kept[job_key(r)]))
    return sorted(out, key=lambda s: (s.study, str(job_key(s.old)), s.old.start_time))


def artifact_key(r: RunData, param: str) -> str:
    """The cache key (last folder) of the artifact a run's `param` names, '' when it names none."""
    return str(r.params.get(param) or "").rstrip("/").rsplit("/", 1)[-1]


def differences(old: RunData, kept: RunData) -> list[str]:
    """What the two runs' recorded identities say differs, each a short phrase; a tag only one of them recorded is
    named as not recorded by the other (runs made before it was logged)."""
    out = []
    a, b = old.tags.get(COMMIT_TAG, "")[:7], kept.tags.get(COMMIT_TAG, "")[:7]
    if a != b:
        out.append(f"commit {a or '?'} → {b or '?'}")
    for p in ARTIFACT_PARAMS:
        ka, kb = artifact_key(old, p), artifact_key(kept, p)
        if ka != kb:
            out.append(f"another `{p}` artifact (cache key {ka[:8] or '?'} → {kb[:8] or '?'}: built from another "
                       "spec or code)")
    if old.tags.get(UPSTREAM_RM_TAG) != kept.tags.get(UPSTREAM_RM_TAG):
        out.append("another RM run")
    for tag, what in ((CODE_TAG, "package code"), (CONFIG_TAG, "composed config"), (INPUTS_TAG, "local inputs"),
                      (CPU_TAG, "CPU kernels"), (STUDY_DIGEST_TAG, "study file")):
        va, vb = old.tags.get(tag), kept.tags.get(tag)
        if va and vb and va != vb:
            out.append(f"{what} {va[:8]} → {vb[:8]}")
        elif vb and not va and tag in (CODE_TAG, CPU_TAG):
            out.append(f"{what} not recorded by the earlier run")
    keys = [k for k in sorted(set(old.params) | set(kept.params)) if k not in ARTIFACT_PARAMS]
    changed = [f"{k} {old.params[k]} → {kept.params[k]}" for k in keys
               if k in old.params and k in kept.params and old.params[k] != kept.params[k]]
    new = [k for k in keys if k not in old.params]
    if changed:
        out.append("logged " + ", ".join(changed))
    if new:
        out.append(f"{len(new)} options the earlier code did not have ({', '.join(new[:3])}"
                   + (", …" if len(new) > 3 else "") + ")")
    return out or ["nothing recorded differs (the same commit, artifacts and config: nondeterminism)"]


def figure(r: RunData) -> str:
    """What the run gives that a claim reads: a policy run's final gold and split-half drop, an RM's accuracy."""
    if r.stage in POLICY_STAGES:
        return f"{fmt(final_gold(r))} / {fmt(gold_drop(r))}"
    return f"acc {fmt(r.metrics.get('rm/accuracy', float('nan')))}"


def overrides(r: RunData) -> str:
    key = job_key(r)
    return " ".join(f"{k}={v}" for k, v in key[2] if k != "sweep") if key else "?"


def summary(rows: Sequence[Superseded]) -> list[str]:
    """One line per study tag: how many runs were superseded, their commits and the kept runs', how many started
    from another SFT artifact, and the mean absolute change of final gold (policy runs)."""
    by: dict[str, list[Superseded]] = {}
    for s in rows:
        by.setdefault(s.old.tags.get("rlhf_lab.study", s.study), []).append(s)
    out = []
    for tag, rs in sorted(by.items()):
        commits = lambda runs: ", ".join(sorted({r.tags.get(COMMIT_TAG, "?")[:7] for r in runs}))  # noqa: E731
        other = sum(any(artifact_key(s.old, p) != artifact_key(s.kept, p) for p in ARTIFACT_PARAMS) for s in rs)
        gaps = [abs(final_gold(s.old) - final_gold(s.kept)) for s in rs if s.old.stage in POLICY_STAGES]
        gaps = [g for g in gaps if g == g]
        out.append(f"- `{tag}`: {len(rs)} run{'s' if len(rs) > 1 else ''} at {commits([s.old for s in rs])}, "
                   f"replaced by runs at {commits([s.kept for s in rs])}; {other} of {len(rs)} started from another "
                   "SFT, RM backbone or reference artifact than the run that replaced them"
                   + (f"; final gold moved by {fmt(sum(gaps) / len(gaps))} on average (largest {fmt(max(gaps))})"
                      if gaps else "") + ".")
    return out


def superseded_section(rows: Sequence[Superseded]) -> list[str]:
    """The report's list of superseded runs (empty list: the section says there are none)."""
    lines = [SECTION, ""]
    if not rows:
        return lines + ["No run of a counted job was replaced by a newer one.", ""]
    lines += ["Runs that count but were replaced by a newer run of the same job (the rule in the header), by study "
              "tag and job: each run's final gold (test split) / split-half drop from the peak (an RM run: its "
              "accuracy), and what the two runs recorded differently. Runs made before the job's digests and CPU "
              "kernels were recorded (2026-12-05) can be told apart only by their commit, their upstream artifacts "
              "and their logged config: an artifact's cache key digests its spec, the cache version and the code of "
              "the stage that built it, so a run that started from another SFT, backbone or reference artifact "
              "trained from another model, built by other code or config (the commits say which); the CPU kernels "
              "of such a run are unknown, so they are not ruled out as a further cause.", "",
              *summary(rows), "",
              md_table(["study", "job", "superseded run (commit)", "its gold / drop", "kept run (commit)",
                        "its gold / drop", "what differs"],
                       [[f"`{s.old.tags.get('rlhf_lab.study', s.study)}`", f"`{overrides(s.old)}`",
                         f"`{s.old.run_id[:8]}` ({s.old.tags.get(COMMIT_TAG, '?')[:7]})", figure(s.old),
                         f"`{s.kept.run_id[:8]}` ({s.kept.tags.get(COMMIT_TAG, '?')[:7]})", figure(s.kept),
                         "; ".join(differences(s.old, s.kept))] for s in rows]), ""]
    return lines
