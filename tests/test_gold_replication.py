"""rlhf_lab_research.studies.gold_replication on made-up runs: the per-run ρ against the formula (gold RM and −KL),
the (gold, proxy) cells as the unit, the primary interval over the cells and the report's lines. No training."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlhf_lab.analysis.study_runs import RunData
from rlhf_lab_research.studies import gold_replication as R

STEPS = list(range(0, 90, 10))


def run(i: int, stage: str, gold: int, proxy: int, formula, rm, kl, status: str = "FINISHED") -> RunData:
    hist = {"eval/formula_gold_reward": list(zip(STEPS, formula)), "eval/gold_reward": list(zip(STEPS, rm)),
            "eval/kl": list(zip(STEPS, kl))}
    params = {"gold.build.reward_model.seed": str(gold), "gold.build.data.seed": str(gold + 1),
              "reward_model.seed": str(proxy)}
    return RunData(f"r{i}", stage, status, params, {}, {}, hist, {}, {}, str(30 + i % 2))


def world(rng, agree: float = 1.0) -> list[RunData]:
    """Gold rises then falls (hacking); the gold RM follows it with `agree` of its shape; KL grows throughout."""
    shape = np.r_[np.linspace(0, 1, 5), np.linspace(0.8, -0.5, 4)]
    out, i = [], 0
    for g in (0, 1):
        for p in (0, 1, 2):
            for stage in ("grpo", "rloo", "ppo"):
                for _ in range(2):
                    f = shape + rng.normal(0, 0.05, 9)
                    out.append(run(i, stage, g, p, f, agree * f + (1 - agree) * rng.normal(0, 1, 9),
                                   np.linspace(0, 20, 9) + rng.normal(0, 0.1, 9)))
                    i += 1
    return out


def test_kl_rho_by_hand_and_the_cells_are_the_units():
    r = run(0, "grpo", 0, 0, [0.0, 1.0, 2.0, 1.5, 0.5], [0.0, 1.0, 2.0, 1.5, 0.5], [1.0, 2.0, 3.0, 4.0, 5.0])
    # formula ranks 1 3 5 4 2, −KL ranks 5 4 3 2 1: d = −4 −1 2 2 1, Σd² = 26, ρ = 1 − 6·26/(5·24) = −0.3
    assert R.kl_rho(r) == pytest.approx(-0.3)
    runs = world(np.random.default_rng(0))
    held = R.cells(runs)
    assert len(held) == 6 and all(v[2] == 4 for v in held.values())  # 2 held-out algorithms x 2 seeds per cell
    assert all(v[0] > 0.9 for v in held.values()) and all(v[1] < 0.5 for v in held.values())
    failed = runs + [run(99, "grpo", 0, 0, [0] * 9, [0] * 9, [0] * 9, status="FAILED")]
    assert R.cells(failed) == held  # a failed run enters no cell


def test_primary_over_the_cells_meets_the_bar_and_beats_kl_only_when_it_should():
    gold, kl, diff = R.primary(R.cells(world(np.random.default_rng(1))))
    assert gold.n == kl.n == diff.n == 6 and gold.lo > 0.5 and diff.lo > 0
    text = "\n".join(R.render(world(np.random.default_rng(1)), ["rlhf-lab -m sweep=gold_rm_replication"]))
    assert "**meets the bar**" in text and "ranks the formula's gold better than −KL" in text
    noisy = "\n".join(R.render(world(np.random.default_rng(2), agree=0.0), []))
    assert "**does not meet the bar**" in noisy and "not shown to rank better than −KL" in noisy
    assert math.isnan(R.primary({})[0].estimate)
