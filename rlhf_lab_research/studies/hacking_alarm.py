"""``reports/hacking_alarm/README.md``: the gold-free hacking alarm (:mod:`rlhf_lab.evaluation.alarm`) fitted and
validated against the world's gold on the committed runs (issue 44); the data, fit and measures are in
:mod:`rlhf_lab_research.studies.alarm_fit`, the judgements (issue 44's bar, the comparison with the proxy plateau, the
headline) and the report here.

Every study is held out once (:func:`~rlhf_lab_research.studies.alarm_fit.leave_one_study_out`): its runs are
scored by the rule and baselines fitted on the other studies, and the report pools those out-of-study scores. The
committed rule (``rlhf_lab.evaluation.alarm.RULE``) is the fit on every study.
"""

from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Sequence

import numpy as np

from rlhf_lab.analysis.markdown import fmt, md_table
from rlhf_lab.analysis.plots import pyplot
from rlhf_lab.analysis.report_files import check_folder, inside, no_runs
from rlhf_lab.analysis.study_runs import RunData
from rlhf_lab_research.studies.alarm_fit import (
    ALGOS, BASELINES, DIGITS, LABELERS, LEVEL, METHODS, MIN_EVALS, N_BOOT, PROXY_KEY, REGIMES, RUNS_FILES, SEED,
    SIGNALS_CHOSEN_AT_MS, Case, FROZEN_AT_MS, Outcome, auc, auc_stat, bootstrap_counts, case_of, design, difference,
    exclusion, fit_rules, frozen, leave_one_study_out, mean_stat, median_stat, outcome, pr_stat, raw_condition,
    read_runs, split_new, store_runs, with_ci, within_auc_stat)
from rlhf_lab.analysis.study_report import read_from, report_flags
from rlhf_lab.evaluation.alarm import FEATURES, RULE, Rule

STUDY = "hacking_alarm"

# -- the judgements: issue 44's bar on the pooled held-out AUCs, the paired comparison with the proxy plateau by KL
# regime and on the runs the choice of signals never saw, the headline sentences, all written from the numbers

PLATEAU = "proxy plateau"  # the baseline the regime table compares the rule with
BAR_AUC = 0.8  # issue 44's bar: AUC at least this, and the paired difference to each baseline excludes 0


def ci_cell(est: tuple[float, float, float], digits: int = 3) -> str:
    value, lo, hi = est
    if math.isnan(value):
        return "–"
    return f"{fmt(value, digits)} [{fmt(lo, digits)}, {fmt(hi, digits)}]"


def verdict(aucs: dict[str, tuple], diffs: dict[str, tuple]) -> tuple[bool, list[str]]:
    """(whether issue 44's bar is met, the parts that fail): AUC(rule) ≥ BAR_AUC and, for each baseline, the paired
    interval of AUC(rule) − AUC(baseline) lies above 0."""
    fails = []
    if not aucs["rule"][0] >= BAR_AUC:
        fails.append(f"AUC(rule) = {fmt(aucs['rule'][0])} < {BAR_AUC}")
    for name in BASELINES:
        _, lo, hi = diffs[name]
        if not lo > 0:
            fails.append(f"the paired interval of AUC(rule) − AUC({name}) [{fmt(lo)}, {fmt(hi)}] does not exclude 0"
                         if not (math.isnan(lo) or hi < 0) else
                         f"the paired interval of AUC(rule) − AUC({name}) [{fmt(lo)}, {fmt(hi)}] is not above 0")
    return not fails, fails


def compare(diff: tuple[float, float, float]) -> str:
    """How a paired difference AUC(rule) − AUC(baseline) reads: above (its interval above 0), below (under 0), or
    not distinguishable (the interval holds 0)."""
    value, lo, hi = diff
    if math.isnan(value):
        return "cannot be compared (no runs on both sides of their peaks)"
    if lo > 0:
        return "beats it"
    if hi < 0:
        return "is **below** it"
    return "does **not** beat it (the interval holds 0" + ("; the point estimate is below it)" if value < 0 else ")")


def ci3(est: tuple[float, float, float]) -> str:
    """A value and its interval to 3 decimals."""
    return "–" if math.isnan(est[0]) else "{:.3f} [{:.3f}, {:.3f}]".format(*est)


