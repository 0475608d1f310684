"""MLflow tracking: one run per stage (:func:`start_run`), embedded SQLite store by default.

The store is :func:`rlhf_lab.runs.tracking_server.tracking_uri`'s. Lightning's MLFlowLogger is pointed at the run
:func:`start_run` opened and leaves its status to us: a run that raises ends FAILED with its error as the tag
``rlhf_lab.error``, one stopped by a signal KILLED (:mod:`rlhf_lab.runs.states`). A stage's run is FINISHED only after
the writes that follow its body (its artifact, the job's summary): :func:`status_after_writes`.

A tracking server that stops answering mid-run: MLflow retries each request (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``,
about 4 minutes in all), so a server restarted within that window costs a pause; past it the job fails with
:class:`TrackingServerLost` (one line), its run RUNNING on the server until the next start marks it KILLED.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Iterator

import mlflow

from rlhf_lab.config.keys import computes, override_key
from rlhf_lab.runs.code import CPU_TAG, cpu_capability, library_versions
from rlhf_lab.runs.distributed import is_rank_zero
from rlhf_lab.runs.identity import leaves, run_tags
from rlhf_lab.runs.jobs import STUDY_DIGEST_TAG, RunSettings, hydra_overrides, job_sweep_params, study_digest
from rlhf_lab.runs.states import Interrupted, mark_dead_runs, process_tags
from rlhf_lab.runs.store import store_lock
from rlhf_lab.runs.process import PARENT_ENV, environment
from rlhf_lab.runs.tracking_server import tracking_server_unreachable


def git_commit() -> str:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except Exception:
        return "unknown"


JOB_TAG = "rlhf_lab.job"  # "true" on the run of the job stage (not on the upstream stages it built)


NAME_CHARS = 80  # the overrides in a run's name, at most (whole ones; the rest counted as "+N more")
NAME_SKIPS = ("algo", "trainer.threads", "hydra")  # the stage names the job; threads and Hydra's own compute nothing


def short_value(value: str) -> str:
    """A local path by its last part (``/data/u/pythia-70m`` -> ``pythia-70m``); any other value as it is."""
    if value.startswith(("/", "./", "../", "~")) and value.rstrip("/"):
        return Path(value.rstrip("/")).name or value
    return value


def named(name: str, pairs: list[tuple[str, str]]) -> str:
    """`name` and ``key=value`` for each pair, values shortened (:func:`short_value`), whole pairs only: past
    :data:`NAME_CHARS` characters the rest are counted (``+2 more``), never cut in the middle."""
    tokens = [f"{k}={short_value(v)}" for k, v in pairs]
    kept: list[str] = []
    for t in tokens:
        if kept and len(" ".join([*kept, t])) > NAME_CHARS:
            break
        kept.append(t)
    rest = len(tokens) - len(kept)
    return " ".join([name, *kept, *([f"+{rest} more"] if rest else [])])


def sweep_run_name(name: str, swept: dict[str, str]) -> str:
    """``ppo kl.beta=0.1 seed=1``: the stage and the job's values of the swept keys (``sweep.<key>``)."""
    return named(name, [(k.removeprefix("sweep."), v) for k, v in swept.items()])


def job_run_name(name: str, overrides: list[str]) -> str:
    """A job run outside a sweep: ``sft seed=3 sft.lr=0.001``, the stage and the job's command-line overrides that
    change what it computes (not ``algo=``, which the stage names, nor the keys of
    :data:`~rlhf_lab.config.keys.NOT_COMPUTED`, threads or Hydra's own), shortened as :func:`named` does; the stage
    alone without any."""
    pairs = []
    for o in overrides:
        key, eq, value = o.partition("=")
        key = override_key(key)
        if eq and computes(key) and not any(key == s or key.startswith(s + ".") or key.startswith(s + "/")
                                            for s in NAME_SKIPS):
            pairs.append((key, value))
    return named(name, pairs)


# the runs list with the headline metrics as columns, a view the UI applies when its link names it (viewStateShareKey=
# HEADLINE_VIEW): MLflow 3.17 reads the view from the experiment tag HEADLINE_VIEW_TAG; the list has no default columns
HEADLINE_COLUMNS = ("test/gold_reward", "eval/gold_reward", "eval/proxy_reward", "eval/kl")
HEADLINE_VIEW = "rlhf_lab_headline"
HEADLINE_VIEW_TAG = f"mlflow.sharedViewState.{HEADLINE_VIEW}"
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development",  # the MLflow 3 UI opens on the runs
                   HEADLINE_VIEW_TAG: json.dumps({"selectedColumns": [f"metrics.`{k}`" for k in HEADLINE_COLUMNS]})}


