"""The algorithm frontier at matched constraints (issue 69): tune on some seeds, compare at equal KL on others.

Two studies, scored here by rules written before either has a run (reports/PREREGISTERED.md records this file):

**Phase 1, ``algo_frontier_matched_tune``** (sweeps/sweep/algo_frontier_matched_tune.yaml): PPO, GRPO and RLOO at
matched samples, prompts per step and updates, each over algo.lr × kl.beta on seeds 20-22. Each run's curve is its eval
gold against its eval √KL (``eval/gold_reward``, √``eval/kl``, at every evaluation; :func:`curve`), and its value the
gold where √KL first reaches :data:`D_STAR` (:func:`gold_at`: linear between the two evaluations around it, never beyond
the curve). Each algorithm's setting (:func:`choose`) is the one whose runs FINISHED and reached d* on every tuning seed
with the highest mean value (ties: the smaller lr, then the smaller β). ``--phase tune`` writes
``reports/algo_frontier_matched_tune/`` and phase 2's study files (:func:`phase2_files`): one option of
``sweeps/frontier_matched/`` per chosen algorithm and ``sweeps/sweep/algo_frontier_matched.yaml``, to be committed (and
recorded) before any phase-2 run. From its runs file alone, ``rlhf-lab-report algo_frontier_matched_tune --no-store
--runs reports/algo_frontier_matched_tune/runs.json.gz`` regenerates the report (and writes no study file).

**Phase 2, ``algo_frontier_matched``**: each algorithm's chosen setting on seeds 30-39 (paired: a seed is one SFT policy
and one RM), every evaluation also on the held-out test prompts (``eval.test_each_eval``). Per run, the *test* gold
where its eval √KL first reaches d ∈ :data:`D_GRID` (x measured on the eval prompts, y on the test prompts: no selection
on the y's noise). Primary: at d* = 1.5, the paired differences of the pairs in :data:`PAIRS` over the seeds where both
runs reached it, each with its two-sided 95 % t interval and p; Holm over the three. A pair is ordered when its
Holm-adjusted p < 0.05; otherwise the report says about how many seeds a one-sided t test at 0.025 / 3 (Holm's first
step) would need for 80 % power at the measured difference and sd. One look, after all 30 jobs FINISHED (a failed job
rerun once with its seed; a run that fails twice, or never reaches d, is missing from the pairs it is in, and counted);
never extended, so the fixed-n intervals keep their level. Shown: each algorithm's mean [t 95 %] at every d of
:data:`D_GRID`, its final test gold and final KL.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from rlhf_lab.analysis.markdown import fmt, fmt_ci, md_table
from rlhf_lab.analysis.study_runs import RunData
from rlhf_lab.runs.process import write_atomic
from rlhf_lab_research.stats import Effect, holm, t_effect, units_for_power
from rlhf_lab_research.studies import write_rendered_report

TUNE = "algo_frontier_matched_tune"
STUDY = "algo_frontier_matched"
ALGOS = ("ppo", "grpo", "rloo")
TUNE_SEEDS = ("20", "21", "22")
MEASURE_SEEDS = tuple(str(s) for s in range(30, 40))
D_STAR = 1.5                    # √nats (KL 2.25 nats): where the tuning chooses and the primary comparison is made
D_GRID = (1.0, 1.5, 2.0)        # √nats: phase 2's table
PAIRS = (("ppo", "grpo"), ("ppo", "rloo"), ("rloo", "grpo"))
ALPHA = 0.05                    # two-sided, Holm over PAIRS
POWER = 0.8
KEYS = ("eval/gold_reward", "eval/kl", "test/gold_reward", "eval/proxy_reward")

Setting = tuple[str, float, float]  # (algorithm, lr, β)


def curve(r: RunData, gold_key: str = "eval/gold_reward") -> list[tuple[float, float]]:
    """(√eval/kl, gold) at the run's evaluations that logged both, in step order (a negative KL estimate as 0)."""
    kl = dict(r.series("eval/kl"))
    return [(math.sqrt(max(kl[s], 0.0)), g) for s, g in r.series(gold_key)
            if s in kl and math.isfinite(kl[s]) and math.isfinite(g)]


def gold_at(points: Sequence[tuple[float, float]], d: float) -> float:
    """The gold where the curve's √KL first reaches `d`: at the first evaluation j with d_j ≥ d, linear in √KL
    between evaluation j − 1 and j (the value at j when j is the first evaluation or d_{j−1} = d_j); NaN when no
    evaluation reaches `d` (never extrapolated)."""
    for j, (dj, gj) in enumerate(points):
        if dj >= d:
            if j == 0:
                return float(gj)
            d0, g0 = points[j - 1]
            return float(gj) if dj == d0 else float(g0 + (gj - g0) * (d - d0) / (dj - d0))
    return float("nan")


