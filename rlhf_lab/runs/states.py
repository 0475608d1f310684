"""How a run ends when its process is stopped: signals, exit codes, runs left RUNNING by a dead process.

- SIGTERM and SIGINT (:func:`install_signal_handlers`, by the CLI) raise :class:`Interrupted` in the main thread:
  :func:`rlhf_lab.runs.tracking.start_run` ends the open runs KILLED (``rlhf_lab.error = "Interrupted: SIGTERM"``)
  and the CLI exits ``128 + signal``. It is a ``BaseException`` but no ``KeyboardInterrupt`` (which Lightning turns
  into exit status 1), so nothing on the way swallows it. Only the first signal raises (:func:`raise_interrupted`);
  one that arrives inside a database write raises once the write is done (:func:`in_critical_code`).
- Pre-emption: inside :func:`defer_sigterm` a SIGTERM waits for the training loop's next step boundary, where it
  saves a checkpoint; Lightning's own ``SIGTERMException`` becomes :class:`Interrupted`
  (:func:`lightning_sigterm_as_interrupted`).
- ``kill -9`` or a lost Ray node: every run carries its pid, host and Ray node (:func:`process_tags`), and the next
  start of a run in the experiment ends KILLED those whose process or node is gone (:func:`mark_dead_runs`).
- A sweep stopped by a signal: its launching process passes the signal on to its job processes and ends their runs
  and the parent KILLED (:func:`end_interrupted_sweep`).

A leaf module (nothing from rlhf_lab at import, no MLflow or Lightning).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from typing import Any, Iterator

import psutil

SIGNALS = (signal.SIGTERM, signal.SIGINT)
PID_TAG = "rlhf_lab.pid"
HOST_TAG = "rlhf_lab.host"
NODE_TAG = "rlhf_lab.node"
OPEN_SWEEP: dict[str, str] = {}  # the launching process's open sweep: uri, run_id, experiment_id (rlhf_lab.entry.sweeps)
SWEEP_PID_ENV = "RLHF_LAB_SWEEP_PID"  # the pid of a sweep's launching process, for its jobs


class Interrupted(BaseException):
    """The process received a stop signal (SIGTERM, SIGINT)."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(signal.Signals(self.signum).name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


RECEIVED: list[int] = []  # the stop signals this process received since install_signal_handlers, in order
RAISED = [False]  # whether Interrupted was raised for them (once per process)
DEFER_SIGTERM = [False]  # inside defer_sigterm: a first SIGTERM waits for the training loop's step boundary


RETRYING = [False]  # the next call of the handler is retry_later's, not a new signal
# Code that a raise must not cut in the middle of: a database write cut there leaves its transaction open and the
# SQLite store locked, so the run could no longer be ended KILLED (and the error that follows would replace
# Interrupted).
CRITICAL_MODULES = ("sqlalchemy", "sqlite3", "alembic", "mlflow.store")  # bounded work (not a lock wait)
RETRY_S = 0.02


NESTED: list[int] = []  # stop signals whose handler ran inside another one's: handled once that one ends


def raise_interrupted(signum: int, frame: Any) -> None:
    """The signal handler: the first stop signal raises :class:`Interrupted` (naming it), later ones are only
    recorded, so that a second Ctrl-C or a scheduler's repeated TERM never cuts short the cleanup that ends the runs
    KILLED (the handler keeps that state itself: Lightning's teardown re-installs the handlers it found, which would
    undo a ``SIG_IGN``). Inside :func:`defer_sigterm` SIGTERMs are only recorded: the training loop stops at its next
    step boundary after its checkpoint; a SIGINT stops it at once.

    Python may run a handler inside another one, even before its first line, so signals sent at the same instant
    could name the later one: a handler called inside this one's frames only queues its signal (:data:`NESTED`),
    handled when this one ends."""
    if in_handler(frame):
        NESTED.append(int(signum))
        return
    try:
        handle_signal(signum, frame)
    finally:
        while NESTED:
            handle_signal(NESTED.pop(0), frame)


def in_handler(frame: Any) -> bool:
    """Whether `frame` or a caller of it is :func:`raise_interrupted` (a signal handled inside another's handler)."""
    while frame is not None:
        if frame.f_code is raise_interrupted.__code__:
            return True
        frame = frame.f_back
    return False


def handle_signal(signum: int, frame: Any) -> None:
    """The body of :func:`raise_interrupted`, for one signal."""
    if RETRYING[0]:
        RETRYING[0] = False
    else:
        RECEIVED.append(int(signum))
        if DEFER_SIGTERM[0] and all(s == signal.SIGTERM for s in RECEIVED):  # TERM, TERM: the save goes on
            return
    if RAISED[0]:
        return
    if in_critical_code(frame):
        retry_later()
        return
    stop_now()