UI_WORKFLOW = "workflowType=machine_learning"  # MLflow 3's UI opens in its GenAI view (traces) without it


def ui_link(base: str, experiment_id: str, run_id: str | None = None, view: str | None = None) -> str:
    """The MLflow UI page of an experiment's runs (or of one run), with the saved `view` applied
    (:data:`HEADLINE_VIEW`), in the model-training view: MLflow 3.x opens its GenAI view unless the
    ``workflowType`` query parameter (or the browser's last choice) says otherwise, whatever the experiment's tags."""
    page = f"runs/{run_id}" if run_id else "runs"
    shared = f"&viewStateShareKey={view}" if view and not run_id else ""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/{page}?{UI_WORKFLOW}{shared}"


def ui_base(uri: str) -> str | None:
    """Where the UI of the store `uri` is: the tracking server itself, or for a sqlite store ``mlflow ui``'s
    default address; None for other stores."""
    return uri if uri.startswith("http") else "http://127.0.0.1:5000" if uri.startswith("sqlite") else None


def ui_hint(uri: str, experiment_id: str | None, run_id: str | None = None) -> str | None:
    """How to see a run in the UI: its page on a tracking server, or the ``mlflow ui`` command for a sqlite
    store and the page it will serve (default port); None for other stores."""
    if uri.startswith("http") and experiment_id:
        return ui_link(uri, experiment_id, run_id)
    if uri.startswith("sqlite"):
        page = f", then {ui_link(ui_base(uri), experiment_id, run_id)}" if experiment_id else ""
        return f"mlflow ui --backend-store-uri {uri}{page}"
    return None


def experiment_id(uri: str, name: str) -> str:
    """The id of the experiment `name` in the store at `uri`, created (tagged :data:`EXPERIMENT_TAGS`) if missing,
    under :func:`~rlhf_lab.runs.store.store_lock` (so are a new sqlite store's tables): processes may start at the same
    moment in a fresh folder; on a tracking server (no lock) the loser of the race takes the winner's."""
    with store_lock(uri):
        client = mlflow.MlflowClient(uri)
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        try:
            return client.create_experiment(name, tags=EXPERIMENT_TAGS)
        except mlflow.exceptions.MlflowException as err:  # a server has no file lock: another process was first
            exp = client.get_experiment_by_name(name) if err.error_code == "RESOURCE_ALREADY_EXISTS" else None
            if exp is None:
                raise
            return exp.experiment_id


YAML_BOOLS = ("y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "true", "True", "TRUE", "false", "False",
              "FALSE", "on", "On", "ON", "off", "Off", "OFF")  # the words OmegaConf's YAML reads as booleans


def number_like(text: str) -> bool:
    """Whether OmegaConf would read `text` unquoted as a number or boolean (``1e-3``, ``nan``, ``y``), which PyYAML
    alone writes bare."""
    if text in YAML_BOOLS:
        return True
    for parse in (int, float):
        try:
            parse(text)
            return True
        except ValueError:
            pass
    return False


def config_yaml(config: dict) -> str:
    """The resolved config as YAML, byte for byte as ``OmegaConf.to_yaml(cfg, resolve=True)`` writes it (this
    package takes no omegaconf below the stages), so that ``OmegaConf.load`` of ``config.yaml`` gives it back."""
    import yaml

    class Dumper(yaml.Dumper):
        pass

    def text(dumper: yaml.Dumper, data: str) -> yaml.ScalarNode:
        return dumper.represent_scalar(yaml.resolver.BaseResolver.DEFAULT_SCALAR_TAG, data,
                                       style="'" if number_like(data) else None)

    Dumper.add_representer(str, text)
    return yaml.dump(config, default_flow_style=False, allow_unicode=True, sort_keys=False, Dumper=Dumper)


