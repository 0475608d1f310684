"""Sample statistics shared by every policy algorithm (names in docs/metrics.md)."""

from __future__ import annotations

from rlhf_lab.world import count_fillers


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
