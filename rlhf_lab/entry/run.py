"""The `rlhf-lab` command: a Hydra app that runs the job named by `algo` with its upstream stages."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from rlhf_lab.config.errors import ConfigError
from rlhf_lab.config.checks import composition_error_line, exit_on_bad_config
from rlhf_lab.data.errors import DataError
from rlhf_lab.evaluation.summary import figures_line, held_out_counts, small_n_warning
from rlhf_lab.runs.identity import running
from rlhf_lab.runs.states import (
    SWEEP_PID_ENV,
    Interrupted,
    end_interrupted_sweep,
    ignore_signals,
    install_signal_handlers,
    restore_signal_handlers,
)
from rlhf_lab.config.keys import configured_uri, experiment_name, to_plain
from rlhf_lab.runs.process import quiet_libraries, start_job_clock, stop_job_clock
from rlhf_lab.runs.store import exit_on_broken_store
from rlhf_lab.runs.tracking_server import exit_on_unreachable_server, tracking_uri
from rlhf_lab.entry.sweeps import end_failed_sweep, mark_job, server_failure_line


def launcher_threads(launcher: dict, cores: int) -> int:
    """A job's torch threads under its launcher: ``cores // n_jobs`` with joblib (``hydra/launcher=parallel``; 1
    when ``n_jobs`` ≤ 0, joblib's one job per core), the CPUs the job holds with Ray (``ray.remote.num_cpus``,
    Ray's default 1) or submitit (``cpus_per_task``, when set), else all the cores (one job at a time)."""
    if launcher.get("n_jobs") is not None:
        n_jobs = int(launcher["n_jobs"])
        return max(1, cores // n_jobs) if n_jobs > 0 else 1
    if isinstance(launcher.get("ray"), dict):
        return max(1, int((launcher["ray"].get("remote") or {}).get("num_cpus") or 1))
    if launcher.get("cpus_per_task"):
        return max(1, int(launcher["cpus_per_task"]))
    return max(1, cores)


def set_threads(cfg: DictConfig) -> int:
    import torch

    n = cfg.trainer.get("threads")
    if n is None:
        n = os.cpu_count() or 1
        try:  # under a launcher that runs several jobs at a time, share the cores among them
            launcher = HydraConfig.get().launcher
            n = launcher_threads(OmegaConf.to_container(launcher, resolve=False) if launcher else {}, n)
        except Exception:
            pass
        from rlhf_lab.runs.distributed import n_processes

        n = max(1, n // n_processes(to_plain(cfg.trainer)))  # and among the job's own processes (trainer=ddp_cpu)
    torch.set_num_threads(int(n))
    return int(n)


GOLD_DEPTH = 2.0  # eval/gold_rm_std_ratio above which a job's summary says the gold RM is out of its depth


def gold_depth_warning(ev: dict) -> str | None:
    """The summary's warning when the gold RM's members disagree, at the last evaluation, more than
    :data:`GOLD_DEPTH` times as much as on its held-out pairs: its gold figures there are not to be trusted."""
    r = ev.get("eval/gold_rm_std_ratio")
    if r is None or not r > GOLD_DEPTH:
        return None
    return (f"the gold RM's members disagree {r:.1f}x their held-out level at the last evaluation (eval/gold_rm_std_"
            f"ratio > {GOLD_DEPTH:g}): the gold is out of its depth there, and its gold figures are not to be trusted")


def summary(cfg: DictConfig, meta: dict, seconds: float, threads: int | None = None) -> str:
    lines = [
        "=" * 72,
        f"rlhf-lab {cfg.algo.name}: done in {seconds:.0f}s" + (f" ({threads} CPU threads)" if threads else ""),
        f"  MLflow run : {meta.get('run_id')}  ({tracking_uri(configured_uri(cfg))})",
        f"  artifact   : {meta.get('artifact')}",
    ]
    if meta.get("cache_path"):
        lines.append(f"  cached as  : {meta['cache_path']}")
    world = OmegaConf.select(cfg, "data.source", default="world") == "world"  # filler phrases: the world's own
    for label, prefix in (("final test", "test/"), ("final eval", "eval/")):  # test prompts: the final figure
        line = figures_line(meta.get(prefix.rstrip("/")) or {}, prefix, f"{prefix[:-1]} prompt", world)
        if line:  # each figure ± its SE and the n of prompts it stands on
            lines.append(f"  {label} : {line}")
    for k, v in (meta.get("summary") or {}).items():
        lines.append(f"  {k:<11}: {v}")
    for warning in (small_n_warning(held_out_counts(meta)), gold_depth_warning(meta.get("eval") or {})):
        if warning:
            lines.append(f"  WARNING    : {warning}")
    uri = tracking_uri(configured_uri(cfg))
    from rlhf_lab.runs.tracking import ui_hint

    hint = ui_hint(uri, meta.get("experiment_id"), meta.get("run_id"))
    if hint:
        lines.append(f"  open the UI: {hint}")
    lines.append("=" * 72)
    return "\n".join(lines)


def skip_if_finished(cfg: DictConfig, identity: dict[str, str]) -> tuple[str, float | None]:
    """With ``skip_finished=true``: ``("skipped", its final gold, or its objective as a trial of
    ``hydra/sweeper=optuna``: :func:`rlhf_lab.entry.tune.trial_result`)`` when a FINISHED run of the job (same
    study, same overrides: :func:`rlhf_lab.runs.jobs.finished_runs`) computed what the job would: the same config,
    inputs and code (`identity`, :mod:`rlhf_lab.runs.identity`); ``("rerun", None)`` when the job has such runs but
    none did, after one line saying what changed since the latest; ``("ran", None)`` when it has none, or without
    ``skip_finished``. The kind is the job's mark for its sweep (:func:`rlhf_lab.entry.sweeps.mark_job`)."""
    if not cfg.get("skip_finished"):
        return "ran", None
    from rlhf_lab.runs.identity import changed_parts, rerun_reason
    from rlhf_lab.runs.jobs import finished_runs, hydra_overrides
    from rlhf_lab.stages.pipeline import run_settings

    runs = list(finished_runs(run_settings(cfg), str(cfg.algo.name), hydra_overrides()))
    if not runs:
        return "ran", None
    overrides = " ".join(hydra_overrides())
    for run in runs:
        if changed_parts(run.data.tags, identity) == []:
            print(f"[rlhf-lab] {cfg.algo.name} {overrides}: skipped (finished run {run.info.run_id})", flush=True)
            from rlhf_lab.entry.tune import trial_result

            return "skipped", trial_result(cfg, run.info.run_id, run.data.metrics.get("eval/gold_reward"), log=False)
    why = rerun_reason(runs[0], identity, to_plain(cfg), tracking_uri(configured_uri(cfg)))
    print(f"[rlhf-lab] {cfg.algo.name} {overrides}: rerun: {why}", flush=True)
    return "rerun", None


def joblib_worker() -> bool:
    """Whether this job runs in a worker process of the joblib launcher (``hydra/launcher=parallel``), where the
    CLI's ``main`` did not install the signal handlers. Ray's and submitit's workers handle their signals."""
    target = str(OmegaConf.select(HydraConfig.get(), "launcher._target_", default="") or "")
    return "joblib" in target and os.environ.get(SWEEP_PID_ENV, str(os.getpid())) != str(os.getpid())


FULL_ERROR = "HYDRA_FULL_ERROR"
USER_FULL_ERROR: list[str | None] = [None]  # the user's HYDRA_FULL_ERROR, put back once the config is composed


@hydra.main(config_path="pkg://rlhf_lab.conf", config_name="config", version_base="1.3")
def _app(cfg: DictConfig) -> float | None:
    entered = time.time()
    restore_full_error()  # composed: from here on Hydra reports a job's errors as it always does
    if joblib_worker():
        install_signal_handlers()  # a sweep's job in a joblib worker: a stop signal ends its run KILLED
    try:
        exit_on_bad_config(cfg)  # before anything loads: one line on stderr, exit status 2
        exit_on_unreachable_server(tracking_uri(configured_uri(cfg)))
        exit_on_broken_store(tracking_uri(configured_uri(cfg)))  # a new sqlite store: created once, under a lock
        quiet_libraries()
        with running(to_plain(cfg)) as identity:  # what the job computes, recorded on its run (rlhf_lab.runs.identity)
            kind, gold = skip_if_finished(cfg, identity)  # before any work: a resumed sweep runs only what is missing
            mark_job(kind)
            if kind == "skipped":
                return gold
            from rlhf_lab.stages import run_job

            threads = set_threads(cfg)
            out_dir = Path(HydraConfig.get().runtime.output_dir)
            t0 = start_job_clock(entered)  # time/startup_s, time/setup_s (runs.process.job_phases)
            try:
                meta = run_job(cfg, out_dir)
            finally:
                stop_job_clock()
            if meta.get("run_id"):  # the policy job's proxy-vs-gold figure in its run, drawn from the store
                from rlhf_lab.analysis.run_figure import log_job_figure
                from rlhf_lab.stages.pipeline import job_stage, run_settings

                log_job_figure(job_stage(cfg), run_settings(cfg).uri, meta["run_id"])
        if meta.get("run_id") and "experiment_id" not in meta:
            from rlhf_lab.runs import tracking

            meta["experiment_id"] = tracking.experiment_id(tracking_uri(configured_uri(cfg)), experiment_name(cfg))
        print(summary(cfg, meta, time.time() - t0, threads))
        from rlhf_lab.entry.tune import trial_result  # a trial of hydra/sweeper=optuna: its objective (tune.objective)

        # else for a sweeper: the eval gold (selection on eval, never test)
        return trial_result(cfg, meta.get("run_id"), (meta.get("eval") or {}).get("eval/gold_reward"))
    except Exception as err:
        # A single run fails (non-zero exit); in a multirun the failing job is logged and recorded (its
        # MLflow run is already FAILED) and the other jobs go on (rlhf_lab/entry/sweeps.py).
        from hydra.types import RunMode

        if HydraConfig.get().mode != RunMode.MULTIRUN:
            lost = server_failure_line(err, tracking_uri(configured_uri(cfg)))
            if lost and os.environ.get(FULL_ERROR) != "1":  # the tracking server gone: one line, as at start-up
                print(f"rlhf-lab: {lost}", file=sys.stderr)
                raise SystemExit(2) from None
            if isinstance(err, (DataError, ConfigError)) and os.environ.get(FULL_ERROR) != "1":
                # a data error, or a config error a stage finds (e.g. what the machine lacks): one line, exit 2
                print(f"rlhf-lab: {'data' if isinstance(err, DataError) else 'config'} error: {err}", file=sys.stderr)
                raise SystemExit(2) from None
            raise
        from rlhf_lab.entry.sweeps import record_failure

        record_failure(cfg, err)
        return None


def restore_full_error() -> None:
    if USER_FULL_ERROR[0] is None:
        os.environ.pop(FULL_ERROR, None)
    else:
        os.environ[FULL_ERROR] = USER_FULL_ERROR[0]


def main() -> None:
    previous = install_signal_handlers()  # SIGTERM/SIGINT: the open runs end KILLED, exit 128 + signal
    # Hydra raises its composition errors to us (instead of printing them over several lines and exiting 1): they are
    # config errors, one line and exit 2 like the others; HYDRA_FULL_ERROR=1 of the user keeps the traceback.
    USER_FULL_ERROR[0] = os.environ.get(FULL_ERROR)
    os.environ[FULL_ERROR] = "1"
    try:
        _app()
    except Exception as err:
        restore_full_error()
        end_failed_sweep(f"{type(err).__name__}: {str(err)[:300]}")  # a job's config or a launcher's error: stopped
        line = None if USER_FULL_ERROR[0] == "1" else composition_error_line(err)
        if line is None:
            raise
        print(f"rlhf-lab: config error: {line}", file=sys.stderr)
        raise SystemExit(2) from None
    except SystemExit as stop:
        if stop.code not in (None, 0):  # a sweep stopped by a job's exit (the tracking server gone): parent FAILED
            end_failed_sweep(f"the sweep stopped with exit status {stop.code}")
        raise
    except Interrupted as sig:
        # Ignored until the process is gone (never restored): nothing cuts the last cleanup short, whoever
        # re-installed which handler before, and a late Ctrl-C cannot turn exit 130 into Python's own SIGINT death.
        previous = {}
        ignore_signals()
        left: list[str] = []
        if "mlflow" in sys.modules:  # runs whose ending the signal cut short: KILLED, never left to MLflow's exit hook
            from rlhf_lab.runs.tracking import end_open_runs

            end_open_runs(f"{type(sig).__name__}: {sig}")
            left = end_interrupted_sweep(f"{type(sig).__name__}: {sig}", sig.signum)[1]  # a sweep: its jobs, its parent
        print(f"rlhf-lab: stopped by {sig}; the open MLflow runs are KILLED" + (
            f", except {len(left)} job run(s) whose process still runs or is on another host ({', '.join(left)}): the "
            "next rlhf-lab start in the experiment marks them KILLED once their process is gone" if left else ""),
            file=sys.stderr)
        raise SystemExit(sig.exit_code) from None
    finally:
        restore_signal_handlers(previous)


if __name__ == "__main__":
    main()
