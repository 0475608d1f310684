"""Where ``rlhf-lab-report`` may write, and what it may overwrite.

- A study is named as the canned studies are (:func:`known_studies`: the names of ``sweeps/sweep/*.yaml``); any
  other plain name (letters, digits, ``_ - .``, no path) only with an explicit ``--out`` folder, so a misspelt name
  is an error rather than a "not run yet" report. A name is never a path: the report of study ``s`` is
  ``<out>/<s>/``, inside ``<out>`` (``reports/`` by default).
- A file is overwritten only if ``rlhf-lab-report`` wrote it (:func:`is_generated`): a markdown file whose first
  line is a heading and whose text names the command in backticks (`` `rlhf-lab-report ``, as every report it
  writes does: "Reproduce (then `rlhf-lab-report <study>`)", "Computed by `rlhf-lab-report --claims`"), or a
  runs file in the format of :mod:`~rlhf_lab.analysis.snapshot`. A report folder that exists without such a
  README.md but holds files is refused as a whole.

Every refusal is a :class:`ReportError` with a message of one line (the CLI prints it and exits 2).
"""

from __future__ import annotations

import difflib
import gzip
import re
from pathlib import Path

MARK = "`rlhf-lab-report"
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
RUNS_FILE_START = b'{"format":'  # snapshot.write_snapshot: sorted keys, "format" first


class ReportError(ValueError):
    """A study name or an output path rlhf-lab-report refuses; ``str(err)`` is one line."""


def known_studies() -> list[str]:
    """The canned studies: the names of the sweep files shipped in ``rlhf_lab.sweeps`` (``sweeps/sweep/*.yaml``, and
    the superseded designs of ``sweeps/archive/sweep/``, whose earlier reports can be written again)."""
    from rlhf_lab.runs.jobs import study_names

    return study_names(archived=True)


def check_study(study: str, own_out: bool, known: list[str] | None = None) -> None:
    """Raise :class:`ReportError` unless `study` is in `known` (default: the canned studies), or a plain name with
    `own_out` (``--out`` given)."""
    known = known_studies() if known is None else known
    if study in known:
        return
    if not PLAIN_NAME.fullmatch(study) or study in (".", ".."):
        raise ReportError(f"study {study!r} is not a study name (letters, digits, _ - . only; never a path): "
                          "the report goes to <out>/<study>/")
    if own_out:
        return
    close = difflib.get_close_matches(study, known, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise ReportError(f"unknown study {study!r}: {hint}the studies are the files of sweeps/sweep/ "
                      f"({', '.join(known)}); for a study of your own, pass --out DIR")


def is_generated(path: Path) -> bool:
    """Whether the existing file `path` was written by rlhf-lab-report (see the module's doc)."""
    path = Path(path)
    if path.name.endswith(".json.gz"):
        try:
            with gzip.open(path, "rb") as f:
                return f.read(len(RUNS_FILE_START)) == RUNS_FILE_START
        except (OSError, EOFError):
            return False
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return False
    return text.startswith("# ") and MARK in text


def check_file(path: Path) -> None:
    """Raise :class:`ReportError` when `path` exists and rlhf-lab-report did not write it."""
    path = Path(path)
    if path.is_symlink() or (path.exists() and not (path.is_file() and is_generated(path))):
        raise ReportError(f"{path} exists and was not written by rlhf-lab-report: not overwritten "
                          "(move it away, or pass --out to another folder)")


def check_folder(folder: Path) -> None:
    """Raise :class:`ReportError` unless the report folder `folder` is new, empty, or holds a README.md that
    rlhf-lab-report wrote (its PNGs are then the report's too)."""
    folder = Path(folder)
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise ReportError(f"{folder} exists and is not a report folder: not overwritten")
    if not folder.is_dir() or not any(folder.iterdir()):
        return
    readme = folder / "README.md"
    if not readme.is_file():
        raise ReportError(f"{folder} holds files that rlhf-lab-report did not write (no README.md of a report): "
                          "not overwritten (move them away, or pass --out to another folder)")
    check_file(readme)


def inside(out: Path, target: Path) -> Path:
    """`target`, after checking that it resolves inside the folder `out` (ReportError otherwise)."""
    if not Path(target).resolve().is_relative_to(Path(out).resolve()):
        raise ReportError(f"{target} is outside the output folder {out}: not written")
    return Path(target)


class NoRuns(ReportError):
    """A study without runs in the store the report reads (the CLI exits 1, nothing written)."""


def no_runs(study: str, store: str) -> NoRuns:
    """The error of a study without runs in the store `store`."""
    return NoRuns(f"no runs of study {study!r} in {store} (tag rlhf_lab.study={study}): nothing written; "
                       f"run it first (rlhf-lab -m sweep={study}) or name the store with --uri / MLFLOW_TRACKING_URI")
