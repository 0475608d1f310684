"""The ship rules' prospective test (issue 67, ``reports/ship/PROTOCOL.md``): the frozen rules
(``reports/ship/rules.json``) scored once on the runs of the studies made after the freeze, written before any of
those runs existed.

    python -m rlhf_lab_research.ship_test --store     # the test studies' runs from the tracking store: writes
                                                      # reports/ship/test_runs.json.gz, then reports/ship/test.md
    python -m rlhf_lab_research.ship_test --runs reports/ship/test_runs.json.gz    # again, from that file

``--store`` reads the runs of :data:`TEST_STUDIES` with every history the scoring needs (:data:`HISTORY`; a study
report's runs file keeps fewer: no ``test/gold_reward`` or held-out RM history) and keeps them in a runs file first.

A test run enters when it is a FINISHED PPO, GRPO or RLOO run that logged, at ≥ :data:`MIN_EVALS` evaluations,
what the rules read (the training proxy ``objective/scores``, ``eval/kl``, ``eval/entropy``, ``eval/length``) and the
gold of the selection and measurement sets (``eval/gold_reward`` on the evaluation prompts, ``test/gold_reward`` on the
test prompts, logged at every evaluation by ``eval.test_each_eval``); ``eval/heldout_reward`` and
``eval/proxy_ensemble_std`` enter where logged. A rule's regret on a run: the best checkpoint chosen by its evaluation
gold, it and the shipped one measured on the test prompts (:func:`rlhf_lab.evaluation.ship.selection_regret`); a run
is past its peak when the test gold of that best checkpoint exceeds the last one's by more than :data:`MARGIN`.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from rlhf_lab.analysis.study_runs import RunData, load_study
from rlhf_lab.analysis.snapshot import write_snapshot
from rlhf_lab.evaluation import ship as S
from rlhf_lab_research.ship_design import (
    ALGOS, PROXY_KEY, ci, cluster_weights, fmt, fraction, mean_ci, params_text, read_runs, table)
from rlhf_lab_research.stats import units_for_power
from rlhf_lab_research.studies.alarm_fit import interval_means, kl_regime

RULES = Path("reports/ship/rules.json")
TEST_STUDIES = ("ship_labeler", "ship_critic_free", "ship_ensemble")  # reports/ship/PROTOCOL.md
RUNS_OUT, OUT = Path("reports/ship/test_runs.json.gz"), Path("reports/ship/test.md")
KEYS = ("eval/kl", "eval/entropy", "eval/length", "eval/gold_reward", "test/gold_reward")
OPTIONAL = {"proxy_ensemble_std": "eval/proxy_ensemble_std", "heldout_reward": "eval/heldout_reward"}
HISTORY = (*KEYS, "objective/scores", *OPTIONAL.values())
MIN_EVALS = 3
MARGIN = 0.05  # gold units: "past its peak" only where the test gold fell more than this from the peak
PRIMARY, BASELINES = "proxy_minus_sqrt_kl", ("clock", "last_checkpoint")


@dataclass
class ProspectiveRun:
    study: str
    run_id: str
    seed: str
    algo: str
    labeler: str
    regime: str
    curve: S.Curve
    select: np.ndarray  # eval/gold_reward at each evaluation
    measure: np.ndarray  # test/gold_reward at each evaluation

    @property
    def peak(self) -> int:
        return S.first_argmax(self.select)

    @property
    def past_peak(self) -> bool:
        return bool(self.measure[self.peak] - self.measure[-1] > MARGIN)


def eval_steps(r: RunData) -> list[int]:
    return sorted(set.intersection(*({t for t, _ in r.series(k)} for k in KEYS)))


def exclusion(r: RunData) -> str | None:
    """Why a run does not enter the test (None: it does)."""
    if r.stage not in ALGOS:
        return f"a {r.stage} run (not PPO, GRPO or RLOO)"
    if r.status != "FINISHED":
        return f"status {r.status}"
    missing = [k for k in (*KEYS, PROXY_KEY) if not r.series(k)]
    if missing:
        return "no " + ", ".join(f"`{k}`" for k in missing) + " history kept"
    if len(eval_steps(r)) < MIN_EVALS:
        return f"fewer than {MIN_EVALS} evaluations"
    return None


def prospective_run(study: str, r: RunData) -> ProspectiveRun:
    steps = eval_steps(r)
    kl, entropy, length, select, measure = (dict(r.series(k)) for k in KEYS)
    optional = {}
    for name, key in OPTIONAL.items():
        values = dict(r.series(key))
        if all(t in values for t in steps):
            optional[name] = tuple(values[t] for t in steps)
    curve = S.Curve(tuple(steps), tuple(interval_means(r.series(PROXY_KEY), steps)), tuple(kl[t] for t in steps),
                    entropy=tuple(entropy[t] for t in steps), length=tuple(length[t] for t in steps), **optional)
    return ProspectiveRun(study, r.run_id, str(r.seed), r.stage, str(r.value("labeler.name") or "?"), kl_regime(r),
                          curve, np.array([select[t] for t in steps]), np.array([measure[t] for t in steps]))


def scored(runs: Sequence[ProspectiveRun], rule: str, params: dict) -> tuple[list[int | None], np.ndarray]:
    """(the index each run ships, its regret: nan where the run lacks the rule's signal)."""
    index = [S.ship(d.curve, rule, params) for d in runs]
    return index, np.array([math.nan if i is None else S.selection_regret(d.select, d.measure, i)
                            for d, i in zip(runs, index)])


def power_lines(runs: Sequence[ProspectiveRun], regrets: dict, diffs: Sequence[tuple]) -> list[str]:
    """For each baseline whose paired interval reaches 0: the studies a decision would need (reports/ship/PROTOCOL.md,
    look 4). The bootstrap's top unit is the study, so the unit counted is a study: the paired difference's mean in
    each study, their spread (sd), and the studies a one-sided t test on study means at 2.5 % needs for 80 % power
    (:func:`rlhf_lab_research.stats.units_for_power`) where the true difference is the measured one."""
    studies = sorted({d.study for d in runs})
    out = []
    for b, d in zip(BASELINES, diffs):
        if d[2] < 0 or not d[0] < 0:
            continue
        diff = regrets[PRIMARY] - regrets[b]
        means = [float(np.nanmean(diff[[r.study == s for r in runs]])) for s in studies]
        sd = float(np.std(means, ddof=1))
        n = units_for_power(-d[0], sd)
        need = f"about {n} studies like these" if n is not None else "more studies than can be counted"
        out += ["", f"Undecided against `{b}`: its paired difference by study is "
                f"{', '.join(f'{fmt(m)} ({s})' for m, s in zip(means, studies))} (sd {fmt(sd)} between studies, the "
                f"bootstrap's top unit); for 80 % power at the measured {fmt(d[0])}, a one-sided t test on study means "
                f"at 2.5 % needs {need} ({len(studies)} now)."]
    return out


def report(runs: Sequence[ProspectiveRun], left_out: Counter, rules: dict, files: Sequence[str]) -> str:
    weights = cluster_weights([d.study for d in runs], [d.seed for d in runs])
    shipped = {rule: scored(runs, rule, params) for rule, params in rules.items()}
    regrets = {rule: r for rule, (_, r) in shipped.items()}
    past, rows = [d.past_peak for d in runs], []
    for rule, params in rules.items():
        index = shipped[rule][0]
        early = [None if i is None else i < len(d.curve.steps) - 1 for d, i in zip(runs, index)]
        worse = [None if i is None else bool(d.measure[i] < d.measure[0]) for d, i in zip(runs, index)]
        rows.append([f"`{rule}`" + (" (primary)" if rule == PRIMARY else ""), params_text(params),
                     str(int(np.isfinite(regrets[rule]).sum())), ci(mean_ci(regrets[rule], weights)),
                     *(ci(mean_ci(regrets[rule] - regrets[b], weights)) if b != rule else "–" for b in BASELINES),
                     fmt(fraction(worse)), fmt(fraction([None if e is None else not e for e in early])),
                     fmt(fraction([e for e, p in zip(early, past) if not p])),
                     fmt(fraction([None if e is None else not e for e, p in zip(early, past) if p]))])
    diffs = [mean_ci(regrets[PRIMARY] - regrets[b], weights) for b in BASELINES]
    verdict = ("**better** than both (each paired interval below 0)" if all(d[2] < 0 for d in diffs) else
               "**not** better than both (a paired interval reaches 0 or above)")
    lines = ["# Ship rules: the prospective test (issue 67)", "",
             f"Rules: `{RULES}` (`reports/ship/FROZEN.md`); protocol: `reports/ship/PROTOCOL.md`. Runs: "
             f"{len(runs)} of {len({d.study for d in runs})} studies ({', '.join(f'`{f}`' for f in files)}); "
             f"{sum(past)} past their peak (test gold more than {MARGIN} below the peak chosen on the eval gold).", "",
             f"Primary: `{PRIMARY}` against `clock` {ci(diffs[0])} and `last_checkpoint` {ci(diffs[1])}: {verdict}.",
             *(power_lines(runs, regrets, diffs)), ""]
    lines += table(("rule", "parameters", "runs", "mean regret", "− clock, paired", "− last checkpoint, paired",
                    "ships worse than the start", "ships the last", "false alarms", "misses"), rows)
    lines += ["", "By group (mean regret; descriptive, no interval):", ""]
    groups = []
    for label, attr in (("study", "study"), ("algorithm", "algo"), ("labeler", "labeler"), ("KL regime", "regime")):
        for g in sorted({getattr(d, attr) for d in runs}):
            sel = np.array([getattr(d, attr) == g for d in runs])
            groups.append([label, g, str(int(sel.sum())), fmt(float(np.mean(np.array(past)[sel]))),
                           *(fmt(float(np.nanmean(regrets[r][sel]))) if np.isfinite(regrets[r][sel]).any() else "–"
                             for r in rules)])
    lines += table(("by", "group", "runs", "past their peak", *(f"`{r}`" for r in rules)), groups)
    lines += ["", "Regret: test gold of the checkpoint best by eval gold − test gold of the shipped one. Intervals: "
              "95 % two-stage bootstrap (studies, then seeds), paired; secondary rules' intervals unadjusted. *False "
              "alarms*: ships before the last among the runs not past their peak; *misses*: ships the last among those "
              "past it.", "", "Left out: " + (", ".join(f"{why} ({study}: {n})" for (why, study), n in
                                                       sorted(left_out.items())) or "none") + "."]
    return "\n".join(lines) + "\n"


def store_runs(path: Path | str, uri: str | None = None, load=load_study) -> Path:
    """Keeps the policy runs of :data:`TEST_STUDIES` in the store (`uri`: as ``rlhf-lab-report``'s), with the
    histories of :data:`HISTORY`, in the runs file `path`."""
    return write_snapshot(path, {study: load(study, uri, stages=ALGOS, history_keys=HISTORY)[0]
                                 for study in TEST_STUDIES})


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--store", action="store_true", help=f"read the test studies from the store into {RUNS_OUT}")
    source.add_argument("--runs", action="append", help="a runs file of the test studies (repeatable)")
    parser.add_argument("--uri", default=None, help="the tracking store (default: as rlhf-lab-report's)")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    if args.store:
        args.runs = [str(store_runs(RUNS_OUT, args.uri))]
    rules = json.loads(RULES.read_text(encoding="utf-8"))["rules"]
    runs, left_out = [], Counter()
    for study, r in read_runs(args.runs):
        why = exclusion(r)
        if why is None:
            runs.append(prospective_run(study, r))
        else:
            left_out[(why, study)] += 1
    runs.sort(key=lambda d: (d.study, d.run_id))
    Path(args.out).write_text(report(runs, left_out, rules, args.runs), encoding="utf-8")
    print(args.out)


if __name__ == "__main__":
    main()
