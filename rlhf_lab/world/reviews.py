"""Seeded review generator, the gold reward, and the biased preference labeler.

Gold reward (documented in docs/concepts.md, "The world"), for a prompt p naming product P and a response y
split into sentences s_1..s_n (fillers are their own units):

    g(p, y) = w_sentiment · clip(mean valence of the grammatical non-filler sentences, -1, 1)
            + w_fluency   · (fluency − 1)        fluency = fraction of words inside grammatical sentences
            − w_repetition · (n − #distinct sentences) / n
            − w_filler    · #filler units
            − w_eos       · [y did not end with EOS]
            − w_length    · max(0, #words − length_cap) / length_cap

A sentence about a product other than P is off-topic, hence not grammatical for p. The prompt's optional
focus sentence ("i care about the battery .") is cosmetic: g ignores it, so a response that never
mentions the battery loses nothing and a battery sentence counts as any other aspect sentence. An empty response
has fluency 0 and scores −w_fluency. Words repeated outside the grammar ("great great great") are not
fluent and carry no sentiment.

Labeler (a simulated annotator): P(a ≻ b) = σ((u(a) − u(b)) / temperature) with
u(y) = g(p, y) + length_bonus · #words(y) / 10 + filler_bonus · #fillers(y). The bonuses are the biases
that a reward model trained on these labels learns and a policy can exploit. In gold-RM mode (``gold=rm``) g is
a frozen reward model's score and the bonuses are added to it the same way (:meth:`Labeler.utility_from_gold`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from rlhf_lab.world import grammar as G
from rlhf_lab.world.splits import Splits


@dataclass(frozen=True)
class GoldWeights:
    sentiment: float = 1.0
    fluency: float = 1.0
    repetition: float = 1.0
    filler: float = 0.25
    eos: float = 0.5
    length: float = 0.5
    length_cap: int = 40


@dataclass(frozen=True)
class GoldParts:
    sentiment: float
    fluency: float
    repetition: float
    fillers: int
    n_words: int
    ended: bool
    total: float


def gold_parts(prompt: str, response: str, ended: bool = True, w: GoldWeights = GoldWeights()) -> GoldParts:
    product = G.opener_product(prompt)
    sents = G.split_sentences(response, product)
    n_words = len(response.split())
    content = [s for s in sents if s.valence is not None and not s.filler]
    sentiment = max(-1.0, min(1.0, sum(s.valence for s in content) / len(content))) if content else 0.0
    fluent_words = sum(len(s.words) for s in sents if s.valence is not None)
    fluency = fluent_words / n_words if n_words else 0.0
    repetition = (len(sents) - len({s.words for s in sents})) / len(sents) if sents else 0.0
    fillers = sum(1 for s in sents if s.filler)
    total = (
        w.sentiment * sentiment
        + w.fluency * (fluency - 1.0)
        - w.repetition * repetition
        - w.filler * fillers
        - w.eos * (0.0 if ended else 1.0)
        - w.length * max(0, n_words - w.length_cap) / w.length_cap
    )
    return GoldParts(sentiment, fluency, repetition, fillers, n_words, ended, total)


def gold_reward(prompt: str, response: str, ended: bool = True, w: GoldWeights = GoldWeights()) -> float:
    """The true reward g(prompt, response); see the module docstring for the formula."""
    return gold_parts(prompt, response, ended, w).total


def count_fillers(response: str) -> int:
    return sum(1 for s in G.split_sentences(response) if s.filler)


@dataclass(frozen=True)
class Labeler:
    """A Bradley–Terry annotator on the gold reward with length and filler biases."""

    temperature: float = 0.2
    length_bonus: float = 0.0
    filler_bonus: float = 0.0

    def __post_init__(self):
        if self.temperature <= 0:
            raise ValueError(f"labeler.temperature must be > 0, got {self.temperature}")

    def utility(self, prompt: str, response: str, ended: bool = True, w: GoldWeights = GoldWeights()) -> float:
        return self.utility_from_gold(gold_reward(prompt, response, ended, w), response)

    def utility_from_gold(self, gold: float, response: str) -> float:
        """u = gold + the biases: `gold` is the world's formula or a gold reward model's score (``gold=rm``)."""
        return gold + self.length_bonus * len(response.split()) / 10.0 + self.filler_bonus * count_fillers(response)

    def preference_prob(self, u_a: float, u_b: float) -> float:
        """P(a ≻ b) = σ((u(a) − u(b)) / temperature) from the two utilities."""
        d = (u_a - u_b) / self.temperature
        return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, d))))

    def prob_first_preferred(self, prompt: str, a: str, b: str, ended_a=True, ended_b=True, w=GoldWeights()) -> float:
        return self.preference_prob(self.utility(prompt, a, ended_a, w), self.utility(prompt, b, ended_b, w))

    def prefers_first(self, rng: random.Random, prompt: str, a: str, b: str, ended_a=True, ended_b=True, w=GoldWeights()) -> bool:
        return rng.random() < self.prob_first_preferred(prompt, a, b, ended_a, ended_b, w)

    def prefers_first_given(self, rng: random.Random, gold_a: float, gold_b: float, a: str, b: str) -> bool:
        """One draw of the annotator's choice when the two responses' gold rewards are known (one random number,
        as :meth:`prefers_first`, which it equals for the formula's values)."""
        return rng.random() < self.preference_prob(self.utility_from_gold(gold_a, a), self.utility_from_gold(gold_b, b))


@dataclass(frozen=True)
class WorldSpec:
    """Parameters of the review generator (the `world` config group)."""

    max_sentences: int = 6
    mean_sentences: float = 2.5
    filler_rate: float = 0.05
    adverb_rate: float = 0.3
    sentiment_noise: float = 0.5


class ReviewGenerator:
    """Deterministic given its seed: the same seed gives the same reviews, in order.

    A prompt is an opener, a product and, with probability ``grammar.FOCUS_RATE``, a focus sentence
    (template and aspect), each drawn uniformly. ``split`` restricts it to one split of ``splits``
    (:mod:`rlhf_lab.world.splits`) by rejection: draws outside the split are skipped.
    """

    MAX_TRIES = 100_000  # draws per prompt before a split is declared empty

    def __init__(self, seed: int, spec: WorldSpec = WorldSpec(), splits: Splits = Splits()):
        self.rng = random.Random(seed)
        self.spec = spec
        self.splits = splits

    def _draw_prompt(self, products: list[str]) -> str:
        r = self.rng
        opener, product = r.choice(G.OPENERS), r.choice(products)
        if r.random() < G.FOCUS_RATE:
            return G.make_prompt(opener, product, r.choice(G.FOCUS), r.choice(G.ASPECTS))
        return G.make_prompt(opener, product)

    def prompt(self, split: str | None = None) -> str:
        """A prompt of `split` (None: of the whole prompt space)."""
        if split is None:
            return self._draw_prompt(G.PRODUCTS)
        products = self.splits.products(split)
        for _ in range(self.MAX_TRIES):
            p = self._draw_prompt(products)
            if self.splits.accepts(split, p):
                return p
        raise ValueError(f"no prompt of split {split!r} in {self.MAX_TRIES} draws; check world.splits")

    def _adj(self, target: float) -> str:
        r = self.rng
        names = list(G.ADJECTIVES)
        weights = [math.exp(-((G.ADJECTIVES[a] - target) ** 2) / 0.1) for a in names]
        adj = r.choices(names, weights)[0]
        if r.random() < self.spec.adverb_rate:
            adv = r.choice([a for a in G.ADVERBS if a != "not"] + (["not"] if G.ADJECTIVES[adj] < 0 and target > 0 else []))
            return f"{adv} {adj}"
        return adj

    def _pick(self, table: dict[str, float], target: float) -> str:
        names = list(table)
        weights = [math.exp(-((table[k] - target) ** 2) / 0.1) for k in names]
        return self.rng.choices(names, weights)[0]

    def sentence(self, product: str, sentiment: float) -> str:
        r = self.rng
        s = self.spec
        if r.random() < s.filler_rate:
            f = r.choice(G.FILLERS)
            return f if f.endswith(".") else f"{f} {self.sentence(product, sentiment)}"
        target = max(-1.0, min(1.0, r.gauss(sentiment, s.sentiment_noise)))
        kind = r.choices(["aspect", "product", "verb", "feeling", "overall", "neutral"], [45, 10, 15, 10, 8, 12])[0]
        if kind == "aspect":
            return f"the {r.choice(G.ASPECTS)} is {self._adj(target)} ."
        if kind == "product":
            return f"the {product} is {self._adj(target)} ."
        if kind == "verb":
            return f"it {self._pick(G.VERB_PHRASES, target)} ."
        if kind == "feeling":
            return f"i {self._pick(G.FEELINGS, target)} it ."
        if kind == "overall":
            return f"overall it is {self._adj(target)} ."
        return r.choice(G.NEUTRAL_SENTENCES)

    def response(self, prompt: str) -> str:
        r = self.rng
        product = G.opener_product(prompt) or r.choice(G.PRODUCTS)
        sentiment = r.uniform(-1.0, 1.0)
        # geometric number of sentences with the configured mean, at least 1
        p = 1.0 / self.spec.mean_sentences
        n = 1
        while n < self.spec.max_sentences and r.random() > p:
            n += 1
        return " ".join(self.sentence(product, sentiment) for _ in range(n))

    def review(self, split: str | None = None) -> tuple[str, str]:
        prompt = self.prompt(split)
        return prompt, self.response(prompt)

    def reviews(self, n: int, split: str | None = None) -> list[tuple[str, str]]:
        return [self.review(split) for _ in range(n)]
