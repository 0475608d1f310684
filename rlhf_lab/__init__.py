"""rlhf-lab: RLHF experiments (reward models, PPO, DPO) on a world with a known gold reward."""

__version__ = "0.1.0"
