"""A dataset the job cannot use: one line naming file and line, no traceback, exit 2; the stage that first reads
the data has a FAILED run with that line as its error when it reads inside its run (the pretraining stage's evaluation
prompts), no run when it reads before (the RM's pairs)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlflow
import pytest

from rlhf_lab.data_errors import DataError, data_errors
from rlhf_lab.preferences import read_jsonl
from tests import cli_process
from tests.conftest import TINY

ROOT = Path(__file__).resolve().parents[1]
GOOD = {"prompt": "Review: the lamp", "chosen": " It is great.", "rejected": " bad"}


def write_rows(path: Path, bad_line: int = 2, n: int = 4) -> Path:
    lines = [json.dumps(GOOD) for _ in range(n)]
    lines[bad_line - 1] = '{"prompt": "x", "chosen": '  # not JSON
    path.write_text("\n".join(lines) + "\n")
    return path


def test_data_errors_are_one_line_naming_file_and_line(tmp_path):
    f = write_rows(tmp_path / "pairs.jsonl", bad_line=2)
    with pytest.raises(DataError) as exc, data_errors():
        read_jsonl(f)
    text = str(exc.value)
    assert "\n" not in text and f"{f}:2" in text and "1 bad row(s) of 4; fix or remove them: " in text
    assert isinstance(exc.value.__cause__, ValueError)  # the data layer's own error, kept as the cause
    with pytest.raises(DataError, match="no such file"), data_errors():
        read_jsonl(tmp_path / "absent.jsonl")


@pytest.mark.slow
def test_cli_bad_rows_exit_2_with_one_line_and_no_run(tmp_path, session_cache):
    f = write_rows(tmp_path / "pairs.jsonl", bad_line=3)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("HYDRA_FULL_ERROR", None)
    r = cli_process.run(["algo=rm", *[o for o in TINY if not o.startswith("data.")], "data=jsonl", f"data.path={f}",
                         f"cache_dir={session_cache}"], cwd=tmp_path, env=env, timeout=900)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("rlhf-lab: data error:")]
    assert len(errors) == 1 and f"{f}:3" in errors[0], r.stderr[-3000:]
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["rlhf-lab"]) if (tmp_path / "mlflow.db").exists() else []
    for _, run in (runs.iterrows() if len(runs) else []):  # none FINISHED or RUNNING past the bad data
        assert run["tags.rlhf_lab.stage"] != "rm"
        assert run["status"] == "FINISHED" or (run["status"] == "FAILED" and f"{f}:3" in run["tags.rlhf_lab.error"])
