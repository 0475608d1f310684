"""eval.schedule: evaluations every N steps, spread evenly in log(step) (dense while KL rises, for Gao-style
gold-vs-√KL curves), or when the rollouts' √KL crosses evenly spaced levels (kl); the steps against hand
computations, and PPO jobs that evaluate exactly there."""

from __future__ import annotations

import mlflow
import pytest

from rlhf_lab import stages
from rlhf_lab.evaluation.callbacks import evaluation_steps
from rlhf_lab.evaluation.schedule import KLSchedule, sqrt_kl_level


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
    with pytest.raises(ValueError, match="eval.schedule='lin': one of every, log, kl"):
        evaluation_steps("lin", 10)


def test_sqrt_kl_levels_by_hand():
    # spacing 0.5: level k from KL (0.5 k)^2 on: 0.25 -> 1, 1 -> 2, 2.25 -> 3, 4 -> 4
    assert [sqrt_kl_level(k, 0.5) for k in (0.0, 0.2, 0.25, 0.99, 1.0, 2.0, 2.25, 4.0, 30.0)] == [0, 0, 1, 1, 2, 2, 3, 4,
                                                                                                  10]
    assert sqrt_kl_level(-0.3, 0.5) == 0 and sqrt_kl_level(float("nan"), 0.5) == 0 and sqrt_kl_level(None, 0.5) == 0
    assert sqrt_kl_level(9.0, 1.0) == 3


def schedule_over(kls: list[float], spacing: float, n_points: int) -> list[int]:
    """The steps a KLSchedule evaluates when step s's rollouts have KL kls[s - 1] (each step asked twice: a later
    query must get the first answer)."""
    at = {"kl": None}
    sched = KLSchedule(lambda: at["kl"], spacing, n_points)
    for step, kl in enumerate(kls, start=1):
        at["kl"] = kl
        first = step in sched
        at["kl"] = -1.0  # a second query is answered from the first, whatever the KL says now
        assert (step in sched) == first
    return sched.steps()


def test_the_kl_schedule_evaluates_at_each_new_level_once():
    # levels at spacing 0.5:   0    1    1    2    1    3    3    5     5     6
    kls = [0.1, 0.3, 0.5, 1.2, 0.6, 2.3, 2.4, 6.5, 6.6, 9.1]
    # a new level at steps 2 (1), 4 (2), 6 (3), 8 (5: levels 4 and 5 at once, one evaluation), 10 (6); a fall back
    # (step 5) and a level already evaluated (steps 3, 7, 9) are not evaluated
    assert schedule_over(kls, 0.5, 12) == [2, 4, 6, 8, 10]
    assert schedule_over(kls, 0.5, 3) == [2, 4, 6]  # at most n_points; the end of training is evaluated anyway
    # spacing 1: levels 0 0 0 1 0 1 1 2 2 3, new at steps 4 (KL 1.2), 8 (6.5) and 10 (9.1)
    assert [sqrt_kl_level(k, 1.0) for k in kls] == [0, 0, 0, 1, 0, 1, 1, 2, 2, 3]
    assert schedule_over(kls, 1.0, 12) == [4, 8, 10]


def test_the_kl_schedule_state_survives_a_checkpoint():
    a = KLSchedule(lambda: 1.2, 0.5, 12)
    assert 1 in a and 2 not in a
    b = KLSchedule(lambda: 2.3, 0.5, 12)
    b.load_state_dict(a.state_dict())
    assert b.level == 2 and b.steps() == [1] and 3 in b and b.steps() == [1, 3]
    with pytest.raises(ValueError, match="sqrt_kl_spacing must be > 0"):
        KLSchedule(lambda: 1.0, 0.0, 12)


def test_the_kl_schedule_is_refused_where_there_are_no_rollouts(tiny_cfg):
    from rlhf_lab.config.checks import validate
    from rlhf_lab.config.errors import ConfigError

    with pytest.raises(ConfigError, match="eval.schedule must be every or log with algo=dpo"):
        validate(tiny_cfg("algo=dpo", "eval.schedule=kl"))
    with pytest.raises(ConfigError, match="eval.sqrt_kl_spacing must be > 0"):
        validate(tiny_cfg("algo=ppo", "eval.schedule=kl", "eval.sqrt_kl_spacing=0"))
    validate(tiny_cfg("algo=grpo", "eval.schedule=kl"))


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


