"""The team server against a hostile local user (issue 41, items 1 and 2): PostgreSQL asks a password and MLflow's
role has no superuser rights; MLflow asks a login and keeps users' experiments apart; no secret in a command line,
a log or the commands' output; rlhf-lab's jobs log in with MLflow's variables and fail in one line without them.

The quick tests use no server (a fake HTTP server that wants a login, the secret files, the command lines); the slow
ones share one `rlhf-lab-server start` (module fixture), and one test migrates a passwordless cluster of the old
server (skipped, saying why, without PostgreSQL's binaries)."""

from __future__ import annotations

import base64
import os
import http.server
import shutil
import tempfile
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlhf_lab.entry import server
from rlhf_lab.server import auth as server_auth, files as server_files, passwords as server_passwords
from rlhf_lab.server import guard as server_guard, postgres as server_postgres
from rlhf_lab.runs.tracking_server import tracking_server_problem
from tests.test_sweeps import MICRO
from tests.test_team_scale import login, run_cmd, start_team_server

# -- no server ------------------------------------------------------------------------------------------


class NeedsLogin(http.server.BaseHTTPRequestHandler):
    """MLflow's basic auth in miniature: /health open, every other path 401 unless ann's password comes."""

    GOOD = "Basic " + base64.b64encode(b"ann:s3cret").decode()

    def do_GET(self):
        ok = self.path.startswith("/health") or self.headers.get("Authorization") == self.GOOD
        self.send_response(200 if ok else 401)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def test_a_job_without_a_login_for_a_server_that_asks_one_is_told_which_variables_to_set(tmp_path, monkeypatch):
    """The start-up probe (runtime.exit_on_unreachable_server) found only /health, which MLflow leaves open: a job
    without credentials then died in a traceback of its first request (HTTP 401)."""
    for key in server_auth.LOGIN_VARS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.mlflow/credentials
    httpd = http.server.HTTPServer(("127.0.0.1", 0), NeedsLogin)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_port}"
    try:
        problem = tracking_server_problem(url, timeout=5)
        assert problem == (f"the MLflow tracking server at {url} asks for a login and this process has none: set "
                           "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or put them in "
                           "~/.mlflow/credentials); the server's admin creates a login with: rlhf-lab-server user add "
                           "NAME --dir <the server's folder>")
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "ann")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong")
        assert tracking_server_problem(url, timeout=5).startswith(
            f"the MLflow tracking server at {url} refused the login of ann (wrong password or no such user): set ")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cret")
        assert tracking_server_problem(url, timeout=5) is None
        monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
        (tmp_path / ".mlflow").mkdir()  # the file user add writes, installed as MLflow reads it
        (tmp_path / ".mlflow" / "credentials").write_text(server_auth.credentials_text(url, "ann", "s3cret"))
        assert tracking_server_problem(url, timeout=5) is None
    finally:
        httpd.shutdown()


def test_secrets_are_private_files_and_the_command_lines_hold_none(tmp_path):
    layout = server_files.Layout(tmp_path / "team")
    secret = server_files.ensure_secret(layout.admin_secret)
    assert len(secret) >= 40 and server_files.ensure_secret(layout.admin_secret) == secret  # generated once
    assert layout.admin_secret.stat().st_mode & 0o777 == 0o600 and layout.secrets.stat().st_mode & 0o777 == 0o700
    layout.admin_secret.chmod(0o644)
    with pytest.raises(server.ServerError, match=f"the secret file {layout.admin_secret} is readable by other users "
                                                 r"\(mode 0o644\): chmod 600"):
        server_files.read_secret(layout.admin_secret)
    layout.admin_secret.chmod(0o600)
    with pytest.raises(server.ServerError, match=f"the secret file {layout.flask_secret} is missing: restore it"):
        server_files.read_secret(layout.flask_secret)

    cmd = server.mlflow_command(5433, layout, "127.0.0.1", 5000, 2)
    assert cmd[-2:] == ["--app-name", server_guard.APP_NAME] and "--app-name" not in server.mlflow_command(
        5433, layout, "127.0.0.1", 5000, 2, auth=False)
    env = server.mlflow_env(layout, "pw:with\\odd", auth=True)
    assert env["PGPASSFILE"] == str(layout.pgpass) and env["MLFLOW_AUTH_ADMIN_PASSWORD"] == secret
    assert layout.pgpass.read_text() == "127.0.0.1:*:mlflow:mlflow_server:pw\\:with\\\\odd\n"
    assert layout.pgpass.stat().st_mode & 0o777 == 0o600 and layout.auth_db.stat().st_mode & 0o777 == 0o600
    secrets = [secret, "pw:with\\odd", env["MLFLOW_FLASK_SERVER_SECRET_KEY"]]
    assert not any(s in " ".join(cmd) or s in layout.auth_config.read_text() for s in secrets)
    assert "default_permission = READ" in layout.auth_config.read_text()
    assert "mlflow_tracking_password = 50%%" in server_auth.credentials_text("http://x", "ann", "50%")  # configparser


