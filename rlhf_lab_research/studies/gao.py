"""``reports/gao_rm_scaling/README.md``: Gao, Schulman & Hilton 2022 reproduced on the gold world.

Reads the PPO runs of ``sweep=gao_rm_scaling`` (β = 0, evaluations log-spaced in steps) and the best-of-n runs of
``sweep=gao_rm_scaling_bon`` (the same RMs), groups them by labeler and RM size, and per group fits Gao et al.'s
forms to the gold gain over the start, **pooled over seeds** (all seeds' points in one least-squares fit,
:func:`pooled_fit`):

    RL (PPO):   R(d) = d (α − β log d)        best-of-n:   R(d) = d (α − β d)        d = √KL

Each estimate (α, β, the peak d* and the peak gain R(d*)) carries a percentile bootstrap interval over seeds
(:func:`bootstrap_fits`: the seeds of the group resampled with replacement, the pooled fit redone). R² is given
twice: over every point (the seed-to-seed scatter counts as misfit) and over binned means
(the pooled points averaged in bins along √KL: the curve the form is meant to describe). The trend table regresses each estimate on log10(RM parameters)
(:func:`trend`), with a bootstrap interval that resamples the seeds of every size independently, next to the
direction Gao et al. report. Pure functions of numbers, then the report; nothing here fits a run with β > 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from rlhf_lab.analysis.fits import MIN_FIT_POINTS, GaoFit, fit_bon, fit_rl, r_squared
from rlhf_lab.analysis.markdown import fmt, md_table
from rlhf_lab.analysis.plots import pyplot
from rlhf_lab.analysis.report_files import check_folder, inside, no_runs
from rlhf_lab.analysis.study_runs import RunData, load_study, rm_size, store_uri
from rlhf_lab.analysis.study_report import reproduce_commands, runs_table, study_runs_from_files
from rlhf_lab_research.stats import percentile_ci

RL_STUDY, BON_STUDY = "gao_rm_scaling", "gao_rm_scaling_bon"
KL_STUDY = "gao_rm_scaling_kl"  # RL_STUDY's unbiased arm, evaluated where KL moves (eval.schedule=kl): C13's judged parts
N_BOOT = 2000
R2_GOOD = 0.9  # a fit "that fits": R² of the binned means at least this
LEVEL = 0.95
Curve = tuple[np.ndarray, np.ndarray]  # (d = √KL, gold gain over the start) of one run
ESTIMATES = ("alpha", "beta", "d_star", "r_star")
# What Gao et al. 2022 report as the proxy RM grows, as we read their Fig. 3 and §3.2: the coefficients vary
# smoothly, about logarithmically, with RM size, and a larger RM gives a higher peak of gold at a larger KL.
GAO_DIRECTION = {("rl", "alpha"): "not reported", ("rl", "beta"): "falls",
                 ("bon", "alpha"): "rises", ("bon", "beta"): "falls",
                 ("rl", "d_star"): "rises", ("bon", "d_star"): "rises",
                 ("rl", "r_star"): "rises", ("bon", "r_star"): "rises"}
NAMES = {"alpha": "α", "beta": "β", "d_star": "d* (√KL at the peak)", "r_star": "peak gold gain R(d*)"}


def pooled_fit(curves: Sequence[Curve], form: str) -> GaoFit:
    """The form ("rl" or "bon") fitted by least squares to every point of `curves` at once (fits.fit_rl /
    fits.fit_bon; at least MIN_FIT_POINTS points with d > 0)."""
    if not curves:
        return (fit_bon if form == "bon" else fit_rl)([], [])
    d = np.concatenate([np.asarray(c[0], dtype=float) for c in curves])
    r = np.concatenate([np.asarray(c[1], dtype=float) for c in curves])
    return (fit_bon if form == "bon" else fit_rl)(d, r, MIN_FIT_POINTS)


def mean_curve(curves: Sequence[Curve]) -> Curve:
    """The pooled points (d > 0) sorted by d and averaged in consecutive bins of as many points as there are
    seeds: (mean d, mean gain) per bin. The seeds reach different KLs at the same step, so means are taken along
    d, not per evaluation step."""
    if not curves:
        return np.zeros(0), np.zeros(0)
    d = np.concatenate([np.asarray(c[0], dtype=float) for c in curves])
    r = np.concatenate([np.asarray(c[1], dtype=float) for c in curves])
    ok = np.isfinite(d) & np.isfinite(r) & (d > 1e-8)
    d, r = d[ok], r[ok]
    order = np.argsort(d, kind="stable")
    bins = [order[i:i + len(curves)] for i in range(0, len(order), len(curves))]
    return np.asarray([d[b].mean() for b in bins]), np.asarray([r[b].mean() for b in bins])


def r2_of_means(fit: GaoFit, curves: Sequence[Curve]) -> float:
    """R² of `fit` on the binned means of the pooled points (:func:`mean_curve`)."""
    d, r = mean_curve(curves)
    return r_squared(r, fit.curve(d)) if fit.ok and d.size >= 2 else float("nan")


def bootstrap_fits(curves: Sequence[Curve], form: str, n_boot: int = N_BOOT, seed: int = 0) -> list[GaoFit]:
    """`n_boot` pooled fits, each to a resample of the seeds (curves) with replacement."""
    rng = np.random.default_rng(seed)
    k = len(curves)
    return [pooled_fit([curves[i] for i in rng.integers(0, k, k)], form) for _ in range(n_boot)] if k else []


@dataclass
class GroupFit:
    """The pooled fit of one group (labeler × RM size × method) with its bootstrap."""

    form: str
    fit: GaoFit
    n_seeds: int
    r2_means: float
    boot: list[GaoFit] = field(default_factory=list)
    means: Curve = field(default_factory=lambda: (np.zeros(0), np.zeros(0)))  # the binned means (mean_curve)

    def ci(self, what: str) -> tuple[float, float]:
        return percentile_ci([getattr(f, what) for f in self.boot])

    def in_data(self) -> float:
        """Share of the bootstrap fits whose peak lies inside their data."""
        return float(np.mean([f.peak_in_data for f in self.boot])) if self.boot else float("nan")


def fit_group(curves: Sequence[Curve], form: str, n_boot: int = N_BOOT, seed: int = 0) -> GroupFit:
    fit = pooled_fit(curves, form)
    return GroupFit(form, fit, len(curves), r2_of_means(fit, curves), bootstrap_fits(curves, form, n_boot, seed),
                    mean_curve(curves))


def misfit_note(g: GroupFit) -> str:
    """Why a pooled fit misses its mean curve (the binned means, :func:`mean_curve`), from the data: the form fitted
    to the rise alone (the binned means up to the highest one), whether that fit follows the rise (R² ≥
    :data:`R2_GOOD`) and how far it falls from the peak to the last bin against how far the mean gold falls; and
    the rise's curvature (least squares of the gain on d and d²): a convex rise (its d² term gives ≥ 10 % of the
    peak gain) followed by a peak, which neither form can follow (the RL form's curvature is −β/d, best-of-n's −2β:
    one sign for every d)."""
    d, r = (np.asarray(x, dtype=float) for x in g.means)
    k = int(np.argmax(r)) if d.size else -1
    form = "d(α − β log d)" if g.form == "rl" else "d(α − β d)"
    pre = (fit_bon if g.form == "bon" else fit_rl)(d[:k + 1], r[:k + 1], MIN_FIT_POINTS)
    if not pre.ok:
        return f"only {k + 1} binned means up to the mean curve's peak (√KL {d[k]:.2f}): too few to say" if k >= 0 \
            else "no points"
    curv = float(np.linalg.lstsq(np.stack([d[:k + 1], d[:k + 1] ** 2], 1), r[:k + 1], rcond=None)[0][1])
    peak = f"up to the mean curve's peak at √KL {d[k]:.2f}"
    bend = "−β/d" if g.form == "rl" else "−2β"
    if curv > 0 and curv * d[k] ** 2 >= 0.1 * r[k] and k < d.size - 1:  # convex: ≥ 10 % of the peak gain from d²
        return (f"the mean gold rises convexly in √KL (d² term {curv:+.3f} {peak}) and then turns over; the form's "
                f"curvature {bend} has one sign for every d, so with a peak (β > 0) {form} is concave throughout and "
                "cannot follow both")
    if pre.r2 >= R2_GOOD and k < d.size - 1:
        fall, fall_fit = float(r[k] - r[-1]), float(pre.curve(d[k:k + 1])[0] - pre.curve(d[-1:])[0])
        how = "faster" if fall > fall_fit else "more slowly"
        fit_does = f"falls {fall_fit:.2f}" if fall_fit >= 0 else f"still rises {-fall_fit:.2f}"
        return (f"the rise alone follows the form (R² {pre.r2:.2f} {peak}), but from there to √KL {d[-1]:.2f} the "
                f"mean gold falls {fall:.2f} where that fit {fit_does}: gold falls {how} after its peak than {form} "
                "allows")
    return f"the form fitted to the rise alone has R² {pre.r2:.2f} ({peak}; d² term of the rise {curv:+.3f})"


def slope(x: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of y on x over the finite pairs (nan from fewer than 2 distinct x)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 2 or np.ptp(x[ok]) == 0:
        return float("nan")
    return float(np.polyfit(x[ok], y[ok], 1)[0])


def trend(sizes: Sequence[float], groups: Sequence[GroupFit], what: str) -> tuple[float, float, float]:
    """(slope, lo, hi) of the estimate `what` against log10(RM parameters) over the sizes: the slope of the
    pooled estimates, and a percentile interval from the b-th bootstrap fit of every size (each size's seeds are
    resampled independently); a replicate with a non-finite estimate at some size has no slope."""
    x = np.log10(np.asarray(sizes, dtype=float))
    point = slope(x, [getattr(g.fit, what) for g in groups])
    if not all(math.isfinite(getattr(g.fit, what)) for g in groups):
        point = float("nan")
    n = min((len(g.boot) for g in groups), default=0)
    reps = []
    for b in range(n):
        ys = [getattr(g.boot[b], what) for g in groups]
        reps.append(slope(x, ys) if all(math.isfinite(v) for v in ys) else float("nan"))
    lo, hi = percentile_ci(reps)
    return point, lo, hi


# -- the runs -------------------------------------------------------------------------------------------------------

def curve_of(r: RunData) -> Curve:
    """(√KL, gold gain over the first evaluation) of one run (the best-of-n run: n as the step)."""
    return r.points("eval/gold_reward")


def group_key(r: RunData) -> tuple[str, str]:
    return str(r.value("labeler") or "?"), rm_size(r)


def by_group(runs: Sequence[RunData]) -> dict[tuple[str, str], list[RunData]]:
    out: dict[tuple[str, str], list[RunData]] = {}
    for r in runs:
        out.setdefault(group_key(r), []).append(r)
    return out


def _params(members: Sequence[RunData]) -> float:
    v = [r.rm_params() for r in members if math.isfinite(r.rm_params())]
    return float(np.median(v)) if v else float("nan")


def load_runs(uri: str | None, runs_files: Sequence[Path | str], use_store: bool
              ) -> tuple[list[RunData], list[str]]:
    """The two studies' runs (store, then files; a run in both: the store's copy) and their sweep commands."""
    runs: dict[str, RunData] = {}
    cmds: set[str] = set()
    for study in (RL_STUDY, BON_STUDY):
        if runs_files:
            kept, kept_cmds = study_runs_from_files(study, runs_files)
            runs.update({r.run_id: r for r in kept})
            cmds |= set(kept_cmds)
        if use_store:
            found, parents = load_study(study, uri)
            runs.update({r.run_id: r for r in found})
            if parents:
                cmds |= set(reproduce_commands(study, parents))
    return list(runs.values()), sorted(cmds) or [f"rlhf-lab -m sweep={RL_STUDY} hydra/launcher=parallel",
                                                 f"rlhf-lab -m sweep={BON_STUDY} hydra/launcher=parallel"]


# -- the report -----------------------------------------------------------------------------------------------------

def _ci_cell(value: float, ci: tuple[float, float], digits: int = 3) -> str:
    if math.isnan(value):
        return "–"
    return f"{fmt(value, digits)} [{fmt(ci[0], digits)}, {fmt(ci[1], digits)}]"


def _peak_cells(g: GroupFit) -> list[str]:
    f = g.fit
    if not f.ok:
        return [f"no fit ({f.status})", "–"]
    where = "" if f.peak_in_data else f" ({f.status}: √KL {fmt(f.d_lo, 2)}–{fmt(f.d_hi, 2)})"
    return [_ci_cell(f.d_star, g.ci("d_star"), 2) + where, _ci_cell(f.r_star, g.ci("r_star"))]


def fit_rows(fits: dict[tuple[str, str, str], GroupFit], params: dict[str, float], labeler: str, form: str) -> list[list]:
    rows = []
    for size in params:
        g = fits.get((labeler, size, form))
        if g is None:
            continue
        f = g.fit
        rows.append([size, fmt(params[size], 0, sci=False), g.n_seeds, f.n, _ci_cell(f.alpha, g.ci("alpha")),
                     _ci_cell(f.beta, g.ci("beta")), *_peak_cells(g), fmt(f.r2), fmt(g.r2_means),
                     fmt(g.in_data(), 2)])
    return rows


def plot(groups: dict[tuple[str, str], list[RunData]], fits: dict, params: dict[str, float], labelers: list[str],
         path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(len(labelers), 3, figsize=(15, 4.2 * len(labelers)), squeeze=False)
    cmap = plt.get_cmap("viridis")
    sizes = list(params)
    for i, lab in enumerate(labelers):
        for j, size in enumerate(sizes):
            color = cmap(j / max(1, len(sizes) - 1))
            name = f"RM {size} ({fmt(params[size] / 1e3, 0, sci=False)}k)"
            for col, (stage, key, form) in enumerate((("ppo", "eval/gold_reward", "rl"),
                                                       ("ppo", "eval/proxy_reward", None),
                                                       ("bon", "eval/gold_reward", "bon"))):
                members = [r for r in groups.get((lab, size), []) if r.stage == stage]
                curves = [r.points(key) for r in members]
                curves = [c for c in curves if len(c[0])]
                if not curves:
                    continue
                ax = axes[i][col]
                for d, y in curves:
                    ax.plot(d, y, ".", ms=2.5, color=color, alpha=0.35)
                md, my = mean_curve(curves)
                ax.plot(md, my, "o", ms=4, color=color, label=name)
                g = fits.get((lab, size, form)) if form else None
                if g is not None and g.fit.ok:
                    xs = np.linspace(0, g.fit.d_hi, 100)
                    ax.plot(xs, g.fit.curve(xs), "-", color=color, lw=1.2)
        for col, title in enumerate(("PPO gold gain (lines: pooled RL fit)", "PPO proxy gain",
                                     "best-of-n gold gain (lines: pooled BoN fit)")):
            ax = axes[i][col]
            ax.set_title(f"labeler={lab}: {title}", fontsize=9)
            ax.set_xlabel("√KL (nats per response)")
            ax.axhline(0, color="grey", lw=0.5)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        axes[i][0].set_ylabel("reward − reward at start")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def compute_fits(groups: dict[tuple[str, str], list[RunData]], n_boot: int = N_BOOT
                 ) -> dict[tuple[str, str, str], GroupFit]:
    """{(labeler, RM size, form): its pooled fit}; each group's bootstrap draws from its own stream, so the
    resamples of two sizes are independent."""
    out = {}
    for i, ((lab, size), members) in enumerate(sorted(groups.items())):
        for j, (stage, form) in enumerate((("ppo", "rl"), ("bon", "bon"))):
            curves = [curve_of(r) for r in sorted(members, key=lambda r: r.seed) if r.stage == stage]
            curves = [c for c in curves if len(c[0])]
            if curves:
                out[(lab, size, form)] = fit_group(curves, form, n_boot, seed=2 * i + j)
    return out


def write_gao_report(out_dir: Path | str = "reports", uri: str | None = None, runs_files: Sequence[Path | str] = (),
                     use_store: bool = True, require_runs: bool = False, n_boot: int = N_BOOT) -> Path:
    """``<out_dir>/gao_rm_scaling/README.md`` and ``gold_vs_sqrt_kl.png`` from the two studies' FINISHED runs."""
    out = inside(out_dir, Path(out_dir) / RL_STUDY)
    check_folder(out)
    runs_all, cmds = load_runs(uri, runs_files, use_store)
    source = " and ".join(([f"`{store_uri(uri)}`"] if use_store else []) + [f"`{f}`" for f in runs_files])
    if require_runs and not runs_all:
        raise no_runs(RL_STUDY, source.replace("`", ""))
    out.mkdir(parents=True, exist_ok=True)
    flags = ("" if use_store else " --no-store") + "".join(f" --runs {f}" for f in runs_files)
    runs = [r for r in runs_all if r.status == "FINISHED"]
    groups = by_group(runs)
    labelers = sorted({k[0] for k in groups}, key=lambda s: (s != "unbiased", s))
    params = {s: _params([r for (_, sz), rs in groups.items() if sz == s for r in rs]) for s in {k[1] for k in groups}}
    sizes = sorted(params, key=params.get)
    params = {s: params[s] for s in sizes}  # in order of size: the tables' and the figure's order
    fits = compute_fits(groups, n_boot)
    lines = [f"# Study `{RL_STUDY}`: Gao et al. (2022) on the gold world", "",
             "Reproduce (then `rlhf-lab-report gao_rm_scaling`):", "", "```bash", *cmds, "```", ""]
    if not runs:
        lines += [f"**Not run yet**: no finished runs of {RL_STUDY} or {BON_STUDY} in {source}.", ""]
        (out / "README.md").write_text("\n".join(lines))
        return out / "README.md"
    seeds = sorted({r.seed for r in runs}, key=int)
    n_ppo, n_bon = sum(r.stage == "ppo" for r in runs), sum(r.stage == "bon" for r in runs)
    lines += [
        f"{n_ppo} PPO runs (β = 0) and {n_bon} best-of-n runs, FINISHED; seeds {', '.join(seeds)}; each seed trains "
        "its own RM (`reward_model.seed: ${seed}`), and the best-of-n job of a seed uses the RM of the PPO job of "
        "that seed. Held fixed: the policy (`a_small`) and its SFT run, the preference prompts, the 384 eval prompts. "
        f"Not finished: {len(runs_all) - len(runs)}.", "",
        "## Method", "",
        "Gain in gold reward over the start (the first evaluation; n = 1 for best-of-n) against d = √KL to the SFT "
        "policy (PPO: `eval/kl`, nats per response, at the log-spaced evaluations; best-of-n: log n − (n − 1)/n). "
        "Per labeler and RM size, one least-squares fit of Gao et al.'s form to the points of all seeds together: "
        "RL R(d) = d(α − β log d), peak d* = exp(α/β − 1), R(d*) = β d*; best-of-n R(d) = d(α − β d), d* = α/(2β), "
        f"R(d*) = α²/(4β). Intervals: {int(LEVEL * 100)} % percentile bootstrap over seeds ({n_boot} resamples of "
        "the seeds with replacement, the pooled fit redone). R² (all points) counts the seed-to-seed scatter as "
        "misfit; R² (binned means) is the fit against the mean curve: the pooled points sorted by √KL and averaged "
        "in bins of as many points as seeds (the seeds reach different KLs at the same step). "
        "\"Peak in data\" is the share of bootstrap fits whose d* lies inside their √KL range. No fit is made on "
        "runs with β > 0.", "",
        "![gold and proxy vs sqrt KL](gold_vs_sqrt_kl.png)", ""]
    plot(groups, fits, params, labelers, out / "gold_vs_sqrt_kl.png")
    header = ["RM", "RM params", "seeds", "points", "α", "β", "d*", "R(d*)", "R² (all points)", "R² (binned means)",
              "peak in data"]
    for lab in labelers:
        lines += [f"## labeler={lab}", ""]
        for form, title in (("rl", "PPO, RL form"), ("bon", "best-of-n, BoN form")):
            rows = fit_rows(fits, params, lab, form)
            if rows:
                lines += [f"### {title}", "", md_table(header, rows), ""]
        low = [f"- {'RL' if form == 'rl' else 'BoN'} {size} ({fmt(fits[(lab, size, form)].r2_means)}): "
               f"{misfit_note(fits[(lab, size, form)])}."
               for form in ("rl", "bon") for size in sizes
               if (lab, size, form) in fits and not fits[(lab, size, form)].r2_means >= R2_GOOD]
        lines += ([f"Pooled fits with R² (binned means) below {R2_GOOD}, and why, from their binned means (the form "
                   "fitted to the rise alone, up to the highest mean; the rise's curvature, the d² term of a least-"
                   "squares fit on d and d²; a rise counts as convex when that term gives at least 10 % of the peak "
                   "gain):", "", *low, ""] if low else
                  [f"Pooled fits with R² (binned means) below {R2_GOOD}: none.", ""])
        trend_rows = []
        for form in ("rl", "bon"):
            gs = [fits.get((lab, s, form)) for s in sizes]
            if any(g is None for g in gs) or len(gs) < 2:
                continue
            for what in ESTIMATES:
                b, lo, hi = trend([params[s] for s in sizes], gs, what)
                seen = ("–" if math.isnan(b) else "rises" if lo > 0 else "falls" if hi < 0 else "no clear trend")
                trend_rows.append([f"{'RL' if form == 'rl' else 'BoN'} {NAMES[what]}", _ci_cell(b, (lo, hi)), seen,
                                   GAO_DIRECTION[(form, what)]])
        if trend_rows:
            lines += ["### Trend against RM size", "",
                      "Slope of each pooled estimate on log10(RM parameters) across the sizes (per decade of RM "
                      "parameters), with its bootstrap interval (every size's seeds resampled independently; a "
                      "resample in which some size's estimate is infinite, e.g. no peak, has no slope); \"here\" "
                      "reads the interval: rises or falls when it excludes 0.", "",
                      md_table(["estimate", "slope per decade [95 % CI]", "here", "Gao et al. 2022"], trend_rows),
                      ""]
    lines += ["## Runs", "", runs_table(sorted(runs_all, key=lambda r: (r.stage, group_key(r), int(r.seed)
                                                                        if r.seed.isdigit() else 0))), "",
              f"Runs read from {source}; generated by `rlhf-lab-report {RL_STUDY}{flags}`.", ""]
    (out / "README.md").write_text("\n".join(lines))
    return out / "README.md"