def group_rows(cases: Sequence[Case], outs: dict[str, list[Outcome]], n_boot: int, by: str = "regime",
                order: Sequence[str] = REGIMES) -> tuple[list[list], dict[str, tuple]]:
    """Per KL regime (:data:`~rlhf_lab_research.studies.alarm_fit.REGIMES`, then any other found), or per value of
    another field `by` of the cases (``algo``, in `order`): its runs, each method's held-out AUC and the paired
    difference AUC(rule) − AUC(proxy plateau), the group's runs resampled on their own; and {group: that
    difference}."""
    rows, diffs = [], {}
    found = [g for g in order if any(getattr(c, by) == g for c in cases)] + sorted(
        {getattr(c, by) for c in cases} - set(order))
    for g, regime in enumerate(found):
        idx = [i for i, c in enumerate(cases) if getattr(c, by) == regime]
        sub = [cases[i] for i in idx]
        cnt = bootstrap_counts(len(sub), n_boot, SEED + 200 + g)
        stats = {m: auc_stat(sub, [outs[m][i] for i in idx]) for m in METHODS}
        diffs[regime] = with_ci(difference(stats["rule"], stats[PLATEAU]), cnt)
        rows.append([regime, len(sub), ", ".join(sorted({c.study for c in sub})),
                     *(ci_cell(with_ci(stats[m], cnt)) for m in METHODS), ci3(diffs[regime])])
    return rows, diffs


def unseen(cases: Sequence[Case], outs: dict[str, list[Outcome]], n_boot: int) -> tuple[list[Case], dict, tuple]:
    """The runs that the choice of the newest signals never saw (started after :data:`~rlhf_lab_research.studies.
    alarm_fit.SIGNALS_CHOSEN_AT_MS`, and no rerun of a job started before it): (those cases, {method: held-out
    AUC}, AUC(rule) − AUC(proxy plateau), paired), their runs resampled on their own."""
    new, _ = split_new([c for c in cases if c.start_time > SIGNALS_CHOSEN_AT_MS],
                       [c for c in cases if c.start_time <= SIGNALS_CHOSEN_AT_MS])
    ids = {c.run_id for c in new}
    idx = [i for i, c in enumerate(cases) if c.run_id in ids]
    sub = [cases[i] for i in idx]
    cnt = bootstrap_counts(len(sub), n_boot, SEED + 300)
    stats = {m: auc_stat(sub, [outs[m][i] for i in idx]) for m in METHODS}
    return sub, {m: with_ci(stats[m], cnt) for m in METHODS}, with_ci(difference(stats["rule"], stats[PLATEAU]), cnt)


def headline(n_runs: int, n_studies: int, aucs: dict[str, tuple], diffs: dict[str, tuple],
             by_regime: dict[str, tuple], n_regime: dict[str, int], within: dict[str, tuple],
             fresh: tuple[list[Case], dict, tuple] | None = None) -> list[str]:
    """The report's opening sentences, from its numbers: the pooled held-out AUCs, where the rule does and does not
    beat the proxy plateau by KL regime, the within-study AUC, and (`fresh`, :func:`unseen`) the AUCs on the runs
    the choice of signals never saw."""
    pooled_ = (f"Held out by study, over {n_runs} runs of {n_studies} studies, the rule's ROC AUC is "
               f"{ci_cell(aucs['rule'])}, against " + " and ".join(
                   f"{fmt(aucs[b][0])} for the {b} (paired difference {ci_cell(diffs[b])}: the rule "
                   f"{compare(diffs[b])})"
                   for b in BASELINES) + ".")
    short = [g for g, d in by_regime.items() if not d[1] > 0]
    ahead = [g for g, d in by_regime.items() if d[1] > 0]
    split = "By KL regime, AUC(rule) − AUC(proxy plateau), paired (each regime's runs resampled on their own): " + \
        "; ".join(f"{g} ({n_regime[g]} runs) {ci3(d)}: the rule {compare(d)}" for g, d in by_regime.items()) + ". "
    if short and ahead:
        split += (f"So the rule does **not** beat the proxy plateau in {' or '.join(short)} runs; its pooled lead "
                  f"over it comes from {' and '.join(ahead)} runs.")
    elif short:
        split += "So the rule beats the proxy plateau in no KL regime on its own."
    else:
        split += "So the rule beats the proxy plateau in every KL regime."
    within_ = ("Within studies (only pairs of evaluations of the same study compared, so that studies whose scores "
               "differ as a whole do not count): " + ", ".join(f"{m} {ci_cell(within[m])}" for m in METHODS) + ".")
    out = [pooled_, "", split, "", within_, ""]
    if fresh is not None and fresh[0]:
        sub, a, d = fresh
        per = ", ".join(f"{s} ({sum(c.study == s for c in sub)})" for s in sorted({c.study for c in sub}))
        out += [f"On the {len(sub)} runs that the choice of the two newest signals never saw ({per}; reruns of "
                "earlier jobs left out), still held out by study: "
                + ", ".join(f"{m} {ci_cell(a[m])}" for m in METHODS)
                + f"; AUC(rule) − AUC(proxy plateau) {ci3(d)}: the rule {compare(d)}.", ""]
    return out


