"""Degenerate variants of a response: the texts an over-optimised policy drifts into, made from an SFT sample.

A gold reward model trained on SFT samples only has never seen what a policy pushed against a proxy produces: at
β = 0 the policies of ``reports/gold_rm_validation`` collapse onto one sentence said again and again (distinct-1
near 0, the formula's repetition term), and the gold RM, which never saw repetition, scores it highest. A fraction
of a gold's training pairs (``data.degenerate_fraction``) therefore pairs an SFT response with one variant of
itself, labelled like every pair by the labeler on the gold (for the gold RM of ``gold=rm_world``: the unbiased
labeler on the formula), so the labels, not this module, say which is better. The kinds cycle over the pairs:

- ``repeat``: one of its sentences said again right after itself, 1 to 3 more times;
- ``loop``: its first sentence said over and over, up to the length limit (the collapse seen at β = 0);
- ``truncate``: cut inside, at a random word; it did not end (no EOS);
- ``filler``: 1 to 3 filler phrases of the world (``grammar.FILLERS``) put between its sentences;
- ``long``: neutral sentences of the world (``grammar.NEUTRAL_SENTENCES``) added until it reaches the length limit;
- ``short``: its first sentence only (the empty response when it has one sentence);
- ``babble``: one of its words said 3 to 6 times in a row ("great great great"), outside the grammar;
- ``drop``: 1 or 2 words left out of one of its sentences ("the lid very good ."): the word salad that the policies
  of a pilot of ``gold_recipes`` (seeds 0–2 at β = 0) were pushed into, positive words without a grammatical
  sentence;
- ``shuffle``: the words of one of its sentences in another order, its final "." kept.

The length limit is ``generation.max_new_tokens`` words: no variant is longer than a policy could sample. Every
variant is a pure function of the response and the random generator, so the pairs are reproducible from the seed.
"""

from __future__ import annotations

import random

from rlhf_lab.world import grammar as G

KINDS = ("repeat", "loop", "truncate", "filler", "long", "short", "babble", "drop", "shuffle")


def sentences(response: str) -> list[str]:
    """The response cut after each " ." (a trailing fragment without one is its own piece)."""
    out, cur = [], []
    for w in response.split():
        cur.append(w)
        if w == ".":
            out.append(" ".join(cur))
            cur = []
    if cur:
        out.append(" ".join(cur))
    return out


def fit(text: str, max_words: int) -> str:
    """The text's first `max_words` words."""
    return " ".join(text.split()[:max_words])


def degenerate(response: str, ended: bool, kind: str, rng: random.Random, max_words: int) -> tuple[str, bool]:
    """(variant, ended) of `response` of this `kind` (:data:`KINDS`), at most `max_words` words; see the module
    docstring. A variant that comes out as the response itself (one already at the length limit leaves no room to
    add to; a one-word response cannot be cut) is its truncation instead; the empty response's is the empty one
    that did not end."""
    out = variant(response, ended, kind, rng, max_words)
    if out == (response, ended) and kind != "truncate":
        out = variant(response, ended, "truncate", rng, max_words)
    return out


def variant(response: str, ended: bool, kind: str, rng: random.Random, max_words: int) -> tuple[str, bool]:
    """The variant of this kind as made (:func:`degenerate` replaces one equal to the response)."""
    if kind not in KINDS:
        raise ValueError(f"unknown degenerate kind {kind!r}; the kinds are {', '.join(KINDS)}")
    if max_words < 1:
        raise ValueError(f"max_words must be >= 1, got {max_words}")
    sents = sentences(response)
    words = response.split()
    if not sents:  # the empty response: nothing to repeat or cut, but it can fail to end
        return ("", False) if ended else (response, ended)
    if kind == "repeat":
        i = rng.randrange(len(sents))
        out = sents[: i + 1] + [sents[i]] * rng.randint(1, 3) + sents[i + 1 :]
        return fit(" ".join(out), max_words), ended
    if kind == "loop":
        n = max(2, max_words // max(1, len(sents[0].split())))
        return fit(" ".join([sents[0]] * n), max_words), ended
    if kind == "truncate":
        if len(words) < 2:
            return ("", False) if ended else (response, ended)
        return " ".join(words[: rng.randint(1, len(words) - 1)]), False
    if kind == "filler":
        out = list(sents)
        for _ in range(rng.randint(1, 3)):
            out.insert(rng.randint(0, len(out)), rng.choice(G.FILLERS))
        return fit(" ".join(out), max_words), ended
    if kind == "long":
        out = list(sents)
        while len(" ".join(out).split()) < max_words:
            out.append(rng.choice(G.NEUTRAL_SENTENCES))
        return fit(" ".join(out), max_words), ended
    if kind == "short":
        return (sents[0] if len(sents) > 1 else ""), ended
    if kind == "babble":
        i = rng.randrange(len(words))
        out = words[:i] + [words[i]] * rng.randint(3, 6) + words[i + 1 :]
        return fit(" ".join(out), max_words), ended
    j = rng.randrange(len(sents))  # drop, shuffle: one sentence loses its grammar
    body = sents[j].split()
    end = body[-1:] if body[-1] == "." else []
    body = body[: len(body) - len(end)]
    if kind == "drop" and len(body) > 1:
        for _ in range(min(rng.randint(1, 2), len(body) - 1)):
            del body[rng.randrange(len(body))]
    elif kind == "shuffle":
        rng.shuffle(body)
    out = sents[:j] + [" ".join(body + end)] + sents[j + 1 :]
    return fit(" ".join(out), max_words), ended


class Variants:
    """The second response of each degenerate pair (``sample_pairs(second=...)``): a variant of the first, from one
    random generator seeded by the pairs' seed, the kinds in turn across batches."""

    def __init__(self, seed: int, max_words: int):
        self.rng = random.Random(f"degenerate/{seed}")
        self.max_words = int(max_words)
        self.done = 0

    def __call__(self, prompts: list[str], responses: list[str], ended: list[bool]) -> tuple[list[str], list[bool]]:
        """One variant of each response (its prompt unused): response i of the pairs so far gets
        ``KINDS[i % len(KINDS)]``."""
        out = [degenerate(r, e, KINDS[(self.done + i) % len(KINDS)], self.rng, self.max_words)
               for i, (r, e) in enumerate(zip(responses, ended))]
        self.done += len(out)
        return [t for t, _ in out], [e for _, e in out]
