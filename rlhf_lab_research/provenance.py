"""The claims report's last table: where each study's counted runs come from, which seeds were added after the
study file's own, and whether today's code reproduced its stored seed-0 run before they were.

``rlhf-lab-suite --more-seeds`` and ``--decide`` rerun a study's stored seed-0 run under the study tag
``<study>_reproduce`` before adding seeds to it (:mod:`rlhf_lab_research.suite_seeds`); the claims report reads those runs
too (:data:`REPRODUCE_SUFFIX`), keeps them in its runs file, and this table compares them with the stored run.
"""

from __future__ import annotations

import datetime
from functools import cache
from typing import Any, Iterable, Sequence

from rlhf_lab.analysis.study_runs import POLICY_STAGES, STUDY_TAG, RunData
from rlhf_lab.analysis.snapshot import newest_per_job
from rlhf_lab.runs.code import CPU_TAG

REPRODUCE_SUFFIX = "_reproduce"  # the study tag of a stored seed-0 run's rerun
REPRODUCED_KEYS = ("test/gold_reward", "eval/gold_reward", "eval/kl")  # what a rerun of seed 0 must give again
REPRODUCED_RM_KEYS = ("rm/accuracy", "rm/accuracy_gold", "rm/spearman_gold")  # the same of a study of RMs alone
TOLERANCE = 1e-9  # relative

PROVENANCE = "## Where the runs come from"
PROVENANCE_HEADER = ["study", "runs", "seeds (added after the study file's)", "commit (runs)",
                     "first start – last end (UTC)", "seed 0 rerun before seeds were added"]


def provenance_text(file_name: str) -> str:
    return ("Every run counted above, by study: its seeds (those past the study file's own were added later, after a "
            "report had asked for them: a second look at the data, which fixed-sample intervals do not allow for), "
            "the code it ran (its `rlhf_lab.git_commit` tag) and when, and whether today's code, rerunning the "
            "study's stored seed-0 run before seeds were added (study tag `<study>_reproduce`), gave the same "
            f"{', '.join(REPRODUCED_KEYS)} (an RM study: {', '.join(REPRODUCED_RM_KEYS)}) to {TOLERANCE:g} relative. "
            "Relaunching a study with `skip_finished=true` in the same folder runs only what is missing. Every run read "
            f"is also kept beside this file, in `{file_name}`: `rlhf-lab-report --claims --runs reports/{file_name}` "
            "adds them to the store's (on a new machine, say), and with `--no-store` recomputes the verdicts from that "
            "file alone.")


def redone_text(redone: dict[str, tuple[tuple[str, ...], str]]) -> str:
    """The note under the table: which designs replaced an earlier one after its results were seen (`redone`:
    :data:`rlhf_lab_research.designs.REDONE`)."""
    items = [f"`{new}` replaced {', '.join(f'`{o}`' for o in old)} ({why})" for new, (old, why) in redone.items()]
    return ("**Designs redone after their results were seen:** " + "; ".join(items) + ". The replacements were chosen "
            "knowing the earlier results (a second look of another kind than added seeds, which no interval here "
            "allows for); each claim reads one design, never a mix.")