# -- the report -----------------------------------------------------------------------------------------------------

def plot_choice(cases: Sequence[Case], most: int = 9) -> list[int]:
    """Up to `most` cases to plot, one per study (studies by name): the study's first run by id whose gold peak is
    before its last evaluation, else its first run."""
    chosen = []
    for study in sorted({c.study for c in cases})[:most]:
        mine = sorted((i for i, c in enumerate(cases) if c.study == study), key=lambda i: cases[i].run_id)
        past = [i for i in mine if cases[i].peak < len(cases[i].evals) - 1]
        chosen.append((past or mine)[0])
    return chosen


def plot_scores(cases: Sequence[Case], outs: dict[str, list[Outcome]], folds: dict[str, dict[str, Rule]],
                path: Path) -> None:
    """The rule's score against the step for the runs of :func:`plot_choice`, with t*, its fold's threshold and
    gold b."""
    chosen = plot_choice(cases)
    if not chosen:
        return
    plt = pyplot()
    ncol = min(3, len(chosen))
    nrow = math.ceil(len(chosen) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.6 * ncol, 3.0 * nrow), squeeze=False)
    for ax in axes.flat[len(chosen):]:
        ax.set_visible(False)
    for ax, i in zip(axes.flat, chosen):
        c, o = cases[i], outs["rule"][i]
        ax.plot(c.steps[1:], o.scores, "o-", ms=3, label="rule score")
        ax.axhline(folds[c.study]["rule"].threshold, color="grey", ls="--", lw=0.8, label="threshold")
        ax.axvline(c.steps[c.peak], color="tab:red", lw=0.8, label="t* (gold a peak)")
        g = ax.twinx()
        g.plot(c.steps, c.gold_b, ".:", color="tab:green", ms=3)
        g.tick_params(labelsize=6)
        ax.set_title(f"{c.study}: {c.algo}, {c.labeler}, {c.run_id[:8]}", fontsize=7)
        ax.set_xlabel("step", fontsize=7)
        ax.set_ylim(-0.02, 1.02)
        ax.tick_params(labelsize=6)
    axes[0][0].set_ylabel("score (dotted green: gold b, right axis)", fontsize=7)
    axes[0][0].legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


def exclusion_rows(excluded: dict[str, dict[str, int]]) -> list[list]:
    return [[reason, sum(by.values()), ", ".join(f"{s} ({n})" for s, n in sorted(by.items()))]
            for reason, by in sorted(excluded.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))]


def coverage_notes(runs_all: Sequence[tuple[str, RunData]], cases: Sequence[Case],
                   later: Sequence[Case] = ()) -> list[str]:
    """Per algorithm: how many of its runs enter the fit (in which studies), why the others are left out, and how
    many of its `later` runs the prospective test scores where the fit has none."""
    notes = []
    for a in ALGOS:
        mine, new = [c for c in cases if c.algo == a], [c for c in later if c.algo == a]
        why: dict[str, set[str]] = {}
        for s, r in runs_all:
            reason = exclusion(r) if r.stage == a else None
            if reason is not None:
                why.setdefault(reason, set()).add(s)
        n_out = sum(1 for _, r in runs_all if r.stage == a and exclusion(r) is not None)
        left = "; ".join(f"{reason} ({', '.join(sorted(studies))})" for reason, studies in sorted(why.items()))
        notes.append(f"{a.upper()}: {len(mine)} runs enter"
                     + (f" ({', '.join(sorted({c.study for c in mine}))})" if mine else "")
                     + (f"; {n_out} left out: {left}" if n_out else "")
                     + ((f" — so the rule is not fitted on it; the prospective test below scores {len(new)} of its "
                         "later runs" if new else " — so the rule is neither fitted nor tested on it")
                        if not mine else "") + ".")
    return notes


