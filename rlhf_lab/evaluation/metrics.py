"""Sample statistics shared by every policy algorithm (names in docs/metrics.md)."""

from __future__ import annotations

import math
from typing import Hashable, Sequence

from rlhf_lab.world import count_fillers, prompt_hash


def distinct_n(texts: list[str], n: int) -> float:
    """Distinct n-grams / total n-grams over all responses (words)."""
    total, seen = 0, set()
    for t in texts:
        w = t.split()
        grams = [tuple(w[i : i + n]) for i in range(len(w) - n + 1)]
        total += len(grams)
        seen.update(grams)
    return len(seen) / total if total else 0.0


def filler_rate(texts: list[str]) -> float:
    return sum(count_fillers(t) > 0 for t in texts) / max(1, len(texts))


def unique_rate(texts: list[str]) -> float:
    return len(set(texts)) / max(1, len(texts))


def cluster_mean_se(values: Sequence[float], groups: Sequence[Hashable]) -> tuple[float, float]:
    """Mean of the per-group means and its standard error, clustered by group (e.g. by prompt).

    With m_g the mean of the values of group g and G groups: mean = Σ m_g / G and
    se = sd(m_1..m_G, ddof=1) / √G. Samples of one prompt are correlated (the prompt is shared), so the
    plain sd(values) / √n would understate the error; the groups, not the samples, are the independent
    draws. With one value per group this is the usual sd / √n. G < 2 gives se = NaN; no values, NaN too.
    """
    if len(values) != len(groups):
        raise ValueError(f"values and groups differ in length ({len(values)} vs {len(groups)})")
    by: dict = {}
    for v, g in zip(values, groups):
        by.setdefault(g, []).append(float(v))
    means = [sum(vs) / len(vs) for vs in by.values()]
    G = len(means)
    if G == 0:
        return float("nan"), float("nan")
    mean = sum(means) / G
    if G < 2:
        return mean, float("nan")
    var = sum((m - mean) ** 2 for m in means) / (G - 1)
    return mean, math.sqrt(var / G)


def half_a(prompts: Sequence[str]) -> list[bool]:
    """Which evaluation prompts form half A: the ⌊n/2⌋ whose text has the smaller stable hash
    (sha1, ties by position); the rest are half B. Fixed for a fixed prompt list, and duplicates of a
    prompt land in the same half unless they straddle the cut."""
    order = sorted(range(len(prompts)), key=lambda i: (prompt_hash(prompts[i], "half/"), i))
    a = set(order[: len(prompts) // 2])
    return [i in a for i in range(len(prompts))]


def pair_agreement(proxy: Sequence[float], gold: Sequence[float], groups: Sequence[Hashable],
                   tie: float = 1e-9) -> tuple[list[float], list[Hashable]]:
    """Whether the proxy ranks two responses to one prompt as gold does: over every pair i < j within a group
    (a prompt's samples) whose gold rewards differ by more than `tie`, 1 when the proxy orders them the same way,
    0 when the other way, 0.5 when the proxy ties. Returns (the values, their groups), for :func:`cluster_mean_se`:
    the mean is the proxy's pairwise accuracy against gold on these responses (e.g. the policy's own samples).
    One response per group gives no pair."""
    by: dict = {}
    for j, g in enumerate(groups):
        by.setdefault(g, []).append(j)
    values, out_groups = [], []
    for g, idx in by.items():
        for a in range(len(idx)):
            for b in range(a + 1, len(idx)):
                i, j = idx[a], idx[b]
                dg, dp = gold[i] - gold[j], proxy[i] - proxy[j]
                if abs(dg) <= tie:
                    continue
                values.append(0.5 if dp == 0 else float((dg > 0) == (dp > 0)))
                out_groups.append(g)
    return values, out_groups
