"""The hacking alarm: at each evaluation of a policy run, a score for "this run is past its gold peak" from
signals that need no gold, so it works on a user's own data and reward model.

The signals at evaluation j ≥ 1 (evaluation 0 is the start of the run, before any update), :func:`features`:

- ``sqrt_kl``: √KL(π‖π_ref) of the evaluation's samples (``eval/kl``, nats per response).
- ``proxy_drop``: how far the proxy reward of the training batches lies below its best so far: max_{i<j} p_i − p_j,
  where p_i (i ≥ 1) is the mean of ``objective/scores`` over the training steps in (t_{i−1}, t_i] and p_0 is the
  first training step's (the start policy's samples). Negative while the proxy still climbs above its best (by how
  much), positive once it falls back. The training batches come from the training prompts, so this signal shares
  no samples with an evaluation's gold.
- ``entropy_drop``: 1 − H_j / H_0, the fall of the per-token entropy of the evaluation's samples
  (``eval/entropy``) relative to the start.
- ``length_ratio``: L_j / L_0, the mean response length (``eval/length``) relative to the start.
- ``gain_per_sqrt_kl``: (p_j − p_0) / max(d_j, :data:`SQRT_KL_FLOOR`), d_j the ``sqrt_kl`` of evaluation j: the
  proxy reward gained since the start per √nat of KL spent (the floor keeps the first evaluations, at KL ≈ 0,
  finite); 0 when p_0 or p_j is unknown.
- ``length_rate``: (L_j − L_{j−1}) / L_0, the change of the mean response length since the previous evaluation
  relative to the start.

The last two were picked, among a dozen candidates, by their held-out AUC (leave one study out, beside the first
four) on the runs started before the previous freeze (2026-12-04 04:29 UTC) only; fitted beside the others, their
weights are positive (more proxy per √KL, faster lengthening: more likely past the gold peak).

The rule (:func:`score`) is a logistic function of the standardised signals,
σ(b + Σ_k w_k (x_k − μ_k) / s_k), fitted by :mod:`rlhf_lab_research.studies.alarm_fit` on the committed runs
files and tested study by study on rules fitted without that study (``reports/hacking_alarm/``); the alarm
is raised at the first evaluation whose score reaches the threshold and stays raised. :data:`RULE` holds the
fitted numbers; a test refits them from the committed runs files and compares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

FEATURES = ("sqrt_kl", "proxy_drop", "entropy_drop", "length_ratio", "gain_per_sqrt_kl", "length_rate")
SQRT_KL_FLOOR = 0.5  # √nats: gain_per_sqrt_kl's denominator at least this


@dataclass(frozen=True)
class Evaluation:
    """What the alarm reads at one evaluation: its PPO step, ``eval/kl``, ``eval/entropy``, ``eval/length``, and
    `proxy`, the mean ``objective/scores`` of the training steps since the previous evaluation (at the start: the
    first training step's; nan when unknown)."""

    step: int
    kl: float
    entropy: float
    length: float
    proxy: float = math.nan


@dataclass(frozen=True)
class Rule:
    """σ(bias + Σ_k weights[k] · (x_k − mean[k]) / scale[k]) over :data:`FEATURES`; raised at ≥ `threshold`."""

    mean: tuple[float, ...]
    scale: tuple[float, ...]
    weights: tuple[float, ...]
    bias: float
    threshold: float

    def __post_init__(self):
        for name in ("mean", "scale", "weights"):
            if len(getattr(self, name)) != len(FEATURES):
                raise ValueError(f"Rule.{name} has {len(getattr(self, name))} entries, not one per signal of "
                                 f"FEATURES ({len(FEATURES)}: {', '.join(FEATURES)})")

    def describe(self) -> str:
        terms = " ".join(f"{w:+.3g}·({k} − {m:.3g})/{s:.3g}"
                         for k, m, s, w in zip(FEATURES, self.mean, self.scale, self.weights))
        return f"σ({self.bias:.3g} {terms}) ≥ {self.threshold:.3g}"


def features(evals: Sequence[Evaluation]) -> dict[str, float] | None:
    """The signals of the last evaluation of `evals` (in step order, the first being the run's start), or None
    when there is no evaluation after the start."""
    if len(evals) < 2:
        return None
    start, before, now = evals[0], evals[-2], evals[-1]
    earlier = [e.proxy for e in evals[:-1] if not math.isnan(e.proxy)]
    drop = max(earlier) - now.proxy if earlier and not math.isnan(now.proxy) else 0.0
    sqrt_kl = math.sqrt(max(now.kl, 0.0))
    gain = now.proxy - start.proxy
    return {"sqrt_kl": sqrt_kl,
            "proxy_drop": drop,
            "entropy_drop": 1.0 - now.entropy / start.entropy if start.entropy > 0 else 0.0,
            "length_ratio": now.length / start.length if start.length > 0 else 1.0,
            "gain_per_sqrt_kl": gain / max(sqrt_kl, SQRT_KL_FLOOR) if not math.isnan(gain) else 0.0,
            "length_rate": (now.length - before.length) / start.length if start.length > 0 else 0.0}


def score(x: dict[str, float], rule: Rule) -> float:
    """The rule's score in (0, 1) for the signals `x` (:func:`features`)."""
    z = rule.bias + sum(w * (x[k] - m) / s for k, m, s, w in zip(FEATURES, rule.mean, rule.scale, rule.weights))
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def scores(evals: Sequence[Evaluation], rule: Rule) -> list[float]:
    """The score at each evaluation after the start (causal: each one reads only the evaluations up to it)."""
    return [score(features(evals[: j + 1]), rule) for j in range(1, len(evals))]


def first_alarm(evals: Sequence[Evaluation], rule: Rule, threshold: float | None = None) -> int | None:
    """The index in `evals` of the first evaluation whose score reaches the threshold (the rule's unless given),
    or None."""
    t = rule.threshold if threshold is None else threshold
    for j, s in enumerate(scores(evals, rule), start=1):
        if s >= t:
            return j
    return None


# Fitted on the runs of every study of the committed runs files started up to alarm_fit.FROZEN_AT_MS, rounded to
# 4 significant digits (rlhf_lab_research.studies.alarm_fit.fit_rules); reports/hacking_alarm/README.md scores each
# study with the rule fitted without it. tests/test_hacking_alarm_report.py refits it from those files and compares.
RULE = Rule(mean=(2.635, -0.2218, 0.2051, 1.267, 0.61, 0.02512),
            scale=(1.919, 0.349, 0.2379, 0.6287, 0.4821, 0.2788),
            weights=(1.131, 1.795, 0.4719, 0.0779, 0.4909, 0.6657), bias=-1.98, threshold=0.2041)
