"""Run states when a job is stopped: SIGTERM/SIGINT end the run KILLED and exit 128 + signal; a run left
RUNNING by a process killed with -9 is marked KILLED at the next start."""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import time
from pathlib import Path

import mlflow
import pytest

from rlhf_lab.runs import states as run_states
from tests import cli_process

ROOT = Path(__file__).resolve().parents[1]
# a pretrain job long enough to be stopped while its MLflow run is open
LONG_JOB = ["algo=pretrain", "policy=a_tiny", "pretrain.n_texts=300", "trainer.max_steps=100000",
            "eval.every_n_steps=0", "eval.n_prompts=4", "trainer.progress_bar=false", "trainer.threads=1"]


def start_job(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.pop("MLFLOW_TRACKING_URI", None)
    return cli_process.start(LONG_JOB, cwd=tmp_path, env=env)


def wait_running(tmp_path, proc, timeout=240):
    db, t0 = tmp_path / "mlflow.db", time.time()
    while time.time() - t0 < timeout:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        if db.exists():
            try:
                with sqlite3.connect(db) as con:
                    if con.execute("select count(*) from runs where status = 'RUNNING'").fetchone()[0]:
                        time.sleep(2)  # into the run's body
                        return
            except sqlite3.Error:
                pass
        time.sleep(0.5)
    proc.kill()
    raise AssertionError("no RUNNING run appeared")


def runs(tmp_path):
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    return mlflow.search_runs(experiment_names=["rlhf-lab"])


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_ends_the_run_killed_with_128_plus_signal(tmp_path, sig):
    proc = start_job(tmp_path)
    wait_running(tmp_path, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert f"stopped by {signal.Signals(sig).name}" in err
    row = runs(tmp_path).iloc[0]
    assert row["status"] == "KILLED"
    assert row["tags.rlhf_lab.error"] == f"Interrupted: {signal.Signals(sig).name}"


SEQUENCES = {"INT+INT": (signal.SIGINT, signal.SIGINT), "TERM+TERM": (signal.SIGTERM, signal.SIGTERM),
             "INT+INT+TERM": (signal.SIGINT, signal.SIGINT, signal.SIGTERM)}


GAPS = (0, 0.2, 1, 2)


def send(proc, sigs, gap):
    """The signals `sigs` to `proc`, `gap` seconds apart (while it lives)."""
    for i, sig in enumerate(sigs):
        if i:
            time.sleep(gap)
        if proc.poll() is None:
            proc.send_signal(sig)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SEQUENCES))
def test_repeated_signals_still_end_the_run_killed(tmp_path, name):
    """A second (third) stop signal at any moment of the cleanup (Lightning's teardown, which re-installs the
    handlers, the ending of the MLflow run) leaves the run KILLED with the first signal named, never FINISHED
    or RUNNING, and the exit status is 128 + the first signal. One job per gap (0, 0.2, 1, 2 s), side by side."""
    from concurrent.futures import ThreadPoolExecutor

    sigs = SEQUENCES[name]
    dirs = [tmp_path / f"gap_{gap}" for gap in GAPS]
    procs = []
    for d in dirs:
        d.mkdir()
        procs.append(start_job(d))

    def stop(d, proc, gap):  # as soon as this job runs: a job that waits for the others only burns CPU
        wait_running(d, proc)
        send(proc, sigs, gap)

    with ThreadPoolExecutor(len(procs)) as pool:
        for f in [pool.submit(stop, d, p, gap) for d, p, gap in zip(dirs, procs, GAPS)]:
            f.result()
    first = signal.Signals(sigs[0]).name
    for d, proc, gap in zip(dirs, procs, GAPS):
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 128 + sigs[0], (gap, err[-3000:])
        assert f"stopped by {first}" in err
        row = runs(d).iloc[0]
        assert row["status"] == "KILLED", (gap, err[-3000:])
        assert row["tags.rlhf_lab.error"] == f"Interrupted: {first}"


