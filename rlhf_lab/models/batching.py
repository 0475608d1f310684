"""Token batches for the models: right-padded ids and masks (:func:`pad_right`), padding-free packed rows
(:func:`pack_rows`, whose passes are :mod:`rlhf_lab.models.packing`), the rows' distinct prompts
(:func:`prompt_groups`, for :mod:`rlhf_lab.models.shared_prefix`), and a causal LM's (prompt, response) examples
with their collate function (:func:`encode_lm_examples`, :func:`collate_right`). A leaf: torch only."""

from __future__ import annotations

from typing import Sequence

import torch


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


def prompt_groups(q_ids: torch.Tensor, q_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' distinct prompts (left-padded ids and masks [B, P]): (``first`` [n], the first row of each distinct
    prompt; ``group`` [B], the index into ``first`` of each row's prompt). Rows are alike when ids and masks are."""
    _, group = torch.unique(torch.cat([q_ids * q_mask, q_mask], 1), dim=0, return_inverse=True)
    rows = torch.arange(len(group), device=group.device)
    first = torch.full((int(group.max()) + 1,), len(group), device=group.device).scatter_reduce(0, group, rows, "amin")
    return first, group


def collate_right(tokenizer):
    """The collate function of :func:`encode_lm_examples`' examples: right-padded ``input_ids`` and
    ``attention_mask`` (:func:`pad_right`), and ``labels`` padded with −100 (no loss)."""

    def collate(batch: list[dict]) -> dict[str, torch.Tensor]:
        ids, mask = pad_right([b["input_ids"] for b in batch], tokenizer.pad_token_id)
        labels, _ = pad_right([b["labels"] for b in batch], -100)
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}

    return collate
