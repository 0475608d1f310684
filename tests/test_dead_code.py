"""No dead code in the packages: vulture (a dev dependency) finds nothing at 80 % confidence or more in rlhf_lab/ and
rlhf_lab_research/ (unused imports, variables, unreachable code, and functions or classes once its whitelist below
is too), besides the names Lightning's and Hydra's hooks take by signature (WHITELIST). A lower confidence lists
functions that only tests call, which stay where they are a tested API (e.g. RewardScorer.score_tokens)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# parameters a body need not read: those of framework hooks (Lightning's batch_idx and outputs, Hydra's job_return and
# the ConfigStore memo) and a functools cache's key (analysis/snapshot.checked_payload's file stamp)
WHITELIST = ("batch_idx", "outputs", "job_return", "memo", "stamp")


def test_vulture_finds_no_dead_code(tmp_path):
    pytest.importorskip("vulture")
    packages = [str(ROOT / p) for p in ("rlhf_lab", "rlhf_lab_research") if (ROOT / p).is_dir()]
    r = subprocess.run([sys.executable, "-m", "vulture", *packages, "--min-confidence", "80",
                        "--ignore-names", ",".join(WHITELIST)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, "dead code (vulture):\n" + r.stdout + r.stderr


def test_vulture_would_find_a_planted_unused_import(tmp_path):
    pytest.importorskip("vulture")
    (tmp_path / "m.py").write_text("import os\n\n\ndef f():\n    return 1\n    print('never')\n")
    r = subprocess.run([sys.executable, "-m", "vulture", str(tmp_path), "--min-confidence", "80"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "unused import 'os'" in r.stdout and "unreachable code" in r.stdout
