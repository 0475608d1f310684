"""The objective of a tuning trial (``hydra/sweeper=optuna``, :mod:`rlhf_lab.entry.tune`): one number per policy run,
read from the metrics it logged at its evaluations. ``tune.objective`` chooses it (:class:`Objective`):

- ``ship`` (the default, what a user without a gold tunes on): the gold-free value of the checkpoint the ship rule
  ``tune.rule`` ships (:mod:`rlhf_lab.evaluation.ship`, with ``tune.params``). The value is the held-out RM's score
  there (``eval/heldout_reward``, ``reward_model.heldout=true``) when the run logged it: an RM trained on pairs the
  proxy never saw, whose errors are not the ones the policy was trained to exploit, and which the default rule does
  not read (the rule chooses on the proxy and KL, the value is measured with another RM: the choice of the
  checkpoint and its value do not share the proxy's errors). Without it, the value is the rule's proxy there minus
  ``tune.kl_cost`` · √KL: the proxy gained is discounted by the KL spent on it, the proxy growing about linearly in
  √KL while the gold peaks and falls (Gao et al. 2022); with the default rule (``proxy_minus_sqrt_kl`` with
  ``cost: ${tune.kl_cost}``) it is the largest value of the rule's own criterion. Neither sees the bias every RM
  trained on the same labeler shares (length, filler): ``docs/without-gold.md``.
- ``proxy``: the raw proxy, ``eval/proxy_reward`` at the last evaluation: what the job's summary prints and what a
  naive tuning maximises. The proxy is the target the policy was optimised against, so the tuning that maximises it
  chooses the settings that exploit the proxy's errors most (little KL penalty, many steps, a high learning rate):
  Goodhart's law, measured by the study ``tune_goodhart_*`` (sweeps/README.md).
- ``gold``: ``eval/gold_reward`` (eval prompts, never test prompts) at the checkpoint the ship rule ships: the same
  decision valued by the gold itself, the lab's reference for that comparison; a run without a gold has none.

The proxy the rules read is the one they were fitted with (``reports/ship/rules.json``): the mean training-batch
score ``objective/scores`` since the previous evaluation (:func:`interval_means`); a run that logged none (DPO) reads
``eval/proxy_reward``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Mapping, Sequence

import numpy as np

from rlhf_lab.evaluation import ship as S

History = Sequence[tuple[int, float]]  # (step, value) as MLflow keeps a metric's history


class Objective(StrEnum):
    ship = "ship"  # the gold-free value of the checkpoint the ship rule ships
    proxy = "proxy"  # the raw proxy at the last evaluation (Goodhart's target)
    gold = "gold"  # the eval gold at the checkpoint the ship rule ships (the lab's reference; needs a gold)


TRAIN_PROXY = "objective/scores"
SIGNALS = {"kl": "eval/kl", "proxy_ensemble_std": "eval/proxy_ensemble_std", "heldout_reward": "eval/heldout_reward",
           "entropy": "eval/entropy", "length": "eval/length"}  # the Curve's optional fields: the rules' signals
EVAL_PROXY, GOLD = "eval/proxy_reward", "eval/gold_reward"
KEYS = (TRAIN_PROXY, EVAL_PROXY, GOLD, *SIGNALS.values())  # the histories a trial's objective reads


@dataclass(frozen=True)
class TrialValue:
    value: float
    step: int  # the step of the checkpoint valued (the shipped one; the last for ``proxy``)
    measure: str  # what the value is, in words, for the trial's line


def interval_means(history: History, steps: Sequence[int]) -> list[float]:
    """p_i per evaluation step t_i: at i = 0 the first value logged after t_0 (the start policy's batch), else the
    mean of the values logged at steps s with t_{i−1} < s ≤ t_i (nan if none). The one definition: the hacking alarm's
    study and the ship rules' design read the training proxy through it too (``alarm_fit.interval_means``), with
    numpy's sums, which the frozen rules were fitted with."""
    s = np.asarray([p[0] for p in history], dtype=float)
    v = np.asarray([p[1] for p in history], dtype=float)
    after = np.flatnonzero(s > steps[0]) if len(s) else np.zeros(0, dtype=int)
    out = [float(v[after[np.argmin(s[after])]]) if len(after) else math.nan]
    for lo, hi in zip(steps[:-1], steps[1:]):
        sel = (s > lo) & (s <= hi)
        out.append(float(v[sel].mean()) if sel.any() else math.nan)
    return out


def run_curve(histories: Mapping[str, History]) -> S.Curve:
    """The :class:`~rlhf_lab.evaluation.ship.Curve` of a run from its metric histories (:data:`KEYS`): the steps at
    which it logged ``eval/kl`` and ``eval/proxy_reward``; a signal logged at only some of them is left out."""
    kl, proxy = dict(histories.get("eval/kl") or ()), dict(histories.get(EVAL_PROXY) or ())
    steps = sorted(set(kl) & set(proxy))
    if not steps:
        raise ValueError("the run logged no evaluation with eval/kl and eval/proxy_reward: nothing to tune on")
    train = histories.get(TRAIN_PROXY)
    p = interval_means(train, steps) if train else [proxy[t] for t in steps]
    optional = {}
    for field, key in SIGNALS.items():
        series = dict(histories.get(key) or ())
        if field != "kl" and all(t in series for t in steps):
            optional[field] = tuple(series[t] for t in steps)
    return S.Curve(tuple(steps), tuple(p), tuple(kl[t] for t in steps), **optional)


def trial_value(histories: Mapping[str, History], objective: str, rule: str, params: Mapping | None,
                kl_cost: float) -> TrialValue:
    """A run's objective (the module's docstring) from its metric histories."""
    objective = Objective(objective)
    if objective is Objective.proxy:
        step, value = max(histories.get(EVAL_PROXY) or [(0, math.nan)])
        return TrialValue(value, step, "the proxy eval/proxy_reward at the last evaluation")
    curve = run_curve(histories)
    i = S.ship(curve, rule, dict(params or {}))
    if i is None:
        raise ValueError(f"tune.rule={rule} reads a signal the run did not log (reward_model.heldout=true logs "
                         "eval/heldout_reward, reward_model.ensemble>=2 eval/proxy_ensemble_std): choose another rule")
    step = curve.steps[i]
    if objective is Objective.gold:
        gold = dict(histories.get(GOLD) or ())
        if step not in gold:
            raise ValueError(f"tune.objective=gold: the run logged no {GOLD} at step {step} (data without a gold has "
                             "none): use tune.objective=ship")
        return TrialValue(gold[step], step, f"the eval gold at the checkpoint {rule} ships")
    if curve.heldout_reward is not None:
        return TrialValue(curve.heldout_reward[i], step, f"the held-out RM at the checkpoint {rule} ships")
    return TrialValue(curve.proxy[i] - kl_cost * math.sqrt(max(curve.kl[i], 0.0)), step,
                      f"proxy - {kl_cost:g}*sqrt(KL) at the checkpoint {rule} ships")
