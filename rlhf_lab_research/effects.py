"""How a claim's effect is computed from a study's runs: arms, paired comparisons over seeds, one-sample effects.

A study's runs are split into **arms** (:class:`Arm`: the runs with given config values, read with
:meth:`RunData.value`, i.e. the swept ``sweep.<key>`` params, else the logged config). A per-run quantity
(:mod:`~rlhf_lab.analysis.quantities`) is reduced to one value per **unit**, normally the seed (runs of one arm
with the same seed are averaged), and

* :func:`paired` compares two arms seed by seed: effect = mean over the seeds both arms ran of
  (a − b), ln(a/b) or 100·(a/b − 1), with the paired t interval (:func:`stats.paired_ci`);
* :func:`within` takes one arm's per-seed values (a change over training, a drop from the peak) and gives
  their t interval (:func:`stats.t_effect`);
* :func:`grouped` compares groups of settings inside one unit (e.g. the fixed β's in 0.01–0.1 against β = 0
  for each seed, or the small against the large RM for each policy size and seed).

Each returns a function of ``{study: [finished runs]}`` to a :class:`Measured`: the effect (or why there is
none), and the per-arm figures. Nothing here decides a verdict; see :mod:`~rlhf_lab_research.claims`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from rlhf_lab.analysis.markdown import fmt
from rlhf_lab.analysis.quantities import final_gold, final_gold_source
from rlhf_lab.analysis.study_runs import RunData
from rlhf_lab_research.stats import Effect, paired_ci, t_effect

NAN = float("nan")
Studies = Mapping[str, Sequence[RunData]]
Quantity = Callable[[RunData], float]

# config defaults (conf/), for runs that did not log a key (older runs, or a key outside their stage's params)
DEFAULTS: dict[str, Any] = {
    "reward_model.ensemble": 1, "reward_model.conservative_lambda": 0.0, "reward_model.normalize": True,
    "reward_model.lora.r": 0, "data.on_policy_fraction": 0.0, "algo.reference.path": None,
    "algo.reference.kind": "copy", "algo.reference.sync_every": 0, "algo.kl_in": "reward",
    "algo.kl_estimator": "k1", "algo.length_penalty": 0.0, "algo.clip_eps": 0.2, "algo.critic": "policy",
}
# what a quantity that came out NaN needed
NEEDS = {
    "gold drop from peak (split-half)": "eval/gold_reward_a and eval/gold_reward_b at ≥ 3 evaluations (the gold "
                                        "reward on two halves of the eval prompts); without them no unbiased drop",
}


def same(value: Any, target: Any) -> bool:
    """A logged config value (a string) equals a target: numbers as numbers, booleans and words case-blind,
    None / "null" / "" as None."""
    if target is None:
        return value is None or str(value).strip().lower() in ("", "none", "null")
    if value is None:
        return False
    v = str(value).strip()
    try:
        return float(v) == float(target)
    except (TypeError, ValueError):
        return v.lower() == str(target).lower()


def config(r: RunData, key: str) -> Any:
    return r.value(key, DEFAULTS.get(key))


def config_num(r: RunData, key: str) -> float:
    try:
        return float(config(r, key))
    except (TypeError, ValueError):
        return NAN


@dataclass(frozen=True)
class Arm:
    """The runs of one stage ("" = any stage) whose config matches `where`, not `unless`, and exceeds `above`
    (numbers); with `extreme` = (key, "max" | "min"), only those at that key's largest / smallest value among the
    matching runs, named in the label; when the matching runs have one value of the key only, the label says so and
    names the values the study's runs have ("the only α > 0 that ran, 0.1 (algo.length_penalty ran: 0, 0.1)"), so
    that a "largest" and a "smallest" arm that are the same runs do not read as two settings. `symbol`: the key's
    name in labels (α), else the key."""

    label: str
    where: Mapping[str, Any] = field(default_factory=dict)
    stage: str = "ppo"
    extreme: tuple[str, str] | None = None
    unless: Mapping[str, Any] = field(default_factory=dict)
    above: Mapping[str, float] = field(default_factory=dict)
    symbol: str = ""

    def matches(self, r: RunData, bounds: bool = True) -> bool:
        return ((not self.stage or r.stage == self.stage)
                and all(same(config(r, k), v) for k, v in self.where.items())
                and not any(same(config(r, k), v) for k, v in self.unless.items())
                and (not bounds or all(config_num(r, k) > v for k, v in self.above.items())))

    def select(self, runs: Sequence[RunData]) -> tuple[list[RunData], str]:
        rs = [r for r in runs if self.matches(r)]
        if not self.extreme or not rs:
            return rs, self.label
        key, how = self.extreme
        values = sorted({v for v in (config_num(r, key) for r in rs) if math.isfinite(v)})
        if not values:
            return [], self.label
        x = values[-1] if how == "max" else values[0]
        chosen = [r for r in rs if config_num(r, key) == x]
        if len(values) > 1:
            return chosen, f"{self.label} ({key} = {x:g})"
        ran = sorted({v for v in (config_num(r, key) for r in runs if self.matches(r, bounds=False))
                      if math.isfinite(v)})
        name = self.symbol or key
        bound = f" > {self.above[key]:g}" if key in self.above else ""
        return chosen, f"the only {name}{bound} that ran, {x:g} ({key} ran: {', '.join(f'{v:g}' for v in ran)})"


@dataclass
class Measured:
    """An effect estimate with the figures behind it; `effect` None (or NaN bounds) with `missing` saying why."""

    effect: Effect | None
    detail: str = ""
    missing: str = ""
    runs: tuple[RunData, ...] = ()
    gold_sources: frozenset[str] = frozenset()
    n_of: str = "seeds"  # what the effect's n counts
    arms: tuple[str, ...] = ()  # the labels of the arms compared, as the runs gave them (Arm.select)
    arm_names: tuple[str, ...] = ()  # the same arms' names in the registry (Arm.label)


def seed_of(r: RunData) -> str:
    return r.seed


def n_of(unit: Callable[[RunData], Any]) -> str:
    """What one unit is, for the report: a function's `n_of` attribute, else seeds."""
    return getattr(unit, "n_of", "seeds")


