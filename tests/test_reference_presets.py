"""``algo.reference.path=sft@<policy preset>`` (claim C8: a reference of another size): the preset is composed
from conf/policy/<name>.yaml, must share the policy's tokenizer, and resolves to that preset's SFT artifact,
built or reused through ``stages.ensure``. The training here is a few optimizer steps of the two smallest
presets, in the test's own cache."""

from __future__ import annotations

import mlflow
import pytest
from omegaconf import OmegaConf

from rlhf_lab import stages
from rlhf_lab.models import families as F
from rlhf_lab.stages import ppo as ppo_stage
from rlhf_lab.stages.presets import checkpoint_path, parse_preset_ref, preset, preset_config, preset_names
from rlhf_lab.stages.pipeline import upstream_run
from tests.conftest import compose_cfg

KEY = "algo.reference.path"
FAST = ["pretrain.steps=3", "pretrain.n_texts=300", "sft.steps=3", "sft.n_examples=200"]


def test_parse_preset_ref():
    assert parse_preset_ref("sft@a_tiny") == ("sft", "a_tiny")
    assert parse_preset_ref("pretrain@a_medium") == ("pretrain", "a_medium")
    for value in (None, "", "a_tiny", "sft@", "rm@a_tiny", "/ckpt/sft@a_tiny", "./x@y", "org/model"):
        assert parse_preset_ref(value) is None, value


@pytest.mark.slow
def test_preset_is_composed_as_the_policy_group_composes_it():
    assert set(preset_names("policy")) >= {"a_tiny", "a_small", "a_medium", "a_large", "b_tiny", "b_small"}
    for name in ("a_tiny", "b_small"):
        composed = compose_cfg([f"policy={name}"]).policy
        assert OmegaConf.to_container(preset("policy", name, "policy")) == OmegaConf.to_container(composed)
    cfg = compose_cfg(["policy=a_small", "sft.steps=7"])
    small = preset_config(cfg, "a_tiny", KEY)
    assert small.policy.arch.hidden == 32 and small.sft.steps == 7 and cfg.policy.arch.hidden == 64  # a copy


def test_presets_of_another_tokenizer_or_unknown_are_refused_before_any_training():
    cfg = compose_cfg(["policy=a_small"])
    with pytest.raises(ValueError, match=r"algo.reference.path: the preset 'b_tiny'.*another tokenizer.*a_tiny"):
        checkpoint_path(cfg, "sft@b_tiny", KEY)
    with pytest.raises(ValueError, match="no policy preset 'a_huge'; the presets are"):
        checkpoint_path(cfg, "sft@a_huge", KEY)
    with pytest.raises(ValueError, match="policy.name_or_path"):
        checkpoint_path(compose_cfg(["policy=a_small", "policy.name_or_path=/some/ckpt"]), "sft@a_tiny", KEY)
    assert checkpoint_path(cfg, "/some/folder", KEY) == "/some/folder"  # any other value is taken as it is


