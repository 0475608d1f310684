"""Goodhart's law in tuning (issue 67, item 6): what tuning PPO's β, steps and learning rate on the raw proxy picks,
against tuning on the ship rule's gold-free value and on the gold itself, each pick judged by its gold on the test
prompts, which no objective read; ``reports/ship/tuning.md``.

    python -m rlhf_lab_research.goodhart_tuning --store   # the three studies' runs from the tracking store: writes
                                                          # reports/ship/tuning_runs.json.gz, then the report
    python -m rlhf_lab_research.goodhart_tuning --runs reports/ship/tuning_runs.json.gz    # again, from that file

The studies (:data:`STUDIES`, ``sweeps/sweep/tune_goodhart_*.yaml``) are identical but for ``tune.objective``
(:mod:`rlhf_lab.evaluation.objective`): ``proxy`` (``eval/proxy_reward`` at the last evaluation), ``ship`` (the
held-out RM's score at the checkpoint the ship rule ships) and ``gold`` (``eval/gold_reward`` there). Each trial logged
its objective as ``tune/objective`` and the step of the checkpoint it valued as ``tune/step`` (the last for ``proxy``:
a naive tuner ships the model it tuned; for the others the rule's pick), and the test gold of every checkpoint
(``eval.test_each_eval``).

A trial enters when it is a FINISHED policy run with a finite ``tune/objective`` and a ``test/gold_reward`` logged
at its ``tune/step`` (:func:`exclusion`). Each study's **pick** is its trial of the largest ``tune/objective`` (what
the sweeper reports as its best; the earliest started on a tie): its β, steps and learning rate, the checkpoint it
ships (``tune/step``) and that checkpoint's test gold. **Gold regret** of a pick: the test gold of the gold-tuned
pick's shipped checkpoint − the test gold of this pick's (the gold pick was chosen on the evaluation prompts, both
measured on the test prompts, so the choice and the measure do not share prompts' noise). Each trial is one
training seed, so the interval is the test prompts' sampling error only: ± 1.96 · √(se₁² + se₂²) from
``test/gold_reward_se`` (conservative: both means are over the same prompts, whose shared part cancels in the
difference); the spread between training seeds is not measured. Also per study: how well its objective ranks its
own trials by test gold (Spearman ρ over trials).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from scipy.stats import spearmanr

from rlhf_lab.analysis.study_runs import RunData, load_study
from rlhf_lab.analysis.snapshot import SnapshotError, write_snapshot
from rlhf_lab_research.ship_design import fmt, read_runs, table

STUDIES = {"proxy": "tune_goodhart_proxy", "ship": "tune_goodhart_ship", "gold": "tune_goodhart_gold"}
REFERENCE = "gold"
COMMAND = "python -m rlhf_lab_research.goodhart_tuning"
RUNS_OUT, OUT = Path("reports/ship/tuning_runs.json.gz"), Path("reports/ship/tuning.md")
OBJECTIVE, STEP = "tune/objective", "tune/step"
TEST, TEST_SE = "test/gold_reward", "test/gold_reward_se"
HISTORY = ("eval/gold_reward", TEST, TEST_SE, "eval/kl", "eval/proxy_reward", "eval/heldout_reward")
POLICY = ("ppo", "grpo", "rloo", "dpo")
Z = 1.959963984540054  # the normal's 97.5 % quantile: 95 % intervals
PARAMS = ("kl.beta", "algo.steps", "algo.lr")


@dataclass
class Trial:
    """One trial: its run, its objective's value, the step it ships, and there the test gold (with its SE), the
    evaluation gold and the KL; `params` the tuned values (:data:`PARAMS`)."""

    run_id: str
    start_time: int
    params: dict[str, str]
    objective: float
    step: int
    test_gold: float
    test_se: float
    eval_gold: float
    kl: float


def at(r: RunData, key: str, step: int) -> float:
    """The value of `key` logged at `step` (nan if none)."""
    return dict(r.series(key)).get(step, math.nan)


def exclusion(r: RunData) -> str | None:
    """Why a trial's run does not enter (None: it does)."""
    if r.stage not in POLICY:
        return f"a {r.stage} run (not a policy run)"
    if r.status != "FINISHED":
        return f"status {r.status}"
    if not math.isfinite(r.metrics.get(OBJECTIVE, math.nan)) or STEP not in r.metrics:
        return f"no `{OBJECTIVE}` and `{STEP}` logged"
    if not math.isfinite(at(r, TEST, int(r.metrics[STEP]))):
        return f"no `{TEST}` at its `{STEP}`"
    return None


def trial(r: RunData) -> Trial:
    """The :class:`Trial` of a run that enters."""
    step = int(r.metrics[STEP])
    return Trial(r.run_id, r.start_time, {k: str(r.value(k, "?")) for k in PARAMS}, float(r.metrics[OBJECTIVE]), step,
                 at(r, TEST, step), at(r, TEST_SE, step), at(r, "eval/gold_reward", step), at(r, "eval/kl", step))


def pick(trials: Sequence[Trial]) -> Trial | None:
    """The trial of the largest objective (the earliest started, then the first run id, on a tie); None if none."""
    if not trials:
        return None
    return min(trials, key=lambda t: (-t.objective, t.start_time, t.run_id))


def regret(reference: Trial, chosen: Trial) -> tuple[float, float, float]:
    """(the gold regret of `chosen` against `reference`, and its 95 % interval from the two test SEs)."""
    diff = reference.test_gold - chosen.test_gold
    half = Z * math.sqrt(reference.test_se ** 2 + chosen.test_se ** 2)
    return diff, diff - half, diff + half


