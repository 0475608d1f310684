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

from omegaconf import DictConfig

from rlhf_lab.world import PRETRAIN, SPLITS, GoldWeights, Labeler, ReviewGenerator, Splits, WorldSpec, check_split


def stream_seed(world_seed: int, stream: str) -> int:
    return (int(world_seed) * 1_000_003 + zlib.crc32(stream.encode())) % (2**31)


def world_spec(cfg: DictConfig) -> WorldSpec:
    w = cfg.world
    return WorldSpec(max_sentences=w.max_sentences, mean_sentences=w.mean_sentences, filler_rate=w.filler_rate,
                     adverb_rate=w.adverb_rate, sentiment_noise=w.sentiment_noise)


def gold_weights(cfg: DictConfig) -> GoldWeights:
    return GoldWeights(**dict(cfg.world.gold))


def labeler(cfg: DictConfig) -> Labeler:
    lab = cfg.labeler
    return Labeler(temperature=lab.temperature, length_bonus=lab.length_bonus, filler_bonus=lab.filler_bonus)


def splits(cfg: DictConfig) -> Splits:
    sp = cfg.world.splits
    return Splits(train=float(sp.train), eval=float(sp.eval), test=float(sp.test),
                  ood_products=tuple(str(p) for p in cfg.world.ood_products))


def world_generation_spec(cfg: DictConfig) -> dict:
    """The part of the world config that determines generated text (not the reward), splits included."""
    spec = {k: cfg.world[k] for k in ("name", "seed", "max_sentences", "mean_sentences", "filler_rate",
                                      "adverb_rate", "sentiment_noise")}
    sp = splits(cfg)
    spec["splits"] = {"train": sp.train, "eval": sp.eval, "test": sp.test, "ood_products": list(sp.ood_products)}
    return spec


def generator(cfg: DictConfig, stream: str) -> ReviewGenerator:
    return ReviewGenerator(stream_seed(cfg.world.seed, stream), world_spec(cfg), splits(cfg))


def reviews(cfg: DictConfig, stream: str, n: int, split: str = "train") -> list[tuple[str, str]]:
    """`n` (prompt, review) pairs of the seeded `stream`, prompts from `split` (or ``pretrain``)."""
    check_split(split, SPLITS + (PRETRAIN,))
    return generator(cfg, stream).reviews(n, split)


def prompts(cfg: DictConfig, stream: str, n: int, split: str = "train") -> list[str]:
    """`n` prompts of the seeded `stream` from `split` (train, eval, test or ood; repeats possible)."""
    check_split(split)
    g = generator(cfg, stream)
    return [g.prompt(split) for _ in range(n)]


EVAL_SIZE_KEYS = {"eval": "n_prompts", "test": "n_test_prompts", "ood": "n_ood_prompts"}


def eval_prompts(cfg: DictConfig, split: str = "eval") -> list[str]:
    """The fixed evaluation prompts of `split` (eval, test or ood): ``eval.<size key>`` draws of the stream
    named after the split, the same in every run and at every step (a larger size extends the list)."""
    check_split(split, tuple(EVAL_SIZE_KEYS))
    return prompts(cfg, split, int(cfg.eval[EVAL_SIZE_KEYS[split]]), split)
