"""Sweeps as MLflow run groups: a Hydra callback (``hydra.callbacks`` in conf/config.yaml) that makes each multirun
a parent run.

* ``on_multirun_start`` (the launching process) creates the parent run (tags ``rlhf_lab.stage=sweep``,
  ``rlhf_lab.study``, ``rlhf_lab.command``; the swept keys as params) and hands its id and the swept keys to the jobs
  through the environment, in this process and through ``hydra.job.env_set``, which every launcher applies around
  the job, also on a remote worker (Ray, submitit, SLURM). :func:`rlhf_lab.runs.tracking.start_run` then makes each
  job run a child and logs the job's swept values as ``sweep.<key>`` params.
* A failing job (the task function catches it in MULTIRUN mode) is logged and recorded (:func:`record_failure`), so
  the others go on; with the tracking server gone its error is one line naming the server.
* ``on_multirun_end`` attaches the study report to the parent run (:func:`attach_study_report`; off with
  ``hydra.callbacks.mlflow_sweep.report=false``), ends it FINISHED, or FAILED when a job failed (exit status 1), and
  prints a table of the jobs.
* A sweep that ends any other way (a job's ``SystemExit``, an error of a launcher), or whose end cannot reach the
  store, exits non-zero (Hydra would make a callback's exception a warning and exit 0): :func:`end_failed_sweep`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import sys
import traceback
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from rlhf_lab.runs.states import OPEN_SWEEP, SWEEP_PID_ENV, mark_dead_runs, process_tags
from rlhf_lab.config.keys import configured_uri, experiment_name, override_key
from rlhf_lab.runs.process import LAUNCH_DIR_ENV, PARENT_ENV, SWEPT_ENV
from rlhf_lab.runs.store import exit_on_broken_store
from rlhf_lab.runs.tracking_server import (
    exit_on_unreachable_server, tracking_server_problem, tracking_server_unreachable, tracking_uri)

log = logging.getLogger(__name__)

STATE_ENV = "RLHF_LAB_SWEEP_STATE"


def swept_keys(sweeper_params: dict[str, Any] | None, overrides: list[str]) -> list[str]:
    """Keys that take several values in this multirun (sweeper params, then command-line overrides win)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    items = [f"{k}={v}" for k, v in (sweeper_params or {}).items()] + list(overrides)
    parsed = OverridesParser.create().parse_overrides(items)
    final: dict[str, bool] = {}
    for o in parsed:
        key = override_key(o.get_key_element())
        final.pop(key, None)  # keep the order of the last occurrence
        final[key] = o.is_sweep_override()
    return [k for k, is_sweep in final.items() if is_sweep]


def sweep_command(overrides: list[str]) -> str:
    return " ".join(["rlhf-lab", "-m", *(shlex.quote(o) for o in overrides)])


