"""The tests' compose (tests/compose_memo.py): a repeated composition is an equal, independent copy; a config folder
of one's own is composed every time."""

from __future__ import annotations

import hydra
from hydra import initialize_config_dir, initialize_config_module
from omegaconf import OmegaConf


def test_a_repeated_composition_is_an_equal_copy_and_a_folder_of_ones_own_is_read_again(tmp_path):
    assert hasattr(hydra.compose, "real")  # conftest installed it
    with initialize_config_module("rlhf_lab.conf", version_base="1.3"):
        first = hydra.compose("config", overrides=["algo=dpo", "seed=11"])
        first.seed = 12
        again = hydra.compose("config", overrides=["algo=dpo", "seed=11"])
        assert again.seed == 11 and again is not first
        fresh = hydra.compose.real("config", overrides=["algo=dpo", "seed=11"])
        assert OmegaConf.to_container(again) == OmegaConf.to_container(fresh)
    (tmp_path / "c.yaml").write_text("x: 1\n")
    with initialize_config_dir(str(tmp_path), version_base="1.3"):
        assert hydra.compose("c").x == 1
        (tmp_path / "c.yaml").write_text("x: 2\n")
        assert hydra.compose("c").x == 2
