"""Batched sampling and per-token log-probs for decoder policies.

Prompts are left-padded for generation; responses come back right-padded, with the EOS token inside
the mask and padding after it. Every forward pass gets explicit position ids (cumsum of the attention
mask), so left padding does not shift positions, whatever the architecture.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Rollout:
    prompts: list[str]
    query_ids: torch.Tensor  # [B, P] left-padded
    query_mask: torch.Tensor  # [B, P]
    response_ids: torch.Tensor  # [B, T] right-padded
    response_mask: torch.Tensor  # [B, T], 1 up to and including EOS
    responses: list[str]
    ended: list[bool]  # whether the response ended with EOS (else it hit max_new_tokens)

    @property
    def lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)


def encode_prompts(tokenizer, prompts: list[str], max_prompt_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    if max_prompt_len is not None and enc.input_ids.shape[1] > max_prompt_len:
        longest = max(prompts, key=len)
        raise ValueError(
            f"a prompt is {enc.input_ids.shape[1]} tokens long, over the limit {max_prompt_len} "
            f"(e.g. {longest[:80]!r}); raise generation.max_prompt_len (null: no limit) or shorten the prompts"
        )
    return enc.input_ids, enc.attention_mask


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def trim_padding(query_ids, query_mask, response_ids, response_mask):
    """Some rows of a rollout (left-padded prompts, right-padded responses) without the columns that are padding
    in all of them: the prompts' common left padding and the responses' common right padding. The remaining
    tokens keep their positions (the cumsum of the mask), so a forward pass gives the same log-probs and values
    at the remaining response positions. Returns the four tensors, trimmed."""
    start = query_mask.shape[1] - max(1, int(query_mask.sum(1).max()))
    T = max(1, int(response_mask.sum(1).max()))
    return query_ids[:, start:], query_mask[:, start:], response_ids[:, :T], response_mask[:, :T]


def pack_rollout(query_ids, query_mask, response_ids, response_mask,
                 pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of a rollout (left-padded prompts, right-padded responses) packed without padding
    (:func:`rlhf_lab.data.pack_rows` on each row's prompt + response tokens, :mod:`rlhf_lab.models.packing`).
    Returns the packed ids and position ids [R, W] and ``response_index`` [B, T]: for each response token, the
    index in the flattened [R * W] rows of the position whose output predicts it (the token before it); 0 where
    the response mask is 0. On the rollout's device."""
    from rlhf_lab.data import pack_rows

    q_len, r_len = query_mask.sum(1), response_mask.sum(1)
    seqs = [q[len(q) - n:] + r[:k] for q, r, n, k in
            zip(query_ids.tolist(), response_ids.tolist(), q_len.tolist(), r_len.tolist())]
    ids, pos, last = pack_rows(seqs, pad_id)
    t = torch.arange(response_ids.shape[1])
    index = torch.where(t[None, :] < r_len.cpu()[:, None], last[:, None] - r_len.cpu()[:, None] + t[None, :], 0)
    dev = response_ids.device
    return ids.to(dev), pos.to(dev), index.to(dev)


def response_mask_from_ids(response_ids: torch.Tensor, eos_id: int) -> tuple[torch.Tensor, list[bool]]:
    is_eos = response_ids == eos_id
    # 1 up to and including the first EOS
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    mask = (~after_eos).long()
    ended = is_eos.any(-1).tolist()
    return mask, ended


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], max_new_tokens: int, temperature: float = 1.0,
           top_k: int = 0, top_p: float = 1.0, max_prompt_len: int | None = None) -> Rollout:
    """Sample one response per prompt with KV-cached generation (Hugging Face `generate`)."""
    if temperature < 0:
        raise ValueError(f"generation.temperature must be >= 0, got {temperature}")
    q_ids, q_mask = encode_prompts(tokenizer, prompts, max_prompt_len)
    dev = next(model.parameters()).device
    q_ids, q_mask = q_ids.to(dev), q_mask.to(dev)
    was_training = model.training
    model.eval()
    kwargs = dict(do_sample=temperature > 0, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                  eos_token_id=tokenizer.eos_token_id)
    if temperature > 0:
        kwargs.update(temperature=temperature, top_k=int(top_k or 0), top_p=float(top_p))
    out = model.generate(input_ids=q_ids, attention_mask=q_mask, **kwargs)
    model.train(was_training)
    r_ids = out[:, q_ids.shape[1]:]
    mask, ended = response_mask_from_ids(r_ids, tokenizer.eos_token_id)
    r_ids = torch.where(mask.bool(), r_ids, torch.full_like(r_ids, tokenizer.pad_token_id))
    texts = decode_responses(tokenizer, r_ids, mask)
    return Rollout(list(prompts), q_ids, q_mask, r_ids, mask, texts, ended)


def decode_responses(tokenizer, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    out = []
    for ids, m in zip(response_ids.tolist(), response_mask.tolist()):
        ids = [t for t, k in zip(ids, m) if k]
        out.append(tokenizer.decode(ids, skip_special_tokens=True).strip())
    return out


def response_logprobs(model, query_ids, query_mask, response_ids, response_mask, temperature: float = 1.0,
                      with_entropy: bool = False):
    """Per-token log π(y_t | x, y_<t) of the response tokens (logits divided by the sampling temperature).

    Returns logp [B, T] (0 where the mask is 0) and, if asked, the per-token entropy [B, T]. The LM head
    runs only at the T positions that predict response tokens (``logits_to_keep``), not over the prompt.
    """
    input_ids = torch.cat([query_ids, response_ids], dim=1)
    attn = torch.cat([query_mask, response_mask], dim=1)
    T = response_ids.shape[1]
    logits = model(input_ids=input_ids, attention_mask=attn, position_ids=positions(attn), logits_to_keep=T + 1).logits
    return token_logprobs(logits[:, :-1], response_ids, response_mask, temperature, with_entropy)


def logprobs_from_logits(logits, query_len: int, response_ids, response_mask, temperature: float = 1.0,
                         with_entropy: bool = False):
    """`response_logprobs` from the logits [B, P+T, V] of a forward pass over query + response."""
    return token_logprobs(logits[:, query_len - 1 : -1], response_ids, response_mask, temperature, with_entropy)


def token_logprobs(logits, token_ids, mask, temperature: float = 1.0, with_entropy: bool = False,
                   entropy_grad: bool = True):
    """log π of ``token_ids`` [B, T] from the logits [B, T, V] that predict them (0 where ``mask`` is 0),
    and, if asked, the per-token entropy (without a gradient when ``entropy_grad`` is false: a metric only)."""
    logits = logits.float()
    if temperature and temperature != 1.0:
        logits = logits / temperature
    logp_all = F.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1) * mask
    if not with_entropy:
        return logp
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(logp_all.exp() * logp_all).sum(-1) * mask
    return logp, entropy
