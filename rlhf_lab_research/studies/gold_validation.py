"""``reports/gold_rm_validation/README.md``: gold-RM mode validated on the world, where both golds are known.

The study (sweeps/sweep/gold_rm_validation.yaml) runs PPO with ``gold=rm_world``: the gold is a large RM trained on
the formula's labels, the proxy RM learns from the pairs it labels (through the length-biased labeler), and every
evaluation measures the same samples twice, ``eval/gold_reward`` (the gold RM) and ``eval/formula_gold_reward``
(the world's formula; docs/metrics.md). The report asks whether the gold RM tells the same story as the formula:

1. **rank agreement**: Spearman ρ between the two over a run's evaluation points; per run, their mean (Fisher z,
   Student-t interval over runs), and pooled over every evaluation point of every run (percentile bootstrap over
   runs, the unit that is independent);
2. **hacking curves**: both measures at every evaluation, mean ± standard error over seeds, for β = 0, the fixed
   β = 0.1 and adaptive KL;
3. **verdicts**: the claims C1 and C4 judged by the claims registry's own effects and verdict rule
   (:mod:`~rlhf_lab_research.claims_registry`, :func:`~rlhf_lab_research.verdicts.judge`) on these runs, once with each
   measure as the gold (:func:`as_measure`), and whether the two verdicts agree, claim by claim and part by part.

The two measures are in different units (the formula's gold units; the gold RM's normalised score, mean 0 and sd 1
on SFT samples), so levels and the registry's margins (set for the formula) are not comparable; ranks and verdict
signs are. Only FINISHED PPO runs enter; nothing is filled in for a study without runs.

This report keeps the analysis its runs were made under (issue 42's rule, :data:`~rlhf_lab_research.anytime.EARLIER`:
a fixed-n t interval, the unchecked t sequence where seeds were added after looking), so the committed report
regenerates as it was. Under the claims report's rule of issue 69 the Fisher z values of its β = 0 runs are refused
as skewed (no interval, so the bar is not met) and C1's effects here likewise; the replicated design
(sweeps/sweep/gold_rm_replication.yaml, reports/PREREGISTERED.md) is to be scored with the sequences from the first
look on ρ itself, which is bounded.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Sequence

import numpy as np

from rlhf_lab_research.anytime import (ANYTIME, EARLIER, EARLIER_FOOTNOTE as FOOTNOTE, MARK, added_run_ids,
                                      added_seeds, anytime_effect, includes_added, is_anytime)
from rlhf_lab_research.verdicts import ClaimResult, counts, judge
from rlhf_lab_research.effects import Arm, spearman
from rlhf_lab.analysis.markdown import fmt, md_table
from rlhf_lab.analysis.plots import pyplot
from rlhf_lab.analysis.quantities import EVAL_GOLD, final_gold, gold_drop
from rlhf_lab_research.claim_quantities import CLAIM_HISTORY_KEYS
from rlhf_lab_research.designs import BETA0, fixed
from rlhf_lab_research.claims_registry import BY_ID
from rlhf_lab.analysis.report_files import check_folder, no_runs
from rlhf_lab.analysis.study_runs import RunData, groups, label, natural_key, store_uri
from rlhf_lab.analysis.stats import mean_se
from rlhf_lab_research.stats import Effect, bootstrap_ci, t_effect
from rlhf_lab.analysis.study_report import RUNS_FILE, gather_study_runs, read_from, report_flags, write_runs_file
from rlhf_lab_research.studies import not_run_page

STUDY = "gold_rm_validation"
FORMULA, RM = "formula", "rm"
MEASURES = {FORMULA: "the world's formula (`eval/formula_gold_reward`)", RM: "the gold RM (`eval/gold_reward`)"}
SHORT = {FORMULA: "formula (gold units)", RM: "gold RM (normalised score)"}
FORMULA_EVAL = "eval/formula_gold_reward"
CLAIMS = ("C1", "C4")
ARMS = (BETA0, fixed(0.1), fixed(1), Arm("adaptive KL", {"kl.name": "adaptive"}))
N_BOOT = 2000
# the bar a gold RM must clear to serve a Gao-style study, stated before gold_recipes' runs (issue 43): at β = 0, the
# mean per-run ρ(formula, gold RM) at least BAR_MEAN with its interval's lower end at least BAR_LOW, over BAR_RUNS runs
BAR_MEAN, BAR_LOW, BAR_RUNS = 0.8, 0.5, 5


def formula_name(key: str) -> str:
    """The name the formula has beside a gold RM: ``eval/gold_reward_a`` -> ``eval/formula_gold_reward_a``."""
    prefix, _, name = key.partition("/")
    return f"{prefix}/formula_{name}" if name.startswith("gold") else key


def is_gold(key: str) -> bool:
    return key.partition("/")[2].startswith("gold")


def is_formula(key: str) -> bool:
    return key.partition("/")[2].startswith("formula_gold")


HISTORY_KEYS = tuple(dict.fromkeys(CLAIM_HISTORY_KEYS + tuple(formula_name(k) for k in CLAIM_HISTORY_KEYS if is_gold(k))))


def as_measure(r: RunData, measure: str) -> RunData:
    """The run as if `measure` were its gold: ``rm`` keeps its gold metrics (the gold RM's) and drops the formula's;
    ``formula`` puts the formula's metrics under the gold names (``eval/formula_gold_reward_a`` becomes
    ``eval/gold_reward_a``, ...) and drops the gold RM's, so a gold metric the formula did not log is missing, never
    the RM's. Everything else (proxy, KL, config) is the run's."""
    if measure not in MEASURES:
        raise ValueError(f"measure {measure!r}; choose one of {', '.join(MEASURES)}")

    def remap(d: dict) -> dict:
        out = {k: v for k, v in d.items() if not is_formula(k) and not (measure == FORMULA and is_gold(k))}
        if measure == FORMULA:
            out.update({k.replace("/formula_gold", "/gold", 1): v for k, v in d.items() if is_formula(k)})
        return out

    return dataclasses.replace(r, metrics=remap(r.metrics), history=remap(r.history))


# -- rank agreement ---------------------------------------------------------------------------------------------


def paired_points(r: RunData) -> list[tuple[float, float]]:
    """(formula, gold RM) at each evaluation where the run logged both, finite."""
    rm = dict(r.series(EVAL_GOLD))
    return [(f, rm[s]) for s, f in r.series(FORMULA_EVAL) if s in rm and math.isfinite(f) and math.isfinite(rm[s])]


def run_rho(r: RunData) -> float:
    """Spearman ρ between the formula and the gold RM over one run's evaluation points (NaN with fewer than 3)."""
    pts = paired_points(r)
    return spearman([p[0] for p in pts], [p[1] for p in pts])


