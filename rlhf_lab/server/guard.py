"""The team server's MLflow app ``rlhf-lab`` (``mlflow server --app-name rlhf-lab``, entry point group ``mlflow.app``):
MLflow's basic auth (logins, experiment permissions, :mod:`rlhf_lab.server.logins`' limits) with run-level checks.

MLflow's permissions stop at the experiment: whoever may edit the shared experiment (every user: they create runs in
it) may also rename it and change every run in it. :func:`create_app` adds, after MLflow's own checks (so it only
ever refuses more), for every user but the admin:

- a run is created under the login's name: the server writes the login as the run's ``user_id`` and ``mlflow.user``
  tag, so a run's author is the user who created it (:mod:`rlhf_lab.runs.authors`);
- a request that changes a run (any of :data:`RUN_WRITES`, its artifacts through the server's proxy, the UI's upload)
  is refused (403) unless the run's author is the login; nobody but the admin sets or deletes ``mlflow.user``;
- renaming an experiment or changing its tags, and writing artifacts of an experiment outside its runs, needs
  MANAGE on it (its creator holds it; the admin owns the shared one);
- listing users is the admin's.

MLflow (3.x) serves artifact uploads (PUT) through a FastAPI route outside Flask's request hooks: :class:`UploadGuard`,
around the whole ASGI app, checks those with the same rule and hands the client's address to the login limits.
"""

from __future__ import annotations

import functools
import os
import re

from rlhf_lab.runs.authors import AUTHOR_TAG
from rlhf_lab.server.logins import CLIENT_ADDRESS

APP_NAME = "rlhf-lab"  # pyproject.toml: [project.entry-points."mlflow.app"]
RUN_ID = re.compile(r"[0-9a-f]{32}")
EXPERIMENT_PATH = re.compile(r"^(?:workspaces/[^/]+/)?(\d+)(?:/([^/]+))?")  # MLflow's artifact proxy paths
ARTIFACT_PREFIXES = ("/api/2.0/mlflow-artifacts/", "/ajax-api/2.0/mlflow-artifacts/")
ARTIFACT_WRITES = {"PUT": "artifacts/", "DELETE": "artifacts/", "POST": "mpu/"}  # method -> the routes that write
RUN_CREATES = ("CreateRun",)
RUN_WRITES = ("UpdateRun", "DeleteRun", "RestoreRun", "LogMetric", "LogParam", "SetTag", "DeleteTag", "LogBatch",
              "LogModel", "LogInputs", "LogOutputs", "LinkTracesToRun", "CreatePresignedUploadUrl")
EXPERIMENT_WRITES = ("UpdateExperiment", "SetExperimentTag", "DeleteExperimentTag")


def route_kinds() -> dict[tuple[str, str], str]:
    """(path, method) -> ``create``, ``run``, ``upload``, ``experiment`` or ``admin``: the requests the guard judges
    (both REST and the UI's ``ajax-api`` paths, from MLflow's own route table)."""
    from mlflow.server.auth import routes
    from mlflow.server.handlers import get_endpoints

    kinds = {**dict.fromkeys(RUN_CREATES, "create"), **dict.fromkeys(RUN_WRITES, "run"),
             **dict.fromkeys(EXPERIMENT_WRITES, "experiment")}
    out = {(path, method): kind for path, kind, methods in get_endpoints(lambda cls: kinds.get(cls.__name__))
           if kind in ("create", "run", "experiment") for method in methods}
    out[(routes.CREATE_PROMPTLAB_RUN, "POST")] = "create"
    out[(routes.UPLOAD_ARTIFACT, "POST")] = "upload"  # the UI's upload: the run in the query string, a file as body
    for path in (routes.LIST_USERS, routes.AJAX_LIST_USERS, routes.LIST_ROLE_USERS, routes.AJAX_LIST_ROLE_USERS):
        out[(path, "GET")] = "admin"
    return out


@functools.cache
def backend_client():
    """An MLflow client of the server's own backend store (the environment ``mlflow server`` gives its workers)."""
    from mlflow import MlflowClient
    from mlflow.server import BACKEND_STORE_URI_ENV_VAR

    return MlflowClient(tracking_uri=os.environ[BACKEND_STORE_URI_ENV_VAR])


