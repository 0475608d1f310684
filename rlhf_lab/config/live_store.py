"""Hydra's copies of its config repository share the one ConfigStore instead of copying it (Hydra's own later fix).

Hydra 1.3 copies its config repository (``copy.deepcopy``) at every composition and for every config group that
``--help`` lists, and the repository's structured-config source holds the ConfigStore singleton, so every copy
copied every node stored there: with the lab's schemas and the 40 frontier points (rlhf_lab/config/frontier.py),
about 20 ms of CPU a composition, and 4.7 of the 7 s of CPU that ``rlhf-lab --help`` took (176 copies; 2.3 s
now). Hydra's main branch no longer keeps the store on the source and asks ``ConfigStore.instance()`` each time
(facebookresearch/hydra pull request 2928, which also notes that a copy of the singleton is a second store).
:func:`share` gives the same behaviour to the installed Hydra: a deep copy of the ConfigStore is the ConfigStore.
What composes is unchanged: the copy held the same nodes as the singleton (the lab registers its configs when
``rlhf_lab.conf`` is imported, before any composition), and ``ConfigStore.load`` hands out a copy of the node it
returns.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore


def share() -> None:
    """Make ``copy.deepcopy`` of Hydra's ConfigStore return the store itself (once)."""
    if "__deepcopy__" not in ConfigStore.__dict__:
        ConfigStore.__deepcopy__ = lambda self, memo: self