def pooled_rho(runs: Sequence[RunData]) -> float:
    """Spearman ρ over the evaluation points of all the runs together."""
    pts = [p for r in runs for p in paired_points(r)]
    return spearman([p[0] for p in pts], [p[1] for p in pts])


@dataclasses.dataclass(frozen=True)
class Agreement:
    """Rank agreement of the two golds: per run, the mean over runs (Fisher z) and pooled over all points."""

    per_run: dict[str, float]        # run id -> ρ over its evaluation points
    mean: Effect                     # tanh of the mean Fisher z over runs, with its t interval (back-transformed)
    pooled: Effect                   # ρ over all points, percentile bootstrap interval over runs
    n_points: int


def fisher_mean(rhos: Sequence[float], level: float = 0.95, anytime: bool = False) -> Effect:
    """The mean of per-run correlations on Fisher's z = atanh(ρ) scale (|ρ| capped at 0.999999), with the Student-t
    interval over runs, mapped back with tanh (n < 2: no interval); `anytime`: runs were added after looking, so the
    anytime-valid interval of the same z values instead (:func:`~rlhf_lab_research.anytime.anytime_effect`)."""
    z = [math.atanh(max(-0.999999, min(0.999999, x))) for x in rhos if math.isfinite(x)]
    e = anytime_effect(t_effect(z, level), level, check_skew=False) if anytime else t_effect(z, level)
    back = lambda v: math.tanh(v) if math.isfinite(v) else float("nan")  # noqa: E731
    return Effect(back(e.estimate), back(e.lo), back(e.hi), e.n,
                  f"{ANYTIME} Fisher z, t over runs" if anytime else "Fisher z, t over runs", level)


def rho_mean(runs: Sequence[RunData], late: frozenset[str] = frozenset()) -> Effect:
    """:func:`fisher_mean` of the runs' ρ; anytime-valid when one of them is a seed added after looking (its run id
    in `late`: :func:`~rlhf_lab_research.anytime.includes_added`)."""
    return fisher_mean([run_rho(r) for r in runs], anytime=includes_added(runs, late))


