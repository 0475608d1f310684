"""Degenerate variants (rlhf_lab/data/degenerate.py) and the gold's coverage keys of the prefs stage
(data.degenerate_fraction, data.sft_temperatures): each variant does to the formula what its name says, the
pairs are reproducible, and a key left at its default changes no cache key."""

from __future__ import annotations

import random

import pytest

from rlhf_lab.config.errors import ConfigError
from rlhf_lab.data import degenerate as DG
from rlhf_lab.world.reviews import gold_parts
from tests.conftest import compose_cfg

PROMPT = "review of the kettle :"
SFT = "it works well . i like it . the lid is very good ."  # three distinct grammatical sentences


def parts(text: str, ended: bool = True):
    return gold_parts(PROMPT, text, ended)


def test_each_kind_does_what_its_name_says():
    base = parts(SFT)
    assert base.repetition == 0 and base.fillers == 0 and base.fluency == 1.0
    rng = random.Random(0)
    out = {k: DG.degenerate(SFT, True, k, rng, 48) for k in DG.KINDS}
    assert parts(out["repeat"][0]).repetition > 0 and parts(out["repeat"][0]).fluency == 1.0
    loop, _ = out["loop"]
    assert set(DG.sentences(loop)) == {"it works well ."} and 40 < len(loop.split()) <= 48
    assert parts(loop).repetition > 0.9  # n - distinct over n: 15 sentences, one distinct
    text, ended = out["truncate"]
    assert not ended and SFT.startswith(text) and 0 < len(text.split()) < len(SFT.split())
    assert 1 <= parts(out["filler"][0]).fillers <= 3
    assert len(out["long"][0].split()) == 48 and parts(out["long"][0]).n_words > 40  # past the length cap
    assert out["short"][0] == "it works well ."
    babble = parts(out["babble"][0])
    assert babble.fluency < 1.0 and babble.n_words >= len(SFT.split()) + 2
    dropped = parts(out["drop"][0])
    assert dropped.fluency < 1.0 and len(out["drop"][0].split()) in (len(SFT.split()) - 1, len(SFT.split()) - 2)
    shuffled = out["shuffle"][0]
    assert sorted(shuffled.split()) == sorted(SFT.split()) and shuffled != SFT
    assert all(e for k, (_, e) in out.items() if k != "truncate")


def test_no_variant_is_longer_than_the_limit_and_the_same_seed_gives_the_same_variants():
    long = " ".join(["it works well . i like it ."] * 6)
    for k in DG.KINDS:
        assert len(DG.degenerate(long, True, k, random.Random(1), 20)[0].split()) <= 20
    texts, ended = [SFT] * 9, [True] * 9
    first = DG.Variants(seed=3, max_words=24)(["p"] * 9, texts, ended)
    again = DG.Variants(seed=3, max_words=24)
    assert again(["p"] * 4, texts[:4], ended[:4])[0] + again(["p"] * 5, texts[4:], ended[4:])[0] == first[0]  # two batches give one's
    assert DG.Variants(seed=4, max_words=24)(["p"] * 9, texts, ended) != first
    kinds_in_turn = [DG.degenerate(SFT, True, k, random.Random(0), 24)[0] for k in DG.KINDS]
    assert len(set(kinds_in_turn)) == len(DG.KINDS)


def test_short_or_empty_responses_and_unknown_kinds():
    assert DG.degenerate("", True, "repeat", random.Random(0), 10) == ("", False)
    assert DG.degenerate("", False, "repeat", random.Random(0), 10) == ("", False)
    assert DG.degenerate("it works well .", True, "short", random.Random(0), 10) == ("", True)
    assert DG.degenerate("great", False, "truncate", random.Random(0), 10) == ("great", False)
    assert DG.degenerate("great", True, "truncate", random.Random(0), 10) == ("", False)
    at_limit = "it works well . i like it ."  # 7 words: no room to add anything within 7
    for k in ("repeat", "filler", "long", "babble"):
        text, ended = DG.degenerate(at_limit, True, k, random.Random(0), 7)
        assert text != at_limit and len(text.split()) <= 7
    with pytest.raises(ValueError, match="unknown degenerate kind 'spam'"):
        DG.degenerate(SFT, True, "spam", random.Random(0), 10)


def test_the_coverage_keys_enter_the_pairs_key_only_when_used(monkeypatch):
    from rlhf_lab.stages import prefs

    monkeypatch.setattr(prefs, "ensure", lambda stage, cfg: "/fake/sft")
    plain = prefs.spec(compose_cfg([]))
    assert "degenerate_fraction" not in plain and "sft_temperatures" not in plain
    assert prefs.spec(compose_cfg(["data.degenerate_fraction=0.0", "data.sft_temperatures=null"])) == plain
    used = prefs.spec(compose_cfg(["data.degenerate_fraction=0.25", "data.sft_temperatures=[0.7,1.0,1.3]"]))
    assert used["degenerate_fraction"] == 0.25 and used["sft_temperatures"] == [0.7, 1.0, 1.3]
    assert used["degenerate_kinds"] == list(DG.KINDS)  # another set of kinds makes other pairs: another key


