"""A new sqlite MLflow store is created once, under a file lock (rlhf_lab/runs/store.py; issue 65 item 5: two sweeps
started together on a new store failed with ``_alembic_tmp_model_versions already exists`` / a duplicate column, and
every later job on that store with a traceback), and a store left half-migrated is one line with its fix."""

from __future__ import annotations

import multiprocessing
import shutil
import sqlite3
import threading

import pytest
from mlflow.tracking import MlflowClient

from rlhf_lab.entry.sweeps import MlflowSweepCallback
from rlhf_lab.runs import store
from tests import mlflow_template

WAIT_S = 1.5  # how long a migrating process waits for the other one to start migrating too


def sweep_config(tmp_path, uri: str):
    """What a sweep's launching process hands its callback: the composed config with Hydra's node."""
    from hydra import compose, initialize_config_module

    with initialize_config_module("rlhf_lab.conf", version_base="1.3"):
        return compose("config", overrides=["algo=pretrain", f"tracking.uri={uri}", "study=race",
                                            f"hydra.sweep.dir={tmp_path / 'multirun'}"], return_hydra_config=True)


def open_parent_together(config, barrier) -> None:
    """A sweep's launching process: opens its parent run, MLflow's migrations of a new store held until the other
    process migrates too (or :data:`WAIT_S` passed), so that two unguarded migrations overlap every time."""
    from mlflow.store.db import utils

    migrate = utils._initialize_tables

    def together(engine):
        try:
            barrier.wait(WAIT_S)
        except threading.BrokenBarrierError:  # the other process waits for the store's lock: it will not come
            pass
        migrate(engine)

    utils._initialize_tables = together
    MlflowSweepCallback().on_multirun_start(config)


@pytest.mark.slow
def test_two_sweeps_started_together_on_a_new_store_both_open_their_parent_run(tmp_path, monkeypatch):
    monkeypatch.setenv(mlflow_template.MIGRATE, "1")  # MLflow's own migrations, as for a user (no template copy)
    uri = f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"
    config = sweep_config(tmp_path, uri)
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=open_parent_together, args=(config, barrier)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    client = MlflowClient(uri)  # later use: the store is complete and at MLflow's schema
    (exp,) = [e for e in client.search_experiments() if e.name == "rlhf-lab"]
    parents = client.search_runs([exp.experiment_id], "tags.`rlhf_lab.stage` = 'sweep'")
    assert len(parents) == 2 and {r.data.tags["rlhf_lab.study"] for r in parents} == {"race"}
    client.create_run(exp.experiment_id)


def half_migrated(tmp_path, runs: int = 0):
    """A copy of a complete store with an older schema revision (as a process killed while it migrated leaves it)."""
    whole = tmp_path / f"whole{runs}.db"
    client = MlflowClient(f"sqlite:///{whole}")
    exp = client.create_experiment("rlhf-lab")
    for _ in range(runs):
        client.create_run(exp)
    broken = tmp_path / f"broken{runs}.db"
    shutil.copy(whole, broken)
    with sqlite3.connect(broken) as conn:
        conn.execute("update alembic_version set version_num = '451aebb31d03'")  # MLflow's second migration
    return broken


def test_a_half_migrated_store_is_one_line_with_its_fix_not_a_traceback(tmp_path, capsys):
    empty = half_migrated(tmp_path)
    with pytest.raises(store.StoreError) as err:
        store.open_store(f"sqlite:///{empty}")
    line = str(err.value)
    assert "\n" not in line and str(empty) in line and "half-created or half-migrated" in line
    assert f"it holds no runs: remove it (rm {empty})" in line and "out-of-date database schema" in line
    used = half_migrated(tmp_path, runs=2)
    with pytest.raises(SystemExit) as done:
        store.exit_on_broken_store(f"sqlite:///{used}")
    out = capsys.readouterr().err
    assert done.value.code == 2 and out.count("\n") == 1 and out.startswith("rlhf-lab: the MLflow store")
    assert f"it holds 2 runs: back it up (cp {used} {used}.bak), then run `mlflow db upgrade sqlite:///{used}`" in out
    # a sweep on it: that line and exit status 2 before any job, as a job's start gives it (rlhf_lab.entry.run)
    with pytest.raises(SystemExit) as done:
        MlflowSweepCallback().on_multirun_start(sweep_config(tmp_path, f"sqlite:///{used}"))
    assert done.value.code == 2 and "then run `mlflow db upgrade" in capsys.readouterr().err
    store.open_store(f"sqlite:///{tmp_path / 'whole0.db'}")  # a complete store opens
    store.open_store("http://127.0.0.1:1")  # a server's store is the server's: nothing done, nothing reached