def test_user_add_needs_a_running_server_with_logins(tmp_path, capsys):
    assert server.main(["user", "add", "ann", "--dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip() == (f"rlhf-lab-server: no server runs in {tmp_path}: rlhf-lab-server start "
                                               f"--dir {tmp_path} first")
    with pytest.raises(server.ServerError, match="user name 'a b': use letters"):
        server_auth.add_user(server_files.Layout(tmp_path), "http://127.0.0.1:1", "a b", "pw")
    (tmp_path / "pw").write_text(" padded\n")
    (tmp_path / "pw").chmod(0o600)
    with pytest.raises(server.ServerError, match="must hold the password on its first line, without spaces"):
        server_passwords.read_password_file(tmp_path / "pw")


def test_start_without_the_servers_mlflow_app_installed_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    """The app rlhf-lab is an entry point (group mlflow.app) that `pip install` writes: an install older than it
    would have had `mlflow server --app-name rlhf-lab` fail in its log, after PostgreSQL started."""
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [])
    assert server.main(["start", "--dir", str(tmp_path / "team"), "--port", str(server.free_port())]) == 1
    assert capsys.readouterr().err.strip() == (
        "rlhf-lab-server: MLflow does not know the app rlhf-lab (the entry point in rlhf-lab's pyproject.toml, group "
        "mlflow.app): install rlhf-lab again (pip install -e . in its checkout, or pip install rlhf-lab)")
    assert not (tmp_path / "team").exists()


# -- a server ---------------------------------------------------------------------------------------------


def pg_binaries_or_skip() -> None:
    try:
        for name in ("initdb", "pg_ctl"):
            server.find_pg_binary(name)
    except server.ServerError as err:
        pytest.skip(str(err))


@dataclass
class Team:
    url: str
    layout: server_files.Layout
    users: dict[str, Path]  # credentials files
    output: str  # everything the start and user-add commands printed

    def secrets(self) -> list[str]:
        return [*(p.read_text().strip() for p in self.layout.secrets.iterdir() if p.name in SECRET_FILES),
                *(server_auth.read_credentials(p)[1] for p in self.users.values())]


SECRET_FILES = ("postgres_superuser", "postgres_mlflow", "mlflow_admin", "flask_secret_key")


@pytest.fixture(scope="module")
def team():
    pg_binaries_or_skip()
    folder = Path(tempfile.mkdtemp(prefix="rlhf_lab_secure_"))  # under /tmp: the postgres user must reach it
    folder.chmod(0o755)
    url, users, done = start_team_server(folder)
    yield Team(url, server_files.Layout(folder / "team"), users, "".join(r.stdout + r.stderr for r in done))
    server.stop(folder / "team")
    shutil.rmtree(folder, ignore_errors=True)


def pg_connect(team: Team, user: str, password: str | None, dbname: str = "postgres"):
    import psycopg

    port = server_files.read_state(team.layout)["pg_port"]
    return psycopg.connect(host="127.0.0.1", port=port, user=user, password=password, dbname=dbname,
                           autocommit=True, connect_timeout=10)


