"""README's figures come from files the project writes, not from typing: each is checked against its file here.

- Development: the test count and time is the run in tests/timing.json (tests/timing.py).
- Results: every "estimate [low, high]" interval is one of a committed report under reports/ (at README's rounding,
  up to its sign where README says "below" or "lower"), and the main job's figures are its committed summary,
  reports/main_job/summary.json (the command and commit that produced it are in that file).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests import timing

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
NUM = r"[−-]?\d+(?:\.\d+)?(?:e[−+-]?\d+)?"
INTERVAL = re.compile(rf"({NUM}) \[({NUM}), ({NUM})\]")


def section(title: str) -> str:
    """The section's text with its line breaks and indentation folded to single spaces (README wraps its lines)."""
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return " ".join(README[start:end if end > 0 else None].split())


def value(text: str) -> float:
    return float(text.replace("−", "-"))  # also 3.88e-05, as reports write tiny bounds


def decimals(text: str) -> int:
    return len(text.split("e")[0].split(".")[1]) if "." in text else 0


def intervals(text: str) -> list[tuple[str, tuple[float, float, float]]]:
    return [(m.group(0), tuple(value(g) for g in m.groups())) for m in INTERVAL.finditer(text)]


def same_at(d: int, ours: tuple[float, ...], theirs: tuple[float, ...]) -> bool:
    return all(abs(a - b) <= 0.5 * 10 ** -d + 1e-9 for a, b in zip(ours, theirs))


def test_the_development_section_quotes_the_measured_test_run():
    data = json.loads(timing.FILE.read_text())
    assert data["command"] == "python -m pytest -q", data["command"]  # the README's own command, nothing added
    assert timing.sentence(data) in section("Development"), timing.sentence(data)


def test_every_interval_in_results_is_in_a_committed_report():
    reported = [iv for f in sorted((ROOT / "reports").rglob("*.md")) for _, iv in intervals(" ".join(f.read_text().split()))]
    missing = []
    for text, (e, lo, hi) in intervals(section("Results")):
        d = max(decimals(t) for t in INTERVAL.match(text).groups())
        if not any(same_at(d, (e, lo, hi), r) or same_at(d, (-e, -hi, -lo), r) for r in reported):
            missing.append(text)
    assert not missing, f"README Results quotes intervals no committed report has: {missing}"


def test_the_main_job_figures_are_its_committed_summary():
    run = json.loads((ROOT / "reports" / "main_job" / "summary.json").read_text())
    text = section("Results")
    m = run["summary"]
    for figure in (m["gold"], m["kl"], m["beta"], run["command"]):
        assert figure in text, figure
