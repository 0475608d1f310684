"""An error in the RM's backbone names the key the user set (issue 68): a same-source RM on the user's policy folder
is that folder, so a broken one is reported as policy.name_or_path, not as the lab's "reward_model backbone"."""

from __future__ import annotations

import shutil

import pytest

from rlhf_lab.stages.rm import backbone_key
from tests.conftest import compose_cfg


def test_the_backbone_key_is_the_one_the_user_set(tmp_path):
    policy = tmp_path / "my-model"
    cfg = compose_cfg([f"policy.name_or_path={policy}", "sft.steps=0"])
    assert backbone_key(cfg, policy) == "policy.name_or_path"  # same_source: ${policy.name_or_path}
    assert backbone_key(cfg, tmp_path / ".rlhf_lab_cache" / "sft" / "ab12") == "reward_model backbone"  # built here
    other = compose_cfg(["reward_model=different_source", f"reward_model.name_or_path={policy}"])
    assert backbone_key(other, policy) == "reward_model.name_or_path"
    assert backbone_key(compose_cfg(["reward_model=minilm"]), "/x") == "reward_model.name_or_path"
    assert backbone_key(compose_cfg([]), tmp_path / "sft") == "reward_model backbone"  # the world's own models


def test_a_broken_policy_folder_is_reported_by_its_key_in_an_rm_job(arch_checkpoints, tmp_path):
    from rlhf_lab import stages
    from rlhf_lab.models.checkpoints import CheckpointError
    from tests.tiny_archs import conversational_jsonl, world_pairs

    bad = tmp_path / "bad"  # GPT-2's config and tokenizer beside Llama's weights
    shutil.copytree(arch_checkpoints["gpt2"], bad)
    shutil.copy(arch_checkpoints["llama"] / "model.safetensors", bad / "model.safetensors")
    data = conversational_jsonl(tmp_path / "d.jsonl", world_pairs(40))
    cfg = compose_cfg(["algo=rm", f"policy.name_or_path={bad}", "data=jsonl", f"data.path={data}", "sft.steps=0",
                       "data.eval_fraction=0.2", "data.test_fraction=0.2", "reward_model.steps=1",
                       f"cache_dir={tmp_path / 'cache'}", f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
                       "trainer.progress_bar=false", "trainer.threads=1"])
    with pytest.raises(CheckpointError) as err:
        stages.run_job(cfg, tmp_path / "out")
    assert str(err.value).startswith(f"policy.name_or_path={str(bad)!r}: ") and "reward_model backbone" not in str(
        err.value)
