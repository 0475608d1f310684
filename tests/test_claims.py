"""The claims report's statistics on synthetic runs built in memory (RunData objects, no MLflow): every branch of
the verdict (holds; does not hold by sign and by equivalence margin; inconclusive; not run yet; not testable),
preconditions, paired seeds, RM deduplication, the final-gold and drop-from-peak quantities, and the fits' R²,
minimum number of points and honest peaks."""

from __future__ import annotations

import math
from itertools import count

import numpy as np
import pytest

from rlhf_lab_research import claims as C
from rlhf_lab.analysis import fits, quantities
from rlhf_lab_research import claims_registry, designs
from rlhf_lab_research.anytime import EARLIER
from rlhf_lab_research.verdicts import judge_all
from rlhf_lab_research.provenance import provenance_rows
from rlhf_lab.analysis.study_runs import RunData
from rlhf_lab.analysis.study_report import fit_cell, peak_cell

STEPS = 9  # evaluations per synthetic policy run (≥ MIN_EVALS)
T = np.linspace(0.0, 1.0, STEPS)
_ids = count()


def make_run(seed: int, params: dict, curves: dict | None = None, stage: str = "ppo", metrics: dict | None = None,
             rm: dict | None = None, status: str = "FINISHED") -> RunData:
    """A run as load_study builds it: params as strings (swept keys as sweep.<key>), histories at steps 0, 10, …,
    metrics holding each history's last value (as MLflow's run.data.metrics does)."""
    history = {k: [(10 * i, float(v)) for i, v in enumerate(vals)] for k, vals in (curves or {}).items()}
    m = {k: s[-1][1] for k, s in history.items()}
    m.update(metrics or {})
    p = {k: str(v) for k, v in params.items()}
    setting = {k[len("sweep."):]: v for k, v in p.items() if k.startswith("sweep.")}  # an arm: its swept keys
    p["sweep.seed"] = str(seed)
    return RunData(f"run{next(_ids)}", stage, status, p, {}, m, history, rm or {}, setting, str(seed))


def rise_fall(drop: float = 0.5) -> np.ndarray:
    """Gold rises 0.4 to a peak at 60 % of training, then falls by `drop`."""
    return np.where(T <= 0.6, 0.4 * T / 0.6, 0.4 - drop * (T - 0.6) / 0.4)


def with_halves(gold: np.ndarray, rng: np.random.Generator, sd: float = 0.02) -> dict:
    a, b = gold + rng.normal(0, sd, STEPS), gold + rng.normal(0, sd, STEPS)
    return {"eval/gold_reward": (a + b) / 2, "eval/gold_reward_a": a, "eval/gold_reward_b": b}


def beta_run(seed: int, beta: float, rng: np.random.Generator, gold: np.ndarray | None = None, halves: bool = True,
             **extra) -> RunData:
    gold = rise_fall() if gold is None else gold
    curves = with_halves(gold, rng) if halves else {"eval/gold_reward": gold}
    curves.update({"eval/proxy_reward": 1.5 * T + rng.normal(0, 0.05, STEPS), "eval/kl": 40 * T ** 1.5,
                   "eval/length": 15 + 3 * T})
    curves.update(extra)
    return make_run(seed, {"kl.name": "fixed", "kl.beta": beta, "labeler.length_bonus": 0.25}, curves)


def verdicts(studies: dict) -> dict[str, C.ClaimResult]:
    """Each claim's result under the fixed-n t rule (anytime.EARLIER): these worlds of 5 seeds test what each claim
    computes and how its verdict is ruled; the sequences from the first look, which need more seeds, are tested in
    test_claims_anytime.py and test_betting.py."""
    return {r.claim.id: r for r in judge_all(claims_registry.CLAIMS, *C.counted(studies), {}, rule=EARLIER)}


def parts(res: C.ClaimResult) -> dict[str, C.PartResult]:
    return {p.part.says: p for p in res.parts}


# -- holds / does not hold / inconclusive ------------------------------------------------------------------------


def test_c1_holds_when_the_proxy_rises_and_the_split_half_drop_is_real():
    rng = np.random.default_rng(0)
    res = verdicts({"ppo_beta_grid": [beta_run(s, 0.0, rng) for s in range(5)]})["C1"]
    assert res.verdict == "holds", res.reason
    drop = parts(res)["gold falls from its peak"].measured.effect
    assert drop.n == 5 and drop.lo > 0.3 and drop.estimate == pytest.approx(0.5, abs=0.05)


def test_c1_does_not_hold_inside_the_margin_when_gold_never_falls():
    rng = np.random.default_rng(1)
    runs = [beta_run(s, 0.0, rng, gold=np.full(STEPS, 0.5)) for s in range(5)]  # flat gold, noisy halves
    res = verdicts({"ppo_beta_grid": runs})["C1"]
    drop = parts(res)["gold falls from its peak"]
    assert -0.05 <= drop.measured.effect.lo and drop.measured.effect.hi <= 0.05  # negligible: within ±margin
    assert drop.verdict == "does not hold" and res.verdict == "does not hold"
    assert "gold falls from its peak" in res.reason


def test_the_drop_needs_the_halves_never_max_minus_last():
    rng = np.random.default_rng(2)
    runs = [beta_run(s, 0.0, rng, halves=False) for s in range(5)]  # a clear fall on the one eval curve
    assert runs[0].peak("eval/gold_reward") - runs[0].last("eval/gold_reward") > 0.3  # max − last would say 0.5
    assert all(math.isnan(quantities.gold_drop(r)) for r in runs)
    res = verdicts({"ppo_beta_grid": runs})["C1"]
    assert res.verdict == "inconclusive" and "eval/gold_reward_a" in res.reason


def _collapse_grid(entropy0: list[float], entropy1: list[float], distinct_gap: list[float]) -> list[RunData]:
    rng = np.random.default_rng(3)
    runs = []
    for s, (e0, e1, dg) in enumerate(zip(entropy0, entropy1, distinct_gap)):
        runs.append(beta_run(s, 0.0, rng, **{"eval/entropy": np.linspace(2.0, e0, STEPS),
                                             "eval/distinct_2": np.linspace(0.9, 0.6 + dg, STEPS)}))
        runs.append(beta_run(s, 0.1, rng, **{"eval/entropy": np.linspace(2.0, e1, STEPS),
                                             "eval/distinct_2": np.linspace(0.9, 0.6, STEPS)}))
    return runs