def setting_of(r: RunData) -> Setting:
    return (r.stage, r.fnum("algo.lr"), r.fnum("kl.beta"))


def tune_table(runs: Sequence[RunData]) -> dict[Setting, dict[str, float]]:
    """{setting: {seed: eval gold at d*}} over the FINISHED runs of the tuning seeds (a run that never reached d*:
    NaN; a job run twice: the later run in `runs`' order)."""
    out: dict[Setting, dict[str, float]] = {}
    for r in runs:
        if r.status == "FINISHED" and r.seed in TUNE_SEEDS and r.stage in ALGOS:
            out.setdefault(setting_of(r), {})[r.seed] = gold_at(curve(r), D_STAR)
    return out


def eligible(values: Mapping[str, float]) -> bool:
    """Every tuning seed FINISHED and reached d*."""
    return set(values) == set(TUNE_SEEDS) and all(math.isfinite(v) for v in values.values())


def choose(table: Mapping[Setting, Mapping[str, float]]) -> dict[str, Setting | None]:
    """Each algorithm's eligible setting with the highest mean value (ties: the smaller lr, then the smaller β);
    None when it has none."""
    out: dict[str, Setting | None] = {}
    for algo in ALGOS:
        ok = [(s, float(np.mean(list(v.values())))) for s, v in table.items() if s[0] == algo and eligible(v)]
        out[algo] = min(ok, key=lambda sv: (-sv[1], sv[0][1], sv[0][2]))[0] if ok else None
    return out


def number(x: float) -> str:
    """A setting's lr or β as its option file and the tune report write it (repr of the float: 0.0003, 0.01)."""
    return repr(float(x))


def phase2_files(chosen: Mapping[str, Setting | None]) -> dict[str, str]:
    """{path relative to the repository: text} of phase 2's study: ``sweeps/frontier_matched/<algo>.yaml`` for each
    algorithm with a chosen setting and ``sweeps/sweep/algo_frontier_matched.yaml``, whose settings are the tuning
    study's but for the seeds and the test prompts at every evaluation."""
    files, arms = {}, [a for a in ALGOS if chosen.get(a)]
    for algo in arms:
        _, lr, beta = chosen[algo]  # type: ignore[misc]
        files[f"sweeps/frontier_matched/{algo}.yaml"] = (
            "# @package _global_\n"
            f"# The {algo} arm of sweep=algo_frontier_matched: the setting the tuning phase chose (algo.lr and kl.beta "
            "with the\n# highest mean eval gold at sqrt(KL) 1.5 on seeds 20-22; reports/algo_frontier_matched_tune/). "
            "Written by\n# python -m rlhf_lab_research.studies.frontier_matched --phase tune; not edited by hand.\n"
            "defaults:\n"
            f"  - override /algo: {algo}\n"
            "  - _self_\n\n"
            f"algo:\n  lr: {number(lr)}\nkl:\n  beta: {number(beta)}\n")
    files["sweeps/sweep/algo_frontier_matched.yaml"] = (
        "# @package _global_\n"
        "# Study algo_frontier_matched: phase 2 of the frontier at matched constraints (issue 69;\n"
        "# reports/PREREGISTERED.md, \"Frontier at matched constraints\"). Each algorithm at the setting its tuning\n"
        "# phase chose (sweeps/frontier_matched/, written by rlhf_lab_research/studies/frontier_matched.py from\n"
        "# reports/algo_frontier_matched_tune/), on seeds 30-39, which the tuning never used; the tuning study's\n"
        "# matched settings otherwise (sweeps/sweep/algo_frontier_matched_tune.yaml), and every evaluation also\n"
        "# on the held-out test prompts. Scored once, after all its jobs FINISHED: test gold where eval sqrt(KL)\n"
        "# first reaches 1, 1.5 and 2; the paired differences at 1.5, Holm over the three pairs.\n"
        "#\n"
        "#   rlhf-lab -m sweep=algo_frontier_matched hydra/launcher=parallel skip_finished=true\n"
        "#   python -m rlhf_lab_research.studies.frontier_matched --store --phase measure\n"
        f"study: {STUDY}\n\n"
        "defaults:\n  - override /kl: fixed\n  - _self_\n\n"
        "algo:\n  steps: 60\n  batch_size: 64\n  samples_per_prompt: 4\n  ppo_epochs: 4\n  num_minibatches: 4\n"
        "eval:\n  schedule: kl\n  sqrt_kl_spacing: 0.5\n  n_points: 12\n  test_each_eval: true\n"
        "reward_model:\n  seed: ${seed}\n\n"
        "hydra:\n  sweeper:\n    params:\n"
        f"      seed: {','.join(MEASURE_SEEDS)}\n"
        f"      +frontier_matched: {','.join(arms)}\n")
    return files


