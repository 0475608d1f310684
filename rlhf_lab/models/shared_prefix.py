"""Passes over rows that share a prefix (the G responses GRPO and RLOO sample for one prompt): the prefix runs once,
its KV cache is indexed out to the rows that share it, and each row's suffix runs on that cache (Prefix Grouper's
shared-prefix forward, Liu et al. 2025, arXiv 2506.05433). Under causal attention a suffix sees its prefix only through
the prefix's keys and values, so the states are the whole sequence's to float noise. With ``algo.shared_prompt``,
PPO's passes without gradients (:mod:`rlhf_lab.algorithms.ppo`: old log-probs, values, reference; the sampler's
prefill shares a prompt's too, :func:`rlhf_lab.models.sampling.kv_generate`) and the reward model's scores
(:class:`rlhf_lab.models.reward.RewardScorer`) run this way; it pays where a pass costs its tokens (the 0.5b shape:
benchmarks/results.md), not on a tiny model, where two calls cost more than the tokens saved. The update's
passes run packed: there it saved nothing at the 0.5b shape on a CPU (benchmarks/README.md).
"""

from __future__ import annotations

import torch


def shared_prefix_states(trunk, prefix_ids, prefix_mask, group, suffix_ids, suffix_mask):
    """A trunk's last hidden states of ``prefix[group[b]] + suffix[b]`` for every row b, each prefix run once: the
    prefixes' [n, P] (left-padded) and the suffixes' [B, S] (right-padded). Returns (the state at each prefix's last
    token [n, H], the suffixes' states [B, S, H])."""
    from rlhf_lab.models.sampling import cache_argument, positions

    cache_kw = cache_argument(trunk)
    out = trunk(input_ids=prefix_ids, attention_mask=prefix_mask, position_ids=positions(prefix_mask), use_cache=True)
    cache = out[cache_kw]
    cache.batch_select_indices(group)  # the rows' keys and values: an index, so their gradients sum into the prefix's
    attn = torch.cat([prefix_mask[group], suffix_mask], 1)
    pos = prefix_mask[group].sum(1, keepdim=True) + torch.arange(suffix_ids.shape[1], device=suffix_ids.device)
    suffix = trunk(input_ids=suffix_ids, attention_mask=attn, position_ids=pos, use_cache=True, **{cache_kw: cache})
    return out.last_hidden_state[:, -1], suffix.last_hidden_state


def shared_prompt_hidden(trunk, q_ids, q_mask, r_ids, r_mask, groups) -> torch.Tensor:
    """The trunk's last hidden states [B, T, H] at the positions that predict the response tokens (the prompt's last
    token, then the response's but its last), each distinct prompt run once (``groups``:
    :func:`rlhf_lab.models.batching.prompt_groups`)."""
    first, group = groups
    prompt_last, response = shared_prefix_states(trunk, q_ids[first], q_mask[first], group, r_ids, r_mask)
    return torch.cat([prompt_last[group].unsqueeze(1), response[:, :-1]], 1)


def common_prefixes(seqs: list[list[int]], keys: list) -> tuple[list[list[int]], list[int], list[list[int]]] | None:
    """Token lists split where the lists of one key (a prompt's text) stop agreeing: (the longest prefix each key's
    lists share, at most one token shorter than the shortest of them, one per key; each list's key index; each
    list's rest). None where a key's lists share no token: a pass over them could not share one."""
    index = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    group = [index[k] for k in keys]
    prefixes: list[list[int] | None] = [None] * len(index)
    for g, s in zip(group, seqs):
        p = prefixes[g]
        if p is None:
            p = s[:-1]
        else:
            n = next((i for i, (a, b) in enumerate(zip(p, s)) if a != b), min(len(p), len(s) - 1))
            p = p[:min(n, len(s) - 1)]
        prefixes[g] = p
    if any(not p for p in prefixes):
        return None
    return prefixes, group, [s[len(prefixes[g]):] for g, s in zip(group, seqs)]