def test_c2_holds_paired_over_seeds():
    res = verdicts({"ppo_beta_grid": _collapse_grid([0.5, 0.6, 0.4, 0.5, 0.55], [1.8] * 5, [-0.3, -0.25, -0.35,
                                                                                          -0.3, -0.28])})["C2"]
    assert res.verdict == "holds", res.reason
    e = parts(res)["entropy collapses"].measured.effect
    assert e.method == "paired t" and e.n == 5 and e.hi < 0


def test_c2_does_not_hold_by_sign():
    # the unpenalised policy keeps *more* entropy than β = 0.1 on every seed: the CI excludes 0 on the wrong side
    res = verdicts({"ppo_beta_grid": _collapse_grid([1.9, 1.95, 1.85, 1.9, 1.92], [1.5, 1.45, 1.55, 1.5, 1.48],
                                                    [0.1, 0.12, 0.09, 0.1, 0.11])})["C2"]
    assert parts(res)["entropy collapses"].measured.effect.lo > 0
    assert res.verdict == "does not hold" and "entropy collapses" in res.reason


def test_c2_inconclusive_when_the_interval_straddles_zero_beyond_the_margin():
    res = verdicts({"ppo_beta_grid": _collapse_grid([1.5, 2.2, 1.6, 2.3, 1.7], [1.8] * 5,
                                                    [-0.2, 0.15, -0.1, 0.2, -0.15])})["C2"]
    e = parts(res)["entropy collapses"].measured.effect
    assert e.lo < -0.05 and e.hi > 0.05
    assert res.verdict == "inconclusive"


def test_c2_without_a_penalised_arm_is_not_holds():
    runs = [r for r in _collapse_grid([0.5] * 5, [1.8] * 5, [-0.3] * 5) if r.fnum("kl.beta") == 0]
    res = verdicts({"ppo_beta_grid": runs})["C2"]
    assert res.verdict == "inconclusive" and "fixed β = 0.1" in res.reason


def test_paired_effects_use_only_the_seeds_both_arms_ran():
    runs = _collapse_grid([0.5] * 5, [1.8] * 5, [-0.3] * 5)
    runs = [r for r in runs if r.fnum("kl.beta") == 0.1 or r.seed in ("0", "1", "2")]
    e = parts(verdicts({"ppo_beta_grid": runs})["C2"])["entropy collapses"].measured.effect
    assert e.n == 3 and e.estimate == pytest.approx(-1.3)
    disjoint = [r for r in runs if (r.fnum("kl.beta") == 0) == (r.seed in ("0", "1"))]  # β = 0: seeds 0, 1 only
    m = parts(verdicts({"ppo_beta_grid": disjoint})["C2"])["entropy collapses"].measured
    assert m.effect is None and "in both fixed β = 0 and fixed β = 0.1" in m.missing


# -- C10: gao_rm_scaling's length-biased arm against its unbiased control -----------------------------------------


def _c10_runs(labeler: str, prefs: list[float], growth: float, shared_rm: bool = False,
              length_bonus: float = 0.25) -> list[RunData]:
    """gao_rm_scaling's β = 0 PPO runs of one labeler arm: RMs micro and medium, one per seed (or one shared), each
    RM's rm/length_preference prefs[seed], eval/length growing by `growth` tokens over the run."""
    rng = np.random.default_rng(4 if labeler == "unbiased" else 5)
    runs = []
    for size in ("micro", "medium"):
        for s, pref in enumerate(prefs):
            k = 0 if shared_rm else s
            rm = {"run_id": f"rm-{labeler}-{size}-{k}", "metrics": {"rm/length_preference": pref}}
            runs.append(make_run(s, {"sweep.labeler": labeler, "sweep.rm_size": size, "labeler.name": labeler,
                                     "labeler.length_bonus": length_bonus if labeler == "length_biased" else 0.0},
                                 with_halves(rise_fall(), rng) | {"eval/length": 15 + growth * T
                                                                   + rng.normal(0, 0.3, STEPS)}, rm=rm))
    return runs


def _c10(biased: list[RunData], unbiased: list[RunData]) -> C.ClaimResult:
    return verdicts({"gao_rm_scaling": biased + unbiased})["C10"]


def test_c10_holds_when_the_biased_rms_prefer_length_and_ppo_lengthens_beyond_the_control():
    res = _c10(_c10_runs("length_biased", [0.15, 0.18, 0.16, 0.2, 0.17], growth=20.0),
               _c10_runs("unbiased", [0.0, 0.01, -0.01, 0.0, 0.01], growth=5.0))
    m = parts(res)["PPO exploits it"].measured
    assert m.effect.n == 5 and m.effect.estimate == pytest.approx(15.0, abs=0.5)  # 20 − 5 tokens, per seed
    assert res.verdict == "holds", res.reason


def test_c10_length_growth_that_the_unbiased_control_shows_too_is_not_exploitation():
    res = _c10(_c10_runs("length_biased", [0.15, 0.18, 0.16, 0.2, 0.17], growth=20.0),
               _c10_runs("unbiased", [0.0, 0.01, -0.01, 0.0, 0.01], growth=20.0))
    exploits = parts(res)["PPO exploits it"]
    assert abs(exploits.measured.effect.estimate) < 0.5 and exploits.verdict != "holds"
    assert res.verdict != "holds"


def test_c10_a_tiny_difference_in_length_preference_is_not_a_learned_bias():
    res = _c10(_c10_runs("length_biased", [0.001, 0.003, -0.002, 0.002, 0.0], growth=20.0),
               _c10_runs("unbiased", [0.0, 0.001, -0.001, 0.0, 0.001], growth=5.0))
    learned = parts(res)["the RM learns the length bias"]
    assert learned.measured.effect.n == 5 and learned.verdict == "does not hold"  # inside ±0.02: negligible
    assert res.verdict == "does not hold"


def test_c10_one_shared_rm_per_arm_is_not_replicated():
    res = _c10(_c10_runs("length_biased", [0.15] * 5, growth=20.0, shared_rm=True),
               _c10_runs("unbiased", [0.0] * 5, growth=5.0, shared_rm=True))
    assert res.verdict == "inconclusive" and res.reason.startswith("not replicated"), res.reason


def test_c10_an_unbiased_biased_arm_fails_the_precondition():
    res = _c10(_c10_runs("length_biased", [0.15, 0.18, 0.16, 0.2, 0.17], growth=20.0, length_bonus=0.0),
               _c10_runs("unbiased", [0.0, 0.01, -0.01, 0.0, 0.01], growth=5.0))
    assert res.verdict == "inconclusive" and "cannot be tested" in res.reason