def unit_values(runs: Sequence[RunData], q: Quantity, unit: Callable[[RunData], Any] = seed_of) -> dict[Any, float]:
    """{unit: mean of q over the unit's runs} (NaN values skipped; NaN when none is finite)."""
    acc: dict[Any, list[float]] = {}
    for r in runs:
        acc.setdefault(unit(r), []).append(q(r))
    out = {}
    for k, vs in acc.items():
        good = [v for v in vs if math.isfinite(v)]
        out[k] = float(np.mean(good)) if good else NAN
    return out


def count(n: int, noun: str) -> str:
    """'3 seeds', '1 seed', '1 RM seed', '2 policy × seed cells'."""
    return f"{n} {noun[:-1] if n == 1 and noun.endswith('s') else noun}"


def summary(values: Mapping[Any, float], noun: str = "seeds", digits: int = 3) -> str:
    v = [x for x in values.values() if math.isfinite(x)]
    if not v:
        return "no value"
    if len(v) == 1:
        return f"{fmt(v[0], digits)} ({count(1, noun)})"
    return f"{fmt(float(np.mean(v)), digits)} ± {fmt(float(np.std(v, ddof=1)), digits)} ({count(len(v), noun)})"


def _name(q: Quantity) -> str:
    return getattr(q, "__name__", "the quantity")


def why_nan(q: Quantity, runs: Sequence[RunData]) -> str:
    name = _name(q)
    return f"no run has a {name}" + (f": it needs {NEEDS[name]}" if name in NEEDS else "")


def sources(q: Quantity, runs: Sequence[RunData]) -> frozenset[str]:
    return frozenset(final_gold_source(r) for r in runs) if q is final_gold else frozenset()


def _missing_arm(study: str, arms: Sequence[tuple[list[RunData], str]], studies: Studies) -> str:
    if not studies.get(study):
        return f"no finished runs of {study}"
    empty = [label for rs, label in arms if not rs]
    return f"no finished run of {' or '.join(empty)} in {study}" if empty else ""


def _transform(va: dict, vb: dict, scale: str) -> Effect:
    if scale == "diff":
        return paired_ci(va, vb)
    keys = [k for k in va if k in vb and va[k] > 0 and vb[k] > 0]
    if scale == "log ratio":
        return t_effect([math.log(va[k] / vb[k]) for k in keys], method="paired t")
    if scale == "percent":
        return t_effect([100.0 * (va[k] / vb[k] - 1.0) for k in keys], method="paired t")
    raise ValueError(f"unknown scale {scale!r}")