@pytest.mark.slow
def test_repeated_signals_on_a_policy_job_end_its_run_killed(tmp_path, session_cache):
    """A PPO job, where a first SIGTERM waits for the step's end (pre-emption checkpoint): TERM+TERM and INT+INT+TERM
    at 0.2 and 1 s still end its run KILLED with the first signal named and exit 128 + that signal."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.conftest import TINY

    job = ["algo=ppo", *TINY, "algo.reward=gold", "algo.batch_size=8", "algo.num_minibatches=2", "algo.ppo_epochs=1",
           "generation.max_new_tokens=12", "trainer.max_steps=100000", f"cache_dir={session_cache}"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.pop("MLFLOW_TRACKING_URI", None)
    cases = [("TERM+TERM", 0.2), ("TERM+TERM", 1), ("INT+INT+TERM", 0.2), ("INT+INT+TERM", 1)]
    dirs = [tmp_path / f"{name}_{gap}" for name, gap in cases]
    procs = []
    for d in dirs:
        d.mkdir()
        procs.append(cli_process.start(job, cwd=d, env=env))
    def stop(d, proc, name, gap):  # as soon as this job is into its PPO steps (the ppo run has logged a step)
        t0 = time.time()
        while True:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.time() - t0 < 900
            try:
                with sqlite3.connect(d / "mlflow.db") as con:
                    if con.execute("select count(*) from metrics where key = 'objective/kl'").fetchone()[0]:
                        break
            except sqlite3.Error:
                pass
            time.sleep(0.3)
        send(proc, SEQUENCES[name], gap)

    with ThreadPoolExecutor(len(procs)) as pool:
        for f in [pool.submit(stop, d, p, name, gap) for d, p, (name, gap) in zip(dirs, procs, cases)]:
            f.result()
    for d, proc, (name, gap) in zip(dirs, procs, cases):
        _, err = proc.communicate(timeout=300)
        first = SEQUENCES[name][0]
        assert proc.returncode == 128 + first, (name, gap, err[-3000:])
        rows = runs(d)
        row = rows[rows["tags.rlhf_lab.stage"] == "ppo"].iloc[0]
        assert row["status"] == "KILLED", (name, gap, err[-3000:])
        assert row["tags.rlhf_lab.error"] == f"Interrupted: {signal.Signals(first).name}"


def test_only_the_first_stop_signal_raises(monkeypatch):
    monkeypatch.setattr(run_states, "RECEIVED", [])
    monkeypatch.setattr(run_states, "RAISED", [False])
    with pytest.raises(run_states.Interrupted) as e:
        run_states.raise_interrupted(signal.SIGINT, None)
    assert e.value.exit_code == 130
    run_states.raise_interrupted(signal.SIGINT, None)  # recorded, not raised: the cleanup goes on
    run_states.raise_interrupted(signal.SIGTERM, None)
    assert run_states.RECEIVED == [signal.SIGINT, signal.SIGINT, signal.SIGTERM]


def nested(outer: int, inner: int) -> run_states.Interrupted:
    """``raise_interrupted(outer)`` with `inner`'s handler run at the very entry of outer's, before its first line,
    as Python may run it (a profile hook on the call); the Interrupted it raises."""
    fired = []

    def inner_arrives(frame, event, arg):
        if event == "call" and frame.f_code is run_states.raise_interrupted.__code__ and not fired:
            fired.append(frame.f_locals["signum"])
            run_states.raise_interrupted(inner, frame)

    sys.setprofile(inner_arrives)
    try:
        with pytest.raises(run_states.Interrupted) as e:
            run_states.raise_interrupted(outer, None)
    finally:
        sys.setprofile(None)
    assert fired == [outer]
    return e.value


def test_a_signal_handled_as_another_signals_handler_starts_comes_after_it(monkeypatch):
    """INT, INT, TERM sent at once: Python may run TERM's handler inside INT's, before INT's first line (seen as exit
    143 instead of 130, about 1 run in 5). INT is still the first signal, the one raised, and TERM is recorded after
    it."""
    monkeypatch.setattr(run_states, "RECEIVED", [])
    monkeypatch.setattr(run_states, "RAISED", [False])
    monkeypatch.setattr(run_states, "NESTED", [])
    assert nested(signal.SIGINT, signal.SIGTERM).exit_code == 130
    assert run_states.RECEIVED == [signal.SIGINT, signal.SIGTERM]


def test_a_second_signal_inside_a_deferred_sigterms_handler_still_stops_at_once(monkeypatch):
    """Inside defer_sigterm a first TERM only waits for the step's end; an INT whose handler runs inside TERM's is
    handled when TERM's ends: it stops the job at once, naming TERM, the first."""
    monkeypatch.setattr(run_states, "RECEIVED", [])
    monkeypatch.setattr(run_states, "RAISED", [False])
    monkeypatch.setattr(run_states, "NESTED", [])
    monkeypatch.setattr(run_states, "DEFER_SIGTERM", [True])
    assert nested(signal.SIGTERM, signal.SIGINT).exit_code == 143
    assert run_states.RECEIVED == [signal.SIGTERM, signal.SIGINT]


