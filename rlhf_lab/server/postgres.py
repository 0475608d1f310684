"""The team server's PostgreSQL cluster (:mod:`rlhf_lab.entry.server`): created, secured, started and stopped.

- ``initdb --auth=scram-sha-256``: every connection needs a password, the superuser's handed over in a 0600 file;
  ``pg_hba.conf`` (:data:`HBA`) admits TCP on 127.0.0.1 only, MLflow's role :data:`MLFLOW_ROLE` to ``mlflow`` only;
- MLflow's role has no superuser rights (:data:`ROLE_RIGHTS`) and owns the database ``mlflow`` and nothing else,
  so it cannot run ``COPY ... TO PROGRAM`` nor read the server's files; its password reaches MLflow's server through
  a libpq password file (``PGPASSFILE``). Passwords are sent as SCRAM verifiers computed here
  (:func:`set_password`), so no statement or log line holds one;
- a cluster of an older ``rlhf-lab-server`` (``--auth=trust``) is migrated at the next start
  (:func:`migrate_trust_cluster`).

PostgreSQL refuses to run as root: started as root, its processes run as ``postgres`` or ``rlhf-lab-pg``
(:func:`pg_account`).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from rlhf_lab.runs.process import write_atomic
from rlhf_lab.server.files import Layout, ServerError, open_private_log

DB_NAME = "mlflow"
DB_USER = "rlhf_lab"  # the cluster's superuser (initdb -U)
MLFLOW_ROLE = "mlflow_server"  # the role MLflow's server connects as: no superuser rights
ROOT_PG_USERS = ("postgres", "rlhf-lab-pg")  # as root: the first that exists, else the last is created
INSTALL_HINT = "install PostgreSQL's server binaries: apt-get install postgresql (Debian, Ubuntu)"
HBA = f"""# written by rlhf-lab-server: passwords (scram-sha-256) on 127.0.0.1 only (the server has no Unix sockets);
# MLflow's role reaches its database only
# TYPE  DATABASE  USER             ADDRESS       METHOD
host    {DB_NAME}    {MLFLOW_ROLE}    127.0.0.1/32  scram-sha-256
host    all       {DB_USER}         127.0.0.1/32  scram-sha-256
"""
ROLE_RIGHTS = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"


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
    """MLflow's backend store: the database ``mlflow`` as :data:`MLFLOW_ROLE` (no password: libpq reads it from
    ``PGPASSFILE``)."""
    return f"postgresql+psycopg://{MLFLOW_ROLE}@127.0.0.1:{pg_port}/{DB_NAME}"


def pgpass_line(password: str) -> str:
    """The libpq password-file line of MLflow's role on 127.0.0.1, any port (``:`` and ``\\`` escaped)."""
    escaped = password.replace("\\", "\\\\").replace(":", "\\:")
    return f"127.0.0.1:*:{DB_NAME}:{MLFLOW_ROLE}:{escaped}\n"


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


def give_to(path: Path, account: pwd.struct_passwd | None) -> None:
    """``path`` (a symbolic link there itself, not what it points to) owned by ``account`` (the PostgreSQL user);
    nothing when None (it is this user)."""
    if account is not None:
        os.chown(path, account.pw_uid, account.pw_gid, follow_symlinks=False)


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
                              f"{oct(st.st_mode & 0o777)}): chmod o+x {parent} (others may then pass through it, "
                              f"not list it), or run rlhf-lab-server as a user other than root")


def run_checked(cmd: list, what: str, **kw) -> subprocess.CompletedProcess:
    """Run ``cmd``; a ServerError naming ``what`` and the last line of its output when it fails."""
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if r.returncode != 0:
        detail = (r.stderr.strip() or r.stdout.strip()).splitlines()
        raise ServerError(f"{what} failed: {detail[-1] if detail else 'exit status ' + str(r.returncode)}")
    return r


# -- the cluster -------------------------------------------------------------------------------------------


