"""`rlhf-lab-report`: study reports and the claims report, computed from the MLflow runs present.

    rlhf-lab-report ppo_beta_grid        # -> reports/ppo_beta_grid/README.md + PNG plots
    rlhf-lab-report --claims             # -> reports/claims.md (one line per claim the studies cover)

Runs are found by the tag ``rlhf_lab.study`` (set by every sweep file in sweeps/sweep/) in the tracking
store of rlhf_lab/tracking.py (``MLFLOW_TRACKING_URI``, else ``--uri``, else ``sqlite:///mlflow.db``).
Only FINISHED runs enter figures and verdicts; nothing is ever filled in for a study without runs.

Gold reward against d = √KL (KL = ``eval/kl``, nats per response) is fitted with the functional forms of
Gao, Schulman & Hilton 2022 (their eq. 1-2), on the gain over the run's first evaluation (the start policy):

    RL:         R(d) = d (α − β log d)     peak at d* = exp(α/β − 1), R(d*) = β d*
    best-of-n:  R(d) = d (α − β d)         peak at d* = α / (2β),     R(d*) = α² / (4β)

both by least squares on R/d, which is linear in (α, β).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

STUDY_TAG = "rlhf_lab.study"
POLICY_STAGES = ("ppo", "dpo", "bon", "best_of_n")
BON_STAGES = ("bon", "best_of_n")
HISTORY_KEYS = ("eval/gold_reward", "eval/proxy_reward", "eval/kl", "eval/entropy", "eval/distinct_2",
                "eval/length", "eval/filler_rate")
STUDIES = ("ppo_beta_grid", "dpo_beta_grid", "rm_size_vs_policy_size", "rm_source", "seeds")


# ------------------------------------------------------------------------------------------------------------
# Gao et al. 2022 functional forms (pure functions)


def _clean(d: Sequence[float], r: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    d, r = np.asarray(d, dtype=float), np.asarray(r, dtype=float)
    ok = np.isfinite(d) & np.isfinite(r) & (d > 1e-8)
    return d[ok], r[ok]


def fit_gao_rl(d: Sequence[float], r: Sequence[float]) -> tuple[float, float]:
    """(α, β) of R(d) = d(α − β log d): least squares on r/d = α − β log d over the points with d > 0."""
    d, r = _clean(d, r)
    if len(d) < 2 or np.ptp(np.log(d)) < 1e-9:
        return float("nan"), float("nan")
    X = np.stack([np.ones_like(d), -np.log(d)], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(X, r / d, rcond=None)
    return float(alpha), float(beta)


def fit_gao_bon(d: Sequence[float], r: Sequence[float]) -> tuple[float, float]:
    """(α, β) of R(d) = d(α − β d): least squares on r/d = α − β d over the points with d > 0."""
    d, r = _clean(d, r)
    if len(d) < 2 or np.ptp(d) < 1e-9:
        return float("nan"), float("nan")
    X = np.stack([np.ones_like(d), -d], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(X, r / d, rcond=None)
    return float(alpha), float(beta)


def gao_rl(d: Any, alpha: float, beta: float) -> np.ndarray:
    d = np.asarray(d, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(d > 0, d * (alpha - beta * np.log(np.where(d > 0, d, 1.0))), 0.0)


def gao_bon(d: Any, alpha: float, beta: float) -> np.ndarray:
    d = np.asarray(d, dtype=float)
    return d * (alpha - beta * d)


def peak_rl(alpha: float, beta: float) -> tuple[float, float]:
    """(d*, R(d*)) of the RL form; (inf, inf) when β ≤ 0 (no peak: still rising)."""
    if not (math.isfinite(alpha) and math.isfinite(beta)) or beta <= 0:
        return float("inf") if math.isfinite(beta) else float("nan"), float("nan")
    x = alpha / beta - 1.0
    if x > 700:
        return float("inf"), float("nan")
    d = math.exp(x)
    return d, beta * d


def peak_bon(alpha: float, beta: float) -> tuple[float, float]:
    if not (math.isfinite(alpha) and math.isfinite(beta)) or beta <= 0:
        return float("inf") if math.isfinite(beta) else float("nan"), float("nan")
    return alpha / (2 * beta), alpha**2 / (4 * beta)


def bon_kl(n: int) -> float:
    """KL of best-of-n to the base policy, log n − (n − 1)/n (Stiennon et al. 2020; Gao et al. 2022)."""
    return math.log(n) - (n - 1) / n


# ------------------------------------------------------------------------------------------------------------
# runs


@dataclass
class RunData:
    run_id: str
    stage: str
    status: str
    params: dict[str, str]
    tags: dict[str, str]
    metrics: dict[str, float]
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    rm: dict[str, Any] = field(default_factory=dict)  # the upstream RM run: metrics and params
    setting: dict[str, str] = field(default_factory=dict)  # swept keys (seed excluded)
    seed: str = "0"

    # -- values
    def series(self, key: str) -> list[tuple[int, float]]:
        return sorted(self.history.get(key) or [])

    def first(self, key: str) -> float:
        s = self.series(key)
        return s[0][1] if s else float("nan")

    def last(self, key: str) -> float:
        s = self.series(key)
        return s[-1][1] if s else self.metrics.get(key, float("nan"))

    def peak(self, key: str) -> float:
        s = self.series(key)
        return max(v for _, v in s) if s else float("nan")

    def smoothed(self, key: str, k: int = 3) -> list[float]:
        """Centered running mean over k evaluations (k//2 at the ends): peak and final without single-eval noise."""
        v = np.asarray([x for _, x in self.series(key)], dtype=float)
        if len(v) < k:
            return list(v)
        h = k // 2
        return [float(v[max(0, i - h): i + h + 1].mean()) for i in range(len(v))]

    def slast(self, key: str) -> float:
        s = self.smoothed(key)
        return s[-1] if s else self.metrics.get(key, float("nan"))

    def speak(self, key: str) -> float:
        s = self.smoothed(key)
        return max(s) if s else float("nan")

    def sfirst(self, key: str) -> float:
        s = self.smoothed(key)
        return s[0] if s else float("nan")

    def noise(self, key: str = "eval/gold_reward") -> float:
        """Evaluation noise σ from second differences (var = 6σ² for white noise; a smooth trend cancels)."""
        v = np.asarray([x for _, x in self.series(key)], dtype=float)
        if len(v) < 4:
            return float("nan")
        return float(np.std(np.diff(v, 2)) / math.sqrt(6))

    def value(self, key: str, default: Any = None) -> Any:
        """A config value: the job's swept value, else the run's logged param."""
        if key in self.setting:
            return self.setting[key]
        if f"sweep.{key}" in self.params:
            return self.params[f"sweep.{key}"]
        return self.params.get(key, default)

    def fnum(self, key: str, default: float = float("nan")) -> float:
        try:
            return float(self.value(key, default))
        except (TypeError, ValueError):
            return default

    @property
    def algo(self) -> str:
        return self.stage

    def points(self, key: str = "eval/gold_reward", gain: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(√KL, reward) at the evaluations that logged both, as the gain over the first one if `gain`."""
        kl = dict(self.series("eval/kl"))
        pts = [(s, v) for s, v in self.series(key) if s in kl]
        if not pts:
            return np.zeros(0), np.zeros(0)
        d = np.sqrt(np.maximum([kl[s] for s, _ in pts], 0.0))
        r = np.asarray([v for _, v in pts], dtype=float)
        if gain:
            r = r - r[0]
        return d, r

    def fit(self) -> tuple[float, float]:
        d, r = self.points()
        return fit_gao_bon(d, r) if self.stage in BON_STAGES else fit_gao_rl(d, r)

    def rm_accuracy(self) -> float:
        return float(self.rm.get("metrics", {}).get("rm/accuracy", float("nan")))

    def rm_params(self) -> float:
        try:
            return float(self.rm.get("params", {}).get("n_params", "nan"))
        except ValueError:
            return float("nan")


def tracking_uri(uri: str | None = None) -> str:
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    from rlhf_lab.tracking import DEFAULT_URI

    return uri or DEFAULT_URI


def _parse_overrides(text: str) -> dict[str, str]:
    out = {}
    try:
        parts = shlex.split(text or "")
    except ValueError:
        parts = (text or "").split()
    for p in parts:
        if "=" in p:
            k, v = p.split("=", 1)
            out[k.lstrip("+~")] = v
    return out


def _rm_from_artifact_cache(rm_id: str, root: str | os.PathLike | None = None) -> dict | None:
    """{"metrics", "params"} of the RM whose run is ``rm_id``, from the metadata its artifact keeps in the
    cache (``RLHF_LAB_CACHE_DIR`` or ``.rlhf_lab_cache``), for an RM tracked in another MLflow store."""
    from rlhf_lab.cache import META_FILE, ArtifactCache

    cache = ArtifactCache(root or os.environ.get("RLHF_LAB_CACHE_DIR") or ".rlhf_lab_cache")
    for meta_file in sorted((cache.root / "rm").glob(f"*/{META_FILE}")):
        try:
            meta = cache.meta(meta_file.parent)
        except (OSError, ValueError):
            continue
        if meta.get("run_id") == rm_id:
            return {"metrics": dict(meta.get("eval") or {}), "params": {"n_params": str(meta.get("n_params", "nan"))},
                    "run_id": rm_id, "from": str(meta_file.parent)}
    return None


def load_study(study: str, uri: str | None = None, client=None) -> tuple[list[RunData], list[Any]]:
    """(the study's policy runs, its sweep parent runs) from MLflow; all statuses."""
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = tracking_uri(uri)
    client = client or MlflowClient(tracking_uri=uri)
    mlflow.set_tracking_uri(uri)
    found = mlflow.search_runs(search_all_experiments=True, filter_string=f"tags.`{STUDY_TAG}` = '{study}'",
                               output_format="list", max_results=50000)
    parents = [r for r in found if r.data.tags.get("rlhf_lab.stage") == "sweep"]
    rm_cache: dict[str, dict] = {}
    runs: list[RunData] = []
    for r in found:
        stage = r.data.tags.get("rlhf_lab.stage", "")
        if stage not in POLICY_STAGES:
            continue
        rd = RunData(r.info.run_id, stage, r.info.status, dict(r.data.params), dict(r.data.tags), dict(r.data.metrics))
        for key in HISTORY_KEYS:
            if key in rd.metrics:
                rd.history[key] = [(int(m.step), float(m.value)) for m in client.get_metric_history(rd.run_id, key)]
        rm_id = rd.tags.get("rlhf_lab.upstream.rm")
        if rm_id:
            if rm_id not in rm_cache:
                try:
                    rr = client.get_run(rm_id)
                    rm_cache[rm_id] = {"metrics": dict(rr.data.metrics), "params": dict(rr.data.params),
                                       "run_id": rm_id}
                except Exception:  # the RM was trained against another store: its cached artifact's metadata
                    rm_cache[rm_id] = _rm_from_artifact_cache(rm_id) or {"run_id": rm_id}
            rd.rm = rm_cache[rm_id]
        sweep = {k[len("sweep."):]: v for k, v in rd.params.items() if k.startswith("sweep.")}
        # the swept keys, plus the keys a follow-up sweep fixed on its command line (e.g. more seeds of one cell)
        setting = {**_parse_overrides(rd.tags.get("rlhf_lab.overrides", "")), **sweep}
        rd.seed = str(setting.pop("seed", rd.params.get("seed", "0")))
        for k in ("sweep", "study"):
            setting.pop(k, None)
        rd.setting = setting
        runs.append(rd)
    # a setting is named by the keys that vary across the study's runs
    keys = sorted({k for r in runs for k in r.setting})
    varying = [k for k in keys if len({r.setting.get(k) for r in runs}) > 1]
    for r in runs:
        r.setting = {k: r.setting[k] for k in varying if k in r.setting} or {"algo": r.stage}
    runs.sort(key=lambda r: (r.stage, natural_key(label(r)), natural_key(r.seed)))
    return runs, parents


def natural_key(text: str) -> list:
    """Sort key with numbers compared as numbers: fixed_0.003 < fixed_0.01 < fixed_1, seed 2 < seed 10."""
    import re

    out: list = []
    for part in re.split(r"(-?\d+(?:\.\d+)?(?:[eE]-?\d+)?)", str(text)):
        try:
            out.append((0, float(part), ""))
        except ValueError:
            out.append((1, 0.0, part))
    return out


def label(r: RunData) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(r.setting.items())) or r.stage


def groups(runs: Iterable[RunData]) -> dict[str, list[RunData]]:
    out: dict[str, list[RunData]] = {}
    for r in runs:
        out.setdefault(label(r), []).append(r)
    return out


def mean_spread(values: Iterable[float]) -> tuple[float, float, int]:
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if len(v) == 0:
        return float("nan"), float("nan"), 0
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0, len(v)


def fmt(x: float, digits: int = 3, sci: bool = True) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "∞" if x > 0 else "−∞"
    if sci and (abs(x) >= 1e4 or (0 < abs(x) < 1e-3)):
        return f"{x:.2e}"
    return f"{x:.{digits}f}"


def fmt_ms(values: Iterable[float], digits: int = 3) -> str:
    m, s, n = mean_spread(values)
    if n == 0:
        return "–"
    return fmt(m, digits) if n == 1 else f"{fmt(m, digits)} ± {fmt(s, digits, sci=abs(m) < 1e-3 or abs(m) >= 1e4)}"


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def run_summary(r: RunData) -> dict[str, float]:
    a, b = r.fit()
    d_star, r_star = peak_bon(a, b) if r.stage in BON_STAGES else peak_rl(a, b)
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


# ------------------------------------------------------------------------------------------------------------
# plots


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_reward_vs_sqrt_kl(runs: Sequence[RunData], path: Path) -> None:
    plt = _plt()
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
            a, b = r.fit()
            d, _ = r.points()
            if len(d) and math.isfinite(a):
                xs = np.linspace(0, max(d.max(), 1e-3), 100)
                ys = gao_bon(xs, a, b) if r.stage in BON_STAGES else gao_rl(xs, a, b)
                axes[0].plot(xs, ys, "-", color=color, lw=1)
    axes[0].set_title("gold reward gain vs √KL (lines: Gao et al. fit)")
    axes[1].set_title("proxy (RM) reward gain vs √KL")
    for ax in axes:
        ax.set_xlabel("√KL  (KL in nats per response)")
        ax.axhline(0, color="grey", lw=0.5)
    axes[0].set_ylabel("reward − reward at start")
    if g:
        axes[1].legend(fontsize=6, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def frontier(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Upper-left envelope: the points (KL, gold) that no point with lower or equal KL beats."""
    out, best = [], -float("inf")
    for kl, g in sorted(p for p in points if all(math.isfinite(x) for x in p)):
        if g > best:
            out.append((kl, g))
            best = g
    return out


def plot_frontier(runs: Sequence[RunData], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for algo, marker in (("ppo", "o"), ("dpo", "s"), ("bon", "^")):
        rs = [r for r in runs if r.stage == algo]
        if not rs:
            continue
        pts = [(r.last("eval/kl"), r.last("eval/gold_reward")) for r in rs]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker, alpha=0.6, label=f"{algo} (final of each run)")
        f = frontier([(kl, g) for r in rs for (_, kl), (_, g) in _paired(r)])
        if f:
            ax.plot([p[0] for p in f], [p[1] for p in f], "-", lw=1.5, label=f"{algo} frontier (all evaluations)")
    ax.set_xlabel("KL(π‖π_ref), nats per response")
    ax.set_ylabel("gold reward")
    ax.set_title("gold reward – KL frontier")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _paired(r: RunData) -> list[tuple[tuple[int, float], tuple[int, float]]]:
    kl = dict(r.series("eval/kl"))
    return [((s, kl[s]), (s, g)) for s, g in r.series("eval/gold_reward") if s in kl]


# ------------------------------------------------------------------------------------------------------------
# study report


def _policy_size(r: RunData) -> str:
    v = r.value("policy")
    if v:
        return str(v)
    n = r.fnum("n_params")
    return f"{n / 1e6:.2f}M" if math.isfinite(n) else "?"


def _rm_size(r: RunData) -> str:
    v = r.value("rm_size")
    if v:
        return str(v)
    h, layers = r.value("reward_model.arch.hidden"), r.value("reward_model.arch.layers")
    return f"{h}x{layers}" if h else "?"


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
                  f"`{tracking_uri(uri)}`.", ""]
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
            f = frontier([(kl, g) for r in rs for (_, kl), (_, g) in _paired(r)])
            if f:
                best = max(f, key=lambda p: p[1])
                rows.append([algo, len(rs), fmt(best[1]), fmt(best[0], 2), len(f)])
        if rows:
            lines += [md_table(["algo", "runs", "best gold on frontier", "at KL", "frontier points"], rows), ""]

    ppo = [r for r in runs if r.stage == "ppo"]
    if ppo and (len({_rm_size(r) for r in ppo}) > 1 or len({_policy_size(r) for r in ppo}) > 1):
        rows = []
        cells: dict[tuple[str, str], list[RunData]] = {}
        for r in ppo:
            cells.setdefault((_policy_size(r), _rm_size(r)), []).append(r)
        for (ps, rs_), members in sorted(cells.items()):
            s = [run_summary(r) for r in members]
            pol_n = [r.fnum("n_params") for r in members]
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
              "", f"Tracking store: `{tracking_uri(uri)}`; generated by `rlhf-lab-report {study}`.", ""]
    (out / "README.md").write_text("\n".join(lines))
    return out / "README.md"


# ------------------------------------------------------------------------------------------------------------
# claims


@dataclass
class Verdict:
    claim: str
    text: str
    command: str
    measured: str
    verdict: str  # holds | does not hold | inconclusive at this scale | not run yet


NOT_RUN = "not run yet"
MIN_EVALS = 5  # evaluations a run needs before it counts towards a verdict
MIN_KL = 1.0   # nats/response the least-constrained runs must reach before "does not hold" is said of over-optimisation


def _moved(rs) -> tuple[bool, str]:
    kl = _mean(rs, lambda r: r.slast("eval/kl"))
    ok = math.isfinite(kl) and kl >= MIN_KL
    return ok, "" if ok else f" (the policy barely moved: final KL {fmt(kl, 2)} < {MIN_KL:g} nats; train longer)"
HOLDS, FAILS, INCONCL = "holds", "does not hold", "inconclusive at this scale"


def _tol(runs: Sequence[RunData], key: str = "eval/gold_reward", floor: float = 0.05) -> float:
    """What counts as a real difference of smoothed values: twice the larger of the pooled seed spread and the
    evaluation noise of a 3-evaluation mean (√(2/3)·σ), at least `floor`."""
    spreads = []
    for members in groups(runs).values():
        _, s, n = mean_spread([r.slast(key) for r in members])
        if n > 1:
            spreads.append(s)
    noise = [x for x in (r.noise(key) for r in runs) if math.isfinite(x)]
    seed_sd = float(np.mean(spreads)) if spreads else 0.0
    eval_sd = float(np.median(noise)) * math.sqrt(2 / 3) if noise else 0.0
    return max(floor, 2 * seed_sd, 2 * eval_sd)


def _fixed(runs):
    return [r for r in runs if r.stage == "ppo" and r.value("kl.name") == "fixed" and math.isfinite(r.fnum("kl.beta"))]


def _mean(rs, f):
    return mean_spread([f(r) for r in rs])[0]


def _spearman(x, y) -> float:
    from scipy.stats import spearmanr

    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 3 or np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
        return float("nan")
    return float(spearmanr(x[ok], y[ok]).correlation)


def claim_c1(s):
    runs = s["ppo_beta_grid"]
    zero = [r for r in _fixed(runs) if r.fnum("kl.beta") == 0]
    if not zero:
        return NOT_RUN if not runs else INCONCL, "no finished β=0 run" if runs else ""
    tol = _tol(runs)
    pg = _mean(zero, lambda r: r.slast("eval/proxy_reward") - r.sfirst("eval/proxy_reward"))
    drop = _mean(zero, lambda r: r.speak("eval/gold_reward") - r.slast("eval/gold_reward"))
    gg = _mean(zero, lambda r: r.slast("eval/gold_reward") - r.sfirst("eval/gold_reward"))
    m = (f"β=0 ({len(zero)} runs), change over training: proxy {fmt(pg)}, gold {fmt(gg)} (gold drop from its peak "
         f"{fmt(drop)}); tolerance {fmt(tol)}")
    if not math.isfinite(pg):
        return INCONCL, m + " (no eval/proxy_reward)"
    if pg > tol and drop > tol:
        return HOLDS, m
    moved, why = _moved(zero)
    if pg > tol and drop <= tol / 2 and moved:
        return FAILS, m
    return INCONCL, m + why


def claim_c2(s):
    runs = s["ppo_beta_grid"]
    fixed = _fixed(runs)
    zero = [r for r in fixed if r.fnum("kl.beta") == 0]
    if not zero:
        return NOT_RUN if not runs else INCONCL, "no finished β=0 run" if runs else ""
    bmax = max(r.fnum("kl.beta") for r in fixed)
    big = [r for r in fixed if r.fnum("kl.beta") == bmax] if bmax > 0 else []

    def rel(rs, key):
        return _mean(rs, lambda r: (r.slast(key) - r.sfirst(key)) / abs(r.sfirst(key)) if r.sfirst(key) else float("nan"))

    e0, d0 = rel(zero, "eval/entropy"), rel(zero, "eval/distinct_2")
    eb, db = (rel(big, "eval/entropy"), rel(big, "eval/distinct_2")) if big else (float("nan"), float("nan"))
    m = f"β=0: entropy {fmt(100 * e0, 0)}%, distinct-2 {fmt(100 * d0, 0)}% over training"
    if big:
        m += f"; β={bmax:g}: entropy {fmt(100 * eb, 0)}%, distinct-2 {fmt(100 * db, 0)}%"
    if not (math.isfinite(e0) and math.isfinite(d0)):
        return INCONCL, m + " (no eval/entropy or eval/distinct_2)"
    if e0 < -0.2 and d0 < -0.2 and not (e0 >= eb - 0.05 or d0 >= db - 0.05):
        return HOLDS, m
    moved, why = _moved(zero)
    if e0 > -0.05 and d0 > -0.05 and moved:
        return FAILS, m
    return INCONCL, m + why


def claim_c4(s):
    runs = s["ppo_beta_grid"]
    fixed = _fixed(runs)
    betas = sorted({r.fnum("kl.beta") for r in fixed})
    if len(betas) < 3:
        return NOT_RUN if not runs else INCONCL, f"{len(betas)} fixed-β settings finished" if runs else ""
    tol = _tol(runs)
    final = {b: _mean([r for r in fixed if r.fnum("kl.beta") == b], lambda r: r.slast("eval/gold_reward")) for b in betas}
    gain = {b: _mean([r for r in fixed if r.fnum("kl.beta") == b],
                     lambda r: r.slast("eval/gold_reward") - r.sfirst("eval/gold_reward")) for b in betas}
    kl = {b: _mean([r for r in fixed if r.fnum("kl.beta") == b], lambda r: r.slast("eval/kl")) for b in betas}
    best = max(betas, key=lambda b: final[b])
    small_hacks = final[best] - final[betas[0]] > tol
    large_stalls = gain[betas[-1]] < tol and final[best] - final[betas[-1]] > tol
    m = ("final gold by β: " + ", ".join(f"{b:g}: {fmt(final[b])} (KL {fmt(kl[b], 1)})" for b in betas)
         + f"; best β={best:g}; KL unit: nats/response, β per token")
    if small_hacks and large_stalls and 0.01 <= best <= 0.1:
        return HOLDS, m
    moved, why = _moved([r for r in fixed if r.fnum("kl.beta") == betas[0]])
    if not moved:
        return INCONCL, m + why
    if best in (betas[0], betas[-1]) and final[best] - sorted(final.values())[-2] > tol:
        return FAILS, m + " (no interior optimum)"
    if small_hacks and large_stalls and not (0.003 <= best <= 0.3):
        return FAILS, m + " (optimum outside 0.01–0.1)"
    return INCONCL, m


def claim_c5(s):
    runs = [r for r in s["ppo_beta_grid"] if r.stage == "ppo" and r.value("kl.name") == "adaptive"]
    if not runs:
        return NOT_RUN if not s["ppo_beta_grid"] else INCONCL, "no finished adaptive-KL run" if s["ppo_beta_grid"] else ""
    targets = sorted({r.fnum("kl.target") for r in runs})
    ratio = {t: _mean([r for r in runs if r.fnum("kl.target") == t], lambda r: r.slast("eval/kl")) / t for t in targets}
    units = {r.value("kl.unit") for r in runs}
    m = "final eval/kl ÷ target: " + ", ".join(f"target {t:g}: {fmt(ratio[t], 2)}" for t in targets)
    if units - {"sequence", None}:
        return INCONCL, m + f" (kl.unit={units}: eval/kl is per sequence)"
    short = [r for r in runs if r.fnum("steps") * r.fnum("algo.batch_size") < r.fnum("kl.horizon")]
    if short:
        return INCONCL, m + (f" ({len(short)} runs saw fewer responses than the controller's horizon "
                             f"{short[0].fnum('kl.horizon'):g}: β could not adapt yet)")
    if all(0.5 <= x <= 2 for x in ratio.values()):
        return HOLDS, m
    if any(not (0.25 <= x <= 4) for x in ratio.values()):
        return FAILS, m
    return INCONCL, m


def claim_c9(s):
    ppo = _fixed(s["ppo_beta_grid"])
    dpo = [r for r in s["dpo_beta_grid"] if r.stage == "dpo"]
    if not dpo or not ppo:
        missing = [n for n, rs in (("ppo_beta_grid", ppo), ("dpo_beta_grid", dpo)) if not rs]
        if any(s.get("_n_finished", {}).get(n) for n in missing):
            return INCONCL, f"no finished runs with ≥ {MIN_EVALS} evaluations in " + " and ".join(missing)
        return NOT_RUN, "no finished runs of " + " and ".join(missing)
    rp = _spearman([r.fnum("kl.beta") for r in ppo], [r.slast("eval/kl") for r in ppo])
    rd = _spearman([r.fnum("algo.beta") for r in dpo], [r.slast("eval/kl") for r in dpo])
    fp = frontier([(kl, g) for r in ppo for (_, kl), (_, g) in _paired(r)])
    fd = frontier([(kl, g) for r in dpo for (_, kl), (_, g) in _paired(r)])
    bp, bd = (max(g for _, g in fp) if fp else float("nan")), (max(g for _, g in fd) if fd else float("nan"))
    m = (f"Spearman ρ(β, final KL): PPO {fmt(rp, 2)}, DPO {fmt(rd, 2)}; best frontier gold PPO {fmt(bp)}, "
         f"DPO {fmt(bd)}; final KL range PPO {fmt(min(r.slast('eval/kl') for r in ppo), 1)}–"
         f"{fmt(max(r.slast('eval/kl') for r in ppo), 1)}, DPO {fmt(min(r.slast('eval/kl') for r in dpo), 1)}–"
         f"{fmt(max(r.slast('eval/kl') for r in dpo), 1)}")
    if not (math.isfinite(rp) and math.isfinite(rd)):
        return INCONCL, m
    if abs(rp) >= 0.8 and abs(rd) < 0.6:
        return HOLDS, m
    if abs(rd) >= 0.8:
        return FAILS, m + " (DPO's β sets its KL monotonically too)"
    return INCONCL, m


def claim_c10(s):
    runs = s["ppo_beta_grid"]
    fixed = _fixed(runs)
    if not fixed:
        return NOT_RUN if not runs else INCONCL, "no finished fixed-β run" if runs else ""
    low = [r for r in fixed if r.fnum("kl.beta") == min(x.fnum("kl.beta") for x in fixed)]
    dl = _mean(low, lambda r: r.slast("eval/length") - r.sfirst("eval/length"))
    df = _mean(low, lambda r: r.slast("eval/filler_rate") - r.sfirst("eval/filler_rate"))
    rl = _mean(low, lambda r: float(r.rm.get("metrics", {}).get("rm/length_preference", float("nan"))))
    rf = _mean(low, lambda r: float(r.rm.get("metrics", {}).get("rm/filler_preference", float("nan"))))
    lb, fb = low[0].fnum("labeler.length_bonus", 0.0), low[0].fnum("labeler.filler_bonus", 0.0)
    m = (f"labeler length_bonus={lb:g}, filler_bonus={fb:g}; RM length/filler preference {fmt(rl)}/{fmt(rf)}; "
         f"PPO (β={low[0].fnum('kl.beta'):g}) length {fmt(dl, 1)} tokens, filler rate {fmt(df)} over training")
    learned = (math.isfinite(rl) and rl > 0) or (math.isfinite(rf) and rf > 0)
    exploited = (math.isfinite(dl) and dl > 2) or (math.isfinite(df) and df > 0.05)
    if lb <= 0 and fb <= 0:
        return INCONCL, m + " (unbiased labeler)"
    if learned and exploited:
        return HOLDS, m
    moved, why = _moved(low)
    if math.isfinite(dl) and math.isfinite(df) and dl <= 0 and df <= 0 and moved:
        return FAILS, m
    return INCONCL, m + why


def _size_cells(runs):
    ppo = [r for r in runs if r.stage == "ppo"]
    out = []
    for r in ppo:
        out.append((_policy_size(r), r.rm_params(), r.fnum("n_params"), r))
    return out


def claim_c13(s):
    runs = s["rm_size_vs_policy_size"]
    cells = _size_cells(runs)
    if not cells:
        return NOT_RUN, ""
    tol = _tol(runs)
    rhos, largest_drops = [], []
    for ps in sorted({c[0] for c in cells}):
        cs = [c for c in cells if c[0] == ps]
        rm_n = [c[1] for c in cs]
        drops = [c[3].speak("eval/gold_reward") - c[3].slast("eval/gold_reward") for c in cs]
        rhos.append(_spearman(rm_n, drops))
        if any(math.isfinite(x) for x in rm_n):
            big = max(x for x in rm_n if math.isfinite(x))
            largest_drops.append(float(np.mean([d for x, d in zip(rm_n, drops) if x == big])))
    rho = float(np.nanmean(rhos)) if any(math.isfinite(x) for x in rhos) else float("nan")
    ld = float(np.mean(largest_drops)) if largest_drops else float("nan")
    drops_all = [c[3].speak("eval/gold_reward") - c[3].slast("eval/gold_reward") for c in cells]
    n_hacked = sum(d > tol for d in drops_all if math.isfinite(d))
    m = (f"mean over policy sizes of Spearman ρ(RM params, gold drop from peak) = {fmt(rho, 2)}; drop with the "
         f"largest RM {fmt(ld)}; {n_hacked} of {len(cells)} runs drop more than the tolerance {fmt(tol)}")
    if not math.isfinite(rho) or n_hacked < 2:  # too little hacking in the grid to say what RM size does to it
        return INCONCL, m
    if rho < -0.3 and ld > tol:
        return HOLDS, m
    if rho > 0.3 or (rho < -0.3 and ld <= tol / 2):
        return FAILS, m
    return INCONCL, m


def claim_c18(s):
    runs = s["rm_size_vs_policy_size"]
    cells = [c for c in _size_cells(runs) if math.isfinite(c[1]) and math.isfinite(c[2]) and c[2] > 0]
    if not _size_cells(runs):
        return NOT_RUN, ""
    small = [c[3] for c in cells if c[1] / c[2] < 0.1]
    ok = [c[3] for c in cells if c[1] / c[2] >= 0.1]
    if not small or not ok:
        return INCONCL, f"{len(small)} runs with RM < 1/10 of the policy, {len(ok)} with ≥ 1/10 (need both); ensembles not covered"
    tol = _tol(runs)
    ds, do = (_mean(small, lambda r: r.speak("eval/gold_reward") - r.slast("eval/gold_reward")),
              _mean(ok, lambda r: r.speak("eval/gold_reward") - r.slast("eval/gold_reward")))
    ps, po = _mean(small, lambda r: r.speak("eval/gold_reward")), _mean(ok, lambda r: r.speak("eval/gold_reward"))
    m = (f"RM < 1/10 of policy: drop {fmt(ds)}, peak gold {fmt(ps)} ({len(small)} runs); ≥ 1/10: drop {fmt(do)}, "
         f"peak {fmt(po)} ({len(ok)} runs); ensemble part not covered")
    if ds - do > tol or po - ps > tol:
        return HOLDS, m
    if do - ds > tol or ps - po > tol:
        return FAILS, m
    return INCONCL, m


def _source(runs, src, frac0: bool):
    return [r for r in runs if r.stage == "ppo" and (r.value("reward_model.source") == src)
            and ((r.fnum("data.on_policy_fraction", 0.0) == 0) == frac0)]


def _final_and_drop(runs) -> tuple[float, float]:
    """Mean final gold reward of the runs, and mean drop of gold from its peak to the end."""
    return (_mean(runs, lambda r: r.slast("eval/gold_reward")),
            _mean(runs, lambda r: r.speak("eval/gold_reward") - r.slast("eval/gold_reward")))


def claim_c16(s):
    runs = s["rm_source"]
    same, diff = _source(runs, "same", True), _source(runs, "different", True)
    if not runs:
        return NOT_RUN, ""
    if not same or not diff:
        return INCONCL, f"{len(same)} same-source and {len(diff)} different-source runs finished (need both)"
    tol = _tol(runs)
    (gs, ds), (gd, dd) = _final_and_drop(same), _final_and_drop(diff)
    ss, sd = mean_spread([r.slast("eval/gold_reward") for r in same])[1], mean_spread([r.slast("eval/gold_reward") for r in diff])[1]
    m = (f"final gold same {fmt(gs)} (drop {fmt(ds)}, seed sd {fmt(ss)}) vs different {fmt(gd)} (drop {fmt(dd)}, "
         f"seed sd {fmt(sd)}); tolerance {fmt(tol)}")
    if gs - gd > tol or dd - ds > tol:
        return HOLDS, m
    if gd - gs > tol or ds - dd > tol:
        return FAILS, m
    return INCONCL, m


def claim_c17(s):
    runs = s["rm_source"]
    base, mixed = _source(runs, "different", True), _source(runs, "different", False)
    if not runs:
        return NOT_RUN, ""
    if not base or not mixed:
        return INCONCL, f"{len(base)} different-source runs without and {len(mixed)} with on-policy mixing finished (need both)"
    tol = _tol(runs)
    (gb, db), (gm, dm) = _final_and_drop(base), _final_and_drop(mixed)
    fr = sorted({r.value("data.on_policy_fraction") for r in mixed})
    m = (f"different-source RM: final gold {fmt(gb)} (drop {fmt(db)}) without vs {fmt(gm)} (drop {fmt(dm)}) with "
         f"on-policy fraction {', '.join(map(str, fr))}; tolerance {fmt(tol)}")
    if gm - gb > tol or db - dm > tol:
        return HOLDS, m
    if gb - gm > tol:
        return FAILS, m
    return INCONCL, m


CLAIMS: list[tuple[str, str, str, Callable]] = [
    ("C1", "β=0 PPO reward-hacks: proxy rises while gold falls", "ppo_beta_grid", claim_c1),
    ("C2", "with no KL penalty the policy collapses to few modes", "ppo_beta_grid", claim_c2),
    ("C4", "β too small hacks, too large stalls; good β is 0.01–0.1", "ppo_beta_grid", claim_c4),
    ("C5", "adaptive KL keeps KL near its target", "ppo_beta_grid", claim_c5),
    ("C9", "DPO gives less fine-grained KL control than PPO", "ppo_beta_grid + dpo_beta_grid", claim_c9),
    ("C10", "the RM learns annotator biases and PPO exploits them", "ppo_beta_grid", claim_c10),
    ("C13", "a larger RM reduces but does not remove hacking", "rm_size_vs_policy_size", claim_c13),
    ("C16", "the RM need not share the base, but same-source is more stable", "rm_source", claim_c16),
    ("C17", "~20% on-policy samples fix a different-source RM", "rm_source", claim_c17),
    ("C18", "the RM should be ≥ 1/10 of the policy's size", "rm_size_vs_policy_size", claim_c18),
]
NOT_COVERED = {
    "C3": "reference sync interval sweep (algo.reference.sync_every)", "C6": "separate vs shared-base reference memory",
    "C7": "k1/k2/k3 estimators (algo.kl_estimator)", "C8": "reference of another size (algo.reference.path)",
    "C11": "length penalty α grid (algo.length_penalty)", "C12": "clip ε grid (algo.clip_eps)",
    "C15": "critic vs no-critic baseline (algo.critic)", "C19": "RM LoRA rank grid (reward_model.lora_rank)",
    "C20": "normalised vs raw RM output (reward_model.normalize)",
}


def evaluate_claims(uri: str | None = None, studies: dict[str, list[RunData]] | None = None) -> list[Verdict]:
    if studies is None:
        studies = {}
        for st in ("ppo_beta_grid", "dpo_beta_grid", "rm_size_vs_policy_size", "rm_source"):
            runs, _ = load_study(st, uri)
            studies[st] = [r for r in runs if r.status == "FINISHED"]
    out = []
    for cid, text, study, fn in CLAIMS:
        names = [x.strip() for x in study.split("+")]
        cmd = " && ".join(f"rlhf-lab -m sweep={n}" for n in names) + " && " + " && ".join(
            f"rlhf-lab-report {n}" for n in names)
        if all(not studies.get(n) for n in names):
            out.append(Verdict(cid, text, cmd, "no runs", NOT_RUN))
            continue
        present = [r for n in names for r in studies.get(n, [])]
        long_enough = {n: [r for r in studies.get(n, []) if len(r.series("eval/gold_reward")) >= MIN_EVALS]
                       for n in names}
        if not any(long_enough.values()):
            n_evals = sorted({len(r.series("eval/gold_reward")) for r in present})
            out.append(Verdict(cid, text, cmd, f"{len(present)} runs, too short to judge: {n_evals} evaluations "
                               f"(need ≥ {MIN_EVALS})", INCONCL))
            continue
        try:
            verdict, measured = fn({**studies, **long_enough, "_n_finished": {n: len(v) for n, v in studies.items()}})
        except Exception as err:  # a verdict that cannot be computed is not a verdict
            verdict, measured = INCONCL, f"could not compute: {type(err).__name__}: {err}"
        out.append(Verdict(cid, text, cmd, measured or "no runs", verdict))
    return out


def write_claims_report(out_dir: Path | str = "reports", uri: str | None = None,
                        studies: dict[str, list[RunData]] | None = None) -> Path:
    verdicts = evaluate_claims(uri, studies)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# Claims of ../shared/CLAIMS.md put to the canned studies", "",
             "Computed by `rlhf-lab-report --claims` from the finished runs in "
             f"`{tracking_uri(uri)}`; a difference counts when it exceeds twice the seed spread (at least 0.05 "
             "gold, and twice the evaluation noise); peaks and final values are 3-evaluation running means, and runs "
             f"with fewer than {MIN_EVALS} evaluations are not counted. Verdicts hold for this world and these model "
             "sizes only.", "",
             md_table(["claim", "statement (seed)", "command that tests it", "measured", "verdict"],
                      [[v.claim, v.text, f"`{v.command}`", v.measured, f"**{v.verdict}**"] for v in verdicts]), "",
             "Testable claims without a canned study yet (run the sweep inline, e.g. `rlhf-lab -m algo=ppo "
             "algo.clip_eps=0.1,0.2,0.4`): " + "; ".join(f"{k}: {v}" for k, v in NOT_COVERED.items()) + ".", ""]
    path = out / "claims.md"
    path.write_text("\n".join(lines))
    return path


# ------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rlhf-lab-report", description="Write reports/<study>/README.md (plots, tables, "
                                "Gao et al. fits) or reports/claims.md from the MLflow runs of the canned studies.")
    p.add_argument("study", nargs="?", help=f"the study (tag rlhf_lab.study), e.g. {', '.join(STUDIES[:-1])}")
    p.add_argument("--claims", action="store_true", help="write reports/claims.md")
    p.add_argument("--uri", default=None, help="MLflow tracking URI (MLFLOW_TRACKING_URI wins; default "
                   "sqlite:///mlflow.db)")
    p.add_argument("--out", default="reports", help="output folder (default: reports)")
    a = p.parse_args(argv)
    if not a.study and not a.claims:
        p.error("name a study or pass --claims")
    import logging

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    if a.study:
        path = write_study_report(a.study, a.out, a.uri)
        text = path.read_text()
        print(f"wrote {path}")
        cmds = text.split("```bash\n", 1)[1].split("```", 1)[0].strip() if "```bash\n" in text else ""
        print(f"reproduce with:\n  {cmds.replace(chr(10), chr(10) + '  ')}\n  rlhf-lab-report {a.study}")
    if a.claims:
        path = write_claims_report(a.out, a.uri)
        print(f"wrote {path}")
        for line in path.read_text().splitlines():
            if line.startswith("| C"):
                cells = [c.strip() for c in line.strip("|").split("|")]
                print(f"  {cells[0]:<4} {cells[-1].strip('*'):<28} {cells[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