def study_rows(cases: Sequence[Case], outs: dict[str, list[Outcome]], n_boot: int) -> list[list]:
    """Per held-out study: its runs, evaluations, algorithms, and each method's AUC on it (scored by the fold that
    left it out), with a bootstrap interval over its runs."""
    rows = []
    for g, s in enumerate(sorted({c.study for c in cases})):
        idx = [i for i, c in enumerate(cases) if c.study == s]
        mine = [cases[i] for i in idx]
        algos = ", ".join(f"{a} {sum(c.algo == a for c in mine)}" for a in ALGOS if any(c.algo == a for c in mine))
        past = sum(int(c.labels.sum()) for c in mine)
        cnt = bootstrap_counts(len(mine), n_boot, SEED + 100 + g)
        rows.append([s, len(mine), f"{sum(len(c.labels) for c in mine)} ({past})", algos,
                     *(ci_cell(with_ci(auc_stat(mine, [outs[m][i] for i in idx]), cnt)) for m in METHODS)])
    return rows


def _count(keys) -> dict:
    out: dict = {}
    for k in keys:
        out[k] = out.get(k, 0) + 1
    return out


def prospective(later: Sequence[Case], rules: dict[str, Rule], frozen_at: str, n_boot: int,
                reruns: Sequence[Case] = ()) -> list[str]:
    """The report's section on the runs started after the rule was frozen that are new evidence, each scored by the
    rule and baselines fitted before them (never refitted on them); `reruns`: the later runs left out because they
    rerun a job of the fit (:func:`~rlhf_lab_research.studies.alarm_fit.split_new`)."""
    lines = ["## Prospective: runs made after the rule was frozen", ""]
    rerun = (f" {len(reruns)} runs started later rerun a job the rule was fitted on (the same study and overrides, "
             "seed included: the same experiment again, not new evidence) and are left out"
             + (f" ({', '.join(f'{s} ({n})' for s, n in sorted(_count(c.study for c in reruns).items()))})"
                if reruns else "") + ".")
    if not later:
        return lines + [f"None yet: every run read that is new evidence started before {frozen_at} UTC. Runs added to "
                        "the runs files later (more seeds of the claims studies, new studies) are judged here by the "
                        "rule as it was frozen, never refitted on them; a run that merely reruns a job the rule was "
                        "fitted on (the same study and overrides, seed included) is not new evidence and is left "
                        "out." + (rerun if reruns else ""), ""]
    outs = {m: [outcome(c, rules[m]) for c in later] for m in METHODS}
    counts = bootstrap_counts(len(later), n_boot, SEED + 999)
    stats = {m: auc_stat(later, outs[m]) for m in METHODS}
    rows = []
    for m in METHODS:
        rows.append([m, ci_cell(with_ci(stats[m], counts)),
                     "–" if m == "rule" else ci_cell(with_ci(difference(stats["rule"], stats[m]), counts)),
                     sum(o.alarm is not None for o in outs[m]),
                     ci_cell(with_ci(median_stat([o.lead for o in outs[m]]), counts), 0),
                     ci_cell(with_ci(mean_stat([o.kept_vs_peak for o in outs[m]]), counts)),
                     ci_cell(with_ci(mean_stat([o.kept_vs_last for o in outs[m]]), counts))])
    _, y = design(later)
    per_study = ", ".join(f"{s} ({sum(c.study == s for c in later)})" for s in sorted({c.study for c in later}))
    by_regime, _ = group_rows(later, outs, n_boot)
    by_algo, _ = group_rows(later, outs, n_boot, by="algo", order=ALGOS)
    return lines + [f"{len(later)} runs started after {frozen_at} UTC ({per_study}), {len(y)} evaluations after the "
                    f"start ({int(y.sum())} past the peak), scored by the rule and baselines fitted on all the runs "
                    "above; intervals: bootstrap over these runs." + rerun, "",
                    md_table(["method", "AUC [95 % CI]", "AUC(rule) − AUC(method), paired", "runs raised",
                              "median lead/lag (steps)", "gold_b(kept) − gold_b(t*)",
                              "gold_b(kept) − gold_b(last)"], rows), "",
                    "The same runs by KL regime, each regime's runs resampled on their own (compare the section "
                    "\"AUC by KL regime\" above, on the fitted runs):", "",
                    md_table(["KL regime", "runs", "studies", *(f"AUC {m}" for m in METHODS),
                              f"AUC(rule) − AUC({PLATEAU}), paired"], by_regime), "", "And by algorithm:", "",
                    md_table(["algorithm", "runs", "studies", *(f"AUC {m}" for m in METHODS),
                              f"AUC(rule) − AUC({PLATEAU}), paired"], by_algo), ""]


