"""``rlhf-lab-server``: a team tracking server in one folder, MLflow on PostgreSQL, with users and passwords.

    rlhf-lab-server start --dir team_store [--port 5000]   # prints: export MLFLOW_TRACKING_URI=http://127.0.0.1:5000
    rlhf-lab-server user add ann --dir team_store          # prints the path of ann's credentials file
    rlhf-lab-server status --dir team_store
    rlhf-lab-server stop --dir team_store

``start`` initialises (first time only) and starts a PostgreSQL cluster in ``<dir>/postgres``, on 127.0.0.1 only,
with passwords (:mod:`rlhf_lab.server.postgres`); then ``mlflow server --app-name rlhf-lab`` (MLflow's basic auth,
:mod:`rlhf_lab.server.auth`, with run-level checks, :mod:`rlhf_lab.server.guard`, and login limits,
:mod:`rlhf_lab.server.logins`) with the database ``mlflow`` as its backend store and ``<dir>/artifacts`` as its
artifact destination, and waits until it answers. The export line goes to stdout, everything else to stderr, so
``eval "$(rlhf-lab-server start --dir team_store)"`` sets the variable. ``--no-auth`` turns MLflow's logins off (a
warning says what that opens).

The server uses nothing in or above its folder that another local user could have planted
(:mod:`rlhf_lab.server.files`: one line, exit status 2), and ``user add --password-file`` refuses a weak password or
a file others can read (:mod:`rlhf_lab.server.passwords`). What is protected and what is not: docs/team.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

from rlhf_lab.runs.process import write_atomic
from rlhf_lab.server.auth import add_user as add_mlflow_user, auth_env, ensure_shared_experiment
from rlhf_lab.server.guard import APP_NAME as GUARD_APP, app_problem
from rlhf_lab.server.files import (Layout, Refused, ServerError, check_server_folder, ensure_secret, make_server_folder,
                                   open_private_log, private_folder, read_state, say)
from rlhf_lab.server.passwords import check_password, read_password_file
from rlhf_lab.server.postgres import (
    backend_uri,
    check_reachable,
    connect,
    find_pg_binary,
    init_cluster,
    migrate_trust_cluster,
    pg_account,
    pgpass_line,
    postgres_running,
    prepare_database,
    start_postgres,
    stop_postgres,
    uses_trust,
)

__all__ = ["Layout", "ServerError", "Refused", "backend_uri", "check_reachable", "find_pg_binary", "pg_account",
           "start", "stop", "status", "add_user", "main"]
NO_AUTH_WARNING = ("warning: --no-auth: MLflow asks no login: every user of this machine (and anyone who reaches "
                   "--host) can read, change and delete every run; PostgreSQL still asks its password")


# -- pure helpers ------------------------------------------------------------------------------------------


def tracking_url(host: str, port: int) -> str:
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on ``host:port`` now (connections closing on it, as after a stop, do not
    count: servers bind with SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port that the system reports free now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def pid_alive(pid: int | None, must_contain: str = "") -> bool:
    """Whether process ``pid`` exists (and its command line contains ``must_contain``: a reused pid is not ours)."""
    if not pid:
        return False
    try:
        return must_contain in " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


# -- PostgreSQL --------------------------------------------------------------------------------------------


def secure_cluster(layout: Layout, account) -> tuple[str, str]:
    """The cluster made (first time) or migrated from an older rlhf-lab-server's passwordless one; its superuser's
    and MLflow role's passwords (secrets generated the first time)."""
    private_folder(layout.secrets)
    exists = (layout.data / "PG_VERSION").is_file()
    if exists and not uses_trust(layout) and not layout.superuser_secret.exists():
        raise ServerError(f"the PostgreSQL cluster in {layout.data} asks a password, but its secret file "
                          f"{layout.superuser_secret} is missing: restore it, or move {layout.data} aside to start "
                          f"a new cluster (its runs are not in the new one)")
    superuser, role = ensure_secret(layout.superuser_secret), ensure_secret(layout.role_secret)
    if not exists:
        init_cluster(layout, account, superuser)
        say(f"initialised a PostgreSQL cluster in {layout.data} (passwords in {layout.secrets})")
    elif uses_trust(layout):
        if postgres_running(layout, account):
            raise ServerError(f"PostgreSQL already runs in {layout.data}: rlhf-lab-server stop --dir {layout.root} "
                              f"first")
        migrate_trust_cluster(layout, account, free_port(), superuser, role)
        say(f"migrated the PostgreSQL cluster in {layout.data} from trust (no passwords) to passwords (in "
            f"{layout.secrets}); the mlflow database now belongs to a role without superuser rights")
    return superuser, role


# -- MLflow ------------------------------------------------------------------------------------------------


def mlflow_command(pg_port: int, layout: Layout, host: str, port: int, workers: int, auth: bool = True) -> list[str]:
    """``mlflow server``'s command line (no secret in it: ``ps`` shows it to every user)."""
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_uri(pg_port),
            "--artifacts-destination", str(layout.artifacts.resolve()), "--host", host, "--port", str(port),
            "--workers", str(workers), *(["--app-name", GUARD_APP] if auth else [])]


