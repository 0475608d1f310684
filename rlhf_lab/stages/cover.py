"""Stage ``cover``: a policy that hacked a proxy RM, whose samples a gold RM learns from (``gold.build.covers``).

A gold RM trained on SFT samples alone rates the text a hacked policy writes as it rates nothing it has seen (at β = 0
its rank agreement with the formula was 0.24 [-0.26, 0.63] per run, reports/gold_recipes); the recipe that met the bar
adds the samples of policies that hacked *other* proxies. A cover is PPO with the settings of
:func:`rlhf_lab.stages.gold.cover_config` (its key: that whole config), its run in study ``gold_cover``; the folder
holds the policy that ``data.on_policy_path`` reads, without PPO's training checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from rlhf_lab.config.keys import computed_plain, to_plain
from rlhf_lab.stages import ppo

WHAT = "cover policy (a policy that hacked a proxy RM, for the gold RM's pairs)"


def spec(cfg: DictConfig) -> dict:
    """PPO's spec (its SFT policy, seed, steps) and the whole config the cover trains with (its proxy, β, gold)."""
    return {**ppo.spec(cfg), "config": computed_plain(to_plain(cfg))}


def build(cfg: DictConfig, out_dir: Path, spec: dict) -> dict:
    meta = ppo.build(cfg, out_dir, {k: v for k, v in spec.items() if k != "config"})
    (Path(out_dir) / "ppo_last.ckpt").unlink(missing_ok=True)  # the policy is what a gold reads: no optimiser state
    return meta