def server_failure_line(err: BaseException, uri: str) -> str | None:
    """One line for a job's error when it comes with the tracking server at `uri` gone, else None:
    :class:`~rlhf_lab.runs.tracking.TrackingServerLost`'s message, or for any other error (MLflow's, after its
    retries) :func:`~rlhf_lab.runs.tracking_server.tracking_server_problem`'s."""
    if not uri.startswith(("http://", "https://")):  # a store without a server (a sqlite file): the error itself
        return None
    from rlhf_lab.runs.tracking import TrackingServerLost

    if isinstance(err, TrackingServerLost):
        return f"{type(err).__name__}: {err}"
    problem = tracking_server_problem(uri, float(os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT") or 5))
    return f"{type(err).__name__}: {problem}" if problem else None


def record_failure(cfg: DictConfig, err: BaseException) -> None:
    """Log a job's exception (MULTIRUN) and leave a record for on_multirun_end; the sweep goes on (the next job's
    start-up check stops it when the tracking server is gone). With the server gone: one line, no traceback
    (:func:`server_failure_line`)."""
    line = server_failure_line(err, tracking_uri(configured_uri(cfg)))
    tb = line or "".join(traceback.format_exception(type(err), err, err.__traceback__))
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
        num, overrides = hc.job.num, " ".join(hc.overrides.task)
    except Exception:
        num, overrides = os.getpid(), ""
    log.error("rlhf-lab: job %s (%s) failed; the other jobs go on:\n%s", num, overrides, tb)
    print(f"[rlhf-lab] job {num} FAILED: {line or f'{type(err).__name__}: {err}'}", file=sys.stderr)
    state = os.environ.get(STATE_ENV)
    if state:
        try:
            Path(state).mkdir(parents=True, exist_ok=True)
            (Path(state) / f"failed_{num}.txt").write_text(f"{overrides}\n{tb}")
        except OSError:
            pass


def mark_job(kind: str) -> None:
    """In a sweep's job: leave ``<kind>_<job number>.txt`` (a kind of :func:`resume_counts`) in the sweep's state
    folder, so the launching process knows whether any job ran and says how many of each; outside a sweep nothing."""
    state = os.environ.get(STATE_ENV)
    if not state:
        return
    try:
        from hydra.core.hydra_config import HydraConfig

        num = HydraConfig.get().job.num
        Path(state).mkdir(parents=True, exist_ok=True)
        (Path(state) / f"{kind}_{num}.txt").write_text("")
    except Exception:  # no Hydra context or an unwritable folder: the parent run is then kept, as before
        pass


class MlflowSweepCallback(Callback):
    """Parent MLflow run per multirun; jobs are its children (see the module docstring)."""

    def __init__(self, enabled: bool = True, exit_nonzero_on_failure: bool = True, report: bool = True) -> None:
        self.enabled = enabled
        self.report = report
        self.exit_nonzero_on_failure = exit_nonzero_on_failure
        self.run_id: str | None = None
        self.state_dir: Path | None = None
        self._saved_env: dict[str, str | None] = {}

    def _restore_env(self) -> None:
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    # -- launching process --------------------------------------------------------------------------------
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.enabled:
            return
        try:
            self.open_parent_run(config)
        except Exception as err:  # Hydra would turn it into a warning, and the jobs would run without their parent
            print(f"rlhf-lab: the sweep could not open its parent MLflow run in {tracking_uri(configured_uri(config))} "
                  f"({type(err).__name__}: {str(err)[:300]}); no job ran", file=sys.stderr)
            raise SystemExit(2) from err

    def open_parent_run(self, config: DictConfig) -> None:
        """The sweep's parent run, and the environment that makes every job its child."""
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        from rlhf_lab.runs.authors import AUTHOR_TAG, current_author
        from rlhf_lab.runs.tracking import experiment_id, git_commit  # here: Hydra loads this callback in every run

        uri = tracking_uri(configured_uri(config))
        exit_on_unreachable_server(uri)  # before any job: in seconds, not minutes of retries per job
        exit_on_broken_store(uri)  # a new sqlite store: created once, under a lock
        overrides = list(config.hydra.overrides.task)
        node = OmegaConf.select(config, "hydra.sweeper.params")
        params = OmegaConf.to_container(node, resolve=False) if isinstance(node, DictConfig) else {}
        keys = swept_keys(params, overrides)
        study = config.get("study")
        command = sweep_command(overrides)
        client = MlflowClient(tracking_uri=uri)
        exp_id = experiment_id(uri, experiment_name(config))
        tags = {**process_tags(), "rlhf_lab.stage": "sweep", "rlhf_lab.command": command,
                "rlhf_lab.overrides": " ".join(overrides), "rlhf_lab.git_commit": git_commit(),
                "rlhf_lab.swept_keys": ",".join(keys), **({"rlhf_lab.study": str(study)} if study else {}),
                AUTHOR_TAG: current_author()}  # its author, as the jobs' runs record theirs (rlhf_lab.runs.authors)
        run = client.create_run(exp_id, run_name=f"sweep:{study or 'multirun'}", tags=tags)
        self.run_id = run.info.run_id
        self._client = client
        self.state_dir = Path(str(config.hydra.sweep.dir)).resolve() / ".rlhf_lab" / self.run_id
        # until on_multirun_end ends it: a stop signal ends it KILLED, a sweep stopped otherwise FAILED (the CLI)
        OPEN_SWEEP.update(uri=uri, run_id=self.run_id, experiment_id=exp_id, state_dir=str(self.state_dir))
        flat = {"sweep.study": str(study), "sweep.command": command[:6000],
                **{f"sweep.values.{override_key(k)}": str(v)[:6000] for k, v in (params or {}).items()}}
        for o in overrides:
            if "=" in o:
                k, v = o.split("=", 1)
                flat[f"sweep.values.{override_key(k)}"] = v[:6000]
        client.log_batch(self.run_id, params=[Param(k[:250], str(v)[:6000]) for k, v in flat.items()])
        env = {PARENT_ENV: self.run_id, SWEPT_ENV: ",".join(keys), STATE_ENV: str(self.state_dir),
               SWEEP_PID_ENV: str(os.getpid()),
               # a job on a Ray or SLURM worker runs elsewhere: relative cache_dir and sqlite store are the launch's
               LAUNCH_DIR_ENV: os.environ.get(LAUNCH_DIR_ENV) or os.getcwd()}
        if os.environ.get("MLFLOW_TRACKING_URI"):  # a worker on another machine logs where the parent run is
            env["MLFLOW_TRACKING_URI"] = os.environ["MLFLOW_TRACKING_URI"]
        for k, v in env.items():
            self._saved_env[k] = os.environ.get(k)
            os.environ[k] = v
        # every launcher sets hydra.job.env_set around the job, also on a remote worker
        with read_write(config.hydra.overrides.hydra), open_dict(config):
            for k, v in env.items():
                config.hydra.overrides.hydra.append(f"++hydra.job.env_set.{k}={_quote(v)}")
        print(f"[rlhf-lab] sweep {study or ''}: parent MLflow run {self.run_id}; swept: {', '.join(keys) or '-'}")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.enabled or self.run_id is None:
            return
        uri = tracking_uri(configured_uri(config))
        try:
            lost = tracking_server_unreachable(uri)  # in seconds, before minutes of MLflow's retries
            if lost:
                raise ConnectionError(lost)
            self.end_parent_run(config)
        except Exception as err:  # Hydra would make it a warning and the sweep would exit 0
            self._restore_env()
            lost = end_failed_sweep(f"the sweep's end failed: {type(err).__name__}: {str(err)[:300]}")
            sys.stdout.flush()
            raise SystemExit(2 if lost else 1) from None  # 2: the tracking server cannot be reached, as at start-up

    def end_parent_run(self, config: DictConfig) -> None:
        """The sweep's end (the module's doc): the report, the parent run FINISHED or FAILED, its table of jobs."""
        client, uri = self._client, tracking_uri(configured_uri(config))
        failed = failed_jobs(self.state_dir)
        exp_id = client.get_run(self.run_id).info.experiment_id
        mark_dead_runs(client, exp_id)  # a job whose process or Ray node died mid-run: KILLED, not left RUNNING
        children = client.search_runs([exp_id], filter_string=f"tags.mlflow.parentRunId = '{self.run_id}'",
                                      max_results=5000)
        for r in children:
            if r.info.status == "FAILED":
                failed.setdefault(f"run {r.info.run_id}", r.data.tags.get("rlhf_lab.overrides", ""))
        marks = [f.name.split("_")[0] for f in self.state_dir.glob("*_*.txt")] if self.state_dir else []
        resumed = resume_counts(marks)
        if not children and not failed and "skipped" in marks and not {"ran", "rerun"} & set(marks):  # nothing left
            OPEN_SWEEP.clear()
            client.delete_run(self.run_id)  # an empty parent per relaunch would only clutter the run list
            self._restore_env()
            print(f"[rlhf-lab] sweep {config.get('study') or ''}: every job has a finished run; nothing ran "
                  f"(no new parent run): {resumed}")
            return
        n_failed_jobs = len([k for k in failed if k.startswith("job")]) or len(failed)
        client.log_metric(self.run_id, "sweep/n_child_runs", len(children))
        client.log_metric(self.run_id, "sweep/n_failed", n_failed_jobs)
        if self.report:
            attach_study_report(client, self.run_id, config.get("study"), uri, children)
        status = "FAILED" if failed else "FINISHED"
        if failed:
            client.set_tag(self.run_id, "rlhf_lab.error", "; ".join(f"{k}: {v}" for k, v in failed.items())[:5000])
        OPEN_SWEEP.clear()  # until here a stop signal ends the parent run KILLED (the CLI)
        client.set_terminated(self.run_id, status=status)
        self._restore_env()
        print(jobs_table(children, failed))
        print(f"[rlhf-lab] sweep {config.get('study') or ''}: parent run {self.run_id} {status} "
              f"({len(children)} child runs" + (f"; failed: {', '.join(failed)})" if failed else ")"))
        if {"skipped", "rerun"} & set(marks):  # a relaunch with skip_finished=true: what it found done
            print(f"[rlhf-lab] sweep {config.get('study') or ''}: skip_finished: {resumed}")
        from rlhf_lab.runs.tracking import HEADLINE_VIEW, HEADLINE_VIEW_TAG, ui_base, ui_hint, ui_link

        hint = ui_hint(uri, exp_id, self.run_id)
        if hint:  # and the runs list, with the headline metrics as columns where the experiment has that view
            view = HEADLINE_VIEW if HEADLINE_VIEW_TAG in client.get_experiment(exp_id).tags else None
            print(f"[rlhf-lab] in the UI: {hint}\n[rlhf-lab] the jobs side by side: "
                  f"{ui_link(ui_base(uri), exp_id, view=view)}")
        if failed and self.exit_nonzero_on_failure:
            sys.stdout.flush()
            raise SystemExit(1)


def failed_jobs(state_dir: Path | None) -> dict[str, str]:
    """{``job <number>``: its overrides} of the jobs that recorded a failure in the sweep's state folder
    (:func:`record_failure`)."""
    failed: dict[str, str] = {}
    if state_dir is not None and state_dir.is_dir():
        for f in sorted(state_dir.glob("failed_*.txt")):
            text = f.read_text()
            failed[f"job {f.stem.split('_', 1)[1]}"] = text.splitlines()[0] if text else ""
    return failed


def end_failed_sweep(error: str) -> str | None:
    """In the launching process of a sweep whose parent run is still open (:data:`OPEN_SWEEP`): the parent ended
    FAILED with ``rlhf_lab.error`` = the failed jobs' records and `error`, the job runs of dead processes KILLED, in
    one line; with the tracking server unreachable, one line saying the parent stays RUNNING until the next start
    marks it KILLED. Returns why the server cannot be reached, or None (also when there is no open parent)."""
    if not OPEN_SWEEP:
        return None
    sweep = dict(OPEN_SWEEP)
    OPEN_SWEEP.clear()
    uri, run_id = sweep["uri"], sweep["run_id"]
    failed = failed_jobs(Path(sweep["state_dir"]) if sweep.get("state_dir") else None)
    error = "; ".join([*(f"{k}: {v}" for k, v in failed.items()), error])
    lost = tracking_server_unreachable(uri)
    try:
        if lost:
            raise ConnectionError(lost)
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        with contextlib.suppress(Exception):  # a job's process gone mid-run: KILLED, not left RUNNING
            mark_dead_runs(client, sweep["experiment_id"])
        client.set_tag(run_id, "rlhf_lab.error", error[:5000])
        client.set_terminated(run_id, status="FAILED")
    except Exception as err:
        left = (f"the sweep's parent MLflow run {run_id} could not be marked FAILED and stays RUNNING until the next "
                "rlhf-lab start in the experiment on this host marks it KILLED")
        print(f"rlhf-lab: cannot reach the MLflow tracking server at {uri} ({lost}; MLFLOW_TRACKING_URI, else "
              f"tracking.uri): {left}; once the server answers, run the same command again with skip_finished=true "
              "(the jobs that finished are skipped)" if lost else
              f"rlhf-lab: {left} ({type(err).__name__}: {str(err)[:300]})", file=sys.stderr)
        return lost
    print(f"[rlhf-lab] sweep: parent run {run_id} FAILED ({error[:300]})", file=sys.stderr)
    return None


def resume_counts(marks: list[str]) -> str:
    """What a relaunch with ``skip_finished=true`` did with its jobs, from their marks (:func:`mark_job`): ``2 jobs
    skipped (a finished run computed the same), 1 job run (no finished run)``."""
    words = {"skipped": "skipped (a finished run computed the same)",
             "rerun": "rerun (its config, inputs or code changed since its finished run)",
             "ran": "run (no finished run)"}
    n = {k: marks.count(k) for k in words}
    return ", ".join(f"{n[k]} job{'s' * (n[k] != 1)} {w}" for k, w in words.items() if n[k])


def attach_study_report(client, run_id: str, study: str | None, uri: str, children: list) -> dict | None:
    """The study report of the sweep's jobs into its parent run (:mod:`rlhf_lab.analysis.parent_run`), with one
    line saying so; a failure to write it is reported and never fails the sweep."""
    from rlhf_lab.runs.tracking import JOB_TAG

    stages = sorted({r.data.tags.get("rlhf_lab.stage", "") for r in children if r.data.tags.get(JOB_TAG) == "true"})
    if not stages:
        return None
    try:
        from rlhf_lab.analysis.parent_run import ARTIFACT_DIR, publish_study_report

        out = publish_study_report(client, run_id, study, uri, stages)
    except Exception as err:  # the jobs' results are in the store whatever happens here
        print(f"[rlhf-lab] sweep: no study report in the parent run ({type(err).__name__}: {err}); "
              f"rlhf-lab-report {study or '<study>'} writes it from the store", file=sys.stderr)
        return None
    best = out["best"]
    print(f"[rlhf-lab] sweep: study report in the parent run's artifacts ({ARTIFACT_DIR}/: {', '.join(out['files'])})"
          + (f"; best setting {best.setting}: {best.split} gold {best.gold:.3f} (chosen on eval gold "
             f"{best.eval_gold:.3f})" if best else ""))
    return out


def jobs_table(children: list, failed: dict[str, str]) -> str:
    """One table of the sweep's jobs: run name, status, test and eval gold reward, eval KL, wall time; then the jobs
    that failed before opening a run."""
    from rlhf_lab.runs.tracking import JOB_TAG

    jobs = sorted((r for r in children if r.data.tags.get(JOB_TAG) == "true"), key=lambda r: r.info.start_time or 0)
    keys = ("test/gold_reward", "eval/gold_reward", "eval/kl")
    rows = [("job (run name)", "status", "test gold", "eval gold", "eval KL", "time")]
    for r in jobs:
        m = r.data.metrics
        secs = ((r.info.end_time or r.info.start_time or 0) - (r.info.start_time or 0)) / 1000
        rows.append((r.info.run_name or r.info.run_id, r.info.status,
                     *(f"{m[k]:.3f}" if k in m else "-" for k in keys), f"{secs:.0f}s"))
    rows += [(f"{k} ({v})" if v else k, "FAILED", "-", "-", "-", "-") for k, v in failed.items() if k.startswith("job")]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in rows]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def _quote(v: str) -> str:
    return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"


# -- dry run -----------------------------------------------------------------------------------------------


def plan(overrides: list[str], validate: bool = True) -> list[list[str]]:
    """The jobs (override lists) that ``rlhf-lab -m <overrides>`` launches with the basic sweeper, each composed when
    ``validate`` (a bad key or option raises here; of jobs that differ only in ``seed`` one, the others' seeds checked
    to be integers)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    parser = OverridesParser.create()
    fixed = [o for o, p in zip(overrides, parser.parse_overrides(list(overrides))) if not p.is_sweep_override()]
    GlobalHydra.instance().clear()
    with initialize_config_module("rlhf_lab.conf", version_base="1.3"):
        cfg = compose("config", overrides=fixed, return_hydra_config=True)
        node = OmegaConf.select(cfg, "hydra.sweeper.params")
        params = OmegaConf.to_container(node, resolve=False) if isinstance(node, DictConfig) else {}
        items = [f"{k}={v}" for k, v in (params or {}).items()] + list(overrides)
        jobs = BasicSweeper.split_arguments(parser.parse_overrides(items), None)[0]
        if validate:
            composed = set()
            for job in jobs:
                setting = tuple(o for o in job if not o.startswith("seed="))
                if setting not in composed:
                    compose("config", overrides=job)
                    composed.add(setting)
                for o in job:
                    if o.startswith("seed=") and not o[len("seed="):].lstrip("-").isdigit():
                        raise ValueError(f"{o}: seed must be an integer")
    return jobs


def _main(argv: list[str] | None = None) -> int:
    """``python -m rlhf_lab.entry.sweeps sweep=ppo_beta_grid [overrides]``: list the jobs of a multirun."""
    args = list(sys.argv[1:] if argv is None else argv)
    jobs = plan(args)
    for i, job in enumerate(jobs):
        print(f"#{i}: {' '.join(job)}")
    print(f"{len(jobs)} jobs; launch with: {sweep_command(args)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