def in_critical_code(frame: Any, depth: int = 200) -> bool:
    """Whether `frame` or a caller of it (up to `depth` frames) runs code of :data:`CRITICAL_MODULES`."""
    while frame is not None and depth > 0:
        if str(frame.f_globals.get("__name__", "")).startswith(CRITICAL_MODULES):
            return True
        frame, depth = frame.f_back, depth - 1
    return False


def retry_later() -> None:
    """Call the handler again in the main thread in :data:`RETRY_S` seconds, for the first signal received."""
    import _thread
    import threading

    def again() -> None:
        RETRYING[0] = True
        _thread.interrupt_main(RECEIVED[0])

    t = threading.Timer(RETRY_S, again)
    t.daemon = True
    t.start()


def pending_stop() -> int | None:
    """The stop signal received and not yet acted on (a deferred SIGTERM), or None."""
    return RECEIVED[0] if RECEIVED and not RAISED[0] else None


def stop_now() -> None:
    """Raise :class:`Interrupted` for the first stop signal received (SIGTERM on a rank that received none itself)."""
    RAISED[0] = True
    raise Interrupted(RECEIVED[0] if RECEIVED else signal.SIGTERM)


@contextlib.contextmanager
def defer_sigterm() -> Iterator[None]:
    """A SIGTERM received inside waits for the training loop's next step boundary, where the loop saves a checkpoint
    and calls :func:`stop_now`; one still pending when the block ends stops the process there."""
    DEFER_SIGTERM[0] = True
    try:
        yield
    finally:
        DEFER_SIGTERM[0] = False
    if pending_stop() is not None:
        stop_now()


@contextlib.contextmanager
def lightning_sigterm_as_interrupted() -> Iterator[None]:
    """Lightning's ``SIGTERMException`` (its handler, which ``fit`` composes in front of ours, saw a SIGTERM ours
    deferred; a ``SystemExit`` without code: exit status 0) raised as :class:`Interrupted`: the run ends KILLED, exit
    143."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    try:
        yield
    except SIGTERMException:
        if not RECEIVED:
            RECEIVED.append(int(signal.SIGTERM))
        RAISED[0] = True  # a retry of our handler still pending does nothing
        raise Interrupted(RECEIVED[0]) from None


def ignore_signals() -> None:
    """SIGTERM and SIGINT ignored from here on (the CLI's last cleanup, once a stop signal was received)."""
    import threading

    if threading.current_thread() is threading.main_thread():
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)


