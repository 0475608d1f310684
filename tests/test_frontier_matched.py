"""The frontier at matched constraints (issue 69; rlhf_lab_research/studies/frontier_matched.py), checked before any
of its runs exists: the curve reading against hand computations, the tuning's choice and eligibility, the paired
comparison with Holm against scipy, the phase-2 files it writes, and the tuning study's arms (Hydra's compose API)."""

from __future__ import annotations

import math

import pytest
import yaml
from scipy import stats as st

from rlhf_lab.analysis.study_runs import RunData
from rlhf_lab_research.studies import frontier_matched as F

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def run(algo: str, seed: int, lr: float, beta: float, kl: list[float], gold: list[float], status: str = "FINISHED",
        test: list[float] | None = None) -> RunData:
    steps = list(range(0, 10 * len(kl), 10))
    history = {"eval/kl": list(zip(steps, kl)), "eval/gold_reward": list(zip(steps, gold))}
    if test is not None:
        history["test/gold_reward"] = list(zip(steps, test))
    return RunData(f"{algo}-{seed}-{lr}-{beta}", algo, status, {"algo.lr": str(lr), "kl.beta": str(beta)},
                   {"rlhf_lab.study": F.TUNE}, {}, history, seed=str(seed))


def test_gold_at_interpolates_in_sqrt_kl_at_the_first_crossing_and_never_extrapolates():
    pts = [(0.0, -0.1), (1.0, 0.3), (2.0, 0.7), (1.2, 0.0), (3.0, 0.9)]  # KL falls back after 2.0: first crossing wins
    assert F.gold_at(pts, 1.5) == pytest.approx(0.3 + 0.4 * 0.5)
    assert F.gold_at(pts, 1.0) == pytest.approx(0.3)  # exactly at an evaluation
    assert F.gold_at(pts, 2.5) == pytest.approx(0.9 * (2.5 - 1.2) / (3.0 - 1.2))  # the segment crossing 2.5: j 3->4
    assert math.isnan(F.gold_at(pts, 3.5))
    assert F.gold_at([(2.0, 0.5)], 1.5) == 0.5 and F.gold_at([(0.0, 1.0), (0.0, 2.0)], 0.0) == 1.0


def test_curve_reads_sqrt_kl_at_steps_with_both_and_clamps_a_negative_estimate():
    r = run("ppo", 20, 3e-4, 0.01, [-0.2, 1.0, 4.0], [0.0, 0.2, 0.4])
    r.history["eval/gold_reward"].append((99, 1.0))  # no KL at step 99: left out
    assert F.curve(r) == [(0.0, 0.0), (1.0, 0.2), (2.0, 0.4)]


def tuning_runs() -> list[RunData]:
    runs = []
    for seed in (20, 21, 22):
        # ppo at lr 3e-4 best (0.6 at d*); at 1e-3 better still but seed 22 FAILED: not eligible
        runs.append(run("ppo", seed, 3e-4, 0.01, [0, 1, 4], [0, 0.2, 1.0]))      # at √KL 1.5: 0.6
        runs.append(run("ppo", seed, 1e-3, 0.01, [0, 1, 4], [0, 0.5, 1.5],
                        status="FAILED" if seed == 22 else "FINISHED"))
        runs.append(run("ppo", seed, 1e-4, 0.1, [0, 1, 1.5], [0, 0.9, 1.0]))    # never reaches d*: not eligible
        # grpo: a tie at 0.4 between lr 1e-4 and 3e-4: the smaller lr wins
        runs.append(run("grpo", seed, 3e-4, 0.01, [0, 1, 4], [0, 0.2, 0.6]))
        runs.append(run("grpo", seed, 1e-4, 0.1, [0, 1, 4], [0, 0.2, 0.6]))
    return runs


def test_the_tuning_chooses_the_eligible_setting_with_the_highest_mean_at_d_star():
    table = F.tune_table(tuning_runs())
    assert table[("ppo", 3e-4, 0.01)] == {s: pytest.approx(0.6) for s in ("20", "21", "22")}
    assert not F.eligible(table[("ppo", 1e-3, 0.01)])  # seed 22 failed
    assert not F.eligible(table[("ppo", 1e-4, 0.1)])  # never reached √KL 1.5
    assert F.choose(table) == {"ppo": ("ppo", 3e-4, 0.01), "grpo": ("grpo", 1e-4, 0.1), "rloo": None}


