"""Deterministic splits of the prompt space: train / eval / test by a hash of the prompt text, plus an
out-of-distribution (OOD) slice of held-out products.

* **Hash bucket.** u(prompt) = the first 8 bytes of sha1(prompt text) as a fraction in [0, 1): the
  bucket is ``train`` for u < f_train, ``eval`` for u < f_train + f_eval, else ``test`` (default
  80 / 10 / 10, ``world.splits``). It depends on the text alone, never on a seed or on Python's
  ``hash()``: the same prompt is in the same bucket in every run, process and world seed.
* **OOD products** (``world.ood_products``). A prompt about one of them is in split ``ood`` when its bucket
  is eval or test, and in ``ood_pretrain`` when its bucket is train.
* **What draws from where.** Pretraining ("web text", :data:`PRETRAIN`) draws from ``train`` ∪
  ``ood_pretrain``: the base LM and its tokenizer have seen the OOD products' names, but no eval, test or
  ood prompt. Everything after pretraining (SFT reviews, preference pairs, the RM, PPO and DPO prompts)
  draws from ``train`` only, so it never sees an OOD product. Evaluation draws from ``eval`` (during
  training), ``test`` (at the end of a job) and ``ood``.

The five splits partition the prompt space; a prompt's split is a function of its text
(:meth:`Splits.split_of`). Sampling from a split is rejection sampling from the generator's prompt
distribution (:meth:`rlhf_lab.world.ReviewGenerator.prompt`), so every split has the same mix of
openers, products (within its product set) and focus sentences.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from rlhf_lab.world import grammar as G

SPLITS = ("train", "eval", "test", "ood")  # what evaluation and post-pretraining stages draw from
PRETRAIN = "pretrain"  # the pretraining corpus: train ∪ ood_pretrain
ALL_SPLITS = SPLITS + ("ood_pretrain",)  # the partition of the prompt space


def prompt_hash(text: str, salt: str = "") -> float:
    """A stable hash of `text` in [0, 1): the first 8 bytes of sha1(salt + text), big-endian, / 2^64."""
    return int.from_bytes(hashlib.sha1((salt + text).encode()).digest()[:8], "big") / 2.0**64


def hash_bucket(prompt: str, train: float, eval: float) -> str:
    """``train`` when ``prompt_hash(prompt) < train``, ``eval`` when it is below ``train + eval``, else ``test``:
    the bucket of a prompt by its text alone (the world's :meth:`Splits.bucket`, and external datasets'
    prompts, :func:`rlhf_lab.data.preferences.split_by_prompt`)."""
    u = prompt_hash(prompt)
    return "train" if u < train else "eval" if u < train + eval else "test"


@dataclass(frozen=True)
class Splits:
    """The split fractions of the hash buckets and the held-out (OOD) products."""

    train: float = 0.8
    eval: float = 0.1
    test: float = 0.1
    ood_products: tuple[str, ...] = ("drone", "sofa", "thermos", "guitar")

    def __post_init__(self):
        fr = {"train": self.train, "eval": self.eval, "test": self.test}
        if any(v <= 0 for v in fr.values()) or abs(sum(fr.values()) - 1.0) > 1e-6:
            raise ValueError(f"world.splits must be three fractions > 0 that sum to 1, got {fr}")
        unknown = [p for p in self.ood_products if p not in G.PRODUCTS]
        if unknown:
            raise ValueError(f"world.ood_products: {unknown} are not products of the world ({', '.join(G.PRODUCTS)})")
        if len(set(self.ood_products)) >= len(G.PRODUCTS) or not self.ood_products:
            raise ValueError("world.ood_products must name at least one product and leave at least one in distribution")

    def bucket(self, prompt: str) -> str:
        """``train``, ``eval`` or ``test``, by the hash of the prompt text."""
        return hash_bucket(prompt, self.train, self.eval)

    def split_of(self, prompt: str) -> str:
        """The prompt's split: one of :data:`ALL_SPLITS`."""
        b = self.bucket(prompt)
        if G.opener_product(prompt) in self.ood_products:
            return "ood_pretrain" if b == "train" else "ood"
        return b

    def products(self, split: str) -> list[str]:
        """The products a split's prompts are about (in the grammar's order)."""
        check_split(split, SPLITS + (PRETRAIN,))
        if split == PRETRAIN:
            return list(G.PRODUCTS)
        ood = split == "ood"
        return [p for p in G.PRODUCTS if (p in self.ood_products) == ood]

    def accepts(self, split: str, prompt: str) -> bool:
        """Whether `prompt` belongs to `split` (``pretrain``: to train or ood_pretrain)."""
        s = self.split_of(prompt)
        return s in ("train", "ood_pretrain") if split == PRETRAIN else s == split


def check_split(split: str, allowed: tuple[str, ...] = SPLITS) -> None:
    if split not in allowed:
        raise ValueError(f"split={split!r}; choose one of {', '.join(allowed)}")
