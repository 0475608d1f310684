"""``python -m benchmarks.ops.gpu``: the GPU check, one run of a few minutes on a machine with a CUDA GPU; and the
0.5B-class run on this machine's CPU.

    python -m benchmarks.ops.gpu                             # Qwen2-0.5B-shaped model, bf16, trainer=gpu
    python -m benchmarks.ops.gpu --shape tiny --device cpu   # the same at tiny shapes on the CPU (the test's)
    python -m benchmarks.ops.gpu --trainer fsdp              # sharded over every visible GPU (fsdp_cpu: 2 CPU ranks)
    python -m benchmarks.ops.gpu --shape 0.5b --device cpu --vs-trl --save   # 0.5B on the CPU, TRL side by side

A random Qwen2 model of the shape with the world's tokenizer, saved with ``save_pretrained``, trained by ``rlhf-lab``
jobs through the command line (``algo=rm``, ``dpo``, ``ppo``, ``grpo``; ``policy.name_or_path=<folder> sft.steps=0``;
on the CPU at 0.5b PPO also with a LoRA policy on the shared base, the reference its adapters disabled), each read
back: FINISHED with finite losses, median step time and tokens/s, peak memory, and the fraction of the device's peak
(6 · parameters · tokens/s ÷ the GPU's dense bf16 peak, :data:`PEAK_TFLOPS`, or ÷ the fp32 matmul rate measured here
at the jobs' threads on the CPU; PPO's and GRPO's count trained tokens only: a lower bound). ``--vs-trl``: TRL's
``DPOTrainer``, ``RewardTrainer`` and ``GRPOTrainer`` against ours on the same model and batches (the ``vs_trl``
benchmarks at this shape). ``--save``: the section into ``benchmarks/results/`` and ``results.md``. Exit status 1
when a job fails or a loss is not finite.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import common as C

# the vocabulary is the world tokenizer's (None): a random model over Qwen2's 151,936 ids samples ids the world's
# 384-token tokenizer cannot decode, and every preference pair comes out empty. The 0.5b trunk is Qwen2-0.5B's
# (358M parameters with the world's vocabulary; 494M, a quarter of its FLOPs in the LM head, with Qwen2's)
SHAPES = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=None),
    "tiny": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=None),
}
# dense bf16 peak of the device, TFLOP/s, by a substring of torch.cuda.get_device_name()
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0, "L4": 121.0}
JOBS = {"rm": ["algo=rm"], "dpo": ["algo=dpo"], "ppo_lora": ["algo=ppo", "algo.lora.r=16",
        "algo.reference.kind=lora_disabled"], "grpo": ["algo=grpo"], "ppo": ["algo=ppo"]}  # the largest last
# job sizes per shape (the 0.5b shape on the CPU: "0.5b_cpu"); PPO and GRPO sample `batch` responses per step
# "lr": the policy jobs' algo.lr (and PPO's critic_lr) where the toy world's 3e-4 is too large: at 0.5b on one H200,
# GRPO at 3e-4 stopped at step 2 on the divergence guard (approxkl 5.5 > 5); 1e-6 is TRL's default for DPO and GRPO
SIZES = {"0.5b": {"steps": 8, "batch": 64, "pairs": 512, "new_tokens": 64, "threads": 1, "eval": 32, "lr": 1e-6},
         "0.5b_cpu": {"steps": 3, "batch": 4, "pairs": 16, "new_tokens": 16, "threads": 2, "eval": 4},
         "tiny": {"steps": 3, "batch": 8, "pairs": 48, "new_tokens": 8, "threads": 1, "eval": 32}}
# --vs-trl: each vs_trl benchmark's sizes at this shape (C.OVERRIDES while it runs)
VS_TRL = {"DPO": ["algo.batch_size=4"], "RM": ["reward_model.batch_size=4"],
          "GRPO": ["algo.batch_size=8", "algo.samples_per_prompt=4", "generation.max_new_tokens=16",
                   "generation.max_prompt_len=64"]}


def matmul_peak(threads: int, n: int = 2048, seconds: float = 4.0) -> float:
    """This machine's fp32 matmul rate at `threads` torch threads, FLOP/s: the best of repeated n×n products."""
    torch.set_num_threads(threads)
    a, b, best, end = torch.randn(n, n), torch.randn(n, n), 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        a @ b
        best = max(best, 2 * n ** 3 / (time.perf_counter() - t))
    return best


