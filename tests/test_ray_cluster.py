"""A sweep on a Ray cluster of two nodes simulated on this machine (``ray.cluster_utils.Cluster``: a head and a
worker node, each its own raylet with one CPU), through ``hydra/launcher=ray_cluster``: jobs on both nodes, logging
to the PostgreSQL-backed tracking server, the artifact cache shared; and a worker node removed in the middle of a
sweep (docs/team.md)."""

import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rlhf_lab.runs.states import NODE_TAG
from tests import cli_process
from tests.test_sweeps import MICRO
from tests.test_team_scale import cmd_env, team_server  # noqa: F401  (the module's PostgreSQL + MLflow server)

pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="the `cluster` extra is not installed")
# two jobs, one CPU each: the head's one CPU is taken when the second is placed, so it runs on the worker node
SEEDS = "seed=0,1"


@pytest.fixture(scope="module")
def cluster():
    """A head node and one worker node, one CPU each, on this machine, for the module (the node-loss test, last,
    removes the worker); shut down at the end (the RAY_ADDRESS it sets in this process is restored)."""
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_ADDRESS", "")
        mp.delenv("RAY_ADDRESS")
        # Ray starts its workers at nice 15 (its `worker_niceness`); beside the other test workers on 2 cores that
        # starved these jobs (the node-loss test took 13 min instead of 2.5); the raylets read this at their start
        mp.setenv("RAY_worker_niceness", "0")
        # the workers run this checkout's code, as the CLI's processes do (test_team_scale.cmd_env), not the installed
        # package's: with an editable install of another tree, a job's code digest followed that tree's edits, and
        # a relaunch took the finished jobs for changed ones
        mp.setenv("PYTHONPATH", cmd_env()["PYTHONPATH"])

        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        worker = c.add_node(num_cpus=1)
        c.wait_for_nodes()
        try:
            yield c, worker
        finally:
            c.shutdown()


def sweep_args(address: str, study: str, *extra: str, seeds: str = SEEDS) -> list[str]:
    """The arguments of `rlhf-lab` for a sweep on the cluster (run as a process forked from a warm interpreter,
    tests/cli_process.py: the driver; Ray's raylets start the workers that run the jobs)."""
    return ["-m", "hydra/launcher=ray_cluster",
            f"hydra.launcher.ray.init.address={address}", "hydra.launcher.ray.remote.num_cpus=1", "algo=sft", *MICRO,
            "trainer.threads=1", f"study={study}", seeds, *extra]


def job_runs(client: MlflowClient, study: str) -> list:
    exp = client.get_experiment_by_name("rlhf-lab")
    return client.search_runs([exp.experiment_id], f"tags.`rlhf_lab.study` = '{study}'", max_results=200)


