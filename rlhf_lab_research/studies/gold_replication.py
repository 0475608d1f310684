"""``reports/gold_rm_replication/README.md``: gold-RM mode validated with the gold replicated (issue 69).

The study (sweeps/sweep/gold_rm_replication.yaml) crosses 2 gold builds (sweeps/gold_build/) with 3 proxy RMs each
and validates policies of another distribution than the gold's covers (GRPO and RLOO; the covers are PPO jobs), with
PPO beside them as the in-distribution case, all at β = 0. Its analysis, fixed before its runs
(reports/PREREGISTERED.md records this file's digest):

1. per run, Spearman ρ between ``eval/formula_gold_reward`` and ``eval/gold_reward`` over its evaluations
   (:func:`~rlhf_lab_research.studies.gold_validation.run_rho`), and the gold-free baseline, ρ between the formula and
   −``eval/kl`` over the same evaluations (:func:`kl_rho`: a policy further from its reference is, by that measure
   alone, a worse one);
2. per (gold build, proxy) cell, the mean of each over its held-out runs (:func:`cells`): the cell is the unit, since
   the runs of a cell share their gold and their proxy;
3. over the cells, the mean ρ on Fisher's z scale with its fixed-n Student-t 95 % interval (df = cells − 1), tanh
   back (:func:`~rlhf_lab_research.studies.gold_validation.fisher_mean`), against the bar (mean ≥ 0.8, lower end
   ≥ 0.5); and the paired difference z(ρ gold RM) − z(ρ −KL) over the cells with its t interval: the gold RM earns
   its cost only if that interval lies above 0. The study has one look and is never extended, so a fixed-n interval
   keeps its level.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Sequence

from rlhf_lab.analysis.markdown import fmt, md_table
from rlhf_lab.analysis.study_runs import RunData
from rlhf_lab_research.effects import spearman
from rlhf_lab_research.stats import Effect, t_effect
from rlhf_lab_research.studies import write_rendered_report
from rlhf_lab_research.studies.gold_validation import (BAR_LOW, BAR_MEAN, FORMULA_EVAL, HISTORY_KEYS, fisher_mean,
                                                       meets_bar, run_rho)

STUDY = "gold_rm_replication"
HELD_OUT = ("grpo", "rloo")     # the validated policies' algorithms the covers (PPO jobs) are not: the primary
IN_DISTRIBUTION = ("ppo",)      # the covers' algorithm: shown beside
STAGES = (*HELD_OUT, *IN_DISTRIBUTION)
KEYS = (*HISTORY_KEYS, "eval/kl")
GOLD_KEYS = ("gold.build.reward_model.seed", "gold.build.data.seed")
PROXY_KEY = "reward_model.seed"


def kl_rho(r: RunData) -> float:
    """Spearman ρ between the formula's gold and −eval/kl over one run's evaluations (NaN with fewer than 3)."""
    kl = dict(r.series("eval/kl"))
    pts = [(f, -kl[s]) for s, f in r.series(FORMULA_EVAL) if s in kl and math.isfinite(f) and math.isfinite(kl[s])]
    return spearman([p[0] for p in pts], [p[1] for p in pts])


def cell_of(r: RunData) -> tuple[str, str]:
    """(gold build, proxy) of a run, from its logged config: 'RM seed s, data seed d' and 'proxy seed p'."""
    g = r.params
    return (f"RM seed {g.get(GOLD_KEYS[0], '?')}, data seed {g.get(GOLD_KEYS[1], '?')}",
            f"proxy seed {g.get(PROXY_KEY, '?')}")


def cells(runs: Sequence[RunData], stages: Sequence[str] = HELD_OUT) -> dict[tuple[str, str], tuple[float, float, int]]:
    """{(gold, proxy): (mean ρ gold RM, mean ρ −KL, runs)} over the FINISHED runs of `stages` (a run without a ρ
    left out of both means)."""
    out: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in runs:
        if r.status == "FINISHED" and r.stage in stages:
            pair = (run_rho(r), kl_rho(r))
            if all(map(math.isfinite, pair)):
                out.setdefault(cell_of(r), []).append(pair)
    return {k: (sum(p[0] for p in v) / len(v), sum(p[1] for p in v) / len(v), len(v)) for k, v in sorted(out.items())}


def z(rho: float) -> float:
    return math.atanh(max(-0.999999, min(0.999999, rho)))


def primary(table: dict[tuple[str, str], tuple[float, float, int]]) -> tuple[Effect, Effect, Effect]:
    """(mean ρ gold RM over the cells, mean ρ −KL over the cells, z(ρ gold RM) − z(ρ −KL) over the cells): the first two
    :func:`fisher_mean` (fixed-n t on Fisher z, tanh back), the third a t interval on the z scale."""
    gold = [v[0] for v in table.values()]
    kl = [v[1] for v in table.values()]
    return fisher_mean(gold), fisher_mean(kl), t_effect([z(g) - z(k) for g, k in zip(gold, kl)],
                                                        method="paired t over cells, Fisher z")


def ci(e: Effect) -> str:
    return f"{fmt(e.estimate, 2)} [{fmt(e.lo, 2)}, {fmt(e.hi, 2)}] (n = {e.n})" if e.n >= 2 else f"– (n = {e.n})"


def render(runs: Sequence[RunData], commands: Sequence[str]) -> list[str]:
    held, inside = cells(runs), cells(runs, IN_DISTRIBUTION)
    gold, kl, diff = primary(held)
    verdict = ("meets the bar" if meets_bar(gold) and gold.n >= 6 else "does not meet the bar")
    beats = ("the gold RM ranks the formula's gold better than −KL" if diff.n >= 2 and diff.lo > 0 else
             "the gold RM is not shown to rank better than −KL" if diff.n >= 2 else "no cells")
    rows = [[g, p, fmt(v[0], 2), fmt(v[1], 2), v[2], fmt(inside.get((g, p), (math.nan,) * 3)[0], 2)]
            for (g, p), v in held.items()]
    lines = [f"# Study `{STUDY}`: the gold RM validated with the gold replicated", "",
             f"Runs: {sum(r.status == 'FINISHED' for r in runs)} FINISHED of {len(runs)}; "
             f"{len(held)} (gold, proxy) cells with held-out ({', '.join(HELD_OUT)}) runs.", "",
             f"**Primary** (stated before the runs): mean per-cell ρ(formula, gold RM) over held-out runs, "
             f"{ci(gold)}; the bar: a mean ≥ {BAR_MEAN} with the lower end ≥ {BAR_LOW} over the 6 cells: "
             f"**{verdict}**.", "",
             f"**Gold-free baseline:** ρ(formula, −KL) {ci(kl)}; z(ρ gold RM) − z(ρ −KL) per cell: {ci(diff)}: "
             f"{beats}.", "",
             md_table(["gold build", "proxy", "ρ gold RM (held out)", "ρ −KL (held out)", "runs",
                       "ρ gold RM (PPO, in distribution)"], rows), "",
             "Reproduce:", "", "```bash", *commands, "```"]
    return lines


def write_gold_replication_report(out_dir: Path | str = "reports", uri: str | None = None,
                                  runs_files: Sequence[Path | str] = (), use_store: bool = True,
                                  require_runs: bool = False) -> Path:
    """``<out_dir>/gold_rm_replication/README.md`` from the study's runs (store and `runs_files`); read from a store,
    the runs are kept beside it in ``runs.json.gz``."""
    return write_rendered_report(STUDY, render, out_dir, uri, runs_files, use_store, require_runs, stages=STAGES,
                                 history_keys=KEYS)[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlhf_lab_research.studies.gold_replication", description=__doc__)
    p.add_argument("--store", action="store_true", help="read the study's runs from the tracking store")
    p.add_argument("--uri", default=None)
    p.add_argument("--runs", action="append", default=[], help="a runs file (repeatable)")
    p.add_argument("--out", default="reports")
    a = p.parse_args(argv)
    if not a.store and not a.runs:
        p.error("give --store or --runs FILE")
    try:
        path = write_gold_replication_report(a.out, a.uri, a.runs, use_store=a.store, require_runs=True)
    except ValueError as err:
        print(f"gold_replication: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