# -- phase 2 ------------------------------------------------------------------------------------------------------

def measure_table(runs: Sequence[RunData]) -> dict[str, dict[str, dict[float, float]]]:
    """{algo: {seed: {d: test gold where eval √KL first reaches d}}} over the FINISHED runs of the measured seeds."""
    out: dict[str, dict[str, dict[float, float]]] = {}
    for r in runs:
        if r.status == "FINISHED" and r.seed in MEASURE_SEEDS and r.stage in ALGOS:
            pts = curve(r, "test/gold_reward")
            out.setdefault(r.stage, {})[r.seed] = {d: gold_at(pts, d) for d in D_GRID}
    return out


def two_sided_p(e: Effect) -> float:
    if e.n < 2:
        return float("nan")
    return min(1.0, 2 * min(e.p_value(1), e.p_value(-1)))


def pair_effects(table: Mapping[str, Mapping[str, Mapping[float, float]]], d: float = D_STAR
                 ) -> list[tuple[tuple[str, str], Effect, float, float]]:
    """For each pair (a, b) of :data:`PAIRS`: (pair, the paired t effect of a − b at `d` over the seeds where both
    reached it, two-sided p, Holm-adjusted p over the pairs)."""
    effects = []
    for a, b in PAIRS:
        ta, tb = table.get(a, {}), table.get(b, {})
        diffs = [ta[s][d] - tb[s][d] for s in sorted(set(ta) & set(tb), key=int)
                 if math.isfinite(ta[s][d]) and math.isfinite(tb[s][d])]
        effects.append(((a, b), t_effect(diffs, method="paired t over seeds")))
    ps = [two_sided_p(e) for _, e in effects]
    return [(pair, e, p, q) for (pair, e), p, q in zip(effects, ps, holm(ps))]


def pair_verdict(pair: tuple[str, str], e: Effect, q: float) -> str:
    """'a above b' / 'b above a' when Holm's p < ALPHA; else 'not ordered' with the seeds a one-sided t test at
    ALPHA / 2 / len(PAIRS) would need for 80 % power at the measured difference."""
    a, b = pair
    if e.n < 2 or not math.isfinite(q):
        return f"no comparison ({e.n} paired seeds)"
    if q < ALPHA:
        return f"**{a} above {b}**" if e.estimate > 0 else f"**{b} above {a}**"
    n = units_for_power(abs(e.estimate), e.sd, alpha=ALPHA / 2 / len(PAIRS), power=POWER)
    return "not ordered" + (f"; about {n} seeds would decide it" if n else "; no difference to power")


# -- reports --------------------------------------------------------------------------------------------------------

def render_tune(runs: Sequence[RunData], commands: Sequence[str]) -> list[str]:
    table = tune_table(runs)
    chosen = choose(table)
    rows = []
    for s in sorted(table, key=lambda s: (ALGOS.index(s[0]), s[1], s[2])):
        v = table[s]
        per = ", ".join(f"{k}: {fmt(v[k])}" if k in v else f"{k}: not finished" for k in TUNE_SEEDS)
        rows.append([s[0], number(s[1]), number(s[2]), per,
                     fmt(float(np.mean(list(v.values())))) if eligible(v) else "not eligible",
                     "**chosen**" if chosen.get(s[0]) == s else ""])
    picks = "; ".join(f"{a}: lr {number(c[1])}, β {number(c[2])}" if c else f"{a}: none eligible"
                      for a, c in chosen.items())
    lines = [f"# Study `{TUNE}`: each algorithm's setting for the frontier at matched constraints", "",
             f"Runs: {sum(r.status == 'FINISHED' for r in runs)} FINISHED of {len(runs)} "
             f"(seeds {', '.join(TUNE_SEEDS)}).", "",
             f"Each run's value is its eval gold where its eval √KL first reaches d* = {D_STAR} (KL "
             f"{fmt(D_STAR ** 2, 2)} nats), linear between the two evaluations around it; a setting is eligible when "
             "every tuning seed FINISHED and reached d*; each algorithm's setting is the eligible one with the "
             "highest mean (rules fixed before the runs: reports/PREREGISTERED.md). Chosen: " + picks + ".", "",
             md_table(["algo", "lr", "β", "eval gold at d* per seed", "mean", ""], rows), "",
             "Phase 2 (`algo_frontier_matched`) runs the chosen settings on seeds "
             f"{MEASURE_SEEDS[0]}-{MEASURE_SEEDS[-1]}; its files are written with this report.", "",
             "Reproduce:", "", "```bash", *commands, "```"]
    return lines