def day(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M") if ms else "?"


@cache
def file_seeds(study: str) -> tuple[int, ...] | None:
    """The seeds a study file sweeps (``hydra.sweeper.params.seed`` of ``sweeps/sweep/<study>.yaml``, or of an
    archived design), or None."""
    import yaml

    from rlhf_lab.runs.jobs import study_file

    f = study_file("sweep", study)
    if f is None:
        return None
    node = yaml.safe_load(f.read_text()) or {}
    seeds = (((node.get("hydra") or {}).get("sweeper") or {}).get("params") or {}).get("seed")
    try:
        return tuple(int(s) for s in str(seeds).split(",")) if seeds is not None else None
    except ValueError:
        return None


def spans(seeds: Sequence[int]) -> str:
    """``0–4, 7`` for [0, 1, 2, 3, 4, 7]."""
    out: list[str] = []
    prev: int | None = None
    for s in sorted(set(seeds)):
        if prev is not None and s == prev + 1:
            out[-1] = f"{out[-1].split('–')[0]}–{s}"
        else:
            out.append(str(s))
        prev = s
    return ", ".join(out)


def seeds_present(runs: Sequence[RunData]) -> list[int]:
    """The distinct integer seeds of a study's runs, sorted."""
    return sorted({int(r.seed) for r in runs if str(r.seed).lstrip("-").isdigit()})


def seeds_cell(study: str, runs: Sequence[RunData]) -> str:
    seeds = seeds_present(runs)
    own = file_seeds(study)
    added = [s for s in seeds if own is not None and s not in own]
    return spans([s for s in seeds if s not in added]) + (f" (+ {spans(added)} added)" if added else "")


def stored_seed0(runs: Sequence[RunData]) -> RunData | None:
    """A study's stored seed-0 run as the suite picks it to rerun: its first FINISHED policy run of seed 0 (by its
    overrides), else its first RM run of seed 0; of a job run more than once (a rerun kept beside the first run),
    the newest, as the report counts it (:func:`~rlhf_lab.analysis.snapshot.newest_per_job`)."""
    mine = newest_per_job([r for r in runs if r.seed == "0" and r.status == "FINISHED"
                           and r.stage in (*POLICY_STAGES, "rm") and r.tags.get("rlhf_lab.overrides")])
    return min(mine, key=lambda r: (r.stage not in POLICY_STAGES, r.tags["rlhf_lab.overrides"]), default=None)


def reproduced_keys(stored: RunData) -> tuple[str, ...]:
    """What a rerun of `stored` must give again: an RM run's held-out figures, else a policy run's gold and KL."""
    return REPRODUCED_RM_KEYS if stored.stage == "rm" else REPRODUCED_KEYS


def same(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and abs(a - b) <= TOLERANCE * max(1.0, abs(a))


def reproduction_cell(stored: RunData | None, reruns: Sequence[RunData]) -> str:
    """Whether the newest FINISHED rerun of `stored` gave its figures again."""
    done = [r for r in reruns if r.status == "FINISHED"]
    if not done:
        return "–"
    new = max(done, key=lambda r: r.start_time)
    when = f"rerun at {new.tags.get('rlhf_lab.git_commit', '?')[:7]}, {day(new.start_time)}"
    if new.tags.get(CPU_TAG):  # the CPU kernels it computed with (recorded since 2026-12-05)
        when += f", {new.tags[CPU_TAG]} kernels"
    if stored is None:
        return f"no stored seed-0 run to compare ({when})"
    differ = [k for k in reproduced_keys(stored) if not same(stored.metrics.get(k), new.metrics.get(k))]
    if differ:
        k = differ[0]
        return f"**differs** ({when}): {k} {stored.metrics.get(k)} stored, {new.metrics.get(k)} rerun"
    return f"equal ({when})"


def provenance_rows(runs: Iterable[RunData], reruns: dict[str, list[RunData]] | None = None) -> list[list[Any]]:
    """One row per study (tag ``rlhf_lab.study``) of the counted runs: runs, seeds (those added past the study file's
    marked), the code they ran (tag ``rlhf_lab.git_commit``, short, with its number of runs), when (first start to
    last end, UTC), and its seed-0 rerun (`reruns`: {study tag: the runs of ``<tag>_reproduce``})."""
    by: dict[str, list[RunData]] = {}
    for r in runs:
        by.setdefault(r.tags.get(STUDY_TAG, "?"), []).append(r)
    rows = []
    for study, rs in sorted(by.items()):
        commits: dict[str, int] = {}
        for r in rs:
            c = r.tags.get("rlhf_lab.git_commit", "")[:7] or "?"
            commits[c] = commits.get(c, 0) + 1
        starts = [r.start_time for r in rs if r.start_time]
        ends = [r.end_time for r in rs if r.end_time]
        rows.append([f"`{study}`", len(rs), seeds_cell(study, rs),
                     ", ".join(f"{c} ({n})" for c, n in sorted(commits.items())),
                     f"{day(min(starts)) if starts else '?'} – {day(max(ends)) if ends else '?'}",
                     reproduction_cell(stored_seed0(rs), (reruns or {}).get(study, []))])
    return rows


def reproduction_runs(all_runs: dict[str, list[RunData]]) -> dict[str, list[RunData]]:
    """{study tag: its seed-0 reruns} from the runs read (keys ``<tag>_reproduce``)."""
    return {k[: -len(REPRODUCE_SUFFIX)]: v for k, v in all_runs.items() if k.endswith(REPRODUCE_SUFFIX)}
