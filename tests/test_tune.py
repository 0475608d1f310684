"""Tuning without gold (issue 67, item 6): a trial's objective (rlhf_lab/evaluation/objective.py) against hand
computations, the ``tune`` checks and the launcher's batch (rlhf_lab/entry/tune.py), ``hydra/sweeper=optuna``'s settings
(rlhf_lab/config/sweeper.py), the studies tune_ppo and tune_goodhart_* (sweeps/sweep/), and a tiny Optuna sweep end to
end as a process (slow)."""

from __future__ import annotations

import math
import os
import re

import mlflow
import pytest
from omegaconf import OmegaConf

from rlhf_lab.config.errors import ConfigError
from rlhf_lab.entry.tune import check_tune, launcher_batch
from rlhf_lab.evaluation import objective as O

# a run of 4 evaluations: the proxy climbs while KL grows; the training batches' proxy logged every step
STEPS = (0, 10, 20, 30)
HIST = {
    "eval/kl": [(0, 0.0), (10, 1.0), (20, 4.0), (30, 16.0)],
    "eval/proxy_reward": [(0, 0.0), (10, 0.4), (20, 0.9), (30, 1.5)],
    "eval/gold_reward": [(0, 0.1), (10, 0.3), (20, 0.35), (30, 0.2)],
    "objective/scores": [(1, 0.0), (5, 0.2), (10, 0.4), (15, 0.6), (20, 0.8), (25, 1.4), (30, 1.6)],
}
RULE, PARAMS = "proxy_minus_sqrt_kl", {"cost": 0.2}


def test_interval_means_are_the_training_proxy_since_the_previous_evaluation():
    # at the start: the first batch after step 0 (the start policy's samples); then the mean over (t_{i-1}, t_i]
    assert O.interval_means(HIST["objective/scores"], STEPS) == pytest.approx([0.0, 0.2, 0.7, 1.5])
    assert math.isnan(O.interval_means([(1, 1.0)], (0, 10, 20))[2])  # no batch in (10, 20]


def test_the_curve_reads_the_training_proxy_else_the_eval_proxy_and_only_complete_signals():
    c = O.run_curve(HIST)
    assert c.steps == STEPS and c.proxy == pytest.approx((0.0, 0.2, 0.7, 1.5)) and c.kl == (0.0, 1.0, 4.0, 16.0)
    assert c.heldout_reward is None and c.entropy is None
    no_train = {k: v for k, v in HIST.items() if k != "objective/scores"}  # DPO: no training-batch proxy
    assert O.run_curve(no_train).proxy == (0.0, 0.4, 0.9, 1.5)
    partial = {**HIST, "eval/heldout_reward": [(0, 0.0), (10, 0.1)]}  # not at every evaluation: left out
    assert O.run_curve(partial).heldout_reward is None
    with pytest.raises(ValueError, match="no evaluation with eval/kl and eval/proxy_reward"):
        O.run_curve({"eval/kl": [(0, 0.0)]})


def test_the_ship_objective_values_the_shipped_checkpoint_without_gold():
    # proxy - 0.2*sqrt(KL) per evaluation: 0, 0.2-0.2, 0.7-0.4, 1.5-0.8 = 0, 0, 0.3, 0.7: the last one ships
    tv = O.trial_value(HIST, "ship", RULE, PARAMS, kl_cost=0.2)
    assert tv.step == 30 and tv.value == pytest.approx(0.7)
    # a steeper price of KL ships earlier: cost 0.5 gives 0, -0.3, -0.3, -0.5: the start
    tv = O.trial_value(HIST, "ship", RULE, {"cost": 0.5}, kl_cost=0.5)
    assert tv.step == 0 and tv.value == pytest.approx(0.0)
    # with a held-out RM the value is its score at the checkpoint the rule (on the proxy and KL) ships
    held = {**HIST, "eval/heldout_reward": [(0, 0.0), (10, 0.5), (20, 0.6), (30, 0.1)]}
    tv = O.trial_value(held, "ship", RULE, PARAMS, kl_cost=0.2)
    assert (tv.step, tv.value) == (30, pytest.approx(0.1)) and "held-out RM" in tv.measure
    tv = O.trial_value(held, "ship", "heldout_max", {}, kl_cost=0.2)
    assert (tv.step, tv.value) == (20, pytest.approx(0.6))