def install_signal_handlers() -> dict:
    """SIGTERM and SIGINT raise :class:`Interrupted` (main thread only; elsewhere this does nothing).
    Returns the handlers it replaced, for :func:`restore_signal_handlers`."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    RECEIVED.clear()
    NESTED.clear()
    RAISED[0] = RETRYING[0] = False
    for s in SIGNALS:
        signal.signal(s, raise_interrupted)
    return previous


def restore_signal_handlers(previous: dict) -> None:
    for s, handler in previous.items():
        if handler is not None:
            signal.signal(s, handler)


def ray_node_id() -> str | None:
    """The id of the Ray node this process runs on when it is a Ray worker, else None (Ray is never imported)."""
    ray = sys.modules.get("ray")
    try:
        return ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else None
    except Exception:  # noqa: BLE001  (a half-initialised Ray: no node to name)
        return None


def dead_ray_nodes() -> dict[str, str]:
    """{node id: its address} of the nodes the Ray cluster this process is connected to reports dead, else {}."""
    ray = sys.modules.get("ray")
    try:
        if ray is None or not ray.is_initialized():
            return {}
        return {n["NodeID"]: str(n.get("NodeManagerAddress", "?")) for n in ray.nodes() if not n.get("Alive", True)}
    except Exception:  # noqa: BLE001  (the cluster's state is unreadable: nothing is known dead)
        return {}


def process_tags() -> dict[str, str]:
    """The tags that say where a run's process lives: pid and host, and the Ray node inside a Ray worker."""
    node = ray_node_id()
    return {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname(), **({NODE_TAG: node} if node else {})}


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists (psutil; a zombie counts, as for ``kill -0``)."""
    return psutil.pid_exists(pid)


def pid_running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (a killed job process its launcher has not reaped)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's: it exists
        return True


def descendants(pid: int | None = None) -> list[int]:
    """The live (not zombie) processes below `pid` (this process), children first (psutil)."""
    try:
        below = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p.pid for p in below if pid_running(p.pid)]


def stop_processes(pids: list[int], signum: int, grace_s: float) -> None:
    """Send `signum` to `pids` (a sweep's job processes: they end their runs KILLED), wait up to `grace_s` seconds
    for them to end, then SIGKILL those left."""
    for sig, wait in ((signum, grace_s), (signal.SIGKILL, 5.0)):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        t0 = time.time()
        while pids and time.time() - t0 < wait:
            time.sleep(0.2)
            pids = [p for p in pids if pid_running(p)]
        if not pids:
            return


def end_interrupted_sweep(error: str, signum: int, grace_s: float = 30.0) -> tuple[list[str], list[str]]:
    """In the launching process of a sweep (:data:`OPEN_SWEEP`) that a stop signal interrupted: the signal passed on
    to the processes below this one that hold a RUNNING run of the sweep (:func:`stop_processes`), those runs whose
    process is then gone and the parent ended KILLED with ``rlhf_lab.error`` = `error`. Returns (the job runs it
    ended, those left open: on another host, ended by the next start there). Outside a sweep: nothing."""
    if not OPEN_SWEEP:
        return [], []
    from mlflow.tracking import MlflowClient

    sweep = dict(OPEN_SWEEP)
    OPEN_SWEEP.clear()
    client = MlflowClient(tracking_uri=sweep["uri"])
    host = socket.gethostname()

    def running_jobs() -> list:
        return list(client.search_runs([sweep["experiment_id"]], max_results=5000, filter_string=(
            f"tags.mlflow.parentRunId = '{sweep['run_id']}' and attributes.status = 'RUNNING'")))

    mine = set(descendants())
    pids = [int(p) for r in running_jobs() if r.data.tags.get(HOST_TAG) == host
            for p in [r.data.tags.get(PID_TAG, "")] if p.isdigit() and int(p) in mine]
    stop_processes(pids, signum, grace_s)
    ended, left = [], []
    for r in running_jobs():
        pid = r.data.tags.get(PID_TAG, "")
        if r.data.tags.get(HOST_TAG) == host and pid.isdigit() and not pid_running(int(pid)):
            client.set_tag(r.info.run_id, "rlhf_lab.error", f"{error} (the sweep was stopped while this job ran)")
            client.set_terminated(r.info.run_id, status="KILLED")
            ended.append(r.info.run_id)
        else:
            left.append(r.info.run_id)
    client.set_tag(sweep["run_id"], "rlhf_lab.error", error)
    client.set_terminated(sweep["run_id"], status="KILLED")
    return ended, left


def mark_dead_runs(client, experiment_id: str) -> list[str]:
    """End as KILLED this user's RUNNING runs (:func:`rlhf_lab.runs.authors.authored_by`: on a team server a user
    changes only their own) whose Ray node (tag ``rlhf_lab.node``) the cluster reports dead, and those of this host
    whose process (tag ``rlhf_lab.pid``) is gone; their ids."""
    from rlhf_lab.runs.authors import authored_by, current_author

    host = socket.gethostname()
    marked = []
    dead = dead_ray_nodes()
    me = current_author()
    if dead:
        for r in authored_by(client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'",
                                                max_results=1000), me):
            node = r.data.tags.get(NODE_TAG)
            if node in dead:
                client.set_tag(r.info.run_id, "rlhf_lab.error",
                               f"Ray node {node} ({dead[node]}) was lost while the run was running; marked KILLED "
                               "by a job on a live node")
                client.set_terminated(r.info.run_id, status="KILLED")
                marked.append(r.info.run_id)
    runs = authored_by(client.search_runs([experiment_id], max_results=1000,
                                          filter_string=f"attributes.status = 'RUNNING' and tags.`{HOST_TAG}` = '{host}'"),
                       me)
    for r in runs:
        if r.info.run_id in marked:
            continue
        pid = r.data.tags.get(PID_TAG, "")
        if not pid.isdigit() or int(pid) == os.getpid() or process_alive(int(pid)):
            continue
        client.set_tag(r.info.run_id, "rlhf_lab.error",
                       f"process {pid} on {host} ended without ending the run (kill -9, power loss, OOM killer? or "
                       "it lost the tracking server); marked KILLED at the next start")
        client.set_terminated(r.info.run_id, status="KILLED")
        marked.append(r.info.run_id)
    if marked:
        print(f"[rlhf-lab] marked {len(marked)} run(s) of dead processes KILLED: {', '.join(marked)}")
    return marked
