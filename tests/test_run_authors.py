"""Issue 65 (item 3, readers' side): reports and ``skip_finished`` read only the runs of the user running them
(MLflow's run author, ``user_id`` / tag ``mlflow.user``: :mod:`rlhf_lab.runs.authors`) unless asked for every
author's; a dead process's run is marked KILLED only by its author. The login limits of the team server as a pure
object (:class:`rlhf_lab.server.logins.LoginLimiter`). No server: sqlite stores in tmp_path."""

from __future__ import annotations

import os

import pytest

from rlhf_lab.analysis.study_runs import load_study
from rlhf_lab.entry import report
from rlhf_lab.runs import authors, states
from rlhf_lab.runs.jobs import RunSettings, finished_runs
from rlhf_lab.server.logins import LoginLimiter


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A sqlite store in which this process is the user `ann` (MLflow's login variable), holding a FINISHED ppo run
    of study `s` by ann, one by `bob`, and one that records no author; (uri, client, {author: run id})."""
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "ann")
    monkeypatch.delenv(authors.ALL_AUTHORS_ENV, raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(uri)
    exp = client.create_experiment("rlhf-lab")
    ids = {}
    for who in ("ann", "bob", None):
        tags = {"rlhf_lab.stage": "ppo", "rlhf_lab.study": "s", "rlhf_lab.overrides": "seed=0",
                **({authors.AUTHOR_TAG: who} if who else {})}
        run = client.create_run(exp, tags=tags)
        client.set_terminated(run.info.run_id, "FINISHED")
        ids[who] = run.info.run_id
    return uri, client, ids


def test_a_report_reads_only_this_users_runs_unless_asked(store, monkeypatch):
    """Old code: load_study read bob's run into ann's report (a run he logged `test/gold_reward=99` into)."""
    uri, _, ids = store
    assert authors.current_author() == "ann"
    assert {r.run_id for r in load_study("s", uri)[0]} == {ids["ann"], ids[None]}
    assert {r.run_id for r in load_study("s", uri, all_authors=True)[0]} == set(ids.values())
    monkeypatch.setenv(authors.ALL_AUTHORS_ENV, "1")  # what rlhf-lab-report --all-authors sets
    assert {r.run_id for r in load_study("s", uri)[0]} == set(ids.values())


def test_rlhf_lab_report_all_authors_asks_for_every_authors_runs(monkeypatch):
    seen = []
    monkeypatch.setattr(report, "write_report", lambda a, own: seen.append(authors.all_authors_asked()) or 0)
    monkeypatch.delenv(authors.ALL_AUTHORS_ENV, raising=False)
    assert report.main(["s", "--out", "x"]) == 0 and report.main(["s", "--out", "x", "--all-authors"]) == 0
    assert seen == [False, True] and authors.ALL_AUTHORS_ENV not in os.environ  # set for the command only


def test_skip_finished_takes_only_this_users_finished_runs_unless_asked(store):
    """Old code: skip_finished took bob's FINISHED run for ann's job (and reported its gold as hers)."""
    uri, _, ids = store
    mine = RunSettings(uri=uri, study="s")
    assert [r.info.run_id for r in finished_runs(mine, "ppo", ["seed=0"])] == [ids[None], ids["ann"]]
    every = RunSettings(uri=uri, study="s", all_authors=True)
    assert {r.info.run_id for r in finished_runs(every, "ppo", ["seed=0"])} == set(ids.values())


def test_the_config_key_reaches_skip_finished():
    from tests.conftest import compose_cfg

    from rlhf_lab.stages.pipeline import run_settings

    assert not run_settings(compose_cfg(["algo=sft"])).all_authors
    assert run_settings(compose_cfg(["algo=sft", "tracking.all_authors=true"])).all_authors


def test_a_dead_process_run_is_marked_killed_by_its_author_only(store, monkeypatch):
    """Old code: ann's start tried to end bob's dead run too (refused on the team server, which stopped the rest)."""
    uri, client, ids = store
    exp = client.get_experiment_by_name("rlhf-lab").experiment_id
    dead = {}
    for who in ("ann", "bob"):
        run = client.create_run(exp, tags={authors.AUTHOR_TAG: who, states.PID_TAG: "999999999",
                                           states.HOST_TAG: states.socket.gethostname()})
        dead[who] = run.info.run_id
    monkeypatch.setattr(states, "dead_ray_nodes", lambda: {})
    assert states.mark_dead_runs(client, exp) == [dead["ann"]]
    assert client.get_run(dead["bob"]).info.status == "RUNNING"


def test_failed_logins_wait_per_user_and_per_address_and_a_known_login_does_not():
    now = [0.0]
    limiter = LoginLimiter(clock=lambda: now[0], limits={"user": 3, "addr": 5}, window_s=100.0)
    for _ in range(3):
        assert limiter.retry_after("user:ann", "addr:a") == 0
        limiter.failed("user:ann", "addr:a")
    assert limiter.retry_after("user:ann", "addr:b") == 100 and limiter.retry_after("user:bob", "addr:a") == 0
    now[0] = 40.0
    limiter.failed("user:bob", "addr:a")
    limiter.failed("user:cid", "addr:a")  # 5 from address a
    assert limiter.retry_after("user:eve", "addr:a") == 60  # the oldest of the 5 leaves the window at t=100
    now[0] = 100.0  # the failures of t=0 left the window: ann and address a may try again
    assert limiter.retry_after("user:ann", "addr:a") == 0
    limiter.remember("ann", "right")
    assert limiter.is_known("ann", "right") and not limiter.is_known("ann", "wrong")
