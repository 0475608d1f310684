"""End-to-end reward-model stage on tiny sizes: the algo=rm job, caching, the length bias it learns from a
biased labeler, same- vs different-source RMs on policy samples, external JSONL data, ensembles + LoRA +
on-policy mixing. Seeds are fixed; the thresholds leave room for thread-count nondeterminism."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
import torch

from rlhf_lab import stages
from rlhf_lab.stages.pipeline import cache_for
from rlhf_lab.models.reward import RewardScorer
from rlhf_lab.stages import prefs
from tests.conftest import compose_cfg
from rlhf_lab.stages import rm as rm_stage

pytestmark = pytest.mark.slow  # trains models: deselect with -m 'not slow'

# shared by every test here, so the preference pairs (one set per labeler) are sampled once per session
RM_TINY = ["data.n_eval=300", "reward_model.steps=100"]
# (rm/filler_preference needs held-out pairs that differ in filler phrases, which the tiny policy hardly
# writes; the default-size `rlhf-lab algo=rm` run logs it: README, Results)
CONVENTION_METRICS = ("rm/accuracy", "rm/accuracy_gold", "rm/spearman_gold", "rm/length_preference")


def _runs(db):
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    return mlflow.search_runs(experiment_names=["rlhf-lab"])


def _rm_eval(cfg) -> dict:
    """The rm/* metrics stored with the cached RM (trained now if missing)."""
    return cache_for(cfg).meta(stages.ensure("rm", cfg))["eval"]


def test_rm_job_end_to_end_logs_metrics_and_is_reused_from_cache(tiny_cfg, tmp_path):
    db = tmp_path / "mlflow.db"
    cfg = tiny_cfg("algo=rm", *RM_TINY, mlflow_db=db)
    meta = stages.run_job(cfg, tmp_path / "out")
    ev = meta["eval"]
    # well above chance (0.5) against the labeler and against gold; ranks responses like gold
    assert ev["rm/accuracy"] > 0.58
    assert ev["rm/accuracy_gold"] > 0.65
    assert ev["rm/spearman_gold"] > 0.25
    # normalised on SFT samples: the held-out SFT samples score near mean 0, std 1
    assert abs(ev["rm/reward_mean"]) < 0.3 and 0.6 < ev["rm/reward_std"] < 1.4
    runs = _runs(db)
    rm_run = runs[runs["tags.rlhf_lab.stage"] == "rm"]
    assert len(rm_run) == 1 and rm_run.iloc[0]["status"] == "FINISHED"
    row = rm_run.iloc[0]
    assert row["run_id"] == meta["run_id"]
    for k in CONVENTION_METRICS + ("loss/rm", "rewards/accuracies", "time/step_s", "rm/reward_mean", "rm/reward_std",
                                   "rm/accuracy_len_short", "rm/accuracy_no_filler"):
        assert row[f"metrics.{k}"] == row[f"metrics.{k}"], k  # logged, not NaN
    assert row["metrics.rm/accuracy"] == pytest.approx(ev["rm/accuracy"])
    from rlhf_lab.world import count_fillers

    _, held = prefs.load(cfg)
    filler_pairs = sum(count_fillers(q.chosen) != count_fillers(q.rejected) for q in held)
    assert ("rm/filler_preference" in ev) == (filler_pairs > 0)
    assert row["tags.rlhf_lab.upstream.sft"] and row["tags.rlhf_lab.upstream.prefs"]
    # the job published its RM: ensure_rm (as PPO calls it) reuses it without a new run
    path = stages.ensure("rm", cfg)
    assert str(path) == meta["cache_path"]
    assert len(_runs(db)) == len(runs)
    # the scorer (as PPO loads it) reproduces the job's held-out numbers from the artifact folder
    from rlhf_lab.algorithms.rm import evaluate_rm

    scorer = rm_stage.load_scorer(cfg)
    again, _ = evaluate_rm(scorer, held)
    assert again["rm/accuracy"] == pytest.approx(ev["rm/accuracy"], abs=1e-6)
    assert again["rm/reward_mean"] == pytest.approx(ev["rm/reward_mean"], abs=1e-4)
    raw = RewardScorer.from_path(path, normalize=False)
    p = [q.prompt for q in held[:8]]
    y = [q.chosen for q in held[:8]]
    e = [q.chosen_ended for q in held[:8]]
    assert scorer(p, y, e).tolist() == pytest.approx((scorer.gain * raw(p, y, e) + scorer.bias).tolist(), abs=1e-5)


def test_length_biased_labels_teach_the_rm_to_prefer_length_unbiased_do_not(tiny_cfg):
    biased = _rm_eval(tiny_cfg("labeler=length_biased", *RM_TINY))
    unbiased = _rm_eval(tiny_cfg("labeler=unbiased", *RM_TINY))
    # measured with these seeds: +0.25 vs -0.01 (rate of preferring the longer response, RM minus gold)
    assert biased["rm/length_preference"] > 0.12
    assert unbiased["rm/length_preference"] < 0.08
    assert biased["rm/length_preference"] - unbiased["rm/length_preference"] > 0.12
    # the unbiased labels also give the RM that agrees more with gold
    assert unbiased["rm/accuracy_gold"] > biased["rm/accuracy_gold"]


def test_same_and_different_source_rms_score_policy_samples(tiny_cfg):
    """Both RMs train; both score the policy's samples through their own tokenizer (b re-encodes a's text)."""
    from rlhf_lab.algorithms.rm import spearman
    from rlhf_lab.world import streams as D
    from rlhf_lab.config import world as W
    from rlhf_lab.models import families as F
    from rlhf_lab.models.sampling import sample
    from rlhf_lab.world import gold_reward

    same_cfg = tiny_cfg(*RM_TINY)
    diff_cfg = tiny_cfg(*RM_TINY, "reward_model=different_source", "reward_model.arch.hidden=32")
    diff_ev = _rm_eval(diff_cfg)
    assert diff_ev["rm/accuracy_gold"] > 0.6
    same, diff = rm_stage.load_scorer(same_cfg), rm_stage.load_scorer(diff_cfg)
    sft = stages.ensure("sft", same_cfg)
    tok = F.load_tokenizer(sft)
    assert type(diff.members[0]).__name__.startswith("GPT2") and type(same.members[0]).__name__.startswith("Llama")
    assert same.tokenizer.get_vocab() == tok.get_vocab() and len(diff.tokenizer) != len(tok)
    policy = F.load_causal_lm(sft, tok)
    prompts = D.prompts(W.world_settings(same_cfg), "rm_test", 96)
    torch.manual_seed(0)
    g = same_cfg.generation
    ro = sample(policy, tok, prompts, g.max_new_tokens, 1.0, 0, 1.0, g.max_prompt_len)
    gold = [gold_reward(p, r, e, W.gold_weights(same_cfg)) for p, r, e in zip(prompts, ro.responses, ro.ended)]
    for sc in (same, diff):
        s = sc.score_tokens(tok, prompts, ro.response_ids, ro.response_mask, ro.ended)
        assert s.tolist() == pytest.approx(sc(prompts, ro.responses, ro.ended).tolist(), abs=1e-5)
        assert spearman(s.tolist(), gold) > 0.2  # both rank the policy's samples like gold
        assert 0.4 < float(s.std()) < 2.0  # normalised scale


def _compose_external(tiny_cfg, path: Path, *extra, mlflow_db=None):
    cfg = tiny_cfg(*extra, mlflow_db=mlflow_db)
    from omegaconf import OmegaConf, open_dict

    with open_dict(cfg):
        cfg.data = OmegaConf.create({"source": "jsonl", "path": str(path), "eval_fraction": 0.25, "seed": 0})
    return cfg


def test_external_jsonl_preferences_train_an_rm_without_gold_metrics(tiny_cfg, tmp_path):
    from rlhf_lab.world import ReviewGenerator, gold_reward

    g = ReviewGenerator(123)
    rows = []
    for _ in range(400):  # 100 held-out pairs: the accuracy's SE ≈ 0.05
        p = g.prompt()
        a, b = g.response(p), g.response(p)
        if a == b:
            continue
        c, r = (a, b) if gold_reward(p, a) > gold_reward(p, b) else (b, a)
        rows.append({"prompt": p, "chosen": c, "rejected": r, "extra": 1})
    f = tmp_path / "prefs.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    db = tmp_path / "mlflow.db"
    cfg = _compose_external(tiny_cfg, f, "algo=rm", "reward_model.steps=100", mlflow_db=db)
    meta = stages.run_job(cfg, tmp_path / "out")
    ev = meta["eval"]
    from rlhf_lab.config import data as DS
    from rlhf_lab.data.preferences import load_external

    n_eval = len(load_external(DS.external_data(cfg))[1])  # the pairs of the eval split's prompts (83 of 400)
    assert ev["rm/n_eval_pairs"] == n_eval and n_eval > 60
    assert ev["rm/accuracy"] > 0.65
    assert not any("gold" in k or k.endswith("_preference") for k in ev)
    assert "rm/longer_win_rate" in ev
    run = _runs(db).iloc[0]
    assert run["status"] == "FINISHED" and run["metrics.rm/accuracy"] == pytest.approx(ev["rm/accuracy"])

    # bad input: clear errors before any training
    bad = tmp_path / "bad.jsonl"
    bad.write_text("")
    with pytest.raises(ValueError, match="empty"):
        stages.run_job(_compose_external(tiny_cfg, bad, "algo=rm", mlflow_db=db), tmp_path / "o1")
    bad.write_text("\n".join(json.dumps({"prompt": "p", "chosen": "same", "rejected": "same"}) for _ in range(5)))
    with pytest.raises(ValueError, match="chosen == rejected"):
        stages.run_job(_compose_external(tiny_cfg, bad, "algo=rm", mlflow_db=db), tmp_path / "o2")
    bad.write_text("\n".join(json.dumps({"prompt": "p", "chosen": "a", "reject": "b"}) for _ in range(5)))
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['rejected'\]"):
        stages.run_job(_compose_external(tiny_cfg, bad, "algo=rm", mlflow_db=db), tmp_path / "o3")
    with pytest.raises(ValueError, match="only data=world"):
        stages.run_job(_compose_external(tiny_cfg, f, "algo=rm", "reward_model.margin=true", mlflow_db=db),
                         tmp_path / "o4")


def test_ensemble_with_lora_and_on_policy_pairs(tiny_cfg, tmp_path):
    base = tiny_cfg(*RM_TINY)
    sft = stages.ensure("sft", base)
    cfg = tiny_cfg(*RM_TINY, "reward_model.ensemble=2", "reward_model.lora.r=8", "reward_model.lr=3e-3",
                   f"data.on_policy_path={sft}", "data.on_policy_fraction=0.5", "reward_model.conservative_lambda=1.0")
    ev = _rm_eval(cfg)
    assert ev["rm/train_on_policy_fraction"] == pytest.approx(0.5, abs=0.05)
    assert ev["rm/member_0/accuracy"] > 0.55 and ev["rm/member_1/accuracy"] > 0.55
    assert ev["rm/ensemble_std"] > 0.01  # members differ (seeds: head init and data order)
    path = stages.ensure("rm", cfg)
    meta = cache_for(cfg).meta(path)
    assert meta["n_members"] == 2 and meta["model/params_trainable"] < meta["model/params_total"] / 3
    sc = rm_stage.load_scorer(cfg)
    assert len(sc.members) == 2 and sc.conservative_lambda == 1.0
    assert sc.heldout_spread == pytest.approx(ev["rm/ensemble_std"])  # the level a gold's disagreement is read against
    # normalize / conservative_lambda act when the RM is used: they do not change the cache key
    assert rm_stage.spec(tiny_cfg(*RM_TINY, "reward_model.ensemble=2", "reward_model.lora.r=8", "reward_model.lr=3e-3",
                              f"data.on_policy_path={sft}", "data.on_policy_fraction=0.5",
                              "reward_model.normalize=false")) == rm_stage.spec(cfg)
    # a conservative score is lower than the mean score, by lambda * gain * member std

    _, held = prefs.load(cfg)
    p, y, e = [q.prompt for q in held], [q.chosen for q in held], [q.chosen_ended for q in held]
    mean_sc = RewardScorer.from_path(path)
    diff = mean_sc(p, y, e) - sc(p, y, e)
    assert float(diff.min()) >= -1e-6 and float(diff.mean()) > 0.01


def test_an_on_policy_path_without_on_policy_pairs_leaves_the_pairs_key_alone(monkeypatch):
    """rm_source_5seeds hands every job the prepared policy; its jobs with data.on_policy_fraction=0 draw nothing
    from it, so they must find the pairs (and RMs) the other studies built."""
    monkeypatch.setattr(prefs, "ensure", lambda stage, cfg: "/fake/sft")
    plain = prefs.spec(compose_cfg([]))
    with_path = prefs.spec(compose_cfg(["data.on_policy_path=/some/ppo/artifact"]))
    mixed = prefs.spec(compose_cfg(["data.on_policy_path=/some/ppo/artifact", "data.on_policy_fraction=0.2"]))
    assert with_path == plain and plain["on_policy_path"] is None
    assert mixed["on_policy_path"] == "/some/ppo/artifact" and mixed["on_policy_fraction"] == 0.2
