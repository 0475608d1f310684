"""The config as the rest of the package sees it: plain containers (:func:`to_plain`, resolved, for cache keys,
MLflow params and the typed settings a stage hands down), and which keys compute nothing (:data:`NOT_COMPUTED`,
:func:`computes`, :func:`drop_keys`). Also the resolver ``${rlhf_lab.launch_dir:}`` (registered on import): the
folder a multirun is launched from, cached, so that a job on a Ray or SLURM worker writes its Hydra output folder
under the launch folder (``hydra.sweep.dir`` in conf/config.yaml), not under its own working folder."""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf


def launch_dir() -> str:
    """``${rlhf_lab.launch_dir:}``: the working folder where it is first resolved. Registered with Hydra's
    ``use_cache`` (like ``${now:}``): a launcher resolves ``hydra.sweep.dir`` in the process that launches the sweep
    and copies that config's resolver cache into every job's config (``load_sweep_config``), and the cache travels
    with the pickled config, so a job on another machine resolves the launch folder, not its own."""
    return os.getcwd()


if not OmegaConf.has_resolver("rlhf_lab.launch_dir"):  # on import: a Ray worker resolves the job's config too
    OmegaConf.register_new_resolver("rlhf_lab.launch_dir", launch_dir, use_cache=True)


# the config keys that do not change what a job computes (where it logs, how it shows progress, an explicit resume,
# the input's size bounds, which only refuse data, what a tuning trial returns): left out of a pre-empted job's
# checkpoint key (stages/ppo.py) and of a run's setting in the reports (analysis/study_runs.py)
NOT_COMPUTED = ("tracking", "skip_finished", "study", "tune", "cache_dir", "trainer.progress_bar", "algo.resume_from",
                "eval.reuse_start", "data.max_line_bytes", "data.max_total_bytes")


# keys added after runs and artifacts were made, each with the value that does what the code did before it existed:
# left out of a job's config digest, its pre-emption checkpoint key and the cache keys that hold the whole config
# (computed_plain) while they hold it, so adding one changed no earlier job's identity or key
ADDED_OFF = {"eval.test_each_eval": False, "eval.save_checkpoints": False, "reward_model.heldout": False,
             "algo.shared_prompt": False}


def computed_plain(plain: dict, also=()) -> dict:
    """`plain` (a config as plain containers, changed in place and returned) without :data:`NOT_COMPUTED`, the dotted
    keys `also`, and the :data:`ADDED_OFF` keys that hold their old value: what a job computes."""
    drop_keys(plain, (*NOT_COMPUTED, *also))
    for key, off in ADDED_OFF.items():
        *parents, last = key.split(".")
        node = plain
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and last in node and node[last] == off:
            del node[last]
    return plain


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


def override_key(key: str) -> str:
    """The config key of a command-line override (``+key`` / ``~key`` / ``key``)."""
    return key.lstrip("+~")


def to_plain(x: Any) -> Any:
    """An OmegaConf node as plain (resolved) dicts and lists, a choice (a StrEnum-typed key) as its name, which is its
    value (the text it had before the schema typed it: cache keys, job digests and params stay as they were); anything
    else is returned as it is."""
    if isinstance(x, (DictConfig, ListConfig)):
        return OmegaConf.to_container(x, resolve=True, enum_to_str=True)
    return x


def configured_uri(cfg: Any) -> str | None:
    """``tracking.uri`` of a config, or None (the store is then ``MLFLOW_TRACKING_URI`` or the default:
    :func:`rlhf_lab.runs.tracking_server.tracking_uri`)."""
    t = cfg.get("tracking") if cfg is not None else None
    return str(t.uri) if t and t.get("uri") else None


def experiment_name(cfg: Any) -> str:
    """``tracking.experiment`` of a config (``rlhf-lab`` when it has no ``tracking`` group)."""
    return str(cfg.tracking.experiment) if cfg.get("tracking") else "rlhf-lab"
