"""The figures the README and the docs quote come from files the project writes, not from typing: each is checked
against its file here.

- docs/development.md: the test count and time is the run in tests/timing.json (tests/timing.py).
- docs/results.md: every "estimate [low, high]" interval is one of a committed report under reports/ (at its
  rounding, up to its sign where the page says "below" or "lower"), and the main job's figures are its committed
  summary, reports/main_job/summary.json (the command and commit that produced it are in that file).
- README.md, "Your first 15 minutes": the default job's time and its annotated summary lines are that summary's.
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
MAIN_JOB = json.loads((ROOT / "reports" / "main_job" / "summary.json").read_text())


def page(name: str) -> str:
    """A docs page's text with its line breaks and indentation folded to single spaces (the pages wrap their lines)."""
    return " ".join((ROOT / "docs" / name).read_text().split())


def value(text: str) -> float:
    return float(text.replace("−", "-"))  # also 3.88e-05, as reports write tiny bounds


def decimals(text: str) -> int:
    return len(text.split("e")[0].split(".")[1]) if "." in text else 0


def intervals(text: str) -> list[tuple[str, tuple[float, float, float]]]:
    return [(m.group(0), tuple(value(g) for g in m.groups())) for m in INTERVAL.finditer(text)]


def same_at(d: int, ours: tuple[float, ...], theirs: tuple[float, ...]) -> bool:
    return all(abs(a - b) <= 0.5 * 10 ** -d + 1e-9 for a, b in zip(ours, theirs))


def test_the_development_page_quotes_the_measured_test_run():
    data = json.loads(timing.FILE.read_text())
    assert data["command"] == "python -m pytest -q", data["command"]  # the README's own command, nothing added
    assert timing.sentence(data) in page("development.md"), timing.sentence(data)


def test_every_interval_in_results_is_in_a_committed_report():
    reported = [iv for f in sorted((ROOT / "reports").rglob("*.md")) for _, iv in intervals(" ".join(f.read_text().split()))]
    missing = []
    for text, (e, lo, hi) in intervals(page("results.md")):
        d = max(decimals(t) for t in INTERVAL.match(text).groups())
        if not any(same_at(d, (e, lo, hi), r) or same_at(d, (-e, -hi, -lo), r) for r in reported):
            missing.append(text)
    assert not missing, f"docs/results.md quotes intervals no committed report has: {missing}"


def test_the_main_job_figures_are_its_committed_summary():
    text = page("results.md")
    m = MAIN_JOB["summary"]
    for figure in (m["test gold"], m["kl"], m["beta"], MAIN_JOB["command"]):
        assert figure in text, figure


def test_the_readme_first_job_quotes_its_committed_summary_and_time():
    """The annotated summary lines and the time of the default job in the README's first 15 minutes."""
    start = README.index("\n## Your first 15 minutes\n")
    text = README[start:README.find("\n## ", start + 1)]
    for key in ("test gold", "kl", "beta", "proxy"):
        assert f"  {key:<11}: {MAIN_JOB['summary'][key]}" in text, key  # as the job prints it (entry/run.py)
    m, s = divmod(round(MAIN_JOB["wall_s"]), 60)
    assert f"{m} min {s} s of wall time" in text
    cm, cs = (int(x) for x in re.search(r"(\d+) min (\d+) s of\s+CPU time", text).groups())
    assert abs(cm * 60 + cs - MAIN_JOB["cpu_s"]) <= 1, (cm, cs, MAIN_JOB["cpu_s"])
    assert f"reports/main_job/summary.json" in text
