"""reports/PREREGISTERED.md (issue 69): every recorded file of a pre-registered design or its analysis matches its last
record, and each record the file its commit holds; every study file the record names exists and is recorded with its
analysis code. Reads files and ``git show`` only."""

from __future__ import annotations

from pathlib import Path

from rlhf_lab_research import freeze

ROOT = Path(__file__).resolve().parents[1]
PREREGISTERED = ROOT / "reports" / "PREREGISTERED.md"
STUDIES = {"ref_shared_matched": "rlhf_lab_research/claims_registry.py",
           "length_penalty_grid": "rlhf_lab_research/claims_registry.py",
           "gold_rm_replication": "rlhf_lab_research/studies/gold_replication.py",
           "algo_frontier_matched_tune": "rlhf_lab_research/studies/frontier_matched.py",
           "algo_frontier_matched": "rlhf_lab_research/studies/frontier_matched.py"}


def rows() -> list[dict]:
    return freeze.records(PREREGISTERED.read_text(encoding="utf-8"))


def test_every_recorded_file_matches_its_last_record():
    """A change to a recorded file needs a new record (PREREGISTERED.md says how); fails on any changed byte."""
    assert freeze.changed(rows(), ROOT) == []


def test_each_record_digests_the_file_its_commit_holds():
    for r in rows():
        assert freeze.at_commit(r, ROOT) == r["sha256"], (r["n"], r["study"], r["path"])


def test_each_study_is_recorded_with_its_study_file_and_its_analysis():
    last = freeze.latest(rows())
    for study, analysis in STUDIES.items():
        assert (study, f"sweeps/sweep/{study}.yaml") in last and (study, analysis) in last, study
        assert f"`{study}`" in PREREGISTERED.read_text(encoding="utf-8").split("## Records")[0]


def test_a_changed_byte_is_caught(tmp_path):
    f = tmp_path / "a.yaml"
    f.write_text("x: 1\n")
    row = {"n": 1, "study": "s", "path": "a.yaml", "commit": "0" * 40, "sha256": freeze.file_digest(f)}
    assert freeze.changed([row], tmp_path) == []
    f.write_text("x: 2\n")
    assert freeze.changed([row], tmp_path) == ["a.yaml (s)"]
    assert freeze.records("| 1 | `s` | `a.yaml` | `" + "0" * 40 + "` | `" + "a" * 64 + "` | why |")[0]["n"] == 1