def _measured(eff: Effect, detail: str, q: Quantity, runs: Sequence[RunData], unit: Callable,
              arms: tuple[str, ...] = (), names: tuple[str, ...] = ()) -> Measured:
    if eff.n == 0:
        return Measured(None, detail, why_nan(q, runs), tuple(runs), sources(q, runs), n_of(unit), arms, names)
    return Measured(eff, detail, "", tuple(runs), sources(q, runs), n_of(unit), arms, names)


def paired(study: str, a: Arm, b: Arm, q: Quantity, scale: str = "diff",
           unit: Callable[[RunData], Any] = seed_of) -> Callable[[Studies], Measured]:
    """Arm a against arm b, unit by unit (seed by seed): a − b, ln(a/b) or 100·(a/b − 1) of q."""
    def compute(studies: Studies) -> Measured:
        runs = studies.get(study, [])
        ra, la = a.select(runs)
        rb, lb = b.select(runs)
        missing = _missing_arm(study, [(ra, la), (rb, lb)], studies)
        if missing:
            return Measured(None, missing=missing, arms=(la, lb), arm_names=(a.label, b.label))
        va, vb = unit_values(ra, q, unit), unit_values(rb, q, unit)
        detail = f"{la}: {summary(va, n_of(unit))}; {lb}: {summary(vb, n_of(unit))}"
        m = _measured(_transform(va, vb, scale), detail, q, ra + rb, unit, (la, lb), (a.label, b.label))
        if m.effect is None and any(map(math.isfinite, va.values())) and any(map(math.isfinite, vb.values())):
            m.missing = f"no unit ({n_of(unit)}) has a value of {_name(q)} in both {la} and {lb}"
        return m
    return compute


def within(study: str, a: Arm, q: Quantity, unit: Callable[[RunData], Any] = seed_of) -> Callable[[Studies], Measured]:
    """One arm's per-unit values of q (a change, a drop, a ratio inside each run) and their t interval."""
    def compute(studies: Studies) -> Measured:
        ra, la = a.select(studies.get(study, []))
        if not ra:
            return Measured(None, missing=_missing_arm(study, [(ra, la)], studies), arms=(la,), arm_names=(a.label,))
        va = unit_values(ra, q, unit)
        return _measured(t_effect(list(va.values()), method="t"), f"{la}: {summary(va, n_of(unit))}", q, ra, unit,
                         (la,), (a.label,))
    return compute


def grouped(study: str, a: Arm, key: Callable[[RunData], float], in_a: Callable[[float, list[float]], bool],
            in_b: Callable[[float, list[float]], bool] | None, q: Quantity, labels: tuple[str, str],
            reduce_a: str = "mean", reduce_b: str = "mean",
            unit: Callable[[RunData], Any] = seed_of) -> Callable[[Studies], Measured]:
    """Inside each unit: reduce q over the settings (values of `key`) in group a, likewise for group b, and
    take a − b (b None: a alone). in_a / in_b get a setting's value and all the unit's values. Units without
    both groups are left out."""
    red = {"mean": np.mean, "max": np.max, "min": np.min}

    def compute(studies: Studies) -> Measured:
        ra, la = a.select(studies.get(study, []))
        if not ra:
            return Measured(None, missing=_missing_arm(study, [(ra, la)], studies))
        per_unit: dict[Any, dict[float, list[float]]] = {}
        for r in ra:
            k = key(r)
            if math.isfinite(k):
                per_unit.setdefault(unit(r), {}).setdefault(k, []).append(q(r))
        diffs, ga, gb = [], [], []
        for cells in per_unit.values():
            vals = {k: float(np.mean([x for x in v if math.isfinite(x)])) if any(map(math.isfinite, v)) else NAN
                    for k, v in cells.items()}
            keys = sorted(vals)
            xa = [vals[k] for k in keys if in_a(k, keys) and math.isfinite(vals[k])]
            xb = [vals[k] for k in keys if in_b(k, keys) and math.isfinite(vals[k])] if in_b else [0.0]
            if xa and xb:
                ya, yb = float(red[reduce_a](xa)), float(red[reduce_b](xb))
                diffs.append(ya - yb)
                ga.append(ya)
                gb.append(yb)
        detail = f"{labels[0]}: {summary(dict(enumerate(ga)), n_of(unit))}"
        if in_b is not None:
            detail += f"; {labels[1]}: {summary(dict(enumerate(gb)), n_of(unit))}"
        if not diffs and per_unit and in_b is not None:
            why = f"no unit ({n_of(unit)}) has both {labels[0]} and {labels[1]} with a value of {_name(q)}"
            if not any(math.isfinite(q(r)) for r in ra):
                why = why_nan(q, ra)
            return Measured(None, detail, why, tuple(ra), sources(q, ra), n_of(unit))
        return _measured(t_effect(diffs, method="t" if in_b is None else "paired t"), detail, q, ra, unit)
    return compute