def render_measure(runs: Sequence[RunData], commands: Sequence[str]) -> list[str]:
    table = measure_table(runs)
    finals: dict[str, list[tuple[float, float]]] = {}
    for r in runs:
        if r.status == "FINISHED" and r.seed in MEASURE_SEEDS and r.stage in ALGOS:
            finals.setdefault(r.stage, []).append((r.last("test/gold_reward"), r.last("eval/kl")))
    rows = []
    for algo in ALGOS:
        t = table.get(algo, {})
        cells = []
        for d in D_GRID:
            vals = [v[d] for v in t.values() if math.isfinite(v[d])]
            of = f"({len(vals)} of {len(t)})"
            cells.append(f"{fmt_ci(vals)} {of}" if len(vals) >= 2 else f"– {of}")
        f = finals.get(algo, [])
        rows.append([algo, len(t), *cells, fmt_ci([g for g, _ in f]), fmt_ci([k for _, k in f])])
    pairs = pair_effects(table)
    prow = [[f"{a} − {b}", e.n, f"{fmt(e.estimate)} [{fmt(e.lo)}, {fmt(e.hi)}]" if e.n >= 2 else "–",
             fmt(p, 3), fmt(q, 3), pair_verdict((a, b), e, q)] for (a, b), e, p, q in pairs]
    lines = [f"# Study `{STUDY}`: the algorithm frontier at matched constraints", "",
             f"Runs: {sum(r.status == 'FINISHED' for r in runs)} FINISHED of {len(runs)} "
             f"(seeds {MEASURE_SEEDS[0]}-{MEASURE_SEEDS[-1]}; each algorithm at the setting `{TUNE}` chose on other "
             "seeds).", "",
             "**Primary** (fixed before the runs: reports/PREREGISTERED.md): test gold where each run's eval √KL first "
             f"reaches {D_STAR}, paired by seed (one SFT policy and one RM per seed); two-sided 95 % t intervals, "
             f"Holm over the {len(PAIRS)} pairs; one look, never extended.", "",
             md_table(["pair", "seeds", "difference [95% t]", "p", "Holm p", "verdict"], prow), "",
             "Test gold at each √KL (mean [95% t] over the seeds that reached it, of the seeds run), final test gold "
             "and final eval KL:", "",
             md_table(["algo", "seeds", *(f"√KL {d}" for d in D_GRID), "final test gold", "final KL (nats)"], rows),
             "", "Reproduce:", "", "```bash", *commands, "```"]
    return lines


def write_tune_report(out_dir: Path | str = "reports", uri: str | None = None, runs_files: Sequence[Path | str] = (),
                      use_store: bool = True, require_runs: bool = False, root: Path | str = ".") -> Path:
    """``<out_dir>/algo_frontier_matched_tune/README.md`` from phase 1's runs (store and `runs_files`); read from a
    store (the look), its runs kept beside it in ``runs.json.gz`` and phase 2's files (:func:`phase2_files`) written
    under `root`."""
    path, runs = write_rendered_report(TUNE, render_tune, out_dir, uri, runs_files, use_store, require_runs,
                                       stages=ALGOS, history_keys=KEYS)
    if use_store and runs:
        for rel, text in phase2_files(choose(tune_table(runs))).items():
            p = Path(root) / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(p, text)
    return path


def write_measure_report(out_dir: Path | str = "reports", uri: str | None = None, runs_files: Sequence[Path | str] = (),
                         use_store: bool = True, require_runs: bool = False) -> Path:
    """``<out_dir>/algo_frontier_matched/README.md`` from phase 2's runs (store and `runs_files`); read from a store,
    its runs kept beside it in ``runs.json.gz``."""
    return write_rendered_report(STUDY, render_measure, out_dir, uri, runs_files, use_store, require_runs,
                                 stages=ALGOS, history_keys=KEYS)[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlhf_lab_research.studies.frontier_matched", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase", choices=("tune", "measure"), required=True)
    p.add_argument("--store", action="store_true", help="read the study's runs from the tracking store")
    p.add_argument("--uri", default=None)
    p.add_argument("--runs", action="append", default=[], help="a runs file (repeatable)")
    p.add_argument("--out", default="reports")
    a = p.parse_args(argv)
    if not a.store and not a.runs:
        p.error("give --store or --runs FILE")
    try:
        write = write_tune_report if a.phase == "tune" else write_measure_report
        print(f"wrote {write(a.out, a.uri, a.runs, use_store=a.store, require_runs=True)}")
    except ValueError as err:
        print(f"frontier_matched: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
