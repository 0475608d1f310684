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
    first = DG.Variants(seed=3, max_words=24)(texts, ended)
    again = DG.Variants(seed=3, max_words=24)
    assert again(texts[:4], ended[:4])[0] + again(texts[4:], ended[4:])[0] == first[0]  # two batches give one's
    assert DG.Variants(seed=4, max_words=24)(texts, ended) != first
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
    (["gold=rm_world", "gold.build.data.degenerate_fraction=0.9", "gold.build.data.on_policy_fraction=0.5",
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
