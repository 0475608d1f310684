"""Tuning with Hydra's Optuna sweeper: ``rlhf-lab -m hydra/sweeper=optuna <search space>`` (its settings:
:mod:`rlhf_lab.config.sweeper`).

:class:`OptunaSweeper` wraps the ``hydra-optuna-sweeper`` plugin's sweeper (the ``tune`` extra) with: the ``tune``
settings checked before any trial (:func:`check_tune`); ``hydra.sweeper.n_jobs: null``, a batch of as many trials as
the launcher runs at once; and the best trial printed and recorded on the sweep's parent run (metric
``tune/best_objective``, tags ``rlhf_lab.tune.objective`` and ``rlhf_lab.tune.best``). Each trial is one job of the
task function, which returns :func:`trial_result`: the objective computed from the run's histories in the store
(:mod:`rlhf_lab.evaluation.objective`), logged as ``tune/objective`` and ``tune/step``.

``skip_finished=true`` on a relaunch: a trial whose job has a finished run that computed the same is skipped and its
objective read back from the store, the number the first launch told Optuna; with Optuna's in-memory storage the
same sampler seed and values then propose the same trials, so the sweep runs on from the first missing, failed or
changed one. Optuna's own persistent study (``hydra.sweeper.storage``) is refused where SQLAlchemy 2 is installed
(:func:`check_storage`)."""

from __future__ import annotations

import inspect
import math
import os
import sys
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf

from rlhf_lab.config.errors import ConfigError
from rlhf_lab.config.keys import configured_uri, to_plain
from rlhf_lab.config.sweeper import SWEEPER
from rlhf_lab.evaluation.objective import KEYS, Objective, trial_value
from rlhf_lab.evaluation.ship import SHIP_RULES
from rlhf_lab.runs.tracking_server import tracking_uri

INSTALL = "pip install 'rlhf-lab[tune]'"  # the extra with hydra-optuna-sweeper


def check_tune(tune: dict | None) -> None:
    """The ``tune`` settings (conf/config.yaml): a known objective and ship rule, the rule's parameters (those of its
    function but the run), a KL cost ≥ 0. Raises :class:`~rlhf_lab.config.errors.ConfigError` naming the key."""
    tune = tune or {}
    if str(tune.get("objective")) not in Objective.__members__:
        raise ConfigError("tune.objective", tune.get("objective"), f"one of {', '.join(Objective)}")
    if str(tune.get("rule")) not in SHIP_RULES:
        raise ConfigError("tune.rule", tune.get("rule"), f"one of {', '.join(SHIP_RULES)}")
    params = tune.get("params") or {}
    taken = list(inspect.signature(SHIP_RULES[str(tune["rule"])]).parameters.values())[1:]  # after the run's Curve
    needed = {p.name for p in taken if p.default is inspect.Parameter.empty}
    if not isinstance(params, dict) or not needed <= set(params) <= {p.name for p in taken}:
        names = ", ".join(p.name for p in taken) or "none"
        raise ConfigError("tune.params", tune.get("params"), f"the parameters of tune.rule={tune['rule']} ({names}; "
                          f"needed: {', '.join(sorted(needed)) or 'none'})")
    cost = tune.get("kl_cost")
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not cost >= 0:
        raise ConfigError("tune.kl_cost", cost, "a number >= 0")


def is_tuning() -> bool:
    """Whether this job is a trial of :class:`OptunaSweeper` (``hydra/sweeper=optuna``)."""
    try:
        target = OmegaConf.select(HydraConfig.get(), "sweeper._target_", default="")
    except ValueError:  # no Hydra app
        return False
    return target == SWEEPER


def trial_result(cfg: DictConfig, run_id: str | None, other: float | None, log: bool = True) -> float | None:
    """What the task function returns for its job's run `run_id`: under ``hydra/sweeper=optuna`` the trial's
    objective (``tune``: :func:`rlhf_lab.evaluation.objective.trial_value` on the run's histories, read from the
    store), logged on the run as ``tune/objective`` and ``tune/step`` when `log`; otherwise `other`."""
    if not is_tuning() or not run_id:
        return other
    from mlflow.tracking import MlflowClient

    tune = to_plain(cfg.tune)
    client = MlflowClient(tracking_uri=tracking_uri(configured_uri(cfg)))
    logged = client.get_run(run_id).data.metrics
    histories = {k: [(int(m.step), float(m.value)) for m in client.get_metric_history(run_id, k)]
                 for k in KEYS if k in logged}
    tv = trial_value(histories, tune["objective"], tune["rule"], tune.get("params"), float(tune["kl_cost"]))
    if log and math.isfinite(tv.value):
        client.log_metric(run_id, "tune/objective", tv.value, step=0)
        client.log_metric(run_id, "tune/step", tv.step, step=0)
    print(f"[rlhf-lab] tune: objective {tune['objective']} = {tv.value:.4f}: {tv.measure} (step {tv.step}), "
          f"run {run_id}", flush=True)
    return tv.value