# -- preconditions and grouped designs: C13 ----------------------------------------------------------------------


def _rm_size_runs(drop_small: float, drop_large: float) -> list[RunData]:
    rng = np.random.default_rng(5)
    runs = []
    for policy, n in (("a_small", 1e5), ("a_medium", 8e5)):
        for rm_n, drop in ((3e4, drop_small), (8e5, drop_large)):
            for s in range(5):  # one RM per size and seed (reward_model.seed: ${seed})
                gold = rise_fall(drop) if drop > 0 else np.full(STEPS, 0.4)
                r = make_run(s, {"sweep.policy": policy, "sweep.rm_size": rm_n}, with_halves(gold, rng),
                             metrics={"model/params_total": n},
                             rm={"run_id": f"rm{rm_n}-{s}", "metrics": {"model/params_total": rm_n}})
                runs.append(r)
    return runs


def _gao_runs(drop_small: float, drop_large: float, labeler: str = "unbiased", kl_small: float = 8.0,
              kl_large: float = 8.0) -> list[RunData]:
    """gao_rm_scaling's PPO runs: RM micro and medium, one RM per seed, gold rise_fall(drop), KL rising to kl_*."""
    rng = np.random.default_rng(5)
    runs = []
    for size, rm_n, drop, kl_end in (("micro", 9e3, drop_small, kl_small), ("medium", 8.7e5, drop_large, kl_large)):
        for s in range(5):
            gold = rise_fall(drop) if drop > 0 else np.full(STEPS, 0.4)
            runs.append(make_run(s, {"sweep.labeler": labeler, "sweep.rm_size": size, "labeler.name": labeler},
                                 with_halves(gold, rng) | {"eval/kl": kl_end * T ** 1.5},
                                 rm={"run_id": f"rm{rm_n}-{s}", "metrics": {"model/params_total": rm_n}}))
    return runs


def test_c13_holds_when_the_larger_rm_hacks_less_but_still_hacks():
    res = verdicts({"gao_rm_scaling_kl": _gao_runs(0.5, 0.2)})["C13"]
    assert res.verdict == "holds", res.reason
    reduces = parts(res)["a larger RM reduces it"].measured
    assert reduces.effect.n == 5 and reduces.effect.estimate == pytest.approx(0.3, abs=0.05)
    assert reduces.detail.startswith("KL matched per seed: 8.0–8.0 nats")


def test_c13_without_hacking_is_untestable_not_false():
    res = verdicts({"gao_rm_scaling_kl": _gao_runs(0.0, 0.0)})["C13"]
    assert res.verdict == "inconclusive" and "there is hacking to reduce" in res.reason


def test_c13_compares_the_drop_at_a_matched_kl():
    """The smallest RM goes twice as far in KL: up to the largest RM's final KL (a quarter of its KL range, ≈ 40 %
    of its steps, before its peak at 60 %) it has not dropped, so the larger RM reduces nothing there."""
    res = verdicts({"gao_rm_scaling_kl": _gao_runs(0.5, 0.2, kl_small=32.0)})["C13"]
    reduces = parts(res)["a larger RM reduces it"]
    assert reduces.measured.detail.startswith("KL matched per seed: 8.0–8.0 nats")
    assert reduces.measured.effect.estimate < 0.1 and reduces.verdict != "holds"
    # the length-biased arm is read from gao_rm_scaling's runs, and is shown, not judged
    biased = verdicts({"gao_rm_scaling_kl": _gao_runs(0.5, 0.2),
                       "gao_rm_scaling": _gao_runs(0.5, 0.2) + _gao_runs(0.4, 0.4, "length_biased")})["C13"]
    shown = parts(biased)["hacking with the length-biased labeler, smallest vs largest RM"]
    assert abs(shown.measured.effect.estimate) < 0.1 and biased.verdict == "holds"
    assert C.verdict_cell(shown).startswith("shown: ")  # worded from its interval, not a hand-written conclusion


# -- ratios and margins: C6 ------------------------------------------------------------------------------------


def test_c6_memory_holds_compute_inside_the_margin_so_the_claim_does_not_hold():
    rng = np.random.default_rng(6)
    runs = []
    for s in range(4):
        for kind, nbytes, rss in (("copy", 2.0e6, 906.0), ("lora_disabled", 1.1e6, 900.0)):
            step = 1.0 + rng.normal(0, 0.005, 20)
            runs.append(make_run(s, {"sweep.algo.reference.kind": kind}, {
                "eval/gold_reward": np.full(STEPS, 0.5), "time/step_s": step},
                metrics={"memory/model_bytes": nbytes, "memory/peak_rss_mb": rss + rng.normal(0, 0.3)}))
    res = verdicts({"ref_shared": runs})["C6"]
    memory, compute = parts(res)["a separate reference costs memory"], parts(res)["a separate reference costs compute"]
    assert memory.verdict == "holds" and memory.measured.effect.estimate == pytest.approx(6.0, abs=0.6)  # MB
    nbytes = parts(res)["the models' bytes with the copy"]  # exact, shown
    assert nbytes.verdict is None and nbytes.measured.effect.estimate == pytest.approx(100 * (2.0 / 1.1 - 1))
    assert compute.verdict == "does not hold"  # within ±5 %
    assert res.verdict == "does not hold"


# -- C9: KL control, paired per seed -------------------------------------------------------------------------------


# DPO's final KL over β = 0.03, 0.1, 0.3, 1 per seed, out of order: |ρ| = 0, 0, 0.2, 0.2 (hand: 1 − 6Σd²/(n³ − n))
SHUFFLED = [(4.0, 9.0, 3.0, 6.0), (6.0, 3.0, 9.0, 4.0), (4.0, 6.0, 9.0, 3.0), (3.0, 9.0, 6.0, 4.0)]


def _c9(dpo_monotone: bool) -> dict:
    rng = np.random.default_rng(7)
    ppo, dpo = [], []
    for s in range(4):
        for b, kl in zip((0.01, 0.03, 0.1, 0.3), (20.0, 10.0, 5.0, 2.0)):
            ppo.append(beta_run(s, b, rng, **{"eval/kl": kl * T}))
        kls = (9.0, 6.0, 4.0, 3.0) if dpo_monotone else SHUFFLED[s]
        for b, kl in zip((0.03, 0.1, 0.3, 1.0), kls):
            dpo.append(make_run(s, {"sweep.algo.beta": b}, {"eval/gold_reward": np.full(STEPS, 0.3),
                                                            "eval/kl": kl * T}, stage="dpo"))
    return {"ppo_beta_grid": ppo, "dpo_beta_grid": dpo}


