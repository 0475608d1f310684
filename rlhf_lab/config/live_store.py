"""Hydra's copies of its config repository share the one ConfigStore instead of copying it (Hydra's own later fix).

Hydra 1.3 deep-copies its config repository at every composition and for every group ``--help`` lists, and the
repository holds the ConfigStore singleton, so each copy copied every stored node (the schemas, the 40 frontier
points): about 20 ms of CPU a composition, 4.7 of the 7 s of CPU that ``rlhf-lab --help`` took. Hydra's main branch
asks ``ConfigStore.instance()`` instead (facebookresearch/hydra pull request 2928); :func:`share` does the same for
the installed Hydra. What composes is unchanged: the lab registers its configs before any composition, and
``ConfigStore.load`` hands out a copy of the node it returns.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore


def share() -> None:
    """Make ``copy.deepcopy`` of Hydra's ConfigStore return the store itself (once)."""
    if "__deepcopy__" not in ConfigStore.__dict__:
        ConfigStore.__deepcopy__ = lambda self, memo: self
