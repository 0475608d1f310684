"""Which studies to give more seeds, and how many: the plan of ``rlhf-lab-suite --decide``.

Each inconclusive judged effect of the claims report states the seeds that 80 % power would need to decide it
(:func:`rlhf_lab_research.verdicts.seeds_to_decide`, counted in seeds: an effect whose unit is a policy × seed
cell or an RM is not planned here). A study's target is the largest of those among the claims it tests that is at
most the cap; the studies are planned cheapest decision first: the jobs the missing seeds add times the study's
time per job (its header's ``Expected: N jobs ... about M min``, measured with 2 jobs at a time on 2 cores). An
effect above the cap stays "needs about N seeds" in the report: more seeds are not worth it here.

Pure: it reads the judged results and the runs that count; running the plan is :mod:`rlhf_lab_research.suite`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

from rlhf_lab_research.provenance import seeds_present
from rlhf_lab_research.claims_registry import JUDGED
from rlhf_lab_research.stats import INCONCLUSIVE
from rlhf_lab_research.verdicts import SEED_UNITS


@dataclass(frozen=True)
class PlanItem:
    """More seeds for one study: from `seeds_now` distinct seeds to `target`, the new ones `new_seeds`."""

    study: str  # the study file that runs the design (sweeps/sweep/<study>.yaml)
    claims: tuple[str, ...]  # the claims whose inconclusive effects set the target
    seeds_now: int
    target: int
    new_seeds: tuple[int, ...]
    jobs: int  # jobs the new seeds add
    minutes: float  # their expected wall time, 2 jobs at a time on 2 cores

    @property
    def seed_override(self) -> str:
        return "seed=" + ",".join(str(s) for s in self.new_seeds)


@dataclass(frozen=True)
class Beyond:
    """An inconclusive judged effect that more seeds would not decide within the cap (or that is not in seeds)."""

    claim: str
    effect: str
    needs: int | None
    unit: str


def targets(results: Sequence, cap: int) -> tuple[dict[str, tuple[int, set[str]]], list[Beyond]]:
    """({claim study key: (seeds its inconclusive judged effects need, at most `cap`; the claims)}, the inconclusive
    judged effects left to the report: over the cap, or not counted in seeds)."""
    want: dict[str, tuple[int, set[str]]] = {}
    beyond: list[Beyond] = []
    for r in results:
        if r.verdict != INCONCLUSIVE:
            continue
        for p in r.parts:
            if p.part.role != JUDGED or p.verdict != INCONCLUSIVE:
                continue
            unit = p.measured.n_of
            if p.needs is None or unit not in SEED_UNITS or p.needs > cap:
                beyond.append(Beyond(r.claim.id, p.part.says, p.needs, unit))
                continue
            for s in r.claim.studies:
                n, claims = want.get(s, (0, set()))
                want[s] = (max(n, p.needs), claims | {r.claim.id})
    return want, beyond


def plan(results: Sequence, counting: dict[str, list], cap: int, suite_study: Callable[[str], str | None],
         per_seed: Callable[[str], tuple[int, float]]) -> tuple[list[PlanItem], list[Beyond]]:
    """The studies to extend, cheapest first, and the effects left undecided.

    `counting`: {claim study key: the runs that count}; `suite_study(key)`: the study file that runs the key's
    design (None: not in the suite); `per_seed(study)`: (jobs, minutes) one more seed of it costs."""
    want, beyond = targets(results, cap)
    items: dict[str, PlanItem] = {}
    for key, (target, claims) in want.items():
        study = suite_study(key)
        present = seeds_present(counting.get(key, []))
        if study is None or not present or len(present) >= target:  # no runs yet: the suite runs the study itself
            continue
        start = max(present) + 1
        new = tuple(range(start, start + target - len(present)))
        jobs, minutes = per_seed(study)
        old = items.get(study)
        merged = tuple(sorted(claims | set(old.claims if old else ())))
        if old is None or len(new) > len(old.new_seeds):
            items[study] = PlanItem(study, merged, len(present), target, new, jobs * len(new), minutes * len(new))
        else:
            items[study] = replace(old, claims=merged)
    return sorted(items.values(), key=lambda i: (i.minutes, i.study)), beyond


def plan_table(items: Sequence[PlanItem], beyond: Sequence[Beyond], cap: int) -> str:
    """The plan as ``--dry-run`` prints it."""
    lines = [f"{'#':>2}  {'study':<28} {'claims':<10} {'seeds':>9} {'jobs':>5} {'~min':>6}"]
    total = 0.0
    for i, it in enumerate(items, 1):
        total += it.minutes
        lines.append(f"{i:>2}  {it.study:<28} {' '.join(it.claims):<10} {f'{it.seeds_now} -> {it.target}':>9} "
                     f"{it.jobs:>5} {it.minutes:>6.0f}")
    lines.append(f"{len(items)} studies, {sum(i.jobs for i in items)} jobs, about {total / 60:.1f} h with 2 jobs at a "
                 "time on 2 cores (each study's seed-0 run is reproduced first: one job more each)")
    for b in beyond:
        why = (f"needs about {b.needs} {b.unit}, above the cap {cap}" if b.needs is not None and b.unit in SEED_UNITS
               else f"counted in {b.unit}, not seeds" if b.needs is not None else "no power estimate")
        lines.append(f"    left: {b.claim} \"{b.effect}\": {why}")
    return "\n".join(lines)