def write_hba(layout: Layout, account: pwd.struct_passwd | None) -> None:
    """Replace the cluster's ``pg_hba.conf`` with :data:`HBA` (read at the next start), mode 0600, by a new file
    renamed over it (a symbolic link there is replaced, not followed)."""
    hba = layout.data / "pg_hba.conf"
    write_atomic(hba, HBA)
    give_to(hba, account)


def uses_trust(layout: Layout) -> bool:
    """Whether the cluster's ``pg_hba.conf`` lets anyone in without a password (a line with method ``trust``)."""
    try:
        lines = (layout.data / "pg_hba.conf").read_text().splitlines()
    except OSError:
        return False
    return any(line.split("#", 1)[0].split()[-1:] == ["trust"] for line in lines)


def init_cluster(layout: Layout, account: pwd.struct_passwd | None, password: str) -> bool:
    """``initdb`` into the data folder unless it holds a cluster already, the superuser's password handed over in a
    0600 file (owned by the PostgreSQL user, removed right after), then :func:`write_hba`; True when it created
    one."""
    if (layout.data / "PG_VERSION").is_file():
        return False
    layout.data.mkdir(parents=True, exist_ok=True)
    give_to(layout.data, account)
    layout.data.chmod(0o700)
    fd, pwfile = tempfile.mkstemp(prefix=".initdb-pw-", dir=layout.root)  # mode 0600
    try:
        os.write(fd, (password + "\n").encode())
        os.close(fd)
        give_to(Path(pwfile), account)
        run_checked([find_pg_binary("initdb"), "-D", layout.data, "-U", DB_USER, "--auth=scram-sha-256",
                     f"--pwfile={pwfile}", "-E", "UTF8", "--locale=C"], "initdb", cwd=layout.data, **as_account(account))
    finally:
        os.unlink(pwfile)
    write_hba(layout, account)
    return True


def start_postgres(layout: Layout, account: pwd.struct_passwd | None, port: int, socket_dir: str = "") -> None:
    """``pg_ctl start`` on 127.0.0.1:``port`` without Unix sockets, or, given ``socket_dir``, on that Unix socket
    folder only; its log made 0600 (the PostgreSQL user's) first."""
    private_log(layout, account)
    listen = f"-c listen_addresses='' -c unix_socket_directories='{socket_dir}'" if socket_dir else \
        "-c listen_addresses=127.0.0.1 -c unix_socket_directories=''"
    run_checked([find_pg_binary("pg_ctl"), "-D", layout.data, "-l", layout.pg_log, "-o", f"-p {port} {listen}", "-w",
                 "-t", "60", "start"], f"pg_ctl start (log: {layout.pg_log})", cwd=layout.data, **as_account(account))


def private_log(layout: Layout, account: pwd.struct_passwd | None) -> None:
    """PostgreSQL's log (``pg_ctl -l``, which appends to it) created or made mode 0600, owned by ``account`` when
    given, never through a symbolic link (:func:`rlhf_lab.server.files.open_private_log`)."""
    fd = open_private_log(layout.pg_log, (account.pw_uid,) if account else ())
    try:
        if account is not None:
            os.fchown(fd, account.pw_uid, account.pw_gid)
    finally:
        os.close(fd)


def postgres_running(layout: Layout, account: pwd.struct_passwd | None) -> bool:
    """Whether ``pg_ctl status`` finds the cluster's server running."""
    if not (layout.data / "postmaster.pid").is_file():
        return False
    r = subprocess.run([str(find_pg_binary("pg_ctl")), "-D", str(layout.data), "status"], capture_output=True,
                       cwd=layout.data, **as_account(account))
    return r.returncode == 0


def stop_postgres(layout: Layout, account: pwd.struct_passwd | None) -> None:
    run_checked([find_pg_binary("pg_ctl"), "-D", layout.data, "-m", "fast", "-w", "-t", "60", "stop"],
                "pg_ctl stop", cwd=layout.data, **as_account(account))


# -- roles and the database --------------------------------------------------------------------------------


