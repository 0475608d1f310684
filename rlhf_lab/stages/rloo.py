"""Stage ``rloo``: RLOO (Ahmadian et al. 2024) of the SFT policy against the frozen reward model.

Wiring only: the PPO stage (:mod:`rlhf_lab.stages.ppo`) and :class:`rlhf_lab.algorithms.ppo.PPOModule`
with RLOO's settings from ``conf/algo/rloo.yaml`` (k samples per prompt, leave-one-out baseline, β·KL in the
reward, REINFORCE on the sequence, optional PPO clipping, no critic). The run is tagged ``rlhf_lab.stage=rloo``.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from rlhf_lab.stages import ppo

WHAT = "RLOO policy"
CACHED = False


def check_config(algo: DictConfig) -> None:
    """RLOO's defining settings: the leave-one-out baseline over k >= 2 samples and no critic."""
    if str(algo.critic) != "none" or str(algo.baseline) != "loo" or int(algo.samples_per_prompt) < 2:
        raise ValueError(f"algo=rloo needs algo.critic=none, algo.baseline=loo and algo.samples_per_prompt >= 2, "
                         f"got critic={algo.critic}, baseline={algo.baseline}, "
                         f"samples_per_prompt={algo.samples_per_prompt}")


def spec(cfg: DictConfig) -> dict:
    check_config(cfg.algo)
    return ppo.spec(cfg, "rloo")


def build(cfg: DictConfig, out_dir: Path, spec: dict) -> dict:
    return ppo.build(cfg, out_dir, spec, "rloo")
