"""How the claims report words a shown effect: from its interval and equivalence margin alone, so that no
hand-written label can contradict its numbers (issue 42, point 6).

A shown part (:func:`~rlhf_lab_research.claims_registry.shown`) names what it compares and carries :class:`Words`, what
each side of 0 means for it; :func:`word_effect` picks them from the interval: a direction when the interval
excludes 0, "no … detected" only when it lies inside ±margin, "inconclusive" otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlhf_lab.analysis.markdown import fmt


@dataclass(frozen=True)
class Words:
    """`above` when an effect's interval lies above 0, `below` when below, `negligible` only when it lies inside
    ±margin (a part without a margin is never negligible); otherwise it is inconclusive."""

    above: str
    below: str
    negligible: str


def gold_words(more: str, less: str) -> Words:
    """Words for a gold difference: `more` / `less` on either side, "no gold difference detected" inside ±margin."""
    return Words(more, less, "no gold difference detected")


def word_effect(lo: float, hi: float, margin: float | None, words: Words, estimate: float | None = None,
                unit: str = "", note: str = "") -> str:
    """An effect in words from its interval [lo, hi] and equivalence `margin`: ``words.below`` when the interval
    lies below 0, ``words.above`` when above (noting "by less than ±margin" when it also lies inside the margin),
    ``words.negligible`` only when it spans 0 inside ±margin, "inconclusive" otherwise, and "no interval" without
    one; `note` (e.g. " (unadjusted)") follows a conclusion, a direction or a negligible call, and nothing else.
    With `estimate`, the numbers follow: "costs gold: -0.044 [-0.078, -0.009] gold reward"."""
    finite = math.isfinite(lo) and math.isfinite(hi)
    if not finite:
        text = "no interval"
    else:
        m = f"±{margin:.3g}" if margin is not None else ""
        inside = margin is not None and -margin <= lo and hi <= margin
        if hi < 0 or lo > 0:
            text = (words.below if hi < 0 else words.above) + (f" (by less than {m})" if inside else "") + note
        elif inside:
            text = f"{words.negligible} (inside {m})" + note
        else:
            text = "inconclusive (the interval spans 0" + (f" and reaches past {m})" if m else ")")
    if estimate is None:
        return text
    return f"{text}: {fmt(estimate)}" + (f" [{fmt(lo)}, {fmt(hi)}]" if finite else "") + (f" {unit}" if unit else "")
