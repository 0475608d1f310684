"""The cache never hands out a damaged artifact: manifests, quarantine, killed builds, portable keys."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from filelock import FileLock

from rlhf_lab.runs import cache as C
from rlhf_lab.runs.cache import QUARANTINE_DIR, ArtifactCache, manifest_problem
from rlhf_lab.runs.contents import MANIFEST_FILE, SPEC_FILE

WEIGHTS = bytes(range(256)) * 1024  # 256 KiB standing in for model.safetensors


@pytest.fixture(autouse=True)
def fresh_process_state():
    """Each test plays a new process: nothing verified or announced yet."""
    C.forget_checks()
    yield
    C.forget_checks()


def build_weights(calls: list):
    def build(d: Path):
        calls.append(d)
        (d / "model.safetensors").write_bytes(WEIGHTS)
        (d / "sub").mkdir()
        (d / "sub" / "tokenizer.json").write_text("{}")
        return {"run_id": f"r{len(calls)}"}
    return build


def quarantined(root: Path, stage: str) -> list[Path]:
    q = root / stage / QUARANTINE_DIR
    return sorted(q.iterdir()) if q.exists() else []


def test_manifest_lists_every_file_with_size_and_hash(tmp_path):
    cache, calls = ArtifactCache(tmp_path), []
    p, built = cache.get_or_build("sft", {"a": 1}, build_weights(calls))
    m = json.loads((p / MANIFEST_FILE).read_text())
    assert built and set(m) == {"model.safetensors", "sub/tokenizer.json", C.META_FILE}
    assert m["model.safetensors"]["bytes"] == len(WEIGHTS) and len(m["model.safetensors"]["sha256"]) == 64
    assert manifest_problem(p) is None


@pytest.mark.parametrize("damage", ["truncate", "zero_64k", "delete"])
def test_damaged_artifact_is_quarantined_and_rebuilt(tmp_path, capsys, damage):
    cache, calls = ArtifactCache(tmp_path), []
    p, _ = cache.get_or_build("sft", {"a": 1}, build_weights(calls))
    f = p / "model.safetensors"
    if damage == "truncate":
        f.write_bytes(WEIGHTS[: len(WEIGHTS) // 2])
    elif damage == "zero_64k":  # same size, different bytes: only the hash can tell
        f.write_bytes(WEIGHTS[:65536] + bytes(65536) + WEIGHTS[131072:])
    else:
        f.unlink()
    C.forget_checks()  # a later process
    p2, built = cache.get_or_build("sft", {"a": 1}, build_weights(calls))
    assert built and p2 == p and len(calls) == 2
    assert (p2 / "model.safetensors").read_bytes() == WEIGHTS and manifest_problem(p2) is None
    q = quarantined(tmp_path, "sft")
    assert len(q) == 1 and q[0].name.startswith(p.name)
    out = capsys.readouterr().out
    assert "is corrupt: model.safetensors" in out and str(p) in out and str(q[0]) in out


def test_get_returns_none_for_a_damaged_artifact(tmp_path):
    cache, calls = ArtifactCache(tmp_path), []
    p, _ = cache.get_or_build("rm", {"a": 1}, build_weights(calls))
    assert cache.get("rm", {"a": 1}) == p
    (p / "sub" / "tokenizer.json").write_text('{"x": 1}')
    C.forget_checks()
    assert cache.get("rm", {"a": 1}) is None and not p.exists() and len(quarantined(tmp_path, "rm")) == 1


def test_check_is_once_per_process(tmp_path):
    """Damage after the first check in the same process is not looked for again (checking costs a hash)."""
    cache, calls = ArtifactCache(tmp_path), []
    p, _ = cache.get_or_build("sft", {"a": 1}, build_weights(calls))
    (p / "model.safetensors").write_bytes(b"x")
    assert cache.get("sft", {"a": 1}) == p  # built in this process: already verified


def test_an_artifact_without_its_manifest_is_quarantined_and_rebuilt(tmp_path, capsys):
    """The manifest deleted, then the weights damaged: not accepted and re-manifested, but rebuilt."""
    cache, calls = ArtifactCache(tmp_path), []
    p, _ = cache.get_or_build("sft", {"a": 1}, build_weights(calls))
    (p / MANIFEST_FILE).unlink()
    (p / "model.safetensors").write_bytes(WEIGHTS[:1000])
    C.forget_checks()
    assert cache.get("sft", {"a": 1}) is None and len(quarantined(tmp_path, "sft")) == 1
    assert f"is corrupt: {MANIFEST_FILE} is missing" in capsys.readouterr().out
    p2, built = cache.get_or_build("sft", {"a": 1}, build_weights(calls))
    assert built and len(calls) == 2 and (p2 / "model.safetensors").read_bytes() == WEIGHTS
    assert manifest_problem(p2) is None


def test_killed_builds_are_removed(tmp_path):
    cache, calls = ArtifactCache(tmp_path), []
    final = cache.path("sft", {"a": 1})
    final.parent.mkdir(parents=True)
    own = final.parent / f".tmp-{final.name}-deadbeef"       # a killed build of this key
    other_key = "0123456789abcdef"
    other = final.parent / f".tmp-{other_key}-cafebabe"      # a killed build of another key
    busy_key = "fedcba9876543210"
    busy = final.parent / f".tmp-{busy_key}-0badf00d"        # a build that is running (its lock is held)
    for d in (own, other, busy):
        (d / "half").mkdir(parents=True)
    held = FileLock(str(final.parent / f"{busy_key}.lock"))
    held.acquire()
    try:
        cache.get_or_build("sft", {"a": 1}, build_weights(calls))
    finally:
        held.release()
    assert not own.exists() and not other.exists() and busy.exists()


def test_keys_survive_moving_the_cache(tmp_path):
    """Upstream artifacts enter a spec as paths under the root; moving the cache folder keeps every key."""
    a = ArtifactCache(tmp_path / "one")
    base, _ = a.get_or_build("pretrain", {"n": 1}, build_weights([]))
    sft, _ = a.get_or_build("sft", {"base": str(base), "lr": 1}, build_weights([]))
    shutil.move(str(tmp_path / "one"), str(tmp_path / "two"))
    b = ArtifactCache(tmp_path / "two")
    moved_base = b.get("pretrain", {"n": 1})
    assert moved_base is not None and moved_base.name == base.name
    assert b.get("sft", {"base": str(moved_base), "lr": 1}) is not None
    assert (b.path("sft", {"base": str(moved_base), "lr": 1}) / SPEC_FILE).exists()
    assert b.path("sft", {"base": "/elsewhere/pretrain/x", "lr": 1}).name != sft.name