@contextlib.contextmanager
def start_run(settings: RunSettings, stage: str, run_name: str | None = None, params: dict | None = None,
              tags: dict[str, str] | None = None, resume_run_id: str | None = None) -> Iterator[mlflow.ActiveRun]:
    """Open an MLflow run for a stage with the shared params and tags (docs/metrics.md).

    `resume_run_id`: the KILLED run of a pre-empted job that resumes from its checkpoint, reopened (its tags set
    again, its error tag removed), so the job's history is one run; any other run is left alone and a new one opened.
    On a rank other than 0 nothing is opened: it yields a stand-in whose ``info.run_id`` is None."""
    if not is_rank_zero():
        yield _NoRun()
        return
    uri = settings.uri
    with run_refused_in_one_line(uri, settings.experiment):
        exp_id = experiment_id(uri, settings.experiment)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id=exp_id)
    with contextlib.suppress(Exception):  # runs left RUNNING by a dead process (kill -9): KILLED
        mark_dead_runs(mlflow.MlflowClient(uri), exp_id)
    all_tags = {
        **process_tags(),
        "rlhf_lab.stage": stage,
        "rlhf_lab.git_commit": git_commit(),
        "rlhf_lab.overrides": " ".join(hydra_overrides()),
        CPU_TAG: cpu_capability(),  # the kernels and libraries that computed: what else a rerun must match
        "rlhf_lab.libraries": library_versions(),
    }
    digest = study_digest(hydra_overrides())
    if digest:
        all_tags[STUDY_DIGEST_TAG] = digest
    if settings.study:
        all_tags["rlhf_lab.study"] = settings.study
    parent = os.environ.get(PARENT_ENV)
    if parent:
        all_tags["mlflow.parentRunId"] = parent
    all_tags.update(tags or {})
    is_job = settings.job is not None and stage == settings.job
    swept = job_sweep_params(hydra_overrides()) if parent and is_job else {}
    if is_job:  # what the job computes (rlhf_lab.runs.identity): skip_finished compares it
        all_tags.update({JOB_TAG: "true", **run_tags(settings.config)})
    client = mlflow.MlflowClient(uri)
    resumed = resumable_run(client, resume_run_id, exp_id) if resume_run_id else None
    if resumed:
        run = mlflow.start_run(run_id=resumed)
        mlflow.set_tags(all_tags)
        with contextlib.suppress(Exception):
            client.delete_tag(resumed, "rlhf_lab.error")
    else:
        with run_refused_in_one_line(uri, settings.experiment):
            name = (job_run_name(run_name or stage, hydra_overrides()) if is_job and not parent  # its own overrides
                    else sweep_run_name(run_name or stage, swept))
            run = mlflow.start_run(run_name=name, tags=all_tags)
    OPEN_RUNS[run.info.run_id] = uri
    try:
        if swept and not resumed:
            mlflow.log_params(swept)
        mlflow.log_text(config_yaml(settings.config), "config.yaml")  # the resolved config
        if params is not None and not resumed:  # MLflow sends them in batches of 100
            mlflow.log_params({k: "" if v is None else str(json.dumps(v) if isinstance(v, list) else v)[:6000]
                               for k, v in leaves(params, lists=False).items()})
        yield run
    except BaseException as err:
        msg = f"{type(err).__name__}: {err}"
        lost = tracking_server_unreachable(uri) if not isinstance(err, Interrupted) else None
        # the server is gone: each request tried once (5 s), not minutes of retries for a run that cannot be ended
        once = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"} if lost else {}
        with environment(once):
            with contextlib.suppress(Exception):
                mlflow.flush_async_logging()
                mlflow.set_tag("rlhf_lab.error", msg[:5000])
            try:
                mlflow.end_run(status="KILLED" if isinstance(err, Interrupted) else "FAILED")  # off the stack first
            except Exception:
                if not lost:
                    raise
        OPEN_RUNS.pop(run.info.run_id, None)
        if lost:
            raise TrackingServerLost(uri, stage, run.info.run_id, lost) from err
        raise
    else:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():  # the job's GPU memory high-water mark
            mlflow.log_metric("memory/peak_gpu_mb", torch.cuda.max_memory_allocated() / 2**20)
        mlflow.flush_async_logging()
        if PENDING:  # the caller still writes (the artifact): it decides the status (status_after_writes)
            mlflow.end_run(status="RUNNING")  # off MLflow's stack, still RUNNING in the store
            PENDING[-1].append(run.info.run_id)
            return
        mlflow.end_run(status="FINISHED")
        OPEN_RUNS.pop(run.info.run_id, None)


@contextlib.contextmanager
def run_refused_in_one_line(uri: str, experiment: str) -> Iterator[None]:
    """The tracking server's refusal (HTTP 403) to create the experiment or a run in it, as a one-line ConfigError."""
    try:
        yield
    except mlflow.exceptions.MlflowException as err:
        if err.error_code != "PERMISSION_DENIED":
            raise
        from rlhf_lab.config.errors import ConfigError
        from rlhf_lab.runs.authors import current_author

        raise ConfigError("tracking.experiment", experiment, (
            f"an experiment in which {current_author()} may create runs (the MLflow server at {uri} refused: "
            "permission denied): use one of yours (tracking.experiment=<a new name> creates it) or ask its owner or "
            "the server's admin for EDIT on it")) from None