def connect(host: str, port: int, password: str | None, dbname: str = "postgres"):
    """An autocommit connection as the superuser (the password goes to libpq in this process only)."""
    try:
        import psycopg  # MLflow's PostgreSQL driver
    except ImportError:
        raise ServerError("MLflow's PostgreSQL driver psycopg is missing: pip install 'rlhf-lab[cluster]'") from None
    try:
        return psycopg.connect(host=host, port=port, user=DB_USER, password=password, dbname=dbname,
                               autocommit=True)
    except psycopg.OperationalError as err:
        last = str(err).strip().splitlines()[-1:] or ["?"]
        raise ServerError(f"cannot connect to PostgreSQL as {DB_USER} ({last[0]}): if "
                          f"secrets/postgres_superuser was changed or lost, restore it") from None


def set_password(conn, role: str, password: str, rights: str = "") -> None:
    """``ALTER ROLE role [rights] PASSWORD <SCRAM verifier>`` (the verifier computed here, not the password sent)."""
    from psycopg import sql

    verifier = conn.pgconn.encrypt_password(password.encode(), role.encode(), b"scram-sha-256").decode()
    conn.execute(sql.SQL("ALTER ROLE {} " + rights + " PASSWORD {}").format(sql.Identifier(role),
                                                                            sql.Literal(verifier)))


def prepare_database(conn, role_password: str) -> None:
    """MLflow's role (created, or its rights and password reset to :data:`ROLE_RIGHTS` and ``role_password``) and
    the database ``mlflow`` owned by it; ``conn``: the superuser's, to the database ``postgres``."""
    from psycopg import sql

    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (MLFLOW_ROLE,)).fetchone() is None:
        conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(MLFLOW_ROLE)))
    set_password(conn, MLFLOW_ROLE, role_password, ROLE_RIGHTS)
    db, role = sql.Identifier(DB_NAME), sql.Identifier(MLFLOW_ROLE)
    if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,)).fetchone() is None:
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(db, role))
    else:
        conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(db, role))


# tables (with their indexes and sequences), views and types of the schema public: to MLflow's role
HAND_OVER = f"""DO $$ DECLARE r record; BEGIN
  FOR r IN SELECT c.oid::regclass::text AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v') LOOP
    EXECUTE format('ALTER TABLE %s OWNER TO {MLFLOW_ROLE}', r.name);
  END LOOP;
  FOR r IN SELECT c.oid::regclass::text AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'public' AND c.relkind = 'S' AND NOT EXISTS (SELECT 1 FROM pg_depend d
             WHERE d.objid = c.oid AND d.deptype IN ('a', 'i')) LOOP
    EXECUTE format('ALTER SEQUENCE %s OWNER TO {MLFLOW_ROLE}', r.name);
  END LOOP;
  FOR r IN SELECT t.oid::regtype::text AS name FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
           WHERE n.nspname = 'public' AND t.typtype IN ('e', 'd') LOOP
    EXECUTE format('ALTER TYPE %s OWNER TO {MLFLOW_ROLE}', r.name);
  END LOOP;
END $$"""


def migrate_trust_cluster(layout: Layout, account: pwd.struct_passwd | None, port: int, superuser_password: str,
                          role_password: str) -> None:
    """Secure a cluster an older rlhf-lab-server made with ``--auth=trust``: started on a private Unix socket only,
    it gets the superuser's password, MLflow's role and database (:func:`prepare_database`), the database's tables
    handed to that role (they were the superuser's), then :func:`write_hba`; stopped again."""
    sock = Path(tempfile.mkdtemp(prefix="rlhf-lab-pg-"))  # short: a socket's path has at most 107 characters
    give_to(sock, account)
    start_postgres(layout, account, port, socket_dir=str(sock))
    try:
        with connect(str(sock), port, None) as conn:
            set_password(conn, DB_USER, superuser_password)
            prepare_database(conn, role_password)
        with connect(str(sock), port, None, dbname=DB_NAME) as conn:
            conn.execute(HAND_OVER)
        write_hba(layout, account)
    finally:
        stop_postgres(layout, account)
        shutil.rmtree(sock, ignore_errors=True)
