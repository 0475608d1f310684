"""GRPO, RLOO and best-of-n jobs, and the PPO config checks they rely on (tiny sizes)."""

from __future__ import annotations

import math

import mlflow
import pytest
import torch

from rlhf_lab import stages
from rlhf_lab.stages import ppo as ppo_stage
from tests.conftest import compose_cfg

TINY_RL = ["algo.reward=gold", "algo.steps=2", "algo.batch_size=8", "eval.every_n_steps=0",
           "generation.max_new_tokens=12", "eval.n_prompts=8", "trainer.threads=1"]


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _history(db, run_id, key):
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    return {m.step: m.value for m in mlflow.tracking.MlflowClient().get_metric_history(run_id, key)}


def _tag(db, run_id, key):
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    return mlflow.tracking.MlflowClient().get_run(run_id).data.tags.get(key)


def _no_models(*args, **kwargs):
    raise AssertionError("a model or upstream stage was loaded before the config check")


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_kl_in_loss_with_k1_fails_before_any_model_loads(tiny_cfg, tmp_path, monkeypatch, algo):
    monkeypatch.setattr(ppo_stage, "ensure", _no_models)
    monkeypatch.setattr(ppo_stage, "load_reward", _no_models)
    with pytest.raises(ValueError, match=r"algo\.kl_estimator must be k2 or k3 with algo\.kl_in=loss"):
        stages.run_job(tiny_cfg(f"algo={algo}", "algo.kl_in=loss", "algo.kl_estimator=k1"), tmp_path)


@pytest.mark.parametrize("algo, overrides, match", [
    ("grpo", ["algo.critic=policy"], "algo.critic must be none with algo=grpo"),
    ("rloo", ["algo.baseline=mean"], "algo.baseline must be loo with algo=rloo"),
    ("bon", ["algo.n_max=6"], "power of two"),
])
def test_bad_config_fails_before_any_model_loads(tiny_cfg, tmp_path, monkeypatch, algo, overrides, match):
    monkeypatch.setattr(ppo_stage, "ensure", _no_models)
    with pytest.raises(ValueError, match=match):
        stages.run_job(tiny_cfg(f"algo={algo}", *overrides), tmp_path)


def test_grpo_and_rloo_are_the_ppo_stage_under_their_own_name():
    """Registry aliases (no module of their own): the PPO stage's code, their own name for the run's tag, seed, steps
    and resume key (what the committed runs of algo=grpo/rloo jobs were made under)."""
    from rlhf_lab.stages.pipeline import ALIASES, JOBS, stage_module

    for name in ("grpo", "rloo"):
        cfg = compose_cfg([f"algo={name}"])
        assert ALIASES[name] == "ppo" and name in JOBS and stage_module(name) is ppo_stage
        assert ppo_stage.stage_name(cfg) == name
    assert ppo_stage.stage_name(compose_cfg([])) == "ppo"


@pytest.mark.slow
def test_grpo_job_kl_in_the_loss_and_group_metrics(tiny_cfg, tmp_path):
    db = tmp_path / "mlflow.db"
    cfg = tiny_cfg("algo=grpo", *TINY_RL, "algo.samples_per_prompt=4", mlflow_db=db)
    assert (cfg.kl.name, cfg.kl.beta, cfg.algo.kl_estimator, cfg.algo.kl_in) == ("fixed", 0.04, "k3", "loss")
    meta = stages.run_job(cfg, tmp_path / "g")
    run = meta["run_id"]
    assert meta["stage"] == "grpo" and _tag(db, run, "rlhf_lab.stage") == "grpo"
    for step in (1, 2):
        # the KL is in the loss: not in the reward
        assert _history(db, run, "objective/non_score_reward")[step] == 0.0
        assert _history(db, run, "objective/rlhf_reward")[step] == pytest.approx(
            _history(db, run, "objective/scores_shaped")[step])
        assert 0.0 <= _history(db, run, "group/tie_frac")[step] <= 1.0
    for k in ("loss/kl", "group/reward_std", "policy/clipfrac"):
        assert _history(db, run, k), k
    assert _history(db, run, "val/explained_variance") == {}  # no critic


@pytest.mark.slow
def test_rloo_job_kl_in_the_reward(tiny_cfg, tmp_path):
    db = tmp_path / "mlflow.db"
    meta = stages.run_job(tiny_cfg("algo=rloo", *TINY_RL, "algo.samples_per_prompt=2", "kl=fixed", "kl.beta=0.5",
                                   mlflow_db=db), tmp_path / "r")
    run = meta["run_id"]
    assert meta["stage"] == "rloo" and _tag(db, run, "rlhf_lab.stage") == "rloo"
    for step in (1, 2):
        kl = _history(db, run, "objective/kl")[step]
        assert _history(db, run, "objective/non_score_reward")[step] == pytest.approx(-0.5 * kl, abs=1e-6)
        assert _history(db, run, "objective/rlhf_reward")[step] == pytest.approx(
            _history(db, run, "objective/scores_shaped")[step] - 0.5 * kl, abs=1e-6)
    assert _history(db, run, "loss/kl") == {}


@pytest.mark.slow
def test_bon_job_curve(tiny_cfg, tmp_path):
    db = tmp_path / "mlflow.db"
    cfg = tiny_cfg("algo=bon", "algo.n_max=4", "algo.batch_size=16", "eval.n_prompts=4", "generation.max_new_tokens=12",
                   "reward_model.steps=10", "data.n_train=64", "data.n_eval=32", "reward_model.norm_samples=64",
                   mlflow_db=db)
    meta = stages.run_job(cfg, tmp_path / "b")
    run = meta["run_id"]
    assert _tag(db, run, "rlhf_lab.stage") == "bon"
    kl, proxy, gold = (_history(db, run, f"bon/{k}") for k in ("kl", "proxy_reward", "gold_reward"))
    assert set(kl) == set(proxy) == set(gold) == {1, 2, 4}
    assert kl == pytest.approx({1: 0.0, 2: math.log(2) - 0.5, 4: math.log(4) - 0.75})
    assert proxy[1] <= proxy[2] + 1e-9 <= proxy[4] + 2e-9  # the expected maximum grows with n
    # each gold point has its standard error over the 4 prompts: sd of the per-prompt values / √4
    se = _history(db, run, "bon/gold_reward_se")
    assert set(se) == {1, 2, 4} and all(math.isfinite(v) and 0 <= v < 2 for v in se.values())
    line = meta["summary"]["eval gold"]
    assert "± " in line and "(n=4 eval prompts, ± SE over prompts)" in line
    assert "(best of 1) -> " in line  # the n of best-of-n is not the n of a figure (issue 68)
