"""GRPO, RLOO and best-of-n jobs, and the PPO config checks they rely on (tiny sizes)."""

from __future__ import annotations

import pytest

from rlhf_lab import stages
from rlhf_lab.stages import ppo as ppo_stage


def _no_models(*args, **kwargs):
    raise AssertionError("a model or upstream stage was loaded before the config check")


@pytest.mark.parametrize("algo", ["ppo"])
def test_kl_in_loss_with_k1_fails_before_any_model_loads(tiny_cfg, tmp_path, monkeypatch, algo):
    monkeypatch.setattr(ppo_stage, "ensure", _no_models)
    monkeypatch.setattr(ppo_stage, "load_reward", _no_models)
    with pytest.raises(ValueError, match=r"algo\.kl_in=loss with algo\.kl_estimator=k1"):
        stages.run_job(tiny_cfg(f"algo={algo}", "algo.kl_in=loss", "algo.kl_estimator=k1"), tmp_path)
