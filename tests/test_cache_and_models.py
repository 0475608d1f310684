"""The artifact cache (hash, lock, atomic write) and loading checkpoints through from_pretrained."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import pytest
import torch

from rlhf_lab.runs.cache import ArtifactCache, artifact_key
from rlhf_lab.runs.contents import SPEC_FILE
from rlhf_lab.models import families as F
from rlhf_lab.world import ReviewGenerator


def test_key_depends_on_content_not_order():
    a = artifact_key("sft", {"lr": 1e-3, "steps": 10})
    assert a == artifact_key("sft", {"steps": 10, "lr": 1e-3})
    assert a != artifact_key("sft", {"steps": 11, "lr": 1e-3})
    assert a != artifact_key("rm", {"steps": 10, "lr": 1e-3})


def test_get_or_build_builds_once_and_cleans_up_failures(tmp_path):
    cache = ArtifactCache(tmp_path)
    calls = []

    def build(d: Path):
        calls.append(d)
        (d / "x.txt").write_text("hi")
        return {"run_id": "r1"}

    p1, built1 = cache.get_or_build("s", {"a": 1}, build)
    p2, built2 = cache.get_or_build("s", {"a": 1}, build)
    assert (built1, built2) == (True, False) and p1 == p2 and len(calls) == 1
    assert (p1 / "x.txt").read_text() == "hi" and cache.meta(p1) == {"run_id": "r1"}
    # the build folder was a temporary one beside the final folder, renamed into place
    assert calls[0] != p1 and not calls[0].exists()

    def boom(d: Path):
        (d / "half.txt").write_text("half")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        cache.get_or_build("s", {"a": 2}, boom)
    assert cache.get("s", {"a": 2}) is None
    assert not [p for p in (tmp_path / "s").iterdir() if p.name.startswith(".tmp")]  # nothing half-written left


def _racer(root: str, q):
    cache = ArtifactCache(root)

    def build(d: Path):
        q.put("built")
        time.sleep(0.5)
        (d / "w.txt").write_text("ok")

    path, _ = cache.get_or_build("s", {"k": 1}, build)
    q.put((path / "w.txt").read_text())


def test_two_processes_build_once(tmp_path):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(str(tmp_path), q)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    out = [q.get(timeout=5) for _ in range(3)]
    assert out.count("built") == 1 and out.count("ok") == 2
    assert (tmp_path / "s" / artifact_key("s", {"k": 1}) / SPEC_FILE).exists()


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    texts = [p + " " + r for p, r in ReviewGenerator(0).reviews(500)]
    out = {}
    for fam, vocab in (("a", 200), ("b", 400)):
        tok = F.train_tokenizer(fam, texts, vocab)
        model = F.build_model(fam, {"hidden": 32, "layers": 1, "heads": 2}, tok)
        tok.save_pretrained(d / fam)
        model.save_pretrained(d / fam)
        out[fam] = (d / fam, tok, model)
    return out


@pytest.mark.parametrize("fam,arch", [("a", "LlamaForCausalLM"), ("b", "GPT2LMHeadModel")])
def test_load_by_path_roundtrip_same_code_as_hub(saved_pair, fam, arch):
    path, tok, model = saved_pair[fam]
    tok2 = F.load_tokenizer(str(path))
    model2 = F.load_causal_lm(str(path), tok2)
    assert type(model2).__name__ == arch
    text = "review of the lamp : the price is good ."
    assert tok2(text).input_ids == tok(text).input_ids
    ids = torch.tensor([tok(text).input_ids])
    with torch.no_grad():
        assert torch.allclose(model.eval()(ids).logits, model2.eval()(ids).logits, atol=1e-5)


def test_families_have_different_tokenizers(saved_pair):
    _, ta, _ = saved_pair["a"]
    _, tb, _ = saved_pair["b"]
    text = "the price is very good ."
    assert ta.convert_ids_to_tokens(ta(text).input_ids) != tb.convert_ids_to_tokens(tb(text).input_ids)
    assert ta.decode(ta(text).input_ids, skip_special_tokens=True).strip() == text
    assert tb.decode(tb(text).input_ids, skip_special_tokens=True).strip() == text


def test_missing_checkpoint_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"policy.name_or_path='\./nope'.*no such checkpoint"):
        F.load_tokenizer("./nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="without a Hugging Face checkpoint"):
        F.load_causal_lm(tmp_path / "empty")


def test_hub_name_unreachable_is_a_clear_error():  # conftest sets HF_HUB_OFFLINE=1
    with pytest.raises(OSError, match="could not be loaded.*hub"):
        F.load_tokenizer("some-org/some-model-that-is-not-here")


def test_tokenizer_model_mismatch_is_a_clear_error(saved_pair):
    path_a, tok_a, _ = saved_pair["a"]
    _, tok_b, _ = saved_pair["b"]
    assert len(tok_b) > len(tok_a)
    with pytest.raises(ValueError, match="not a pair"):
        F.load_causal_lm(path_a, tok_b)


def test_bad_arch_and_family_are_clear_errors(saved_pair):
    _, tok, _ = saved_pair["a"]
    with pytest.raises(ValueError, match="divisible"):
        F.build_model("a", {"hidden": 30, "layers": 1, "heads": 4}, tok)
    with pytest.raises(ValueError, match="not a model family"):
        F.build_model("c", {"hidden": 32, "layers": 1, "heads": 4}, tok)


def test_trained_upstream_stages_are_keyed_by_their_precision(tiny_cfg, monkeypatch, tmp_path):
    """A base model, SFT policy or reward model trained in bf16 is another model than the fp32 one: its own cache
    key. fp32, written either way, keeps the key of the artifacts cached before precision was part of it."""
    from rlhf_lab.stages import pipeline

    class Recorder:
        def __init__(self):
            self.keys = {}

        def get_or_build(self, stage, spec, build):
            self.keys[stage] = artifact_key(stage, spec)
            return tmp_path / stage, False

        def path(self, stage, spec):
            return tmp_path / stage

    def keys(*overrides):
        rec = Recorder()
        monkeypatch.setattr(pipeline, "cache_for", lambda cfg: rec)
        pipeline.ensure("rm", tiny_cfg(*overrides))
        return rec.keys

    fp32, fp32_short, bf16 = keys(), keys("trainer.precision=32"), keys("trainer.precision=bf16-mixed")
    assert set(fp32) == {"pretrain", "sft", "rm"}
    assert fp32 == fp32_short
    assert all(bf16[s] != fp32[s] for s in fp32)
