"""``rlhf-lab-server``: a team tracking server in one folder, MLflow on PostgreSQL.

    rlhf-lab-server start --dir team_store [--port 5000]   # prints: export MLFLOW_TRACKING_URI=http://127.0.0.1:5000
    rlhf-lab-server status --dir team_store
    rlhf-lab-server stop --dir team_store

``start`` initialises (``initdb``, first time only) and starts (``pg_ctl``) a PostgreSQL cluster in
``<dir>/postgres`` with the system's binaries (on ``PATH`` or under ``/usr/lib/postgresql/*/bin``), listening on
127.0.0.1 only, on a free port, without Unix sockets; creates the database ``mlflow``; then starts
``mlflow server`` with that database as its backend store and ``<dir>/artifacts`` as its artifact destination
(clients upload artifacts through the server), and waits until it answers. The export line goes to stdout,
everything else to stderr, so ``eval "$(rlhf-lab-server start --dir team_store)"`` sets the variable.

PostgreSQL refuses to run as root. Started as root, the PostgreSQL processes run as the user ``postgres``
(created by ``apt-get install postgresql``), or as ``rlhf-lab-pg``, created with ``useradd`` when there is no
``postgres`` user; the data folder is owned by that user, and every folder above it must let it in.

Neither server asks for a password: both listen on the loopback interface only, and MLflow's server has no
authentication of its own, so anyone logged in on this machine can use them.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

DB_NAME = "mlflow"
DB_USER = "rlhf_lab"  # the cluster's superuser (initdb -U)
ROOT_PG_USERS = ("postgres", "rlhf-lab-pg")  # as root: the first that exists, else the last is created
STATE_FILE = "server.json"
INSTALL_HINT = "install PostgreSQL's server binaries: apt-get install postgresql (Debian, Ubuntu)"


class ServerError(RuntimeError):
    """A failure with a one-line message that says what to do."""


@dataclass(frozen=True)
class Layout:
    """Where everything lives inside the team folder (made absolute: the PostgreSQL tools run inside it)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root).resolve())

    @property
    def data(self) -> Path:  # the PostgreSQL cluster, owned by the PostgreSQL user
        return self.root / "postgres"

    @property
    def pg_log(self) -> Path:  # inside the data folder: the PostgreSQL user writes it
        return self.data / "postgres.log"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    @property
    def mlflow_log(self) -> Path:
        return self.root / "mlflow.log"

    @property
    def state(self) -> Path:
        return self.root / STATE_FILE


# -- pure helpers ------------------------------------------------------------------------------------------


def find_pg_binary(name: str, path_env: str | None = None, pattern: str = "/usr/lib/postgresql/*/bin") -> Path:
    """``name`` (``initdb``, ``pg_ctl``) on ``PATH``, else in the newest ``/usr/lib/postgresql/<version>/bin``."""
    found = shutil.which(name, path=path_env if path_env is not None else os.environ.get("PATH"))
    if found:
        return Path(found)
    dirs = sorted(glob.glob(pattern), key=lambda d: [int(p) if p.isdigit() else 0 for p in Path(d).parent.name.split(".")])
    for d in reversed(dirs):
        if (Path(d) / name).is_file():
            return Path(d) / name
    raise ServerError(f"PostgreSQL's {name} is not on PATH nor in {pattern}: {INSTALL_HINT}")


def backend_uri(pg_port: int) -> str:
    return f"postgresql+psycopg://{DB_USER}@127.0.0.1:{pg_port}/{DB_NAME}"


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
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return must_contain in cmdline


def read_state(layout: Layout) -> dict:
    try:
        return json.loads(layout.state.read_text())
    except (OSError, ValueError):
        return {}


# -- the PostgreSQL user -----------------------------------------------------------------------------------


def pg_account() -> pwd.struct_passwd | None:
    """The account the PostgreSQL processes run as: None (this user) unless root; as root ``postgres``, else
    ``rlhf-lab-pg``, created with ``useradd`` if missing."""
    if os.geteuid() != 0:
        return None
    for name in ROOT_PG_USERS:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    name = ROOT_PG_USERS[-1]
    r = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise ServerError(f"cannot create the user {name} that PostgreSQL runs as (it refuses root): "
                          f"{r.stderr.strip() or r.stdout.strip()}")
    return pwd.getpwnam(name)


def as_account(account: pwd.struct_passwd | None) -> dict:
    """subprocess keyword arguments that run a command as ``account`` (nothing when None)."""
    if account is None:
        return {}
    env = dict(os.environ, HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name)
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": [], "env": env}