@pytest.mark.slow
def test_postgres_refuses_connections_without_the_secret(team):
    import psycopg

    for user, password, why in (("rlhf_lab", None, "no password supplied"),
                                ("rlhf_lab", "guess", "password authentication failed"),
                                ("postgres", None, "no pg_hba.conf entry"),
                                ("mlflow_server", None, "no password supplied")):
        with pytest.raises(psycopg.OperationalError, match=why):
            pg_connect(team, user, password, "mlflow")
    role_password = team.layout.role_secret.read_text().strip()
    with pytest.raises(psycopg.OperationalError, match="no pg_hba.conf entry"):  # its own database only
        pg_connect(team, "mlflow_server", role_password, "postgres")


@pytest.mark.slow
def test_mlflows_role_cannot_run_programs_as_the_database_account(team, tmp_path):
    import psycopg

    role_password = team.layout.role_secret.read_text().strip()
    with pg_connect(team, "mlflow_server", role_password, "mlflow") as conn:
        assert conn.execute("SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = "
                            "current_user").fetchone() == (False, False, False)
        assert conn.execute("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'mlflow'").fetchone() \
            == ("mlflow_server",)
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="must be superuser or have privileges of "
                                                                       "the pg_execute_server_program role"):
            conn.execute(f"COPY (SELECT 1) TO PROGRAM 'id > {tmp_path / 'pwned'}'")
    assert not (tmp_path / "pwned").exists()


@pytest.mark.slow
def test_no_secret_in_any_command_line_log_or_output(team):
    secrets = team.secrets()
    assert len(secrets) == len(SECRET_FILES) + 2 and all(len(s) >= 32 for s in secrets)
    cmdlines = [p.read_bytes().replace(b"\0", b" ").decode(errors="replace")
                for p in Path("/proc").glob("[0-9]*/cmdline") if p.exists()]
    mlflow_cmd = [c for c in cmdlines if "mlflow server" in c and str(team.layout.artifacts) in c]
    assert mlflow_cmd and "--app-name rlhf-lab" in mlflow_cmd[0]  # the server runs, with logins and the guard
    texts = {"command lines": " ".join(cmdlines), "MLflow's log": team.layout.mlflow_log.read_text(),
             "PostgreSQL's log": team.layout.pg_log.read_text(), "server.json": team.layout.state.read_text(),
             "the commands' output": team.output}
    for where, text in texts.items():
        assert not [s for s in secrets if s in text], f"a secret in {where}"
    files = [*team.layout.secrets.iterdir(), *team.layout.users.iterdir()]
    assert {p.stat().st_mode & 0o777 for p in files} == {0o600}
    # issue 65: the logs (MLflow's access log names users and experiments) and server.json are the server user's only
    logs = (team.layout.mlflow_log, team.layout.pg_log, team.layout.state)
    assert {p: p.stat().st_mode & 0o777 for p in logs} == {p: 0o600 for p in logs}
    assert {(d.stat().st_mode & 0o777) for d in (team.layout.secrets, team.layout.users, team.layout.artifacts)} \
        == {0o700}  # artifacts go through the server, not the disk


def as_user(team: Team, name: str):
    """MLflow's clients in this process log in as `name` (its credentials file)."""
    return server_auth.mlflow_login(*server_auth.read_credentials(team.users[name]))


@pytest.mark.slow
def test_mlflow_refuses_a_client_without_a_login(team, monkeypatch):
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    for key in server_auth.LOGIN_VARS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", "/nonexistent")  # no ~/.mlflow/credentials
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{team.url}/api/2.0/mlflow/experiments/search?max_results=1", timeout=10)
    assert refused.value.code == 401
    with pytest.raises(MlflowException, match="401"):
        MlflowClient(team.url).search_experiments()
    with server_auth.mlflow_login("ann", "not her password"), pytest.raises(MlflowException, match="401"):
        MlflowClient(team.url).search_experiments()


@pytest.mark.slow
def test_a_user_cannot_delete_anothers_experiment_but_their_own(team):
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(team.url)
    with as_user(team, "ann"):
        exp = client.create_experiment("ann_only")
    with as_user(team, "bob"):
        assert client.get_experiment(exp).name == "ann_only"  # others read
        for act in (lambda: client.delete_experiment(exp), lambda: client.create_run(exp)):
            with pytest.raises(MlflowException, match="Permission denied") as denied:
                act()
            assert denied.value.get_http_status_code() == 403
        shared = client.get_experiment_by_name(server_auth.SHARED_EXPERIMENT)
        client.set_terminated(client.create_run(shared.experiment_id).info.run_id)  # the shared one: EDIT
        with pytest.raises(MlflowException, match="Permission denied"):  # only the admin deletes it
            client.delete_experiment(shared.experiment_id)
    with as_user(team, "ann"):
        client.delete_experiment(exp)
        assert client.get_experiment(exp).lifecycle_stage == "deleted"