def test_phase2_files_carry_the_choice_and_the_tuning_studys_matched_settings():
    files = F.phase2_files(F.choose(F.tune_table(tuning_runs())))
    assert set(files) == {"sweeps/frontier_matched/ppo.yaml", "sweeps/frontier_matched/grpo.yaml",
                          "sweeps/sweep/algo_frontier_matched.yaml"}
    ppo = yaml.safe_load(files["sweeps/frontier_matched/ppo.yaml"])
    assert ppo["algo"] == {"lr": 3e-4} and ppo["kl"] == {"beta": 0.01} and {"override /algo": "ppo"} in ppo["defaults"]
    measure = yaml.safe_load(files["sweeps/sweep/algo_frontier_matched.yaml"])
    tune = yaml.safe_load((ROOT / "sweeps/sweep/algo_frontier_matched_tune.yaml").read_text())
    assert measure["study"] == F.STUDY and measure["eval"].pop("test_each_eval") is True
    for key in ("defaults", "algo", "eval", "reward_model"):  # matched exactly as tuned, but the test prompts
        assert measure[key] == tune[key], key
    params = measure["hydra"]["sweeper"]["params"]
    assert params == {"seed": ",".join(map(str, range(30, 40))), "+frontier_matched": "ppo,grpo"}
    assert set(F.TUNE_SEEDS).isdisjoint(F.MEASURE_SEEDS)
    assert tune["hydra"]["sweeper"]["params"]["seed"] == ",".join(F.TUNE_SEEDS)


def measured_runs(shift: dict[str, float]) -> list[RunData]:
    runs = []
    for i, seed in enumerate(range(30, 40)):
        for algo, s in shift.items():
            noise = 0.05 * ((i * 7 + 3 * F.ALGOS.index(algo)) % 5 - 2)
            runs.append(run(algo, seed, 3e-4, 0.01, [0, 1, 4, 9], [0, 0, 0, 0],
                            test=[0.0, 0.2 + s + noise, 0.6 + s + noise, 0.7 + s]))
    return runs


def test_pairs_are_paired_t_over_seeds_with_holm_and_the_verdict_follows_the_adjusted_p():
    table = F.measure_table(measured_runs({"ppo": 0.3, "grpo": 0.0, "rloo": 0.01}))
    assert table["ppo"]["30"][1.5] == pytest.approx((0.4 + 0.8) / 2)  # seed 30: noise -0.1; √KL 1 and 2 around 1.5
    pairs = F.pair_effects(table)
    by = {pair: (e, p, q) for pair, e, p, q in pairs}
    e, p, q = by[("ppo", "grpo")]
    diffs = [table["ppo"][s][1.5] - table["grpo"][s][1.5] for s in F.MEASURE_SEEDS]
    assert e.n == 10 and e.estimate == pytest.approx(sum(diffs) / 10)
    assert p == pytest.approx(st.ttest_1samp(diffs, 0.0).pvalue)
    ps = sorted(pp for _, _, pp, _ in pairs)
    assert min(qq for _, _, _, qq in pairs) == pytest.approx(min(1.0, 3 * ps[0]))
    assert F.pair_verdict(("ppo", "grpo"), e, q) == "**ppo above grpo**"
    e2, _, q2 = by[("rloo", "grpo")]
    assert q2 >= F.ALPHA and F.pair_verdict(("rloo", "grpo"), e2, q2).startswith("not ordered")


def test_a_run_that_never_reaches_d_is_missing_from_its_pairs_only():
    runs = measured_runs({"ppo": 0.3, "grpo": 0.0, "rloo": 0.0})
    short = next(r for r in runs if r.stage == "grpo" and r.seed == "31")
    short.history["eval/kl"] = [(0, 0.0), (10, 1.0), (20, 1.2), (30, 1.4)]  # √KL ≤ 1.19: reaches 1 only
    table = F.measure_table(runs)
    assert math.isnan(table["grpo"]["31"][1.5]) and math.isfinite(table["grpo"]["31"][1.0])
    by = {pair: e for pair, e, _, _ in F.pair_effects(table)}
    assert by[("ppo", "grpo")].n == 9 and by[("rloo", "grpo")].n == 9 and by[("ppo", "rloo")].n == 10