def rank_agreement(runs: Sequence[RunData], n_boot: int = N_BOOT, seed: int = 0,
                   late: frozenset[str] = frozenset()) -> Agreement:
    """:class:`Agreement` of the runs; the pooled interval resamples whole runs (their points are not independent)."""
    per_run = {r.run_id: run_rho(r) for r in runs}
    rs = list(runs)

    def stat(idx) -> float:
        return pooled_rho([rs[int(i)] for i in idx])

    nan = float("nan")
    est, lo, hi, n = bootstrap_ci(np.arange(len(rs)), n_boot=n_boot, seed=seed, stat=stat) if rs else (nan, nan, nan, 0)
    pooled = Effect(est, lo, hi, n, "percentile bootstrap over runs")
    mean = fisher_mean(list(per_run.values()), anytime=includes_added(rs, late))  # each run's ρ once
    return Agreement(per_run, mean, pooled, sum(len(paired_points(r)) for r in rs))


def meets_bar(e: Effect) -> bool:
    """Whether a mean per-run ρ (:func:`fisher_mean`) clears the bar (:data:`BAR_MEAN`, :data:`BAR_LOW`,
    :data:`BAR_RUNS`)."""
    return math.isfinite(e.lo) and e.estimate >= BAR_MEAN and e.lo >= BAR_LOW and e.n >= BAR_RUNS


def bar_line(at0: Effect) -> str:
    """What the mean per-run ρ at β = 0 says against the bar stated before the runs."""
    verdict = "**meets the bar**" if meets_bar(at0) else "**does not meet the bar**"
    return (f"The primary effect, stated before the runs: at β = 0 the mean per-run ρ, {ci_cell(at0)}; the bar: a mean "
            f"≥ {BAR_MEAN} with the lower end ≥ {BAR_LOW}, over ≥ {BAR_RUNS} finished runs: {verdict}.")


def rho_by_setting(runs: Sequence[RunData], late: frozenset[str] = frozenset()) -> dict[str, Effect]:
    """{setting: the Fisher-z mean of its runs' ρ}: where the policy stays near its reference the two golds may
    agree while they part where it is pushed far from it (hacking), which the pooled ρ mixes."""
    return {name: rho_mean(members, late) for name, members in groups(runs).items()}


# -- curves ---------------------------------------------------------------------------------------------------------


def mean_curve(runs: Sequence[RunData], key: str) -> list[tuple[int, float, float, int]]:
    """(step, mean, se, n) over the runs at every evaluation step any of them logged `key`."""
    by_step: dict[int, list[float]] = {}
    for r in runs:
        for s, v in r.series(key):
            by_step.setdefault(s, []).append(v)
    return [(s, *mean_se(v)) for s, v in sorted(by_step.items())]


def arm_curves(runs: Sequence[RunData]) -> dict[str, dict[str, list[tuple[int, float, float, int]]]]:
    """{arm label: {measure: curve}} for the arms that have runs."""
    out = {}
    for arm in ARMS:
        rs, name = arm.select(runs)
        if rs:
            out[name] = {FORMULA: mean_curve(rs, FORMULA_EVAL), RM: mean_curve(rs, EVAL_GOLD)}
    return out


def arm_points(runs: Sequence[RunData]) -> dict[str, list[tuple[float, float]]]:
    """{arm label: every (formula, gold RM) evaluation point of its runs}."""
    out = {}
    for arm in ARMS:
        rs, name = arm.select(runs)
        if rs:
            out[name] = [p for r in rs for p in paired_points(r)]
    return out


# -- verdicts ---------------------------------------------------------------------------------------------------


def verdicts(runs: Sequence[RunData], claim_ids: Sequence[str] = CLAIMS) -> dict[str, dict[str, ClaimResult]]:
    """{claim: {measure: its result}}: each claim of the registry judged on the runs (as the study its effects
    read) with each measure as the gold, by the registry's effects and the claims report's verdict rule."""
    out: dict[str, dict[str, ClaimResult]] = {}
    for cid in claim_ids:
        claim = BY_ID[cid]
        out[cid] = {}
        for m in MEASURES:
            view = [as_measure(r, m) for r in runs]
            studies = {s: [r for r in view if counts(r)] for s in claim.studies + claim.also}
            present = {s: len(view) for s in claim.studies + claim.also}
            out[cid][m] = judge(claim, studies, present, rule=EARLIER)
    return out


