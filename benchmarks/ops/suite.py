"""Claims-suite throughput against a baseline: ``python -m benchmarks.ops.suite [--baseline v2|v1|code:REV]
[--seeds 4] [--rounds 1] [--with KEY=VALUE ...]``.

The default PPO job at the suite's usual length over ``--seeds`` seeds, launched as the suite launches a study (2 jobs
at a time), once with the baseline's settings and once with today's defaults (or ``--with`` options), into one store:
wall time and jobs per hour, where a job's time goes, and whether the training result is unchanged (each seed's final
test gold, paired). What the baselines are and how to read it: benchmarks/README.md. The result goes to
``benchmarks/results/suite.json`` (``suite_with.json`` with ``--with``) and the generated benchmarks/results.md.
"""

from __future__ import annotations

import argparse
import datetime
import io
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from benchmarks import common as C
from benchmarks.common import table

BASELINES = {
    "defaults": ("today's defaults", []),  # with --with: what an option buys against the defaults
    "v2": ("v2 (before v3)", ["eval.reuse_start=false"]),
    "v1": ("before v2", ["algo.packing=false", "algo.trim_minibatches=false", "reward_model.packing=false",
                         "generation.sampler=hf", "eval.reuse_start=false"]),
}
SIDES = {"before": BASELINES["v2"], "today": ("today's defaults", [])}  # main() sets "before" from --baseline
SAMPLE_ALGOS = ("ppo", "grpo", "rloo")  # the algorithms whose jobs the PPO sample's ratio is applied to


# where a job's time goes: (name, how it is read from the run's metrics). "sum" metrics are per PPO step and summed
# over the steps; the others are logged once. The job summary's `time` line shows the same split.
PHASES = (("start-up (imports, config, store)", "time/startup_s", "once"),
          ("setup (upstream stages from the cache, models)", "time/setup_s", "once"),
          ("generation", "time/rollout_s", "sum"), ("scoring (reward model)", "time/score_s", "sum"),
          ("no-grad passes (old, reference, values)", "time/forward_s", "sum"),
          ("update (PPO epochs × minibatches)", "time/update_s", "sum"),
          ("evaluations (eval/* and test/*)", "time/eval_s", "once"))


def run_facts(client, run) -> dict:
    """seed, run seconds, mean PPO step seconds (``time/step_s``), final test gold, the eval gold curve {step: value}
    and the seconds per phase of one job run (`client`: an ``MlflowClient`` on its store): :data:`PHASES`, plus ``the
    rest of the steps`` (statistics, gold, logging: the steps' time, the sum of ``time/step_s``, minus their phases)
    and ``Lightning around the steps`` (the fit's training time minus the evaluations and the steps)."""
    def history(key: str) -> list[float]:
        return [m.value for m in client.get_metric_history(run.info.run_id, key)]

    steps, phases = history("time/step_s"), {}
    for name, key, how in PHASES:
        hist = history(key)
        phases[name] = (sum(hist) if how == "sum" else hist[-1]) if hist else float("nan")
    phases["the rest of the steps (statistics, gold, logging)"] = sum(steps) - sum(
        phases[n] for n, k, h in PHASES if h == "sum")
    phases["Lightning around the steps"] = (run.data.metrics.get("time/train_s", float("nan"))
                                            - phases["evaluations (eval/* and test/*)"] - sum(steps))
    return {"seed": int(run.data.params.get("seed", -1)),
            "seconds": (run.info.end_time - run.info.start_time) / 1000,
            "step_s": sum(steps) / len(steps) if steps else float("nan"),
            "test_gold": run.data.metrics.get("test/gold_reward", float("nan")),
            "curve": {m.step: m.value for m in client.get_metric_history(run.info.run_id, "eval/gold_reward")},
            "phases": phases}


def phase_rows(sides: dict) -> list[list]:
    """Rows (phase, mean seconds per job on each side, share of today's job slot): a job slot is the sweep's wall
    time × 2 jobs at a time ÷ jobs; what the runs do not account for is the sweep's own (processes, Hydra, the
    parent run, a job's start before its run)."""
    names = list(next(iter(sides.values()))[0]["runs"][0]["phases"])
    runs = {n: [f for r in rounds for f in r["runs"]] for n, rounds in sides.items()}
    slot = {n: 2 * sum(r["wall"] for r in rounds) / len(runs[n]) for n, rounds in sides.items()}
    mean = {n: {p: sum(f["phases"][p] for f in runs[n]) / len(runs[n]) for p in names} for n in sides}
    rows = [[p, *(mean[n][p] for n in sides), f"{100 * mean['today'][p] / slot['today']:.0f}%"] for p in names]
    accounted = {n: sum(v for v in mean[n].values() if v == v) for n in sides}
    outside = {n: slot[n] - accounted[n] for n in sides}
    rows.append(["outside the job's run (sweep, processes, Hydra, start of a job before its run)",
                 *outside.values(), f"{100 * outside['today'] / slot['today']:.0f}%"])
    rows.append(["**job slot** (wall × 2 ÷ jobs)", *(slot[n] for n in sides), "100%"])
    return rows