def resumable_run(client: mlflow.MlflowClient, run_id: str, experiment: str) -> str | None:
    """`run_id` when it is a KILLED run of `experiment` in the store (a pre-empted job's run to go on with), else
    None."""
    try:
        info = client.get_run(run_id).info
    except Exception:  # gone, or another store
        return None
    return run_id if info.experiment_id == experiment and info.status == "KILLED" else None


class TrackingServerLost(RuntimeError):
    """The tracking server stopped answering during a run, past MLflow's retries: one line saying so and what to do."""

    def __init__(self, uri: str, stage: str, run_id: str, reason: str):
        super().__init__(
            f"lost the MLflow tracking server at {uri} during the {stage} run {run_id} ({reason}); MLflow retried "
            f"each request {os.environ.get('MLFLOW_HTTP_REQUEST_MAX_RETRIES') or 7} times "
            "(MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR). The run stays RUNNING there until "
            "the next rlhf-lab start marks it KILLED; once the server (MLFLOW_TRACKING_URI, else tracking.uri) "
            "answers, relaunch with skip_finished=true")


PENDING: list[list[str]] = []  # one list per open status_after_writes block: the runs whose status waits on it


@contextlib.contextmanager
def status_after_writes() -> Iterator[None]:
    """A run that :func:`start_run` ends without error inside this block stays RUNNING until the block ends:
    FINISHED if it ends normally, FAILED (KILLED for a stop signal) with ``rlhf_lab.error`` if it raises, so a run is
    never FINISHED when its artifact could not be saved."""
    pending: list[str] = []
    PENDING.append(pending)
    try:
        yield
    except BaseException as err:
        leave(pending)
        status = "KILLED" if isinstance(err, Interrupted) else "FAILED"
        lost = next(filter(None, (tracking_server_unreachable(OPEN_RUNS.get(r, "")) for r in pending)), None)
        for run_id in pending:
            if lost:  # nothing reaches the server: the run stays RUNNING there until the next start ends it
                OPEN_RUNS.pop(run_id, None)
            else:
                end_stored_run(run_id, status, f"{type(err).__name__}: {err}")
        raise
    leave(pending)
    for run_id in pending:
        end_stored_run(run_id, "FINISHED")


def leave(pending: list[str]) -> None:
    """Take a block's list off :data:`PENDING` by identity (the lists of nested blocks may be equal, e.g. empty)."""
    for i in range(len(PENDING) - 1, -1, -1):
        if PENDING[i] is pending:
            del PENDING[i]
            return


def end_stored_run(run_id: str, status: str, error: str | None = None) -> None:
    """Set the status (and the tag ``rlhf_lab.error``) of a run :func:`start_run` opened, off MLflow's stack."""
    client = mlflow.MlflowClient(OPEN_RUNS.get(run_id, mlflow.get_tracking_uri()))
    if error:
        client.set_tag(run_id, "rlhf_lab.error", error[:5000])
    client.set_terminated(run_id, status=status)
    OPEN_RUNS.pop(run_id, None)


OPEN_RUNS: dict[str, str] = {}  # run id -> tracking URI: the runs start_run opened and has not ended yet


def end_open_runs(error: str, status: str = "KILLED") -> list[str]:
    """End with `status` and ``rlhf_lab.error`` = `error` every run :func:`start_run` opened and did not get to end
    (a stop signal cut it short), and empty MLflow's stack of active runs (its exit hook would end them FINISHED).
    Returns the ids it ended."""
    while mlflow.active_run() is not None:
        run_id = mlflow.active_run().info.run_id
        OPEN_RUNS.setdefault(run_id, mlflow.get_tracking_uri())
        try:
            mlflow.end_run(status=status)  # pops the run off the stack first, then writes the status
        except Exception:
            pass
    ended = []
    for run_id in list(OPEN_RUNS):
        with contextlib.suppress(Exception):
            end_stored_run(run_id, status, error)
            ended.append(run_id)
        OPEN_RUNS.pop(run_id, None)
    return ended


def lightning_logger(settings: RunSettings):
    """Lightning's MLflow logger bound to the open run, whose status stays ours to set (its ``finalize`` does
    nothing); False on ranks other than 0. Lightning is imported here: a sweep's launching process imports this
    module and never trains (the import is about 2.7 s on 2 cores)."""
    from lightning.pytorch.loggers import MLFlowLogger

    class RunLogger(MLFlowLogger):
        def finalize(self, status: str = "success") -> None:  # noqa: D401
            pass

    if not is_rank_zero():
        return False
    run = mlflow.active_run()
    if run is None:
        raise RuntimeError("lightning_logger() needs an open run: call it inside tracking.start_run")
    return RunLogger(tracking_uri=settings.uri, run_id=run.info.run_id)


class _NoRun:
    class info:  # noqa: N801
        run_id = None
