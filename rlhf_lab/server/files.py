"""The team server's folder (:mod:`rlhf_lab.entry.server`): where everything lives, and its secrets.

Secrets are random tokens kept in ``<dir>/secrets`` (mode 0700), one file each, mode 0600, owned by the user who
runs ``rlhf-lab-server``; they reach the processes that need them through files or environment variables, never
through command lines (which every local user can read in ``/proc/<pid>/cmdline``) nor the logs. A secret file
that other users can read is refused, not used.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

STATE_FILE = "server.json"


class ServerError(RuntimeError):
    """A failure with a one-line message that says what to do."""


def say(msg: str) -> None:
    """A progress line of ``rlhf-lab-server`` on stderr (stdout carries only the export line)."""
    print(f"[rlhf-lab-server] {msg}", file=sys.stderr, flush=True)


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

    @property
    def secrets(self) -> Path:  # 0700: the secrets below, MLflow's user store and its configuration
        return self.root / "secrets"

    @property
    def superuser_secret(self) -> Path:  # the password of the cluster's superuser (initdb -U)
        return self.secrets / "postgres_superuser"

    @property
    def role_secret(self) -> Path:  # the password of the role MLflow's server connects as
        return self.secrets / "postgres_mlflow"

    @property
    def pgpass(self) -> Path:  # libpq's password file for MLflow's server (PGPASSFILE in its environment only)
        return self.secrets / "pgpass"

    @property
    def admin_secret(self) -> Path:  # the password of MLflow's user `admin`
        return self.secrets / "mlflow_admin"

    @property
    def flask_secret(self) -> Path:  # MLflow's CSRF key (MLFLOW_FLASK_SERVER_SECRET_KEY)
        return self.secrets / "flask_secret_key"

    @property
    def auth_config(self) -> Path:  # MLFLOW_AUTH_CONFIG_PATH
        return self.secrets / "basic_auth.ini"

    @property
    def auth_db(self) -> Path:  # MLflow's user store (users, password hashes, permissions)
        return self.secrets / "basic_auth.db"

    @property
    def users(self) -> Path:  # 0700: one ``<name>.credentials`` file per user that `user add` created
        return self.root / "users"


def read_state(layout: Layout) -> dict:
    """What ``start`` recorded in ``server.json`` (URL, pids, ports, whether MLflow asks a login); {} if nothing."""
    try:
        return json.loads(layout.state.read_text())
    except (OSError, ValueError):
        return {}


def private_folder(path: Path) -> Path:
    """``path`` created if missing, mode 0700 (only its owner enters)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 from its creation on (a new file replaces an old one)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_secret(path: Path) -> str:
    """The secret in ``path``; a ServerError when it is missing or unreadable, other users may read it (mode beyond
    0600), or it is empty."""
    try:
        mode = path.stat().st_mode & 0o777
        value = path.read_text().strip()
    except FileNotFoundError:
        raise ServerError(f"the secret file {path} is missing: restore it from a backup (the server's data need "
                          f"it)") from None
    except PermissionError:
        raise ServerError(f"cannot read the secret file {path}: run rlhf-lab-server as the user who owns "
                          f"{path.parent}") from None
    if mode & 0o077:
        raise ServerError(f"the secret file {path} is readable by other users (mode {oct(mode)}): chmod 600 {path} "
                          f"and change the secret if they may have read it")
    if not value:
        raise ServerError(f"the secret file {path} is empty: delete it and start again to generate a new one")
    return value


def ensure_secret(path: Path) -> str:
    """The secret in ``path``, generated (a random 43-character token) and written 0600 the first time."""
    if not path.exists():
        private_folder(path.parent)
        write_private(path, secrets.token_urlsafe(32) + "\n")
    return read_secret(path)