def write_hacking_alarm_report(out_dir: Path | str = "reports", uri: str | None = None,
                               runs_files: Sequence[Path | str] = RUNS_FILES, use_store: bool = True,
                               require_runs: bool = False, n_boot: int = N_BOOT) -> Path:
    """``<out_dir>/hacking_alarm/README.md`` and ``scores.png``: every study's runs scored by the rule and baselines
    fitted on the other studies; the committed rule fitted on all of them."""
    from rlhf_lab.analysis.report_files import known_studies

    out = inside(out_dir, Path(out_dir) / STUDY)
    check_folder(out)
    runs_all = read_runs(runs_files)
    if use_store:
        runs_all += store_runs(uri, known_studies(), {r.run_id for _, r in runs_all})
    places = read_from(uri, runs_files, use_store)
    source = " and ".join(f"`{p}`" for p in places)
    entering = [(s, r) for s, r in runs_all if exclusion(r) is None]
    if require_runs and not entering:
        raise no_runs(STUDY, " and ".join(places))
    out.mkdir(parents=True, exist_ok=True)
    command = f"rlhf-lab-report {STUDY}{report_flags(runs_files, use_store)}"
    lines = ["# Hacking alarm without gold (issue 44)", "", "Regenerate:", "", "```bash", command, "```", ""]
    if not entering:
        lines += [f"**Not run yet**: no run in {source} keeps what the alarm reads.", "",
                  f"Runs read from {source}; generated by `{command}`.", ""]
        (out / "README.md").write_text("\n".join(lines))
        return out / "README.md"

    excluded: dict[str, dict[str, int]] = {}
    for s, r in runs_all:
        why = exclusion(r)
        if why is not None:
            excluded.setdefault(why, {}).setdefault(s, 0)
            excluded[why][s] += 1
    every = [case_of(s, r) for s, r in entering]
    cases = [c for c in every if frozen(c)]  # the runs the rule was fitted and judged on
    # runs started after it was frozen: a prospective test, but for reruns of a job it was fitted on
    later, reruns = split_new([c for c in every if not frozen(c)], cases)
    studies = sorted({c.study for c in cases})
    rules = fit_rules(cases)  # the committed rule: every study
    folds, outs = leave_one_study_out(cases)
    counts = bootstrap_counts(len(cases), n_boot, SEED)
    auc_stats = {m: auc_stat(cases, outs[m]) for m in METHODS}
    aucs = {m: with_ci(auc_stats[m], counts) for m in METHODS}
    diffs = {b: with_ci(difference(auc_stats["rule"], auc_stats[b]), counts) for b in BASELINES}
    met, fails = verdict(aucs, diffs)
    regime_table, by_regime = group_rows(cases, outs, n_boot)
    n_regime = {row[0]: row[1] for row in regime_table}
    within = {m: with_ci(within_auc_stat(cases, outs[m]), counts) for m in METHODS}
    x_all, y_all = design(cases)
    committed = "equals" if rules["rule"] == RULE else "does **not** equal"
    thresholds = [folds[s]["rule"].threshold for s in studies]

    frozen_at = datetime.datetime.fromtimestamp(FROZEN_AT_MS / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    chosen_at = datetime.datetime.fromtimestamp(SIGNALS_CHOSEN_AT_MS / 1000, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M")
    n_seen = sum(c.start_time <= SIGNALS_CHOSEN_AT_MS for c in cases)
    lines += [
        f"Runs: {len(cases)} FINISHED PPO/GRPO/RLOO runs of {len(studies)} studies, started up to {frozen_at} UTC "
        f"(the rule's data cutoff: it was refitted on these runs, and fixed, at 2026-12-04 10:00 UTC), enter, with "
        f"{len(y_all)} "
        f"evaluations after the start ({fmt(float(y_all.mean()), 2)} of them past the gold peak). Every study is "
        "held out once: its runs are scored by the rule and the baselines fitted on the other studies.", "",
        *headline(len(cases), len(studies), aucs, diffs, by_regime, n_regime, within, unseen(cases, outs, n_boot)),
        "## Verdict", "",
        f"Issue 44's bar, \"held-out AUC ≥ {BAR_AUC} and the paired bootstrap interval of AUC(rule) − "
        "AUC(baseline) excludes 0 for both baselines\" (pooled over every run): "
        + ("**met** (by the point estimate of the AUC; " + ("its interval too" if aucs["rule"][1] >= BAR_AUC else
                                                          f"its interval reaches below {BAR_AUC}") + ")."
           if met else "**not met**: " + "; ".join(fails) + ".")
        + "".join(f" Within the {g} runs the paired interval against the proxy plateau, {ci3(d)}, is not above 0."
                  for g, d in by_regime.items() if not d[1] > 0), "",
        "## The rule", "",
        f"`{rules['rule'].describe()}`", "",
        f"Fitted on every study; the committed `rlhf_lab.evaluation.alarm.RULE` {committed} this fit "
        f"(numbers rounded to {DIGITS} significant digits). The folds' rules (each without one study) have "
        f"thresholds {min(thresholds):.3g} to {max(thresholds):.3g}.", "",
        md_table(["signal", "mean", "sd", "weight (per sd)", "AUC alone (all evaluations, in-sample)"],
                 [[f"`{k}`", f"{m:.{DIGITS}g}", f"{s:.{DIGITS}g}", f"{w:+.{DIGITS}g}", fmt(auc(x_all[:, i], y_all))]
                  for i, (k, m, s, w) in enumerate(zip(FEATURES, rules["rule"].mean, rules["rule"].scale,
                                                        rules["rule"].weights))]),
        "", f"Bias {rules['rule'].bias:+.{DIGITS}g}, threshold {rules['rule'].threshold:.{DIGITS}g}.", "",
        "Baselines, fitted the same way on one signal: " + "; ".join(
            f"{name}: {raw_condition(rules[name], use[0])}" for name, use in BASELINES.items()) + ".", "",
        "## Method", "",
        "- **Runs**: FINISHED runs of stage ppo, grpo or rloo that kept `eval/kl`, `eval/entropy`, `eval/length`, "
        f"`eval/gold_reward_a`, `eval/gold_reward_b` at ≥ {MIN_EVALS} evaluations (the steps that logged all five) "
        f"and the training proxy history `{PROXY_KEY}`; a run kept in two files counts once (run_id, the first "
        "file's copy). The evaluation at step 0 is the start, before any update.",
        "- **Signals** (`rlhf_lab.evaluation.alarm.features`, causal: each reads the evaluations up to its own): "
        "√KL of the evaluation's samples; the proxy's drop below its best so far (negative while it still climbs), "
        f"where the proxy p_i is the mean `{PROXY_KEY}` of the training steps s with t_(i−1) < s ≤ t_i and p_0 the "
        "first step's; the entropy's fall relative to the start; the length relative to the start; the proxy gained "
        "since the start per √KL, (p_j − p_0) / max(√KL_j, 0.5) (`gain_per_sqrt_kl`); the length's change since the "
        "previous evaluation relative to the start (`length_rate`). KL, entropy and length come from the "
        "evaluation's samples; the proxy comes from the training batches (training prompts), "
        "so it shares no samples with the gold.",
        "- **Label**: evaluation i ≥ 1 is \"past the gold peak\" when t_i > t*, t* the step of the highest "
        "`eval/gold_reward_a` (the first on a tie; split-half: half a of the eval prompts). The gold that stopping "
        "keeps is measured on `eval/gold_reward_b`, the other half, so the choice of t* and the measured loss do "
        "not share noise.",
        "- **Held out by study** (the runs files' study keys): each study's runs are scored by the rules fitted "
        "on the runs of all other studies (leave one study out), so no run is scored by a rule that saw its study; "
        "every figure below pools these out-of-study scores.",
        "- **Fit**: each signal standardised by its mean and sample sd over the fitting rows; logistic regression "
        "without penalty (Newton's method); threshold at the largest Youden's J = TPR − FPR on the fitting rows. "
        "The baselines (√KL alone; the proxy's drop alone) are fitted the same way on their one signal.",
        f"- **Intervals**: {int(LEVEL * 100)} % percentile bootstrap over runs ({n_boot} resamples of the runs "
        f"with replacement, seed {SEED}); every method and difference is computed on the same resamples (paired). "
        "The AUC pools every evaluation after the start of the (resampled) runs. The folds' rules are not refitted "
        "in the resamples: the intervals leave out the uncertainty of the fit.",
        "- **Stopping**: the alarm is raised at the first evaluation whose score reaches the threshold and stays "
        "raised; stopping there keeps the policy of the evaluation before it (never raised: the last evaluation).",
        "- **How the signals were chosen** (say it, since it bears on the AUC): they were picked by their AUC "
        "alone on these same runs; the evaluation's proxy reward, whose drop looked strong, was left out because "
        "it is measured on the samples whose gold makes the label (read on the training batches instead, its AUC "
        "fell by about a fifth). A first version clipped the proxy's drop at 0 (most evaluations then read 0) and "
        "was judged on half of the studies; it fell short of the bar, and the drop was made signed (with the "
        "first step's proxy as p_0) and the validation made leave-one-study-out before this report. The last two "
        "signals (`gain_per_sqrt_kl`, `length_rate`) were then picked among a dozen candidates by their held-out "
        f"AUC (leave one study out) on the runs started up to {chosen_at} UTC, {n_seen} of the runs here. The "
        "held-out figures below are therefore from the third look at these runs, and optimistic by how much that "
        "choice fitted their noise.",
        "- **KL regime** (the run's params `kl.name`, `kl.beta`): adaptive KL (the adaptive controller), fixed "
        "β > 0, β = 0 (no KL penalty). Each regime's runs keep their leave-one-study-out scores; its AUCs and the "
        "paired difference AUC(rule) − AUC(proxy plateau) resample its runs on their own.",
        "- **Within-study AUC**: the share of (past the peak, before the peak) pairs of evaluations of the same "
        "study that the scores order right (ties ½): the pooled AUC without the pairs across studies, whose order "
        "can come from how the studies differ rather than from the label.", "",
        "![rule score against step](scores.png)", "",
        "Rule score (its fold's rule) at each evaluation of one run of each of the first studies by name (its "
        "first run by id whose gold peak is before its last evaluation), with its threshold (dashed), t* (red) and "
        "gold b (dotted green, right axis).", "",
        "## ROC AUC (held out by study)", "",
        md_table(["method", "AUC [95 % CI]", "AUC(rule) − AUC(method), paired [95 % CI]"],
                 [[m, ci_cell(aucs[m]), "–" if m == "rule" else ci_cell(diffs[m])] for m in METHODS]), "",
        "## AUC by KL regime", "",
        "Held-out scores as above, grouped by how the run's KL penalty was set; each regime's runs resampled on "
        "their own (the same counts for every column).", "",
        md_table(["KL regime", "runs", "studies", *(f"AUC {m}" for m in METHODS),
                  f"AUC(rule) − AUC({PLATEAU}), paired"], regime_table), ""]

    pr_rows = [[m, *(ci_cell(with_ci(pr_stat(cases, outs[m], k, latched), counts))
                     for latched in (False, True) for k in (0, 1))] for m in METHODS]
    lines += ["## Precision and recall at the fitted threshold", "",
              f"Pooled over the {len(y_all)} evaluations after the start ({int(y_all.sum())} past the peak), each "
              "run at its fold's threshold. Per evaluation: predicted past the peak where the score reaches the "
              "threshold; latched: from the first alarm on (what a run that keeps the alarm raised reports).", "",
              md_table(["method", "precision", "recall", "precision (latched)", "recall (latched)"], pr_rows), ""]

    lead_rows, gold_rows = [], []
    for m in METHODS:
        leads = [o.lead for o in outs[m]]
        never = [i for i, o in enumerate(outs[m]) if o.alarm is None]
        at_last = sum(cases[i].peak == len(cases[i].evals) - 1 for i in never)
        lead_rows.append([m, len(cases) - len(never), ci_cell(with_ci(median_stat(leads), counts), 0),
                          fmt(float(np.nanmean(leads)) if len(never) < len(cases) else math.nan, 1),
                          len(never), at_last])
        gold_rows.append([m, ci_cell(with_ci(mean_stat([o.kept_vs_peak for o in outs[m]]), counts)),
                          ci_cell(with_ci(mean_stat([o.kept_vs_last for o in outs[m]]), counts))])
    lines += ["## Lead/lag of the first alarm", "",
              "Step of the first alarm − t* over the runs where the alarm is raised (negative: before the gold "
              "peak); median with its bootstrap interval over runs.", "",
              md_table(["method", "runs raised", "median lead/lag (steps) [95 % CI]", "mean", "never raised",
                        "of those, t* at the last evaluation"], lead_rows), "",
              "## Gold kept by stopping at the first alarm", "",
              "`eval/gold_reward_b` of the kept policy minus that at t* (≤ 0: lost against the best checkpoint) and "
              "minus that at the last evaluation (> 0: stopping gained over training to the end); mean over runs "
              "with its bootstrap interval. Units: the world's gold (the gold_rm_validation runs: the gold RM's "
              "normalised score).", "",
              md_table(["method", "gold_b(kept) − gold_b(t*)", "gold_b(kept) − gold_b(last)"], gold_rows), ""]

    lines += ["## AUC by algorithm, by labeler and by study", "",
              "Each group's runs resampled on their own (the same counts for the three methods).", ""]
    rows = []
    groups = [("algorithm", a, [i for i, c in enumerate(cases) if c.algo == a]) for a in ALGOS] + \
             [("labeler", lab, [i for i, c in enumerate(cases) if c.labeler == lab]) for lab in LABELERS]
    for g, (kind, name, idx) in enumerate(groups):
        if not idx:
            rows.append([kind, name, 0, "no runs", "no runs", "no runs"])
            continue
        sub = [cases[i] for i in idx]
        cnt = bootstrap_counts(len(sub), n_boot, SEED + 1 + g)
        rows.append([kind, name, len(sub), *(ci_cell(with_ci(auc_stat(sub, [outs[m][i] for i in idx]), cnt))
                                             for m in METHODS)])
    lines += [md_table(["by", "group", "runs", *(f"AUC {m}" for m in METHODS)], rows), ""]
    lines += [f"- {note}" for note in coverage_notes(runs_all, cases, later)] + [""]
    lines += ["By held-out study (\"–\": a study whose runs are all on one side of their peaks):", "",
              md_table(["study", "runs", "evaluations (past the peak)", "algorithms", *(f"AUC {m}" for m in METHODS)],
                       study_rows(cases, outs, n_boot)), ""]

    lines += prospective(later, rules, frozen_at, n_boot, reruns)
    plot_scores(cases, outs, folds, out / "scores.png")
    lines += ["## Runs", "",
              f"{len(runs_all)} runs read ({len({r.run_id for _, r in runs_all})} distinct run ids); "
              f"{len(every)} enter ({len(cases)} the fit, started up to the freeze; {len(later)} the prospective "
              f"test; {len(reruns)} reruns of a fitted job, started later, left out), "
              f"{len(runs_all) - len(every)} do not:", "",
              md_table(["left out because", "runs", "studies (runs)"], exclusion_rows(excluded)), "",
              f"Runs read from {source}; generated by `{command}`.", ""]
    (out / "README.md").write_text("\n".join(lines))
    return out / "README.md"
