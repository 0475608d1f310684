"""Team scale: the tracking server on PostgreSQL (rlhf-lab-server), sweeps through Ray and submitit, the study
report inside a sweep's parent run.

The slow tests start real processes: a throwaway PostgreSQL and `mlflow server` on free loopback ports (skipped,
with the reason, where PostgreSQL's binaries are absent), a local Ray instance with 2 CPUs, submitit's local
executor. Run as root (CI), PostgreSQL runs as an unprivileged user (rlhf_lab/entry/server.py).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rlhf_lab.entry import run as cli, server, sweeps as sweeping
from rlhf_lab.server import auth as server_auth
from rlhf_lab.analysis import parent_run
from rlhf_lab.analysis.study_runs import RunData, study_filter
from rlhf_lab.analysis.study_report import best_setting
from tests import cli_process
from tests.test_sweeps import MICRO

ROOT = Path(__file__).resolve().parents[1]
# 2 DPO steps on 16 pairs after a 3-step base model and a 1-epoch SFT: every stage of a policy job, in seconds
DPO_MICRO = [*MICRO, "algo=dpo", "data.n_train=16", "data.n_eval=4", "algo.batch_size=4", "trainer.threads=1"]


# -- pure parts -------------------------------------------------------------------------------------------


def test_pg_binaries_are_found_on_path_then_under_usr_lib_postgresql(tmp_path):
    for version in ("9.6", "15", "16"):
        (tmp_path / version / "bin").mkdir(parents=True)
        (tmp_path / version / "bin" / "initdb").write_text("")
    pattern = str(tmp_path / "*" / "bin")
    assert server.find_pg_binary("initdb", path_env="", pattern=pattern) == tmp_path / "16" / "bin" / "initdb"
    (tmp_path / "path").mkdir()
    exe = tmp_path / "path" / "initdb"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert server.find_pg_binary("initdb", path_env=str(tmp_path / "path"), pattern=pattern) == exe
    with pytest.raises(server.ServerError, match="pg_ctl is not on PATH.*apt-get install postgresql"):
        server.find_pg_binary("pg_ctl", path_env="", pattern=pattern)


def test_uris_ports_and_processes():
    assert server.backend_uri(5433) == "postgresql+psycopg://mlflow_server@127.0.0.1:5433/mlflow"  # no password
    assert server.tracking_url("0.0.0.0", 5000) == "http://127.0.0.1:5000"
    assert server.tracking_url("127.0.0.1", 5001) == "http://127.0.0.1:5001"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert not server.port_is_free(port)
    assert server.port_is_free(server.free_port())
    assert server.pid_alive(os.getpid(), "python") and not server.pid_alive(os.getpid(), "no-such-program")
    assert not server.pid_alive(None) and server.group_alive(os.getpgid(0))


def test_start_refuses_a_busy_port_in_one_line(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert server.main(["start", "--dir", str(tmp_path / "team"), "--port", str(port)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"rlhf-lab-server: port {port} on 127.0.0.1 is in use: pick another with --port"
    assert not (tmp_path / "team").exists()  # nothing was initialised


def test_a_folder_the_postgres_user_cannot_enter_is_named():
    account = pwd.getpwnam("nobody")  # stands for the PostgreSQL user (only its uid and name are read)
    base = Path(tempfile.mkdtemp(prefix="rlhf_lab_reach_"))  # under /tmp, which every user enters (pytest's is 0700)
    base.chmod(0o755)
    private = base / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(server.ServerError, match=f"nobody cannot enter {private}.*chmod o\\+x"):
        server.check_reachable(private / "team" / "postgres", account)
    private.chmod(0o701)  # others may enter, not list: enough
    server.check_reachable(private / "team" / "postgres", account)
    server.check_reachable(private / "team", None)  # not root: PostgreSQL runs as this user, nothing to check
    assert os.geteuid() == 0 or server.pg_account() is None
    shutil.rmtree(base)


def test_a_job_takes_its_share_of_the_cores_under_each_launcher():
    assert cli.launcher_threads({"n_jobs": 2}, 8) == 4 and cli.launcher_threads({"n_jobs": -1}, 8) == 1
    assert cli.launcher_threads({"ray": {"init": {}, "remote": {"num_cpus": 3}}}, 8) == 3
    assert cli.launcher_threads({"ray": {"init": {}, "remote": {}}}, 8) == 1  # Ray's default: 1 CPU per task
    assert cli.launcher_threads({"cpus_per_task": 4, "timeout_min": 60}, 8) == 4
    assert cli.launcher_threads({"cpus_per_task": None}, 8) == 8 and cli.launcher_threads({}, 2) == 2


def _run(setting: dict, gold: list[float], status: str = "FINISHED", test: float | None = None) -> RunData:
    r = RunData("id", "dpo", status, {}, {}, {} if test is None else {"test/gold_reward": test},
                history={"eval/gold_reward": list(enumerate(gold))})
    r.setting = setting
    return r


def test_best_setting_is_chosen_on_eval_gold_and_reported_on_test_gold():
    runs = [_run({"algo.beta": "0.1"}, [0.0, 0.5], test=0.45), _run({"algo.beta": "0.1"}, [0.0, 0.1], test=0.05),
            _run({"algo.beta": "0.3"}, [0.0, 0.4], test=0.2), _run({"algo.beta": "0.3"}, [0.0, 0.4], test=0.3),
            _run({"algo.beta": "1"}, [0.0, 0.9], status="FAILED", test=0.9)]
    best = best_setting(runs)  # eval means: 0.1 -> 0.3, 0.3 -> 0.4; failed runs do not count
    assert (best.setting, best.n, best.split) == ("algo.beta=0.3", 2, "test")
    assert best.eval_gold == pytest.approx(0.4) and best.gold == pytest.approx(0.25)  # (0.2 + 0.3) / 2
    assert best_setting([_run({"algo.beta": "1"}, [0.9], status="KILLED")]) is None
    note = parent_run.summary_note("smoke", best, 3, 4)
    assert ("best setting `algo.beta=0.3`: test-split gold (`test/gold_reward`) **0.250** (mean over 2 runs; chosen "
            "on eval-split gold, `eval/gold_reward` 0.400)") in note
    assert "3 of 4 jobs finished" in note and "study_report/README.md" in note
    no_test = best_setting([_run({"algo.beta": "0.3"}, [0.0, 0.4])])  # a run that logged no test split
    assert no_test.split == "last eval" and no_test.gold == pytest.approx(0.4)
    assert "last eval-split gold (`eval/gold_reward`; no test split logged) **0.400**" in parent_run.summary_note(
        None, no_test, 1, 1)


def test_a_study_or_one_sweeps_runs_are_searched():
    assert study_filter("s") == "tags.`rlhf_lab.study` = 's'"
    assert study_filter(None, "abc") == "tags.`mlflow.parentRunId` = 'abc'"
    assert study_filter("s", "abc") == "tags.`rlhf_lab.study` = 's' and tags.`mlflow.parentRunId` = 'abc'"
    with pytest.raises(ValueError):
        study_filter(None)


def test_cluster_launchers_compose_and_differ_from_the_local_ones_only_in_executor_settings():
    pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="the `cluster` extra is not installed")
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the `cluster` extra is not installed")
    from hydra import compose, initialize_config_module

    def launcher(name: str) -> dict:
        with initialize_config_module("rlhf_lab.conf", version_base="1.3"):
            cfg = compose("config", overrides=[f"hydra/launcher={name}"], return_hydra_config=True)
            return dict(cfg.hydra.launcher)

    ray, ray_cluster = launcher("ray"), launcher("ray_cluster")
    assert ray["_target_"] == ray_cluster["_target_"] and ray["ray"]["init"]["address"] is None
    assert ray_cluster["ray"]["init"]["address"] == "auto" and ray_cluster["ray"]["remote"]["num_cpus"] == 4
    local, slurm = launcher("submitit_local"), launcher("slurm")
    assert local["_target_"].endswith("LocalLauncher") and slurm["_target_"].endswith("SlurmLauncher")
    assert set(local) - {"_target_"} <= set(slurm)  # the SLURM executor adds settings, drops none


def test_the_process_that_loses_the_race_to_create_the_experiment_on_a_server_uses_the_winners(monkeypatch):
    """On a tracking server there is no file lock: two sweeps starting at once both find no experiment and both
    create it; the server refuses the second (measured: 2 of 5 such races on PostgreSQL). The loser reads the id."""
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import PERMISSION_DENIED, RESOURCE_ALREADY_EXISTS

    from rlhf_lab.runs import tracking

    class Exp:
        experiment_id = "7"

    class Client:
        looked = 0

        def __init__(self, uri):
            pass

        def get_experiment_by_name(self, name):
            Client.looked += 1
            return None if Client.looked == 1 else Exp()  # created by the other process in between

        def create_experiment(self, name, tags=None):
            raise MlflowException(f"Experiment(name={name}) already exists", error_code=RESOURCE_ALREADY_EXISTS)

    monkeypatch.setattr(mlflow, "MlflowClient", Client)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    assert tracking.experiment_id("http://127.0.0.1:1", "rlhf-lab") == "7" and Client.looked == 2

    class Refused(Client):
        def create_experiment(self, name, tags=None):
            raise MlflowException("permission denied", error_code=PERMISSION_DENIED)

    Client.looked = 0
    monkeypatch.setattr(mlflow, "MlflowClient", Refused)
    with pytest.raises(MlflowException, match="permission denied"):  # any other refusal is the user's to see
        tracking.experiment_id("http://127.0.0.1:1", "rlhf-lab")


def test_a_sweep_that_cannot_open_its_parent_run_stops_before_any_job(monkeypatch, capsys):
    """Hydra turns a callback's exception into a warning; the jobs would then run without their parent run (no
    study report, no summary). The sweep stops instead, with one line."""
    from omegaconf import OmegaConf

    cb = sweeping.MlflowSweepCallback()

    def broken(config):
        raise RuntimeError("the store said no")

    monkeypatch.setattr(cb, "open_parent_run", broken)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////tmp/x.db")
    with pytest.raises(SystemExit) as exit_:
        cb.on_multirun_start(OmegaConf.create({}))
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["rlhf-lab: the sweep could not open its parent MLflow run in sqlite:////tmp/x.db (RuntimeError: "
                   "the store said no); no job ran"]


# -- processes --------------------------------------------------------------------------------------------


def cmd_env(**env) -> dict[str, str]:
    """The environment of a command of this checkout's code: ours plus `env`, without a tracking URI or a sweep's
    variables unless `env` sets them."""
    full = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), **env)  # this checkout's code
    for k in ("MLFLOW_TRACKING_URI", sweeping.PARENT_ENV, sweeping.SWEPT_ENV, sweeping.STATE_ENV):
        if k not in env:
            full.pop(k, None)
    return full


def run_cmd(args: list[str], cwd: Path, timeout: int = 480, **env) -> subprocess.CompletedProcess:
    full = cmd_env(**env)
    # forked from a warm interpreter (tests/cli_process.py), but for joblib's launcher: its loky workers, started from
    # a forked child, hang
    forked = (["-m", "rlhf_lab.entry.run"], ["-m", "rlhf_lab.entry.report"], ["-m", "rlhf_lab.entry.server"])
    if args[:2] in forked and "hydra/launcher=parallel" not in args:
        return cli_process.run(args[2:], cwd=cwd, env=full, timeout=timeout, module=args[1])
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full)


def login(credentials: Path) -> dict[str, str]:
    """The MLflow login in a credentials file of `rlhf-lab-server user add` (~/.mlflow/credentials' format) as the
    environment variables MLflow's clients read."""
    name, password = server_auth.read_credentials(credentials)
    return {"MLFLOW_TRACKING_USERNAME": name, "MLFLOW_TRACKING_PASSWORD": password}


# the test servers' MLflow worker processes (`--workers`; the default, 2, serves a team): each worker imports MLflow's
# server, 3 s of CPU, at every start
SERVER_WORKERS = 1


def start_team_server(folder: Path, users: tuple[str, ...] = ("ann", "bob")) -> tuple[str, dict[str, Path], list]:
    """`rlhf-lab-server start --workers SERVER_WORKERS` in `folder / "team"` on a free port, then `user add` for
    each of `users`: the URL, each user's credentials file, and the finished commands (their output)."""
    port = server.free_port()
    r = run_cmd(["-m", "rlhf_lab.entry.server", "start", "--dir", str(folder / "team"), "--port", str(port),
                 "--workers", str(SERVER_WORKERS)], folder, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    url = f"http://127.0.0.1:{port}"
    assert r.stdout.strip().splitlines()[-1] == f"export MLFLOW_TRACKING_URI={url}"
    done, files = [r], {}
    for user in users:
        added = run_cmd(["-m", "rlhf_lab.entry.server", "user", "add", user, "--dir", str(folder / "team")], folder)
        assert added.returncode == 0, added.stderr[-3000:]
        files[user] = Path(added.stdout.strip())
        done.append(added)
    return url, files, done


@pytest.fixture(scope="module")
def team_server():
    """A throwaway PostgreSQL and MLflow server started by `rlhf-lab-server start` on free loopback ports, with the
    users ann and bob; this process (and the commands it starts) logs in as ann (MLFLOW_TRACKING_USERNAME /
    MLFLOW_TRACKING_PASSWORD) until the end of the module, when the server is stopped (and checked stopped)."""
    try:
        for name in ("initdb", "pg_ctl"):
            server.find_pg_binary(name)
    except server.ServerError as err:
        pytest.skip(str(err))
    folder = Path(tempfile.mkdtemp(prefix="rlhf_lab_team_"))  # under /tmp: the postgres user must reach it
    folder.chmod(0o755)
    url, files, _ = start_team_server(folder)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in login(files["ann"]).items():
            mp.setenv(key, value)
        yield url, folder / "team"
    r = run_cmd(["-m", "rlhf_lab.entry.server", "stop", "--dir", str(folder / "team")], folder, timeout=120)
    assert r.returncode == 0 and "stopped PostgreSQL" in r.stderr, r.stderr
    status = run_cmd(["-m", "rlhf_lab.entry.server", "status", "--dir", str(folder / "team")], folder)
    assert status.returncode == 1 and server.port_is_free(int(url.rsplit(":", 1)[1]))
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_the_server_refuses_a_second_start_in_its_folder(team_server, tmp_path):
    url, folder = team_server
    r = run_cmd(["-m", "rlhf_lab.entry.server", "start", "--dir", str(folder), "--port", str(server.free_port())], tmp_path)
    assert r.returncode == 1 and f"{folder} already runs a server ({url}" in r.stderr
    r = run_cmd(["-m", "rlhf_lab.entry.server", "status", "--dir", str(folder)], tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"export MLFLOW_TRACKING_URI={url}"


@pytest.mark.slow
def test_a_parallel_sweep_logs_to_the_server_and_its_report_comes_from_there(team_server, tmp_path):
    url, folder = team_server
    r = run_cmd(["-m", "rlhf_lab.entry.run", "-m", "hydra/launcher=parallel", *DPO_MICRO, "study=team_smoke",
                 "algo.beta=0.1,0.3", "seed=0,1"], tmp_path, MLFLOW_TRACKING_URI=url)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not (tmp_path / "mlflow.db").exists()  # nothing went to the default sqlite store
    client = MlflowClient(url)
    exp = client.get_experiment_by_name("rlhf-lab")
    runs = client.search_runs([exp.experiment_id], "tags.`rlhf_lab.study` = 'team_smoke'", max_results=100)
    parent = next(p for p in runs if p.data.tags["rlhf_lab.stage"] == "sweep")
    jobs = [x for x in runs if x.data.tags["rlhf_lab.stage"] == "dpo"]
    assert parent.info.status == "FINISHED" and len(jobs) == 4
    assert {x.data.tags["mlflow.parentRunId"] for x in runs if x is not parent} == {parent.info.run_id}
    assert sorted(x.info.run_name for x in jobs) == [f"dpo algo.beta={b} seed={s}" for b in ("0.1", "0.3")
                                                     for s in (0, 1)]
    for job in jobs:  # every step of every job reached PostgreSQL through the server
        assert job.info.status == "FINISHED"
        assert "proxy_vs_gold.png" in {a.path for a in client.list_artifacts(job.info.run_id)}  # through the guard
        assert [m.step for m in client.get_metric_history(job.info.run_id, "loss/dpo")] == [0, 1]
        assert [m.step for m in client.get_metric_history(job.info.run_id, "eval/gold_reward")] == [0, 2]
    assert {x.data.tags["rlhf_lab.stage"] for x in runs} == {"sweep", "pretrain", "sft", "prefs", "dpo"}
    assert sum(x.data.tags["rlhf_lab.stage"] == "pretrain" for x in runs) == 1  # built once, shared

    # the parent run holds the study report and its headline (the MLflow UI shows the study)
    arts = {a.path for a in client.list_artifacts(parent.info.run_id, parent_run.ARTIFACT_DIR)}
    assert {"study_report/README.md", "study_report/gold_vs_sqrt_kl.png", "study_report/frontier.png"} <= arts
    best_eval, best_test = parent.data.metrics[parent_run.BEST_EVAL_GOLD], parent.data.metrics[parent_run.BEST_GOLD]
    best = parent.data.tags[parent_run.BEST_SETTING_TAG]
    assert best in ("algo.beta=0.1", "algo.beta=0.3")

    def mean_over_seeds(key: str) -> dict[str, float]:
        finals = {j.info.run_name: client.get_metric_history(j.info.run_id, key)[-1].value for j in jobs}
        return {b: (finals[f"dpo {b} seed=0"] + finals[f"dpo {b} seed=1"]) / 2
                for b in ("algo.beta=0.1", "algo.beta=0.3")}

    evals, tests = mean_over_seeds("eval/gold_reward"), mean_over_seeds("test/gold_reward")
    assert best_eval == pytest.approx(max(evals.values())) and evals[best] == pytest.approx(best_eval)
    assert best_test == pytest.approx(tests[best])  # reported on the test split, as the study report does
    assert f"best setting `{best}`: test-split gold (`test/gold_reward`) **{best_test:.3f}**" in parent.data.tags[
        "mlflow.note.content"]
    readme = Path(client.download_artifacts(parent.info.run_id, "study_report/README.md", str(tmp_path)))
    assert f"parent MLflow run is `{parent.info.run_id}`" in readme.read_text()
    assert "[rlhf-lab] sweep: study report in the parent run's artifacts" in r.stdout

    # and rlhf-lab-report reads the study from the server
    rep = run_cmd(["-m", "rlhf_lab.entry.report", "team_smoke", "--uri", url, "--out", str(tmp_path / "reports")],
                  tmp_path)
    assert rep.returncode == 0, rep.stderr[-3000:]
    text = (tmp_path / "reports" / "team_smoke" / "README.md").read_text()
    assert "4 finished runs (dpo)" in text and f"Tracking store: `{url}`" in text
    assert (tmp_path / "reports" / "team_smoke" / "gold_vs_sqrt_kl.png").stat().st_size > 1000


def check_two_job_sweep(r: subprocess.CompletedProcess, cwd: Path) -> None:
    """A 2-job sweep (seed=0,1) in `cwd`: both jobs are children of the one parent run, and the base model was
    built once and reused from the cache by the other job."""
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    client = MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("rlhf-lab").experiment_id], "", max_results=100)
    parents = [x for x in runs if x.data.tags["rlhf_lab.stage"] == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    pid = parents[0].info.run_id
    jobs = [x for x in runs if x.data.tags.get("rlhf_lab.job") == "true"]
    assert sorted(x.info.run_name for x in jobs) == ["sft seed=0", "sft seed=1"]
    assert {x.data.tags.get("mlflow.parentRunId") for x in runs if x.info.run_id != pid} == {pid}
    assert {x.data.tags["rlhf_lab.pid"] for x in jobs} != {parents[0].data.tags["rlhf_lab.pid"]}  # other processes
    pretrain = [x for x in runs if x.data.tags["rlhf_lab.stage"] == "pretrain"]
    assert len(pretrain) == 1 and len(list((cwd / ".rlhf_lab_cache" / "pretrain").glob("*/rlhf_lab_spec.json"))) == 1
    assert "[rlhf-lab] pretrain: reusing cached base model" in r.stdout + r.stderr
    assert {a.path for a in client.list_artifacts(pid, parent_run.ARTIFACT_DIR)} >= {"study_report/README.md"}


@pytest.mark.slow
def test_a_sweep_through_a_local_ray_instance(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="the `cluster` extra is not installed")
    # address=local: a new local instance even when a Ray cluster runs on this machine (tests/test_ray_cluster.py)
    r = run_cmd(["-m", "rlhf_lab.entry.run", "-m", "hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2",
                 "hydra.launcher.ray.init.address=local",
                 "+hydra.launcher.ray.init.include_dashboard=false", "algo=sft", *MICRO, "trainer.threads=1",
                 "study=ray_smoke", "seed=0,1"], tmp_path, RAY_DEDUP_LOGS="0",
                RAY_worker_niceness="0")  # not Ray's nice 15 for its workers: starved beside other tests
    check_two_job_sweep(r, tmp_path)
    assert "Started a local Ray instance" in r.stderr


@pytest.mark.slow
def test_a_sweep_through_submitit_the_slurm_code_path_on_this_machine(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the `cluster` extra is not installed")
    r = run_cmd(["-m", "rlhf_lab.entry.run", "-m", "hydra/launcher=submitit_local", "algo=sft", *MICRO,
                 "trainer.threads=1", "study=submitit_smoke", "seed=0,1"], tmp_path)
    # submitit keeps each job's output in its folder, not on the launcher's stdout
    logs = "".join(p.read_text() for p in tmp_path.glob("multirun/*/*/.submitit/*/*_log.*"))
    check_two_job_sweep(subprocess.CompletedProcess(r.args, r.returncode, r.stdout + logs, r.stderr), tmp_path)