@pytest.mark.slow
def test_a_job_logs_with_the_login_in_its_environment_and_without_one_fails_in_one_line(team, tmp_path):
    job = ["-m", "rlhf_lab.entry.run", "algo=sft", *MICRO, "trainer.threads=1", "study=secure_job"]
    anonymous = {key: "" for key in server_auth.LOGIN_VARS}  # MLflow reads an empty variable as unset
    r = run_cmd(job, tmp_path, MLFLOW_TRACKING_URI=team.url, HOME=str(tmp_path), **anonymous)
    assert r.returncode == 2 and r.stderr.strip() == (
        f"rlhf-lab: the MLflow tracking server at {team.url} asks for a login and this process has none: set "
        "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or put them in ~/.mlflow/credentials); the server's "
        "admin creates a login with: rlhf-lab-server user add NAME --dir <the server's folder>"), r.stderr[-3000:]
    r = run_cmd(job, tmp_path, MLFLOW_TRACKING_URI=team.url, **login(team.users["bob"]))
    assert r.returncode == 0, r.stderr[-3000:]
    from mlflow import MlflowClient

    with as_user(team, "ann"):  # and ann reads bob's runs
        client = MlflowClient(team.url)
        exp = client.get_experiment_by_name(server_auth.SHARED_EXPERIMENT)
        runs = client.search_runs([exp.experiment_id], "tags.`rlhf_lab.study` = 'secure_job'")
    assert {x.data.tags["rlhf_lab.stage"] for x in runs} == {"pretrain", "sft"}
    assert {x.info.status for x in runs} == {"FINISHED"}


# -- issue 65: each user changes only their own runs; logins limited; users listed by the admin only ------------


def as_admin(team: Team):
    return server_auth.mlflow_login(server_auth.ADMIN, team.layout.admin_secret.read_text().strip())


def http_as(url: str, user: str, password: str):
    """(status, headers (case-insensitive), body) of a GET of `url` with a basic-auth login."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


@pytest.mark.slow
def test_a_user_changes_only_the_runs_they_created_and_the_admin_any(team, tmp_path):
    """Old code (EDIT on the shared experiment for every user): bob logged `test/gold_reward=99` into ann's run, set
    it FAILED, deleted its tags and overwrote its config.yaml, all answered 200."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param
    from mlflow.exceptions import MlflowException

    client = MlflowClient(team.url)
    with as_user(team, "ann"):
        shared = client.get_experiment_by_name(server_auth.SHARED_EXPERIMENT).experiment_id
        run = client.create_run(shared, tags={"mlflow.user": "bob", "keep": "yes"})  # a forged author is replaced
        rid = run.info.run_id
        assert (run.info.user_id, run.data.tags["mlflow.user"]) == ("ann", "ann")
        client.log_metric(rid, "test/gold_reward", 0.5)
        client.log_text(rid, "ann's config", "config.yaml")  # through the artifact proxy (MLflow's FastAPI route)
    attacks = {"log a metric": lambda: client.log_metric(rid, "test/gold_reward", 99.0),
               "log a batch": lambda: client.log_batch(rid, metrics=[Metric("test/gold_reward", 99.0, 0, 1)]),
               "log a param": lambda: client.log_batch(rid, params=[Param("forged", "1")]),
               "set a tag": lambda: client.set_tag(rid, "keep", "no"),
               "delete a tag": lambda: client.delete_tag(rid, "keep"),
               "set its status": lambda: client.set_terminated(rid, "FAILED"),
               "rename it": lambda: client.update_run(rid, name="bob's now"),
               "overwrite an artifact": lambda: client.log_text(rid, "bob's config", "config.yaml"),
               "delete it": lambda: client.delete_run(rid)}
    with as_user(team, "bob"):
        for what, act in attacks.items():
            with pytest.raises(Exception, match="403|Permission denied"):
                act()
        own = client.create_run(shared).info.run_id  # his own run: everything
        client.log_metric(own, "test/gold_reward", 0.1)
        client.set_tag(own, "keep", "his")
        client.delete_tag(own, "keep")
        client.log_text(own, "bob's config", "config.yaml")
        client.update_run(own, name="bob's run")
        client.set_terminated(own, "FINISHED")
        with pytest.raises(MlflowException, match="Permission denied"):  # a run's author is not his to change
            client.set_tag(own, "mlflow.user", "ann")
    with as_user(team, "ann"):
        after = client.get_run(rid)
        assert after.info.status == "RUNNING" and after.info.run_name == run.info.run_name
        assert after.data.tags["keep"] == "yes" and "forged" not in after.data.params
        assert [m.value for m in client.get_metric_history(rid, "test/gold_reward")] == [0.5]
        assert Path(client.download_artifacts(rid, "config.yaml", str(tmp_path))).read_text() == "ann's config"
        assert client.get_run(own).info.user_id == "bob"
    with as_admin(team):  # the admin may change any run
        client.set_tag(rid, "checked_by", "admin")
        client.set_terminated(rid, "FINISHED")
    with as_user(team, "ann"):
        assert client.get_run(rid).data.tags["checked_by"] == "admin"