def grouped_at_matched_kl(study: str, a: Arm, key: Callable[[RunData], float],
                          in_a: Callable[[float, list[float]], bool], in_b: Callable[[float, list[float]], bool],
                          q_at: Callable[[float], Quantity], labels: tuple[str, str], side: str = "diff",
                          unit: Callable[[RunData], Any] = seed_of) -> Callable[[Studies], Measured]:
    """As :func:`grouped`, at a KL matched inside each unit: the lowest final ``eval/kl`` among the unit's runs of
    groups a and b, which every one of them reached (chosen from KL alone, never from the gold reward); the
    quantity is ``q_at(that KL)``. `side`: "diff" (a − b per unit) or "a" (group a's value per unit)."""
    def compute(studies: Studies) -> Measured:
        ra, _ = a.select(studies.get(study, []))
        if not ra:
            return Measured(None, missing=_missing_arm(study, [(ra, a.label)], studies))
        per_unit: dict[Any, dict[float, list[RunData]]] = {}
        for r in ra:
            if math.isfinite(key(r)):
                per_unit.setdefault(unit(r), {}).setdefault(key(r), []).append(r)
        values, ga, gb, kls = [], [], [], []
        for cells in per_unit.values():
            keys = sorted(cells)
            in_ga = [r for k in keys if in_a(k, keys) for r in cells[k]]
            in_gb = [r for k in keys if in_b(k, keys) for r in cells[k]]
            finals = [r.last("eval/kl") for r in in_ga + in_gb]
            if not in_ga or not in_gb or not all(map(math.isfinite, finals)):
                continue
            q = q_at(min(finals))
            xa, xb = ([v for v in map(q, g) if math.isfinite(v)] for g in (in_ga, in_gb))
            if xa and xb:
                ga.append(float(np.mean(xa)))
                gb.append(float(np.mean(xb)))
                kls.append(min(finals))
                values.append(ga[-1] - gb[-1] if side == "diff" else ga[-1])
        q0 = q_at(NAN)
        if not values:
            return Measured(None, missing=f"no unit ({n_of(unit)}) has {labels[0]} and {labels[1]} with a value of "
                                          f"{_name(q0)}", runs=tuple(ra), n_of=n_of(unit))
        detail = (f"KL matched per {n_of(unit)[:-1]}: {fmt(min(kls), 1)}–{fmt(max(kls), 1)} nats; "
                  f"{labels[0]}: {summary(dict(enumerate(ga)), n_of(unit))}")
        if side == "diff":
            detail += f"; {labels[1]}: {summary(dict(enumerate(gb)), n_of(unit))}"
        return _measured(t_effect(values, method="paired t" if side == "diff" else "t"), detail, q0, ra, unit)
    return compute


def log_ratio(q1: Quantity, q2: Quantity, name: str) -> Quantity:
    """ln(q1 / q2) of one run (NaN unless both are > 0)."""
    def q(r: RunData) -> float:
        x, y = q1(r), q2(r)
        return math.log(x / y) if x > 0 and y > 0 else NAN
    q.__name__ = name
    return q


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's ρ over the finite pairs; NaN with fewer than 3 or without spread."""
    from scipy.stats import spearmanr

    xa, ya = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(xa) & np.isfinite(ya)
    if ok.sum() < 3 or np.ptp(xa[ok]) == 0 or np.ptp(ya[ok]) == 0:
        return NAN
    return float(spearmanr(xa[ok], ya[ok]).correlation)


def config_value(study: str, arm: Arm, key: str) -> Callable[[Studies], Measured]:
    """A config value of an arm's runs as an exact 'effect' (lo = min, hi = max over the runs)."""
    def compute(studies: Studies) -> Measured:
        rs, label = arm.select(studies.get(study, []))
        vals = [config_num(r, key) for r in rs]
        vals = [v for v in vals if math.isfinite(v)]
        if not vals:
            return Measured(None, missing=f"no {label} run logged {key}")
        eff = Effect(sum(vals) / len(vals), min(vals), max(vals), len(vals), "config value")
        return Measured(eff, f"{key} = {', '.join(sorted({f'{v:g}' for v in vals}))}", "", tuple(rs), n_of="runs")
    return compute