def test_a_signal_inside_a_database_write_raises_once_it_is_done(monkeypatch):
    """Cut in the middle of a commit, a write leaves the SQLite store locked: the handler raises a moment later."""
    monkeypatch.setattr(run_states, "RECEIVED", [])
    monkeypatch.setattr(run_states, "RAISED", [False])
    previous = run_states.install_signal_handlers()
    try:
        fake_write = {"__name__": "sqlalchemy.engine.base", "run_states": run_states, "signal": signal, "sys": sys}
        exec("def commit():\n    run_states.raise_interrupted(signal.SIGINT, sys._getframe())\n", fake_write)
        fake_write["commit"]()  # inside the "write": recorded, not raised
        assert run_states.RECEIVED == [signal.SIGINT] and not run_states.RAISED[0]
        with pytest.raises(run_states.Interrupted) as e:
            for _ in range(200):  # the retry comes within RETRY_S, outside the write
                time.sleep(0.01)
        assert e.value.exit_code == 130 and run_states.RECEIVED == [signal.SIGINT]
    finally:
        run_states.restore_signal_handlers(previous)


def test_lightnings_own_sigterm_exit_is_a_stop_signal_not_exit_0(monkeypatch, tmp_path):
    """Lightning's SIGTERM handler runs before ours and its fit loop raises SIGTERMException (a SystemExit without
    code: exit 0) at the epoch's end; when ours deferred the signal (a database write), that exception must still
    end the job as a SIGTERM stop (Interrupted: KILLED, exit 143). Simulated: Lightning's flag set by a step."""
    import lightning as L
    import torch

    monkeypatch.setattr(run_states, "RECEIVED", [])
    monkeypatch.setattr(run_states, "RAISED", [False])

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch, batch_idx):
            self.trainer._signal_connector.received_sigterm = True  # what Lightning's handler does on a SIGTERM
            return (self.w - batch).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = L.Trainer(max_steps=10, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    with pytest.raises(run_states.Interrupted) as e:
        with run_states.lightning_sigterm_as_interrupted():
            trainer.fit(Module(), torch.utils.data.DataLoader(torch.ones(2, 1), batch_size=1))
    assert e.value.exit_code == 143 and run_states.RAISED[0]
    run_states.raise_interrupted(signal.SIGTERM, None)  # our handler's pending retry: nothing more is raised


def test_end_open_runs_ends_a_run_whose_ending_was_cut_short(tmp_path):
    """A run still on MLflow's stack (the signal came before its end) and a run popped off it but not written
    (the signal came inside ``mlflow.end_run``) both end KILLED with the error named."""
    from rlhf_lab.runs import tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("cut_short")  # not the experiment id an earlier test of this worker left active
    popped = mlflow.start_run().info.run_id
    tracking.OPEN_RUNS[popped] = uri
    mlflow.tracking.fluent._active_run_stack.get().pop()  # as if end_run was stopped after its pop
    active = mlflow.start_run().info.run_id
    assert sorted(tracking.end_open_runs("Interrupted: SIGTERM")) == sorted([popped, active])
    assert mlflow.active_run() is None and not tracking.OPEN_RUNS
    client = mlflow.MlflowClient(uri)
    for run_id in (popped, active):
        run = client.get_run(run_id)
        assert run.info.status == "KILLED" and run.data.tags["rlhf_lab.error"] == "Interrupted: SIGTERM"


@pytest.mark.slow
def test_run_of_a_dead_process_is_marked_killed_at_the_next_start(tmp_path):
    proc = start_job(tmp_path)
    wait_running(tmp_path, proc)
    proc.kill()
    proc.communicate(timeout=60)
    row = runs(tmp_path).iloc[0]
    assert row["status"] == "RUNNING" and row["tags.rlhf_lab.pid"] == str(proc.pid)
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    marked = run_states.mark_dead_runs(client, row["experiment_id"])
    assert marked == [row["run_id"]]
    row = runs(tmp_path).iloc[0]
    assert row["status"] == "KILLED" and "marked KILLED at the next start" in row["tags.rlhf_lab.error"]
    assert run_states.mark_dead_runs(client, row["experiment_id"]) == []


def test_interrupted_is_not_an_exception():
    err = run_states.Interrupted(signal.SIGTERM)
    assert not isinstance(err, Exception) and not isinstance(err, KeyboardInterrupt)
    assert str(err) == "SIGTERM" and err.exit_code == 143
    assert run_states.process_alive(os.getpid())


def test_a_run_is_finished_only_after_the_writes_that_follow_it(tmp_path):
    """Inside status_after_writes a run that ended without error stays RUNNING; a later failure (the artifact
    could not be saved) ends it FAILED with the cause, a normal end FINISHED."""
    from omegaconf import OmegaConf

    from rlhf_lab.runs import tracking
    from rlhf_lab.stages.pipeline import run_settings

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = OmegaConf.create({"tracking": {"uri": uri, "experiment": "rlhf-lab"}})
    client = mlflow.MlflowClient(uri)
    with pytest.raises(PermissionError):
        with tracking.status_after_writes():
            with tracking.start_run(run_settings(cfg), "pretrain") as run:
                failed = run.info.run_id
            assert client.get_run(failed).info.status == "RUNNING" and mlflow.active_run() is None
            raise PermissionError("[Errno 13] Permission denied: 'cache/pretrain'")
    run = client.get_run(failed)
    assert run.info.status == "FAILED"
    assert run.data.tags["rlhf_lab.error"] == "PermissionError: [Errno 13] Permission denied: 'cache/pretrain'"
    with tracking.status_after_writes(), tracking.start_run(run_settings(cfg), "pretrain") as run:
        finished = run.info.run_id
    assert client.get_run(finished).info.status == "FINISHED" and not tracking.OPEN_RUNS
    # nested blocks (an upstream stage built inside the job's): each run waits on its own block
    with tracking.status_after_writes():
        with tracking.status_after_writes():  # a cached upstream artifact: no run (an empty list, like the outer's)
            pass
        with tracking.status_after_writes():
            with tracking.start_run(run_settings(cfg), "sft") as run:
                inner = run.info.run_id
        assert client.get_run(inner).info.status == "FINISHED"
        with tracking.start_run(run_settings(cfg), "ppo") as run:
            outer = run.info.run_id
        assert client.get_run(outer).info.status == "RUNNING"
    assert client.get_run(outer).info.status == "FINISHED" and not tracking.PENDING


@pytest.mark.slow
def test_a_job_whose_artifact_cannot_be_saved_ends_failed(tmp_path):
    """The job trains to the end, then cannot write its artifact into the cache (cache_dir under a file): its
    run is FAILED with the cause, and the exit status is not 0."""
    (tmp_path / "a_file").write_text("")
    job = [a for a in LONG_JOB if not a.startswith("trainer.max_steps")]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.pop("MLFLOW_TRACKING_URI", None)
    r = cli_process.run([*job, "trainer.max_steps=3", f"cache_dir={tmp_path / 'a_file' / 'cache'}"], cwd=tmp_path,
                        env=env, timeout=600)
    assert r.returncode != 0
    row = runs(tmp_path).iloc[0]
    assert row["status"] == "FAILED" and "Not a directory" in row["tags.rlhf_lab.error"], r.stderr[-2000:]


def test_an_unreachable_tracking_server_is_named_in_seconds():
    import socket

    from rlhf_lab.runs.tracking_server import tracking_server_problem

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.time()
    problem = tracking_server_problem(f"http://127.0.0.1:{port}", timeout=2)
    assert time.time() - t0 < 5
    assert problem.startswith(f"cannot reach the MLflow tracking server at http://127.0.0.1:{port} (")
    assert "\n" not in problem
    assert tracking_server_problem("sqlite:///mlflow.db") is None


def test_a_server_that_answers_is_reachable_whatever_its_status():
    import http.server
    import threading

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    from rlhf_lab.runs.tracking_server import tracking_server_problem

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert tracking_server_problem(f"http://127.0.0.1:{server.server_port}", timeout=5) is None
    finally:
        server.shutdown()



def test_a_server_that_resets_a_connection_while_it_restarts_is_asked_again():
    """A restarted server can accept a connection and reset it before its workers serve (seen: a sweep's next job
    stopped with "Connection reset by peer" just after a restart): a reset is asked again, a refusal is not."""
    import socket
    import struct
    import threading

    from rlhf_lab.runs.tracking_server import tracking_server_unreachable

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port, seen = listener.getsockname()[1], []

    def serve(resets: int) -> None:
        for i in range(resets + 1):
            conn, _ = listener.accept()
            seen.append(i)
            if i < resets:  # closed with a RST: SO_LINGER on, 0 s
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nOK")
            conn.close()

    try:
        t = threading.Thread(target=serve, args=(1,), daemon=True)
        t.start()
        assert tracking_server_unreachable(f"http://127.0.0.1:{port}", timeout=5) is None
        t.join(5)
        assert seen == [0, 1]  # reset once, answered the second time
    finally:
        listener.close()

@pytest.mark.slow
def test_cli_fails_in_seconds_on_an_unreachable_server(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), MLFLOW_TRACKING_URI=f"http://127.0.0.1:{port}")
    t0 = time.time()
    r = cli_process.run(LONG_JOB, cwd=tmp_path, env=env, timeout=120)
    assert time.time() - t0 < 60  # seconds of start-up, not minutes of retries
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and f"http://127.0.0.1:{port}" in lines[0], r.stderr[-2000:]


def test_job_phases_read_the_clock_the_cli_sets(monkeypatch):
    from rlhf_lab.runs import process as runtime

    monkeypatch.setattr(runtime, "JOB_CLOCK", {})
    assert runtime.job_phases(now=10.0) == {}  # a stage called directly: no start-up or setup to report
    monkeypatch.setattr(runtime, "JOB_CLOCK", {"process": 1.0, "job": 4.0})
    assert runtime.job_phases(now=10.0) == {"time/startup_s": 3.0, "time/setup_s": 6.0}
