"""Ctrl-C of a sweep: every open run of the sweep ends KILLED before the launching process exits, or is named."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rlhf_lab.runs import states as run_states

ROOT = Path(__file__).resolve().parents[1]
LONG_JOB = ["algo=pretrain", "policy=a_tiny", "pretrain.n_texts=300", "trainer.max_steps=100000",
            "eval.every_n_steps=0", "eval.n_prompts=4", "trainer.progress_bar=false", "trainer.threads=1"]


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_an_interrupted_sweep_ends_its_runs_killed_and_names_those_it_cannot(tmp_path, monkeypatch):
    """The launching process's cleanup (no processes involved): the job run of a gone process and the parent end
    KILLED with the signal named; a job run on another host is left open and returned; a FINISHED one is kept."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("rlhf-lab")
    parent = client.create_run(exp, run_name="sweep").info.run_id
    host = socket.gethostname()

    def child(pid, h, status=None):
        tags = {"mlflow.parentRunId": parent, run_states.PID_TAG: str(pid), run_states.HOST_TAG: h}
        run_id = client.create_run(exp, tags=tags).info.run_id
        if status:
            client.set_terminated(run_id, status=status)
        return run_id

    gone, elsewhere, done = child(dead_pid(), host), child(os.getpid(), "another-host"), child(1, host, "FINISHED")
    monkeypatch.setattr(run_states, "OPEN_SWEEP", {"uri": uri, "run_id": parent, "experiment_id": exp})
    ended, left = run_states.end_interrupted_sweep("Interrupted: SIGINT", signal.SIGINT, grace_s=1)
    assert ended == [gone] and left == [elsewhere]
    status = {r: client.get_run(r).info.status for r in (parent, gone, elsewhere, done)}
    assert status == {parent: "KILLED", gone: "KILLED", elsewhere: "RUNNING", done: "FINISHED"}
    assert client.get_run(parent).data.tags["rlhf_lab.error"] == "Interrupted: SIGINT"
    assert client.get_run(gone).data.tags["rlhf_lab.error"].startswith("Interrupted: SIGINT")
    assert run_states.OPEN_SWEEP == {}  # once
    assert run_states.end_interrupted_sweep("Interrupted: SIGINT", signal.SIGINT) == ([], [])


def statuses(db: Path) -> dict[str, str]:
    with sqlite3.connect(db) as con:
        return dict(con.execute("select name, status from runs"))


@pytest.mark.slow
def test_ctrl_c_of_a_parallel_sweep_ends_every_run_killed(tmp_path):
    """Ctrl-C (SIGINT to the foreground process group) of a 2-job joblib sweep while both jobs run: exit 130, and
    the parent run and both job runs are KILLED when the launching process has exited (they stayed RUNNING)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [sys.executable, "-m", "rlhf_lab.entry.run", "-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=2",
           *LONG_JOB, "seed=0,1", "hydra.callbacks.mlflow_sweep.report=false"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    db, t0 = tmp_path / "mlflow.db", time.time()
    try:
        while time.time() - t0 < 400:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            try:
                if list(statuses(db).values()).count("RUNNING") == 3:
                    break
            except sqlite3.Error:
                pass
            time.sleep(0.5)
        else:
            raise AssertionError("the sweep's three runs were not RUNNING within 400 s")
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-3000:]
    assert "stopped by SIGINT; the open MLflow runs are KILLED" in err
    assert statuses(db) == {"sweep:multirun": "KILLED", "pretrain seed=0": "KILLED", "pretrain seed=1": "KILLED"}
