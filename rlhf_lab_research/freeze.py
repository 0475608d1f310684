"""Freeze records: sha256 digests of files fixed before the runs that will test them (issues 67 and 69).

A record file (reports/ship/FROZEN.md, reports/PREREGISTERED.md) holds a markdown table whose rows name a file and
its digest at a commit; a test recomputes the digests of the files as they are now (:func:`changed`) and at the
recorded commit (:func:`at_commit`), so that changing a frozen file without a new record fails. Pure but for reading
files and ``git show``.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path
from typing import Iterable

ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*`([^`]+)`\s*\|\s*`([^`]+)`\s*\|\s*`([0-9a-f]{40})`\s*\|\s*`([0-9a-f]{64})`\s*\|")


def file_digest(path: Path | str) -> str:
    """The sha256 of a file's bytes, hex."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def records(text: str) -> list[dict]:
    """The rows of a record table ``| # | `study` | `path` | `commit` | `sha256` | ...``, in order: {n, study, path,
    commit, sha256}."""
    return [{"n": int(m[1]), "study": m[2], "path": m[3], "commit": m[4], "sha256": m[5]}
            for m in map(ROW.match, text.splitlines()) if m]


def latest(rows: Iterable[dict]) -> dict[tuple[str, str], dict]:
    """{(study, path): its last record}."""
    out: dict[tuple[str, str], dict] = {}
    for r in rows:
        out[(r["study"], r["path"])] = r
    return out


def changed(rows: Iterable[dict], root: Path | str) -> list[str]:
    """The files whose bytes under `root` now differ from their last record (or are missing), as 'path (study)'."""
    root = Path(root)
    return [f"{p} ({s})" for (s, p), r in latest(rows).items()
            if not (root / p).is_file() or file_digest(root / p) != r["sha256"]]


def at_commit(row: dict, root: Path | str) -> str:
    """The sha256 of the file a record names, as its commit holds it (``git show commit:path``)."""
    out = subprocess.run(["git", "show", f"{row['commit']}:{row['path']}"], cwd=root, capture_output=True, check=True)
    return hashlib.sha256(out.stdout).hexdigest()