def test_c9_does_not_hold_when_dpo_beta_sets_kl_as_reliably():
    res = verdicts(_c9(dpo_monotone=True))["C9"]
    assert parts(res)["β sets PPO's KL more reliably than DPO's"].measured.effect.n == 4
    assert res.verdict == "does not hold"


def test_c9_holds_when_dpo_kl_does_not_follow_beta():
    res = verdicts(_c9(dpo_monotone=False))["C9"]
    e = parts(res)["β sets PPO's KL more reliably than DPO's"].measured.effect
    assert e.estimate == pytest.approx(0.9) and e.lo > 0  # PPO |ρ| = 1 on every seed
    assert res.verdict == "holds"


def test_c9_with_one_study_missing_is_not_run_yet():
    res = verdicts({"ppo_beta_grid": _c9(True)["ppo_beta_grid"]})["C9"]
    assert res.verdict == "not run yet" and "rlhf-lab -m sweep=dpo_beta_grid" in res.reason


# -- RM runs: C19, paired by the RM's seed, one value per RM -----------------------------------------------------


def test_c19_holds_from_rm_job_runs_paired_by_seed():
    rng = np.random.default_rng(8)
    runs = [make_run(s, {"sweep.reward_model.lora.r": r}, stage="rm",
                     metrics={"rm/accuracy": acc + rng.normal(0, 0.003), "rm/accuracy_gold": acc - 0.05})
            for s in range(5) for r, acc in ((8, 0.78), (64, 0.81), (0, 0.82))]
    res = verdicts({"rm_lora": runs})["C19"]
    assert res.verdict == "holds", res.reason
    assert parts(res)["r = 8 fits the preferences worse"].measured.effect.n == 5


def test_c19_ppo_runs_sharing_one_rm_per_rank_give_one_pair():
    rng = np.random.default_rng(9)
    runs = []
    for rank, acc in ((8, 0.78), (64, 0.81)):
        rm = {"run_id": f"rm_r{rank}", "params": {"seed": "0"}, "metrics": {"rm/accuracy": acc}}
        for s in range(5):
            r = beta_run(s, 0.1, rng)
            r.params["sweep.reward_model.lora.r"] = str(rank)
            r.rm = rm
            runs.append(r)
    res = verdicts({"rm_lora": runs})["C19"]
    assert parts(res)["r = 8 fits the preferences worse"].measured.effect.n == 1
    assert res.verdict == "inconclusive"


# -- not run yet, not testable, unusable runs --------------------------------------------------------------------


def test_claims_without_runs_say_not_run_yet_with_the_command():
    res = verdicts({})
    for cid in ("C1", "C3", "C6", "C7", "C8", "C11", "C12", "C14", "C15", "C19", "C20"):
        assert res[cid].verdict == "not run yet"
        assert f"rlhf-lab -m sweep={claims_registry.BY_ID[cid].studies[0]}" in res[cid].reason
    assert res["C21"].verdict == "not testable"


def test_a_study_with_only_failed_or_short_runs_is_inconclusive_not_unrun():
    rng = np.random.default_rng(10)
    failed = [beta_run(s, 0.0, rng) for s in range(3)]
    for r in failed:
        r.status = "FAILED"
    short = make_run(4, {"kl.name": "fixed", "kl.beta": 0}, {"eval/gold_reward": [0.1, 0.2, 0.3]})
    res = verdicts({"ppo_beta_grid": failed + [short]})["C1"]
    assert res.verdict == "inconclusive" and "none FINISHED" in res.reason


# -- per-run quantities ----------------------------------------------------------------------------------------


def test_final_gold_is_the_test_split_when_logged_else_the_last_eval():
    with_test = make_run(0, {}, {"eval/gold_reward": [0.1, 0.5]}, metrics={"test/gold_reward": 0.9})
    without = make_run(0, {}, {"eval/gold_reward": [0.1, 0.5]})
    assert quantities.final_gold(with_test) == 0.9 and quantities.final_gold_source(with_test) == "test"
    assert quantities.final_gold(without) == 0.5 and quantities.final_gold_source(without) == "last eval"


def test_split_half_drop_of_one_run_by_hand():
    a, b = [0.0, 1.0, 0.5], [0.2, 0.9, 0.4]
    r = make_run(0, {}, {"eval/gold_reward_a": a, "eval/gold_reward_b": b})
    # peak on A at step 1, measured on B: 0.9 − 0.4 = 0.5; peak on B at step 1, measured on A: 1.0 − 0.5 = 0.5
    assert quantities.gold_drop(r) == pytest.approx(0.5)
    assert math.isnan(quantities.gold_drop(make_run(0, {}, {"eval/gold_reward_a": a[:2], "eval/gold_reward_b": b[:2]})))


# -- the report ------------------------------------------------------------------------------------------------------


def test_report_names_the_data_the_interval_and_the_command(tmp_path):
    rng = np.random.default_rng(11)
    runs = [beta_run(s, 0.0, rng) for s in range(5)]
    for r in runs[:2]:
        r.metrics["test/gold_reward"] = 0.3
    text = C.write_claims_report(tmp_path, uri="sqlite:///x.db", studies={"ppo_beta_grid": runs}).read_text()
    assert "`test/gold_reward` (the held-out test split) for 2 of them" in text
    assert "95% Student-t interval" in text and "gold reward: ±0.05" in text
    assert "| C1 |" in text and "**holds**" in text and "rlhf-lab -m sweep=ppo_beta_grid" in text
    assert "5 logged the gold reward on two fixed halves" in text
    row = next(line for line in text.splitlines() if "| gold falls from its peak |" in line)
    assert "[" in row and "gold reward" in row and "5 seeds" in row


def test_registry_covers_every_claim_once():
    ids = [c.id for c in claims_registry.CLAIMS]
    assert ids == [f"C{i}" for i in range(1, 22)]
    for c in claims_registry.CLAIMS:
        if c.untestable:
            continue
        judged = [p for p in c.parts if p.role == claims_registry.JUDGED]
        assert c.studies and judged, c.id
        assert all(p.direction in (1, -1) and (p.margin is None or p.margin > 0) for p in judged), c.id
    studied = {s for c in claims_registry.CLAIMS for s in c.studies}
    assert {"ref_sync", "ref_shared", "kl_estimators", "ref_size", "length_penalty", "clip_eps", "critic_baseline",
            "rm_lora", "rm_normalize", "ppo_beta_grid", "dpo_beta_grid", "rm_size_vs_policy_size",
            "gao_rm_scaling", "rm_mis_scoring_probe"} <= studied