def sweep_side(name: str, work: Path, common: list[str], seeds: int, round_i: int, env: dict | None = None) -> dict:
    """Launch one side's sweep (`env`: environment variables of its processes, e.g. another code's
    ``PYTHONPATH``); its wall seconds and its runs' facts."""
    from mlflow.tracking import MlflowClient

    study = f"bench_{name}_{round_i}"
    args = ["-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=2", *common, f"study={study}",
            "seed=" + ",".join(str(s) for s in range(seeds)), *SIDES[name][1]]
    print(f"[suite-bench] round {round_i}: {SIDES[name][0]}: rlhf-lab {shlex.join(args)}", flush=True)
    secs, _ = C.rlhf_lab(args, work / study, env=env, timeout=4 * 3600)
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    facts = [run_facts(client, r) for r in C.finished_job_runs(client, study)]
    if len(facts) != seeds:
        raise RuntimeError(f"{name}: {len(facts)} of {seeds} jobs finished")
    print(f"[suite-bench] {SIDES[name][0]}: {secs:.0f} s for {seeds} jobs", flush=True)
    return {"wall": secs, "runs": sorted(facts, key=lambda f: f["seed"])}


def install_revision(rev: str, work: Path) -> tuple[Path, str]:
    """The package as it was at git revision `rev` of this checkout, installed (``git archive``, then
    ``pip install --no-deps --target``) into a folder under `work`; (that folder, the commit's short hash).
    SystemExit with one line when git or pip fails."""
    def run(cmd: list[str], what: str) -> subprocess.CompletedProcess:
        p = subprocess.run(cmd, capture_output=True)
        if p.returncode != 0:
            last = ((p.stderr or p.stdout).decode(errors="replace").strip().splitlines() or ["no output"])[-1]
            raise SystemExit(f"benchmarks.ops.suite: --baseline code:{rev}: {what} failed (exit {p.returncode}): {last}")
        return p

    sha = run(["git", "-C", str(C.ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"],
              "not a commit of this checkout: git rev-parse").stdout.decode().strip()
    short, src, site = sha[:7], work / f"src_{sha[:7]}", work / f"site_{sha[:7]}"
    src.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(run(["git", "-C", str(C.ROOT), "archive", "--format=tar", sha],
                                             "git archive").stdout)) as tar:
        tar.extractall(src, filter="data")
    print(f"[suite-bench] installing the code at {short} into {site}", flush=True)
    run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "--target",
         str(site), str(src)], "pip install")
    return site, short


def baseline_arg(value: str) -> str:
    """``--baseline``: a name of :data:`BASELINES` or ``code:REV``."""
    if value in BASELINES or (value.startswith("code:") and len(value) > 5):
        return value
    raise argparse.ArgumentTypeError(f"{value!r}: choose {', '.join(sorted(BASELINES))} or code:REV (a git revision)")


def gold_comparison(before: list[dict], after: list[dict]) -> dict:
    """Paired by seed: the final test gold difference (today − before) with its 95% t interval, and the largest
    per-evaluation difference of the seed-mean eval gold curves."""
    import numpy as np

    from rlhf_lab_research.stats import paired_ci

    b = {f["seed"]: f["test_gold"] for f in before}
    a = {f["seed"]: f["test_gold"] for f in after}
    eff = paired_ci(a, b)
    steps = sorted(set.intersection(*(set(f["curve"]) for f in before + after)))
    mean_b = np.array([np.mean([f["curve"][s] for f in before]) for s in steps])
    mean_a = np.array([np.mean([f["curve"][s] for f in after]) for s in steps])
    return {"effect": eff, "steps": steps, "curve_before": mean_b, "curve_today": mean_a,
            "max_curve_diff": float(np.max(np.abs(mean_a - mean_b))) if steps else float("nan"),
            "before_mean": float(np.mean(list(b.values()))), "today_mean": float(np.mean(list(a.values())))}