@pytest.mark.parametrize("overrides,key", [
    (["data.degenerate_fraction=1.5"], "data.degenerate_fraction"),
    (["data.degenerate_fraction=0.6", "data.on_policy_fraction=0.6", "data.on_policy_path=/x"],
     "data.degenerate_fraction"),
    (["data.sft_temperatures=[]"], "data.sft_temperatures"),
    (["data.sft_temperatures=[1.0,0.0]"], "data.sft_temperatures"),
    (["data.sft_temperatures=[0.7,1.3]"], "data.sft_temperatures"),  # generation.temperature 1.0 not in it
    # a gold's own pairs are checked the same way, under their own keys
    (["gold=rm_world_sft", "gold.build.data.degenerate_fraction=0.9", "gold.build.data.on_policy_fraction=0.5",
      "gold.build.data.on_policy_path=/x"], "gold.build.data.degenerate_fraction"),
    (["gold=rm_world", "gold.build.data.sft_temperatures=[0.7]"], "gold.build.data.sft_temperatures"),
])
def test_bad_coverage_settings_are_refused_naming_the_key(overrides, key):
    from rlhf_lab.config.checks import validate

    with pytest.raises(ConfigError) as err:
        validate(compose_cfg(overrides))
    assert err.value.key == key


def test_sft_parts_split_the_prompts_over_the_temperatures():
    from rlhf_lab.config.schema import GenerationConfig
    from rlhf_lab.stages.prefs import sft_parts

    gen = GenerationConfig(max_new_tokens=48, temperature=1.0, top_k=0, top_p=1.0, max_prompt_len=24, sampler="lab")
    prompts = [f"p{i}" for i in range(10)]
    assert sft_parts({"seed": 5}, gen, prompts) == [(gen, prompts, 5, "sft")]
    parts_ = sft_parts({"seed": 5, "sft_temperatures": [0.7, 1.0, 1.3]}, gen, prompts)
    assert [p for _, chunk, _, _ in parts_ for p in chunk] == prompts
    assert [(g.temperature, s, src) for g, _, s, src in parts_] == [(0.7, 5, "sft@0.7"), (1.0, 15, "sft"),
                                                                   (1.3, 25, "sft@1.3")]


def test_the_temperatures_must_hold_the_generation_temperature():
    from rlhf_lab.config.checks import validate

    validate(compose_cfg(["data.sft_temperatures=[0.7,1.0]"]))
    with pytest.raises(ConfigError, match="holds generation.temperature"):
        validate(compose_cfg(["data.sft_temperatures=[0.7,1.3]"]))
    validate(compose_cfg(["data.sft_temperatures=[0.7,1.3]", "generation.temperature=0.7"]))
    validate(compose_cfg(["gold=rm_world", "gold.build.data.degenerate_fraction=0.25",
                          "gold.build.data.sft_temperatures=[0.7,1.0,1.3]"]))


def test_prefs_with_degenerate_pairs_and_several_temperatures(tiny_cfg):
    """The pairs of a gold's recipe: degenerate pairs as asked, SFT pairs at each temperature, held-out pairs as
    before, and the RM normalised on the SFT samples at generation.temperature only."""
    from collections import Counter

    from rlhf_lab.algorithms.rm import normalization_set
    from rlhf_lab.stages import prefs

    plain_train, plain_held = prefs.load(tiny_cfg())
    cfg = tiny_cfg("data.degenerate_fraction=0.3", "data.sft_temperatures=[1.0,1.6]")
    train, held = prefs.load(cfg)
    src = Counter(p.source for p in train)
    assert set(src) == {"sft", "sft@1.6", "degenerate"}
    assert 84 <= src["degenerate"] <= 90 and 95 <= src["sft"] <= 105  # 300 pairs: 90, 105, 105 less text ties
    assert [(p.prompt, p.chosen) for p in held] == [(p.prompt, p.chosen) for p in plain_held]  # held-out: unchanged
    # hotter samples are less fluent: the formula's mean gold is lower at 1.6
    gold = {s: sum(p.gold_chosen + p.gold_rejected for p in train if p.source == s) / (2 * src[s]) for s in src}
    assert gold["sft@1.6"] < gold["sft"]
    deg = [p for p in train if p.source == "degenerate"]  # labelled on the formula like every pair
    assert all(p.gold_chosen is not None for p in deg) and any(p.gold_chosen != p.gold_rejected for p in deg)
    sft_texts = {y for p in train if p.source == "sft" for y in (p.chosen, p.rejected)}
    _, norm, _ = normalization_set(train, 10**6, 0)
    assert norm and set(norm) <= sft_texts
    assert len(plain_train) > 290 and {p.source for p in plain_train} == {"sft"}