@pytest.mark.slow
def test_a_ppo_job_evaluates_where_its_rollouts_kl_reaches_a_new_level(tiny_cfg, tmp_path):
    from rlhf_lab.evaluation.schedule import sqrt_kl_level as level

    db = tmp_path / "mlflow.db"
    cfg = tiny_cfg("algo=ppo", "algo.reward=gold", "kl.beta=0", "algo.lr=3e-3", "algo.batch_size=8",
                   "algo.num_minibatches=2", "algo.ppo_epochs=1", "generation.max_new_tokens=12", "trainer.max_steps=8",
                   "eval.schedule=kl", "eval.sqrt_kl_spacing=0.3", "eval.n_points=4", "eval.n_prompts=8",
                   "eval.n_test_prompts=8", mlflow_db=db)
    stages.run_job(cfg, tmp_path / "out")
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    run = mlflow.search_runs(experiment_names=["rlhf-lab"], filter_string="tags.`rlhf_lab.stage` = 'ppo'",
                             output_format="list")[0]
    client = mlflow.MlflowClient()
    kl = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "objective/kl")}
    evaluated = [m.step for m in client.get_metric_history(run.info.run_id, "eval/gold_reward")]
    expected, top = [], 0  # the rule by hand over the logged KL of each step
    for step in sorted(kl):
        if step > 0 and level(kl[step], 0.3) > top and len(expected) < 4:
            expected.append(step)
            top = level(kl[step], 0.3)
    assert expected, kl  # the run moved its policy: at least one level crossed
    assert evaluated == [0, *expected, *([8] if 8 not in expected else [])]


def test_the_gao_study_is_beta_zero_with_log_spaced_evaluations_and_one_rm_per_seed():
    from rlhf_lab.entry import sweeps as sweeping
    from tests.conftest import compose_cfg

    jobs = sweeping.plan(["sweep=gao_rm_scaling"], validate=False)
    cfgs = [compose_cfg(j) for j in jobs]
    assert len(cfgs) == 40
    assert {(c.kl.name, float(c.kl.beta), c.eval.schedule, int(c.eval.n_points)) for c in cfgs} == {("fixed", 0.0, "log", 12)}
    assert {c.labeler.name for c in cfgs} == {"unbiased", "length_biased"}
    sizes = {(c.reward_model.arch.hidden, c.reward_model.arch.layers) for c in cfgs}
    assert sizes == {(16, 1), (32, 2), (64, 2), (128, 4)}  # micro, tiny, small, medium
    assert all(int(c.reward_model.seed) == int(c.seed) for c in cfgs) and {int(c.seed) for c in cfgs} == set(range(5))
    assert {c.policy.arch.hidden for c in cfgs} == {64}  # one policy: a_small


def test_the_kl_spaced_gao_study_is_the_gao_studys_unbiased_arm_measured_where_kl_moves():
    """gao_rm_scaling_kl: each of its jobs is gao_rm_scaling's unbiased-labeler job of the same RM size and seed,
    but for the evaluation schedule (and the study's name); its arms differ only in the RM size."""
    from rlhf_lab.config.keys import computes, to_plain
    from rlhf_lab.entry import sweeps as sweeping
    from tests.conftest import compose_cfg

    def flat(node, prefix=""):
        out = {}
        for k, v in node.items():
            key = f"{prefix}{k}"
            out.update(flat(v, key + ".") if isinstance(v, dict) else {key: v})
        return out

    def by_job(study):
        cfgs = [to_plain(compose_cfg(j)) for j in sweeping.plan([f"sweep={study}"], validate=False)]
        return {(c["reward_model"]["arch"]["hidden"], c["seed"]): flat(c) for c in cfgs
                if c["labeler"]["name"] == "unbiased"}

    new, old = by_job("gao_rm_scaling_kl"), by_job("gao_rm_scaling")
    assert len(new) == 20 and set(new) == set(old)
    for key in new:
        differ = {k for k in set(new[key]) | set(old[key]) if new[key].get(k) != old[key].get(k) and computes(k)}
        assert differ == {"eval.schedule", "eval.n_points"}, (key, differ)
        assert new[key]["eval.schedule"] == "kl" and new[key]["eval.sqrt_kl_spacing"] == 0.5
    arms = {}
    for (hidden, seed), c in new.items():
        arms.setdefault(hidden, []).append(c)
    base = arms[16][0]
    for hidden, cs in arms.items():  # within the study: only the RM's size (and the seed) differ
        for c in cs:
            differ = {k for k in set(c) | set(base) if c.get(k) != base.get(k) and computes(k)}
            assert all(k == "seed" or k.startswith("reward_model.") or k == "rm_size" for k in differ), differ
