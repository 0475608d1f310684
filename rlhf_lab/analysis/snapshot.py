"""Runs as a file that travels with the repository: a study report's ``reports/<study>/runs.json.gz``, the claims'
``reports/claims_runs.json.gz``.

A tracking store lives on one machine; a report written from a store also writes every run it read (all statuses,
:class:`RunData` as it is: histories and the upstream RM's figures included), and ``--runs FILE`` reads such files
back, so that runs accumulate across machines and sessions and a report is recomputed from the repository alone
(``--no-store``).

The file is gzip'd JSON ``{"format", "sha256", "payload"}``, ``sha256`` the digest of the payload's canonical JSON. A
file whose format or digest does not match, that decompresses to more than :data:`MAX_JSON_BYTES` (a 3 MB gzip once
decompressed to 3 GB) or that nests deeper than Python's JSON reader goes is refused (:class:`SnapshotError`). It is
written to a temporary file and renamed: a killed writer leaves the old file whole.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import gzip
import hashlib
import io
import json
import marshal
import re
import sys
from pathlib import Path
from typing import Callable, Iterable, Sequence

from rlhf_lab.analysis.study_runs import RunData, job_key
from rlhf_lab.config.keys import computes
from rlhf_lab.runs.process import write_atomic

FORMAT = 1
FILE_NAME = "claims_runs.json.gz"
# a runs file's JSON, decompressed, at most: 256 MiB, ten times the largest one written (reports/claims_runs.json.gz,
# 22.5 MiB, read into about 100 MB of Python objects)
MAX_JSON_BYTES = 256 * 2**20

Studies = dict[str, list[RunData]]  # {claims study key (registry): its runs, all statuses}
Commands = dict[str, list[str]]     # {claims study key: the commands of its sweep parent runs}


class SnapshotError(ValueError):
    """A runs file that cannot be used: unreadable, another format, or a digest that does not match."""


def digest(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def run_to_dict(run: RunData) -> dict:
    """The run's fields as they are (no deep copy: the dict is serialised at once, which dataclasses.asdict made 12 s
    of a claims report's 22), its histories as [step, value] lists."""
    d = {f.name: getattr(run, f.name) for f in dataclasses.fields(run) if f.name != "history"}
    d["history"] = {k: [[int(s), float(v)] for s, v in pts] for k, pts in run.history.items()}
    return d


def tree_copy(value: object) -> object:
    """A deep copy of a tree of dicts, lists, strings, numbers and None (a runs file's JSON): marshal's round trip,
    about ten times faster than ``copy.deepcopy``, which copies whatever marshal refuses."""
    try:
        return marshal.loads(marshal.dumps(value))
    except ValueError:
        return copy.deepcopy(value)


def points(pts: Sequence) -> tuple[tuple[int, float], ...]:
    """A history's [step, value] pairs as (int, float) tuples: immutable, so the runs built from one read file may
    share them."""
    return tuple((int(s), float(v)) for s, v in pts)


def run_from_dict(d: dict) -> RunData:
    """A run of a runs file's payload, sharing nothing mutable with `d` (a read file's payload is kept for later
    reads; :func:`checked_payload` has made its histories tuples of points once)."""
    known = {f.name for f in dataclasses.fields(RunData)}
    run = RunData(**tree_copy({k: v for k, v in d.items() if k in known and k != "history"}))
    run.history = {k: list(pts if isinstance(pts, tuple) else points(pts))
                   for k, pts in (d.get("history") or {}).items()}
    run.setting = {k: v for k, v in run.setting.items() if computes(k)}  # a file written before they were left out
    return run