def test_kl_estimators_arms_are_the_options_its_sweep_runs():
    """C7's arms are read from the option files kl_estimators sweeps (sweeps/kl_est/, issue 47: each study's arms
    defined once): one arm per swept option, matching exactly the values its file sets, so that editing the file
    moves the arm with it; a job composed with the option has those values."""
    from pathlib import Path

    import yaml
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from rlhf_lab_research.designs import K1_REWARD, K3_LOSS, K3_REWARD, option_arm

    root = Path(__file__).resolve().parents[1] / "sweeps"
    swept = yaml.safe_load((root / "sweep" / "kl_estimators.yaml").read_text())["hydra"]["sweeper"]["params"]["+kl_est"]
    arms = {"k1_reward": K1_REWARD, "k3_reward": K3_REWARD, "k3_loss": K3_LOSS}
    assert sorted(swept.split(",")) == sorted(arms)
    c7 = next(c for c in claims_registry.CLAIMS if c.id == "C7")
    assert c7.studies == (claims_registry.KL_EST,)
    with initialize_config_module("rlhf_lab.conf", version_base="1.3"):
        for option, arm in arms.items():
            assert arm.where == {"algo.kl_estimator": option[:2], "algo.kl_in": option[3:]}, option
            cfg = compose("config", overrides=["sweep=kl_estimators", f"+kl_est={option}", "seed=0"])
            assert all(OmegaConf.select(cfg, k) == v for k, v in arm.where.items()), option
    with pytest.raises(ValueError):
        option_arm("ppo_kl", "fixed_0", "a file that chooses the kl group")  # defaults: not values alone
    with pytest.raises(FileNotFoundError):
        option_arm("kl_est", "k9_nowhere", "no such option")


# -- fits ---------------------------------------------------------------------------------------------------------


def test_r_squared_by_hand():
    # SS_res = 0.01 + 0.01 + 0.04 + 0.04 = 0.10, SS_tot = 2.25 + 0.25 + 0.25 + 2.25 = 5: R² = 0.98
    assert fits.r_squared([1, 2, 3, 4], [1.1, 1.9, 3.2, 3.8]) == pytest.approx(0.98)


