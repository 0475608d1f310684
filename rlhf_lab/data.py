"""Datasets built from the world: corpora, SFT pairs, held-out prompts, and batching for causal LMs.

Every stream has its own seed derived from ``world.seed`` and the stream's name, so that e.g. the
evaluation prompts never overlap the training stream by construction of the RNG, and family ``b``
pretrains on a different corpus sample than family ``a``.
"""

from __future__ import annotations

import zlib
from typing import Sequence

import torch
from omegaconf import DictConfig

from rlhf_lab.world import GoldWeights, Labeler, ReviewGenerator, WorldSpec


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


def world_generation_spec(cfg: DictConfig) -> dict:
    """The part of the world config that determines generated text (not the reward)."""
    return {k: cfg.world[k] for k in ("name", "seed", "max_sentences", "mean_sentences", "filler_rate",
                                      "adverb_rate", "sentiment_noise")}


def reviews(cfg: DictConfig, stream: str, n: int) -> list[tuple[str, str]]:
    return ReviewGenerator(stream_seed(cfg.world.seed, stream), world_spec(cfg)).reviews(n)


def prompts(cfg: DictConfig, stream: str, n: int) -> list[str]:
    g = ReviewGenerator(stream_seed(cfg.world.seed, stream), world_spec(cfg))
    return [g.prompt() for _ in range(n)]


def eval_prompts(cfg: DictConfig) -> list[str]:
    return prompts(cfg, "eval", int(cfg.eval.n_prompts))


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
