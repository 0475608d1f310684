"""Per-rank memory of sharded training: ``python -m benchmarks.ops.sharding [--quick]``.

One SFT job (``algo=sft``: the job stage, a causal LM trained by ``fit_lm``) on a family-a model of about 100M
parameters (hidden 768, 14 layers, 12 heads; ``--quick``: 13M), run as a user runs it, with ``trainer=cpu`` (one
process) and with ``trainer=fsdp_cpu`` (FSDP2 on 2 CPU processes, gloo), from the same cached base model (built
first, by its own command, so that neither run's peak includes it). Reported from each run's MLflow metrics
(rank 0's): ``memory/param_bytes``, ``memory/grad_bytes``, ``memory/optimizer_bytes`` (what training holds on one
rank: the optimised parameters, their gradients, AdamW's two moments); the peak RSS of the largest process of the
job (``RUSAGE_CHILDREN`` of a wrapper process); the last ``loss/lm`` of both (the same global batches: equal up to
float rounding).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import mlflow

from benchmarks import common as C
from benchmarks.common import Section, table

WRAP = ("import resource, subprocess, sys; r = subprocess.run([sys.executable, '-m', 'rlhf_lab.entry.run', "
        "*sys.argv[1:]]); print('PEAK_RSS_MB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024); "
        "sys.exit(r.returncode)")
KEYS = ("param_bytes", "grad_bytes", "optimizer_bytes")


def job(args: list[str], work: Path) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall s, peak RSS MiB of the job's largest process, the process) of ``rlhf-lab ARGS`` in `work`."""
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", WRAP, *args], cwd=work, capture_output=True, text=True, timeout=3600,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(C.ROOT)})
    if r.returncode != 0:
        raise RuntimeError(f"rlhf-lab {' '.join(args)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    peak = float(r.stdout.rsplit("PEAK_RSS_MB", 1)[1].split()[0])
    return time.perf_counter() - t0, peak, r


def run(cfg, wm, work: Path, arch: dict, steps: int) -> Section:
    sec = Section("Sharded training (FSDP2) on CPU processes: per-rank memory", __doc__.split("\n\n", 1)[1].strip())
    shape = [f"policy.arch.{k}={v}" for k, v in arch.items()] + [
        "policy=a_tiny", "pretrain.steps=1", "pretrain.n_texts=64", "pretrain.batch_size=8", f"sft.steps={steps}",
        "sft.batch_size=8", "sft.n_examples=64", "eval.n_prompts=4", "eval.n_test_prompts=4", "eval.n_ood_prompts=2",
        "eval.n_samples_logged=2", "generation.max_new_tokens=8", "trainer.progress_bar=false",
        "trainer.log_every_n_steps=1",
        f"cache_dir={work / 'shard_cache'}"]
    job(["algo=pretrain", *shape, f"tracking.uri=sqlite:///{work / 'shard_base.db'}",
         f"hydra.run.dir={work / 'shard_base'}"], work)
    out = {}
    for trainer in ("cpu", "fsdp_cpu"):
        db = work / f"shard_{trainer}.db"
        secs, peak, _ = job(["algo=sft", *shape, f"trainer={trainer}", f"tracking.uri=sqlite:///{db}",
                             f"hydra.run.dir={work / trainer}"], work)
        client = mlflow.MlflowClient(f"sqlite:///{db}")
        exp = client.get_experiment_by_name("rlhf-lab")
        runs = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("rlhf_lab.stage") == "sft"]
        m = runs[0].data.metrics
        out[trainer] = {**{k: m[f"memory/{k}"] for k in KEYS}, "params": m["model/params_total"], "peak": peak,
                        "secs": secs, "loss": m["loss/lm"]}
    one, two = out["cpu"], out["fsdp_cpu"]
    rows = [[t, f"{o['params'] / 1e6:.1f}M", *(f"{o[k] / 2**20:.0f}" for k in KEYS),
             f"{sum(o[k] for k in KEYS) / 2**20:.0f}", f"{o['peak']:.0f}", f"{o['secs']:.0f}", f"{o['loss']:.5f}"]
            for t, o in (("cpu (1 process)", one), ("fsdp_cpu (2 processes)", two))]
    sec.tables.append(table(["trainer", "parameters", "param MiB/rank", "grad MiB/rank", "optimizer MiB/rank",
                             "trained state MiB/rank", "peak RSS MiB (largest process)", "job s", "last loss/lm"], rows))
    ratio = sum(two[k] for k in KEYS) / sum(one[k] for k in KEYS)
    dloss = abs(one["loss"] - two["loss"])
    sec.ok = ratio <= 0.6 and dloss < 1e-3
    peak = two["peak"] / one["peak"]
    sec.findings += [f"trained state per rank at 2 ranks / 1 rank = **{ratio:.3f}** (bar: ≤ 0.6)",
                     f"last loss/lm: |1 process − 2 processes| = {dloss:.2e} (the same global batches)",
                     f"peak RSS of the largest process, 2 ranks / 1 process = {peak:.2f}: the peak also counts full "
                     "copies that sharding does not remove (each rank loads the whole model before it is sharded; "
                     "evaluations and the final save gather the whole weights), which the trained state "
                     "(weights, gradients, two AdamW moments) outweighs only at larger sizes"]
    sec.summary = ["trained-state bytes per rank, 2 FSDP ranks / 1 process", f"{ratio:.3f}",
                   "≤ 0.6" if ratio <= 0.6 else "above 0.6"]
    sec.data = {"ratio": ratio, **{f"{t}_{k}": v for t, o in out.items() for k, v in o.items()}}
    return sec


SIZES = {"full": {"sharding": dict(arch=dict(hidden=768, layers=14, heads=12), steps=2)},
         "quick": {"sharding": dict(arch=dict(hidden=256, layers=16, heads=4), steps=2)}}

if __name__ == "__main__":
    sys.exit(C.main("python -m benchmarks.ops.sharding", {"sharding": run}, SIZES))
