"""Which effects of the claims report are judged with an anytime-valid interval (issue 42, point 3: optional stopping).

A study was **extended after looking** when its counted runs include seeds beyond the seeds its study file sweeps
(``hydra.sweeper.params.seed``, :func:`rlhf_lab_research.provenance.file_seeds`): ``rlhf-lab-suite --more-seeds``
and ``--decide`` add seeds to a study after a report has shown its intervals, and the report's provenance table
lists them as "added". A fixed-n t interval is not valid at an n chosen after seeing the data, so a judged effect or
a precondition that reads the runs of such an added seed (:func:`added_run_ids`) is judged with the t-mixture
confidence sequence of :func:`rlhf_lab_research.sequential.anytime_t` (Wang & Ramdas 2023) instead: its 95 %
interval and its p = 1/E_n, which enters Holm's family like any other p. Every other effect keeps its fixed-n t
interval and p. The runs an effect read decide, not the units its pairing kept: an effect that reads an added
seed's runs but pairs them with a study that ran only the file's own seeds is judged with the sequence too
(conservative: its n was fixed).
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Iterable, Mapping, Sequence

import numpy as np

from rlhf_lab_research.effects import Measured
from rlhf_lab_research.provenance import file_seeds, seeds_present
from rlhf_lab.analysis.runs import STUDY_TAG, RunData
from rlhf_lab_research.sequential import anytime_t, t_mixture_c, t_mixture_multiplier
from rlhf_lab_research.stats import Effect

ANYTIME = "anytime"    # the start of an anytime-valid interval's Effect.method ("anytime t", "anytime paired t")
LEVEL = 0.95           # the sequence shown (two-sided); its p is used as is at the verdicts' one-sided level
MARK = "†"
FOOTNOTE = f"{MARK} seeds added after looking: anytime-valid interval (Wang & Ramdas 2023)"


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


def anytime_effect(e: Effect, level: float = LEVEL) -> Effect:
    """The same per-unit values' anytime-valid `level` interval (:func:`anytime_t`), values kept."""
    est, lo, hi, _, n = anytime_t(e.values, alpha=1 - level)
    return Effect(est, lo, hi, n, f"{ANYTIME} {e.method}", level, e.values)


def anytime_p(e: Effect, direction: int, null: float = 0.0) -> float:
    """The anytime-valid p toward `direction` against `null`: 1/E_n of the two-sided sequence when the estimate lies
    on that side, else 1 (:func:`anytime_t`)."""
    return anytime_t(e.values, direction=direction, null=null)[3]


def with_anytime(m: Measured) -> Measured:
    """`m` with its effect replaced by the anytime-valid interval of the same values (in place, returned)."""
    if m.effect is not None:
        m.effect = anytime_effect(m.effect)
    return m
