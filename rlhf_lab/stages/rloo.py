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


def spec(cfg: DictConfig) -> dict:
    return ppo.spec(cfg, "rloo")


def build(cfg: DictConfig, out_dir: Path, spec: dict) -> dict:
    return ppo.build(cfg, out_dir, spec, "rloo")
