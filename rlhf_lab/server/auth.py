"""MLflow's users on the team server (:mod:`rlhf_lab.entry.server`): MLflow's own basic auth (``mlflow.server.auth``),
configured here, with the run-level checks of :mod:`rlhf_lab.server.guard` and the login limits of
:mod:`rlhf_lab.server.logins`.

- its configuration ``secrets/basic_auth.ini`` (:func:`write_auth_config`): the user store ``secrets/basic_auth.db``,
  the admin ``admin``, ``default_permission = READ`` (a user reads what others made and changes none of it), and a
  60-second cache of verified logins (each check of a password hash costs about 0.1 s of the server's CPU: a
  password change or a deleted user may still work on another worker for 60 s);
- the admin's password and MLflow's CSRF key reach the server through its environment only (:func:`auth_env`);
- the shared experiment :data:`SHARED_EXPERIMENT` is the admin's, who alone may rename or delete it; :func:`add_user`
  grants every user EDIT on it, which MLflow asks for creating runs there (the guard keeps each run its author's);
- clients log in the MLflow way: ``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD``, or
  ``~/.mlflow/credentials`` (the format of the file :func:`add_user` writes).
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from pathlib import Path
from typing import Iterator

from rlhf_lab.runs.process import environment, write_atomic
from rlhf_lab.server.files import Layout, ServerError, ensure_secret, private_folder, read_secret

ADMIN = "admin"
SHARED_EXPERIMENT = "rlhf-lab"  # conf/config.yaml: tracking.experiment
DEFAULT_PERMISSION = "READ"
SHARED_PERMISSION = "EDIT"  # create runs in the shared experiment; the guard keeps each run its author's
LOGIN_CACHE_S = 60
USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
LOGIN_VARS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_AUTH")


def write_auth_config(layout: Layout) -> None:
    """MLflow's basic-auth configuration (no secret in it: the admin's password goes through the environment); its
    user store created empty with mode 0600 (sqlite would make it 0644)."""
    if not layout.auth_db.exists():
        os.close(os.open(layout.auth_db, os.O_WRONLY | os.O_CREAT, 0o600))
    write_atomic(layout.auth_config, f"""[mlflow]
default_permission = {DEFAULT_PERMISSION}
database_uri = sqlite:///{layout.auth_db}
admin_username = {ADMIN}
authorization_function = rlhf_lab.server.logins:authenticate
auth_cache_ttl_seconds = {LOGIN_CACHE_S}
""")


def auth_env(layout: Layout) -> dict[str, str]:
    """The environment variables that turn MLflow's basic auth on in the server's process (secrets generated the
    first time)."""
    write_auth_config(layout)
    return {"MLFLOW_AUTH_CONFIG_PATH": str(layout.auth_config),
            "MLFLOW_AUTH_ADMIN_PASSWORD": ensure_secret(layout.admin_secret),
            "MLFLOW_FLASK_SERVER_SECRET_KEY": ensure_secret(layout.flask_secret)}


@contextlib.contextmanager
def mlflow_login(username: str, password: str) -> Iterator[None]:
    """MLflow's clients in this process log in as ``username`` (its environment variables, restored after)."""
    with environment({**{k: None for k in LOGIN_VARS}, "MLFLOW_TRACKING_USERNAME": username,
                      "MLFLOW_TRACKING_PASSWORD": password}):
        yield


def admin_call(layout: Layout, what: str, call):
    """``call()`` logged in as the admin; MLflow's refusals as a one-line ServerError naming ``what``."""
    from mlflow.exceptions import MlflowException

    with mlflow_login(ADMIN, read_secret(layout.admin_secret)):
        try:
            return call()
        except MlflowException as err:
            first = str(err.message).strip().splitlines()[:1] or ["?"]
            if "401" in first[0] or err.error_code == "UNAUTHENTICATED":
                raise ServerError(f"{what}: the server refused the admin's password ({layout.admin_secret} does "
                                  f"not match the user store {layout.auth_db})") from None
            raise ServerError(f"{what}: {first[0]}") from None


def ensure_shared_experiment(layout: Layout, url: str) -> str:
    """The id of :data:`SHARED_EXPERIMENT`, created by the admin (tagged as rlhf-lab's jobs tag it) if missing."""
    from rlhf_lab.runs.tracking import experiment_id

    return admin_call(layout, f"creating the shared experiment {SHARED_EXPERIMENT}",
                      lambda: experiment_id(url, SHARED_EXPERIMENT))


def credentials_text(url: str, name: str, password: str) -> str:
    """A ``~/.mlflow/credentials`` file (MLflow's format, read with configparser: ``%`` doubled)."""
    return (f"# MLflow login to {url} (MLFLOW_TRACKING_URI={url}); install as ~/.mlflow/credentials, mode 600\n"
            f"[mlflow]\nmlflow_tracking_username = {name}\nmlflow_tracking_password = {password.replace('%', '%%')}\n")


def read_credentials(path: Path) -> tuple[str, str]:
    """(user name, password) of a credentials file written by :func:`add_user`."""
    import configparser

    parser = configparser.ConfigParser()
    parser.read(path)
    return parser["mlflow"]["mlflow_tracking_username"], parser["mlflow"]["mlflow_tracking_password"]


def add_user(layout: Layout, url: str, name: str, password: str) -> Path:
    """Create MLflow user ``name`` on the server at ``url`` (as the admin), grant it :data:`SHARED_PERMISSION` on
    the shared experiment, and write its credentials file (0600) in ``<dir>/users``; return that file."""
    if not USER_NAME.fullmatch(name):
        raise ServerError(f"user name {name!r}: use letters, digits and . _ @ - (at most 64, starting with a letter "
                          f"or digit)")
    with warnings.catch_warnings():  # importing mlflow.server warns of Starlette's deprecations: not the user's
        warnings.simplefilter("ignore")
        from mlflow.server.auth.client import AuthServiceClient

    exp_id = ensure_shared_experiment(layout, url)
    client = AuthServiceClient(url)

    def create() -> bool:
        from mlflow.exceptions import MlflowException

        try:
            client.create_user(name, password)
        except MlflowException as err:
            if err.error_code == "RESOURCE_ALREADY_EXISTS":
                return False
            raise
        return True

    if not admin_call(layout, f"creating the user {name}", create):
        raise ServerError(f"the MLflow user {name} exists already: pick another name, or change its password in "
                          f"MLflow's UI ({url}, as admin) or with AuthServiceClient.update_user_password")
    admin_call(layout, f"granting {name} {SHARED_PERMISSION} on {SHARED_EXPERIMENT}",
               lambda: client.grant_user_permission(name, "experiment", exp_id, SHARED_PERMISSION))
    path = private_folder(layout.users) / f"{name}.credentials"
    write_atomic(path, credentials_text(url, name, password))
    return path
