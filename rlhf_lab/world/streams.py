"""The world's data streams: corpora, SFT pairs and prompt streams by split (their token batches: :mod:`rlhf_lab.models.batching`).

Every stream has its own seed derived from ``world.seed`` and the stream's name, and every stream draws
from one **split** of the prompt space (:mod:`rlhf_lab.world.splits`: a sha1 hash of the prompt text puts
it in train / eval / test, 80 / 10 / 10 by default; prompts about the held-out products
``world.ood_products`` form the ``ood`` slice). What draws from where:

======================================  =========================================================
pretraining corpus (``pretrain_a|b``)   ``pretrain``: train ∪ the OOD products' train-hash prompts
SFT reviews, preference pairs (train),  ``train`` only: no eval, test or OOD prompt, and no OOD
RM training, PPO prompts, online DPO    product, ever reaches a stage after pretraining
held-out preference pairs (RM, DPO)     ``eval``
``eval/*`` during training              ``eval``: a fixed multiset of ``eval.n_prompts`` prompts
``test/*`` at the start and end of      ``test``: ``eval.n_test_prompts`` prompts
a policy job
``eval/gold_reward_ood`` (with test/*)  ``ood``: ``eval.n_ood_prompts`` prompts
======================================  =========================================================

So evaluation prompts are held out from every training stage by construction of the split, not only by
the seed of the stream: a prompt's text decides its split. The evaluation sets (:func:`eval_prompts`)
depend only on ``world.seed``, ``world.splits``, ``world.ood_products`` and their size, so they are the
same at every evaluation of every run (common random numbers).
"""

from __future__ import annotations

import zlib

from dataclasses import dataclass

from rlhf_lab.world import PRETRAIN, SPLITS, ReviewGenerator, Splits, WorldSpec, check_split


def stream_seed(world_seed: int, stream: str) -> int:
    return (int(world_seed) * 1_000_003 + zlib.crc32(stream.encode())) % (2**31)


@dataclass(frozen=True)
class WorldSettings:
    """What the world's streams read of the ``world`` group (:func:`rlhf_lab.config.world.world_settings` resolves it
    from the config): the seed every stream's seed derives from, the text settings, the splits."""

    seed: int
    spec: WorldSpec
    splits: Splits


def generator(world: WorldSettings, stream: str) -> ReviewGenerator:
    return ReviewGenerator(stream_seed(world.seed, stream), world.spec, world.splits)


def reviews(world: WorldSettings, stream: str, n: int, split: str = "train") -> list[tuple[str, str]]:
    """`n` (prompt, review) pairs of the seeded `stream`, prompts from `split` (or ``pretrain``)."""
    check_split(split, SPLITS + (PRETRAIN,))
    return generator(world, stream).reviews(n, split)


def prompts(world: WorldSettings, stream: str, n: int, split: str = "train") -> list[str]:
    """`n` prompts of the seeded `stream` from `split` (train, eval, test or ood; repeats possible)."""
    check_split(split)
    g = generator(world, stream)
    return [g.prompt(split) for _ in range(n)]


def prompts_outside(world: WorldSettings, stream: str, n: int, exclude: set[str], split: str = "train") -> list[str]:
    """`n` prompts of the seeded `stream` from `split`, none of them in `exclude` (draws that are, are skipped; repeats
    of one prompt possible, as in :func:`prompts`): pairs on other prompts than another stream's. Raises ValueError
    when the split has too few prompts outside `exclude` (fewer than `n` found in 100·n + 1000 draws)."""
    check_split(split)
    g, out = generator(world, stream), []
    for _ in range(100 * n + 1000):
        if len(out) == n:
            return out
        p = g.prompt(split)
        if p not in exclude:
            out.append(p)
    if len(out) == n:
        return out
    raise ValueError(f"only {len(out)} of {n} {split}-split prompts of stream {stream!r} lie outside the "
                     f"{len(exclude)} excluded ones; the world's {split} split is too small for them")


EVAL_SIZE_KEYS = {"eval": "n_prompts", "test": "n_test_prompts", "ood": "n_ood_prompts"}


def eval_prompts(world: WorldSettings, split: str, n: int) -> list[str]:
    """The fixed evaluation prompts of `split` (eval, test or ood): `n` (``eval.<size key>``) draws of the stream
    named after the split, the same in every run and at every step (a larger `n` extends the list)."""
    check_split(split, tuple(EVAL_SIZE_KEYS))
    return prompts(world, split, n, split)