@pytest.mark.slow
def test_sft_at_preset_builds_or_reuses_that_presets_sft_and_shares_the_tokenizer(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the store's artifacts (./mlruns) stay out of the repository
    common = [*FAST, f"cache_dir={tmp_path / 'cache'}", f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
              "trainer.progress_bar=false", "trainer.threads=1", "algo=ppo", "algo.reward=gold", "algo.steps=2",
              "algo.batch_size=8", "algo.num_minibatches=2", "algo.ppo_epochs=1", "eval.every_n_steps=0",
              "eval.n_prompts=8", "eval.n_samples_logged=2", "generation.max_new_tokens=8"]
    small = compose_cfg(["policy=a_small", *common, "algo.reference.path=sft@a_tiny"])
    tiny_sft = stages.ensure("sft", compose_cfg(["policy=a_tiny", *common]))  # the a_tiny policy's own SFT
    spec = ppo_stage.spec(small)  # the policy's SFT, then the reference's (reused: already built above)
    assert spec["reference"] == str(tiny_sft) and spec["sft"] != spec["reference"]
    assert F.same_tokenizer(F.load_tokenizer(spec["sft"]), F.load_tokenizer(spec["reference"]))
    tok = F.load_tokenizer(spec["sft"])
    policy, ref, _ = ppo_stage.build_models(small.algo, spec["sft"], tok, resolved_reference=spec["reference"])
    assert ref.config.hidden_size == 32 and policy.config.hidden_size == 64
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["rlhf-lab"])
    assert sorted(runs["tags.rlhf_lab.stage"]) == ["pretrain", "pretrain", "sft", "sft"]  # each built once
    meta = stages.run_job(small, tmp_path / "ppo")  # the job: 2 PPO steps (oracle reward) against the a_tiny SFT
    runs = mlflow.search_runs(experiment_names=["rlhf-lab"])
    ppo = runs[runs["tags.rlhf_lab.stage"] == "ppo"].iloc[0]
    assert ppo["run_id"] == meta["run_id"] and ppo["params.reference"] == str(tiny_sft)
    assert ppo["params.algo.reference.path"] == "sft@a_tiny" and len(runs) == 5  # nothing rebuilt
    assert ppo["tags.rlhf_lab.upstream.reference"] == upstream_run(small, tiny_sft)  # the a_tiny SFT's run
    assert ppo["tags.rlhf_lab.upstream.reference"] in set(runs[runs["tags.rlhf_lab.stage"] == "sft"]["run_id"])
    # the reference, another model than the policy, is evaluated once on the test prompts: reference/* at step 0
    assert ppo["metrics.reference/gold_reward"] == pytest.approx(
        ppo_stage.evaluate_reference(small, ref, tok, None, ppo_stage.G.load_gold(small))["reference/gold_reward"])
    assert "metrics.reference/length" in ppo and "metrics.reference/kl" not in ppo

    # algo.reference.seed: the same preset pretrained and fine-tuned with seeds 1000 + r, its own model
    seeded = compose_cfg(["policy=a_small", *common, "algo.reference.path=sft@a_small", "algo.reference.seed=0"])
    own = ppo_stage.spec(compose_cfg(["policy=a_small", *common, "algo.reference.path=sft@a_small"]))
    assert own["reference"] == own["sft"]  # without a seed, sft@a_small is the policy itself
    ref_spec = ppo_stage.spec(seeded)
    assert ref_spec["reference"] not in (own["sft"], spec["reference"])
    assert F.same_tokenizer(F.load_tokenizer(ref_spec["sft"]), F.load_tokenizer(ref_spec["reference"]))
    built = mlflow.search_runs(experiment_names=["rlhf-lab"], filter_string="params.seed = '1000'")
    assert sorted(built["tags.rlhf_lab.stage"]) == ["pretrain", "sft"]  # its own pretraining and SFT, seed 1000
    assert ppo_stage.spec(seeded)["reference"] == ref_spec["reference"]  # then reused from the cache


@pytest.mark.parametrize("overrides, key", [
    (["algo=ppo", "algo.reference.seed=1"], "algo.reference.seed"),  # no preset to build
    (["algo=ppo", "algo.reference.path=/some/folder", "algo.reference.seed=1"], "algo.reference.seed"),
    (["algo=ppo", "algo.reference.path=sft@a_tiny", "algo.reference.seed=-1"], "algo.reference.seed"),
    (["algo=dpo", "algo.reference.seed=1"], "algo.reference.seed"),  # PPO only
])
def test_reference_seed_is_refused_where_it_builds_nothing(overrides, key):
    from rlhf_lab.config.errors import ConfigError
    from rlhf_lab.config.checks import check_dpo, check_ppo

    cfg = compose_cfg(overrides)
    with pytest.raises(ConfigError, match=key):
        (check_dpo if "algo=dpo" in overrides else check_ppo)(cfg.algo)