def stream_bandwidth(threads: int, n: int = 2 ** 25, repeats: int = 10) -> dict[str, float]:
    """This machine's memory bandwidth at `threads` torch threads, bytes/s: STREAM's copy (``b = a``) and triad
    (``a = b + s·c``) on fp32 tensors of `n` elements (default 2^25: 128 MiB each, four times a 32 MiB last-level
    cache), each the best of `repeats` after one untimed pass; bytes counted as STREAM counts them (2 and 3 arrays
    read or written, no write-allocate traffic)."""
    torch.set_num_threads(threads)
    a, b, c = torch.rand(n), torch.rand(n), torch.rand(n)  # written: every page is touched before the timing

    def best(fn, arrays: int) -> float:
        return arrays * a.element_size() * n / C.best_seconds(fn, repeats)

    return {"copy": best(lambda: b.copy_(a), 2), "triad": best(lambda: torch.add(b, c, alpha=3.0, out=a), 3)}


def job_overrides(job: str, shape: str, device: str, folder: Path, work: Path,
                  trainer: str | None = None) -> list[str]:
    s = SIZES.get(f"{shape}_{device}", SIZES[shape])
    trainer = trainer or ("gpu" if device == "cuda" else "cpu")
    common = [f"policy.name_or_path={folder}", "sft.steps=0", f"trainer={trainer}",
              f"tracking.uri=sqlite:///{work / 'mlflow.db'}", f"cache_dir={work / 'cache'}", "study=gpu_check",
              f"data.n_train={s['pairs']}", f"data.n_eval={max(16, s['pairs'] // 8)}", f"eval.n_prompts={s['eval']}",
              f"eval.n_test_prompts={s['eval']}", "eval.n_ood_prompts=0", "eval.every_n_steps=0",
              f"generation.max_new_tokens={s['new_tokens']}", "generation.max_prompt_len=64",
              "trainer.progress_bar=false", "trainer.log_every_n_steps=1", "reward_model=same_source",
              f"reward_model.steps={s['steps']}", f"reward_model.batch_size={s['batch']}"]
    common += (["policy.dtype=bfloat16", "reward_model.dtype=bfloat16"] if device == "cuda"
               else [f"trainer.threads={s['threads']}"])
    batch = s["batch"] * (2 if trainer.endswith("_cpu") else 1)  # 2 ranks: GRPO's groups of 8 on each
    group = [f"algo.samples_per_prompt={min(8, batch)}"] if job == "grpo" else []
    if (shape, device) == ("0.5b", "cpu") and job not in ("rm", "dpo"):  # one AdamW step per rollout
        group += ["algo.ppo_epochs=1", "algo.num_minibatches=1"]
    sized = [] if job == "rm" else [f"algo.steps={s['steps']}", f"algo.batch_size={batch}", *group]
    if "lr" in s and job != "rm":
        sized += [f"algo.lr={s['lr']}"] + ([f"algo.critic_lr={s['lr']}"] if job.startswith("ppo") else [])
    return [*JOBS[job], *common, *sized]


def run_job(overrides: list[str], work: Path) -> subprocess.CompletedProcess:
    return C.rlhf_lab(overrides, work, timeout=4 * 3600, check=False)[1]


def job_figures(client, exp_id: str, job: str) -> dict:
    """The job's run (its stage's newest) read back: status, finite losses, step time, tokens/s, memory."""
    stage = JOBS[job][0].split("=")[1]
    runs = client.search_runs([exp_id], f"tags.`rlhf_lab.stage` = '{stage}'", order_by=["attributes.start_time DESC"],
                              max_results=1)
    if not runs:
        return {"job": job, "status": "no run"}
    r = runs[0]
    prefix = "rm/" if stage == "rm" and "rm/time/step_s" in r.data.metrics else ""

    def history(key: str) -> list[float]:
        return [m.value for m in sorted(client.get_metric_history(r.info.run_id, key), key=lambda m: m.step)]

    steps, tps = history(f"{prefix}time/step_s")[1:], history(f"{prefix}time/tokens_per_s")[1:]
    losses = {k: v for k, v in r.data.metrics.items() if "loss" in k}
    return {"job": job, "status": r.info.status, "finite": bool(losses) and all(map(math.isfinite, losses.values())),
            "step_s": C.median(steps), "tokens_per_s": C.median(tps),
            "peak_mb": r.data.metrics.get("memory/peak_gpu_mb", r.data.metrics.get("memory/peak_rss_mb")),
            "error": r.data.tags.get("rlhf_lab.error", "")}


