"""Small, pure statistics for the study reports (numpy and scipy only): the mean with its t interval.

Conventions, shared by every function here and by :mod:`rlhf_lab_research.stats`, which builds the claims' effects on
them:

* Samples are 1-D. NaNs are **dropped** before anything is computed (a NaN is a run that crashed or a
  metric that was never logged, not a value); `n` in the results is the count after dropping them.
* Too little data gives NaN bounds, never an exception: n = 0 → estimate NaN; n < 2 → interval (nan, nan).
* Intervals are two-sided at `level` (0.95 by default).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats as _st


def sample(x: Any) -> np.ndarray:
    """x as a 1-D float array with NaNs dropped (±inf is kept: it is a value, and it should show)."""
    v = np.asarray(x, dtype=float)
    if v.ndim == 0:
        v = v.reshape(1)
    if v.ndim != 1:
        raise ValueError(f"expected a 1-D sample, got shape {v.shape}")
    return v[~np.isnan(v)]


def check_level(level: float) -> None:
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")


def mean_se(x: Any) -> tuple[float, float, int]:
    """(mean, se, n) of a 1-D sample, NaNs dropped.

    mean = Σxᵢ / n,  se = s / √n  with  s² = Σ(xᵢ − mean)² / (n − 1)   (ddof = 1).
    n = 0 → (nan, nan, 0);  n = 1 → (x₁, nan, 1).
    """
    v = sample(x)
    n = v.size
    if n == 0:
        return math.nan, math.nan, 0
    m = float(v.mean())
    se = float(v.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    return m, se, n


def t_ci(x: Any, level: float = 0.95) -> tuple[float, float, float, int]:
    """(mean, lo, hi, n): Student-t interval of the mean, NaNs dropped.

    mean ± t_{(1+level)/2, n−1} · s/√n.  n < 2 → (mean, nan, nan, n).
    """
    check_level(level)
    m, se, n = mean_se(x)
    if n < 2:
        return m, math.nan, math.nan, n
    h = float(_st.t.ppf((1 + level) / 2, n - 1)) * se
    return m, m - h, m + h, n