def test_on_policy_pairs_over_several_checkpoints_against_sft_samples(monkeypatch, tmp_path):
    """data.on_policy_path as a list: the on-policy prompts split evenly over the folders in order, part i with seed
    data.seed + 1 + 100 i (one folder: seed + 1, as before lists); with data.on_policy_pairing=sft each part's
    second response is the SFT checkpoint's sample, else a second sample of its own."""
    import contextlib
    from types import SimpleNamespace

    from rlhf_lab.data.preferences import PreferencePair
    from rlhf_lab.stages import prefs

    calls = []

    def fake_sample(labelling, gen, options, path, prompts, seed, source, gold=None, progress=None, second=None, **kw):
        calls.append((source, path, len(prompts), seed, getattr(second, "path", second)))
        return [PreferencePair(p, "a", "b", gold_chosen=1.0, gold_rejected=0.0) for p in prompts]

    monkeypatch.setattr(prefs, "sample_pairs", fake_sample)
    monkeypatch.setattr(prefs, "Checkpoint", lambda path, *a, **k: SimpleNamespace(path=path))
    monkeypatch.setattr(prefs, "upstream_run", lambda cfg, path: "sft-run")
    monkeypatch.setattr(prefs.tracking, "start_run",
                        lambda *a, **k: contextlib.nullcontext(SimpleNamespace(info=SimpleNamespace(run_id="r"))))
    monkeypatch.setattr(prefs.active_run, "log_metrics", lambda *a, **k: None)
    for pairing, second in (("sft", "/sft"), ("self", None)):
        calls.clear()
        cfg = compose_cfg(["data.n_train=40", "data.n_eval=5", "data.on_policy_fraction=0.5",
                           "data.on_policy_path=[/c1,/c2]", f"data.on_policy_pairing={pairing}"])
        spec = {"sft": "/sft", "n_train": 40, "n_eval": 5, "seed": 3, "on_policy_fraction": 0.5,
                "on_policy_path": ["/c1", "/c2"], **({"on_policy_pairing": "sft"} if second else {})}
        prefs.build(cfg, tmp_path, spec)
        assert [c for c in calls if c[0] == "on_policy"] == [("on_policy", "/c1", 10, 4, second),
                                                              ("on_policy", "/c2", 10, 104, second)]
        assert [c[:3] for c in calls if c[0] == "sft"] == [("sft", "/sft", 20), ("sft", "/sft", 5)]
    # the pairs' key: one folder stays a text (keys made before lists stay valid), the pairing only when sft
    monkeypatch.setattr(prefs, "ensure", lambda stage, cfg: "/fake/sft")
    one = prefs.spec(compose_cfg(["data.on_policy_fraction=0.2", "data.on_policy_path=[/c1]"]))
    assert one["on_policy_path"] == "/c1" and "on_policy_pairing" not in one
    assert one == prefs.spec(compose_cfg(["data.on_policy_fraction=0.2", "data.on_policy_path=/c1"]))
    two = prefs.spec(compose_cfg(["data.on_policy_fraction=0.2", "data.on_policy_path=[/c1,/c2]",
                                  "data.on_policy_pairing=sft"]))
    assert two["on_policy_path"] == ["/c1", "/c2"] and two["on_policy_pairing"] == "sft"
    unused = prefs.spec(compose_cfg(["data.on_policy_pairing=sft"]))  # no on-policy pairs: nothing changes
    assert unused == prefs.spec(compose_cfg([]))


def test_on_policy_pairing_against_sft_on_real_checkpoints(tiny_cfg):
    """Two checkpoints (the pretrained base and the SFT policy) as on-policy folders, each sample against an SFT
    sample: the pairs hold the asked fraction, differ from self pairing, and train an RM."""
    from rlhf_lab import stages
    from rlhf_lab.stages import prefs

    folders = [str(stages.ensure("pretrain", tiny_cfg())), str(stages.ensure("sft", tiny_cfg()))]
    over = ["data.on_policy_fraction=0.4", f"data.on_policy_path=[{folders[0]},{folders[1]}]"]
    train_sft, _ = prefs.load(tiny_cfg(*over, "data.on_policy_pairing=sft"))
    train_self, _ = prefs.load(tiny_cfg(*over))
    on_sft = [p for p in train_sft if p.source == "on_policy"]
    on_self = [p for p in train_self if p.source == "on_policy"]
    assert 110 <= len(on_sft) <= 120 and 110 <= len(on_self) <= 120  # 40 % of 300 less text ties
    assert [(p.chosen, p.rejected) for p in on_sft] != [(p.chosen, p.rejected) for p in on_self]
    # the first half of the prompts come from the base model in both: its first responses are the same samples
    both = {p.prompt: p for p in on_self}
    firsts = [(p, both[p.prompt]) for p in on_sft[:40] if p.prompt in both]
    shared = sum(len({a.chosen, a.rejected} & {b.chosen, b.rejected}) > 0 for a, b in firsts)
    assert shared >= 0.8 * len(firsts)