def write_snapshot(path: Path | str, studies: Studies, commands: Commands | None = None) -> Path:
    """Write `studies` (and their sweep commands) to `path`, atomically."""
    commands = commands or {}
    payload = {"studies": {name: {"runs": [run_to_dict(r) for r in runs], "commands": list(commands.get(name, []))}
                           for name, runs in sorted(studies.items())}}
    doc = {"format": FORMAT, "sha256": digest(payload), "payload": payload}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    # no name, mtime=0: the same runs give the same bytes (no spurious diff when nothing changed)
    with gzip.GzipFile(filename="", fileobj=buf, mode="wb", mtime=0) as gz:
        gz.write(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
    write_atomic(path, buf.getvalue())
    return path


def read_snapshot(path: Path | str) -> tuple[Studies, Commands]:
    """({study: runs}, {study: commands}) from a file written by :func:`write_snapshot`; SnapshotError otherwise."""
    try:
        st = Path(path).stat()
    except OSError as err:
        raise SnapshotError(f"{path}: not a readable runs file ({type(err).__name__}: {err})") from err
    payload = checked_payload(str(path), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    studies, commands = {}, {}
    for name, entry in payload.get("studies", {}).items():
        studies[name] = [run_from_dict(d) for d in entry.get("runs", [])]
        commands[name] = [portable_command(c) for c in entry.get("commands", [])]
    return studies, commands


@functools.lru_cache(maxsize=4)
def checked_payload(path: str, stamp: tuple) -> dict:
    """The payload of the runs file at `path`, its format, digest and layout checked; kept for this process while
    the file's `stamp` (device, inode, size, modification time) stays the same: decoding and checking the claims
    file takes about 3 s, and a report of every study reads it once per study. Never handed out: runs are built
    from it by :func:`run_from_dict`, which copies."""
    try:
        with gzip.open(path, "rb") as f:
            text = f.read(MAX_JSON_BYTES + 1)  # bounded: never more than the limit decompressed
        if len(text) > MAX_JSON_BYTES:
            raise SnapshotError(f"{path}: decompresses to more than {MAX_JSON_BYTES // 2**20} MiB of JSON, the most a "
                                "runs file may hold (rlhf-lab-report writes far less): not read; restore it from git or "
                                "regenerate it from a store")
        doc = json.loads(text)
        payload = doc.get("payload") if isinstance(doc, dict) else None
        matches = isinstance(payload, dict) and digest(payload) == doc.get("sha256")
    except RecursionError as err:  # json's reader (and its writer, for the digest) nest as deep as the recursion limit
        raise SnapshotError(f"{path}: JSON nested deeper than {sys.getrecursionlimit()} levels (a runs file nests "
                            "about 10): not a runs file; restore it from git or regenerate it from a store") from err
    except SnapshotError:
        raise
    except (OSError, EOFError, ValueError) as err:
        raise SnapshotError(f"{path}: not a readable runs file ({type(err).__name__}: {err})") from err
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SnapshotError(f"{path}: runs file format {doc.get('format') if isinstance(doc, dict) else '?'}, "
                            f"this version reads format {FORMAT}")
    if not matches:
        raise SnapshotError(f"{path}: the runs do not match their sha256 (the file is corrupted or was edited); "
                            "restore it from git or regenerate it from a store")
    problem = payload_problem(payload)
    if problem:
        raise SnapshotError(f"{path}: {problem}: not a runs file this version reads (its digest matches: it was "
                            "written so); regenerate it (rlhf-lab-report --claims on a store) or restore it from git")
    for entry in payload.get("studies", {}).values():  # checked: the points of each history as tuples, made once
        for run in entry.get("runs", []):
            run["history"] = {k: points(pts) for k, pts in (run.get("history") or {}).items()}
    return payload


def is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_texts(v: object) -> bool:
    return isinstance(v, dict) and all(isinstance(x, str) for x in v.values())


def is_numbers(v: object) -> bool:
    return isinstance(v, dict) and all(is_number(x) for x in v.values())


def is_history(v: object) -> bool:
    return isinstance(v, dict) and all(isinstance(pts, list) and all(
        isinstance(p, list) and len(p) == 2 and is_number(p[0]) and is_number(p[1]) for p in pts) for pts in v.values())


def is_rm(v: object) -> bool:
    return isinstance(v, dict) and is_numbers(v.get("metrics", {})) and isinstance(v.get("params", {}), dict)


def is_string(v: object) -> bool:
    return isinstance(v, str)


def is_integer(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# RunData's fields in a runs file (run_to_dict): what each must be; REQUIRED_FIELDS have no default
RUN_FIELDS: dict[str, tuple[str, Callable[[object], bool]]] = {
    "run_id": ("a string", is_string), "stage": ("a string", is_string), "status": ("a string", is_string),
    "params": ("a dict of strings", is_texts), "tags": ("a dict of strings", is_texts),
    "metrics": ("a dict of numbers", is_numbers), "history": ("a dict of [[step, value], ...] lists", is_history),
    "rm": ("a dict (metrics: numbers, params: a dict)", is_rm), "setting": ("a dict", lambda v: isinstance(v, dict)),
    "seed": ("a string", is_string), "start_time": ("an integer", is_integer), "end_time": ("an integer", is_integer),
}
REQUIRED_FIELDS = ("run_id", "stage", "status", "params", "tags", "metrics")


def kind(v: object) -> str:
    return "null" if v is None else type(v).__name__


def run_problem(d: object, where: str) -> str | None:
    """What is wrong with one run of a runs file (`where` names it), or None: RunData's fields, each of its type."""
    if not isinstance(d, dict):
        return f"{where} is {kind(d)}, not a run (a dict)"
    missing = [f for f in REQUIRED_FIELDS if f not in d]
    if missing:
        return f"{where} lacks {', '.join(missing)}"
    for field, (what, ok) in RUN_FIELDS.items():
        if field in d and not ok(d[field]):
            return f"{where}.{field} is not {what} ({kind(d[field])})"
    return None


def payload_problem(payload: dict) -> str | None:
    """What is wrong with the layout of a runs file's payload (``{"studies": {name: {"runs": [run, ...], "commands":
    [str, ...]}}}``), the first thing found; None when it is whole."""
    studies = payload.get("studies", {})
    if not isinstance(studies, dict):
        return f"studies is {kind(studies)}, not a dict of studies"
    for name, entry in studies.items():
        if not isinstance(entry, dict):
            return f"studies.{name} is {kind(entry)}, not a dict with runs and commands"
        runs, commands = entry.get("runs", []), entry.get("commands", [])
        if not isinstance(runs, list):
            return f"studies.{name}.runs is {kind(runs)}, not a list"
        if not (isinstance(commands, list) and all(isinstance(c, str) for c in commands)):
            return f"studies.{name}.commands is not a list of strings"
        problem = next((p for i, d in enumerate(runs) if (p := run_problem(d, f"studies.{name}.runs[{i}]"))), None)
        if problem:
            return problem
    return None


def merge(older: Studies, newer: Studies) -> Studies:
    """The union of two {study: runs} by run id (a run in both: `newer`'s copy). Every design's runs are kept (the
    file holds the runs of every committed study report, superseded designs included): a claim picks one design
    when it is judged (:func:`rlhf_lab_research.designs.one_design`)."""
    out: Studies = {}
    for name in list(dict.fromkeys([*older, *newer])):
        by_id = {r.run_id: r for r in older.get(name, [])}
        by_id.update({r.run_id: r for r in newer.get(name, [])})
        out[name] = list(by_id.values())
    return out


def newest_per_job(runs: Sequence[RunData], counts: Callable[[RunData], bool] = lambda r: True) -> list[RunData]:
    """`runs` with, of the runs that `counts` of one job (:func:`~rlhf_lab.analysis.study_runs.job_key`: study, stage, the
    overrides that change what it computes), only the newest (MLflow start time): a study run again (a fresh
    machine's rerun beside the runs kept in a file, another code version) replaces its earlier runs instead of being
    pooled with them. Runs that do not count, or whose job is not known, are kept as they are."""
    newest: dict[tuple, RunData] = {}
    for r in runs:
        job = job_key(r)
        if counts(r) and job is not None:
            if job not in newest or r.start_time >= newest[job].start_time:
                newest[job] = r
    keep = {id(r) for r in newest.values()}
    return [r for r in runs if not counts(r) or job_key(r) is None or id(r) in keep]


def portable_command(command: str) -> str:
    """A sweep's command without the machine's folders: an absolute path to an artifact the suite prepares
    (``.../suite_artifacts/<name>/artifact``, :data:`rlhf_lab_research.suite_prepare.PREPARE`) written relative to the suite's working
    folder, where ``rlhf-lab-suite`` prepares it again; a ``tracking.uri=`` or ``cache_dir=`` override (where that
    machine logged the runs or kept its artifacts, not what they compute) left out; the rest as it is."""
    command = re.sub(r"\s+(tracking\.uri|cache_dir)=\S+", "", command)
    return re.sub(r"(?<==)/\S*?/(suite_artifacts/\S+)", r"\1", command)


def commands_of(commands: Sequence[str], tags: Iterable[str]) -> list[str]:
    """The commands whose ``sweep=<study>`` names one of the study tags `tags` (a file entry holds the commands of
    every design of its key), or all of them when none does."""
    tags = set(tags)
    mine = [c for c in commands if set(re.findall(r"\bsweep=(\S+)", c)) & tags]
    return mine or list(commands)