@pytest.mark.slow
def test_a_sweep_runs_on_both_nodes_and_logs_to_the_team_server(team_server, cluster, tmp_path):  # noqa: F811
    # team_server first: the cluster starts inside its login (MLFLOW_TRACKING_USERNAME/PASSWORD), and Ray's workers
    # take the environment of their node's raylet, not the driver's
    c, worker = cluster
    url, _ = team_server
    r = cli_process.run(sweep_args(c.address, "ray_nodes"), tmp_path, cmd_env(MLFLOW_TRACKING_URI=url), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not (tmp_path / "mlflow.db").exists()  # every job logged to the server
    runs = job_runs(MlflowClient(url), "ray_nodes")
    sft = [x for x in runs if x.data.tags["rlhf_lab.stage"] == "sft"]
    assert len(sft) == 2 and {x.info.status for x in runs} == {"FINISHED"}
    nodes = {x.data.tags[NODE_TAG] for x in sft}
    assert worker.node_id in nodes and len(nodes) == 2, nodes  # jobs ran on the head and on the worker
    # the upstream base model was built once, by one node, in the launch folder's cache, and reused by the others
    assert len([x for x in runs if x.data.tags["rlhf_lab.stage"] == "pretrain"]) == 1
    assert len(list((tmp_path / ".rlhf_lab_cache" / "pretrain").glob("*/rlhf_lab_spec.json"))) == 1
    # every job's Hydra output folder (its .hydra config) is under the launch folder, wherever the job ran
    assert len(list(tmp_path.glob("multirun/*/*/*/.hydra/config.yaml"))) == 2, sorted(tmp_path.rglob(".hydra"))


def wait_for_job_on(node_id: str, db: Path, proc: cli_process.CliProcess, timeout: float = 300) -> str:
    """The name of a job's run that is RUNNING on the node (polling the sweep's sqlite store)."""
    end = time.time() + timeout
    client = None
    while time.time() < end and proc.poll() is None:
        time.sleep(0.3)
        if client is None:  # the store once the sweep made it (a second process creating it races its migration)
            if "parent MLflow run" not in proc.output()[0]:
                continue
            client = MlflowClient(f"sqlite:///{db}")
        running = [x for x in job_runs(client, "ray_fault") if x.info.status == "RUNNING"
                   and x.data.tags.get(NODE_TAG) == node_id and x.data.tags.get("rlhf_lab.stage") == "sft"]
        if running:
            return running[0].info.run_name
    raise AssertionError(f"no job ran on node {node_id}: {proc.output()[0][-2000:]}")


@pytest.mark.slow
def test_a_node_lost_mid_sweep_leaves_no_run_running_and_changes_no_result(cluster, tmp_path):
    """The worker node is removed while one of its jobs trains: Ray retries the job on the head node, the lost
    attempt's run ends KILLED with the cause, the sweep finishes, a relaunch finds nothing to do, and every job's
    figures equal those of the same job in a sweep without the fault (the other jobs ran undisturbed)."""
    c, worker = cluster
    faulty, clean = tmp_path / "faulty", tmp_path / "clean"
    faulty.mkdir()
    clean.mkdir()
    # a job of seconds (30 SFT steps and its evaluations), so that the node goes while it runs: the node is removed
    # within 0.3 s of the job's run appearing RUNNING (a job that ended first fails the KILLED assertion below)
    longer = "trainer.max_steps=30"
    two = SEEDS  # a job for each node
    proc = cli_process.start(sweep_args(c.address, "ray_fault", longer, seeds=two), cwd=faulty, env=cmd_env())
    try:
        lost = wait_for_job_on(worker.node_id, faulty / "mlflow.db", proc)
        c.remove_node(worker)
        assert proc.wait(timeout=1200) == 0, proc.output()[1][-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    client = MlflowClient(f"sqlite:///{faulty / 'mlflow.db'}")
    runs = job_runs(client, "ray_fault")
    assert not [x for x in runs if x.info.status == "RUNNING"]
    killed = [x for x in runs if x.info.status == "KILLED"]
    assert [x.info.run_name for x in killed] == [lost]
    assert f"Ray node {worker.node_id}" in killed[0].data.tags["rlhf_lab.error"]
    finished = {x.info.run_name: x for x in runs if x.info.status == "FINISHED" and x.data.tags["rlhf_lab.stage"] == "sft"}
    assert sorted(finished) == ["sft seed=0", "sft seed=1"]
    # no half-written artifact: every cached artifact is complete (its spec written last, by the rename)
    cache = faulty / ".rlhf_lab_cache"
    assert not list(cache.glob("*/.tmp-*")) and len(list(cache.glob("pretrain/*/rlhf_lab_spec.json"))) == 1
    # a relaunch with skip_finished=true has nothing left to run
    again = cli_process.run(sweep_args(c.address, "ray_fault", longer, "skip_finished=true", seeds=two), faulty,
                            cmd_env(), timeout=600)
    assert again.returncode == 0 and "every job has a finished run; nothing ran" in again.stdout, (
        again.stdout[-3000:], again.stderr[-2000:])
    # the lost job again, without the fault, in its own folder (store and cache): the same figures. A one-job sweep
    # on the local launcher, in the forked process itself: a job's figures depend on its config, not on where it
    # ran, and a Ray driver would start a Ray worker (a fresh interpreter importing torch: ~10 s of CPU) for it
    ok = cli_process.run(["-m", "algo=sft", *MICRO, "trainer.threads=1", "study=ray_fault", longer,
                          lost.split()[-1]], clean, cmd_env(), timeout=600)
    assert ok.returncode == 0, ok.stderr[-3000:]
    reference = [x for x in job_runs(MlflowClient(f"sqlite:///{clean / 'mlflow.db'}"), "ray_fault")
                 if x.data.tags["rlhf_lab.stage"] == "sft"]
    assert len(reference) == 1 and reference[0].data.params["seed"] == lost.split("=")[-1]  # a one-job sweep
    run = finished[lost]
    keys = [k for k in run.data.metrics if k.startswith(("eval/", "test/", "loss/"))]
    assert keys and {k: run.data.metrics[k] for k in keys} == {k: reference[0].data.metrics[k] for k in keys}


def test_runs_of_a_dead_ray_node_are_marked_killed_on_any_host(monkeypatch):
    """mark_dead_runs with a stand-in for Ray (a node alive, a node dead) and for the MLflow client."""
    import types

    from rlhf_lab.runs import states as run_states

    ray = types.SimpleNamespace(is_initialized=lambda: True, nodes=lambda: [
        {"NodeID": "alive", "Alive": True, "NodeManagerAddress": "10.0.0.1"},
        {"NodeID": "gone", "Alive": False, "NodeManagerAddress": "10.0.0.2"}],
        get_runtime_context=lambda: types.SimpleNamespace(get_node_id=lambda: "alive"))
    monkeypatch.setitem(sys.modules, "ray", ray)
    assert run_states.process_tags()[NODE_TAG] == "alive" and run_states.dead_ray_nodes() == {"gone": "10.0.0.2"}

    def run(rid, node):
        return types.SimpleNamespace(info=types.SimpleNamespace(run_id=rid, user_id=""), data=types.SimpleNamespace(
            tags={NODE_TAG: node, run_states.HOST_TAG: "another-host", run_states.PID_TAG: "1"}))

    class Client:
        tags, ended = {}, {}

        def search_runs(self, exps, filter_string, max_results):
            return [run("a", "alive"), run("b", "gone")] if "rlhf_lab.host" not in filter_string else []

        def set_tag(self, rid, k, v):
            self.tags[rid] = v

        def set_terminated(self, rid, status):
            self.ended[rid] = status

    client = Client()
    assert run_states.mark_dead_runs(client, "0") == ["b"]
    assert client.ended == {"b": "KILLED"} and "Ray node gone (10.0.0.2) was lost" in client.tags["b"]
    monkeypatch.delitem(sys.modules, "ray")
    assert NODE_TAG not in run_states.process_tags() and run_states.dead_ray_nodes() == {}


def test_a_job_elsewhere_takes_relative_paths_from_the_launch_folder(monkeypatch):
    from omegaconf import OmegaConf

    from rlhf_lab.runs.process import LAUNCH_DIR_ENV, launch_path
    from rlhf_lab.config.keys import configured_uri
    from rlhf_lab.runs.tracking_server import tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = OmegaConf.create({"tracking": {"uri": "sqlite:///mlflow.db"}})
    monkeypatch.delenv(LAUNCH_DIR_ENV, raising=False)
    assert launch_path(".rlhf_lab_cache") == ".rlhf_lab_cache" and tracking_uri(configured_uri(cfg)) == "sqlite:///mlflow.db"
    monkeypatch.setenv(LAUNCH_DIR_ENV, "/shared/rlhf")
    assert launch_path(".rlhf_lab_cache") == "/shared/rlhf/.rlhf_lab_cache" and launch_path("/abs/c") == "/abs/c"
    assert tracking_uri(configured_uri(cfg)) == "sqlite:////shared/rlhf/mlflow.db"
    assert tracking_uri(configured_uri(OmegaConf.create({"tracking": {"uri": "sqlite:////abs/m.db"}}))) == "sqlite:////abs/m.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://head:5000")
    assert tracking_uri(configured_uri(cfg)) == "http://head:5000"