def mlflow_env(layout: Layout, role_password: str, auth: bool) -> dict[str, str]:
    """``mlflow server``'s environment: ours, the role's password file (``PGPASSFILE``) and, with ``auth``, MLflow's
    basic-auth settings and secrets. MLflow's job runner (GenAI evaluation and scorer jobs; 7 processes) serves
    nothing of rlhf-lab's: off unless the environment asks for it."""
    write_atomic(layout.pgpass, pgpass_line(role_password))
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ, "PGPASSFILE": str(layout.pgpass)}
    return {**env, **auth_env(layout)} if auth else env


def wait_until_answers(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180.0) -> float:
    """Seconds until ``url/health`` answers 200; a ServerError if the process exits first or time runs out."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.is_file() else []
            raise ServerError(f"mlflow server exited with status {proc.returncode} (log: {log}): "
                              f"{tail[0] if tail else 'no output'}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return time.time() - t0
        except OSError:
            pass
        time.sleep(0.5)
    raise ServerError(f"mlflow server did not answer at {url} within {timeout:.0f} s (log: {log})")


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still running (zombies, awaiting a parent that may never reap
    them, do not count)."""
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                return True
    return False


def stop_process_group(pgid: int, timeout: float = 20.0) -> None:
    """SIGTERM to process group ``pgid`` (mlflow server and its workers), SIGKILL if still running after
    ``timeout`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        t0 = time.time()
        while time.time() - t0 < timeout:
            if not group_alive(pgid):
                return
            time.sleep(0.2)


# -- commands ----------------------------------------------------------------------------------------------


def checked_layout(folder: Path):
    """``folder``'s :class:`Layout` and the PostgreSQL user (None: this one), once what exists of the folder has
    passed :func:`rlhf_lab.server.files.check_server_folder` (nothing in it another user could have planted)."""
    account = pg_account()
    check_server_folder(folder, account.pw_uid if account else None)
    return Layout(folder), account


def start(folder: Path, port: int = 5000, host: str = "127.0.0.1", workers: int = 2, auth: bool = True) -> str:
    """Start PostgreSQL and MLflow for ``folder`` (created with mode 0700 if missing; MLflow's logins on unless
    ``auth`` is False); return the tracking URL."""
    layout, account = checked_layout(folder)
    state = read_state(layout)
    if pid_alive(state.get("mlflow_pid"), "mlflow"):
        raise ServerError(f"{folder} already runs a server ({state.get('url')}, pid {state['mlflow_pid']}): "
                          f"rlhf-lab-server stop --dir {folder} first")
    if not port_is_free(port, host):
        raise ServerError(f"port {port} on {host} is in use: pick another with --port")
    if auth and app_problem():
        raise ServerError(app_problem())
    check_reachable(layout.root, account)  # the folders above: before creating anything
    make_server_folder(folder, account.pw_uid if account else None)
    if account is not None:  # the PostgreSQL user enters the folder (x), nothing more
        folder.chmod(folder.stat().st_mode | 0o001)
    superuser, role = secure_cluster(layout, account)
    if postgres_running(layout, account):
        raise ServerError(f"PostgreSQL already runs in {layout.data} without its MLflow server: "
                          f"rlhf-lab-server stop --dir {folder} first")
    pg_port = free_port()
    start_postgres(layout, account, pg_port)
    who = f" as user {account.pw_name}" if account else ""
    say(f"PostgreSQL on 127.0.0.1:{pg_port}{who} (data: {layout.data}, log: {layout.pg_log})")
    proc = None
    try:
        with connect("127.0.0.1", pg_port, superuser) as conn:
            prepare_database(conn, role)
        private_folder(layout.artifacts)  # clients send and fetch artifacts through the server, not the disk
        url = tracking_url(host, port)
        if not auth:
            say(NO_AUTH_WARNING)
        log = open_private_log(layout.mlflow_log)  # 0600: its access log names users and experiments
        try:
            proc = subprocess.Popen(mlflow_command(pg_port, layout, host, port, workers, auth), stdout=log,
                                    stderr=log, stdin=subprocess.DEVNULL, start_new_session=True, cwd=folder,
                                    env=mlflow_env(layout, role, auth))
        finally:
            os.close(log)
        write_atomic(layout.state, json.dumps({"url": url, "mlflow_pid": proc.pid, "pg_port": pg_port, "port": port,
                                                "host": host, "auth": auth, "backend_store_uri": backend_uri(pg_port)},
                                               indent=1))
        secs = wait_until_answers(url, proc, layout.mlflow_log)
        if auth:
            ensure_shared_experiment(layout, url)
    except BaseException:
        if proc is not None:
            stop_process_group(proc.pid)
        with contextlib.suppress(ServerError):  # the first error is the one to report
            stop_postgres(layout, account)
        layout.state.unlink(missing_ok=True)
        raise
    logins = f"logins on (admin password: {layout.admin_secret}; users: rlhf-lab-server user add NAME --dir " \
             f"{folder})" if auth else "no logins"
    say(f"MLflow server on {url} after {secs:.0f} s, {logins} (backend store {backend_uri(pg_port)}, artifacts "
        f"{layout.artifacts}, log {layout.mlflow_log}); UI: open {url}; stop: rlhf-lab-server stop --dir {folder}")
    return url


def stop(folder: Path) -> bool:
    """Stop the MLflow server, then PostgreSQL; False when neither was running."""
    layout, account = checked_layout(folder)
    state = read_state(layout)
    stopped = False
    if pid_alive(state.get("mlflow_pid"), "mlflow"):
        stop_process_group(int(state["mlflow_pid"]))
        say(f"stopped the MLflow server ({state.get('url')})")
        stopped = True
    if (layout.data / "PG_VERSION").is_file():
        if postgres_running(layout, account):
            stop_postgres(layout, account)
            say(f"stopped PostgreSQL ({layout.data})")
            stopped = True
    layout.state.unlink(missing_ok=True)
    if not stopped:
        say(f"no server runs in {folder}")
    return stopped


def status(folder: Path) -> bool:
    """Say what runs in ``folder`` (and print the export line when MLflow does); True when both run."""
    layout, account = checked_layout(folder)
    state = read_state(layout)
    mlflow_up = pid_alive(state.get("mlflow_pid"), "mlflow")
    pg_up = (layout.data / "PG_VERSION").is_file() and postgres_running(layout, account)
    logins = (" (logins on)" if state.get("auth") else " (no logins: --no-auth)") if mlflow_up else ""
    say(f"MLflow server: {'running at ' + state['url'] if mlflow_up else 'stopped'}{logins}; "
        f"PostgreSQL: {'running on 127.0.0.1:' + str(state.get('pg_port', '?')) if pg_up else 'stopped'}")
    if mlflow_up:
        print(f"export MLFLOW_TRACKING_URI={state['url']}")
    return mlflow_up and pg_up


def add_user(folder: Path, name: str, password_file: Path | None = None) -> Path:
    """Create MLflow user ``name`` on the server running in ``folder``, its password read from ``password_file``
    or generated; return its credentials file (0600, in ``<dir>/users``). Nothing secret is printed. A password file
    that another user owns or may read, or a short or common password, is refused
    (:mod:`rlhf_lab.server.passwords`)."""
    password = read_password_file(password_file) if password_file else secrets.token_urlsafe(24)
    if password_file:
        check_password(password, name, password_file)
    layout, _ = checked_layout(folder)
    state = read_state(layout)
    if not pid_alive(state.get("mlflow_pid"), "mlflow"):
        raise ServerError(f"no server runs in {folder}: rlhf-lab-server start --dir {folder} first")
    if not state.get("auth"):
        raise ServerError(f"the server in {folder} runs without logins (--no-auth): stop it and start it without "
                          f"--no-auth to have users")
    path = add_mlflow_user(layout, state["url"], name, password)
    say(f"created the MLflow user {name}: its login is in {path} (mode 600, the format of ~/.mlflow/credentials); "
        f"hand it to {name} privately, e.g. as root: install -D -m 600 -o {name} {path} ~{name}/.mlflow/credentials")
    return path


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlhf-lab-server", description="A team MLflow tracking server on PostgreSQL, "
                                "with users, kept in one folder (docs/team.md).")
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (("start", "initialise (first time) and start PostgreSQL and mlflow server"),
                       ("stop", "stop mlflow server and PostgreSQL"), ("status", "say what runs")):
        c = sub.add_parser(name, help=text)
        c.add_argument("--dir", required=True, type=Path, help="the team folder (database, artifacts, logs)")
        if name == "start":
            c.add_argument("--port", type=int, default=5000, help="MLflow's port (default 5000)")
            c.add_argument("--host", default="127.0.0.1", help="MLflow's interface (default 127.0.0.1; HTTP without "
                           "TLS: another interface sends passwords in clear over the network)")
            c.add_argument("--workers", type=int, default=2, help="MLflow's worker processes (default 2)")
            c.add_argument("--no-auth", action="store_true", help="MLflow without logins: every local user can "
                           "read, change and delete every run (PostgreSQL keeps its password)")
    user = sub.add_parser("user", help="MLflow's users").add_subparsers(dest="action", required=True)
    add = user.add_parser("add", help="create a user (password generated, or read from --password-file); prints the "
                          "path of its credentials file")
    add.add_argument("name")
    add.add_argument("--dir", required=True, type=Path, help="the team folder of the running server")
    add.add_argument("--password-file", type=Path, help="a file whose first line is the password (default: "
                     "generated)")
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        if a.command == "start":
            print(f"export MLFLOW_TRACKING_URI={start(a.dir, a.port, a.host, a.workers, not a.no_auth)}", flush=True)
            return 0
        if a.command == "stop":
            stop(a.dir)
            return 0
        if a.command == "user":
            print(add_user(a.dir, a.name, a.password_file), flush=True)
            return 0
        return 0 if status(a.dir) else 1
    except ServerError as err:
        print(f"rlhf-lab-server: {err}", file=sys.stderr)
        return 2 if isinstance(err, Refused) else 1


if __name__ == "__main__":
    raise SystemExit(main())
