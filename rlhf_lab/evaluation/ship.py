"""Which checkpoint to ship: ship rules, each a small function from a run's gold-free evaluation series to the index of
the checkpoint it ships, and the gold regret that judges them (issue 67).

A run is a :class:`Curve`: at each evaluation i (i = 0 is the start, the SFT policy, before any update) its step and
the signals a user has without a gold: the proxy reward, the KL to the reference, and where the run logged them the
disagreement of an RM ensemble and the score of a held-out RM (one trained on preference pairs the proxy never saw),
the entropy and length the hacking alarm reads. A rule returns the index of the checkpoint to ship, or None where the
run lacks the signal it reads. Each rule reads the whole series; the ones that stop a run (:func:`kl_budget`,
:func:`proxy_plateau`, :func:`heldout_patience`, :func:`alarm`) only read evaluations up to where they stop, so they
can run live. The rules:

- :func:`last_checkpoint`: train to the end and ship it.
- :func:`clock`: the last checkpoint within a fixed fraction of training.
- :func:`kl_budget`: stop when KL(π‖π_ref) first exceeds a budget (nats); ship the checkpoint before.
- :func:`proxy_max`: the checkpoint the proxy RM scores best.
- :func:`proxy_plateau`: early stopping on the proxy (stop after `patience` evaluations that do not beat its best by
  more than `min_delta`; ship that best), as Keras' ``EarlyStopping(restore_best_weights=True)``.
- :func:`proxy_minus_sqrt_kl`: the checkpoint maximising proxy − c·√KL: the proxy gained is worth shipping only
  while it is bought at more than c per √nat of KL (the proxy grows about linearly in √KL, Gao et al. 2022).
- :func:`ensemble_lcb`: the checkpoint maximising the ensemble's mean − k·its disagreement (the members' std): the
  uncertainty-penalised objective of Coste et al. (2023) and Eisenstein et al. (2023), used to choose a checkpoint.
- :func:`heldout_max`: the checkpoint a held-out RM scores best, what a careful practitioner does (Gleave & Irving).
- :func:`heldout_patience`: early stopping on the held-out RM (stop after `patience` evaluations below its best).
- :func:`alarm`: today's hacking alarm (:mod:`rlhf_lab.evaluation.alarm`): stop at its first alarm, ship the
  checkpoint before it.

:data:`SHIP_RULES` names them; their parameters are fitted on the design runs (``reports/ship/design.md``) and frozen
in ``reports/ship/rules.json``. The judge, which needs a gold: :func:`gold_regret` and :func:`selection_regret`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from rlhf_lab.evaluation import alarm as hacking_alarm

Series = tuple[float, ...]


@dataclass(frozen=True)
class Curve:
    """A run's evaluations, in step order, the first being its start: `steps`, `proxy` (the proxy RM's mean reward),
    `kl` (KL(π‖π_ref) per response, nats), and the optional signals (None: not logged), each one value per step."""

    steps: tuple[int, ...]
    proxy: Series
    kl: Series
    proxy_ensemble_std: Series | None = None
    heldout_reward: Series | None = None
    entropy: Series | None = None
    length: Series | None = None

    def __post_init__(self):
        for name in ("proxy", "kl", "proxy_ensemble_std", "heldout_reward", "entropy", "length"):
            values = getattr(self, name)
            if values is not None and len(values) != len(self.steps):
                raise ValueError(f"Curve.{name} has {len(values)} values for {len(self.steps)} steps")
        if not self.steps:
            raise ValueError("Curve has no evaluation")


def first_argmax(values: Sequence[float]) -> int | None:
    """The index of the largest finite value (the first on a tie), None when none is finite."""
    best = None
    for i, v in enumerate(values):
        if math.isfinite(v) and (best is None or v > values[best]):
            best = i
    return best


def early_stop(values: Sequence[float], patience: int, min_delta: float = 0.0) -> int | None:
    """Early stopping on `values`: the index of the best value seen when `patience` evaluations in a row have not
    beaten it by more than `min_delta` (or at the end); nan values never improve. None when none is finite."""
    best, waited = None, 0
    for i, v in enumerate(values):
        if math.isfinite(v) and (best is None or v > values[best] + min_delta):
            best, waited = i, 0
        elif best is not None:
            waited += 1
            if waited >= patience:
                break
    return best


# -- the rules ------------------------------------------------------------------------------------------------------

def last_checkpoint(c: Curve) -> int:
    return len(c.steps) - 1


def clock(c: Curve, fraction: float) -> int:
    """The last checkpoint at or before `fraction` of training (of the steps from the start to the last evaluation)."""
    stop = c.steps[0] + fraction * (c.steps[-1] - c.steps[0])
    return max(i for i, t in enumerate(c.steps) if t <= stop + 1e-9)


def kl_budget(c: Curve, budget: float) -> int:
    """Stop at the first evaluation whose KL exceeds `budget` (nats) and ship the one before (never: the last)."""
    over = next((i for i, kl in enumerate(c.kl) if kl > budget), None)
    return len(c.steps) - 1 if over is None else max(over - 1, 0)


def proxy_max(c: Curve) -> int | None:
    return first_argmax(c.proxy)


def proxy_plateau(c: Curve, patience: int, min_delta: float) -> int | None:
    return early_stop(c.proxy, patience, min_delta)


def proxy_minus_sqrt_kl(c: Curve, cost: float) -> int | None:
    """argmax_i proxy_i − cost · √KL_i."""
    return first_argmax([p - cost * math.sqrt(max(kl, 0.0)) for p, kl in zip(c.proxy, c.kl)])


def ensemble_lcb(c: Curve, k: float) -> int | None:
    """argmax_i proxy_i − k · proxy_ensemble_std_i (`proxy` being the ensemble's mean); None without an ensemble."""
    if c.proxy_ensemble_std is None:
        return None
    return first_argmax([p - k * s for p, s in zip(c.proxy, c.proxy_ensemble_std)])


def heldout_max(c: Curve) -> int | None:
    return None if c.heldout_reward is None else first_argmax(c.heldout_reward)


def heldout_patience(c: Curve, patience: int) -> int | None:
    return None if c.heldout_reward is None else early_stop(c.heldout_reward, patience)


def alarm(c: Curve, threshold: float | None = None, rule: hacking_alarm.Rule = hacking_alarm.RULE) -> int | None:
    """Today's hacking alarm (its rule, at `threshold`, else the rule's own): stop at its first alarm j, ship
    checkpoint j − 1 (never raised: the last). Reads the proxy (as the alarm's: the training batches' mean score since
    the previous evaluation), KL, entropy and length; None without entropy and length."""
    if c.entropy is None or c.length is None:
        return None
    evals = [hacking_alarm.Evaluation(t, kl, h, n, p)
             for t, kl, h, n, p in zip(c.steps, c.kl, c.entropy, c.length, c.proxy)]
    j = hacking_alarm.first_alarm(evals, rule, threshold)
    return len(c.steps) - 1 if j is None else j - 1


SHIP_RULES: dict[str, Callable[..., int | None]] = {
    f.__name__: f for f in (last_checkpoint, clock, kl_budget, proxy_max, proxy_plateau, proxy_minus_sqrt_kl,
                            ensemble_lcb, heldout_max, heldout_patience, alarm)}


def ship(c: Curve, rule: str, params: dict | None = None) -> int | None:
    """The index the rule named `rule` (:data:`SHIP_RULES`) ships with its parameters `params`."""
    if rule not in SHIP_RULES:
        raise ValueError(f"unknown ship rule {rule!r}: choose one of {', '.join(SHIP_RULES)}")
    return SHIP_RULES[rule](c, **(params or {}))


# -- the judge (needs a gold) ---------------------------------------------------------------------------------------

def gold_regret(best_gold: float, shipped_gold: float) -> float:
    """The gold lost by shipping: the best checkpoint's gold − the shipped one's (≥ 0 when both are exact)."""
    return best_gold - shipped_gold


def selection_regret(gold_select: Sequence[float], gold_measure: Sequence[float], shipped: int) -> float:
    """The regret of shipping checkpoint `shipped`, the best checkpoint chosen by its gold on a selection set of
    prompts and both measured on another (so the choice of the best and the gold lost do not share noise; may be
    negative by that noise)."""
    best = first_argmax(gold_select)
    if best is None:
        raise ValueError("selection_regret: no finite gold on the selection set")
    return gold_regret(gold_measure[best], gold_measure[shipped])