@functools.lru_cache(maxsize=10_000)
def stored_owner(run_id: str) -> tuple[str, str]:
    """(author, experiment id) of run `run_id`, kept for the last 10,000 runs asked about (a run's ``user_id`` never
    changes); MLflow's exception, not kept, when the store has no such run."""
    info = backend_client().get_run(run_id).info
    return info.user_id, info.experiment_id


def run_owner(run_id: str) -> tuple[str, str] | None:
    """:func:`stored_owner`, or None when the store has no such run."""
    from mlflow.exceptions import MlflowException

    try:
        return stored_owner(run_id)
    except MlflowException:
        return None


def is_admin(user: str) -> bool:
    from mlflow.server.auth import store

    try:
        return bool(store.get_user(user).is_admin)
    except Exception:
        return False


def manages(user: str, experiment_id: str) -> bool:
    """Whether `user` holds MANAGE on the experiment (a grant of MLflow's basic auth)."""
    from mlflow.server.auth import store
    from mlflow.server.auth.permissions import get_permission

    try:
        return get_permission(store.get_experiment_permission(experiment_id, user).permission).can_manage
    except Exception:
        return False


def run_refusal(user: str, run_id: str | None, experiment_id: str | None = None) -> str | None:
    """Why `user` may not change run `run_id` (in the experiment `experiment_id`, when given), or None."""
    owner = run_owner(run_id) if run_id else None
    if owner is None:
        return f"no run {run_id!r} on this server"
    if experiment_id is not None and owner[1] != experiment_id:
        return f"run {run_id} is not in experiment {experiment_id}"
    if owner[0] != user:
        return f"run {run_id} was created by {owner[0] or 'an unknown user'}: only its author or the admin changes it"
    return None


def artifact_refusal(user: str, artifact_path: str) -> str | None:
    """Why `user` may not write `artifact_path` (a path of MLflow's artifact proxy: ``<experiment>/<run>/...``), or
    None: a run's artifacts are its author's, the rest of an experiment's its managers'."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.uri import validate_path_is_safe

    try:
        canonical = validate_path_is_safe(artifact_path).strip("/")
    except MlflowException:
        return f"artifact path {artifact_path!r} is not a safe path"
    match = EXPERIMENT_PATH.match(canonical)
    if match is None:
        return f"artifact path {artifact_path!r} names no experiment"
    experiment, first = match.groups()
    if first and RUN_ID.fullmatch(first):
        return run_refusal(user, first, experiment)
    if not manages(user, experiment):
        return f"the artifacts of experiment {experiment} outside its runs are its managers' (MANAGE)"
    return None


def request_values() -> dict:
    """The parameters of a request of MLflow's JSON API: its query string and its JSON body's top level."""
    from flask import request

    body = request.get_json(force=True, silent=True) if request.method != "GET" else None
    return {**request.args.to_dict(), **(body if isinstance(body, dict) else {})}


def stamp_author(user: str) -> str | None:
    """Make the run that this request creates the login's: its ``user_id`` and ``mlflow.user`` tag (the JSON body is
    changed in place). A refusal when the body is not a JSON object."""
    from flask import request

    body = request.get_json(force=True, silent=True)
    if not isinstance(body, dict):
        return "a run is created with a JSON object as the request's body"
    body["user_id"] = user
    body["tags"] = [t for t in body.get("tags") or [] if not (isinstance(t, dict) and t.get("key") == AUTHOR_TAG)]
    body["tags"].append({"key": AUTHOR_TAG, "value": user})
    return None


def touches_author_tag(values: dict) -> bool:
    """Whether a request sets or deletes a run's ``mlflow.user`` tag (SetTag, DeleteTag, LogBatch's tags)."""
    tags = values.get("tags") if isinstance(values.get("tags"), list) else []
    return values.get("key") == AUTHOR_TAG or any(isinstance(t, dict) and t.get("key") == AUTHOR_TAG for t in tags)


def refusal(user: str, kind: str) -> str | None:
    """Why the current Flask request of `user` (not the admin), of the guarded `kind`, is refused, or None."""
    from flask import request

    if kind == "admin":
        return "only the admin lists users"
    if kind == "create":
        return stamp_author(user)
    if kind in ("artifact", "upload"):  # a file as the body: not read here (the handler streams it)
        if kind == "upload":
            return run_refusal(user, request.args.get("run_uuid"))
        return artifact_refusal(user, (request.view_args or {}).get("artifact_path") or request.args.get("path", ""))
    values = request_values()
    if kind == "experiment":
        experiment = str(values.get("experiment_id") or "")
        return None if manages(user, experiment) else (
            f"experiment {experiment or '?'} is changed (renamed, tagged) only by its managers (MANAGE) or the admin")
    if touches_author_tag(values):
        return f"a run's {AUTHOR_TAG} tag is its author, set by the server"
    return run_refusal(user, values.get("run_id") or values.get("run_uuid"))


def forbidden(reason: str):
    from flask import Response

    return Response(f"Permission denied: {reason}\n", 403, {"Content-Type": "text/plain"})


def artifact_write(path: str, method: str) -> bool:
    """Whether `path` is a write to MLflow's artifact proxy (upload, delete, multipart upload)."""
    return method in ARTIFACT_WRITES and any(path.startswith(p + ARTIFACT_WRITES[method]) for p in ARTIFACT_PREFIXES)