def agreement_of(results: dict[str, ClaimResult]) -> tuple[bool, list[tuple[str, str, str, bool]]]:
    """(the claim's verdicts agree, [(part, formula verdict, RM verdict, agree)] for the judged parts)."""
    f, g = results[FORMULA], results[RM]
    rows = [(pf.label, pf.verdict or "shown", pg.verdict or "shown", pf.verdict == pg.verdict)
            for pf, pg in zip(f.parts, g.parts)]
    return f.verdict == g.verdict, rows


# -- the report -------------------------------------------------------------------------------------------------


def ci_cell(e: Effect, digits: int = 2) -> str:
    if not math.isfinite(e.estimate):
        return "–"
    ci = f" [{fmt(e.lo, digits)}, {fmt(e.hi, digits)}]" if math.isfinite(e.lo) and math.isfinite(e.hi) else ", no CI"
    return f"{fmt(e.estimate, digits)}{ci}{MARK if is_anytime(e) else ''} (n = {e.n})"


def run_rows(runs: Sequence[RunData]) -> list[list]:
    rows = []
    for r in runs:
        f, g = as_measure(r, FORMULA), as_measure(r, RM)
        rows.append([f"`{label(r)}`", r.seed, len(paired_points(r)), fmt(run_rho(r), 2), fmt(final_gold(f)),
                     fmt(final_gold(g)), fmt(gold_drop(f)), fmt(gold_drop(g)), f"`{r.run_id}`"])
    return rows


def curve_rows(curves: dict) -> list[list]:
    rows = []
    for arm, by in curves.items():
        steps = sorted({s for c in by.values() for s, *_ in c})
        cells = {m: {s: (mu, se, n) for s, mu, se, n in c} for m, c in by.items()}
        for s in steps:
            row = [arm, s]
            for m in MEASURES:
                mu, se, n = cells[m].get(s, (float("nan"), float("nan"), 0))
                row.append("–" if n == 0 else fmt(mu) + (f" ± {fmt(se)}" if n > 1 else "") + f" ({n})")
            rows.append(row)
    return rows


def verdict_lines(res: dict[str, dict[str, ClaimResult]]) -> list[str]:
    lines = [md_table(["claim", "verdict with the formula as gold", "verdict with the gold RM as gold", "agree"],
                      [[cid, f"**{by[FORMULA].verdict}**", f"**{by[RM].verdict}**",
                        "yes" if agreement_of(by)[0] else "**no**"] for cid, by in res.items()]), ""]
    for cid, by in res.items():
        lines += [f"### {cid}: {BY_ID[cid].statement}", ""]
        for m, desc in MEASURES.items():
            lines.append(f"- gold = {desc}: **{by[m].verdict}**: {by[m].reason}.")
        lines.append("")
        rows = []
        for pf, pg in zip(by[FORMULA].parts, by[RM].parts):
            eff = lambda p: (f"{fmt(p.measured.effect.estimate)} [{fmt(p.measured.effect.lo)}, "  # noqa: E731
                             f"{fmt(p.measured.effect.hi)}]" if p.measured.effect is not None else
                             f"– ({p.measured.missing})")
            rows.append([pf.part.role, pf.label, eff(pf), pf.verdict or "shown", eff(pg), pg.verdict or "shown",
                         "yes" if pf.verdict == pg.verdict else "**no**"])
        lines += [md_table(["role", "part", "formula: estimate [95% CI]", "formula", "gold RM: estimate [95% CI]",
                            "gold RM", "agree"], rows), ""]
    return lines


