"""Which effects of the claims report are judged with an anytime-valid interval, and which one (issues 42 and 69).

**The rule (issue 69): every judged effect and precondition with per-unit values is judged with an anytime-valid
confidence sequence from its first look.** ``rlhf-lab-suite --decide`` (and ``--more-seeds``) may extend any study of
the report after its intervals were seen; a fixed-n t test at the first look followed by a sequence at the later ones
(the rule of issue 42, :data:`EARLIER`) runs above its level (one-sided 2.9 % against 2.5 %; this rule 0.75 %: tests/test_claims_anytime.py),
since the first look spends α once and the sequence spends it again. Which sequence:

* values with hard bounds fixed by their definition (:data:`rlhf_lab_research.claims_registry.UNIT_BOUNDS`: a
  difference of fractions, accuracies or |ρ|): the betting sequence of :mod:`rlhf_lab_research.betting`, valid for
  any law on those bounds;
* the others (gold, whose formula bounds it only loosely, [−15.6, 1] at 48 tokens, ten times its spread; RM scores,
  KL, log ratios, tokens, %): the t-mixture sequence of :func:`rlhf_lab_research.sequential.anytime_t`, which
  assumes symmetric values, **refused** when the values are visibly skewed (adjusted sample skewness
  |G1| above :func:`skew_limit`, which 5 % of normal samples of that n exceed): the effect is then inconclusive and
  says why. The check does not make the t sequence
  valid for skewed laws: at 5 to 30 values the samples that miscover are the ones whose tail has not shown yet,
  which no check on them can see (tests/test_claims_anytime.py measures exponential values: 11.5 % miscoverage
  unchecked, 9.5 % checked); it keeps the report from stating an interval its own values contradict.

:data:`EARLIER` keeps issue 42's rule, for the report's "earlier result" beside each changed one: a fixed-n t
interval unless the effect reads a seed its study file does not sweep (added after looking, :func:`added_run_ids`).
The runs an effect read decide, not the units its pairing kept.
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist
from typing import Iterable, Mapping, Sequence

import numpy as np

from scipy import stats as st

from rlhf_lab_research.betting import betting_cs
from rlhf_lab_research.effects import Measured
from rlhf_lab_research.provenance import file_seeds, seeds_present
from rlhf_lab.analysis.study_runs import STUDY_TAG, RunData
from rlhf_lab_research.sequential import anytime_t, t_mixture_c, t_mixture_multiplier
from rlhf_lab_research.stats import Effect

ANYTIME = "anytime"    # the start of an anytime-valid interval's Effect.method ("anytime t", "anytime paired t")
BETTING = "betting"    # ... of a betting sequence's ("anytime betting paired t")
REFUSED = "refused"    # ... of a t sequence refused on skewed values ("anytime refused (skewed, G1 = 2.1) t")
LEVEL = 0.95           # the sequence shown (two-sided); its p is used as is at the verdicts' one-sided level
SKEW_LEVEL = 0.05      # the share of normal samples the skew check refuses, at every n (skew_limit)
FIRST_LOOK, EARLIER = "first look", "added seeds"  # the rule of issue 69, and issue 42's (the "earlier" results)
MARK, BET_MARK = "†", "‡"
FOOTNOTE = (f"{MARK} anytime-valid t-mixture sequence from the first look (Wang & Ramdas 2023); {BET_MARK} anytime-valid "
            "betting sequence on bounded values (Waudby-Smith & Ramdas 2023)")
EARLIER_FOOTNOTE = f"{MARK} seeds added after looking: anytime-valid interval (Wang & Ramdas 2023)"


def added_seeds(study: str, runs: Sequence[RunData]) -> list[int]:
    """The seeds of a study's runs that its study file does not sweep ([] when the file is not found)."""
    own = file_seeds(study)
    return [] if own is None else [s for s in seeds_present(runs) if s not in own]


def by_study_tag(studies: Mapping[str, Sequence[RunData]]) -> dict[str, list[RunData]]:
    """The runs regrouped by the study that ran them (their ``rlhf_lab.study`` tag: a claim's study may be read
    from a rerun of its design under another study file, ``designs.SUITE_VERSIONS``); untagged runs left out."""
    out: dict[str, list[RunData]] = {}
    for r in {r.run_id: r for runs in studies.values() for r in runs}.values():
        if r.tags.get(STUDY_TAG):
            out.setdefault(r.tags[STUDY_TAG], []).append(r)
    return out


def added_run_ids(studies: Mapping[str, Sequence[RunData]]) -> frozenset[str]:
    """The run ids of the runs of seeds added after looking (:func:`added_seeds`, per study tag): an effect with one
    of them among its units has an n chosen after its study's results were seen."""
    out = set()
    for s, runs in by_study_tag(studies).items():
        added = set(added_seeds(s, runs))
        out.update(r.run_id for r in runs if str(r.seed).lstrip("-").isdigit() and int(r.seed) in added)
    return frozenset(out)


def includes_added(runs: Iterable[RunData], run_ids: Iterable[str]) -> bool:
    """Whether one of `runs` is a seed added after looking (its run id among `run_ids`, from :func:`added_run_ids`):
    the rule by which an effect over those runs takes the anytime-valid interval."""
    ids = set(run_ids)
    return any(r.run_id in ids for r in runs)


def from_extended(m: Measured, run_ids: Iterable[str]) -> bool:
    """Whether an effect's units include a seed added after looking (:func:`includes_added`) and it has the values
    to recompute its interval from (a t interval; an exact config value has none)."""
    e = m.effect
    return e is not None and not is_anytime(e) and len(e.values) == e.n > 0 and includes_added(m.runs, run_ids)


