"""The points of the ``frontier`` group (``sweep=algo_frontier``): ``+frontier=<algo>_<β>`` is the algorithm's file
of ``conf/frontier/`` (``rl.yaml`` for PPO, GRPO and RLOO, ``dpo.yaml``) with its β set, registered in Hydra's
ConfigStore when ``rlhf_lab.conf`` is imported (as the schemas are), so that a point is one line of :data:`POINTS`
instead of a file. ``+frontier=bon`` is a file of its own (no β). The group ``frontier_equal`` (``sweep=algo_frontier_equal``) holds
the same points at equal gradient updates, from ``conf/frontier_equal/``."""

from __future__ import annotations

from typing import Any

import yaml
from hydra.core.config_store import ConfigStore

BETAS = ("0.01", "0.03", "0.1", "0.3", "1")  # as typed in the option names (and parsed as YAML: 1 is 1, not 1.0)
# {algorithm: (its file in conf/frontier/, the key that holds its β)}
POINTS: dict[str, tuple[str, str]] = {"ppo": ("rl", "kl.beta"), "grpo": ("rl", "kl.beta"), "rloo": ("rl", "kl.beta"),
                                      "dpo": ("dpo", "algo.beta")}
PACKAGE = "# @package _global_"


def point(text: str, algo: str, key: str, beta: str) -> dict[str, Any]:
    """The config of one point: the algorithm file's `text` (``# @package _global_``) with ``algo=<algo>`` chosen
    (before its ``_self_``) and `key` set to `beta`."""
    if not text.startswith(PACKAGE):
        raise ValueError(f"a frontier file must start with {PACKAGE!r}")
    node = yaml.safe_load(text)
    defaults = [d for d in node.get("defaults", []) if not (isinstance(d, dict) and "override /algo" in d)]
    defaults.insert(defaults.index("_self_") if "_self_" in defaults else len(defaults), {"override /algo": algo})
    node["defaults"] = defaults
    *parents, leaf = key.split(".")
    at = node
    for p in parents:
        at = at.setdefault(p, {})
    at[leaf] = yaml.safe_load(beta)
    return node


def register(folder, group: str) -> None:
    """Store every point of :data:`POINTS` × :data:`BETAS` as option ``<algo>_<β>`` of `group`; `folder`: its files
    (``conf/frontier``, ``conf/frontier_equal``; a path or an importlib.resources traversable)."""
    cs = ConfigStore.instance()
    texts = {name: folder.joinpath(f"{name}.yaml").read_text() for name in {f for f, _ in POINTS.values()}}
    for algo, (name, key) in POINTS.items():
        for beta in BETAS:
            cs.store(group=group, name=f"{algo}_{beta}", node=point(texts[name], algo, key, beta),
                     package="_global_")