def check_reachable(folder: Path, account: pwd.struct_passwd | None) -> None:
    """Every folder above ``folder`` must let the PostgreSQL user in (x for others, or owned by it)."""
    if account is None:
        return
    for parent in folder.resolve().parents:
        if not parent.exists():  # created later, by this user, with mode 0755
            continue
        st = parent.stat()
        if not (st.st_mode & 0o001 or st.st_uid == account.pw_uid):
            raise ServerError(f"the PostgreSQL user {account.pw_name} cannot enter {parent} (mode "
                              f"{oct(st.st_mode & 0o777)}): put --dir in a folder every user can reach, e.g. "
                              f"/srv/rlhf_team, or chmod o+x {parent}")


def run_checked(cmd: list, what: str, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if r.returncode != 0:
        detail = (r.stderr.strip() or r.stdout.strip()).splitlines()
        raise ServerError(f"{what} failed: {detail[-1] if detail else 'exit status ' + str(r.returncode)}")
    return r


# -- PostgreSQL --------------------------------------------------------------------------------------------


def init_cluster(layout: Layout, account: pwd.struct_passwd | None) -> bool:
    """``initdb`` into the data folder unless it holds a cluster already; True when it created one."""
    if (layout.data / "PG_VERSION").is_file():
        return False
    layout.data.mkdir(parents=True, exist_ok=True)
    if account is not None:
        os.chown(layout.data, account.pw_uid, account.pw_gid)
    layout.data.chmod(0o700)
    run_checked([find_pg_binary("initdb"), "-D", layout.data, "-U", DB_USER, "--auth=trust", "-E", "UTF8",
                 "--locale=C"], "initdb", cwd=layout.data, **as_account(account))
    return True


def start_postgres(layout: Layout, account: pwd.struct_passwd | None, port: int) -> None:
    options = f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories=''"
    run_checked([find_pg_binary("pg_ctl"), "-D", layout.data, "-l", layout.pg_log, "-o", options, "-w", "-t", "60",
                 "start"], f"pg_ctl start (log: {layout.pg_log})", cwd=layout.data, **as_account(account))


def postgres_running(layout: Layout, account: pwd.struct_passwd | None) -> bool:
    if not (layout.data / "postmaster.pid").is_file():
        return False
    r = subprocess.run([str(find_pg_binary("pg_ctl")), "-D", str(layout.data), "status"], capture_output=True,
                       cwd=layout.data, **as_account(account))
    return r.returncode == 0


def stop_postgres(layout: Layout, account: pwd.struct_passwd | None) -> None:
    run_checked([find_pg_binary("pg_ctl"), "-D", layout.data, "-m", "fast", "-w", "-t", "60", "stop"],
                "pg_ctl stop", cwd=layout.data, **as_account(account))


def create_database(pg_port: int) -> None:
    """The database ``mlflow`` (MLflow creates its tables at its first start)."""
    try:
        import psycopg
    except ImportError:
        raise ServerError("MLflow's PostgreSQL driver psycopg is missing: pip install 'rlhf-lab[cluster]'") from None
    with psycopg.connect(host="127.0.0.1", port=pg_port, user=DB_USER, dbname="postgres", autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,)).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{DB_NAME}"')


# -- MLflow ------------------------------------------------------------------------------------------------


def mlflow_command(pg_port: int, layout: Layout, host: str, port: int, workers: int) -> list[str]:
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_uri(pg_port),
            "--artifacts-destination", str(layout.artifacts.resolve()), "--host", host, "--port", str(port),
            "--workers", str(workers)]


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
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:  # fields after the command: state, ppid, pgrp
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


def say(msg: str) -> None:
    print(f"[rlhf-lab-server] {msg}", file=sys.stderr, flush=True)


