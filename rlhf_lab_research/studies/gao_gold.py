"""``reports/gao_rm_scaling_gold/README.md``: the Gao study judged in gold-RM mode, beside the formula on the same runs.

The study (sweeps/sweep/gao_rm_scaling_gold.yaml) is ``gao_rm_scaling``'s PPO arm (β = 0, log-spaced evaluations) at
one proxy size with ``gold=rm_world``: the proxy RM learns from comparisons the gold RM labels, as in Gao et al. 2022,
and every evaluation scores the same samples with the gold RM (``eval/gold_reward``) and with the world's formula
(``eval/formula_gold_reward``). Per measure, Gao's RL form R(d) = d(α − β log d) is fitted to the gain over the start
against d = √KL, pooled over seeds with a bootstrap over seeds (:func:`~rlhf_lab_research.studies.gao.fit_group`).
The peak's place d* does not depend on a measure's scale and compares across the two; α, β and R(d*) are each in
their own measure's units. Per run: the rank agreement of the two measures and each one's split-half drop from its
peak; claim C1 judged with each measure as the gold (:func:`~rlhf_lab_research.studies.gold_validation.verdicts`).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Sequence

import numpy as np

from rlhf_lab.analysis.markdown import fmt, md_table
from rlhf_lab.analysis.plots import pyplot
from rlhf_lab.analysis.quantities import gold_drop
from rlhf_lab.analysis.report_files import check_folder
from rlhf_lab.analysis.study_runs import RunData, label, rm_size
from rlhf_lab_research.stats import t_effect
from rlhf_lab_research.studies.gao import LEVEL, N_BOOT, R2_GOOD, GroupFit, fit_group
from rlhf_lab_research.studies.gold_validation import (FORMULA, FORMULA_EVAL, RM, SHORT, as_measure,
                                                       ci_cell, fisher_mean, run_rho, verdict_lines, verdicts,
                                                       write_two_gold_study)
from rlhf_lab_research.studies import not_run_page

STUDY = "gao_rm_scaling_gold"
KEYS = {FORMULA: FORMULA_EVAL, RM: "eval/gold_reward"}
ORDER = (FORMULA, RM)


def curves(runs: Sequence[RunData], measure: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each run's (√KL, gain of `measure` over the first evaluation), in seed order; runs without points left out."""
    out = [r.points(KEYS[measure]) for r in sorted(runs, key=lambda r: int(r.seed) if r.seed.isdigit() else 0)]
    return [c for c in out if len(c[0])]


def fit_measures(runs: Sequence[RunData], n_boot: int = N_BOOT) -> dict[str, GroupFit]:
    """{measure: Gao's RL form pooled over the runs' seeds, with its bootstrap}; the same resamples of seeds for both
    measures (one bootstrap stream), so their intervals differ by the measure alone."""
    by_measure = {m: curves(runs, m) for m in ORDER}
    return {m: fit_group(cs, "rl", n_boot, seed=0) for m, cs in by_measure.items() if cs}


def fit_row(m: str, g: GroupFit) -> list:
    """One measure's row: its pooled estimates, each with its bootstrap interval, and how well the form fits."""
    def cell(what: str, digits: int = 3) -> str:
        lo, hi = g.ci(what)
        return f"{fmt(getattr(g.fit, what), digits)} [{fmt(lo, digits)}, {fmt(hi, digits)}]"

    return [SHORT[m], g.n_seeds, g.fit.n, cell("alpha"), cell("beta"), cell("d_star", 2), cell("r_star"),
            fmt(g.fit.r2, 3), fmt(g.r2_means, 3), fmt(g.in_data(), 2)]


def drop_effect(runs: Sequence[RunData], measure: str):
    """The mean over runs of the split-half drop of `measure` from its peak, with its Student-t interval."""
    return t_effect([d for d in (gold_drop(as_measure(r, measure)) for r in runs) if math.isfinite(d)], LEVEL)


def run_rows(runs: Sequence[RunData]) -> list[list]:
    rows = []
    for r in sorted(runs, key=lambda r: int(r.seed) if r.seed.isdigit() else 0):
        peaks = []
        for m in ORDER:
            s = [(v, step) for step, v in r.series(KEYS[m]) if math.isfinite(v)]
            peaks.append(max(s)[1] if s else "–")
        d, _ = r.points(KEYS[RM])
        rows.append([r.seed, fmt(run_rho(r), 2), *peaks, fmt(float(d.max()) if d.size else float("nan"), 2),
                     *(fmt(gold_drop(as_measure(r, m)), 3) for m in ORDER), f"`{r.run_id}`"])
    return rows


def plot(runs: Sequence[RunData], fits: dict[str, GroupFit], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(fits), figsize=(5.2 * len(fits), 4), squeeze=False)
    for ax, (m, g) in zip(axes[0], fits.items()):
        points = curves(runs, m)
        for d, r in points:
            ax.plot(d, r, "o-", alpha=0.35, ms=3, lw=0.8)
        if g.fit.ok:
            x = np.linspace(1e-3, max(float(c[0].max()) for c in points), 200)
            ax.plot(x, g.fit.curve(x), "k-", lw=2, label=f"d(α − β log d), d* = {g.fit.d_star:.2f}")
            ax.legend(fontsize=8)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xlabel("√KL to the SFT policy")
        ax.set_ylabel(f"gain over the start: {SHORT[m]}")
        ax.set_title(f"{SHORT[m].split(' (')[0]}: {g.n_seeds} seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_gao_gold_report(out_dir: Path | str = "reports", uri: str | None = None,
                          runs_files: Sequence[Path | str] = (), use_store: bool = True, require_runs: bool = False,
                          n_boot: int = N_BOOT) -> Path:
    """``<out_dir>/gao_rm_scaling_gold/README.md`` and its PNG from the study's PPO runs in the store and in
    `runs_files` (a run in both: the store's copy), or the files alone when not `use_store`; read from a store, the
    runs are kept beside it in ``runs.json.gz``, from which a clone regenerates it with ``--no-store --runs``."""
    return write_two_gold_study(STUDY, functools.partial(write_report, n_boot=n_boot), out_dir, uri, runs_files,
                                use_store, require_runs)