def test_the_proxy_objective_is_the_raw_proxy_at_the_end_and_gold_the_eval_gold_where_the_rule_ships():
    tv = O.trial_value(HIST, "proxy", RULE, PARAMS, kl_cost=0.2)
    assert (tv.step, tv.value) == (30, 1.5)  # what a naive tuning maximises: the highest here
    tv = O.trial_value(HIST, "gold", RULE, {"cost": 0.5}, kl_cost=0.5)
    assert (tv.step, tv.value) == (0, 0.1)  # the eval gold where the rule ships (the start), not the gold's best
    with pytest.raises(ValueError, match="tune.objective=gold: the run logged no eval/gold_reward"):
        O.trial_value({k: v for k, v in HIST.items() if k != "eval/gold_reward"}, "gold", RULE, PARAMS, 0.2)
    with pytest.raises(ValueError, match="tune.rule=heldout_max reads a signal the run did not log"):
        O.trial_value(HIST, "ship", "heldout_max", {}, 0.2)


def test_tune_settings_are_checked_in_one_line_naming_the_key():
    good = {"objective": "ship", "rule": RULE, "params": PARAMS, "kl_cost": 0.2}
    check_tune(good)
    check_tune({**good, "rule": "clock", "params": {"fraction": 0.6}})
    check_tune({**good, "rule": "last_checkpoint", "params": None})
    check_tune({**good, "rule": "alarm", "params": {}})  # its threshold has a default
    for bad, key in (({"objective": "gold_test"}, "tune.objective"), ({"rule": "nope"}, "tune.rule"),
                     ({"params": [1]}, "tune.params"), ({"rule": "clock"}, "tune.params"),  # clock takes fraction
                     ({"rule": "clock", "params": {}}, "tune.params"), ({"kl_cost": -1}, "tune.kl_cost"),
                     ({"kl_cost": "x"}, "tune.kl_cost")):
        with pytest.raises(ConfigError, match=re.escape(key)):
            check_tune({**good, **bad})


def test_optuna_s_own_storage_is_refused_in_one_line_with_sqlalchemy_2():
    from importlib.metadata import version

    from rlhf_lab.entry.tune import check_storage

    check_storage(None)
    if int(version("sqlalchemy").split(".")[0]) >= 2:
        with pytest.raises(ConfigError, match=r"hydra.sweeper.storage must be null here .*skip_finished=true"):
            check_storage("sqlite:///optuna.db")


def test_a_batch_is_as_many_trials_as_the_launcher_runs_at_once():
    assert launcher_batch({}) == 1  # the basic launcher: one at a time
    assert launcher_batch({"n_jobs": 2}) == 2  # hydra/launcher=parallel
    assert launcher_batch({"n_jobs": -1}) >= 1  # joblib's one per core


def test_without_the_plugin_the_sweeper_says_how_to_install_it(monkeypatch, capsys):
    import sys

    from rlhf_lab.entry.tune import OptunaSweeper

    monkeypatch.setitem(sys.modules, "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper", None)  # not installed
    with pytest.raises(SystemExit) as stop:
        OptunaSweeper(sampler={"_target_": "optuna.samplers.TPESampler"})
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == ("rlhf-lab: config error: hydra/sweeper=optuna needs the "
                                               "hydra-optuna-sweeper plugin: pip install 'rlhf-lab[tune]'")


def sweep_config(overrides):
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_module("rlhf_lab.conf", version_base="1.3"):
        return compose("config", overrides=overrides, return_hydra_config=True)


def search_space(params) -> dict[str, str]:
    """The Optuna distribution of each key of `params` (hydra.sweeper.params), as the plugin makes them."""
    from hydra_plugins.hydra_optuna_sweeper._impl import create_params_from_overrides

    distributions = create_params_from_overrides([f"{k}={v}" for k, v in params.items()])[0]
    return {k: type(d).__name__ for k, d in distributions.items()}


def test_the_lab_s_optuna_sweeper_maximises_with_a_seeded_tpe_and_tune_ppo_names_its_search_space():
    cfg = sweep_config(["sweep=tune_ppo"])
    s = cfg.hydra.sweeper
    assert s._target_ == "hydra_plugins.rlhf_lab_tune.sweeper.OptunaSweeper" and s.direction == "maximize"
    assert s.sampler._target_ == "optuna.samplers.TPESampler" and s.sampler.seed == 0 and s.n_jobs is None
    assert set(s.params) == {"kl.beta", "algo.steps", "algo.lr"}
    assert search_space(s.params) == {"kl.beta": "UniformDistribution", "algo.steps": "IntUniformDistribution",
                                      "algo.lr": "LogUniformDistribution"}  # algo.steps an int: its schema's type
    assert cfg.tune.objective == "ship" and cfg.kl.name == "fixed" and cfg.algo.name == "ppo"
    assert OmegaConf.to_container(cfg.tune, resolve=True)["params"] == {"cost": cfg.tune.kl_cost}
    check_tune(OmegaConf.to_container(cfg.tune, resolve=True))


GOODHART = ("proxy", "ship", "gold")


def leaves(node, prefix=""):
    if isinstance(node, dict):
        return {k: v for key, sub in node.items() for k, v in leaves(sub, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): node}