def judged_anytime(m: Measured, run_ids: Iterable[str], rule: str = FIRST_LOOK) -> bool:
    """Whether an effect is judged with a sequence: under :data:`FIRST_LOOK`, every effect with per-unit values;
    under :data:`EARLIER`, those whose units include a seed added after looking (:func:`from_extended`)."""
    e = m.effect
    if rule == EARLIER:
        return from_extended(m, run_ids)
    if rule != FIRST_LOOK:
        raise ValueError(f"rule must be {FIRST_LOOK!r} or {EARLIER!r}, got {rule!r}")
    return e is not None and not is_anytime(e) and len(e.values) == e.n > 0


def skewness(values: Sequence[float]) -> float:
    """The adjusted sample skewness G1 (scipy's skew, bias=False); 0 below 3 values or with no spread."""
    x = np.asarray(values, dtype=float)
    if x.size < 3 or not np.ptp(x) > 0:
        return 0.0
    return float(st.skew(x, bias=False))


@lru_cache(maxsize=None)
def skew_limit(n: int, level: float = SKEW_LEVEL) -> float:
    """The |G1| that a share `level` of samples of n normal values exceed (20,000 simulated samples, seed 0; inf
    below 3 values): 1.79 at n = 5, 1.36 at 10, 0.85 at 30."""
    if n < 3:
        return math.inf
    x = np.random.default_rng(0).standard_normal((20_000, n))
    return float(np.quantile(np.abs(st.skew(x, axis=1, bias=False)), 1 - level))


def anytime_needs(delta: float, sd: float, alpha: float, power: float, n_max: int = 10_000) -> int | None:
    """The units at which the anytime sequence would exclude the null with about `power`, for a true effect `delta`
    and spread `sd`: the smallest n with (k_n + z_power)·sd/√n ≤ |delta|, k_n the (1 − alpha) sequence's
    multiplier (:func:`t_mixture_multiplier`; its two-sided p is used as is at the one-sided `alpha`), the spread
    taken as known. None without a spread or a size, or beyond n_max."""
    if not (delta and sd == sd and sd > 0 and math.isfinite(delta)):
        return None
    z, c = float(NormalDist().inv_cdf(power)), t_mixture_c()
    n = np.arange(2, n_max + 1)
    ok = (t_mixture_multiplier(n, c, alpha) + z) * sd / np.sqrt(n) <= abs(delta)
    return int(n[ok][0]) if ok.any() else None


def is_anytime(e: Effect | None) -> bool:
    """Whether `e` is an anytime-valid interval (:func:`anytime_effect`)."""
    return e is not None and e.method.startswith(ANYTIME)


def is_refused(e: Effect | None) -> bool:
    """Whether `e` is a t sequence refused on skewed values (:func:`anytime_effect`)."""
    return is_anytime(e) and e.method.startswith(f"{ANYTIME} {REFUSED}")


def mark(e: Effect | None) -> str:
    """The report's mark of an anytime-valid effect: :data:`BET_MARK` for a betting sequence, else :data:`MARK`."""
    return "" if not is_anytime(e) else BET_MARK if e.bounds is not None else MARK


def anytime_effect(e: Effect, level: float = LEVEL, bounds: tuple[float, float] | None = None,
                   check_skew: bool = True) -> Effect:
    """The same per-unit values' anytime-valid `level` interval, values kept: the betting sequence within `bounds`
    (:func:`betting_cs`), else the t-mixture sequence (:func:`anytime_t`), or, with `check_skew` and values whose
    |G1| exceeds :func:`skew_limit`, no interval (a refused effect, :func:`is_refused`, whose method says why)."""
    if bounds is not None:
        est, lo, hi, _, n = betting_cs(e.values, *bounds, alpha=1 - level)
        return Effect(est, lo, hi, n, f"{ANYTIME} {BETTING} {e.method}", level, e.values, tuple(bounds))
    g1 = skewness(e.values)
    if check_skew and abs(g1) > skew_limit(len(e.values)):
        return Effect(e.estimate, -math.inf, math.inf, e.n, f"{ANYTIME} {REFUSED} (skewed values, G1 = {g1:.2f}) "
                      f"{e.method}", level, e.values)
    est, lo, hi, _, n = anytime_t(e.values, alpha=1 - level)
    return Effect(est, lo, hi, n, f"{ANYTIME} {e.method}", level, e.values)


def refusal_text(e: Effect) -> str:
    """Why a refused effect has no interval."""
    g1 = e.method.split("G1 = ", 1)[1].split(")", 1)[0]
    return (f"its values are skewed (G1 = {g1}, beyond ±{skew_limit(e.n):.2f}, which 5 % of normal samples of "
            f"{e.n} exceed) and not tightly bounded: the t sequence assumes symmetric values")


def anytime_p(e: Effect, direction: int, null: float = 0.0) -> float:
    """The anytime-valid p toward `direction` against `null`: 1/K_n of the betting sequence (bounded values) or 1/E_n
    of the t sequence, when the estimate lies on that side, else 1 (:func:`betting_cs`, :func:`anytime_t`); 1 for a
    refused effect (no evidence)."""
    if is_refused(e):
        return 1.0
    if e.bounds is not None:
        return betting_cs(e.values, *e.bounds, direction=direction, null=null)[3]
    return anytime_t(e.values, direction=direction, null=null)[3]


def with_anytime(m: Measured, bounds: tuple[float, float] | None = None, check_skew: bool = True) -> Measured:
    """`m` with its effect replaced by the anytime-valid interval of the same values (in place, returned)."""
    if m.effect is not None:
        m.effect = anytime_effect(m.effect, bounds=bounds, check_skew=check_skew)
    return m