def flask_guard(kinds: dict[tuple[str, str], str]):
    """Flask's before-request hook, registered after MLflow's (which has checked the login and its permissions)."""

    def guard():
        from flask import g, request

        kind = kinds.get((request.path, request.method)) or (
            "artifact" if artifact_write(request.path, request.method) else None)
        user = getattr(g, "mlflow_authenticated_user", None)
        if kind is None or user is None or is_admin(user):
            return None
        reason = refusal(user, kind)
        return forbidden(reason) if reason else None

    return guard


class UploadGuard:
    """ASGI wrapper of MLflow's FastAPI app: records each request's client address for the login limits, and
    checks the artifact uploads that MLflow's FastAPI route serves (login first, then :func:`artifact_refusal`)."""

    def __init__(self, app, flask_app):
        self.app, self.flask_app = app, flask_app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        token = CLIENT_ADDRESS.set((scope.get("client") or ("",))[0] or None)
        try:
            if scope["method"] == "PUT" and artifact_write(scope["path"], "PUT"):
                from starlette.concurrency import run_in_threadpool

                answer = await run_in_threadpool(self.check_upload, scope)
                if answer is not None:
                    status, headers, body = answer
                    await send({"type": "http.response.start", "status": status, "headers": headers})
                    await send({"type": "http.response.body", "body": body})
                    return None
            return await self.app(scope, receive, send)
        finally:
            CLIENT_ADDRESS.reset(token)

    def check_upload(self, scope) -> tuple[int, list, bytes] | None:
        """(status, headers, body) refusing the upload `scope`, or None to let MLflow serve it."""
        from flask import Response
        from mlflow.server.auth import authenticate_request

        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        with self.flask_app.test_request_context(path=scope["path"], method="PUT", headers=headers):
            auth = authenticate_request()
            if isinstance(auth, Response):  # 401 or 429: answered here (counted once)
                answer = auth
            elif is_admin(auth.username):
                return None
            else:
                path = scope["path"].split("/mlflow-artifacts/artifacts/", 1)[1]
                reason = artifact_refusal(auth.username, path)
                if reason is None:
                    return None
                answer = forbidden(reason)
            return (answer.status_code, [(k.lower().encode("latin-1"), v.encode("latin-1"))
                                         for k, v in answer.headers.items()], answer.get_data())


def app_problem() -> str | None:
    """Why ``mlflow server --app-name rlhf-lab`` would not find this app (its entry point, written when rlhf-lab is
    installed), or None."""
    from importlib.metadata import entry_points

    if any(e.name == APP_NAME for e in entry_points(group="mlflow.app")):
        return None
    return (f"MLflow does not know the app {APP_NAME} (the entry point in rlhf-lab's pyproject.toml, group mlflow.app): "
            f"install rlhf-lab again (pip install -e . in its checkout, or pip install rlhf-lab)")


def create_app():
    """The ``mlflow.app`` factory: MLflow's basic-auth app with the checks above."""
    from mlflow.server import app as flask_app
    from mlflow.server.auth import create_app as basic_auth_app

    app = basic_auth_app(flask_app)
    flask_app.before_request(flask_guard(route_kinds()))  # after MLflow's hook: the login is checked first
    return app if app is flask_app else UploadGuard(app, flask_app)
