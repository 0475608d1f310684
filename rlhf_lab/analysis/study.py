"""``reports/<study>/README.md``: the study report of one canned study, from its runs in MLflow.

Figures (gold and proxy reward gain against √KL with the per-run Gao et al. fits, the gold reward–KL
frontier), a table per setting (mean ± standard deviation over seeds), the RM size × policy size and the
same- vs different-source tables when the study varies them, the runs that did not finish, and the command
that reproduces the study. Only FINISHED runs enter figures and tables; a study without runs gets a
"Not run yet" page. The metrics are described in docs/metrics.md.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from rlhf_lab.analysis.fits import frontier, peak_rl
from rlhf_lab.analysis.markdown import fmt, fmt_ms, md_table
from rlhf_lab.analysis.plots import plot_frontier, plot_reward_vs_sqrt_kl
from rlhf_lab.analysis.runs import RunData, groups, kl_gold_pairs, label, load_study, policy_size, rm_size, store_uri


def run_summary(r: RunData) -> dict[str, float]:
    a, b = r.fit()
    d_star, r_star = peak_rl(a, b)
    return {
        "gold_start": r.first("eval/gold_reward"), "gold_final": r.last("eval/gold_reward"),
        "gold_peak": r.peak("eval/gold_reward"),
        "gold_drop": r.peak("eval/gold_reward") - r.last("eval/gold_reward"),
        "proxy_start": r.first("eval/proxy_reward"), "proxy_final": r.last("eval/proxy_reward"),
        "kl_final": r.last("eval/kl"), "alpha": a, "beta": b, "d_star": d_star, "r_star": r_star,
        "rm_accuracy": r.rm_accuracy(),
    }


def reproduce_commands(study: str, parents: Sequence[Any]) -> list[str]:
    cmds = sorted({p.data.tags.get("rlhf_lab.command") for p in parents if p.data.tags.get("rlhf_lab.command")})
    return cmds or [f"rlhf-lab -m sweep={study}"]


def write_study_report(study: str, out_dir: Path | str = "reports", uri: str | None = None) -> Path:
    runs_all, parents = load_study(study, uri)
    out = Path(out_dir) / study
    out.mkdir(parents=True, exist_ok=True)
    runs = [r for r in runs_all if r.status == "FINISHED"]
    other = [r for r in runs_all if r.status != "FINISHED"]
    cmds = reproduce_commands(study, parents)
    lines = [f"# Study `{study}`", "", "Reproduce (then `rlhf-lab-report " + study + "`):", "", "```bash",
             *cmds, "```", ""]
    if not runs_all:
        lines += ["**Not run yet**: no runs with tag `rlhf_lab.study=" + study + "` in "
                  f"`{store_uri(uri)}`.", ""]
        (out / "README.md").write_text("\n".join(lines))
        return out / "README.md"
    seeds = sorted({r.seed for r in runs})
    lines += [f"{len(runs)} finished runs ({', '.join(sorted({r.stage for r in runs}))})"
              + (f", {len(other)} not finished ({', '.join(sorted({r.status for r in other}))})" if other else "")
              + f"; seeds {', '.join(seeds)}" + (" — figures are mean ± standard deviation over seeds." if len(seeds) > 1
                                                 else "."), ""]
    for r in other:
        lines.append(f"- {r.status}: `{label(r)}` seed {r.seed} ({r.run_id})"
                     + (f": {r.tags['rlhf_lab.error'][:200]}" if r.tags.get("rlhf_lab.error") else ""))
    if other:
        lines.append("")

    if runs:
        plot_reward_vs_sqrt_kl(runs, out / "gold_vs_sqrt_kl.png")
        lines += ["## Gold and proxy reward against √KL", "",
                  "Gain over each run's first evaluation against d = √KL (`eval/kl`, nats per response). Fit per run "
                  "(Gao et al. 2022): RL R(d) = d(α − β log d), peak d* = exp(α/β − 1); best-of-n R(d) = d(α − β d), "
                  "d* = α/(2β). β ≤ 0: no peak yet (still rising).", "", "![gold and proxy vs sqrt KL](gold_vs_sqrt_kl.png)", ""]
        rows = []
        for name, members in groups(runs).items():
            s = [run_summary(r) for r in members]
            col = lambda k: fmt_ms([x[k] for x in s])  # noqa: E731
            rows.append([f"`{name}`", members[0].stage, len(members), col("gold_start"), col("gold_final"),
                         col("gold_peak"), col("gold_drop"), col("proxy_start"), col("proxy_final"), col("kl_final"),
                         col("alpha"), col("beta"), col("d_star"), col("rm_accuracy")])
        lines += [md_table(["setting", "algo", "seeds", "gold start", "gold final", "gold peak", "drop from peak",
                            "proxy start", "proxy final", "KL final", "α", "β", "d* (√KL)", "RM accuracy"], rows), ""]

    if any(r.stage in ("ppo", "dpo") for r in runs):
        plot_frontier(runs, out / "frontier.png")
        lines += ["## Gold reward – KL frontier", "", "![frontier](frontier.png)", ""]
        rows = []
        for algo in ("ppo", "dpo"):
            rs = [r for r in runs if r.stage == algo]
            f = frontier([(kl, g) for r in rs for (_, kl), (_, g) in kl_gold_pairs(r)])
            if f:
                best = max(f, key=lambda p: p[1])
                rows.append([algo, len(rs), fmt(best[1]), fmt(best[0], 2), len(f)])
        if rows:
            lines += [md_table(["algo", "runs", "best gold on frontier", "at KL", "frontier points"], rows), ""]

    ppo = [r for r in runs if r.stage == "ppo"]
    if ppo and (len({rm_size(r) for r in ppo}) > 1 or len({policy_size(r) for r in ppo}) > 1):
        rows = []
        cells: dict[tuple[str, str], list[RunData]] = {}
        for r in ppo:
            cells.setdefault((policy_size(r), rm_size(r)), []).append(r)
        for (ps, rs_), members in sorted(cells.items()):
            s = [run_summary(r) for r in members]
            pol_n = [r.n_params() for r in members]
            rm_n = [r.rm_params() for r in members]
            ratio = [b / a for a, b in zip(pol_n, rm_n) if math.isfinite(a) and math.isfinite(b) and a > 0]
            rows.append([ps, rs_, len(members), fmt_ms([x["gold_peak"] for x in s]), fmt_ms([x["gold_final"] for x in s]),
                         fmt_ms([x["gold_drop"] for x in s]), fmt_ms([x["rm_accuracy"] for x in s]),
                         fmt_ms(ratio, 2)])
        lines += ["## RM size × policy size", "",
                  "Peak and final gold reward of PPO, the drop from the peak (over-optimisation), and the accuracy of "
                  "the upstream RM (`rm/accuracy` of the run in tag `rlhf_lab.upstream.rm`).", "",
                  md_table(["policy", "RM", "seeds", "peak gold", "final gold", "drop from peak", "RM accuracy",
                            "RM/policy params"], rows), ""]

    sources = {(r.value("reward_model.source") or "?", r.value("data.on_policy_fraction") or "0.0") for r in ppo}
    if ppo and len(sources) > 1:
        rows = []
        for src, frac in sorted(sources):
            members = [r for r in ppo if (r.value("reward_model.source") or "?", r.value("data.on_policy_fraction")
                                          or "0.0") == (src, frac)]
            s = [run_summary(r) for r in members]
            rows.append([src, frac, len(members), fmt_ms([x["gold_final"] for x in s]),
                         fmt_ms([x["gold_peak"] for x in s]), fmt_ms([x["gold_drop"] for x in s]),
                         fmt_ms([x["proxy_final"] for x in s]), fmt_ms([x["rm_accuracy"] for x in s])])
        lines += ["## Same- vs different-source RM", "",
                  md_table(["RM source", "on-policy fraction", "runs", "final gold", "peak gold", "drop from peak",
                            "final proxy", "RM accuracy"], rows), ""]

    lines += ["## Runs", "", md_table(["run", "algo", "setting", "seed", "status"],
                                      [[f"`{r.run_id}`", r.stage, f"`{label(r)}`", r.seed, r.status] for r in runs_all]),
              "", f"Tracking store: `{store_uri(uri)}`; generated by `rlhf-lab-report {study}`.", ""]
    (out / "README.md").write_text("\n".join(lines))
    return out / "README.md"
