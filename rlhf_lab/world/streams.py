"""Datasets built from the world: corpora, SFT pairs, prompt streams by split, and batching for causal LMs.

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
from typing import Sequence

import torch
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


def encode_lm_examples(tokenizer, pairs: list[tuple[str, str]], max_len: int, loss_on_prompt: bool) -> list[dict]:
    """Encode (prompt, response) as <prompt tokens><response tokens><eos>; labels −100 where no loss."""
    out = []
    for prompt, response in pairs:
        p = tokenizer(prompt).input_ids
        r = tokenizer(" " + response, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        ids = (p + r)[:max_len]
        labels = (ids if loss_on_prompt else [-100] * len(p) + r)[:max_len]
        out.append({"input_ids": ids, "labels": labels})
    return out


def pad_right(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded token ids and attention mask [B, T] of token-id lists (none of them empty)."""
    if any(len(s) == 0 for s in seqs):
        raise ValueError("an input encodes to zero tokens")
    T = max(1, max((len(s) for s in seqs), default=1))
    pad = int(pad_id)
    ids = torch.tensor([list(s) + [pad] * (T - len(s)) for s in seqs], dtype=torch.long).reshape(len(seqs), T)
    mask = torch.tensor([[1] * len(s) + [0] * (T - len(s)) for s in seqs], dtype=torch.long).reshape(len(seqs), T)
    return ids, mask


def pack_rows(seqs: Sequence[Sequence[int]], pad_id: int,
              width: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padding-free batching: token-id lists (none empty) packed into rows, first-fit decreasing (longest first,
    ties in input order), each row at most ``width`` tokens (default: the longest list, so no list is split).

    Returns the token ids [R, W] (``pad_id`` after a row's last list; W the fullest row's length), the position
    ids [R, W] (0, 1, ... within each list; a row's padding counts 0, 1, ... as one more list), and the index of
    each list's last token in the flattened [R * W] ids, in input order. A model that derives its attention
    mask from the position ids (transformers' packed-sequence masks) keeps the lists apart.
    """
    lens = [len(s) for s in seqs]
    if not lens or min(lens) == 0:
        raise ValueError("packing needs at least one input, and none of zero tokens")
    width = max(lens) if width is None else int(width)
    if max(lens) > width:
        raise ValueError(f"an input of {max(lens)} tokens does not fit a packed row of {width}")
    rows: list[list[int]] = []
    fill: list[int] = []
    for i in sorted(range(len(seqs)), key=lambda i: -lens[i]):
        r = next((r for r, f in enumerate(fill) if f + lens[i] <= width), len(rows))
        if r == len(rows):
            rows.append([])
            fill.append(0)
        rows[r].append(i)
        fill[r] += lens[i]
    W = max(fill)
    ids: list[int] = []
    pos: list[int] = []
    last = [0] * len(seqs)
    for row, f in zip(rows, fill):
        for i in row:
            ids.extend(seqs[i])
            pos.extend(range(lens[i]))
            last[i] = len(ids) - 1
        ids.extend([int(pad_id)] * (W - f))
        pos.extend(range(W - f))
    shape = (len(rows), W)
    return (torch.tensor(ids, dtype=torch.long).reshape(shape), torch.tensor(pos, dtype=torch.long).reshape(shape),
            torch.tensor(last, dtype=torch.long))


def collate_right(tokenizer):
    pad = tokenizer.pad_token_id

    def collate(batch: list[dict]) -> dict[str, torch.Tensor]:
        T = max(len(b["input_ids"]) for b in batch)
        ids = torch.full((len(batch), T), pad, dtype=torch.long)
        labels = torch.full((len(batch), T), -100, dtype=torch.long)
        mask = torch.zeros((len(batch), T), dtype=torch.long)
        for i, b in enumerate(batch):
            n = len(b["input_ids"])
            ids[i, :n] = torch.tensor(b["input_ids"])
            labels[i, :n] = torch.tensor(b["labels"])
            mask[i, :n] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}

    return collate