def check_storage(storage: str | None) -> None:
    """``hydra.sweeper.storage``: Optuna 2.10 (the plugin pins optuna < 3) opens no database with SQLAlchemy 2 (its
    schema check fails), so a storage is refused in one line where SQLAlchemy 2 is installed."""
    if storage is None:
        return
    from importlib.metadata import version

    if int(version("sqlalchemy").split(".")[0]) >= 2:
        raise ConfigError("hydra.sweeper.storage", storage, "null here (Optuna 2.10, which hydra-optuna-sweeper pins, "
                          "cannot open a database with SQLAlchemy 2): resume with skip_finished=true instead")


def launcher_batch(launcher: dict) -> int:
    """How many trials the launcher runs at once: joblib's ``n_jobs`` (≤ 0: one per core), else 1."""
    n = launcher.get("n_jobs")
    if n is None:
        return 1
    return int(n) if int(n) > 0 else (os.cpu_count() or 1)


class OptunaSweeper(Sweeper):
    """``hydra/sweeper=optuna``: the ``hydra-optuna-sweeper`` plugin's sweeper and the lab's additions (module
    docstring). Takes the plugin's settings (:class:`rlhf_lab.config.sweeper.OptunaSettings`), its sampler as a config
    it instantiates itself; ``n_jobs: null`` is the launcher's."""

    def __init__(self, sampler: Any, n_jobs: int | None = None, **settings: Any) -> None:
        try:
            from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper as Plugin
        except ImportError:
            print(f"rlhf-lab: config error: hydra/sweeper=optuna needs the hydra-optuna-sweeper plugin: {INSTALL}",
                  file=sys.stderr)
            raise SystemExit(2) from None
        from hydra.utils import instantiate

        self.n_jobs = n_jobs
        self.plugin = Plugin(sampler=instantiate(sampler), n_jobs=n_jobs or 1, **settings)
        self.config: DictConfig | None = None

    def setup(self, *, hydra_context, task_function, config: DictConfig) -> None:
        try:
            check_tune(to_plain(config.get("tune")))
            check_storage(config.hydra.sweeper.get("storage"))
        except ConfigError as err:
            print(f"rlhf-lab: config error: {err}", file=sys.stderr)
            raise SystemExit(2) from None
        self.config = config
        self.plugin.setup(hydra_context=hydra_context, task_function=task_function, config=config)
        if self.n_jobs is None:  # the plugin's implementation holds the batch size
            launcher = OmegaConf.to_container(config.hydra.launcher, resolve=True) if config.hydra.launcher else {}
            self.plugin.sweeper.n_jobs = launcher_batch(launcher)

    def sweep(self, arguments: list[str]) -> None:
        from rlhf_lab.runs.states import OPEN_SWEEP

        tune = to_plain(self.config.tune)
        parent = dict(OPEN_SWEEP)
        what = f"{tune['objective']} (rule {tune['rule']}, kl_cost {tune['kl_cost']})"
        self._tag_parent(parent, {"rlhf_lab.tune.objective": what})
        try:
            self.plugin.sweep(arguments)
        except ValueError as err:  # Optuna's best_trial: no trial completed (each failure is in the jobs' records)
            if "No trials are completed" not in str(err):
                raise
            print("[rlhf-lab] optuna: no trial completed, no best trial", flush=True)
            return
        results = OmegaConf.load(Path(str(self.config.hydra.sweep.dir)) / "optimization_results.yaml")
        best = " ".join(f"{k}={v}" for k, v in results.best_params.items())
        n = self.plugin.sweeper.n_trials
        print(f"[rlhf-lab] optuna: best trial {best}: tune/objective {float(results.best_value):.4f} "
              f"(objective {what}; {n} trial{'s' * (n != 1)})", flush=True)
        self._tag_parent(parent, {"rlhf_lab.tune.best": best}, float(results.best_value))

    @staticmethod
    def _tag_parent(parent: dict, tags: dict[str, str], best: float | None = None) -> None:
        if not parent.get("run_id"):  # the sweep callback is off: no parent run
            return
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=parent["uri"])
        for k, v in tags.items():
            client.set_tag(parent["run_id"], k, v[:5000])
        if best is not None and math.isfinite(best):
            client.log_metric(parent["run_id"], "tune/best_objective", best)