def start(folder: Path, port: int = 5000, host: str = "127.0.0.1", workers: int = 2) -> str:
    """Start PostgreSQL and MLflow for ``folder``; return the tracking URL."""
    layout = Layout(folder)
    state = read_state(layout)
    if pid_alive(state.get("mlflow_pid"), "mlflow"):
        raise ServerError(f"{folder} already runs a server ({state.get('url')}, pid {state['mlflow_pid']}): "
                          f"rlhf-lab-server stop --dir {folder} first")
    if not port_is_free(port, host):
        raise ServerError(f"port {port} on {host} is in use: pick another with --port")
    account = pg_account()
    folder.mkdir(parents=True, exist_ok=True)
    if account is not None:  # the PostgreSQL user enters the folder (x), nothing more
        folder.chmod(folder.stat().st_mode | 0o001)
    check_reachable(layout.data, account)
    if init_cluster(layout, account):
        say(f"initialised a PostgreSQL cluster in {layout.data}")
    if postgres_running(layout, account):
        raise ServerError(f"PostgreSQL already runs in {layout.data} without its MLflow server: "
                          f"rlhf-lab-server stop --dir {folder} first")
    pg_port = free_port()
    start_postgres(layout, account, pg_port)
    who = f" as user {account.pw_name}" if account else ""
    say(f"PostgreSQL on 127.0.0.1:{pg_port}{who} (data: {layout.data}, log: {layout.pg_log})")
    try:
        create_database(pg_port)
        layout.artifacts.mkdir(exist_ok=True)
        url = tracking_url(host, port)
        # MLflow's job runner (GenAI evaluation and scorer jobs; 7 processes) serves nothing of rlhf-lab's: off
        # unless the environment asks for it
        env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
        with open(layout.mlflow_log, "ab") as log:
            proc = subprocess.Popen(mlflow_command(pg_port, layout, host, port, workers), stdout=log, stderr=log,
                                    stdin=subprocess.DEVNULL, start_new_session=True, cwd=folder, env=env)
        layout.state.write_text(json.dumps({"url": url, "mlflow_pid": proc.pid, "pg_port": pg_port, "port": port,
                                            "host": host, "backend_store_uri": backend_uri(pg_port)}, indent=1))
        try:
            secs = wait_until_answers(url, proc, layout.mlflow_log)
        except ServerError:
            stop_process_group(proc.pid)
            raise
    except BaseException:
        with contextlib.suppress(ServerError):  # the first error is the one to report
            stop_postgres(layout, account)
        layout.state.unlink(missing_ok=True)
        raise
    say(f"MLflow server on {url} after {secs:.0f} s (backend store {backend_uri(pg_port)}, artifacts "
        f"{layout.artifacts}, log {layout.mlflow_log}); UI: open {url}; stop: rlhf-lab-server stop --dir {folder}")
    return url


def stop(folder: Path) -> bool:
    """Stop the MLflow server, then PostgreSQL; False when neither was running."""
    layout = Layout(folder)
    state = read_state(layout)
    stopped = False
    if pid_alive(state.get("mlflow_pid"), "mlflow"):
        stop_process_group(int(state["mlflow_pid"]))
        say(f"stopped the MLflow server ({state.get('url')})")
        stopped = True
    if (layout.data / "PG_VERSION").is_file():
        account = pg_account()
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
    layout = Layout(folder)
    state = read_state(layout)
    mlflow_up = pid_alive(state.get("mlflow_pid"), "mlflow")
    pg_up = (layout.data / "PG_VERSION").is_file() and postgres_running(layout, pg_account())
    say(f"MLflow server: {'running at ' + state['url'] if mlflow_up else 'stopped'}; "
        f"PostgreSQL: {'running on 127.0.0.1:' + str(state.get('pg_port', '?')) if pg_up else 'stopped'}")
    if mlflow_up:
        print(f"export MLFLOW_TRACKING_URI={state['url']}")
    return mlflow_up and pg_up


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rlhf-lab-server", description="A team MLflow tracking server on PostgreSQL, "
                                "kept in one folder (README: Team setup).")
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (("start", "initialise (first time) and start PostgreSQL and mlflow server"),
                       ("stop", "stop mlflow server and PostgreSQL"), ("status", "say what runs")):
        c = sub.add_parser(name, help=text)
        c.add_argument("--dir", required=True, type=Path, help="the team folder (database, artifacts, logs)")
        if name == "start":
            c.add_argument("--port", type=int, default=5000, help="MLflow's port (default 5000)")
            c.add_argument("--host", default="127.0.0.1", help="MLflow's interface (default 127.0.0.1; MLflow has "
                           "no authentication: anyone who reaches the port can read and write runs)")
            c.add_argument("--workers", type=int, default=2, help="MLflow's worker processes (default 2)")
    a = p.parse_args(argv)
    try:
        if a.command == "start":
            print(f"export MLFLOW_TRACKING_URI={start(a.dir, a.port, a.host, a.workers)}", flush=True)
            return 0
        if a.command == "stop":
            stop(a.dir)
            return 0
        return 0 if status(a.dir) else 1
    except ServerError as err:
        print(f"rlhf-lab-server: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