def plot_gold_curves(curves: dict, measures: dict, path: Path) -> None:
    """The gold-RM validation's hacking curves: one column per arm, one row per measure (the formula, the gold RM);
    `curves` is {arm: {measure: [(step, mean, se, n)]}}, drawn as mean ± se over seeds against the PPO step;
    `measures` is {measure: its label}."""
    plt = pyplot()
    arms = list(curves)
    fig, axes = plt.subplots(len(measures), len(arms), figsize=(4.2 * len(arms), 3.4 * len(measures)), squeeze=False,
                             sharex=True)
    for j, arm in enumerate(arms):
        for i, (m, desc) in enumerate(measures.items()):
            ax = axes[i][j]
            pts = [(s, mu, se if np.isfinite(se) else 0.0) for s, mu, se, n in curves[arm].get(m, []) if n]
            if pts:
                x, y, e = (np.asarray(v, dtype=float) for v in zip(*pts))
                ax.plot(x, y, "o-", ms=3, color=f"C{i}")
                ax.fill_between(x, y - e, y + e, color=f"C{i}", alpha=0.25)
            ax.set_title(f"{arm}: {desc}", fontsize=9)
            ax.set_xlabel("PPO step")
            if j == 0:
                ax.set_ylabel(desc)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_gold_scatter(points: dict, path: Path) -> None:
    """Every evaluation point as (formula gold, gold RM score), one colour per arm: `points` is {arm: [(f, g)]}."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    for name, pts in points.items():
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", ms=3, alpha=0.6, label=name)
    ax.set_xlabel("formula gold (eval/formula_gold_reward)")
    ax.set_ylabel("gold RM (eval/gold_reward)")
    ax.set_title("the same evaluations, two golds")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_gold_validation_report(out_dir: Path | str = "reports", uri: str | None = None,
                                 runs_files: Sequence[Path | str] = (), use_store: bool = True,
                                 require_runs: bool = False) -> Path:
    """``<out_dir>/gold_rm_validation/README.md`` and its PNGs from the study's PPO runs in the store and in
    `runs_files` (a run in both: the store's copy), or the files alone when not `use_store` (with `require_runs`,
    none raises :class:`~rlhf_lab.analysis.report_files.ReportError` and nothing is written). Read from a store,
    the runs it read are kept beside the report in ``runs.json.gz`` (:func:`~rlhf_lab.analysis.study_report.write_runs_file`),
    so that a clone regenerates it with ``rlhf-lab-report gold_rm_validation --no-store --runs
    reports/gold_rm_validation/runs.json.gz``."""
    return write_two_gold_study(STUDY, write_report, out_dir, uri, runs_files, use_store, require_runs)


def write_two_gold_study(study: str, write, out_dir: Path | str, uri: str | None, runs_files: Sequence[Path | str],
                         use_store: bool, require_runs: bool) -> Path:
    """The report of a study whose PPO runs carry both golds: its runs (store and `runs_files`, with both golds'
    histories) through ``write(runs_all, commands, out, source, flags)`` into ``<out_dir>/<study>/``, and, read from
    a store, kept beside it in ``runs.json.gz`` (the evidence travels with the report)."""
    out = Path(out_dir) / study
    check_folder(out)
    runs_all, _, commands = gather_study_runs(study, uri, runs_files, use_store, stages=("ppo",),
                                              history_keys=HISTORY_KEYS)
    places = read_from(uri, runs_files, use_store)
    if require_runs and not runs_all:
        raise no_runs(study, " and ".join(places))
    path = write(runs_all, commands, out, " and ".join(f"`{p}`" for p in places), report_flags(runs_files, use_store))
    if use_store and runs_all:
        write_runs_file(out / RUNS_FILE, study, runs_all, commands)
    return path


def write_report(runs_all: Sequence[RunData], commands: Sequence[str], out: Path, source: str | None = None,
                 flags: str = "") -> Path:
    """The report of `runs_all` (all statuses) in folder `out`; `commands` reproduce it, `source` names where the
    runs were read (default: the default store), `flags` what ``rlhf-lab-report`` was given besides the study."""
    check_folder(out)  # never over files rlhf-lab-report did not write
    out.mkdir(parents=True, exist_ok=True)
    source = source or f"`{store_uri(None)}`"
    runs_all = sorted(runs_all, key=lambda r: (natural_key(label(r)), natural_key(r.seed)))  # store or file: one order
    lines = [f"# Study `{STUDY}`: gold-RM mode against the world's formula", "",
             "PPO with `gold=rm_world`: the gold reward is a larger same-source RM (the `a_medium` backbone) trained "
             "on the formula's labels (unbiased labeler) over pairs that cover where policies go "
             "(`conf/gold/rm_world.yaml`: 40000 pairs of SFT samples at three temperatures, degenerate variants and "
             "samples of nine cover policies, seeds 200-205 and 300-302, that hacked other proxies; the "
             "`adversarial` recipe of reports/gold_recipes, which compares recipes); it labels the proxy RM's pairs "
             "through the length-biased labeler, and every evaluation scores the same samples with the gold RM "
             "(`eval/gold_reward`, its normalised score) and with the formula (`eval/formula_gold_reward`, gold "
             "units). Does the gold RM measure the hacking the formula measures, on policies it never saw (no cover "
             "policy's seed is a validated run's)?", "",
             f"Reproduce (then `rlhf-lab-report {STUDY}`):", "", "```bash",
             *(commands or [f"rlhf-lab -m sweep={STUDY} hydra/launcher=parallel"]), "```", ""]
    runs = [r for r in runs_all if r.status == "FINISHED"]
    if not runs:
        return not_run_page(out, lines, f"no finished PPO runs with tag `rlhf_lab.study={STUDY}`", source)
    other = [r for r in runs_all if r.status != "FINISHED"]
    lines += [f"{len(runs)} finished PPO runs" + (f", {len(other)} not finished" if other else "")
              + f"; seeds {', '.join(sorted({r.seed for r in runs}, key=natural_key))}.", "",
              "The analysis is the one these runs were made under (issue 42's rule): fixed-n t intervals, and the "
              "t confidence sequence where seeds were added after looking (marked). The claims report's later rule "
              "(issue 69: every effect by a confidence sequence from its first look, skewed values refused) would "
              "refuse the Fisher z values of the β = 0 runs as skewed, so the 0.9 bar would not be met here; the "
              "replicated design (`sweeps/sweep/gold_rm_replication.yaml`, reports/PREREGISTERED.md) is to be "
              "judged by that rule, on ρ itself, which is bounded.", ""]
    late = added_run_ids({STUDY: runs})  # seeds added after looking: anytime-valid intervals where they enter
    ag = rank_agreement(runs, late=late)
    lines += ["## Rank agreement of the two golds", "",
              "Spearman ρ between `eval/formula_gold_reward` and `eval/gold_reward` over the evaluation points "
              "(the same samples scored twice).", "",
              md_table(["ρ", "estimate [95% CI]", "how"],
                       [["mean of the per-run ρ", ci_cell(ag.mean), "Fisher z = atanh ρ, Student-t over runs, back "
                         "to ρ"],
                        ["pooled over all evaluation points", ci_cell(ag.pooled),
                         f"{ag.n_points} points; percentile bootstrap over runs ({N_BOOT} resamples)"]]), "",
              "By setting (mean of its runs' ρ on Fisher's z, t interval over its seeds):", "",
              md_table(["setting", "ρ [95% CI]", "runs"],
                       [[f"`{name}`", ci_cell(e), e.n] for name, e in rho_by_setting(runs, late).items()]), "",
              bar_line(rho_mean([r for r in runs if BETA0.matches(r)], late)), "",
              *([f"{FOOTNOTE}: seeds {', '.join(map(str, added_seeds(STUDY, runs)))} of the settings that show it "
                 "were added after the report of the study's own seeds.", ""] if late else []),
              "Per run (final gold: `test/gold_reward` of each measure where logged, else its last evaluation; drop: "
              "the split-half drop from the peak, `eval/*gold_reward_a|_b`, as claim C1 measures it):", "",
              md_table(["setting", "seed", "points", "ρ", "final formula", "final gold RM", "drop formula",
                        "drop gold RM", "run"], run_rows(runs)), ""]
    curves = arm_curves(runs)
    if curves:
        plot_gold_curves(curves, SHORT, out / "hacking_curves.png")
        plot_gold_scatter(arm_points(runs), out / "formula_vs_gold_rm.png")
        lines += ["## Hacking curves, both measures", "",
                  "Mean ± standard error over seeds at each evaluation (PPO step). Top: the formula (gold units); "
                  "bottom: the gold RM (its normalised score).", "", "![hacking curves](hacking_curves.png)", "",
                  "![formula vs gold RM](formula_vs_gold_rm.png)", "",
                  md_table(["arm", "step", "formula (mean ± se, n)", "gold RM (mean ± se, n)"], curve_rows(curves)),
                  ""]
    res = verdicts(runs)
    lines += ["## C1 and C4, judged with each gold", "",
              "The registry's effects and verdict rule (`rlhf-lab-report --claims`, docs/claims.md) on these runs "
              "as the study `ppo_beta_grid` they read. The margins are the registry's, set in the formula's units; "
              "on the gold RM's scale (sd 1 on SFT samples; the formula's sd there is about 0.5) the same number is "
              "about half as wide relative to the spread, so \"negligible\" is harder to show with the gold RM. "
              "Agreeing verdicts do not by themselves validate the gold RM: compare the estimates part by part.", "",
              *verdict_lines(res)]
    lines += ["## Runs", "", md_table(["run", "setting", "seed", "status"],
                                      [[f"`{r.run_id}`", f"`{label(r)}`", r.seed, r.status] for r in runs_all]), "",
              f"Runs read from {source}; generated by `rlhf-lab-report {STUDY}{flags}`.", ""]
    (out / "README.md").write_text("\n".join(lines))
    return out / "README.md"
