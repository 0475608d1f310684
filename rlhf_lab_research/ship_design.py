"""The design phase of the ship rules (issue 67): every ship rule of :mod:`rlhf_lab.evaluation.ship` on the committed
policy runs, its parameters fitted on them, its gold regret with intervals clustered by study and seed;
``reports/ship/design.md`` and the fitted rules, ``reports/ship/rules.json``.

    python -m rlhf_lab_research.ship_design      # writes reports/ship/design.md and reports/ship/rules.json

The design runs are those of :data:`RUNS_FILES`, every runs file committed before the rules were frozen (fixed
here, so that a runs file committed later never enters the design), made before the freeze (:data:`FROZEN_AT_MS`:
``claims_runs.json.gz`` grows as claims are scored, and a run it gains later is not a design run). A run enters when
it is a FINISHED PPO, GRPO or RLOO run that kept, at ≥ :data:`MIN_EVALS` evaluations, ``eval/kl``,
``eval/gold_reward_a``, ``eval/gold_reward_b`` (the gold on two fixed disjoint halves of the evaluation prompts),
``eval/entropy``, ``eval/length`` and the training batches' proxy ``objective/scores`` (:func:`exclusion`).

The rules read the proxy of the training batches, as the hacking alarm does (the mean ``objective/scores`` of the
training steps since the previous evaluation: ``interval_means`` of the alarm's study), not ``eval/proxy_reward``:
that one scores the very samples whose gold measures the regret, and a rule choosing by it would choose by the gold's
noise too.

Regret (:func:`regret`): the best checkpoint chosen by its gold on half A of the evaluation prompts and measured with
the shipped one on half B, and the swap (chosen on B, measured on A); a run's regret is the mean of the two. Each
rule's parameter (:data:`GRIDS`) is the grid value of least mean regret over the design runs (the first on a tie);
the report also gives each rule's regret with each study scored by the parameters fitted without it (leave one study
out). Intervals: a two-stage bootstrap, studies drawn with replacement and, within each, the seeds
(:func:`cluster_weights`: scipy's bootstrap has no clusters; written here in a few lines).
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

from rlhf_lab.analysis.study_runs import RunData
from rlhf_lab.evaluation import ship as S
from rlhf_lab.evaluation.alarm import RULE
from rlhf_lab_research.stats import percentile_ci
from rlhf_lab_research.studies import alarm_fit
from rlhf_lab_research.studies.alarm_fit import interval_means, kl_regime

RUNS_FILES = ("reports/claims_runs.json.gz", "reports/algo_frontier/runs.json.gz",
              "reports/algo_frontier_equal/runs.json.gz", "reports/gao_rm_scaling_gold/runs.json.gz",
              "reports/gao_rm_scaling_kl/runs.json.gz", "reports/gold_recipes/runs.json.gz",
              "reports/gold_rm_validation/runs.json.gz", "reports/hacking_alarm/gold_rm_validation_sft_gold.json.gz",
              "reports/rm_source_5rms/runs.json.gz")
# the freeze (reports/ship/FROZEN.md record 1, commit 33c2caf, 2026-12-06 10:51:35 UTC), ms since the epoch: a run
# started later (C11's, which joined claims_runs.json.gz at 19:51 that day) never enters the design
FROZEN_AT_MS = 1796554295000
COMMAND = "python -m rlhf_lab_research.ship_design"
OUT, RULES_OUT = Path("reports/ship/design.md"), Path("reports/ship/rules.json")
ALGOS = ("ppo", "grpo", "rloo")
KEYS = ("eval/kl", "eval/gold_reward_a", "eval/gold_reward_b", "eval/entropy", "eval/length")
PROXY_KEY = "objective/scores"
MIN_EVALS = 3
N_BOOT, SEED, LEVEL = 2000, 0, 0.95
# Each rule's parameter grid; one point: fixed before the design (the design runs have no such signal, or, for the
# alarm, its rule and threshold as today: rlhf_lab.evaluation.alarm.RULE).
GRIDS: dict[str, list[dict]] = {
    "last_checkpoint": [{}],
    "clock": [{"fraction": round(0.05 * k, 2)} for k in range(1, 21)],
    "kl_budget": [{"budget": b} for b in (0.5, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)],
    "proxy_max": [{}],
    "proxy_plateau": [{"patience": p, "min_delta": d} for p in (1, 2, 3) for d in (0.0, 0.01, 0.02, 0.05, 0.1, 0.2)],
    "proxy_minus_sqrt_kl": [{"cost": c} for c in (0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0)],
    "ensemble_lcb": [{"k": 1.0}],
    "heldout_max": [{}],
    "heldout_patience": [{"patience": 2}],
    "alarm": [{"threshold": RULE.threshold}],
}
BASELINES = ("clock", "last_checkpoint")  # each rule's regret is also compared with these, paired


@dataclass
class DesignRun:
    """One design run: its study, seed, algorithm, labeler, KL regime, gold-free curve and gold on halves A and B."""

    study: str
    run_id: str
    seed: str
    algo: str
    labeler: str
    regime: str
    curve: S.Curve
    gold_a: np.ndarray
    gold_b: np.ndarray


def read_runs(files: Sequence[str] = RUNS_FILES) -> list[tuple[str, RunData]]:
    """(study, run) of every run in `files` (default: the design's), each run once: the alarm study's reader."""
    return alarm_fit.read_runs(files)


def eval_steps(r: RunData) -> list[int]:
    """The steps at which the run logged every one of :data:`KEYS`."""
    common = set.intersection(*({t for t, _ in r.series(k)} for k in KEYS))
    return sorted(common)


def exclusion(r: RunData) -> str | None:
    """Why a run does not enter the design (None: it does)."""
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


def design_run(study: str, r: RunData) -> DesignRun:
    """The :class:`DesignRun` of a run that enters."""
    steps = eval_steps(r)
    kl, gold_a, gold_b, entropy, length = (dict(r.series(k)) for k in KEYS)
    curve = S.Curve(tuple(steps), tuple(interval_means(r.series(PROXY_KEY), steps)), tuple(kl[t] for t in steps),
                    entropy=tuple(entropy[t] for t in steps), length=tuple(length[t] for t in steps))
    return DesignRun(study, r.run_id, str(r.seed), r.stage, str(r.value("labeler.name") or "?"), kl_regime(r), curve,
                     np.array([gold_a[t] for t in steps]), np.array([gold_b[t] for t in steps]))


def load(files: Sequence[str] = RUNS_FILES) -> tuple[list[DesignRun], Counter]:
    """(the design runs, sorted by study and run id; Counter of (why left out, study) of the others made before the
    freeze; a run started after it is not counted at all: :data:`FROZEN_AT_MS`)."""
    runs, out = [], Counter()
    for study, r in read_runs(files):
        if r.start_time >= FROZEN_AT_MS:
            continue
        why = exclusion(r)
        if why is None:
            runs.append(design_run(study, r))
        else:
            out[(why, study)] += 1
    return sorted(runs, key=lambda d: (d.study, d.run_id)), out


# -- the measures ---------------------------------------------------------------------------------------------------

def regret(d: DesignRun, shipped: int) -> float:
    """The run's regret of shipping `shipped`: best on half A measured on B, and best on B measured on A; their mean."""
    return 0.5 * (S.selection_regret(d.gold_a, d.gold_b, shipped) + S.selection_regret(d.gold_b, d.gold_a, shipped))


def gold(d: DesignRun) -> np.ndarray:
    """The run's gold on every evaluation prompt (the mean of the two halves, each half of the prompts)."""
    return 0.5 * (d.gold_a + d.gold_b)


@dataclass
class Shipped:
    """A rule with its parameters on each run: the index it ships (None: the run lacks its signal) and the regret."""

    index: list[int | None]
    regret: np.ndarray


def apply(runs: Sequence[DesignRun], rule: str, params: dict) -> Shipped:
    index = [S.ship(d.curve, rule, params) for d in runs]
    return Shipped(index, np.array([math.nan if i is None else regret(d, i) for d, i in zip(runs, index)]))


def grid_regrets(runs: Sequence[DesignRun], rule: str) -> np.ndarray:
    """(grid points, runs): the regret of each of the rule's grid points (:data:`GRIDS`) on each run (nan: the run
    lacks the rule's signal)."""
    return np.stack([apply(runs, rule, p).regret for p in GRIDS[rule]])


def fit(regrets: np.ndarray, rule: str, use: np.ndarray | None = None) -> dict:
    """The rule's grid point of least mean regret over the runs `use` (default: all) of `regrets`
    (:func:`grid_regrets`); the first on a tie, and the first where no run has the rule's signal."""
    r = regrets if use is None else regrets[:, use]
    means = [float(np.nanmean(row)) if np.isfinite(row).any() else math.inf for row in r]
    return GRIDS[rule][int(np.argmin(means))]


def leave_one_study_out(runs: Sequence[DesignRun], rule: str, regrets: np.ndarray) -> tuple[np.ndarray, dict]:
    """(each run's regret under the parameters fitted without its study, {study: those parameters})."""
    studies = np.array([d.study for d in runs])
    params = {s: fit(regrets, rule, studies != s) for s in sorted(set(studies.tolist()))}
    out = np.array([regrets[GRIDS[rule].index(params[s]), i] for i, s in enumerate(studies)])
    return out, params


def cluster_weights(studies: Sequence[str], seeds: Sequence[str], n_boot: int = N_BOOT,
                    seed: int = SEED) -> np.ndarray:
    """(n_boot, n runs): how often each run is drawn in each two-stage resample: the studies drawn with replacement,
    then within each draw of a study its seeds drawn with replacement (a seed's runs of that study come together)."""
    rng = np.random.default_rng(seed)
    studies, seeds = np.asarray(studies), np.asarray(seeds)
    names = sorted(set(studies.tolist()))
    members = {s: [np.flatnonzero((studies == s) & (seeds == k)) for k in sorted(set(seeds[studies == s].tolist()))]
               for s in names}
    w = np.zeros((n_boot, len(studies)))
    for b in range(n_boot):
        for s in rng.choice(names, size=len(names)):
            clusters = members[s]
            for k in rng.integers(0, len(clusters), size=len(clusters)):
                w[b, clusters[k]] += 1
    return w


def mean_ci(values: np.ndarray, weights: np.ndarray) -> tuple[float, float, float]:
    """(mean of the finite values, and its percentile interval over the resamples `weights`)."""
    ok = np.isfinite(values)
    if not ok.any():
        return math.nan, math.nan, math.nan
    v, w = values[ok], weights[:, ok]
    total = w.sum(axis=1)
    boot = (w @ v)[total > 0] / total[total > 0]
    return (float(v.mean()), *percentile_ci(boot.tolist(), LEVEL))


def fraction(flags: Sequence[bool | None]) -> float:
    known = [f for f in flags if f is not None]
    return sum(known) / len(known) if known else math.nan


# -- the report -----------------------------------------------------------------------------------------------------

def fmt(x: float, digits: int = 3) -> str:
    return "–" if not math.isfinite(x) else f"{x:.{digits}f}"


def ci(t: tuple[float, float, float]) -> str:
    return "no run" if not math.isfinite(t[0]) else f"{fmt(t[0])} [{fmt(t[1])}, {fmt(t[2])}]"


def params_text(p: dict) -> str:
    return ", ".join(f"{k} = {v}" for k, v in p.items()) or "none"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def design(runs: Sequence[DesignRun]) -> dict:
    """Every rule on the runs: {rule: (fitted params, Shipped with them, leave-one-study-out regrets, fold params)}."""
    out = {}
    for rule in GRIDS:
        regrets = grid_regrets(runs, rule)
        params = fit(regrets, rule)
        out[rule] = (params, apply(runs, rule, params), *leave_one_study_out(runs, rule, regrets))
    return out


def frozen_rules(fitted: dict) -> dict:
    """The content of ``reports/ship/rules.json``: each rule's parameters, and what the rules read."""
    return {"issue": 67,
            "proxy": f"mean `{PROXY_KEY}` of the training steps since the previous evaluation (at the start: the "
                     "first training step's)",
            "signals": {"kl": "eval/kl", "entropy": "eval/entropy", "length": "eval/length",
                        "proxy_ensemble_std": "eval/proxy_ensemble_std", "heldout_reward": "eval/heldout_reward"},
            "design_runs_files": list(RUNS_FILES),
            "rules": {rule: fitted[rule][0] for rule in GRIDS},
            "alarm_rule": alarm_rule()}


def alarm_rule() -> dict:
    """The hacking alarm's rule the ``alarm`` ship rule reads (``rlhf_lab.evaluation.alarm.RULE``), as frozen."""
    return {"mean": list(RULE.mean), "scale": list(RULE.scale), "weights": list(RULE.weights), "bias": RULE.bias,
            "threshold": RULE.threshold}


def report(runs: Sequence[DesignRun], left_out: Counter, fitted: dict) -> str:
    n = len(runs)
    studies = [d.study for d in runs]
    weights = cluster_weights(studies, [d.seed for d in runs])
    lines = ["# Ship rules: the design phase (issue 67)", "", "Regenerate:", "", "```bash", COMMAND, "```", "",
             f"Design runs: {n} FINISHED PPO/GRPO/RLOO runs of {len(set(studies))} studies from every runs file "
             f"committed before the freeze ({', '.join(f'`{f}`' for f in RUNS_FILES)}), each with ≥ {MIN_EVALS} "
             f"evaluations (the first at the start, before any update; {sum(len(d.curve.steps) for d in runs)} in "
             "all). These runs fitted the rules: the figures below are in-sample, or held out by study where said, "
             "and none is the test of `reports/ship/PROTOCOL.md`.", "",
             "**Regret** of a rule on a run: the best checkpoint chosen by its gold on half A of the evaluation prompts "
             "(`eval/gold_reward_a`) and measured with the shipped checkpoint on half B (`eval/gold_reward_b`); and the "
             "swap (chosen on B, measured on A); the run's regret is the mean of the two, so the choice of the best and "
             "the gold it is measured with never share prompts (a regret can be below 0 by that noise). Units: the "
             "world's gold (the runs of a gold RM: its normalised score). The rules read no gold: the proxy of the "
             f"training batches (`{PROXY_KEY}`, mean since the previous evaluation), `eval/kl`, `eval/entropy`, "
             "`eval/length`; these committed runs logged no RM-ensemble disagreement and no held-out RM, so those "
             "rules read no run here and keep parameters fixed before the design.", "",
             "**Intervals**: 95 % percentile bootstrap, two-stage over clusters: the studies drawn with replacement, "
             f"then the seeds within each drawn study ({N_BOOT} resamples, seed {SEED}); the differences are paired "
             "(the same resamples). Each rule's parameter is the grid value of least mean regret over all design runs; "
             "*held out by study*: each study's runs scored with the parameter fitted on the other studies.", ""]
    regrets = {rule: fitted[rule][1].regret for rule in GRIDS}
    rows = []
    for rule in GRIDS:
        params, shipped, loso, _ = fitted[rule]
        last = [None if i is None else i == len(d.curve.steps) - 1 for d, i in zip(runs, shipped.index)]
        worse = [None if i is None else bool(gold(d)[i] < gold(d)[0]) for d, i in zip(runs, shipped.index)]
        rows.append([f"`{rule}`", params_text(params), str(int(np.isfinite(shipped.regret).sum())),
                     ci(mean_ci(shipped.regret, weights)), ci(mean_ci(loso, weights)),
                     *(ci(mean_ci(shipped.regret - regrets[b], weights)) if b != rule else "–" for b in BASELINES),
                     fmt(fraction(worse)), fmt(fraction(last))])
    lines += ["## Regret per rule", ""]
    lines += table(("rule", "fitted parameters", "runs", "mean regret (fitted)", "mean regret (held out by study)",
                    "− clock, paired", "− last checkpoint, paired", "ships worse than the start", "ships the last"),
                   rows)
    lines += ["", "*Ships worse than the start*: the fraction of runs whose shipped checkpoint has a lower gold on all "
              "evaluation prompts (halves A and B together) than the start's (each is a mean over the same prompts, "
              "noise included). *Ships the last*: the fraction shipping the last evaluation.", ""]
    lines += ["## Mean regret by group (fitted parameters; no interval)", ""]
    groups = [("algorithm", "algo"), ("labeler", "labeler"), ("KL regime", "regime")]
    rows = []
    for label, attr in groups:
        for g in sorted({getattr(d, attr) for d in runs}):
            sel = np.array([getattr(d, attr) == g for d in runs])
            rows.append([label, g, str(int(sel.sum())),
                         *(fmt(float(np.nanmean(regrets[r][sel]))) if np.isfinite(regrets[r][sel]).any() else "–"
                           for r in GRIDS if r not in ("ensemble_lcb", "heldout_max", "heldout_patience"))])
    lines += table(("by", "group", "runs", *(f"`{r}`" for r in GRIDS
                                             if r not in ("ensemble_lcb", "heldout_max", "heldout_patience"))), rows)
    lines += ["", "## Parameters fitted without each study", ""]
    rows = [[s, *(params_text(fitted[r][3][s]) for r in GRIDS if len(GRIDS[r]) > 1)]
            for s in sorted(set(studies))]
    lines += table(("held-out study", *(f"`{r}`" for r in GRIDS if len(GRIDS[r]) > 1)), rows)
    lines += ["", "## Grids", ""]
    lines += [f"- `{r}`: " + ("; ".join(params_text(p) for p in g) if len(g) > 1 else
                             f"{params_text(g[0])} (fixed before the design)") for r, g in GRIDS.items()]
    lines += ["", "## Runs", "", f"{n} runs enter, by study: " + ", ".join(
        f"{s} ({c})" for s, c in sorted(Counter(studies).items())) + ".", ""]
    by_why: dict[str, Counter] = {}
    for (why, study), c in left_out.items():
        by_why.setdefault(why, Counter())[study] += c
    rows = [[why, str(sum(c.values())), ", ".join(f"{s} ({k})" for s, k in sorted(c.items()))]
            for why, c in sorted(by_why.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))]
    lines += table(("left out because", "runs", "studies (runs)"), rows)
    return "\n".join(lines) + "\n"


def write(root: Path = Path(".")) -> tuple[Path, Path]:
    """Writes ``reports/ship/design.md`` and ``reports/ship/rules.json`` under `root` from the design runs."""
    runs, left_out = load([str(root / f) for f in RUNS_FILES])
    fitted = design(runs)
    out, rules_out = root / OUT, root / RULES_OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report(runs, left_out, fitted), encoding="utf-8")
    rules_out.write_text(json.dumps(frozen_rules(fitted), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out, rules_out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=".", help="the repository root (default: the working folder)")
    args = parser.parse_args(argv)
    for path in write(Path(args.root)):
        print(path)


if __name__ == "__main__":
    main()