@pytest.mark.slow
def test_only_the_admin_renames_or_retags_the_shared_experiment(team):
    """Old code: bob renamed `rlhf-lab` (200) and created his own under the name; ann's next job failed."""
    from mlflow import MlflowClient

    client = MlflowClient(team.url)
    with as_user(team, "bob"):
        shared = client.get_experiment_by_name(server_auth.SHARED_EXPERIMENT).experiment_id
        for act in (lambda: client.rename_experiment(shared, "bobs_now"),
                    lambda: client.set_experiment_tag(shared, "mlflow.note.content", "bob's")):
            with pytest.raises(Exception, match="Permission denied"):
                act()
        mine = client.create_experiment("bob_renames_his_own")
        client.rename_experiment(mine, "bob_renamed_his_own")  # he manages what he creates
    with as_admin(team):
        client.set_experiment_tag(shared, "rlhf_lab.checked", "admin")
    with as_user(team, "ann"):
        assert client.get_experiment(shared).name == server_auth.SHARED_EXPERIMENT
        assert client.get_experiment(shared).tags["rlhf_lab.checked"] == "admin"
        assert client.get_experiment(mine).name == "bob_renamed_his_own"


@pytest.mark.slow
def test_only_the_admin_lists_the_users(team):
    """Old code: any logged-in user listed every user (200)."""
    from mlflow.server.auth import routes

    for path in (routes.LIST_USERS, routes.AJAX_LIST_USERS):
        status, _, _ = http_as(team.url + path, *server_auth.read_credentials(team.users["bob"]))
        assert status == 403
    status, _, body = http_as(team.url + routes.LIST_USERS, server_auth.ADMIN,
                              team.layout.admin_secret.read_text().strip())
    assert status == 200 and b'"bob"' in body


@pytest.mark.slow
def test_a_job_that_may_not_create_its_run_says_why_in_one_line(team, tmp_path):
    """Old code: a job of ann's in an experiment she only reads died in a traceback of HTTP 403."""
    from mlflow import MlflowClient

    with as_user(team, "bob"):
        MlflowClient(team.url).create_experiment("bob_private")
    job = ["-m", "rlhf_lab.entry.run", "algo=sft", *MICRO, "trainer.threads=1", "tracking.experiment=bob_private"]
    r = run_cmd(job, tmp_path, MLFLOW_TRACKING_URI=team.url, **login(team.users["ann"]))
    assert r.returncode == 2 and r.stderr.strip() == (
        f"rlhf-lab: config error: tracking.experiment must be an experiment in which ann may create runs (the MLflow "
        f"server at {team.url} refused: permission denied): use one of yours (tracking.experiment=<a new name> "
        "creates it) or ask its owner or the server's admin for EDIT on it, got 'bob_private'"), r.stderr[-3000:]


