"""The figures (matplotlib, Agg backend) of the study reports: reward gain against √KL with the Gao et al. fits, and
the gold reward–KL frontier; and of one policy run (its MLflow run's ``proxy_vs_gold.png``,
:mod:`rlhf_lab.analysis.run_figure`): gold and proxy reward against the step and against √KL."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from rlhf_lab.analysis.fits import MIN_FIT_POINTS, frontier
from rlhf_lab.analysis.study_runs import POLICY_STAGES, RunData, groups, kl_gold_pairs


def pyplot():
    """matplotlib.pyplot with the Agg backend (no screen)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_reward_vs_sqrt_kl(runs: Sequence[RunData], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharex=True)
    cmap = plt.get_cmap("viridis")
    g = groups(runs)
    for i, (name, members) in enumerate(g.items()):
        color = cmap(i / max(1, len(g) - 1))
        for j, r in enumerate(members):
            for ax, key in zip(axes, ("eval/gold_reward", "eval/proxy_reward")):
                d, y = r.points(key)
                if len(d):
                    ax.plot(d, y, "o", ms=3, color=color, alpha=0.7, label=name if j == 0 else None)
            fit = r.gao_fit()
            if fit.ok:  # drawn over the fitted data's range only
                xs = np.linspace(0, max(fit.d_hi, 1e-3), 100)
                axes[0].plot(xs, fit.curve(xs), "-", color=color, lw=1)
    axes[0].set_title(f"gold reward gain vs √KL (lines: Gao et al. fit, ≥ {MIN_FIT_POINTS} points)")
    axes[1].set_title("proxy (RM) reward gain vs √KL")
    for ax in axes:
        ax.set_xlabel("√KL  (KL in nats per response)")
        ax.axhline(0, color="grey", lw=0.5)
    axes[0].set_ylabel("reward − reward at start")
    for ax in (axes[1], axes[0]):  # the legend where there are points (no proxy reward: DPO without an RM)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="best")
            break
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_frontier(runs: Sequence[RunData], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    markers = dict(zip(POLICY_STAGES, "osD^v"))
    for i, algo in enumerate(POLICY_STAGES):
        rs = [r for r in runs if r.stage == algo]
        if not rs:
            continue
        color = f"C{i}"
        pts = [(kl, g) for r in rs for (_, kl), (_, g) in kl_gold_pairs(r)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], markers[algo], ms=3, alpha=0.35, color=color,
                label=f"{algo}: every evaluation" + (" (each n)" if algo == "bon" else ""))
        f = frontier(pts)
        if f:
            ax.plot([p[0] for p in f], [p[1] for p in f], "-", lw=1.5, color=color, label=f"{algo} frontier")
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlabel("KL(π‖π_ref), nats per response (best-of-n: log n − (n − 1)/n)")
    ax.set_ylabel("gold reward")
    ax.set_title("gold reward – KL frontier")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


RUN_CURVES = (("eval/gold_reward", "gold", "C0"), ("eval/proxy_reward", "proxy (RM)", "C1"))  # what a run's figure draws


def plot_run_rewards(r: RunData, path: Path) -> list[str]:
    """One policy run's figure: gold and proxy reward (``eval/gold_reward``, ``eval/proxy_reward``; a best-of-n
    run's ``bon/*`` curve, n as the step) against the step and against √KL (``eval/kl``), gold on the left axis and
    proxy on the right one (their scales differ). A run that logged no gold (external data without ``gold.path``)
    or no proxy (DPO without an RM) gets what it logged, and the title says which is missing. Returns the
    metrics drawn; draws nothing and returns [] when the run logged neither."""
    drawn = [(key, name, color) for key, name, color in RUN_CURVES if r.series(key)]
    if not drawn:
        return []
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, against in zip(axes, ("step", "sqrt_kl")):
        twin = ax.twinx() if len(drawn) > 1 else None
        for (key, name, color), a in zip(drawn, (ax, twin)):
            if against == "step":
                x, y = zip(*r.series(key))
            else:
                x, y = r.points(key, gain=False)
            a.plot(x, y, "o-", ms=3, color=color, label=name)
            a.set_ylabel(f"{name}: {key}", color=color)
        ax.set_xlabel("n (best-of-n)" if r.stage == "bon" and against == "step" else
                      "step" if against == "step" else "√KL  (eval/kl, nats per response)")
    missing = [name for key, name, _ in RUN_CURVES if key not in {k for k, _, _ in drawn}]
    title = f"{r.tags.get('mlflow.runName') or f'{r.stage} run {r.run_id}'}: " + " and ".join(n for _, n, _ in drawn)
    fig.suptitle(title + " reward" + (f" (no {' or '.join(missing)} logged)" if missing else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return [key for key, _, _ in drawn]
