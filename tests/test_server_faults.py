"""Faults of the team server and several users on it (issue 31), against a throwaway PostgreSQL-backed server
(`tests.test_team_scale.team_server`, a module of its own so that pytest-xdist runs it beside that one): the server
restarted while a job trains, the server down past MLflow's retries and the relaunch that finishes the sweep, and two
users' sweeps launched at the same moment. Slow: real processes; skipped, saying why, without PostgreSQL."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rlhf_lab.entry import server
from tests import cli_process
from tests.test_team_scale import (  # noqa: F401 (team_server: the fixture)
    DPO_MICRO, SERVER_WORKERS, cmd_env, login, run_cmd, team_server)


# a DPO job long enough (30 steps, an evaluation every 5) for the server to go away in its middle
DPO_LONGER = [*DPO_MICRO, "data.n_train=64", "trainer.max_steps=30", "eval.every_n_steps=5"]


def start_sweep(args: list[str], cwd: Path, **env) -> cli_process.CliProcess:
    """`rlhf-lab -m *args` as a process of its own, forked from a warm interpreter (tests/cli_process.py)."""
    cwd.mkdir(parents=True, exist_ok=True)
    return cli_process.start(["-m", *args], cwd=cwd, env=cmd_env(**env))


def output(proc: cli_process.CliProcess, timeout: float | None = None) -> str:
    """The sweep's stdout then its stderr (where its last line, the summary or the error, goes): once it ended
    (`communicate`) with a `timeout`, else what it wrote so far."""
    return "".join(proc.output() if timeout is None else proc.communicate(timeout))


def study_runs(url: str, study: str) -> list:
    client = MlflowClient(url)
    exp = client.get_experiment_by_name("rlhf-lab")  # None until the first run of a fresh server
    return client.search_runs([exp.experiment_id], f"tags.`rlhf_lab.study` = '{study}'", max_results=200) if exp \
        else []


def wait_mid_job(url: str, study: str, proc: cli_process.CliProcess, points: int = 5, timeout: float = 240,
                 name: str | None = None) -> str:
    """The id of the study's first job run (or the one named `name`) once it has logged `points` DPO losses (the job
    is mid-training). The run is searched for until it exists, then only its history is read: each request costs
    the server about 30 ms of CPU (it checks the login; measured: 5 requests, 0.17 s), and the study's runs and
    every job run's history read each 0.3 s kept a tenth of a core busy for the whole wait."""
    client = MlflowClient(url)
    deadline = time.monotonic() + timeout
    run_id = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, output(proc)[-3000:]
        if run_id is None:
            run_id = next((r.info.run_id for r in study_runs(url, study)
                           if r.data.tags.get("rlhf_lab.job") == "true" and name in (None, r.info.run_name)), None)
        if run_id is not None and len(client.get_metric_history(run_id, "loss/dpo")) >= points:
            return run_id
        time.sleep(0.3)
    raise AssertionError(f"no job of {study} reached {points} steps in {timeout} s: {output(proc)[-3000:]}")


def job_finals(url: str, study: str) -> dict[str, tuple]:
    """{run name: (status, loss/dpo steps, eval steps, final test gold, final eval KL)} of the study's FINISHED jobs."""
    client = MlflowClient(url)
    out = {}
    for r in study_runs(url, study):
        if r.data.tags.get("rlhf_lab.job") == "true" and r.info.status == "FINISHED":
            out[r.info.run_name] = ([m.step for m in client.get_metric_history(r.info.run_id, "loss/dpo")],
                                    [m.step for m in client.get_metric_history(r.info.run_id, "eval/gold_reward")],
                                    r.data.metrics["test/gold_reward"], r.data.metrics["eval/kl"])
    return out


