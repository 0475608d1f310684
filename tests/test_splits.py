"""Prompt splits of the world: a large prompt space, disjoint and stable hash splits, the OOD slice held out
from every stage after pretraining, fixed evaluation prompts, PPO's train-only prompt stream, and the
clustered standard error of the evaluation."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlhf_lab.world import streams as D
from rlhf_lab.config import world as W
from rlhf_lab.evaluation.metrics import cluster_mean_se, half_a, pair_agreement
from rlhf_lab.world import (
    ALL_SPLITS,
    SPLITS,
    Splits,
    opener_product,
    prompt_focus,
    prompt_hash,
    prompt_space,
)
from rlhf_lab.world import grammar as G
from tests.conftest import compose_cfg

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cfg():
    return compose_cfg([])


@pytest.fixture(scope="module")
def draws(cfg):
    """Many thousands of prompts drawn from each split through the public API."""
    n = {"train": 20000, "eval": 5000, "test": 5000, "ood": 3000}
    return {s: D.prompts(W.world_settings(cfg), f"draws/{s}", k, split=s) for s, k in n.items()}


@pytest.mark.slow
def test_prompt_space_has_tens_of_thousands_of_distinct_prompts(cfg, draws):
    space = prompt_space()
    assert len(space) == len(set(space)) == 40 * 20 * (1 + 3 * 16) == 39200
    sp = W.splits(cfg)
    sizes = {s: sum(sp.split_of(p) == s for p in space) for s in ALL_SPLITS}
    assert sizes["train"] > 25000 and min(sizes["eval"], sizes["test"]) > 3000 and sizes["ood"] > 500
    assert sum(sizes.values()) == len(space)
    # the generator reaches them: thousands of distinct prompts in a few thousand draws of one split
    assert len(set(draws["train"])) > 8000 and len(set(draws["eval"])) > 1500
    # every prompt names exactly one product; a focus sentence names an aspect, and half the draws have one
    assert all(sum(w in G.PRODUCTS for w in p.split()) == 1 for p in space)
    with_focus = sum(prompt_focus(p) is not None for p in draws["train"]) / len(draws["train"])
    assert 0.45 < with_focus < 0.55


def test_splits_are_disjoint_and_each_draw_is_in_its_split(cfg, draws):
    sp = W.splits(cfg)
    for s, ps in draws.items():
        assert {sp.split_of(p) for p in ps} == {s}
    sets = {s: set(ps) for s, ps in draws.items()}
    for a in SPLITS:
        for b in SPLITS:
            if a < b:
                assert not sets[a] & sets[b], f"prompts in both {a} and {b}"
    # train / eval / test come out near 80 / 10 / 10 over the in-distribution prompt space
    space = [p for p in prompt_space() if opener_product(p) not in sp.ood_products]
    frac = {s: sum(sp.bucket(p) == s for p in space) / len(space) for s in ("train", "eval", "test")}
    assert frac["train"] == pytest.approx(0.8, abs=0.01) and frac["eval"] == pytest.approx(0.1, abs=0.01)


@pytest.mark.slow
def test_ood_products_never_reach_training_after_pretraining(cfg, draws):
    ood = set(cfg.world.ood_products)
    assert ood and ood <= set(G.PRODUCTS)
    assert not any(opener_product(p) in ood for p in draws["train"])
    assert all(opener_product(p) in ood for p in draws["ood"])
    sft = D.reviews(W.world_settings(cfg), "sft", 5000)  # the SFT stage's stream and default split
    assert not any(w in ood for p, r in sft for w in (p + " " + r).split())
    assert {W.splits(cfg).split_of(p) for p, _ in sft} == {"train"}
    # documented choice: the pretraining corpus ("web text") has the OOD products, but no eval/test/ood prompt
    corpus = D.reviews(W.world_settings(cfg), "pretrain_a", 5000, split="pretrain")
    assert {W.splits(cfg).split_of(p) for p, _ in corpus} == {"train", "ood_pretrain"}
    assert any(opener_product(p) in ood for p, _ in corpus)


def test_split_of_a_prompt_is_stable():
    sp = Splits()
    p = "i care about the battery . review of the kettle :"
    # a function of the text alone (sha1), pinned: a change here silently moves prompts between splits
    assert sp.bucket(p) == sp.bucket(str(p)) and Splits(ood_products=("drone",)).bucket(p) == sp.bucket(p)
    pinned = {q: sp.split_of(q) for q in prompt_space()[:2000:97]}
    code = ("from rlhf_lab.world import Splits, prompt_space\n"
            "sp = Splits(); print(repr({q: sp.split_of(q) for q in prompt_space()[:2000:97]}))")
    for seed in ("0", "123"):  # another process, another PYTHONHASHSEED: the same splits
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert eval(out.stdout) == pinned
    pins = {"review of the kettle :": (0.133349, "train"), "is the chair worth it ?": (0.801538, "eval"),
            "review of the blender :": (0.966934, "test"), "thoughts on the drone :": (0.827384, "ood"),
            "i bought this drone last month and": (0.060319, "ood_pretrain")}
    for q, (u, split) in pins.items():
        assert prompt_hash(q) == pytest.approx(u, abs=1e-6) and sp.split_of(q) == split


def eval_prompts(c, split="eval"):
    return D.eval_prompts(W.world_settings(c), split, W.eval_size(c, split))


@pytest.mark.slow
def test_eval_prompts_are_fixed_across_calls_runs_and_seeds(cfg):
    a = eval_prompts(cfg)
    assert len(a) == cfg.eval.n_prompts and a == eval_prompts(cfg)
    assert a == eval_prompts(compose_cfg(["seed=7", "algo=dpo", "sft.seed=3"]))  # the job's seeds do not move it
    assert eval_prompts(compose_cfg(["eval.n_prompts=500"]))[: len(a)] == a  # a larger set extends it
    assert set(eval_prompts(cfg, "test")).isdisjoint(a)
    code = ("from hydra import compose, initialize_config_module\nfrom rlhf_lab.world import streams as D\n"
            "from rlhf_lab.config import world as W\n"
            "with initialize_config_module('rlhf_lab.conf', version_base='1.3'):\n    c = compose('config')\n"
            "print(repr(D.eval_prompts(W.world_settings(c), 'eval', W.eval_size(c, 'eval'))))")
    env = {**os.environ, "PYTHONHASHSEED": "99", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    assert eval(out.stdout) == a
    # the halves A/B: fixed, disjoint, equal in size
    h = half_a(a)
    assert h == half_a(list(a)) and sum(h) == len(a) // 2


def test_ppo_prompt_stream_draws_only_train_prompts(cfg):
    from rlhf_lab.stages.ppo import prompt_stream

    sp = W.splits(cfg)
    fn = prompt_stream(cfg, seed=0, n_prompts=64)
    seen = [p for step in range(100) for p in fn(step)]
    assert {sp.split_of(p) for p in seen} == {"train"}
    assert set(seen).isdisjoint(eval_prompts(cfg))
    ranks = [prompt_stream(cfg, 0, 64, rank=r, world=2)(5) for r in (0, 1)]
    assert sorted(ranks[0] + ranks[1]) == sorted(fn(5))  # the ranks share one step's prompts
    # the other training streams: preference prompts, online DPO
    assert {sp.split_of(p) for p in D.prompts(W.world_settings(cfg), "prefs", 2000)} == {"train"}


def test_split_config_is_validated():
    with pytest.raises(ValueError, match="world.splits"):
        Splits(train=0.8, eval=0.1, test=0.2)
    with pytest.raises(ValueError, match="world.ood_products"):
        Splits(ood_products=("spaceship",))
    with pytest.raises(ValueError, match="split="):
        D.prompts(W.world_settings(compose_cfg([])), "x", 3, split="validation")
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="world.splits.train=abc"):  # typed by the world schema
        compose_cfg(["world.splits.train=abc"])


def test_clustered_se_against_hand_computation():
    # two prompts × three samples: per-prompt means 2 and 5 -> mean 3.5, sd 2.1213, se 2.1213/√2 = 1.5
    m, se = cluster_mean_se([1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 1, 1])
    assert m == pytest.approx(3.5) and se == pytest.approx(1.5)
    # three prompts, two samples each: means 0.5, 2, 0 -> mean 5/6; var = ((1/3)² + (7/6)² + (5/6)²)/2 = 13/12
    m, se = cluster_mean_se([0, 1, 3, 1, -1, 1], ["a", "a", "b", "b", "c", "c"])
    assert m == pytest.approx(5 / 6) and se == pytest.approx(math.sqrt(13 / 12 / 3))
    # the naive SE over samples would be smaller here (correlated samples of one prompt): clustering matters
    vals, groups = [0, 0, 0, 1, 1, 1, 2, 2, 2], [0, 0, 0, 1, 1, 1, 2, 2, 2]
    naive = torch.tensor(vals, dtype=torch.float64).std().item() / 3
    assert cluster_mean_se(vals, groups)[1] == pytest.approx(1 / math.sqrt(3)) and naive < 1 / math.sqrt(3)
    # one sample per prompt: the usual sd / √n
    assert cluster_mean_se([1.0, 3.0], [0, 1]) == pytest.approx((2.0, 1.0))
    assert math.isnan(cluster_mean_se([1.0, 2.0], [0, 0])[1])


@pytest.mark.slow
def test_evaluation_uses_common_random_numbers_and_clustered_se(tiny_cfg):
    from rlhf_lab import stages
    from rlhf_lab.evaluation.policy import evaluate_policy
    from rlhf_lab.config.schema import GenerationConfig, settings
    from rlhf_lab.models import families as F

    cfg = tiny_cfg("algo=sft")
    sft = stages.ensure("sft", cfg)  # the session's tiny SFT policy: its samples vary in gold
    tok = F.load_tokenizer(sft)
    model = F.load_causal_lm(sft, tok).eval()
    prompts = D.prompts(W.world_settings(cfg), "eval", 12, split="eval")
    gen = settings(cfg.generation, GenerationConfig)  # the typed settings a stage hands to evaluate_policy
    state = torch.random.get_rng_state()
    kw = dict(samples_per_prompt=3, halves=True, seed=11, batch_size=8, n_rows=36)
    m1, rows = evaluate_policy(model, tok, prompts, gen, W.gold_weights(cfg), **kw)
    assert torch.equal(state, torch.random.get_rng_state())  # the training's RNG stream is untouched
    m2, _ = evaluate_policy(model, tok, prompts, gen, W.gold_weights(cfg), **kw)
    assert m1 == m2  # same prompts, same random numbers
    assert {"eval/gold_reward_se", "eval/gold_reward_a", "eval/gold_reward_b", "eval/gold_reward_a_se"} <= set(m1)
    assert len(rows) == 36 and rows[0]["prompt"] == rows[2]["prompt"] == prompts[0]  # 3 samples per prompt
    assert len({r["gold"] for r in rows}) > 1 and m1["eval/gold_reward_se"] > 0
    means = [sum(r["gold"] for r in rows[3 * i : 3 * i + 3]) / 3 for i in range(12)]  # by hand, clustered
    mean = sum(means) / 12
    se = math.sqrt(sum((x - mean) ** 2 for x in means) / 11 / 12)
    assert m1["eval/gold_reward"] == pytest.approx(mean, abs=1e-3)
    assert m1["eval/gold_reward_se"] == pytest.approx(se, abs=1e-3)
    assert m1["eval/gold_reward"] == pytest.approx((m1["eval/gold_reward_a"] + m1["eval/gold_reward_b"]) / 2)
    # a proxy that is the gold ranks every pair of a prompt's samples as gold does; its negation none
    from rlhf_lab.evaluation.policy import as_gold_scorer

    gold = as_gold_scorer(W.gold_weights(cfg))
    for scorer, want in ((gold, 1.0), (lambda *a: -gold(*a), 0.0)):
        m, _ = evaluate_policy(model, tok, prompts, gen, W.gold_weights(cfg), scorer=scorer, **kw)
        assert m["eval/proxy_gold_agreement"] == pytest.approx(want)
    assert "eval/proxy_gold_agreement" not in m1  # no proxy: nothing to rank


def test_pair_agreement_against_hand_computation():
    # prompt "a": 3 samples, gold 0, 1, 2 and proxy 0, 2, 1: pairs (0,1) agree, (0,2) agree, (1,2) disagree -> 2/3
    # prompt "b": gold 1, 1 (a gold tie: no pair), prompt "c": gold 0, 1, proxy 5, 5 (a proxy tie: 0.5)
    values, groups = pair_agreement([0, 2, 1, 3, 4, 5, 5], [0, 1, 2, 1, 1, 0, 1], ["a", "a", "a", "b", "b", "c", "c"])
    assert values == [1.0, 1.0, 0.0, 0.5] and groups == ["a", "a", "a", "c"]
    m, se = cluster_mean_se(values, groups)  # per prompt: 2/3 and 0.5 -> 7/12, sd of (2/3, 1/2) / √2
    assert m == pytest.approx(7 / 12) and se == pytest.approx(abs(2 / 3 - 0.5) / math.sqrt(2) / math.sqrt(2))
    assert pair_agreement([1.0, 2.0], [0.0, 1.0], [0, 1]) == ([], [])  # one response per prompt: no pair
