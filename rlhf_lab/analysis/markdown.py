"""Numbers as markdown: mean ± spread over seeds, number formatting, tables."""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import numpy as np


def mean_spread(values: Iterable[float]) -> tuple[float, float, int]:
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if len(v) == 0:
        return float("nan"), float("nan"), 0
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0, len(v)


def fmt(x: float, digits: int = 3, sci: bool = True) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "∞" if x > 0 else "−∞"
    if sci and (abs(x) >= 1e4 or (0 < abs(x) < 1e-3)):
        return f"{x:.2e}"
    return f"{x:.{digits}f}"


def fmt_ms(values: Iterable[float], digits: int = 3) -> str:
    m, s, n = mean_spread(values)
    if n == 0:
        return "–"
    return fmt(m, digits) if n == 1 else f"{fmt(m, digits)} ± {fmt(s, digits, sci=abs(m) < 1e-3 or abs(m) >= 1e4)}"


def fmt_ci(values: Iterable[float], digits: int = 3) -> str:
    """mean [95% Student-t interval] over the finite values (one value: the value; none: –)."""
    from rlhf_lab.analysis.stats import t_ci

    v = [x for x in values if x is not None and math.isfinite(x)]
    if not v:
        return "–"
    m, lo, hi, n = t_ci(v)
    return fmt(m, digits) if n < 2 else f"{fmt(m, digits)} [{fmt(lo, digits)}, {fmt(hi, digits)}]"


def cell(x: Any) -> str:
    """A table cell: a literal | is escaped so that it does not end the cell."""
    return str(x).replace("|", "\\|")


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
