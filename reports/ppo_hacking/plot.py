"""Figures of reports/ppo_hacking/README.md from MLflow runs.

    python reports/ppo_hacking/plot.py --uri sqlite:///mlflow.db --out reports/ppo_hacking \
        --run "adaptive KL (default)=<run_id>" --run "β = 0=<run_id>" ...

Writes curves.png (gold vs proxy, KL, β, length, filler rate, diversity over PPO steps) and prints a
markdown table of headline numbers per run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402

PANELS = [
    ("eval/gold_reward", "gold reward (eval, held-out prompts)"),
    ("eval/proxy_reward", "proxy = RM score (eval, normalised)"),
    ("objective/kl", "KL(π‖π_ref) per response (train batch, nats)"),
    ("objective/beta", "β"),
    ("objective/length", "response length (tokens)"),
    ("objective/filler_rate", "filler rate"),
    ("objective/distinct_2", "distinct-2"),
    ("objective/unique_rate", "unique-sample rate"),
]


def history(client, run_id, key):
    h = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
    return [s for s, _ in h], [v for _, v in h]


def ema(xs, span=10):
    a, out, m = 2 / (span + 1), [], None
    for x in xs:
        m = x if m is None else (1 - a) * m + a * x
        out.append(m)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--uri", default="sqlite:///mlflow.db")
    ap.add_argument("--out", default="reports/ppo_hacking")
    ap.add_argument("--name", default="curves.png")
    ap.add_argument("--run", action="append", required=True, help="label=run_id")
    args = ap.parse_args()
    mlflow.set_tracking_uri(args.uri)
    client = mlflow.tracking.MlflowClient()
    runs = [r.rsplit("=", 1) for r in args.run]
    fig, axes = plt.subplots(2, 4, figsize=(18, 7.5))
    for (key, title), ax in zip(PANELS, axes.flat):
        for label, rid in runs:
            s, v = history(client, rid, key)
            if not s:
                continue
            if key.startswith("objective/") and key != "objective/beta":
                ax.plot(s, v, alpha=0.2)
                ax.plot(s, ema(v), label=label, color=ax.lines[-1].get_color())
            else:
                ax.plot(s, v, marker="o" if key.startswith("eval/") else None, ms=3, label=label)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("PPO step")
        if key == "objective/beta":
            ax.set_yscale("symlog", linthresh=1e-3)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / args.name, dpi=110)
    print(f"wrote {out / args.name}")
    # gold reward against KL (Gao et al. 2022 plot gold against d = sqrt(KL)), one point per evaluation
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for label, rid in runs:
        s, g = history(client, rid, "eval/gold_reward")
        _, kl = history(client, rid, "eval/kl")
        ax.plot([max(k, 0) ** 0.5 for k in kl], g, marker="o", ms=3, label=label)
    ax.set_xlabel("sqrt(eval/kl)  (KL in nats per response)")
    ax.set_ylabel("eval/gold_reward")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / args.name.replace(".png", "_gold_vs_kl.png"), dpi=110)
    print("| run | gold SFT → peak → final | proxy SFT → final | KL final (eval) | length final | filler final | distinct-2 final | hacking alarm |")
    print("|---|---|---|---|---|---|---|---|")
    for label, rid in runs:
        run = client.get_run(rid)
        _, g = history(client, rid, "eval/gold_reward")
        _, p = history(client, rid, "eval/proxy_reward")
        _, kl = history(client, rid, "eval/kl")
        last = lambda k: history(client, rid, k)[1][-1]  # noqa: E731
        alarm = run.data.tags.get("rlhf_lab.reward_hacking_step", "—")
        print(f"| {label} | {g[0]:.2f} → {max(g):.2f} → {g[-1]:.2f} | {p[0]:.2f} → {p[-1]:.2f} | {kl[-1]:.1f} | "
              f"{last('eval/length'):.1f} | {last('eval/filler_rate'):.2f} | {last('eval/distinct_2'):.3f} | {alarm} |")


if __name__ == "__main__":
    main()
