"""The hacking alarm report's judgements (``reports/hacking_alarm/``, :mod:`rlhf_lab_research.studies.hacking_alarm`):
issue 44's bar on the pooled held-out AUCs, the paired comparison with the proxy plateau by KL regime and on the runs
the choice of signals never saw, and the headline sentences, all written from the numbers."""

from __future__ import annotations

import math
from typing import Sequence

from rlhf_lab.analysis.markdown import fmt
from rlhf_lab_research.studies.alarm_fit import (
    BASELINES, METHODS, REGIMES, SEED, SIGNALS_CHOSEN_AT_MS, Case, Outcome, auc_stat, bootstrap_counts, difference,
    split_new, with_ci)

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