def test_the_goodhart_studies_differ_only_in_the_objective():
    """tune_goodhart_{proxy,ship,gold}: the same jobs, search space, trial budget and sampler seed; only tune.objective
    (and the study's name) differ, in the composed config and in Hydra's (the sweeper's settings)."""
    composed = {o: leaves(OmegaConf.to_container(sweep_config([f"sweep=tune_goodhart_{o}"]), resolve=False))
                for o in GOODHART}
    for o in GOODHART:
        c = composed[o]
        assert c["tune.objective"] == o and c["study"] == f"tune_goodhart_{o}"
        assert c["hydra.sweeper.sampler.seed"] == 0 and c["hydra.sweeper.n_trials"] >= 20
        params = {k.split(".", 3)[3]: v for k, v in c.items() if k.startswith("hydra.sweeper.params.")}
        assert search_space(params)["algo.steps"] == "IntUniformDistribution"
    volatile = ("hydra.runtime.", "hydra.job.", "hydra.overrides.")  # the command line and the process
    differ = {k for k in composed["ship"] if not k.startswith(volatile)
              and any(composed[o].get(k) != composed["ship"][k] for o in GOODHART)}
    assert differ == {"tune.objective", "study"}
    assert set(composed["ship"]) == set(composed["proxy"]) == set(composed["gold"])


@pytest.mark.slow
def test_a_tiny_optuna_sweep_runs_its_trials_as_children_and_a_relaunch_skips_them(tmp_path):
    """hydra/sweeper=optuna with the joblib launcher (2 trials in one batch, each a PPO job of 2 steps of 8 responses,
    one AdamW step each, on a 2-step RM): exit 0, one parent run with the trials as children, each child's
    tune/objective logged and the number Optuna was told, the best trial printed and on the parent; relaunched with
    skip_finished=true (one trial at a time, without the joblib workers' start; forked from the warm interpreter of
    tests/cli_process.py, which the basic launcher allows), the study replays: both trials are skipped, their
    objectives read back, the same best printed."""
    from tests import cli_process
    from tests.test_sweeps import MICRO, run_cli, sweeping

    # sizes only: the RM's 200 steps normalised on 1024 samples and PPO's batch of 64 with 4 x 4 update minibatches
    # (the defaults) made the sweep's process tree 50 s of CPU; 37 s with these
    sizes = ["algo.batch_size=8", "algo.ppo_epochs=1", "algo.num_minibatches=1", "reward_model.batch_size=8",
             "reward_model.steps=2", "reward_model.norm_samples=64"]
    args = ["-m", "hydra/sweeper=optuna", "hydra/launcher=parallel", "hydra.sweeper.n_trials=2", "algo=ppo",
            "kl=fixed", "kl.beta=interval(0.0,0.3)", "algo.lr=tag(log,interval(1e-5,1e-3))", *MICRO, *sizes,
            "eval.every_n_steps=1", "data.n_train=100", "data.n_eval=40", "study=tune_smoke"]
    r = run_cli(*args, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    best = re.search(r"\[rlhf-lab\] optuna: best trial (.*): tune/objective (\S+) \(objective ship", r.stdout)
    assert best, r.stdout[-3000:]
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["rlhf-lab"])
    parent = runs[runs["tags.rlhf_lab.stage"] == "sweep"]
    assert len(parent) == 1 and parent.iloc[0]["status"] == "FINISHED"
    trials = runs[runs["tags.rlhf_lab.stage"] == "ppo"]
    assert len(trials) == 2 and set(trials["tags.mlflow.parentRunId"]) == {parent.iloc[0]["run_id"]}
    assert trials["metrics.tune/objective"].notna().all()
    assert parent.iloc[0]["metrics.tune/best_objective"] == pytest.approx(trials["metrics.tune/objective"].max())
    assert parent.iloc[0]["tags.rlhf_lab.tune.best"] == best.group(1)
    assert float(best.group(2)) == pytest.approx(trials["metrics.tune/objective"].max(), abs=1e-4)
    assert set(trials["params.sweep.kl.beta"]) == set(re.findall(r"#\d+ : kl\.beta=([0-9.e+-]+) ", r.stdout))
    serial = [a for a in args if a != "hydra/launcher=parallel"]  # the same trials: the first ones are drawn at random
    env = dict(os.environ, HF_HUB_OFFLINE="1")  # as run_cli's
    for k in ("MLFLOW_TRACKING_URI", sweeping.PARENT_ENV, sweeping.SWEPT_ENV, sweeping.STATE_ENV):
        env.pop(k, None)
    again = cli_process.run([*serial, "skip_finished=true"], tmp_path, env, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count(": skipped (finished run") == 2 and "nothing ran" in again.stdout, again.stdout[-3000:]
    assert best.group(0) in again.stdout  # the same trials, the same values, the same best
