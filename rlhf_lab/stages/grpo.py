"""Stage ``grpo``: GRPO (Shao et al. 2024) of the SFT policy against the frozen reward model.

Wiring only: the PPO stage (:mod:`rlhf_lab.stages.ppo`) and :class:`rlhf_lab.algorithms.ppo.PPOModule`
with GRPO's settings from ``conf/algo/grpo.yaml`` (G samples per prompt, group-normalised advantages, no
critic, k3 KL in the loss, fixed β = 0.04 via ``kl/grpo``). The run is tagged ``rlhf_lab.stage=grpo``.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from rlhf_lab.stages import ppo

WHAT = "GRPO policy"
CACHED = False


def spec(cfg: DictConfig) -> dict:
    return ppo.spec(cfg, "grpo")


def build(cfg: DictConfig, out_dir: Path, spec: dict) -> dict:
    return ppo.build(cfg, out_dir, spec, "grpo")