def test_both_reports_render_from_runs(tmp_path):
    text = "\n".join(F.render_tune(tuning_runs(), ["rlhf-lab -m sweep=algo_frontier_matched_tune"]))
    assert "Chosen: ppo: lr 0.0003, β 0.01; grpo: lr 0.0001, β 0.1; rloo: none eligible." in text
    assert text.count("**chosen**") == 2 and "not eligible" in text
    text = "\n".join(F.render_measure(measured_runs({"ppo": 0.3, "grpo": 0.0, "rloo": 0.01}), ["cmd"]))
    assert "| ppo − grpo | 10 |" in text and "**ppo above grpo**" in text


def test_the_tuning_studys_arms_differ_only_in_the_algorithm_lr_and_beta():
    from tests.test_prospective_designs import composed_jobs, differing

    jobs = composed_jobs(F.TUNE)
    assert len(jobs) == 54 and [c["seed"] for _, c in jobs[:18]] == [20] * 18  # seed-first
    defining = {"algo.name", "algo.critic", "algo.kl_in", "algo.kl_estimator", "algo.loss_agg",
                "algo.whiten_advantages", "algo.advantage_scale", "algo.baseline"}
    arms = [c for _, c in jobs if c["seed"] == 20]
    for a in arms[1:]:
        assert differing(arms[0], a) <= defining | {"algo.lr", "kl.beta"}
    for _, c in jobs:  # matched: samples, prompts per step, updates, KL controller, evaluation, one RM per seed
        assert (c["algo.batch_size"], c["algo.samples_per_prompt"], c["algo.ppo_epochs"], c["algo.num_minibatches"],
                c["algo.steps"], c["kl.name"], c["eval.schedule"], c["eval.sqrt_kl_spacing"]) == (
                    64, 4, 4, 4, 60, "fixed", "kl", 0.5)
        assert c["reward_model.seed"] == c["seed"] and str(c["seed"]) in F.TUNE_SEEDS
    other = [c for _, c in jobs if c["seed"] == 21]
    assert differing(arms[0], other[0]) == {"seed", "reward_model.seed"}


# -- after phase 1's look: the committed report and phase 2's files ----------------------------------------------

TUNE_RUNS = "reports/algo_frontier_matched_tune/runs.json.gz"


def test_the_tuning_report_regenerates_byte_for_byte_and_phase_2s_files_are_its_choice(tmp_path, monkeypatch):
    from rlhf_lab.analysis.snapshot import read_snapshot
    from rlhf_lab_research.report import main

    monkeypatch.chdir(ROOT)
    out = tmp_path / "reports"
    assert main([F.TUNE, "--no-store", "--runs", TUNE_RUNS, "--out", str(out)]) == 0
    assert (out / F.TUNE / "README.md").read_text() == (ROOT / "reports" / F.TUNE / "README.md").read_text()
    assert sorted(p.name for p in (out / F.TUNE).iterdir()) == ["README.md"]  # from a runs file: no study file
    runs = [r for rs in read_snapshot(ROOT / TUNE_RUNS)[0].values() for r in rs]
    files = F.phase2_files(F.choose(F.tune_table(runs)))
    assert set(files) == {"sweeps/frontier_matched/ppo.yaml", "sweeps/frontier_matched/grpo.yaml",
                          "sweeps/frontier_matched/rloo.yaml", "sweeps/sweep/algo_frontier_matched.yaml"}
    for rel, text in files.items():
        assert text == (ROOT / rel).read_text(), rel


def test_phase_2s_arms_differ_only_in_the_algorithm_and_its_chosen_lr_and_beta():
    from tests.test_prospective_designs import composed_jobs, differing

    jobs = composed_jobs(F.STUDY)
    arms = sorted({c["algo.name"] for _, c in jobs})
    assert len(jobs) == 10 * len(arms) and {c["seed"] for _, c in jobs} == set(range(30, 40))
    first = [c for _, c in jobs if c["seed"] == 30]
    defining = {"algo.name", "algo.critic", "algo.kl_in", "algo.kl_estimator", "algo.loss_agg",
                "algo.whiten_advantages", "algo.advantage_scale", "algo.baseline"}
    for c in first[1:]:
        assert differing(first[0], c) <= defining | {"algo.lr", "kl.beta"}
    tune = {(c["algo.name"], c["algo.lr"], c["kl.beta"]): c for _, c in composed_jobs(F.TUNE) if c["seed"] == 20}
    for c in first:  # each arm is its tuning job but for the seeds and the test prompts at every evaluation
        assert differing(tune[(c["algo.name"], c["algo.lr"], c["kl.beta"])], c) == {
            "seed", "reward_model.seed", "eval.test_each_eval"}