def suite_projection(ratio: float) -> tuple[list[list], float, float]:
    """Rows (study, algorithm, jobs, stated min, projected min) and the totals, stated and projected: the
    sample's wall-time ratio (before ÷ today) applied to the studies of ``SAMPLE_ALGOS``."""
    from importlib.resources import files

    from rlhf_lab_research import suite

    rows, stated, projected = [], 0.0, 0.0
    for study, _ in suite.SUITE:
        n, mins = suite.expected(study)
        text = files("rlhf_lab.sweeps").joinpath("sweep", f"{study}.yaml").read_text()
        over = re.search(r"override /algo:\s*(\w+)", text)  # the algorithm a study file overrides, else ppo
        algo, m = over.group(1) if over else "ppo", float(mins or 0)
        proj = m / ratio if algo in SAMPLE_ALGOS else m
        rows.append([study, algo, n or 0, m, proj])
        stated, projected = stated + m, projected + proj
    return rows, stated, projected


def section(argv, started, cores, secs, args, sides: dict, gold: dict, proj) -> str:
    cmd = "python -m benchmarks.ops.suite" + (" " + shlex.join(argv) if argv else "")
    walls = {n: sum(r["wall"] for r in rounds) for n, rounds in sides.items()}
    n_jobs = {n: sum(len(r["runs"]) for r in rounds) for n, rounds in sides.items()}
    ratio = walls["before"] / walls["today"]
    step_s = {n: [f["step_s"] for r in rounds for f in r["runs"]] for n, rounds in sides.items()}
    mean_step = {n: sum(v) / len(v) for n, v in step_s.items()}
    job_s = {n: [f["seconds"] for r in rounds for f in r["runs"]] for n, rounds in sides.items()}
    rows = [[SIDES[n][0], "`" + " ".join(SIDES[n][1]) + "`" if SIDES[n][1] else "(none)", walls[n], n_jobs[n],
             3600 * n_jobs[n] / walls[n], sum(job_s[n]) / len(job_s[n]), walls["before"] / walls[n], mean_step[n],
             mean_step["before"] / mean_step[n]] for n in sides]
    eff = gold["effect"]
    gold_rows = [[f["seed"], f["test_gold"], g["test_gold"], g["test_gold"] - f["test_gold"]]
                 for f, g in zip(sides["before"][0]["runs"], sides["today"][0]["runs"])]
    curve_rows = [[s, b, t, t - b] for s, b, t in zip(gold["steps"], gold["curve_before"], gold["curve_today"])]
    if min(len(r) for r in sides.values()) < 2:  # with two rounds: does round 2 reproduce round 1 (same seeds)?
        repro = "One round: reproducibility across rounds not checked (`--rounds 2`)."
    else:
        diff = {n: max(abs(a["test_gold"] - b["test_gold"]) for a, b in zip(r[0]["runs"], r[1]["runs"]))
                for n, r in sides.items()}
        repro = ("**Reproducible?** Largest difference of a seed's final test gold between round 1 and round 2 (the "
                 "same command run twice): " + "; ".join(f"{SIDES[n][0]} {d:.2g}" for n, d in diff.items()) + ".")
    if proj is None:
        projection = ["**The suite, projected**: only against `--baseline v1` (the study files' stated times were "
                      "measured before v2).", ""]
    else:
        proj_rows, stated, projected = proj
        n = sum(r[2] for r in proj_rows)
        projection = [
            f"**The suite, projected.** The studies' stated times (study file headers, `rlhf-lab-suite --dry-run`; "
            f"measured or estimated with the code before v2) with the sample's ratio ({ratio:.2f}×) applied to "
            f"the {', '.join(SAMPLE_ALGOS).upper()} studies and the others unchanged: **{stated:.0f} min → "
            f"{projected:.0f} min** with 2 jobs at a time, {n} jobs ({60 * n / stated:.0f} → {60 * n / projected:.0f}"
            " jobs per hour). A projection from the sample, not a measurement of the whole suite (which takes "
            "longer than a working session).", "",
            table(["study", "algorithm", "jobs", "stated min", "projected min"], proj_rows), ""]
    lines = [f"## Claims-suite throughput: jobs per hour, {SIDES['before'][0]} and {SIDES['today'][0]}", "",
             *C.run_lines(started, secs, cmd, cores), "",
             f"The sample: the default PPO job (`algo.steps={args.steps} eval.every_n_steps=10`), seeds 0–{args.seeds - 1}, "
             f"launched as the suite launches a study (2 jobs at a time), {args.rounds} round(s); wall time of "
             "`rlhf-lab -m …` from start to exit. Upstream stages cached by a warm-up job"
             + (f" (each side's own: {SIDES['before'][0]} is installed apart and keeps its own artifact cache)."
                if args.baseline.startswith("code:") else "."), "",
             table(["settings", "overrides", "wall s", "jobs", "jobs per hour", "mean job run s",
                    "wall before ÷ this", "mean PPO step s", "step before ÷ this"], rows), "",
             "(The PPO step, `time/step_s`, is rollout, scoring and update; a job also pays its start-up and the "
             "evaluations.)", "",
             "**Where a job's time goes** (mean seconds per job, from each run's `time/*` metrics, the same split "
             "as the job summary's `time` line; start-up is paid by a worker's first job only, later jobs of the "
             "same joblib worker reuse its imports; n/a: a metric that side's code does not log):", "",
             table(["phase", *(f"{SIDES[n][0]} s" for n in sides), "share of today's job slot"], phase_rows(sides)),
             "",
             repro, "",
             f"**Training result unchanged?** Final `test/gold_reward` per seed, round 1 (paired: same seed on both "
             f"sides). today − before: **{eff.estimate:+.3f} [{eff.lo:+.3f}, {eff.hi:+.3f}]** (95% t, n = {eff.n}); "
             f"means {gold['before_mean']:.3f} before, {gold['today_mean']:.3f} today.", "",
             table(["seed", "test gold before", "test gold today", "today − before"], gold_rows), "",
             f"Seed-mean `eval/gold_reward` curve (largest difference {gold['max_curve_diff']:.3f}):", "",
             table(["step", "before", "today", "today − before"], curve_rows), "", *projection]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ops.suite", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=4, help="jobs per side: seeds 0..N-1 (default 4)")
    ap.add_argument("--steps", type=int, default=60, help="PPO steps per job (default 60, the suite's usual)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds; round 2 runs the sides in reverse order")
    ap.add_argument("--cache-dir", default=None, help="the artifact cache (default: a fresh one in the work folder)")
    ap.add_argument("--results", default=str(C.RESULTS_DIR), help="the folder of the results' JSON files")
    ap.add_argument("--baseline", type=baseline_arg, default="v2",
                    help="what today's defaults are compared with: v2 (eval.reuse_start=false; default), v1 (before "
                         "v2), code:REV (the code at git revision REV, e.g. code:8d3a177, installed apart), or defaults "
                         "(with --with)")
    ap.add_argument("--with", dest="options", nargs="+", default=[], metavar="KEY=VALUE",
                    help="overrides of today's side, e.g. --with algo.compile=true (an option against the defaults: "
                         "--baseline defaults)")
    args = ap.parse_args(argv)
    if args.baseline == "defaults" and not args.options:
        ap.error("--baseline defaults compares the defaults with options: give them with --with KEY=VALUE")
    if args.options:
        SIDES["today"] = (f"today's defaults + {' '.join(args.options)}", list(args.options))
    started, t0, cores = datetime.datetime.now().astimezone(), time.time(), C.CoreUse()
    work = Path(tempfile.mkdtemp(prefix="rlhf_bench_suite_"))
    cache = Path(args.cache_dir).resolve() if args.cache_dir else work / "cache"
    common = [f"tracking.uri=sqlite:///{work / 'mlflow.db'}", f"algo.steps={args.steps}", "eval.every_n_steps=10",
              "trainer.progress_bar=false"]
    side_common = {"before": [f"cache_dir={cache}", *common], "today": [f"cache_dir={cache}", *common]}
    side_env: dict[str, dict | None] = {"before": None, "today": None}
    try:
        if args.baseline.startswith("code:"):
            site, short = install_revision(args.baseline[5:], work)
            SIDES["before"] = (f"the code at {short}", [])
            side_common["before"] = [f"cache_dir={work / f'cache_{short}'}", *common]
            side_env["before"] = {"PYTHONPATH": str(site)}
        else:
            SIDES["before"] = BASELINES[args.baseline]
        for name in (("before", "today") if side_env["before"] else ("today",)):
            warm = [*side_common[name], "study=warmup", "algo.steps=1", "eval.every_n_steps=0"]
            if name == "today":
                warm.append("eval.reuse_start=false")  # today's side builds its start-of-run evaluation itself
            secs, _ = C.rlhf_lab(warm, work / f"warmup_{name}", env=side_env[name], timeout=4 * 3600)
            label = SIDES[name][0] if name == "before" else "today's code"
            print(f"[suite-bench] {label}: warm-up job (builds or reuses the upstream stages): {secs:.0f} s", flush=True)
        sides: dict[str, list] = {"before": [], "today": []}
        for i in range(1, args.rounds + 1):
            for name in (("before", "today") if i % 2 else ("today", "before")):
                sides[name].append(sweep_side(name, work, side_common[name], args.seeds, i, side_env[name]))
        gold = gold_comparison(sides["before"][0]["runs"], sides["today"][0]["runs"])
        ratio = sum(r["wall"] for r in sides["before"]) / sum(r["wall"] for r in sides["today"])
        text = section(argv, started, cores, time.time() - t0, args, sides, gold,
                       suite_projection(ratio) if args.baseline == "v1" else None)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    C.save("suite_with" if args.options else "suite", text, data={"ratio": ratio, "sides": sides},
           folder=Path(args.results))
    print("\n" + text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