@pytest.mark.slow
def test_repeated_wrong_logins_are_answered_429_and_a_logged_in_user_goes_on(team):
    """Old code: every wrong password was checked (4.3 guesses/s, a logged-in user's requests 15 times slower).
    Last of the module's server tests: it holds back new logins from 127.0.0.1 for the window."""
    from rlhf_lab.server import logins

    url = f"{team.url}/api/2.0/mlflow/experiments/search?max_results=1"
    ann = server_auth.read_credentials(team.users["ann"])
    assert http_as(url, *ann)[0] == 200  # ann logged in
    name = f"guess{os.getpid()}"
    assert [http_as(url, name, "wrong")[0] for _ in range(logins.MAX_USER_FAILURES)] == \
        [401] * logins.MAX_USER_FAILURES
    status, headers, body = http_as(url, name, "wrong")
    assert status == 429 and 0 < int(headers["Retry-After"]) <= logins.WINDOW_S and b"Too many failed" in body
    for i in range(logins.MAX_ADDRESS_FAILURES):  # other names from the same address, up to its limit
        http_as(url, f"{name}-{i}", "wrong")
    assert http_as(url, f"{name}-new", "wrong")[0] == 429  # the address waits: no password checked
    assert http_as(url, *ann)[0] == 200  # a login the server verified before goes on


# -- a cluster of the old server ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_passwordless_cluster_of_the_old_server_is_migrated_with_its_data():
    """An older rlhf-lab-server made its cluster with `initdb --auth=trust` and MLflow's tables as the superuser;
    the next start (server.secure_cluster) sets passwords, hands the database and its objects to MLflow's role and
    rewrites pg_hba.conf."""
    import psycopg

    pg_binaries_or_skip()
    base = Path(tempfile.mkdtemp(prefix="rlhf_lab_migrate_"))
    base.chmod(0o755)
    layout, account = server_files.Layout(base / "team"), server_postgres.pg_account()
    layout.root.mkdir(mode=0o755)
    layout.data.mkdir(mode=0o700)
    server_postgres.give_to(layout.data, account)
    server_postgres.run_checked([server.find_pg_binary("initdb"), "-D", layout.data, "-U", "rlhf_lab", "--auth=trust",
                                 "-E", "UTF8", "--locale=C"], "initdb", cwd=layout.data,
                                **server_postgres.as_account(account))  # the old server's command
    port = server.free_port()
    try:
        server_postgres.start_postgres(layout, account, port)
        with psycopg.connect(host="127.0.0.1", port=port, user="rlhf_lab", dbname="postgres", autocommit=True) as c:
            c.execute("CREATE DATABASE mlflow")
        with psycopg.connect(host="127.0.0.1", port=port, user="rlhf_lab", dbname="mlflow", autocommit=True) as c:
            c.execute("CREATE TYPE stage AS ENUM ('a', 'b'); CREATE TABLE runs (id serial PRIMARY KEY, s stage); "
                      "INSERT INTO runs (s) VALUES ('a'); CREATE VIEW last AS SELECT max(id) FROM runs")
        server_postgres.stop_postgres(layout, account)
        assert server_postgres.uses_trust(layout)

        superuser, role = server.secure_cluster(layout, account)
        assert not server_postgres.uses_trust(layout) and not server_postgres.postgres_running(layout, account)
        server_postgres.start_postgres(layout, account, port)
        with pytest.raises(psycopg.OperationalError, match="no password supplied"):
            psycopg.connect(host="127.0.0.1", port=port, user="rlhf_lab", dbname="postgres")
        with psycopg.connect(host="127.0.0.1", port=port, user="mlflow_server", password=role, dbname="mlflow",
                             autocommit=True) as c:
            c.execute("INSERT INTO runs (s) VALUES ('b')")  # its tables, sequences and types now
            c.execute("ALTER TYPE stage ADD VALUE 'c'")
            assert c.execute("SELECT * FROM last").fetchone() == (2,)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute("COPY (SELECT 1) TO PROGRAM 'true'")
        with psycopg.connect(host="127.0.0.1", port=port, user="rlhf_lab", password=superuser, dbname="postgres"):
            pass
    finally:
        if server_postgres.postgres_running(layout, account):
            server_postgres.stop_postgres(layout, account)
        shutil.rmtree(base, ignore_errors=True)
