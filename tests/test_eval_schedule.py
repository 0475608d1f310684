"""eval.schedule: evaluations every N steps, or spread evenly in log(step) (dense while KL rises, for Gao-style
gold-vs-√KL curves); the steps against hand computations, and a PPO job that evaluates exactly there."""

from __future__ import annotations

import mlflow
import pytest

from rlhf_lab import stages
from rlhf_lab.evaluation.callbacks import evaluation_steps


def test_every_is_each_multiple_and_zero_is_none():
    assert evaluation_steps("every", 50, every_n_steps=20) == [20, 40]
    assert evaluation_steps("every", 60, every_n_steps=20) == [20, 40, 60]
    assert evaluation_steps("every", 50, every_n_steps=0) == []


def test_log_is_evenly_spaced_in_log_step():
    # round(200 ** (i / 11)), i = 0..11: 1, 1.62, 2.62, 4.24, 6.87, 11.1, 18.0, 29.1, 47.1, 76.3, 123.5, 200
    assert evaluation_steps("log", 200, n_points=12) == [1, 2, 3, 4, 7, 11, 18, 29, 47, 76, 124, 200]
    # 8 ** (i / 3): 1, 2, 4, 8
    assert evaluation_steps("log", 8, n_points=4) == [1, 2, 4, 8]
    # 10 ** (i / 7) rounds to 1 1 2 3 4 5 7 10: repeats move one step on, so there are 8 distinct steps
    assert evaluation_steps("log", 10, n_points=8) == [1, 2, 3, 4, 5, 6, 7, 10]
    assert evaluation_steps("log", 5, n_points=12) == [1, 2, 3, 4, 5]  # no more points than steps
    assert evaluation_steps("log", 60, n_points=1) == [60] and evaluation_steps("log", 60, n_points=0) == []


def test_log_puts_most_evaluations_early():
    steps = evaluation_steps("log", 200, n_points=12)
    assert len(steps) == len(set(steps)) == 12 and steps == sorted(steps)
    assert sum(s <= 20 for s in steps) == 7  # the flat schedule with as many points (every 17) has one there
    assert sum(s <= 20 for s in evaluation_steps("every", 200, every_n_steps=17)) == 1


def test_unknown_schedule_names_the_key():
    with pytest.raises(ValueError, match="eval.schedule='lin': one of every, log"):
        evaluation_steps("lin", 10)


@pytest.mark.slow
def test_a_ppo_job_evaluates_at_the_log_spaced_steps(tiny_cfg, tmp_path):
    db = tmp_path / "mlflow.db"
    cfg = tiny_cfg("algo=ppo", "algo.reward=gold", "algo.batch_size=8", "algo.num_minibatches=2", "algo.ppo_epochs=1",
                   "generation.max_new_tokens=12", "trainer.max_steps=5", "eval.schedule=log", "eval.n_points=3",
                   "eval.n_prompts=8", "eval.n_test_prompts=8", mlflow_db=db)
    stages.run_job(cfg, tmp_path / "out")
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    runs = mlflow.search_runs(experiment_names=["rlhf-lab"], filter_string="tags.`rlhf_lab.stage` = 'ppo'",
                              output_format="list")
    assert len(runs) == 1
    history = mlflow.MlflowClient().get_metric_history(runs[0].info.run_id, "eval/gold_reward")
    assert [m.step for m in history] == [0, 1, 2, 5]  # the start, 5 ** (0, 1/2, 1) rounded


def test_the_gao_study_is_beta_zero_with_log_spaced_evaluations_and_one_rm_per_seed():
    from rlhf_lab.entry import sweeps as sweeping
    from tests.test_sweeps import job_cfg

    jobs = sweeping.plan(["sweep=gao_rm_scaling"], validate=False)
    cfgs = [job_cfg(j) for j in jobs]
    assert len(cfgs) == 40
    assert {(c.kl.name, float(c.kl.beta), c.eval.schedule, int(c.eval.n_points)) for c in cfgs} == {("fixed", 0.0, "log", 12)}
    assert {c.labeler.name for c in cfgs} == {"unbiased", "length_biased"}
    sizes = {(c.reward_model.arch.hidden, c.reward_model.arch.layers) for c in cfgs}
    assert sizes == {(16, 1), (32, 2), (64, 2), (128, 4)}  # micro, tiny, small, medium
    assert all(int(c.reward_model.seed) == int(c.seed) for c in cfgs) and {int(c.seed) for c in cfgs} == set(range(5))
    assert {c.policy.arch.hidden for c in cfgs} == {64}  # one policy: a_small
