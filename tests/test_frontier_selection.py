"""The frontier report's seed-split selection, its bootstrap, the matched-KL interpolation and the confound note
(rlhf_lab/analysis/frontier_matched.py) against hand computations."""

from __future__ import annotations

import math

from rlhf_lab.analysis import frontier_matched as fm
from rlhf_lab.analysis.study_runs import RunData

# setting -> seed -> (final eval gold, final test gold, final eval KL)
TABLE = {"A": {"0": (1.0, 10.0, 1.0), "1": (1.0, 20.0, 2.0), "2": (0.0, 30.0, 1.0), "3": (0.0, 40.0, 1.0)},
         "B": {"0": (0.4, 1.0, 4.0), "1": (0.4, 2.0, 9.0), "2": (0.4, 3.0, 4.0), "3": (0.4, 4.0, 4.0)}}


def test_each_split_chooses_on_its_seeds_and_measures_on_the_others():
    # 4 seeds: choose on 2, measure on 2, 6 splits. A's eval mean over the chosen pair beats B's 0.4 unless the pair
    # is {2, 3} (A 0.0): {0,1} -> A on {2,3}: 35; {0,2} -> A on {1,3}: 30; {0,3} -> A on {1,2}: 25;
    # {1,2} -> A on {0,3}: 25; {1,3} -> A on {0,2}: 20; {2,3} -> B on {0,1}: 1.5
    est, chosen = fm.seed_split_selection(TABLE, ["0", "1", "2", "3"])
    assert math.isclose(est, (35 + 30 + 25 + 25 + 20 + 1.5) / 6) and chosen == {"A": 5, "B": 1}
    assert fm.split_sizes(5) == 3 and fm.split_sizes(4) == 2


def test_one_setting_measured_on_every_split_is_its_mean_and_the_bootstrap_collapses_on_equal_seeds():
    one = {"bon": {str(s): (0.0, float(s + 1), 4.0) for s in range(5)}}
    est, chosen = fm.seed_split_selection(one, [str(s) for s in range(5)])
    assert math.isclose(est, 3.0) and chosen == {"bon": 10}  # each seed measured in 4 of the 10 splits
    flat = {"A": {str(s): (0.5, 0.7, 2.0) for s in range(5)}, "B": {str(s): (0.1, 0.2, 5.0) for s in range(5)}}
    lo, hi, used = fm.bootstrap_selection(flat, [str(s) for s in range(5)], resamples=200)
    assert math.isclose(lo, 0.7) and math.isclose(hi, 0.7) and 0 < used < 200  # draws of one seed have no split
    a = fm.bootstrap_selection(TABLE, ["0", "1", "2", "3"], resamples=300)
    assert a == fm.bootstrap_selection(TABLE, ["0", "1", "2", "3"], resamples=300) and a[0] <= a[1]


def test_gold_is_interpolated_linearly_in_sqrt_kl_and_never_beyond_the_settings():
    pts = [(4.0, 1.0), (1.0, 0.0)]  # √KL 2 -> 1.0, √KL 1 -> 0.0 (given out of order)
    assert math.isclose(fm.interpolate_gold(pts, 2.25), 0.5)  # √2.25 = 1.5, half way
    assert math.isclose(fm.interpolate_gold(pts, 4.0), 1.0)
    assert math.isnan(fm.interpolate_gold(pts, 0.5)) and math.isnan(fm.interpolate_gold(pts, 5.0))
    assert math.isnan(fm.interpolate_gold([(1.0, 0.3)], 1.0))  # one point: no line
    # per seed: seed 0 spans KL 1-4, seed 1 KL 2-9, seeds 2, 3 KL 1-4: every seed covers 2-4
    assert fm.covered_range(TABLE, ["0", "1", "2", "3"]) == (2.0, 4.0)
    # seed 0 at KL 2.25 (√ 1.5, half way from A's √1 to B's √4 = 2): (10 + 1) / 2
    assert math.isclose(fm.matched_kl(TABLE, ["0"], 2.25)[0], 5.5)


def test_the_shared_range_is_that_of_the_most_algorithms_that_overlap():
    assert fm.common_range({"a": (1.0, 3.0), "b": (2.0, 5.0), "c": (6.0, 8.0)}) == (["a", "b"], (2.0, 3.0))
    assert fm.common_range({"a": (1.0, 3.0), "b": (2.0, 5.0)}) == (["a", "b"], (2.0, 3.0))
    assert fm.common_range({"a": (1.0, 2.0), "b": (3.0, 4.0)}) is None


def _run(algo: str, beta: str, seed: int, params: dict[str, str]) -> RunData:
    return RunData(f"{algo}{beta}{seed}", algo, "FINISHED", params, {}, {"test/gold_reward": 0.5},
                   {"eval/gold_reward": [(60, 0.4)], "eval/kl": [(60, float(beta) * 10 + seed)]},
                   setting={"frontier": f"{algo}_{beta}"}, seed=str(seed))


def test_the_confounds_are_read_from_the_runs_and_left_out_below_four_seeds():
    ppo = {"algo.critic": "policy", "algo.kl_in": "reward", "algo.kl_estimator": "k1", "algo.batch_size": "64",
           "algo.samples_per_prompt": "1", "algo.lr": "0.0003"}
    grpo = {**ppo, "algo.critic": "none", "algo.kl_in": "loss", "algo.kl_estimator": "k3",
            "algo.samples_per_prompt": "8"}
    by = {a: [_run(a, b, s, p) for b in ("0.1", "1") for s in range(4)] for a, p in (("ppo", ppo), ("grpo", grpo))}
    note = fm.confound_note(by)[0]
    assert "ppo: critic policy, KL in the reward (k1 estimator), 64 prompts per step, lr 0.0003" in note
    assert "grpo: critic none, KL in the loss (k3 estimator), 8 prompts per step" in note
    assert "not removed" in note.lower()
    assert fm.matched_sections(by)  # 4 seeds: the selection and matched-KL parts are written
    three = {a: [r for r in rs if r.seed != "3"] for a, rs in by.items()}
    assert fm.confound_note(three) == [] and fm.matched_sections(three) == []  # 3 seeds: too few to split 2 / 2
