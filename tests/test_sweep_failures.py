"""A sweep whose job failed, whatever the way, exits non-zero and ends its parent run FAILED, or says in one line
that it cannot (issue 65, item 6): a job's exit that stops the sweep, an error a launcher raises for a job it lost,
a sweep's end that cannot reach the store, a job whose tracking server is gone. In-process sweeps of the basic
launcher whose jobs are stand-ins (no training); the sweep against a tracking server killed mid-job is in
tests/test_server_faults.py."""

from __future__ import annotations

import socket
import sys

import pytest
from hydra.core.plugins import Plugins
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from rlhf_lab.entry import sweeps
from rlhf_lab.runs import states as run_states


@pytest.fixture
def sweep(tmp_path, monkeypatch):
    """`rlhf-lab -m seed=0,1` on a sqlite store in tmp_path, in this process, whose jobs call `job(seed)` instead of
    training; returns (run it: the SystemExit or exception it ends with, or None; the parent run)."""
    from rlhf_lab import stages
    from rlhf_lab.entry import run as cli
    from rlhf_lab.runs import process as runtime

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(runtime, "JOBS_STARTED", [0])
    monkeypatch.setattr(run_states, "OPEN_SWEEP", {})
    monkeypatch.setattr(sweeps, "OPEN_SWEEP", run_states.OPEN_SWEEP)
    monkeypatch.setattr(sys, "argv", ["rlhf-lab", "-m", "study=unit", "seed=0,1", f"tracking.uri={uri}",
                                      f"hydra.sweep.dir={tmp_path / 'multirun'}", "hydra/job_logging=none",
                                      "hydra/hydra_logging=none", "hydra.callbacks.mlflow_sweep.report=false"])

    def launch(job):
        monkeypatch.setattr(stages, "run_job", lambda cfg, out: job(int(cfg.seed)) or {"eval": {}})
        try:
            cli.main()
        except BaseException as end:  # noqa: BLE001  (SystemExit, or what a launcher raised)
            return end
        return None

    def parent():
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("rlhf-lab")
        (run,) = client.search_runs([exp.experiment_id], "tags.`rlhf_lab.stage` = 'sweep'")
        return run

    return launch, parent


@pytest.mark.slow
def test_a_job_that_exits_stops_the_sweep_with_its_status_and_the_parent_failed(sweep, capsys):
    """A job's SystemExit (the start-up check of a job whose tracking server went away exits 2) leaves the
    basic launcher before the sweep's end: the parent was left RUNNING."""
    launch, parent = sweep

    def job(seed):
        if seed == 1:
            raise SystemExit(2)

    end = launch(job)
    assert isinstance(end, SystemExit) and end.code == 2
    run = parent()
    assert run.info.status == "FAILED" and "exit status 2" in run.data.tags["rlhf_lab.error"]
    assert f"parent run {run.info.run_id} FAILED" in capsys.readouterr().err
    assert run_states.OPEN_SWEEP == {}


@pytest.mark.slow
def test_a_launchers_error_for_a_lost_job_ends_the_parent_failed(sweep, monkeypatch):
    """An error the launcher raises (joblib's TerminatedWorkerError for a worker the OOM killer took, a Ray task
    lost) ends the sweep before its end (Hydra prints its traceback and exits 1): the parent was left RUNNING."""
    launch, parent = sweep
    # the class Hydra instantiates (its plugin scan may load the module again: not an import's class)
    basic = Plugins.instance().class_name_to_class["hydra._internal.core_plugins.basic_launcher.BasicLauncher"]
    original = basic.launch

    def losing(self, job_overrides, initial_job_idx):
        original(self, job_overrides, initial_job_idx)
        raise RuntimeError("A worker process managed by the executor was unexpectedly terminated")

    monkeypatch.setattr(basic, "launch", losing)
    end = launch(lambda seed: None)
    assert isinstance(end, SystemExit) and end.code == 1  # Hydra printed the error's traceback and exited 1
    run = parent()
    assert run.info.status == "FAILED" and "exit status 1" in run.data.tags["rlhf_lab.error"]


@pytest.mark.slow
def test_a_sweeps_end_that_cannot_reach_the_store_exits_nonzero(sweep, monkeypatch, capsys):
    """A job failed, then the sweep's end fails on the store (a tracking server gone): Hydra turned the callback's
    exception into a warning and the sweep exited 0 with its parent RUNNING."""
    launch, parent = sweep

    def job(seed):
        if seed == 0:
            raise RuntimeError("a job's error")

    def store_gone(client, experiment_id):
        raise MlflowException("API request to http://127.0.0.1:5000/api/2.0/mlflow/runs/search failed")

    monkeypatch.setattr(sweeps, "mark_dead_runs", store_gone)
    end = launch(job)
    assert isinstance(end, SystemExit) and end.code == 1
    run = parent()  # the store answers again here: the parent is FAILED with both causes
    assert run.info.status == "FAILED"
    assert "job 0" in run.data.tags["rlhf_lab.error"] and "MlflowException" in run.data.tags["rlhf_lab.error"]
    assert "job 0 FAILED: RuntimeError: a job's error" in capsys.readouterr().err


def closed_port() -> int:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_jobs_error_with_its_tracking_server_gone_is_one_line_naming_the_server():
    url = f"http://127.0.0.1:{closed_port()}"
    err = MlflowException(f"API request to {url}/api/2.0/mlflow/runs/update failed with exception "
                          "HTTPConnectionPool(...): Max retries exceeded")
    line = sweeps.server_failure_line(err, url)
    assert line.startswith(f"MlflowException: cannot reach the MLflow tracking server at {url} (")
    assert "MLFLOW_TRACKING_URI" in line and "\n" not in line
    assert sweeps.server_failure_line(err, "sqlite:///mlflow.db") is None  # a store without a server: the error


def test_a_failed_sweep_whose_server_is_gone_says_so_in_one_line(monkeypatch, capsys):
    url = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setattr(run_states, "OPEN_SWEEP", {"uri": url, "run_id": "abc", "experiment_id": "1"})
    monkeypatch.setattr(sweeps, "OPEN_SWEEP", run_states.OPEN_SWEEP)
    assert sweeps.end_failed_sweep("the sweep stopped with exit status 2")  # why: the server cannot be reached
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"rlhf-lab: cannot reach the MLflow tracking server at {url} (")
    assert "MLFLOW_TRACKING_URI" in err and "parent MLflow run abc could not be marked FAILED" in err
    assert run_states.OPEN_SWEEP == {} and sweeps.end_failed_sweep("again") is None  # once
