"""The divergence guard (rlhf_lab/algorithms/guards.py): hand-computed cases, and its defaults replayed over every
step of every run of the committed studies (reports/claims_runs.json.gz): it never fires there."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rlhf_lab.algorithms.guards import Diverged, check_divergence, check_finite, divergence
from tests.conftest import compose_cfg

ROOT = Path(__file__).resolve().parents[1]
BOUNDS = dict(max_kl=1000.0, min_entropy=1e-4, max_approxkl=5.0, max_entropy_ratio=0.95, vocab_size=384)


def test_each_bound_names_its_key():
    ok = {"objective/kl": 50.0, "objective/entropy": 1.0, "policy/approxkl": 0.5}
    assert divergence(ok, 3, **BOUNDS) is None
    assert "algo.max_kl=1000.0" in divergence({**ok, "objective/kl": 1001.0}, 3, **BOUNDS)
    assert "algo.min_entropy=0.0001" in divergence({**ok, "objective/entropy": 5e-5}, 3, **BOUNDS)
    assert divergence({**ok, "policy/approxkl": 4.9}, 3, **BOUNDS) is None
    why = divergence({**ok, "policy/approxkl": 5.1}, 3, **BOUNDS)
    assert "policy/approxkl" in why and "algo.max_approxkl=5.0 at PPO step 3" in why and "algo.lr" in why
    # uniform over 384 tokens: log 384 = 5.953 nats; 0.95 of it = 5.655
    assert divergence({**ok, "objective/entropy": 5.6}, 3, **BOUNDS) is None
    why = divergence({**ok, "objective/entropy": 5.7}, 3, **BOUNDS)
    assert f"{math.log(384):.3g}" in why and "algo.max_entropy_ratio=0.95" in why
    # a policy that started near uniform (a barely trained checkpoint) is not stopped for staying there
    assert divergence({**ok, "objective/entropy": 5.7}, 3, **BOUNDS, start_entropy=5.8) is None
    assert "max_entropy_ratio" in divergence({**ok, "objective/entropy": 5.7}, 3, **BOUNDS, start_entropy=1.2)
    off = dict(BOUNDS, max_approxkl=None, max_entropy_ratio=None)
    assert divergence({**ok, "policy/approxkl": 1e9, "objective/entropy": 5.9}, 3, **off) is None
    with pytest.raises(Diverged, match="max_approxkl"):
        check_divergence({**ok, "policy/approxkl": 11.0}, 1, **BOUNDS)


def test_check_finite_finds_every_non_finite_value_and_only_those():
    import torch

    for bad in ([1.0, math.nan], [math.inf, 2.0], [-math.inf, 0.0], [math.inf, -math.inf]):
        with pytest.raises(FloatingPointError, match="non-finite w at PPO step 3"):
            check_finite("w", torch.tensor(bad), 3)
    check_finite("w", torch.tensor([3e38, 3e38, -1.0]), 3)  # finite values whose sum overflows: no stop
    check_finite("w", torch.tensor([1.0, math.nan]), 3, mask=torch.tensor([1, 0]))  # masked out
    with pytest.raises(FloatingPointError, match="2 values"):
        check_finite("w", torch.tensor([math.inf, -math.inf], dtype=torch.bfloat16), 0)


def test_the_shipped_defaults_are_the_tested_ones():
    for algo in ("ppo", "grpo", "rloo"):
        a = compose_cfg([f"algo={algo}"]).algo
        assert {k: a[k] for k in ("max_kl", "min_entropy", "max_approxkl", "max_entropy_ratio")} == {
            k: BOUNDS[k] for k in ("max_kl", "min_entropy", "max_approxkl", "max_entropy_ratio")}


def test_defaults_never_fire_on_the_committed_studies_runs():
    """Every logged step of every finished policy run behind reports/claims.md: its per-update approximate KL, its KL
    to the reference (k1 and k3 per response) and its entropy (the evaluations', and the last training step's), with
    the smallest vocabulary of the presets (the strictest entropy bound). A run the guard stopped is FAILED with its
    message (ref_size, a_tiny reference, seed 8, 2026-12-05: approxkl 5.16 at PPO step 55, KL 13.8): not counted."""
    from rlhf_lab.analysis.snapshot import read_snapshot

    studies, _ = read_snapshot(ROOT / "reports" / "claims_runs.json.gz")
    checked = 0
    for runs in studies.values():
        for r in runs:
            if r.status != "FINISHED":
                continue
            steps: dict[int, dict[str, float]] = {}
            for key, as_key in (("policy/approxkl", "policy/approxkl"), ("objective/kl_k1", "objective/kl"),
                                ("objective/kl_k3", "objective/kl"), ("eval/entropy", "objective/entropy")):
                for step, v in r.history.get(key, []):
                    steps.setdefault(step, {})[as_key] = max(v, steps.get(step, {}).get(as_key, v))
            last = {k: r.metrics[k] for k in ("objective/entropy", "policy/approxkl", "objective/kl") if k in r.metrics}
            for step, stats in [*steps.items(), (-1, last)]:
                assert divergence(stats, step, **BOUNDS) is None, (r.run_id, step, stats)
                checked += 1
    assert checked > 1000  # the file does hold per-step histories


@pytest.mark.slow
def test_a_destroyed_tiny_policy_stops_failed_naming_the_key(tiny_cfg, tmp_path):
    """algo.lr=1 on the tiny model: the weights stay finite, the first step's updates move the policy by about 10⁵
    nats per token, then it collapses onto noise; the run stops FAILED at the first step, naming algo.max_approxkl."""
    from rlhf_lab import stages

    db = tmp_path / "mlflow.db"
    cfg = tiny_cfg("algo=ppo", "algo.reward=gold", "algo.steps=3", "algo.batch_size=8", "algo.num_minibatches=2",
                   "algo.ppo_epochs=2", "generation.max_new_tokens=12", "eval.n_prompts=8", "eval.n_test_prompts=8",
                   "algo.lr=1.0", mlflow_db=db)
    with pytest.raises(Diverged, match=r"algo.max_approxkl=5.0 at PPO step 0"):
        stages.run_job(cfg, tmp_path / "out")
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{db}")
    runs = mlflow.search_runs(experiment_names=["rlhf-lab"], filter_string="tags.`rlhf_lab.stage` = 'ppo'")
    row = runs.iloc[0]
    assert row["status"] == "FAILED" and "algo.max_approxkl" in row["tags.rlhf_lab.error"]
