"""The benchmark runner's results file, merged section by section."""

from __future__ import annotations

from pathlib import Path

from benchmarks import run as R
from benchmarks.team import BEGIN, END

ROOT = Path(__file__).resolve().parents[1]


def _section(name: str) -> str:
    return f"## {name.upper()} benchmark\n\nsome table\n\n_(1 s)_\n"


def _block(key: str) -> str:
    return f"- **{key}** (1 s): `python -m benchmarks.run`\n  - machine: test"


def _row(name: str, value: str) -> list[str]:
    return [f"`{name}`", f"{name} ratio", value, "ok"]


def test_partial_run_replaces_only_its_sections_and_keeps_the_others():
    team = f"{BEGIN}\n## Team scale\n\nkept\n{END}"
    first = R.results_text("", "run-1", _block("run-1"), {"dpo": _section("dpo"), "rm": _section("rm")},
                           {"dpo": _row("dpo", "1.5×"), "rm": _row("rm", "1.1×")}) + "\n" + team + "\n"
    second = R.results_text(first, "run-2", _block("run-2"), {"ppo": _section("ppo")}, {"ppo": _row("ppo", "1.2×")})
    runs, rows, sections = R.parse_results(second)
    assert list(sections) == ["dpo", "rm", "ppo"]  # BENCHMARKS order
    assert sections["dpo"][0] == sections["rm"][0] == "run-1" and sections["ppo"][0] == "run-2"
    assert list(rows) == ["dpo", "rm", "ppo"] and "1.5×" in rows["dpo"] and "1.2×" in rows["ppo"]
    assert set(runs) == {"run-1", "run-2"}
    assert "; sections: dpo, rm" in runs["run-1"] and "; sections: ppo" in runs["run-2"]
    assert second.count(BEGIN) == 1 and second.rstrip().endswith(END)  # the team-scale section stays, at the end

    # rerunning dpo and rm: run-1 no longer wrote any section and leaves the runs list
    third = R.results_text(second, "run-3", _block("run-3"), {"dpo": _section("dpo"), "rm": _section("rm")},
                           {"dpo": _row("dpo", "1.7×"), "rm": _row("rm", "1.0×")})
    runs, rows, sections = R.parse_results(third)
    assert set(runs) == {"run-2", "run-3"} and sections["dpo"][0] == "run-3" and "1.7×" in rows["dpo"]
    assert R.results_text(third, "run-3", runs["run-3"], {}, {}) == third  # nothing new: the same file


def test_results_file_has_every_section_marked():
    """The committed results file parses: every summary row has its section (the runner merges into it)."""
    runs, rows, sections = R.parse_results((ROOT / "benchmarks" / "results.md").read_text())
    assert set(rows) == set(sections) and set(sections) <= set(R.BENCHMARKS)
    assert {k for k, _ in sections.values()} == set(runs)