def test_fit_rl_r2_against_a_hand_least_squares():
    d = np.array([0.5, 1.0, 1.5, 2.0, 2.5, 3.0])
    r = d * (0.5 - 0.25 * np.log(d)) + np.array([0.02, -0.03, 0.01, 0.04, -0.02, 0.0])
    # least squares on the reward scale, r ≈ α·u + β·v with u = d, v = −d log d: the 2×2 normal equations by Cramer
    u, v = d, -d * np.log(d)
    suu, suv, svv, sur, svr = (u * u).sum(), (u * v).sum(), (v * v).sum(), (u * r).sum(), (v * r).sum()
    det = suu * svv - suv * suv
    alpha, beta = (sur * svv - svr * suv) / det, (suu * svr - suv * sur) / det
    pred = d * (alpha - beta * np.log(d))
    r2 = 1 - ((r - pred) ** 2).sum() / ((r - r.mean()) ** 2).sum()
    f = fits.fit_rl(d, r)
    assert (f.alpha, f.beta) == (pytest.approx(alpha), pytest.approx(beta))
    assert f.r2 == pytest.approx(r2) and 0.9 < f.r2 < 1
    # it is the best (α, β) on the reward scale: the old fit (least squares on r/d) has a lower R²
    x, y = np.log(d), r / d
    b_old = -((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    a_old = y.mean() + b_old * x.mean()
    assert fits.r_squared(r, d * (a_old - b_old * np.log(d))) < f.r2
    assert f.n == 6 and (f.d_lo, f.d_hi) == (0.5, 3.0)
    assert f.status == "peak in the data" and f.d_star == pytest.approx(math.exp(alpha / beta - 1))


def test_fits_refuse_fewer_than_five_points_and_name_peaks_outside_the_data():
    d = np.array([0.0, 0.5, 1.0, 1.5, 2.0])  # d = 0 (the start) is not a point: 4 remain
    f = fits.fit_rl(d, d * (0.5 - 0.25 * np.log(np.maximum(d, 1e-9))))
    assert f.status == "too few points" and f.n == 4 and math.isnan(f.alpha)
    assert all(math.isnan(x) for x in fits.fit_gao_rl(d, d))
    assert fit_cell([f], "alpha") == "too few points (4)" and peak_cell([f]) == "too few points (4)"
    d = np.linspace(0.5, 3.0, 6)
    beyond = fits.fit_rl(d, d * (0.4 - 0.1 * np.log(d)))  # d* = e³ ≈ 20 ≫ 3
    rising = fits.fit_rl(d, 0.3 * d)  # β = 0: no peak
    assert beyond.status == "peak beyond the data" and rising.status == "no peak"
    assert peak_cell([beyond]) == "beyond the data (√KL ≤ 3.00)"
    assert peak_cell([beyond, rising]) == "1 of 2: beyond the data (√KL ≤ 3.00); 1 of 2: no peak (still rising)"
    inside = fits.fit_rl(d, d * (0.5 - 0.25 * np.log(d)))  # d* = e ≈ 2.72 in [0.5, 3]
    assert peak_cell([inside, f]).startswith("2.718; 1 runs: too few points (4)")


# -- every claim of the registry on a synthetic world built to make it hold ------------------------------------------


def line(start: float, end: float, rng: np.random.Generator, sd: float = 0.01, n: int = STEPS) -> np.ndarray:
    return np.linspace(start, end, n) + rng.normal(0, sd, n)


def policy(seed: int, params: dict, gold_end: float, rng: np.random.Generator, stage: str = "ppo",
           **curves) -> RunData:
    metrics = curves.pop("_metrics", None)
    c = with_halves(line(0.0, gold_end, rng), rng) | {"eval/kl": line(0.0, 5.0, rng)}
    c.update(curves)
    return make_run(seed, params, c, stage=stage, metrics=metrics)


def c11_runs(seeds, rng: np.random.Generator, gold_at: dict | None = None) -> list[RunData]:
    """C11's grid: at α = 0 responses grow and gold rises then falls; a penalty shortens them; `gold_at`: {α: final
    gold} (default: α = 0.03 ends above α = 0's 0.3, a mitigation)."""
    gold_at = gold_at or {0.01: 0.35, 0.03: 0.45, 0.1: 0.1}
    out = []
    for k in seeds:
        for a, end in ((0, 25.0), (0.01, 20.0), (0.03, 16.0), (0.1, 6.0)):
            gold = rise_fall(0.1) if a == 0 else np.linspace(0, gold_at[a], STEPS)
            out.append(policy(k, {"sweep.algo.length_penalty": a}, 0.0, rng, **with_halves(gold, rng),
                              **{"eval/length": line(15.0, end, rng, sd=0.2)}))
    return out


def test_c11_holds_only_when_the_penalty_shortens_and_gives_more_gold():
    seeds = range(5)
    res = verdicts({"length_penalty": c11_runs(seeds, np.random.default_rng(1))})["C11"]
    assert res.verdict == "holds", res.reason
    only_shorter = verdicts({"length_penalty": c11_runs(seeds, np.random.default_rng(1),
                                                        {0.01: 0.2, 0.03: 0.0, 0.1: -0.5})})["C11"]
    gold = parts(only_shorter)["and mitigates the hacking: more gold, not only shorter text"]
    assert parts(only_shorter)["the penalty shortens responses"].verdict == "holds"
    assert gold.verdict == "does not hold" and gold.against and only_shorter.verdict == "does not hold"
    assert "more gold, not only shorter text" in only_shorter.reason


def ref_size_runs(rng: np.random.Generator, by_preset: dict[str, tuple[float, float]]) -> list[RunData]:
    """C8's ref_size: {preset: (its reference's own gold, the policy's final gold)}, two labelers, 5 seeds."""
    return [policy(k, {"sweep.algo.reference.path": f"sft@{p}", "sweep.labeler": lab}, g + rng.normal(0, 0.02), rng,
                   _metrics={"reference/gold_reward": ref + rng.normal(0, 0.02),
                             "eval/length": 10.0 if p == "a_tiny" else 12.0})
            for k in range(5) for p, (ref, g) in by_preset.items() for lab in ("unbiased", "length_biased")]


def world() -> dict[str, list[RunData]]:
    rng = np.random.default_rng(12)
    seeds = range(5)
    s: dict[str, list[RunData]] = {}
    grid = {0.0: (-0.2, 80.0), 0.001: (0.3, 40.0), 0.01: (0.8, 20.0), 0.03: (0.9, 10.0), 0.1: (0.8, 5.0),
            0.3: (0.5, 3.0), 1.0: (0.1, 1.0)}
    s["ppo_beta_grid"], s["kl_controller"] = [], []
    for k in seeds:
        rm = {"run_id": f"rm{k}", "params": {"seed": str(k)}, "metrics": {"rm/length_preference": 0.15 + 0.01 * k}}
        for beta, (gold, kl) in grid.items():
            curves = with_halves(rise_fall(0.6) if beta == 0 else line(0.0, gold, rng), rng) | {
                "eval/kl": line(0.0, kl, rng), "eval/proxy_reward": line(0.0, 1.5, rng),
                "eval/entropy": line(2.0, 0.5 if beta == 0 else 1.8, rng),
                "eval/distinct_2": line(0.9, 0.3 if beta == 0 else 0.8, rng),
                "eval/length": line(15.0, 21.0 if beta == 0 else 16.0, rng, sd=0.2)}
            r = make_run(k, {"kl.name": "fixed", "kl.beta": beta, "labeler.length_bonus": 0.25}, curves, rm=rm)
            s["ppo_beta_grid"].append(r)
        for target in (1.0, 4.0, 8.0):
            s["kl_controller"].append(make_run(k, {
                "kl.name": "adaptive", "kl.target": target, "kl.unit": "sequence", "kl.horizon": 128, "steps": 80,
                "algo.batch_size": 64}, {"eval/gold_reward": line(0.0, 0.8, rng),
                                         "eval/kl": line(0.0, target * (1 + rng.normal(0, 0.1)), rng)}, rm=rm))
    shuffled = SHUFFLED + [(9.0, 3.0, 6.0, 4.0)]
    s["dpo_beta_grid"] = [make_run(k, {"sweep.algo.beta": b}, {"eval/gold_reward": line(0, 0.4, rng),
                                                               "eval/kl": line(0, kl, rng)}, stage="dpo")
                          for k in seeds for b, kl in zip((0.03, 0.1, 0.3, 1.0), shuffled[k])]
    s["ref_sync"] = [policy(k, {"sweep.algo.reference.sync_every": n}, g, rng,
                            **{"objective/kl": line(0.0, 0.0 if n == 1 else 4.0, rng, n=20)})
                     for k in seeds for n, g in ((0, 0.8), (10, 0.5), (1, 0.1))]
    s["ref_shared"] = [policy(k, {"sweep.algo.reference.kind": kind}, 0.7, rng, **{
        "time/step_s": line(t, t, rng, n=20), "_metrics": {"memory/model_bytes": b,
                                                            "memory/peak_rss_mb": rss + np.random.default_rng(
                                                                [k, int(rss)]).normal(0, 0.3)}})  # own draws
        for k in seeds for kind, b, t, rss in (("copy", 2e6, 1.5, 906.0), ("lora_disabled", 1e6, 1.0, 900.0))]
    s["kl_estimators"] = [policy(k, {"sweep.algo.kl_estimator": est, "sweep.algo.kl_in": where}, 0.7, rng, **{
        "objective/kl_k1": line(0, 5, rng, sd=0.5, n=20), "objective/kl_k3": line(0, 5, rng, sd=0.1, n=20)})
        for k in seeds for est, where in (("k1", "reward"), ("k3", "reward"), ("k3", "loss"))]
    s["ref_size"] = ref_size_runs(rng, {"a_tiny": (-0.3, 0.5), "a_small": (-0.1, 0.8), "a_medium": (0.0, 0.85)})
    [policy(k, {}, 0.7, rng, **{"eval/length": line(15.0, end, rng, sd=0.2)})  # the draws C11's world once took,
     for k in seeds for end in (25.0, 20.0, 16.0)]                         # so the other studies' draws stay as they were
    s["length_penalty"] = c11_runs(seeds, np.random.default_rng(11))
    spike = np.r_[np.linspace(0, 1, 10), 2.0, np.linspace(1.1, 1.5, 9)]
    s["clip_eps"] = [policy(k, {"sweep.algo.clip_eps": e}, 0.7, rng, **{
        "policy/approxkl": line(akl, akl, rng, sd=0.001, n=20), "policy/clipfrac": line(0.1, 0.1, rng, n=20),
        "objective/scores": spike if e == 0.4 else np.linspace(0, 1.5, 20)})
        for k in seeds for e, akl in ((0.1, 0.005), (0.2, 0.01), (0.4, 0.03))]
    s["rm_size_vs_policy_size"] = _rm_size_runs(0.5, 0.2) + [
        r for r in _rm_size_runs(0.5, 0.2) if r.seed in ("0", "1")]  # a follow-up sweep: more runs, same seeds
    s["gao_rm_scaling"] = _gao_runs(0.5, 0.2) + _gao_runs(0.5, 0.3, "length_biased")
    s["gao_rm_scaling_kl"] = _gao_runs(0.5, 0.2)  # C13's unbiased arm, evaluated where KL moves
    for r in s["gao_rm_scaling"]:  # C10: the biased arm's RMs prefer length and its policies lengthen beyond the control
        biased = r.setting["labeler"] == "length_biased"
        r.params["labeler.length_bonus"] = "0.25" if biased else "0.0"
        r.rm["metrics"]["rm/length_preference"] = (0.15 if biased else 0.0) + rng.normal(0, 0.01)
        r.history["eval/length"] = [(10 * i, float(v)) for i, v in enumerate(line(15.0, 22.0 if biased else 16.0, rng,
                                                                                   sd=0.2))]
    s["gao_rm_scaling_bon"] = [  # best-of-n with the same RMs: n = 1 … 256 as the steps, gold rising with n
        make_run(k, {"sweep.labeler": "unbiased", "sweep.rm_size": size}, {
            "bon/gold_reward": gain * np.log1p(np.arange(STEPS)) + rng.normal(0, 0.01, STEPS),
            "bon/kl": np.log(2.0 ** np.arange(STEPS))}, stage="bon",
            rm={"run_id": f"rm{n}-{k}", "metrics": {"model/params_total": n}})
        for size, n, gain in (("micro", 9e3, 0.2), ("medium", 8.7e5, 0.3)) for k in seeds]
    s["critic_baseline"] = [policy(k, {"sweep.algo.critic": c}, 0.7, rng, **{
        "objective/advantage_var": line(v, v, rng, sd=0.05, n=20)}) for k in seeds for c, v in (("none", 2.0),
                                                                                                ("policy", 1.0))]
    s["rm_source"] = [policy(k, {"reward_model.source": src, "sweep.data.on_policy_fraction": frac,
                                 "sweep.reward_model.ensemble": ens}, g, rng,
                             **{"eval/gold_reward_ood": line(0, g - 0.2, rng)})
                      for k in seeds for src, frac, ens, g in (("same", 0.0, 1, 0.8), ("different", 0.0, 1, 0.5),
                                                               ("different", 0.2, 1, 0.75), ("same", 0.0, 3, 0.85))]
    s["rm_mis_scoring"] = [  # C17: the RM's accuracy on the policy's samples falls most for the different source
        policy(k, {"reward_model.source": src, "sweep.data.on_policy_fraction": frac, "sweep.labeler": lab}, g, rng,
               **{"eval/proxy_gold_agreement": line(0.8, acc, rng)})
        for k in seeds for lab in ("unbiased", "length_biased")
        for src, frac, g, acc in (("same", 0.0, 0.8, 0.78), ("different", 0.0, 0.5, 0.65), ("different", 0.2, 0.75, 0.74))]
    mis = np.random.default_rng(17)  # C17's own draws, so that the studies after it keep theirs
    s["rm_mis_scoring_probe"] = [  # C17: on the probe's text the different-source RM is the least accurate
        policy(k, {"reward_model.source": src, "sweep.data.on_policy_fraction": frac}, g, mis,
               **{"eval/proxy_gold_agreement": line(0.8, own, mis), "probe/proxy_gold_agreement": line(pr, pr, mis)})
        for k in seeds for src, frac, g, own, pr in (("same", 0.0, 0.8, 0.6, 0.78), ("different", 0.0, 0.5, 0.7, 0.65),
                                                    ("different", 0.2, 0.75, 0.74, 0.74))]
    s["rm_source_matched"] = [  # C16: the different-source RM's gold is noisier from step to step and drops
        policy(k, {"reward_model.source": src}, 0.6, rng, **with_halves(gold, rng, sd))
        for k in seeds for src, gold, sd in (("same", 0.6 * T, 0.01), ("different", 0.3 + rise_fall(0.3), 0.03))]
    s["rm_ensemble"] = [policy(k, {"sweep.reward_model.ensemble": ens, "sweep.reward_model.conservative_lambda": lam}, g,
                               rng) for k in seeds for ens, lam, g in ((3, 1.0, 0.82), (3, 0.0, 0.8), (1, 0.0, 0.78))]
    s["rm_lora"] = [make_run(k, {"sweep.reward_model.lora.r": r, "seed": k}, stage="rm",
                             metrics={"rm/accuracy": acc + rng.normal(0, 0.003), "rm/accuracy_gold": acc - 0.1})
                    for k in seeds for r, acc in ((8, 0.78), (64, 0.81), (0, 0.82))]
    s["rm_normalize"] = [policy(k, {"sweep.reward_model.normalize": n}, g, rng)
                         for k in seeds for n, g in (("true", 0.8), ("false", 0.5))]
    s["grpo_kl"] = grpo_kl_runs(rng, {0.0: 0.9, 0.04: 0.7})
    for name in ("rm_source", "rm_mis_scoring", "rm_mis_scoring_probe", "rm_source_matched", "rm_ensemble",
                 "rm_normalize"):  # one RM per seed
        for r in s[name]:
            shared = {k: v for k, v in r.setting.items() if k != "reward_model.normalize"}  # applied at use time
            r.tags["rlhf_lab.upstream.rm"] = f"rm {name} {sorted(shared.items())} {r.seed}"
    return s


def grpo_kl_runs(rng: np.random.Generator, gold_end: dict[float, float]) -> list[RunData]:
    return [policy(k, {"sweep.kl.beta": b}, g, rng, stage="grpo", **{"eval/kl": line(0.0, 30.0 if b == 0 else 6.0, rng)})
            for k in range(5) for b, g in gold_end.items()]


def test_every_testable_claim_holds_on_a_world_built_for_it(tmp_path):
    studies = world()
    res = verdicts(studies)
    assert {cid: r.verdict for cid, r in res.items() if r.verdict != "holds"} == {
        "C21": "not testable"}, {cid: r.reason for cid, r in res.items()}
    for r in res.values():  # shown parts computed too
        for p in r.parts:
            assert p.measured.effect is not None and p.measured.effect.n >= 3, (r.claim.id, p.part.says)
    assert parts(res["C4"])["the good β is not below 0.01"].measured.detail.startswith("best β in 0.01–0.1: 0.9")
    assert parts(res["C4"])["the good β is not above 0.1"].measured.effect.n == 5
    assert parts(res["C5"])["KL ends near a target of 4 nats"].measured.effect.n == 5  # one run per seed
    assert parts(res["C6"])["the models' bytes with the copy"].measured.effect.estimate == pytest.approx(100)
    text = C.write_claims_report(tmp_path, studies=studies).read_text()
    assert text.count("**holds**") >= 19 + 19  # summary table + the judged rows


def test_claims_read_the_5_seed_rerun_of_a_study_when_it_has_runs(monkeypatch):
    rng = np.random.default_rng(0)
    stored = {"ppo_beta_grid": [policy(k, {"sweep.kl.beta": 0.1}, 0.5, rng) for k in range(3)],
              "ppo_beta_grid_5seeds": [policy(k, {"sweep.kl.beta": 0.1}, 0.7, rng) for k in range(5)],
              "rm_source": [policy(k, {"reward_model.source": "same"}, 0.6, rng) for k in range(2)]}
    for name, rs in stored.items():
        for r in rs:
            r.tags["rlhf_lab.study"] = name  # as load_study's runs carry it
    monkeypatch.setattr(C, "load_study", lambda name, uri=None, **kw: (stored.get(name, []), []))
    studies, present = C.counted(C.load_claim_runs(None, ["ppo_beta_grid", "rm_source"])[0])
    assert len(studies["ppo_beta_grid"]) == 5 and present["ppo_beta_grid"] == 5  # the rerun, not a mix
    assert len(studies["rm_source"]) == 2  # no rerun yet: the older study


def test_c14_is_a_non_inferiority_test_at_the_gold_margin():
    rng = np.random.default_rng(14)
    res = verdicts({"grpo_kl": grpo_kl_runs(rng, {0.0: 0.3, 0.04: 0.7})})["C14"]
    assert res.verdict == "does not hold", res.reason  # the KL term gives 0.4 more gold: beyond −0.05
    shown = parts(res)["GRPO's distance from the reference without the KL term"]
    drift = shown.measured.effect
    assert drift.n == 5 and drift.lo > 1.0  # ln(30 / 6) ≈ 1.6
    assert C.verdict_cell(shown) == "shown: drifts further without the KL term (unadjusted)"  # the words follow the interval
    tie = verdicts({"grpo_kl": grpo_kl_runs(rng, {0.0: 0.7, 0.04: 0.7})})["C14"]
    e = parts(tie)["group normalisation alone does at least as well as the KL term"]
    assert e.measured.effect.lo > -0.05 and tie.verdict == "holds", tie.reason  # a tie is "at least as well"
    # an interval that includes 0 (superiority would be inconclusive) but lies above −0.05 holds
    worse = verdicts({"grpo_kl": grpo_kl_runs(rng, {0.0: 0.68, 0.04: 0.7})})["C14"]
    e = parts(worse)["group normalisation alone does at least as well as the KL term"]
    assert -0.05 < e.measured.effect.lo < 0 and worse.verdict == "holds", worse.reason
    assert e.p == pytest.approx(e.measured.effect.p_value(+1, null=-0.05))
    assert "> -0.05 (non-inferiority)" in "\n".join(C.claim_section(worse))


def test_provenance_rows_name_each_studys_commits_and_dates():
    def run(study, commit, start, end):
        return RunData("r", "ppo", "FINISHED", {}, {"rlhf_lab.study": study, "rlhf_lab.git_commit": commit}, {},
                       start_time=start, end_time=end)

    hour = 3_600_000
    rows = provenance_rows([run("b", "ff65520abc", 2 * hour, 3 * hour), run("a", "ecc896c123", 0, hour),
                              run("b", "665c774def", hour, 4 * hour), run("b", "ff65520abc", 5 * hour, 6 * hour)])
    assert rows == [["`a`", 1, "0", "ecc896c (1)", "? – 1970-01-01 01:00", "–"],
                    ["`b`", 3, "0", "665c774 (1), ff65520 (2)", "1970-01-01 01:00 – 1970-01-01 06:00", "–"]]


def test_a_policy_runs_data_keys_come_from_its_upstream_rm_run():
    """+rm_src=different_mix sets data.on_policy_fraction without a swept value, and a PPO run does not log the
    data keys: its upstream RM run does. Without that, the mixed arm read as fraction 0 and joined the plain one."""
    r = RunData("r", "ppo", "FINISHED", {"reward_model.source": "different"}, {}, {})
    assert r.value("data.on_policy_fraction", 0.0) == 0.0  # no RM run known: the default
    r.rm = {"params": {"data.on_policy_fraction": "0.2", "algo.name": "rm"}}
    assert r.value("data.on_policy_fraction", 0.0) == "0.2"
    assert r.value("algo.name", "ppo") == "ppo"  # other keys never from the RM run (a cached RM: another job's)
    assert designs.DIFF_MIX.matches(r) and not designs.DIFF.matches(r)


def test_c8_compares_references_that_differ_only_in_size_and_needs_the_smaller_to_be_worse():
    rng = np.random.default_rng(8)
    res = verdicts({"ref_size": ref_size_runs(rng, {"a_tiny": (-0.3, 0.5), "a_small": (-0.1, 0.8),
                                                      "a_medium": (0.0, 0.85)})})["C8"]
    assert res.verdict == "holds", res.reason
    p = parts(res)
    assert p["a smaller reference caps the policy"].measured.effect.estimate == pytest.approx(0.3, abs=0.05)
    above = p["how far above its reference the policy gets (a_tiny)"].measured.effect
    assert above.estimate == pytest.approx(0.8, abs=0.05) and above.n == 5
    # references of equal gold: the precondition fails, and a smaller one that gives the same gold is no cap
    res = verdicts({"ref_size": ref_size_runs(rng, {"a_tiny": (-0.1, 0.8), "a_small": (-0.1, 0.8)})})["C8"]
    assert res.verdict == "inconclusive", res.reason
