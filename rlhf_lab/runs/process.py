"""Process set-up shared by every entry point; a leaf module (it imports nothing from rlhf_lab).

- :func:`quiet_libraries`: silence the advisory warnings and progress bars of transformers, Lightning
  and MLflow that would otherwise bury the lab's own output;
- :func:`to_plain`: an OmegaConf node as plain Python containers (resolved), anything else unchanged,
  for cache keys and MLflow params;
- :data:`PARENT_ENV`, :data:`SWEPT_ENV`, :func:`override_key`: what a sweep hands its jobs (here, not in
  ``tracking``, so that the sweep callback, which Hydra loads in every run, imports neither Lightning nor
  MLflow and a bad config fails in seconds);
- :func:`tracking_uri`: where MLflow runs go: ``MLFLOW_TRACKING_URI``, else ``tracking.uri``, else
  ``sqlite:///mlflow.db`` in the working directory;
- :func:`write_atomic`: write a file through a temporary file beside it and a rename (never half-written);
- :func:`tracking_server_unreachable`, :func:`tracking_server_login_problem`, :func:`tracking_server_problem`,
  :func:`exit_on_unreachable_server`: why an ``http(s)://`` tracking server cannot be reached or refuses this
  process's MLflow login, checked at start-up in seconds (MLflow's own requests retry for minutes, which suits an
  established run, not a first contact);
- :func:`start_job_clock`, :func:`stop_job_clock`, :func:`job_phases`: when the process and the job started (the
  CLI sets them around the job), for a job's ``time/startup_s`` and ``time/setup_s``;
- the resolver ``${rlhf_lab.launch_dir:}`` (registered on import): the folder a multirun is launched from, cached,
  so that a job on a Ray or SLURM worker writes its Hydra output folder under the launch folder (``hydra.sweep.dir``
  in conf/config.yaml), not under its own working folder.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


def launch_dir() -> str:
    """``${rlhf_lab.launch_dir:}``: the working folder where it is first resolved. Registered with Hydra's
    ``use_cache`` (like ``${now:}``): a launcher resolves ``hydra.sweep.dir`` in the process that launches the sweep
    and copies that config's resolver cache into every job's config (``load_sweep_config``), and the cache travels
    with the pickled config, so a job on another machine resolves the launch folder, not its own."""
    return os.getcwd()


if not OmegaConf.has_resolver("rlhf_lab.launch_dir"):  # on import: a Ray worker resolves the job's config too
    OmegaConf.register_new_resolver("rlhf_lab.launch_dir", launch_dir, use_cache=True)
# {"process": the process's start (rlhf_lab.STARTED; for a sweep worker's later jobs, when the job entered the
# CLI), "job": when the CLI handed the composed, checked config to the job's stage}: set by rlhf_lab.entry.run around the
# job (here, not in the CLI's module: a joblib worker gets the CLI's task function pickled by value, globals copied),
# empty when a stage is called directly (tests, the API)
JOB_CLOCK: dict[str, float] = {}
JOBS_STARTED = [0]  # jobs this process has started (a sweep worker runs several)


def start_job_clock(entered: float) -> float:
    """Start the job's clock (now) and return it; `entered`: when the job entered the CLI. The process's start is
    ``rlhf_lab.STARTED`` (the package's first import) for its first job, `entered` for a warm worker's later ones."""
    now = time.time()
    first = JOBS_STARTED[0] == 0
    JOB_CLOCK.update(process=getattr(sys.modules.get("rlhf_lab"), "STARTED", entered) if first else entered, job=now)
    JOBS_STARTED[0] += 1
    return now


def stop_job_clock() -> None:
    """The job is over: a stage called later in this process (the API, a test) reports no start-up or setup."""
    JOB_CLOCK.clear()


def job_phases(now: float | None = None) -> dict[str, float]:
    """``time/startup_s`` (process start to the job's stage: imports, config composition and checks, the tracking
    store's first contact) and ``time/setup_s`` (from there to `now`, e.g. the start of training: the heavy imports,
    upstream stages built or loaded from the cache, models loaded), for what :data:`JOB_CLOCK` holds."""
    now = time.time() if now is None else now
    out = {}
    if "process" in JOB_CLOCK and "job" in JOB_CLOCK:
        out["time/startup_s"] = JOB_CLOCK["job"] - JOB_CLOCK["process"]
    if "job" in JOB_CLOCK:
        out["time/setup_s"] = now - JOB_CLOCK["job"]
    return out
# the folder a sweep was launched in, handed to its jobs (rlhf_lab/entry/sweeps.py): a job on a Ray or SLURM worker
# runs in another working folder, and the config's relative paths (cache_dir, a sqlite store) mean the launch's
LAUNCH_DIR_ENV = "RLHF_LAB_LAUNCH_DIR"
# the config keys that do not change what a job computes (where it logs, how it shows progress, an explicit resume,
# the input's size bounds, which only refuse data): left out of a pre-empted job's checkpoint key (stages/ppo.py) and
# of a run's setting in the reports (analysis/runs.py)
NOT_COMPUTED = ("tracking", "skip_finished", "study", "cache_dir", "trainer.progress_bar", "algo.resume_from",
                "eval.reuse_start", "data.max_line_bytes", "data.max_total_bytes")


def drop_keys(plain: dict, keys) -> dict:
    """`plain` (a config as plain containers, changed in place and returned) without the dotted `keys`."""
    for key in keys:
        *parents, last = key.split(".")
        node = plain
        for part in parents:
            node = node.get(part) or {}
        node.pop(last, None)
    return plain


def computes(key: str) -> bool:
    """Whether config key `key` (dotted) can change what a job computes: not one of :data:`NOT_COMPUTED` or below."""
    return not any(key == k or key.startswith(k + ".") for k in NOT_COMPUTED)


PARENT_ENV = "RLHF_LAB_PARENT_RUN_ID"  # set by the sweep callback (rlhf_lab/entry/sweeps.py) around every job
SWEPT_ENV = "RLHF_LAB_SWEPT_KEYS"


def write_atomic(path: os.PathLike | str, data: bytes | str) -> None:
    """Write `data` to `path` through a uniquely named temporary file in the same folder, flushed to disk, then
    renamed over `path`: a reader sees the old file or the new one, and a killed writer leaves no half file."""
    import tempfile

    path = os.fspath(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def override_key(key: str) -> str:
    """The config key of a command-line override (``+key`` / ``~key`` / ``key``)."""
    return key.lstrip("+~")


def quiet_libraries() -> None:
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import warnings

    import lightning  # noqa: F401  (imported first: they set their loggers' levels on import)
    import mlflow  # noqa: F401
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    for name in ("lightning", "lightning.pytorch", "lightning.pytorch.utilities.rank_zero", "lightning.fabric",
                 "mlflow", "mlflow.store.db.utils", "mlflow.tracking.fluent", "alembic", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", category=FutureWarning)


def to_plain(x: Any) -> Any:
    """An OmegaConf node as plain (resolved) dicts and lists; anything else is returned as it is."""
    if isinstance(x, (DictConfig, ListConfig)):
        return OmegaConf.to_container(x, resolve=True)
    return x


def launch_path(path: str | os.PathLike) -> str:
    """A relative path of the config (``cache_dir``, a sqlite store's file) taken from the folder the sweep was
    launched in (``RLHF_LAB_LAUNCH_DIR``, set for its jobs) when there is one; otherwise unchanged (relative to
    the working folder, which is the launch folder)."""
    path = os.path.expanduser(str(path))
    base = os.environ.get(LAUNCH_DIR_ENV)
    return os.path.join(base, path) if base and not os.path.isabs(path) else path


def tracking_uri(cfg: DictConfig | None = None) -> str:
    """The MLflow tracking URI: ``MLFLOW_TRACKING_URI``, else ``tracking.uri``, else the default sqlite file; a
    relative sqlite file is the launch folder's (:func:`launch_path`)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        uri = os.environ["MLFLOW_TRACKING_URI"]
    elif cfg is not None and cfg.get("tracking") and cfg.tracking.get("uri"):
        uri = str(cfg.tracking.uri)
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
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None
    except Exception as err:  # refused, no route, DNS, timeout
        return str(getattr(err, "reason", None) or err)


def tracking_server_login_problem(uri: str, timeout: float = 5.0) -> str | None:
    """For an ``http(s)://`` tracking server that asks for a login (MLflow's basic auth: 401 to a request without
    one, e.g. ``rlhf-lab-server``'s): one line saying why this process's login does not do and which variables to
    set, or None (no login asked, or the login works, or another scheme: ``MLFLOW_TRACKING_TOKEN`` /
    ``MLFLOW_TRACKING_AUTH``). The login is MLflow's: ``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD``,
    else ``~/.mlflow/credentials`` (read by MLflow's own reader, imported only when a server asks)."""
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