def write_report(runs_all: Sequence[RunData], commands: Sequence[str], out: Path, source: str, flags: str = "",
                 n_boot: int = N_BOOT) -> Path:
    check_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# Study `{STUDY}`: the Gao study in gold-RM mode", "",
             "PPO with no KL penalty against a proxy RM that learnt from comparisons the gold RM labels (`gold=rm_world`, "
             "its default recipe; the unbiased labeler), as in Gao et al. 2022; every evaluation scores the same "
             "samples with the gold RM (`eval/gold_reward`, its normalised score) and with the world's formula "
             "(`eval/formula_gold_reward`, gold units). Does a Gao-style study run with a gold RM see the "
             "over-optimisation the formula sees? The same study with the formula as the gold, at four proxy sizes: "
             "reports/gao_rm_scaling.", "",
             f"Reproduce (then `rlhf-lab-report {STUDY}`):", "", "```bash",
             *(commands or [f"rlhf-lab -m sweep={STUDY} hydra/launcher=parallel"]), "```", ""]
    runs = [r for r in runs_all if r.status == "FINISHED"]
    if not runs:
        return not_run_page(out, lines, f"no finished PPO runs with tag `rlhf_lab.study={STUDY}`", source)
    sizes = sorted({rm_size(r) for r in runs})
    other = len(runs_all) - len(runs)
    lines += [f"{len(runs)} finished PPO runs (β = 0){f', {other} not finished' if other else ''}; seeds "
              f"{', '.join(sorted({r.seed for r in runs}, key=int))}; proxy RM size {', '.join(sizes)}, one per seed "
              "(`reward_model.seed: ${seed}`). Held fixed: the gold RM (one, built once), the policy (`a_small`) and "
              "its SFT run, the preference prompts, the evaluation prompts.", ""]
    fits = fit_measures(runs, n_boot)
    plot(runs, fits, out / "gain_vs_sqrt_kl.png")
    rho = fisher_mean([run_rho(r) for r in runs])
    lines += ["## Gao's RL form, fitted to each measure on the same runs", "",
              "Gain over the first evaluation against d = √KL (`eval/kl`), every seed's points in one least-squares "
              f"fit; {int(LEVEL * 100)} % percentile bootstrap intervals over seeds ({n_boot} resamples, the same "
              "resamples for both measures). d* = exp(α/β − 1) is where the gain peaks: it does not depend on a "
              "measure's scale, so it compares across the two; α, β and R(d*) = β d* are in each measure's units "
              "(the gold RM's spread on SFT samples is about twice the formula's). \"Peak in data\": the share of "
              "bootstrap fits whose d* lies inside their √KL range.", "",
              md_table(["measure", "seeds", "points", "α", "β", "d*", "R(d*)", "R² (all points)",
                        "R² (binned means)", "peak in data"], [fit_row(m, g) for m, g in fits.items()]), "",
              "![gain vs sqrt KL, both measures](gain_vs_sqrt_kl.png)", ""]
    low = [SHORT[m] for m, g in fits.items() if not g.r2_means >= R2_GOOD]
    if low:
        lines += [f"R² (binned means) below {R2_GOOD}: {', '.join(low)}.", ""]
    drops = {m: drop_effect(runs, m) for m in ORDER}
    lines += ["## Per run", "",
              f"Rank agreement of the two measures over a run's evaluations (Spearman ρ): mean {ci_cell(rho)} (Fisher "
              "z, t over runs). Peak: the PPO step of a measure's highest evaluation. Drop: the split-half drop "
              "of each measure from its peak to the last evaluation, as claim C1 measures it; mean over runs "
              f"[{int(LEVEL * 100)} % t interval]: formula {ci_cell(drops[FORMULA], 3)}, gold RM "
              f"{ci_cell(drops[RM], 3)}.", "",
              md_table(["seed", "ρ", "peak step, formula", "peak step, gold RM", "largest √KL", "drop formula",
                        "drop gold RM", "run"], run_rows(runs)), ""]
    lines += ["## C1 judged with each gold", "",
              "The claims registry's effects and verdict rule on these β = 0 runs, once with each measure as the "
              "gold (the registry's margins are in the formula's units).", "", *verdict_lines(verdicts(runs, ("C1",)))]
    lines += ["## Runs", "", md_table(["run", "setting", "seed", "status"],
                                      [[f"`{r.run_id}`", f"`{label(r)}`", r.seed, r.status] for r in runs_all]), "",
              f"Runs read from {source}; generated by `rlhf-lab-report {STUDY}{flags}`.", ""]
    (out / "README.md").write_text("\n".join(lines))
    return out / "README.md"