def rank_agreement(trials: Sequence[Trial]) -> float:
    """Spearman ρ over the trials between the objective and the test gold at the shipped step (nan: < 3 trials)."""
    obj = np.array([t.objective for t in trials])
    gold = np.array([t.test_gold for t in trials])
    if len(trials) < 3 or np.ptp(obj) == 0 or np.ptp(gold) == 0:
        return math.nan
    return float(spearmanr(obj, gold).statistic)


def number(text: str) -> str:
    """A tuned value as logged, shortened to 3 significant digits when it is a number (Optuna's draws have 17)."""
    try:
        return f"{float(text):.3g}"
    except ValueError:
        return text


def interval(t: tuple[float, float, float]) -> str:
    if not math.isfinite(t[0]):
        return "–"
    return f"{fmt(t[0])} [{fmt(t[1])}, {fmt(t[2])}]" if math.isfinite(t[1]) else f"{fmt(t[0])} (no SE)"


def report(trials: dict[str, list[Trial]], left_out: Counter, files: Sequence[str]) -> str:
    """The report from each objective's trials (`trials`: {objective: its study's trials})."""
    picks = {obj: pick(trials.get(obj, [])) for obj in STUDIES}
    ref = picks[REFERENCE]
    command = COMMAND + "".join(f" --runs {f}" for f in files)
    lines = ["# Goodhart's law in tuning (issue 67)", "", "Regenerate:", "", "```bash", command, "```", "",
             "Three Optuna studies, identical but for the objective they maximise (" + ", ".join(
                 f"`{s}`: `tune.objective={o}`" for o, s in STUDIES.items()) + "), each over PPO's β, steps and "
             "learning rate. Each study's pick is its trial of the best objective; its **gold regret** is the test "
             "gold of the gold-tuned pick's shipped checkpoint minus this pick's (test prompts, which no objective "
             "read). One training seed per trial: the interval is the test prompts' sampling error only (±1.96 √(se₁² "
             "+ se₂²), conservative), not the spread between seeds. Definitions: "
             "`rlhf_lab_research/goodhart_tuning.py`.", ""]
    rows = []
    for obj, study in STUDIES.items():
        p = picks[obj]
        if p is None:
            rows.append([f"`{obj}`", f"`{study}`", "0", *["–"] * 8])
            continue
        gold_regret = ("0 (the reference)" if obj == REFERENCE else
                       interval(regret(ref, p)) if ref is not None else "– (no gold-tuned pick)")
        test_gold = (p.test_gold, p.test_gold - Z * p.test_se, p.test_gold + Z * p.test_se)
        rows.append([f"`{obj}`", f"`{study}`", str(len(trials[obj])), *(number(p.params[k]) for k in PARAMS),
                     fmt(p.objective, 4), str(p.step), fmt(p.kl, 2), interval(test_gold), gold_regret])
    lines += table(("objective", "study", "trials", "β", "steps", "lr", "best objective", "ships step", "KL there",
                    "test gold there", "gold regret vs the gold pick"), rows)
    lines += ["", "How well each objective ranks its own trials by the test gold of the checkpoint it ships "
              "(Spearman ρ over the study's trials; the proxy's trials are valued at their last checkpoint):", ""]
    lines += table(("objective", "trials", "ρ(objective, test gold)"),
                   [[f"`{obj}`", str(len(trials.get(obj, []))), fmt(rank_agreement(trials.get(obj, [])))]
                    for obj in STUDIES])
    lines += ["", "Left out: " + (", ".join(f"{why} ({study}: {n})" for (why, study), n in sorted(left_out.items()))
                                  or "none") + "."]
    return "\n".join(lines) + "\n"


def load(files: Sequence[str]) -> tuple[dict[str, list[Trial]], Counter]:
    """({objective: its study's trials that enter, by run id}, Counter of (why left out, study))."""
    by_study = {study: obj for obj, study in STUDIES.items()}
    trials: dict[str, list[Trial]] = {obj: [] for obj in STUDIES}
    left_out: Counter = Counter()
    for study, r in read_runs(files):
        if study not in by_study:
            continue
        why = exclusion(r)
        if why is None:
            trials[by_study[study]].append(trial(r))
        else:
            left_out[(why, study)] += 1
    return {obj: sorted(ts, key=lambda t: t.run_id) for obj, ts in trials.items()}, left_out


def store_runs(path: Path | str, uri: str | None = None, load_runs=load_study) -> Path:
    """Keeps the policy runs of the three studies in the store (`uri`: as ``rlhf-lab-report``'s), with the histories
    of :data:`HISTORY` and their metrics (``tune/objective``, ``tune/step``), in the runs file `path`."""
    return write_snapshot(path, {study: load_runs(study, uri, stages=POLICY, history_keys=HISTORY)[0]
                                 for study in STUDIES.values()})


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--store", action="store_true", help=f"read the studies from the store into {RUNS_OUT}")
    source.add_argument("--runs", action="append", help="a runs file of the three studies (repeatable)")
    parser.add_argument("--uri", default=None, help="the tracking store (default: as rlhf-lab-report's)")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    if args.store:
        args.runs = [str(store_runs(RUNS_OUT, args.uri))]
    try:
        trials, left_out = load(args.runs)
    except SnapshotError as err:
        print(f"goodhart_tuning: {err}: keep the studies' runs first with --store", file=sys.stderr)
        raise SystemExit(2) from None
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(report(trials, left_out, args.runs), encoding="utf-8")
    print(args.out)


if __name__ == "__main__":
    main()
