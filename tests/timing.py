"""The measured test run that docs/development.md quotes: written by pytest, checked by a test.

`python -m pytest -q --timing-out tests/timing.json` (what `.ci/run` runs, plus the option) writes the run's counts,
wall time and machine to the file (tests/conftest.py's `pytest_terminal_summary`); `sentence` renders the page's
figure from it, and tests/test_readme_figures.py fails when docs/development.md says anything else.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from rlhf_lab.runs.process import write_atomic

ROOT = Path(__file__).resolve().parents[1]
FILE = ROOT / "tests" / "timing.json"


def record(stats: dict, wall_s: float, workers: int, args: list[str]) -> dict:
    """The file's content: counts per outcome, wall seconds, workers, cores, the command and where it ran."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    counts = {k: len(stats.get(k, [])) for k in ("passed", "failed", "skipped", "error")}  # pytest's summary line
    return {"counts": counts, "wall_s": round(wall_s, 1), "workers": workers, "cores": os.cpu_count(),
            "command": " ".join(["python", "-m", "pytest", *args]), "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "commit": commit, "python": platform.python_version(), "load_1min_at_end": round(os.getloadavg()[0], 1),
            "platform": sys.platform}


def without_option(args: list[str], option: str = "--timing-out") -> list[str]:
    """The command-line arguments without ``option`` and its value (``--opt value`` or ``--opt=value``)."""
    out, skip = [], False
    for a in map(str, args):
        if skip:
            skip = False
        elif a == option:
            skip = True
        elif not a.startswith(option + "="):
            out.append(a)
    return out


def write(path: str | os.PathLike, data: dict) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def sentence(data: dict) -> str:
    """docs/development.md's figure: e.g. '480 passed, 1 skipped in 8 min 41 s with 2 workers on 2 cores (2026-12-02, 4f3c2a1)'."""
    c = data["counts"]
    parts = [f"{c['passed']} passed"] + [f"{c[k]} {k}" for k in ("skipped", "failed", "error") if c[k]]
    m, s = divmod(round(data["wall_s"]), 60)
    return (f"{', '.join(parts)} in {m} min {s} s with {data['workers']} workers on {data['cores']} cores "
            f"({data['date']}, commit {data['commit']})")
