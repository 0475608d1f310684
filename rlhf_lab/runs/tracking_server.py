"""Where MLflow runs go (:func:`tracking_uri`: ``MLFLOW_TRACKING_URI``, else ``tracking.uri``, else
``sqlite:///mlflow.db`` in the launch folder) and, for an ``http(s)://`` tracking server, why it cannot be reached or
refuses this process's MLflow login (:func:`tracking_server_problem`), checked at start-up in seconds (MLflow's own
requests retry for minutes, which suits an established run, not a first contact)."""

from __future__ import annotations

import os
import time

from rlhf_lab.runs.process import PARENT_ENV, launch_path


DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


def tracking_uri(configured: str | None = None) -> str:
    """The MLflow tracking URI: ``MLFLOW_TRACKING_URI``, else ``tracking.uri``, else the default sqlite file; a
    relative sqlite file is the launch folder's (:func:`launch_path`)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        uri = os.environ["MLFLOW_TRACKING_URI"]
    elif configured:  # tracking.uri
        uri = str(configured)
    else:
        uri = DEFAULT_TRACKING_URI
    if uri.startswith("sqlite:///") and not uri[len("sqlite:///"):].startswith("/"):
        return "sqlite:///" + launch_path(uri[len("sqlite:///"):])
    return uri


def tracking_server_unreachable(uri: str, timeout: float = 5.0) -> str | None:
    """For an ``http(s)://`` tracking URI: None when something answers HTTP at ``<uri>/health`` within `timeout`
    seconds (any status: a server that wants a login is reachable), else why not (refused, timed out, ...). Other
    URIs (a sqlite file, a folder): None."""
    import urllib.error
    import urllib.request

    if not uri.startswith(("http://", "https://")):
        return None
    for attempt in range(3):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout):
                return None
        except urllib.error.HTTPError:
            return None
        except Exception as err:  # refused, no route, DNS, timeout
            reason = getattr(err, "reason", None) or err
            # reset or dropped: something listens but is not serving yet (a server restarting its workers); ask again
            if attempt < 2 and isinstance(reason, ConnectionResetError):  # also http.client.RemoteDisconnected
                time.sleep(1.0)
                continue
            return str(reason)


def tracking_server_login_problem(uri: str, timeout: float = 5.0) -> str | None:
    """For an ``http(s)://`` tracking server that asks for a login (401 without one): one line saying why this
    process's MLflow login (``MLFLOW_TRACKING_USERNAME``/``_PASSWORD``, else ``~/.mlflow/credentials``) does not do
    and what to set, or None (no login asked, the login works, or a token/auth scheme of MLflow's is set)."""
    import base64
    import urllib.error
    import urllib.request

    if not uri.startswith(("http://", "https://")):
        return None
    probe = uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1"

    def status(headers: dict[str, str]) -> int | None:
        try:
            with urllib.request.urlopen(urllib.request.Request(probe, headers=headers), timeout=timeout) as r:
                return r.status
        except urllib.error.HTTPError as err:
            return err.code
        except Exception:  # unreachable: tracking_server_unreachable's to say
            return None

    if status({}) != 401 or os.environ.get("MLFLOW_TRACKING_TOKEN") or os.environ.get("MLFLOW_TRACKING_AUTH"):
        return None
    from mlflow.utils.credentials import read_mlflow_creds

    creds = read_mlflow_creds()
    how = ("set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or put them in ~/.mlflow/credentials); the "
           "server's admin creates a login with: rlhf-lab-server user add NAME --dir <the server's folder>")
    if not (creds.username and creds.password):
        return f"the MLflow tracking server at {uri} asks for a login and this process has none: {how}"
    token = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
    if status({"Authorization": f"Basic {token}"}) == 401:
        return f"the MLflow tracking server at {uri} refused the login of {creds.username} (wrong password or no " \
               f"such user): {how}"
    return None


def tracking_server_problem(uri: str, timeout: float = 5.0) -> str | None:
    """One line saying why the tracking server at `uri` cannot be used and what to do, or None
    (:func:`tracking_server_unreachable`, then :func:`tracking_server_login_problem`). Inside a sweep's job an
    unreachable server's line also says how to finish the sweep."""
    reason = tracking_server_unreachable(uri, timeout)
    if reason is None:
        return tracking_server_login_problem(uri, timeout)
    hint = ("; the sweep stops here: once the server answers, run the same command again with skip_finished=true "
            "(the jobs that finished are skipped)" if os.environ.get(PARENT_ENV) else "")
    return f"cannot reach the MLflow tracking server at {uri} ({reason}); start it (rlhf-lab-server) or point " \
           f"MLFLOW_TRACKING_URI / tracking.uri at a running one{hint}"


def exit_on_unreachable_server(uri: str) -> None:
    """A tracking server that does not answer, or refuses this process's login: one line naming it on stderr and
    exit status 2, within seconds (``MLFLOW_HTTP_REQUEST_TIMEOUT`` seconds, default 5), instead of minutes of
    MLflow's retries or a traceback of its first refused request."""
    import sys

    problem = tracking_server_problem(uri, float(os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT") or 5))
    if problem:
        print(f"rlhf-lab: {problem}", file=sys.stderr)
        raise SystemExit(2)
