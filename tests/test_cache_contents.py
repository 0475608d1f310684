"""Every cache key that depends on a model or data folder takes its content (rlhf_lab/runs/contents.py, issue 65
item 4: weights copied over ``policy.name_or_path``'s ``model.safetensors`` reused the cached RM and start-of-run
evaluation of the old weights, whose keys held the folder's path as text): the artifact cache's keys
(ArtifactCache.keyed), the specs that name a checkpoint by a relative path, a pre-empted job's resume checkpoint and
the in-process memo of external rows. A spec that names no local folder keys as before."""

from __future__ import annotations

import hashlib
import json
import shutil

from rlhf_lab.config.keys import ADDED_OFF, NOT_COMPUTED, drop_keys, to_plain
from rlhf_lab.runs import contents
from rlhf_lab.runs.cache import ArtifactCache, artifact_key
from tests.conftest import compose_cfg


def model_folder(path, weights: bytes = b"\x00" * 64):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text('{"model_type": "gpt2"}')
    (path / "model.safetensors").write_bytes(weights)
    return path


def test_a_folder_in_a_spec_keys_by_its_content_and_a_hub_name_or_cached_artifact_by_its_text(tmp_path):
    cache = ArtifactCache(tmp_path / "cache")
    ckpt = model_folder(tmp_path / "ckpt")
    spec = {"base": str(ckpt), "config": {"policy": {"name_or_path": str(ckpt)}}, "lr": 1}
    before = cache.path("sft", spec)
    assert cache.path("sft", spec) == before  # the same content: the same key
    (ckpt / "model.safetensors").write_bytes(b"\x01" * 64)  # other weights copied over the file, the same size
    assert cache.path("sft", spec) != before
    (ckpt / "model.safetensors").write_bytes(b"\x00" * 64)
    assert cache.path("sft", spec) == before  # the old weights again: the old key
    copy = shutil.copytree(ckpt, tmp_path / "elsewhere" / "copy")
    assert cache.path("sft", {**spec, "base": str(copy), "config": {"policy": {"name_or_path": str(copy)}}}) == before
    # a spec that names no local file or folder keys as it did: a hub name, a missing path, a cached artifact
    upstream = cache.root / "pretrain" / "0123456789abcdef"
    model_folder(upstream)
    plain = {"base": str(upstream), "hub": "org/model", "gone": str(tmp_path / "missing"), "lr": 1}
    assert cache.path("sft", plain).name == artifact_key("sft", {**plain, "base": "$CACHE/pretrain/0123456789abcdef"})
    (upstream / "model.safetensors").write_bytes(b"\x02")  # the cache's artifacts are keyed by their spec already
    assert cache.path("sft", plain).name == artifact_key("sft", {**plain, "base": "$CACHE/pretrain/0123456789abcdef"})


def test_which_values_name_a_local_input(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model_folder(tmp_path / "ckpt")
    (tmp_path / "ppo").mkdir()
    assert contents.local_path("policy.name_or_path", "ckpt") == "ckpt"  # a path key: relative to the working folder
    assert contents.local_path("config.data.name", "ckpt") == "ckpt"  # data.name, however deep in a spec
    assert contents.local_path("algo.name", "ppo") is None  # a word that is no path, whatever lies in the folder
    assert contents.local_path("base", str(tmp_path / "ckpt")) == str(tmp_path / "ckpt")  # a path-like value
    assert contents.local_path("policy.name_or_path", "org/model") is None  # a hub name
    assert contents.local_path("x.path", "/") is None  # never the filesystem's root
    assert contents.absolute_if_local("ckpt") == str(tmp_path / "ckpt")
    assert contents.absolute_if_local("gpt2") == "gpt2" and contents.absolute_if_local(None) is None


def test_a_checkpoint_named_by_a_relative_path_keys_the_sft_and_rm_by_its_content(tmp_path, monkeypatch):
    """``policy.name_or_path=ckpt`` (a folder in the working folder, no ``/``): the SFT's ``base`` and the RM's backbone
    and data enter their specs as absolute paths, so that their keys see the content."""
    from rlhf_lab.stages import rm as rm_stage
    from rlhf_lab.stages import sft
    from rlhf_lab.stages.pipeline import cache_for

    monkeypatch.chdir(tmp_path)
    model_folder(tmp_path / "ckpt")
    (tmp_path / "pairs.jsonl").write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n')
    cfg = compose_cfg(["policy.name_or_path=ckpt", f"cache_dir={tmp_path / 'cache'}"])
    rm_cfg = compose_cfg(["algo=rm", "policy.name_or_path=ckpt", "reward_model.source=pretrained",
                          "reward_model.name_or_path=ckpt", "data=jsonl", "data.path=pairs.jsonl",
                          f"cache_dir={tmp_path / 'cache'}"])
    keys = lambda: (cache_for(cfg).path("sft", sft.spec(cfg)), cache_for(rm_cfg).path("rm", rm_stage.spec(rm_cfg)))  # noqa: E731
    sft_key, rm_key = keys()
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"\x07" * 64)
    new_sft, new_rm = keys()
    assert new_sft != sft_key and new_rm != rm_key
    (tmp_path / "pairs.jsonl").write_text('{"prompt": "p", "chosen": "b", "rejected": "a"}\n')  # swapped labels
    later_sft, later_rm = keys()
    assert later_sft == new_sft and later_rm != new_rm
    assert rm_stage.spec(rm_cfg)["backbone"] == str(tmp_path / "ckpt")  # as the spec file records it


def test_the_resume_checkpoint_and_the_rows_memo_follow_the_content(tmp_path):
    from rlhf_lab.data.preferences import ExternalData, data_memo_key
    from rlhf_lab.stages.ppo import resume_checkpoint

    ckpt = model_folder(tmp_path / "ckpt")
    folder = tmp_path / "uf"
    folder.mkdir()
    (folder / "data.arrow").write_bytes(b"rows")
    cfg = compose_cfg(["algo=ppo", f"policy.name_or_path={ckpt}", f"cache_dir={tmp_path / 'cache'}"])
    spec = {"sft": str(ckpt), "seed": 0, "steps": 2}
    src = ExternalData({"source": "hf", "name": str(folder)}, str(ckpt))
    before = resume_checkpoint(cfg, "ppo", spec), data_memo_key(src)
    assert (resume_checkpoint(cfg, "ppo", spec), data_memo_key(src)) == before
    (folder / "data.arrow").write_bytes(b"other rows")  # a save_to_disk folder rewritten in place
    assert data_memo_key(src) != before[1]
    (ckpt / "model.safetensors").write_bytes(b"\x03" * 64)
    assert resume_checkpoint(cfg, "ppo", spec) != before[0]
    # the built-in world names no folder: its resume key is the hash of its spec and config as they are (the keys added
    # since, at their default, left out: the key a job made before them had)
    world = compose_cfg(["algo=ppo", f"cache_dir={tmp_path / 'cache'}"])
    cached = {"sft": str(tmp_path / "cache" / "sft" / "0123456789abcdef"), "seed": 0, "steps": 2}
    config = drop_keys(to_plain(world), (*NOT_COMPUTED, *ADDED_OFF))
    blob = json.dumps({"stage": "ppo", "spec": cached, "config": config}, sort_keys=True, default=str)
    assert resume_checkpoint(world, "ppo", cached).stem == hashlib.sha256(blob.encode()).hexdigest()[:16]