def vs_trl(wm: C.WorldModel, work: Path, threads: int) -> tuple[list[str], list[str]]:
    """TRL side by side at this shape (the vs_trl benchmarks, 2 rounds of 3 steps a side, the first a warm-up; GRPO's
    third side ``algo.shared_prompt=true``, no compiled side): (markdown blocks with every table of each comparison,
    GRPO's phases included; summary cells)."""
    from benchmarks.vs_trl import grpo, train

    C.quiet()
    torch.set_num_threads(threads)
    runs = {"DPO": lambda: train.run("dpo", wm, 3, 1, 2), "RM": lambda: train.run("rm", wm, 3, 1, 2),
            "GRPO": lambda: grpo.run(None, wm, work, 3, 1, 2, option=grpo.SHARED_PROMPT)}
    secs = {}
    try:
        for k, run in runs.items():
            C.OVERRIDES[:] = VS_TRL[k]
            secs[k] = run()
            gc.collect()  # the last side's models, before the next benchmark loads its own
    finally:
        C.OVERRIDES.clear()  # also when a comparison fails: no later compose() gets this shape's sizes
    blocks = [f"### {k}: {s.title}\n\n" + "\n\n".join(s.tables) + f"\n\n- {s.findings[0]}" for k, s in secs.items()]
    return blocks, [f"{k} {s.data['ratio']:.2f}×" + (f" ({s.data['option']}: {s.data['ratio_option']:.2f}×)"
                                                      if s.data.get("option") else "")
                    + ("" if s.ok else " (LOSS DIFFERS)") for k, s in secs.items()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--trainer", choices=("fsdp", "fsdp_cpu", "ddp", "ddp_cpu"), default=None,
                   help="the jobs' trainer preset (default: gpu with --device cuda, cpu with --device cpu)")
    p.add_argument("--jobs", default=",".join(JOBS), help=f"the jobs to run, comma-separated (default: {','.join(JOBS)})")
    p.add_argument("--work", default=None, help="work folder (default: a new temporary one)")
    p.add_argument("--out", default=None, help="also write the table as markdown to this file")
    p.add_argument("--vs-trl", action="store_true", help="then TRL's DPO, RM and GRPO trainers against ours")
    p.add_argument("--save", action="store_true", help="write the section into benchmarks/results/ and results.md")
    a = p.parse_args(argv)
    jobs = C.subset(p, "--jobs", a.jobs, JOBS)
    from mlflow.tracking import MlflowClient

    if a.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks.ops.gpu: no CUDA device here; on the CPU: --device cpu --shape tiny", file=sys.stderr)
        return 2
    work = Path(a.work or tempfile.mkdtemp(prefix="rlhf_lab_gpu_"))
    work.mkdir(parents=True, exist_ok=True)
    started, cores, t0 = datetime.datetime.now().astimezone(), C.CoreUse(), time.time()
    threads = SIZES.get(f"{a.shape}_{a.device}", SIZES[a.shape])["threads"]
    name = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    tflops = next((v for k, v in PEAK_TFLOPS.items() if k in name), None) if a.device == "cuda" else None
    peaks = [tflops * 1e12] if tflops else [] if a.device == "cuda" else [matmul_peak(threads)]
    wm = C.make_world_model(C.compose(["policy=a_small"]), work / "world", qwen2=SHAPES[a.shape])
    n_params = wm.n_params
    print(f"[gpu] {a.shape}: {n_params / 1e6:.2f}M parameters on {name}; work folder {work}", flush=True)
    client, rows, failed = MlflowClient(f"sqlite:///{work / 'mlflow.db'}"), [], False
    for job in (j for j in jobs if j != "ppo_lora" or (a.shape, a.device) == ("0.5b", "cpu")):  # LoRA: 0.5b CPU
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # MiB: the largest child's so far
        r = run_job(job_overrides(job, a.shape, a.device, wm.lm_dir, work, a.trainer), work)
        after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        failed |= bool(r.returncode)
        if r.returncode:
            print(r.stderr[-2000:], file=sys.stderr)
        exp = client.get_experiment_by_name("rlhf-lab")
        rows.append(job_figures(client, exp.experiment_id, job) if exp else {"job": job, "status": "no run"})
        print(f"[gpu] {job}: exit {r.returncode} after {time.time() - t0:.0f} s: "  # kept if a later job is cut off
              + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in rows[-1].items()
                          if k not in ("job", "error")), flush=True)
        if rows[-1].get("peak_mb") is None and a.device == "cpu":  # PPO's log their own; else this process's child's
            rows[-1]["peak_mb"] = after if after > before else f"≤ {before:.0f}"
        if r.returncode:  # -9: killed, on Linux most often by the out-of-memory killer (its run left RUNNING)
            rows[-1]["status"] = f"{rows[-1]['status']}, exit {r.returncode}"
    flags = (f"--shape {a.shape} --device {a.device}" + (f" --trainer {a.trainer}" if a.trainer else "")
             + (f" --jobs {a.jobs}" if jobs != list(JOBS) else ""))
    if a.device == "cpu":
        peaks.append(matmul_peak(threads))  # before and after the jobs: the best is the machine's
    for row in rows:  # 6 · parameters · tokens/s over the peak
        row["mfu"] = 6 * n_params * row.get("tokens_per_s", math.nan) / max(peaks) if peaks else math.nan
    keys = ("job", "status", "finite", "step_s", "tokens_per_s", "peak_mb", "mfu")
    mem, frac = ("peak GPU MiB", "MFU") if a.device == "cuda" else ("peak RSS MiB", "fraction of matmul peak")
    table = C.table(["job", "status", "losses finite", "step s", "tokens/s", mem, frac],
                    [[r.get(k, False if k == "finite" else math.nan) for k in keys] for r in rows])
    text = (f"{'GPU check' if a.device == 'cuda' else 'CPU run'}: `python -m benchmarks.ops.gpu {flags}` on {name}, "
            f"{n_params / 1e6:.2f}M parameters, {time.time() - t0:.0f} s in all" + ("" if a.device == "cuda" else
            f"; fp32 matmul rate measured here at {threads} threads, {peaks[0] / 1e9:.0f} GFLOP/s before the jobs and "
            f"{peaks[1] / 1e9:.0f} after (the fraction is of the higher)") + f"\n\n{table}\n")
    done = [r["job"] for r in rows if r.get("status") == "FINISHED" and r.get("finite")]
    summary = [f"{a.shape} on {name}: rlhf-lab jobs finished, losses finite", f"{len(done)}/{len(rows)}" + "".join(
        f"; {r['job']}: {r.get('status')}" for r in rows if r["job"] not in done)]
    if a.vs_trl:
        blocks, cells = vs_trl(wm, work, threads)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
        text += "\n" + "\n\n".join(blocks) + f"\n\n- peak RSS of the side-by-side process: {rss:.1f} GiB\n"
        summary.append("ours/TRL: " + ", ".join(cells))
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    ok = all(r.get("status") == "FINISHED" and r.get("finite") for r in rows) and not failed
    if a.save:
        cmd = f"python -m benchmarks.ops.gpu {flags}" + " --vs-trl" * a.vs_trl + " --save"
        sec = C.Section(f"{a.shape} on {name}: rlhf-lab jobs" + (" and TRL side by side" if a.vs_trl else ""))
        sec.tables.append(text)
        C.save(f"{'gpu' if a.device == 'cuda' else 'cpu'}_{a.shape}",
               sec.markdown(C.run_lines(started, time.time() - t0, cmd, cores)),
               summary + [""] * (3 - len(summary)))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
