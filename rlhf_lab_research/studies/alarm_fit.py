"""The hacking alarm's data, fit and measures (issue 44): the committed runs as the alarm sees them, the logistic
rule fitted on some studies, and how well a rule does on others (:mod:`rlhf_lab_research.studies.hacking_alarm`
writes the report).

The data are the FINISHED PPO, GRPO and RLOO runs of the runs files that kept, at ≥ :data:`MIN_EVALS`
evaluations, ``eval/kl``, ``eval/entropy``, ``eval/length``, ``eval/gold_reward_a`` and ``eval/gold_reward_b``,
and the proxy history ``objective/scores`` of their training batches (:func:`exclusion` says why a run is left
out). Per run, :func:`evaluations` builds the alarm's input; an evaluation i ≥ 1 is labelled "past the gold peak"
when its step is after t*, the step of the best ``eval/gold_reward_a`` (:func:`peak_index`), and the gold a
stopping rule keeps is measured on ``eval/gold_reward_b``, the other half of the evaluation prompts.

A rule is a logistic regression of the label on the standardised signals (:func:`fit_logistic`, scikit-learn's,
no penalty) with the threshold of the best Youden's J (:func:`youden_threshold`); the two baselines (√KL alone,
the proxy's drop alone) are fitted the same way. :func:`leave_one_study_out` scores every run with the rules
fitted on the other studies; the measures (ROC AUC, precision and recall, the lead/lag of the first alarm behind
t*, the gold that stopping there keeps) carry a percentile bootstrap over runs (:func:`bootstrap_counts`; the
same resamples for every method, so differences are paired). The report also groups the runs by how their KL
penalty was set (:func:`kl_regime`), compares only evaluations of the same study (:func:`within_auc_stat`), and
leaves out of its prospective test the later runs that rerun a job the rule was fitted on (:func:`split_new`). Pure
functions of numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from rlhf_lab.analysis.study_runs import STUDY_TAG, RunData, job_key, load_study
from rlhf_lab.evaluation import objective
from rlhf_lab.evaluation.alarm import FEATURES, Evaluation, Rule, features, scores
from rlhf_lab_research.stats import percentile_ci

RUNS_FILES = ("reports/claims_runs.json.gz", "reports/algo_frontier/runs.json.gz",
              "reports/hacking_alarm/gold_rm_validation_sft_gold.json.gz", "reports/rm_source_5rms/runs.json.gz",
              "reports/algo_frontier_equal/runs.json.gz")
ALGOS, LABELERS = ("ppo", "grpo", "rloo"), ("unbiased", "length_biased")
EVAL_KEYS = ("eval/kl", "eval/entropy", "eval/length", "eval/gold_reward_a", "eval/gold_reward_b")
PROXY_KEY = "objective/scores"
HISTORY = (*EVAL_KEYS, PROXY_KEY)
MIN_EVALS = 5
N_BOOT = 2000
SEED = 0
LEVEL = 0.95
DIGITS = 4  # significant digits of the committed RULE
# The rule was frozen on the runs started up to this instant (ms since the epoch: the start of the newest run of the
# committed runs files when it was refitted with the six signals at 2026-12-04 10:00 UTC, 2026-12-04 08:05:53 UTC;
# the first rule, on four signals, was frozen at 2026-12-04 04:29:44 UTC, SIGNALS_CHOSEN_AT_MS); runs started later
# never shaped it, and the report judges the committed rule on them apart, as a prospective test (but for reruns of
# a job it was fitted on: split_new).
FROZEN_AT_MS = 1796371553299
# gain_per_sqrt_kl and length_rate were chosen on the runs started up to this instant (the first rule's freeze); the
# report judges the rule apart on the runs started later, which that choice never saw.
SIGNALS_CHOSEN_AT_MS = 1796358584911
REGIMES = ("adaptive KL", "fixed β > 0", "β = 0")  # kl_regime: how a run's KL penalty was set
BASELINES = {"KL threshold": ("sqrt_kl",), "proxy plateau": ("proxy_drop",)}
METHODS = ("rule", *BASELINES)


# -- the runs -------------------------------------------------------------------------------------------------------

def read_runs(runs_files: Sequence[Path | str]) -> list[tuple[str, RunData]]:
    """(study key, run) of every run kept in `runs_files` (:func:`~rlhf_lab.analysis.snapshot.read_snapshot`), each
    run once (by run_id: the first file's copy), in the order kept."""
    from rlhf_lab.analysis.snapshot import read_snapshot

    seen: dict[str, tuple[str, RunData]] = {}
    for f in runs_files:
        studies, _ = read_snapshot(f)
        for name, runs in studies.items():
            for r in runs:
                seen.setdefault(r.run_id, (name, r))
    return list(seen.values())


def store_runs(uri: str | None, known: Sequence[str], have: set[str]) -> list[tuple[str, RunData]]:
    """(study tag, run) of the policy runs of the studies `known` in the store, but those whose run_id is in `have`."""
    out = []
    for study in known:
        found, _ = load_study(study, uri, stages=ALGOS, history_keys=HISTORY)
        out += [(r.tags.get(STUDY_TAG, study), r) for r in found if r.run_id not in have]
    return out


def eval_steps(r: RunData) -> list[int]:
    """The steps at which the run logged every one of :data:`EVAL_KEYS`, in order."""
    steps = None
    for key in EVAL_KEYS:
        s = {step for step, _ in r.series(key)}
        steps = s if steps is None else steps & s
    return sorted(steps or ())


def exclusion(r: RunData) -> str | None:
    """Why the run does not enter (None: it does): not a PPO/GRPO/RLOO run, not FINISHED, an eval metric or the
    proxy history not kept, or fewer than :data:`MIN_EVALS` evaluations with every eval metric."""
    if r.stage not in ALGOS:
        return f"a {r.stage} run (not PPO, GRPO or RLOO)"
    if r.status != "FINISHED":
        return f"status {r.status}"
    missing = [k for k in EVAL_KEYS if not r.series(k)]
    if missing:
        return "no " + ", ".join(f"`{k}`" for k in missing) + " history kept"
    if not r.series(PROXY_KEY):
        return f"no `{PROXY_KEY}` history kept"
    if len(eval_steps(r)) < MIN_EVALS:
        return f"fewer than {MIN_EVALS} evaluations"
    return None


def interval_means(history: Sequence[tuple[int, float]], steps: Sequence[int]) -> list[float]:
    """p_i per evaluation step t_i: at i = 0 the first value logged after t_0 (the start policy's batch), else the
    mean of the values logged at steps s with t_{i−1} < s ≤ t_i (nan if none): the tuning objective's definition
    (:func:`rlhf_lab.evaluation.objective.interval_means`), so the alarm, the ship rules and tuning read one proxy."""
    return objective.interval_means(history, steps)


def evaluations(r: RunData) -> list[Evaluation]:
    """The alarm's input of one run: at each evaluation step (:func:`eval_steps`) its KL, entropy and length, and
    the mean proxy score of the training steps since the previous evaluation (:func:`interval_means`)."""
    steps = eval_steps(r)
    kl, ent, ln = (dict(r.series(k)) for k in EVAL_KEYS[:3])
    proxy = interval_means(r.series(PROXY_KEY), steps)
    return [Evaluation(t, kl[t], ent[t], ln[t], p) for t, p in zip(steps, proxy)]


def kl_regime(r: RunData) -> str:
    """How the run's KL penalty was set (its params ``kl.name``, ``kl.beta``): "adaptive KL" (the adaptive
    controller, whatever its initial β), "fixed β > 0", "β = 0" (no KL penalty), or "?" (not logged)."""
    if r.value("kl.name") == "adaptive":
        return REGIMES[0]
    beta = r.fnum("kl.beta")
    if math.isnan(beta):
        return "?"
    return REGIMES[1] if beta > 0 else REGIMES[2]


def peak_index(gold_a: Sequence[float]) -> int:
    """The index of the best gold (the first one on a tie): t* of the label."""
    return int(np.argmax(np.asarray(gold_a, dtype=float)))


@dataclass
class Case:
    """One run as the alarm sees it, with its gold: `signals` (rows: evaluations 1..n−1, columns: FEATURES),
    `labels` (evaluation step after t*), `gold_b` at every evaluation, `peak` = the index of t*."""

    study: str
    run_id: str
    start_time: int
    algo: str
    labeler: str
    evals: list[Evaluation]
    signals: np.ndarray
    labels: np.ndarray
    gold_b: np.ndarray
    peak: int
    job: tuple | None = None  # runs.job_key: study, stage, the overrides (seed included); None: not tagged
    regime: str = "?"  # kl_regime

    @property
    def steps(self) -> list[int]:
        return [e.step for e in self.evals]


def case_of(study: str, r: RunData) -> Case:
    """The :class:`Case` of a run that enters (:func:`exclusion` is None)."""
    evals = evaluations(r)
    steps = [e.step for e in evals]
    gold_a, gold_b = (dict(r.series(k)) for k in EVAL_KEYS[3:])
    peak = peak_index([gold_a[t] for t in steps])
    signals = np.asarray([[features(evals[: j + 1])[k] for k in FEATURES] for j in range(1, len(evals))], dtype=float)
    labels = np.asarray([t > steps[peak] for t in steps[1:]], dtype=bool)
    return Case(study, r.run_id, r.start_time, r.stage, str(r.value("labeler.name") or "?"), evals, signals, labels,
                np.asarray([gold_b[t] for t in steps], dtype=float), peak, job_key(r), kl_regime(r))


# -- the fit --------------------------------------------------------------------------------------------------------

def standardise(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, sample sd) of each column; a constant column gets sd 1."""
    x = np.asarray(x, dtype=float)
    sd = x.std(axis=0, ddof=1)
    return x.mean(axis=0), np.where(sd > 0, sd, 1.0)


def sigmoid(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=float)
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def fit_logistic(z: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """(bias, weights) of the unpenalised logistic regression of the 0/1 labels `y` on the columns of `z`
    (scikit-learn's Newton–Cholesky solver, to 1e-12: the Newton iterations written here before gave the same
    rule to 4 significant digits on every committed fit and fold)."""
    from sklearn.linear_model import LogisticRegression

    m = LogisticRegression(C=np.inf, solver="newton-cholesky", tol=1e-12, max_iter=100)
    m.fit(np.asarray(z, dtype=float), np.asarray(y, dtype=bool))
    return float(m.intercept_[0]), m.coef_[0]


def youden_threshold(s: np.ndarray, y: np.ndarray) -> float:
    """The score t maximising Youden's J = TPR − FPR of "score ≥ t" over the rows (the highest such t on a tie), from
    scikit-learn's ROC curve (every distinct score a threshold)."""
    from sklearn.metrics import roc_curve

    fpr, tpr, thresholds = roc_curve(np.asarray(y, dtype=bool), np.asarray(s, dtype=float), drop_intermediate=False)
    return float(thresholds[1:][int(np.argmax((tpr - fpr)[1:]))])  # [0] is +inf, where no row is flagged


def sig(x: float, digits: int = DIGITS) -> float:
    """`x` rounded to `digits` significant digits."""
    return float(f"{x:.{digits - 1}e}") if x != 0 and math.isfinite(x) else float(x)


def rounded(rule: Rule, digits: int = DIGITS) -> Rule:
    """The rule with every number rounded to `digits` significant digits (as committed)."""
    r = lambda v: tuple(sig(x, digits) for x in v)  # noqa: E731
    return Rule(r(rule.mean), r(rule.scale), r(rule.weights), sig(rule.bias, digits), sig(rule.threshold, digits))


def fit_rule(x: np.ndarray, y: np.ndarray, use: Sequence[str] = FEATURES, digits: int | None = DIGITS) -> Rule:
    """The logistic rule on the signals `use` (the other weights 0), standardised over the rows of `x` (columns:
    FEATURES), with the Youden threshold on the same rows; rounded to `digits` significant digits (None: not),
    the threshold chosen on the rounded rule's scores."""
    mean, scale = standardise(x)
    cols = [FEATURES.index(k) for k in use]
    bias, w = fit_logistic(((x - mean) / scale)[:, cols], y)
    weights = np.zeros(len(FEATURES))
    weights[cols] = w
    rule = Rule(tuple(map(float, mean)), tuple(map(float, scale)), tuple(map(float, weights)), bias, 0.5)
    if digits is not None:
        rule = rounded(rule, digits)
    t = youden_threshold(row_scores(x, rule), y)
    return Rule(rule.mean, rule.scale, rule.weights, rule.bias, sig(t, digits) if digits is not None else t)


def row_scores(x: np.ndarray, rule: Rule) -> np.ndarray:
    """The rule's score of each row of signals (columns: FEATURES), as :func:`~rlhf_lab.evaluation.alarm.score`."""
    z = rule.bias + ((np.asarray(x, dtype=float) - np.asarray(rule.mean)) / np.asarray(rule.scale)) @ np.asarray(
        rule.weights)
    return sigmoid(z)


def design(cases: Sequence[Case]) -> tuple[np.ndarray, np.ndarray]:
    """(signals, labels) of every evaluation after the start of every case, stacked."""
    if not cases:
        return np.zeros((0, len(FEATURES))), np.zeros(0, dtype=bool)
    return np.vstack([c.signals for c in cases]), np.concatenate([c.labels for c in cases])


def fit_rules(train: Sequence[Case]) -> dict[str, Rule]:
    """{method: its rule fitted on the training cases}: the rule on every signal, and the baselines."""
    x, y = design(train)
    return {"rule": fit_rule(x, y), **{name: fit_rule(x, y, use) for name, use in BASELINES.items()}}


def raw_threshold(rule: Rule, feature: str) -> float:
    """For a rule on one signal: the value of that signal at which its score reaches the threshold."""
    k = FEATURES.index(feature)
    t = min(max(rule.threshold, 1e-12), 1 - 1e-12)
    return rule.mean[k] + rule.scale[k] * (math.log(t / (1 - t)) - rule.bias) / rule.weights[k]


def raw_condition(rule: Rule, feature: str) -> str:
    """Where a rule on one signal is raised, on that signal's scale: "`feature` ≥ x" (≤ for a negative weight)."""
    w = rule.weights[FEATURES.index(feature)]
    return f"`{feature}` {'≥' if w > 0 else '≤'} {raw_threshold(rule, feature):.{DIGITS}g}"


# -- the measures ---------------------------------------------------------------------------------------------------

def auc(s: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> float:
    """ROC AUC of scores `s` for labels `y` (ties count ½), each row weighted by `w` (default 1): the weighted
    share of (positive, negative) pairs the scores order right; nan without both classes."""
    return ranked_auc(ranks(s), y, w)


def ranks(s: np.ndarray) -> np.ndarray:  # each score's rank among the distinct ones: a bootstrap ranks once
    return np.unique(np.asarray(s, dtype=float), return_inverse=True)[1]


def ranked_auc(g: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> float:
    """:func:`auc` from the scores' ranks `g` (:func:`ranks`). Not sklearn's roc_auc_score (the same value): ranked
    once, this is 31× faster on 20,000 weighted rows, and the report's bootstraps call it thousands of times."""
    y, n = np.asarray(y, dtype=bool), int(g.max()) + 1 if len(g) else 0
    w = np.ones(len(g)) if w is None else np.asarray(w, dtype=float)
    pos, neg = np.bincount(g, weights=w * y, minlength=n), np.bincount(g, weights=w * ~y, minlength=n)
    n_pos, n_neg = pos.sum(), neg.sum()
    if n_pos <= 0 or n_neg <= 0:
        return math.nan
    below = np.cumsum(neg) - neg
    return float((pos * (below + 0.5 * neg)).sum() / (n_pos * n_neg))


def precision_recall(pred: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> tuple[float, float]:
    """(precision, recall) of the 0/1 predictions `pred` for labels `y`, rows weighted by `w`. Not sklearn's
    precision_score/recall_score (the same values): 170× faster on 20,000 rows, called in every bootstrap resample."""
    pred, y = np.asarray(pred, dtype=bool), np.asarray(y, dtype=bool)
    w = np.ones(len(y)) if w is None else np.asarray(w, dtype=float)
    tp, pp, p = (w * (pred & y)).sum(), (w * pred).sum(), (w * y).sum()
    return (float(tp / pp) if pp > 0 else math.nan), (float(tp / p) if p > 0 else math.nan)


@dataclass
class Outcome:
    """One method on one run: the score, whether it reaches the threshold (`flagged`) and whether the alarm is
    raised (from the first flag on) at each evaluation after the start, the index of the
    first alarm (None: never), and the gold_b kept by stopping there minus the best checkpoint's (t*) and minus the
    last evaluation's."""

    scores: np.ndarray
    flagged: np.ndarray
    raised: np.ndarray
    alarm: int | None
    lead: float
    kept_vs_peak: float
    kept_vs_last: float


def outcome(c: Case, rule: Rule) -> Outcome:
    """The rule on a case, its evaluations scored once (:func:`~rlhf_lab.evaluation.alarm.scores`): the alarm is
    raised at the first evaluation j whose score reaches the threshold (:func:`~rlhf_lab.evaluation.alarm.
    first_alarm`, read off those scores), and stopping there keeps the policy of evaluation j − 1 (never raised: the
    last); the lead is the step of the first alarm − t* (nan when never raised)."""
    s = np.asarray(scores(c.evals, rule), dtype=float)
    flagged = s >= rule.threshold
    raised = np.logical_or.accumulate(flagged)
    j = int(np.argmax(flagged)) + 1 if flagged.any() else None
    kept = len(c.evals) - 1 if j is None else j - 1
    lead = math.nan if j is None else float(c.evals[j].step - c.evals[c.peak].step)
    return Outcome(s, flagged, raised, j, lead, float(c.gold_b[kept] - c.gold_b[c.peak]),
                   float(c.gold_b[kept] - c.gold_b[-1]))


def frozen(c_or_r) -> bool:
    """Whether a case's run (or a run) started before the rule was frozen (:data:`FROZEN_AT_MS`; an unknown start
    time, 0, counts as before)."""
    return c_or_r.start_time <= FROZEN_AT_MS


def split_new(later: Sequence[Case], fitted: Sequence[Case]) -> tuple[list[Case], list[Case]]:
    """(the cases of `later` that are new evidence, those that rerun a job of `fitted`): a run whose job
    (:func:`~rlhf_lab.analysis.study_runs.job_key`: the same study, stage and overrides, seed included) is one the rule
    was fitted on is the same experiment again, not a prospective test; a run without a job key counts as new."""
    jobs = {c.job for c in fitted if c.job is not None}
    return [c for c in later if c.job not in jobs], [c for c in later if c.job is not None and c.job in jobs]


def leave_one_study_out(cases: Sequence[Case]) -> tuple[dict[str, dict[str, Rule]], dict[str, list[Outcome]]]:
    """Every study held out once: ({study: {method: rule fitted on the other studies}}, {method: the outcome of each
    case under its own study's fold}, in the order of `cases`)."""
    folds = {s: fit_rules([c for c in cases if c.study != s]) for s in sorted({c.study for c in cases})}
    return folds, {m: [outcome(c, folds[c.study][m]) for c in cases] for m in METHODS}


def bootstrap_counts(n: int, n_boot: int = N_BOOT, seed: int = SEED) -> np.ndarray:
    """(n_boot, n): how many times each of n runs is drawn in each resample of the runs with replacement."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(n_boot, n)) if n else np.zeros((n_boot, 0), dtype=int)
    return np.stack([np.bincount(d, minlength=n) for d in draws]) if n else draws


Statistic = Callable[[np.ndarray], float]  # run weights (how often each run is drawn) -> a number


def with_ci(stat: Statistic, counts: np.ndarray) -> tuple[float, float, float]:
    """(the statistic on the runs as they are, and its bootstrap interval over the resamples `counts`)."""
    return (stat(np.ones(counts.shape[1])), *percentile_ci([stat(c.astype(float)) for c in counts], LEVEL))


def case_rows(cases: Sequence[Case]) -> np.ndarray:  # each case's number of evaluation rows
    return np.array([len(c.labels) for c in cases], dtype=int)


def row_weights(rows: np.ndarray, run_w: np.ndarray) -> np.ndarray:  # each row weighted by its run's weight
    return np.repeat(np.asarray(run_w, dtype=float), rows)


def pooled(outcomes: Sequence[Outcome], attr: str) -> np.ndarray:
    return np.concatenate([getattr(o, attr) for o in outcomes]) if outcomes else np.zeros(0)


def auc_stat(cases: Sequence[Case], outs: Sequence[Outcome]) -> Statistic:
    """The pooled AUC over the evaluations of the (weighted) runs."""
    s, y = pooled(outs, "scores"), np.concatenate([c.labels for c in cases]) if cases else np.zeros(0, dtype=bool)
    g, rows = ranks(s), case_rows(cases)
    return lambda w: ranked_auc(g, y, row_weights(rows, w))


def within_auc_stat(cases: Sequence[Case], outs: Sequence[Outcome]) -> Statistic:
    """The within-study AUC over the evaluations of the (weighted) runs: each study's AUC weighted by its (weighted)
    number of (positive, negative) pairs, i.e. the share of the pairs of the same study ordered right."""
    s = pooled(outs, "scores")
    y = np.concatenate([c.labels for c in cases]) if cases else np.zeros(0, dtype=bool)
    study = np.repeat([c.study for c in cases], [len(c.labels) for c in cases])
    groups = [(g, ranks(s[g])) for g in (study == k for k in sorted({c.study for c in cases}))]
    rows = case_rows(cases)

    def stat(w: np.ndarray) -> float:
        rw = row_weights(rows, w)
        total = num = 0.0
        for g, rank in groups:
            pairs = (rw[g] * y[g]).sum() * (rw[g] * ~y[g]).sum()
            if pairs > 0:
                total += pairs
                num += pairs * ranked_auc(rank, y[g], rw[g])
        return num / total if total > 0 else math.nan
    return stat


def pr_stat(cases: Sequence[Case], outs: Sequence[Outcome], which: int, latched: bool) -> Statistic:
    """Precision (`which` 0) or recall (1) pooled over evaluations: predicted positive where the score reaches its
    rule's threshold, or (`latched`) from the first alarm on."""
    y = np.concatenate([c.labels for c in cases])
    pred = pooled(outs, "raised" if latched else "flagged")
    rows = case_rows(cases)
    return lambda w: precision_recall(pred, y, row_weights(rows, w))[which]


def mean_stat(values: Sequence[float]) -> Statistic:
    """The weighted mean of one number per run (nan values left out)."""
    v = np.asarray(values, dtype=float)
    ok = ~np.isnan(v)
    return lambda w: float((w[ok] * v[ok]).sum() / w[ok].sum()) if w[ok].sum() > 0 else math.nan


def median_stat(values: Sequence[float]) -> Statistic:
    """The median of one number per run, each run repeated as often as drawn (nan values left out)."""
    v = np.asarray(values, dtype=float)
    ok = ~np.isnan(v)
    return lambda w: float(np.median(np.repeat(v[ok], w[ok].astype(int)))) if w[ok].sum() > 0 else math.nan


def difference(a: Statistic, b: Statistic) -> Statistic:
    return lambda w: a(w) - b(w)
