"""``hydra/sweeper=optuna``: the settings of the lab's Optuna sweeper (:class:`rlhf_lab.entry.tune.OptunaSweeper`), as
structured configs in Hydra's ConfigStore, where the ``hydra-optuna-sweeper`` plugin (the ``tune`` extra) stores its
own under the same names.

    rlhf-lab -m sweep=tune_ppo                                              # the canned example (sweeps/sweep/)
    rlhf-lab -m hydra/sweeper=optuna kl=fixed 'kl.beta=interval(0,0.3)' 'algo.lr=tag(log,interval(1e-5,1e-3))'

The plugin's own minimises, with an unseeded sampler and two trials per batch; the lab's maximises the trial's
objective (a reward: ``tune`` in conf/config.yaml), seeds TPE (the same results give the same trials), batches as
many trials as the launcher runs at once and wraps the plugin's sweeper (:mod:`rlhf_lab.entry.tune`). A YAML file
cannot replace a plugin's structured config (Hydra 1.3 refuses to match it against a schema with a defaults list), so
:func:`register` stores these nodes over the plugin's after Hydra's plugin scan (which runs once per process); the
plugin's other samplers (``random``, ``cmaes``, ``grid``, ...) stay as it stores them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

# the sweeper's class: Hydra instantiates sweepers only from its plugin package (hydra_plugins/rlhf_lab_tune/), a
# subclass of rlhf_lab.entry.tune.OptunaSweeper
SWEEPER = "hydra_plugins.rlhf_lab_tune.sweeper.OptunaSweeper"


@dataclass
class SeededTPE:
    """Optuna's TPE sampler with a fixed seed; its first ``n_startup_trials`` trials are drawn at random."""

    _target_: str = "optuna.samplers.TPESampler"
    seed: Optional[int] = 0
    n_startup_trials: int = 10
    multivariate: bool = False


@dataclass
class OptunaSettings:
    """The keys of the plugin's ``hydra/sweeper=optuna`` (hydra.cc/docs/plugins/optuna_sweeper) with the lab's
    defaults. ``_recursive_: false``: the sweeper instantiates its sampler itself, once it knows the plugin is
    installed (else one line saying how to install it)."""

    _target_: str = SWEEPER
    _recursive_: bool = False
    defaults: List[Any] = field(default_factory=lambda: [{"sampler": "tpe"}])
    sampler: Any = MISSING
    direction: Any = "maximize"  # the objective is a reward
    n_trials: int = 20
    n_jobs: Optional[int] = None  # trials per batch asked of Optuna: None = as many as the launcher runs at once
    storage: Optional[Any] = None  # in memory (Optuna 2.10 opens no database with SQLAlchemy 2: entry/tune.py)
    study_name: Optional[str] = None
    max_failure_rate: float = 0.0  # the plugin's; a failed trial is told to Optuna as failed and the others go on
    search_space: Optional[Dict[str, Any]] = None  # the plugin's deprecated form of params
    custom_search_space: Optional[str] = None
    params: Optional[Dict[str, str]] = None  # the search space: {key: interval(a,b) | int(interval(a,b)) | choice(...)}


def register() -> None:
    """Store :class:`OptunaSettings` as ``hydra/sweeper/optuna`` and :class:`SeededTPE` as
    ``hydra/sweeper/sampler/tpe``, after Hydra's plugin scan (run here if it has not run yet) stored the plugin's."""
    from hydra.core.plugins import Plugins

    Plugins.instance()  # the scan: it stores the plugin's nodes (when installed), which these replace
    cs = ConfigStore.instance()
    cs.store(group="hydra/sweeper", name="optuna", node=OptunaSettings, provider="rlhf_lab")
    cs.store(group="hydra/sweeper/sampler", name="tpe", node=SeededTPE, provider="rlhf_lab")