@pytest.mark.slow
def test_a_server_restart_mid_sweep_loses_nothing_and_past_the_retries_a_relaunch_finishes_it(team_server,  # noqa: F811
                                                                                              tmp_path):
    """Issue 31: the tracking server (PostgreSQL and MLflow) stopped and started again while a job trains.
    Within MLflow's retries the job pauses and loses no point; past them (1 retry here; the sweep's last job) the job
    fails with one line, the sweep exits 2 saying in one line that its parent could not be ended and how to finish
    the sweep, and a relaunch with skip_finished=true marks the orphaned runs KILLED and finishes the sweep with the
    figures of the first sweep."""
    url, folder = team_server
    port = int(url.rsplit(":", 1)[1])
    # one artifact cache for the three sweeps: b and its relaunch reuse a's upstream models (a job always trains and
    # logs its own steps; it only publishes its result to the cache)
    sweep = [*DPO_LONGER, "seed=0,1", f"cache_dir={tmp_path / 'cache'}"]

    def restart(down: float = 0.0) -> None:
        assert server.stop(folder)
        time.sleep(down)
        assert server.start(folder, port=port, workers=SERVER_WORKERS) == url

    a = start_sweep([*sweep, "study=restart_a"], tmp_path / "a", MLFLOW_TRACKING_URI=url)
    wait_mid_job(url, "restart_a", a)
    restart()
    out = output(a, timeout=480)
    assert a.returncode == 0, out[-3000:]
    finals = job_finals(url, "restart_a")
    assert sorted(finals) == ["dpo seed=0", "dpo seed=1"]
    for losses, evals, *_ in finals.values():  # every point once: none lost, none doubled by a retried request
        assert losses == list(range(30)) and evals == list(range(0, 31, 5))

    # past the retries: the server goes away in the sweep's last job and stays down until the sweep has given up
    # (issue 65: the job's traceback, then the sweep's end failing on the store, exit 0 and the parent RUNNING)
    few = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "0"}
    b = start_sweep([*sweep, "study=restart_b"], tmp_path / "b", MLFLOW_TRACKING_URI=url, **few)
    orphan = wait_mid_job(url, "restart_b", b, name="dpo seed=1")
    (parent,) = [r.info.run_id for r in study_runs(url, "restart_b") if r.data.tags["rlhf_lab.stage"] == "sweep"]
    assert server.stop(folder)
    out = output(b, timeout=300)
    assert server.start(folder, port=port, workers=SERVER_WORKERS) == url
    assert b.returncode == 2, out[-3000:]
    assert f"[rlhf-lab] job 1 FAILED: TrackingServerLost: lost the MLflow tracking server at {url} during the dpo " \
           f"run {orphan}" in out and "Traceback" not in out
    last = out.strip().splitlines()[-1]  # the sweep's end could not reach the server to end its parent
    assert last.startswith(f"rlhf-lab: cannot reach the MLflow tracking server at {url}") and \
        f"parent MLflow run {parent} could not be marked FAILED" in last and "MLFLOW_TRACKING_URI" in last and \
        "run the same command again with skip_finished=true" in last, last
    for run_id in (orphan, parent):  # nothing could reach the server to end them
        assert MlflowClient(url).get_run(run_id).info.status == "RUNNING"

    again = run_cmd(["-m", "rlhf_lab.entry.run", "-m", *sweep, "study=restart_b", "skip_finished=true"], tmp_path / "b",
                    MLFLOW_TRACKING_URI=url)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "1 job skipped (a finished run computed the same)" in again.stdout, again.stdout[-3000:]
    runs = {r.info.run_id: r for r in study_runs(url, "restart_b")}
    for run_id in (orphan, parent):
        assert runs[run_id].info.status == "KILLED" and "lost the tracking server" in runs[run_id].data.tags[
            "rlhf_lab.error"]
    assert "RUNNING" not in {r.info.status for r in runs.values()}
    assert job_finals(url, "restart_b") == finals  # the relaunch finished the sweep with the same figures


@pytest.mark.slow
def test_two_users_sweeps_at_once_against_one_server_stay_apart(team_server, tmp_path):  # noqa: F811
    """Issue 31: two users (their own folders and MLflow logins, one shared cache folder, as on a cluster) launch a
    sweep of the same study at the same moment on one machine against one server (the shared experiment): each sweep's parent has exactly its own jobs, no
    live run is taken for a dead one (each job's start marks the dead processes' runs of its host KILLED), the
    upstream models are built once for both, and the study's report reads both when asked (--all-authors)."""
    url, folder = team_server
    shared = f"cache_dir={tmp_path / 'shared_cache'}"
    procs = {user: start_sweep([*DPO_MICRO, "study=two_users", f"seed={seeds}", shared], tmp_path / user,
                               MLFLOW_TRACKING_URI=url, **login(folder / "users" / f"{user}.credentials"))
             for user, seeds in (("ann", "0,1"), ("bob", "2,3"))}
    outs = {user: output(p, timeout=480) for user, p in procs.items()}
    for user, p in procs.items():
        assert p.returncode == 0, (user, outs[user][-3000:])
        assert "of dead processes KILLED" not in outs[user]
    assert len(list((tmp_path / "shared_cache" / "pretrain").glob("*/rlhf_lab_spec.json"))) == 1
    runs = study_runs(url, "two_users")
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert sum(r.data.tags["rlhf_lab.stage"] == "pretrain" for r in runs) == 1  # built once, under the cache's lock
    parents = [r for r in runs if r.data.tags["rlhf_lab.stage"] == "sweep"]
    assert len(parents) == 2, outs  # each sweep its parent (it lost one when both created the experiment at once)
    children = {p.data.tags["rlhf_lab.pid"]: sorted(r.info.run_name for r in runs
                                                     if r.data.tags.get("mlflow.parentRunId") == p.info.run_id
                                                     and r.data.tags.get("rlhf_lab.job") == "true")
                for p in parents}
    assert sorted(children.values()) == [["dpo seed=0", "dpo seed=1"], ["dpo seed=2", "dpo seed=3"]]
    rep = run_cmd(["-m", "rlhf_lab.entry.report", "two_users", "--uri", url, "--out", str(tmp_path / "reports"),
                   "--all-authors"], tmp_path)  # both users' runs (by default a report reads its user's own)
    assert rep.returncode == 0, rep.stderr[-3000:]
    text = (tmp_path / "reports" / "two_users" / "README.md").read_text()
    assert "4 finished runs (dpo); seeds 0, 1, 2, 3" in text
