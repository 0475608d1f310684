"""rlhf_lab/config/live_store.py: Hydra's repository copies share the ConfigStore, and every config composes as before."""

from __future__ import annotations

import copy
import importlib

import hydra
from hydra import initialize_config_module
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

JOBS = [["algo=ppo", "seed=3"], ["+frontier=grpo_0.3"], ["sweep=algo_frontier_equal", "+frontier_equal=dpo_0.1"],
        ["sweep=kl_estimators", "+kl_est=k3_loss"], ["hydra/launcher=parallel", "algo=dpo"]]


def composed() -> list:
    compose = getattr(hydra.compose, "real", hydra.compose)  # not the tests' memo (tests/compose_memo.py)
    with initialize_config_module("rlhf_lab.conf", version_base="1.3"):
        return [OmegaConf.to_container(compose("config", overrides=job, return_hydra_config=True), resolve=False)
                for job in JOBS]


def test_a_copy_of_the_config_store_is_the_store_and_configs_compose_as_with_hydras_copies(monkeypatch):
    importlib.import_module("rlhf_lab.conf")  # registers the lab's configs and calls live_store.share(), as composing does
    store = ConfigStore.instance()
    assert copy.deepcopy(store) is store and copy.deepcopy({"s": store})["s"] is store
    shared = composed()
    monkeypatch.delattr(ConfigStore, "__deepcopy__")  # Hydra's own behaviour: each copy copies every stored node
    assert copy.deepcopy(store) is not store
    assert composed() == shared
