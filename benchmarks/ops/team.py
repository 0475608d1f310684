"""Team scale: ``python -m benchmarks.ops.team [--jobs 8] [--points 300] [--no-server]``.

The wall time of one tiny sweep launched three ways (joblib 1 and 2 at a time, local Ray), and the tracking cost per
metric point against sqlite and the team server (see benchmarks/README.md). The result goes to
``benchmarks/results/team.json`` and the generated benchmarks/results.md.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common as C
from benchmarks.common import table

MICRO = ["policy=a_tiny", "pretrain.steps=3", "pretrain.n_texts=200", "sft.n_examples=100", "eval.n_prompts=4",
         "eval.n_test_prompts=4", "eval.n_ood_prompts=0", "eval.every_n_steps=0", "eval.n_samples_logged=2",
         "generation.max_new_tokens=8", "trainer.progress_bar=false", "trainer.log_every_n_steps=1",
         "trainer.max_steps=2", "trainer.threads=1", "algo=sft"]
LAUNCHERS = {
    "joblib, 1 job at a time": ["hydra/launcher=parallel", "hydra.launcher.n_jobs=1"],
    "joblib, 2 jobs at a time": ["hydra/launcher=parallel", "hydra.launcher.n_jobs=2"],
    "Ray, local instance with 2 CPUs": ["hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2",
                                        "+hydra.launcher.ray.init.include_dashboard=false"],
}
RAY_START = ("import time, ray; t = time.perf_counter(); ray.init(num_cpus=2, include_dashboard=False, "
             "object_store_memory=78643200); print(time.perf_counter() - t); ray.shutdown()")


def sweeps(work: Path, n_jobs: int) -> list[list]:
    """Rows: launcher, wall s, jobs finished, summed job run time s, wall per job s, speed-up over 1 at a time."""
    from mlflow.tracking import MlflowClient

    common = [*MICRO, f"cache_dir={work / 'cache'}", f"tracking.uri=sqlite:///{work / 'mlflow.db'}"]
    secs, _ = C.rlhf_lab([*common, "study=warmup"], work / "warmup")  # builds the base model once
    print(f"[team] warm-up job (builds the base model): {secs:.0f} s", flush=True)
    rows, base = [], None
    for i, (name, launcher) in enumerate(LAUNCHERS.items()):
        study = f"bench{i}"
        secs, r = C.rlhf_lab(["-m", *launcher, *common, f"study={study}",
                            "seed=" + ",".join(str(s) for s in range(n_jobs))], work / study)
        done = [(run.info.end_time - run.info.start_time) / 1000  # run times of the FINISHED job runs
                for run in C.finished_job_runs(MlflowClient(f"sqlite:///{work / 'mlflow.db'}"), study)]
        if len(done) != n_jobs or "reusing cached base model" not in r.stdout + r.stderr:
            raise RuntimeError(f"{name}: {len(done)} of {n_jobs} jobs finished, or the base model was not reused")
        base = base or secs
        rows.append([name, secs, len(done), sum(done), secs / n_jobs, base / secs])
        print(f"[team] {name}: {secs:.0f} s for {n_jobs} jobs", flush=True)
    return rows


def log_cost(uri: str, points: int) -> tuple[float, float]:
    """(ms per point with one synchronous log_metric per point, ms per point in log_metrics batches of 10)."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    exp = mlflow.set_experiment("bench-tracking")
    with mlflow.start_run(experiment_id=exp.experiment_id):
        mlflow.log_metric("warmup", 0.0, step=0)
        t0 = time.perf_counter()
        for i in range(points):
            mlflow.log_metric("bench/one", float(i), step=i)
        single = (time.perf_counter() - t0) * 1000 / points
        steps = max(1, points // 10)
        t0 = time.perf_counter()
        for i in range(steps):
            mlflow.log_metrics({f"bench/k{j}": float(i * j) for j in range(10)}, step=i)
        batched = (time.perf_counter() - t0) * 1000 / (steps * 10)
    return single, batched


def tracking(work: Path, points: int, with_server: bool) -> tuple[list[list], str]:
    """Rows: store, URI, ms per point (single), ms per point (batches of 10); and a note on the server."""
    rows = [["sqlite file (the default store)", "sqlite:///<tmp>/track.db",
             *log_cost(f"sqlite:///{work / 'track.db'}", points)]]
    if not with_server:
        return rows, "server not measured (--no-server)"
    from rlhf_lab.entry import server
    from rlhf_lab.server import auth as server_auth

    folder = Path(tempfile.mkdtemp(prefix="rlhf_lab_team_bench_"))  # under /tmp: the postgres user must reach it
    folder.chmod(0o755)
    try:
        t0 = time.perf_counter()
        url = server.start(folder / "team", port=server.free_port())
        note = f"server start-up (a fresh PostgreSQL cluster, then MLflow): {time.perf_counter() - t0:.0f} s"
        with server_auth.mlflow_login(*server_auth.read_credentials(server.add_user(folder / "team", "bench"))):
            rows.append(["team server (rlhf-lab-server: MLflow over HTTP with logins, PostgreSQL 15)", url,
                         *log_cost(url, points)])
    except server.ServerError as err:
        note = f"server not measured: {err}"
    finally:
        server.stop(folder / "team")
        shutil.rmtree(folder, ignore_errors=True)
    return rows, note


def section(args, argv: list[str], started: datetime.datetime, cores, secs: float, sweep_rows, ray_s: float,
            track_rows, note: str) -> str:
    cmd, one = "python -m benchmarks.ops.team" + (" " + shlex.join(argv) if argv else ""), sweep_rows[0]
    lines = ["## Team scale: sweeps through the launchers, tracking on the team server", "",
             *C.run_lines(started, secs, cmd, cores), "",
             f"A sweep of {args.jobs} `algo=sft` jobs at the tests' MICRO sizes (1 torch thread each), the base model "
             "cached by a warm-up job; wall time of `rlhf-lab -m …` from start to exit (process start-up, the parent "
             "run, the jobs, the study report into the parent run). Speed-up: wall time with 1 job at a time ÷ this "
             f"wall time. A local Ray instance (2 CPUs, no dashboard) alone takes {ray_s:.1f} s to start.", "",
             table(["launcher", "wall s", "jobs finished", "sum of job run times s", "wall s per job", "speed-up"],
                   sweep_rows), "",
             "How to read it: with 1 job at a time joblib starts no worker and runs the jobs one after the other in "
             "the launching process; with 2 it starts 2 worker processes, and Ray an instance and 2 workers, each "
             f"importing torch, Lightning and MLflow again. The jobs here are tiny ({one[3] / one[2]:.1f} s of run "
             "time each, one at a time), so those start-ups and the cores' other load decide the wall time; jobs "
             "of minutes (the studies) gain from running 2 at a time (README, `ppo_beta_grid`).", "",
             f"Tracking cost per metric point, {args.points} points each way, from one process: one synchronous "
             "`mlflow.log_metric` per point, and `mlflow.log_metrics` with 10 keys per step. " + note[:1].upper() + note[1:] + ".", "",
             table(["store", "URI", "ms per point (log_metric)", "ms per point (batches of 10)"], track_rows)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ops.team", description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=8, help="jobs per sweep (default 8)")
    ap.add_argument("--points", type=int, default=300, help="metric points per store and way (default 300)")
    ap.add_argument("--no-server", action="store_true", help="measure sqlite only")
    ap.add_argument("--results", default=str(C.RESULTS_DIR), help="the folder of the results' JSON files")
    args = ap.parse_args(argv)
    started, t0, cores = datetime.datetime.now().astimezone(), time.time(), C.CoreUse(
        detached="the team server's PostgreSQL and Ray's daemons")
    work = Path(tempfile.mkdtemp(prefix="rlhf_bench_team_"))
    try:
        sweep_rows = sweeps(work, args.jobs)
        # start and stop a local Ray instance with 2 CPUs (what hydra/launcher=ray pays before its first job)
        ray_s = float(subprocess.run([sys.executable, "-c", RAY_START], capture_output=True, text=True,
                                     timeout=300).stdout.strip().splitlines()[-1])
        track_rows, note = tracking(work, args.points, not args.no_server)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = section(args, argv, started, cores, time.time() - t0, sweep_rows, ray_s, track_rows, note)
    C.save("team", text, data={"sweeps": sweep_rows, "ray_start_s": ray_s, "tracking": track_rows},
           folder=Path(args.results))
    print("\n" + text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
