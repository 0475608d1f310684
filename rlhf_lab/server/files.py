"""The team server's folder (:mod:`rlhf_lab.entry.server`): where everything lives, its secrets, and who may have
put them there.

Secrets are random tokens in ``<dir>/secrets`` (0700), one file each (0600), handed to the processes that need them
through files or environment variables, never command lines (every local user reads ``/proc/<pid>/cmdline``) nor
logs; a secret file others can read is refused.

The server uses nothing another local user could have planted or swapped (:func:`check_server_folder`): what it keeps
in the folder must be this user's (``<dir>/postgres`` may be the PostgreSQL user's), no symbolic link, writable by no
one else, and every folder above it root's or this user's and writable by no one else unless sticky (``/tmp``).
Files are opened with ``O_NOFOLLOW`` and written by write-then-rename (:func:`rlhf_lab.runs.process.write_atomic`),
so a symbolic link is never followed. A refusal is a :class:`Refused` (exit status 2) naming the path and the fix.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import stat
import sys
from pathlib import Path

from rlhf_lab.runs.process import write_atomic

STATE_FILE = "server.json"


class ServerError(RuntimeError):
    """A failure with a one-line message that says what to do."""


class Refused(ServerError):
    """A path or input that ``rlhf-lab-server`` will not use (another user owns or may write it, a symbolic link, a
    weak password); one line naming it and the fix, exit status 2."""


PLANTED_FIX = "remove it if you did not make it (or rlhf-lab-server start --dir a new folder, e.g. ~/rlhf_team)"


def say(msg: str) -> None:
    """A progress line of ``rlhf-lab-server`` on stderr (stdout carries only the export line)."""
    print(f"[rlhf-lab-server] {msg}", file=sys.stderr, flush=True)


class Layout:
    """Where everything lives inside the team folder (made absolute: the PostgreSQL tools run inside it)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.data = self.root / "postgres"  # the PostgreSQL cluster, owned by the PostgreSQL user
        self.pg_log = self.data / "postgres.log"  # inside the data folder: the PostgreSQL user writes it
        self.artifacts = self.root / "artifacts"
        self.mlflow_log = self.root / "mlflow.log"
        self.state = self.root / STATE_FILE
        self.users = self.root / "users"  # 0700: one ``<name>.credentials`` file per user that `user add` created
        self.secrets = self.root / "secrets"  # 0700: the secrets below, MLflow's user store and its configuration
        self.superuser_secret = self.secrets / "postgres_superuser"  # the cluster's superuser's password (initdb -U)
        self.role_secret = self.secrets / "postgres_mlflow"  # the password of the role MLflow's server connects as
        self.pgpass = self.secrets / "pgpass"  # libpq's password file for MLflow's server (its PGPASSFILE only)
        self.admin_secret = self.secrets / "mlflow_admin"  # the password of MLflow's user `admin`
        self.flask_secret = self.secrets / "flask_secret_key"  # MLflow's CSRF key (MLFLOW_FLASK_SERVER_SECRET_KEY)
        self.auth_config = self.secrets / "basic_auth.ini"  # MLFLOW_AUTH_CONFIG_PATH
        self.auth_db = self.secrets / "basic_auth.db"  # MLflow's user store (users, password hashes, permissions)


def user_name(uid: int) -> str:
    """The login name of ``uid`` (``uid N`` when it has none)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def check_owned(path: Path, st: os.stat_result, fix: str, owners: tuple[int, ...] = ()) -> None:
    """A :class:`Refused` unless ``path`` (its ``lstat``) is no symbolic link, is owned by this user (or one of
    ``owners``) and is writable by no one else; ``fix``: what to do (the end of the message)."""
    me = os.geteuid()
    if stat.S_ISLNK(st.st_mode):
        raise Refused(f"{path} is a symbolic link (rlhf-lab-server follows none in its folder): {fix}")
    if st.st_uid != me and st.st_uid not in owners:
        raise Refused(f"{path} belongs to {user_name(st.st_uid)}, not to {user_name(me)} who runs rlhf-lab-server "
                      f"(another user may have planted it): {fix}")
    if st.st_mode & 0o022:
        raise Refused(f"{path} can be written by other users (mode {oct(st.st_mode & 0o7777)}): chmod go-w {path} "
                      f"if nobody else changed it, else {fix}")


def check_above(folder: Path) -> None:
    """A :class:`Refused` unless every folder above ``folder``, and every symbolic link on its way, is owned by
    root or this user, and no other user may write in those folders unless they are sticky (as ``/tmp``: others
    create entries in it but cannot rename or remove ours). Components that do not exist yet are skipped (this
    user creates them)."""
    me = os.geteuid()
    given = Path(os.path.abspath(folder))
    for path in [*reversed(given.parents), *reversed(Path(os.path.realpath(folder)).parents)]:
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        if st.st_uid not in (0, me):
            raise Refused(f"{path}, above {given}, belongs to {user_name(st.st_uid)}, who could swap the folder: "
                          f"put --dir in a folder of your own, e.g. ~/rlhf_team")
        if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise Refused(f"{path}, above {given}, can be written by other users (mode {oct(st.st_mode & 0o7777)}), "
                          f"who could swap the folder: chmod go-w {path}, or put --dir in a folder of your own, "
                          f"e.g. ~/rlhf_team")


def check_server_folder(folder: Path, data_owner: int | None = None) -> None:
    """What exists of the server's folder can be trusted (the module's rules; ``data_owner``: the PostgreSQL
    user's uid, who may own ``<dir>/postgres``); a :class:`Refused` naming the first path that cannot."""
    check_above(folder)
    given = Path(os.path.abspath(folder))
    try:
        st = given.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise Refused(f"{given} is a symbolic link: give --dir the real folder ({os.path.realpath(given)}) if it is "
                      f"yours, else a folder of your own, e.g. ~/rlhf_team")
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(f"{given} is not a folder: give --dir a folder of your own (rlhf-lab-server creates it)")
    check_owned(given, st, "use a folder of your own, e.g. ~/rlhf_team (rlhf-lab-server creates it, mode 0700)")
    layout = Layout(given)
    owners = {layout.data: (data_owner,) if data_owner is not None else ()}
    for path in (layout.state, layout.mlflow_log, layout.secrets, layout.users, layout.artifacts, layout.data):
        try:
            check_owned(path, path.lstat(), PLANTED_FIX, owners.get(path, ()))
        except FileNotFoundError:
            continue
    for private in (layout.secrets, layout.users):
        if private.is_dir():
            for path in private.iterdir():
                check_owned(path, path.lstat(), PLANTED_FIX)


