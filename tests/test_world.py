"""The reviews world: generator determinism, the gold reward on hand-written responses, labeler biases."""

from __future__ import annotations

import random

import pytest

from rlhf_lab.world import GoldWeights, Labeler, ReviewGenerator, WorldSpec, count_fillers, gold_parts, gold_reward
from rlhf_lab.world.grammar import parse_sentence, split_sentences

P = "review of the lamp :"


def test_generator_is_deterministic_per_seed():
    a = ReviewGenerator(7).reviews(50)
    b = ReviewGenerator(7).reviews(50)
    c = ReviewGenerator(8).reviews(50)
    assert a == b
    assert a != c


def test_generated_reviews_are_grammatical_and_varied():
    revs = ReviewGenerator(1).reviews(500)
    fluency = [gold_parts(p, r).fluency for p, r in revs]
    assert min(fluency) == 1.0  # everything the generator writes, the grammar recognises
    lengths = [len(r.split()) for _, r in revs]
    assert min(lengths) <= 5 and max(lengths) >= 25  # varied length
    sentiments = [gold_parts(p, r).sentiment for p, r in revs]
    assert min(sentiments) < -0.5 and max(sentiments) > 0.5  # mixed sentiment
    rate = sum(count_fillers(r) > 0 for _, r in revs) / len(revs)
    assert 0.03 < rate < 0.3  # fillers at a low base rate


def test_filler_rate_knob():
    revs = ReviewGenerator(1, WorldSpec(filler_rate=0.5)).reviews(300)
    assert sum(count_fillers(r) > 0 for _, r in revs) / 300 > 0.6


def test_parse_sentence_valences():
    assert parse_sentence("the price is good .".split()) == pytest.approx(0.6)
    assert parse_sentence("the price is very good .".split()) == pytest.approx(0.78)
    assert parse_sentence("the price is not bad .".split()) == pytest.approx(0.42)
    assert parse_sentence("i love it .".split()) == 1.0
    assert parse_sentence("the lamp is great .".split(), "lamp") == pytest.approx(0.9)
    assert parse_sentence("the phone is great .".split(), "lamp") is None  # off-topic for a lamp prompt
    assert parse_sentence("great great great .".split()) is None
    assert parse_sentence("the price is good".split()) is None  # no full stop


def test_gold_reward_hand_computed():
    w = GoldWeights()
    # one grammatical positive sentence: sentiment 0.9, fluent, no repetition
    assert gold_reward(P, "the lamp is great .") == pytest.approx(0.9)
    # mean sentiment of (1.0, -1.0) = 0
    assert gold_reward(P, "i love it . it broke quickly .") == pytest.approx(0.0)
    # repeated sentence: sentiment 0.9, repetition 1/2
    assert gold_reward(P, "the lamp is great . the lamp is great .") == pytest.approx(0.9 - 0.5)
    # one filler unit: −0.25; sentiment of the content sentence 0.6
    assert gold_reward(P, "i understand how you feel . the price is good .") == pytest.approx(0.6 - w.filler)
    # missing EOS
    assert gold_reward(P, "the lamp is great .", ended=False) == pytest.approx(0.9 - w.eos)
    # too long: 48 words of distinct positive sentences -> length penalty 0.5*(48-40)/40 = 0.1
    long = " ".join(f"the {a} is great ." for a in ["price", "design", "quality", "sound", "size", "color",
                                                   "handle", "screen", "motor", "lid", "strap", "button"])
    assert len(long.split()) == 60
    assert gold_reward(P, long) == pytest.approx(0.9 - 0.5 * 20 / 40)


def test_gold_reward_scores_degenerate_text_low():
    good = gold_reward(P, "the lamp is great . it works well .")
    assert gold_reward(P, "") == pytest.approx(-1.0)
    assert gold_reward(P, "great great great great great") == pytest.approx(-1.0)
    assert gold_reward(P, "the phone is great .") == pytest.approx(-1.0)  # off-topic
    assert gold_reward(P, "the lamp is great . " * 6) == pytest.approx(0.9 - 5 / 6)  # repetition
    assert gold_reward(P, "the lamp is great .", ended=False) < good
    assert good > 0.5


def test_split_sentences_recognises_prefix_fillers():
    s = split_sentences("to be honest , the price is good .")
    assert [x.filler for x in s] == [True, False]
    assert s[1].valence == pytest.approx(0.6)


def _pref_rate(labeler: Labeler, pairs, seed=0) -> float:
    rng = random.Random(seed)
    return sum(labeler.prefers_first(rng, P, a, b) for a, b in pairs) / len(pairs)


def test_labeler_bias_knobs_move_preferences_in_the_documented_direction():
    # equal gold, different length / filler
    long_ = "the price is good . the lid is good . the color is good . the size is good ."
    short = "the price is good ."
    assert gold_reward(P, long_) == pytest.approx(gold_reward(P, short))
    pairs = [(long_, short)] * 2000
    unbiased = _pref_rate(Labeler(temperature=0.2), pairs)
    biased = _pref_rate(Labeler(temperature=0.2, length_bonus=0.25), pairs)
    assert abs(unbiased - 0.5) < 0.04  # no preference without a bias
    assert biased > 0.8  # 15 more words -> +0.375 utility -> sigma(1.875)=0.87
    # filler: gold charges 0.25 per filler, a sycophantic labeler pays 0.5
    fill = "i understand how you feel . the price is good ."
    pairs = [(fill, short)] * 2000
    assert _pref_rate(Labeler(temperature=0.2), pairs) < 0.3
    assert _pref_rate(Labeler(temperature=0.2, filler_bonus=0.5), pairs) > 0.7
    # the temperature: noisier labels
    good, bad = "the price is great .", "the price is bad ."
    sharp = _pref_rate(Labeler(temperature=0.2), [(good, bad)] * 2000)
    noisy = _pref_rate(Labeler(temperature=1.0), [(good, bad)] * 2000)
    assert sharp > 0.99 and 0.7 < noisy < 0.9


def test_labeler_rejects_bad_temperature():
    with pytest.raises(ValueError, match="labeler.temperature"):
        Labeler(temperature=0.0)