def make_server_folder(folder: Path, data_owner: int | None = None) -> Layout:
    """The server's folder, created with mode 0700 when missing (its parents too, as this user's), after
    :func:`check_server_folder`; its :class:`Layout`."""
    check_server_folder(folder, data_owner)
    path = Path(os.path.abspath(folder))
    if not path.exists():
        path.mkdir(mode=0o700, parents=True)
        path.chmod(0o700)  # mkdir's mode passes through the umask
    return Layout(path)


def read_state(layout: Layout) -> dict:
    """What ``start`` recorded in ``server.json`` (URL, pids, ports, whether MLflow asks a login); {} if nothing
    (or not JSON); a :class:`Refused` when it is a symbolic link or another user's."""
    try:
        fd = os.open(layout.state, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return {}
    except OSError as err:  # ELOOP: a symbolic link
        check_owned(layout.state, layout.state.lstat(), PLANTED_FIX)
        raise ServerError(f"cannot read {layout.state}: {err.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        check_owned(layout.state, os.fstat(f.fileno()), PLANTED_FIX)
        try:
            return json.loads(f.read())
        except ValueError:
            return {}


def private_folder(path: Path) -> Path:
    """``path`` created if missing, mode 0700 (only its owner enters); a :class:`Refused` when it exists as a
    symbolic link, another user's folder, or one others may write."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_owned(path, path.lstat(), PLANTED_FIX)
    path.chmod(0o700)
    return path


def open_private_log(path: Path, owners: tuple[int, ...] = ()) -> int:
    """A file descriptor appending to the log ``path``, mode 0600 (created so, or made so), never through a symbolic
    link; a :class:`Refused` when it is a user's other than this one (or ``owners``)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as err:  # ELOOP: a symbolic link
        check_owned(path, path.lstat(), PLANTED_FIX)
        raise ServerError(f"cannot open the log {path}: {err.strerror}") from None
    try:
        check_owned(path, os.fstat(fd), PLANTED_FIX, owners)
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_secret(path: Path) -> str:
    """The secret in ``path``; a ServerError when it is missing or unreadable, or empty; a :class:`Refused` when it
    is a symbolic link, another user's, or others may read or write it (mode beyond 0600)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise ServerError(f"the secret file {path} is missing: restore it from a backup (the server's data need "
                          f"it)") from None
    except PermissionError:
        raise ServerError(f"cannot read the secret file {path}: run rlhf-lab-server as the user who owns "
                          f"{path.parent}") from None
    except OSError as err:  # ELOOP: a symbolic link
        check_owned(path, path.lstat(), PLANTED_FIX + "; then change the secrets: others may know them")
        raise ServerError(f"cannot read the secret file {path}: {err.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        value = f.read().decode(errors="replace").strip()
    check_owned(path, st, PLANTED_FIX + "; then change the secrets: others may know them")
    mode = st.st_mode & 0o777
    if mode & 0o077:
        raise Refused(f"the secret file {path} is readable by other users (mode {oct(mode)}): chmod 600 {path} "
                          f"and change the secret if they may have read it")
    if not value:
        raise ServerError(f"the secret file {path} is empty: delete it and start again to generate a new one")
    return value


def ensure_secret(path: Path) -> str:
    """The secret in ``path``, generated (a random 43-character token) and written 0600 the first time."""
    if not path.exists():
        private_folder(path.parent)
        write_atomic(path, secrets.token_urlsafe(32) + "\n")
    return read_secret(path)
