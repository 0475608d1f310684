"""``python -m benchmarks.ops.gpu``: the GPU check, one run of a few minutes on a machine with a CUDA GPU.

    python -m benchmarks.ops.gpu                             # Qwen2-0.5B-shaped model, bf16, trainer=gpu
    python -m benchmarks.ops.gpu --shape tiny --device cpu   # the same at tiny shapes on the CPU (the test's)
    python -m benchmarks.ops.gpu --trainer fsdp              # sharded over every visible GPU (fsdp_cpu: 2 CPU ranks)

A random Qwen2 model of the shape, saved with ``save_pretrained``, trained by four ``rlhf-lab`` jobs through the
command line (``algo=rm``, ``dpo``, ``ppo``, ``grpo``; ``policy.name_or_path=<folder> sft.steps=0``), each read back:
FINISHED with finite losses, median step time and tokens/s, peak GPU memory, and MFU (6 · parameters · tokens/s ÷
the GPU's dense bf16 peak, :data:`PEAK_TFLOPS`; PPO's and GRPO's count trained tokens only: a lower bound). Exit
status 1 when a job fails or a loss is not finite.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common as C

SHAPES = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936),
    "tiny": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=None),  # None: the tokenizer's size
}
# dense bf16 peak of the device, TFLOP/s, by a substring of torch.cuda.get_device_name()
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0, "L4": 121.0}
ALGOS = ("rm", "dpo", "ppo", "grpo")
# job sizes: (steps, batch) per shape; PPO and GRPO sample `batch` responses per step
SIZES = {"0.5b": {"steps": 8, "batch": 64, "pairs": 2048, "new_tokens": 64},
         "tiny": {"steps": 3, "batch": 8, "pairs": 48, "new_tokens": 8}}


def build_model(shape: str, folder: Path) -> int:
    """Save a random Qwen2 model of the shape with the world's family-a tokenizer into `folder`; its parameters."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rlhf_lab.world import streams as D
    from rlhf_lab.config import world as W
    from rlhf_lab.models import families as Fm

    cfg = C.compose(["policy=a_small"])
    tok = Fm.train_tokenizer("a", [p + " " + r for p, r in D.reviews(W.world_settings(cfg), "pretrain_a", 2000)],
                             int(cfg.policy.vocab_size))
    dims = dict(SHAPES[shape])
    dims["vocab_size"] = dims["vocab_size"] or len(tok)
    config = Qwen2Config(**dims, max_position_embeddings=512, tie_word_embeddings=True,
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def job_overrides(algo: str, shape: str, device: str, folder: Path, work: Path,
                  trainer: str | None = None) -> list[str]:
    s = SIZES[shape]
    trainer = trainer or ("gpu" if device == "cuda" else "cpu")
    common = [f"policy.name_or_path={folder}", "sft.steps=0", f"trainer={trainer}",
              f"tracking.uri=sqlite:///{work / 'mlflow.db'}", f"cache_dir={work / 'cache'}", "study=gpu_check",
              f"data.n_train={s['pairs']}", f"data.n_eval={max(16, s['pairs'] // 8)}", "eval.n_prompts=32",
              "eval.n_test_prompts=32", "eval.n_ood_prompts=0", "eval.every_n_steps=0",
              f"generation.max_new_tokens={s['new_tokens']}", "generation.max_prompt_len=64",
              "trainer.progress_bar=false", "trainer.log_every_n_steps=1", "reward_model=same_source",
              f"reward_model.steps={s['steps']}", f"reward_model.batch_size={s['batch']}"]
    if device == "cuda":
        common += ["policy.dtype=bfloat16", "reward_model.dtype=bfloat16"]
    batch = s["batch"] * (2 if trainer.endswith("_cpu") else 1)  # 2 ranks: GRPO's groups of 8 on each
    sized = [] if algo == "rm" else [f"algo.steps={s['steps']}", f"algo.batch_size={batch}"]  # rm: reward_model.*
    return [f"algo={algo}", *common, *sized]


def run_job(overrides: list[str], work: Path) -> subprocess.CompletedProcess:
    return C.rlhf_lab(overrides, work, timeout=4 * 3600, check=False)[1]


def job_figures(client, exp_id: str, algo: str, n_params: int, peak_tflops: float | None) -> dict:
    """The job's run (stage `algo`, the newest) read back: status, finite losses, step time, tokens/s, memory."""
    runs = client.search_runs([exp_id], f"tags.`rlhf_lab.stage` = '{algo}'", order_by=["attributes.start_time DESC"],
                              max_results=1)
    if not runs:
        return {"algo": algo, "status": "no run"}
    r = runs[0]
    prefix = "rm/" if algo == "rm" and "rm/time/step_s" in r.data.metrics else ""

    def history(key: str) -> list[float]:
        return [m.value for m in sorted(client.get_metric_history(r.info.run_id, key), key=lambda m: m.step)]

    steps, tps = history(f"{prefix}time/step_s")[1:], history(f"{prefix}time/tokens_per_s")[1:]
    losses = {k: v for k, v in r.data.metrics.items() if "loss" in k}
    tokens_per_s = statistics.median(tps) if tps else float("nan")
    return {"algo": algo, "status": r.info.status, "finite": bool(losses) and all(map(math.isfinite, losses.values())),
            "step_s": statistics.median(steps) if steps else float("nan"), "tokens_per_s": tokens_per_s,
            "peak_gpu_mb": r.data.metrics.get("memory/peak_gpu_mb", float("nan")),
            "mfu": 6 * n_params * tokens_per_s / (peak_tflops * 1e12) if peak_tflops else float("nan"),
            "error": r.data.tags.get("rlhf_lab.error", "")}


def table(rows: list[dict]) -> str:
    keys = ("algo", "status", "finite", "step_s", "tokens_per_s", "peak_gpu_mb", "mfu")
    return C.table(["job", "status", "losses finite", "step s", "tokens/s", "peak GPU MiB", "MFU"],
                   [[r.get(k, False if k == "finite" else math.nan) for k in keys] for r in rows])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--trainer", choices=("fsdp", "fsdp_cpu", "ddp", "ddp_cpu"), default=None,
                   help="the jobs' trainer preset (default: gpu with --device cuda, cpu with --device cpu)")
    p.add_argument("--work", default=None, help="work folder (default: a new temporary one)")
    p.add_argument("--out", default=None, help="also write the table as markdown to this file")
    a = p.parse_args(argv)
    import torch
    from mlflow.tracking import MlflowClient

    if a.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks.ops.gpu: no CUDA device here; on the CPU: --device cpu --shape tiny", file=sys.stderr)
        return 2
    work = Path(a.work or tempfile.mkdtemp(prefix="rlhf_lab_gpu_"))
    work.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in name), None) if a.device == "cuda" else None
    t0 = time.time()
    n_params = build_model(a.shape, work / "model")
    print(f"[gpu] {a.shape}: {n_params / 1e6:.2f}M parameters on {name}; work folder {work}", flush=True)
    procs = {}
    for algo in ALGOS:
        r = run_job(job_overrides(algo, a.shape, a.device, work / "model", work, a.trainer), work)
        procs[algo] = r
        print(f"[gpu] {algo}: exit {r.returncode} after {time.time() - t0:.0f} s", flush=True)
        if r.returncode:
            print(r.stderr[-2000:], file=sys.stderr)
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rlhf-lab")
    rows = [job_figures(client, exp.experiment_id, algo, n_params, peak) if exp else {"algo": algo, "status": "no run"}
            for algo in ALGOS]
    flags = f"--shape {a.shape} --device {a.device}" + (f" --trainer {a.trainer}" if a.trainer else "")
    text = (f"GPU check: `python -m benchmarks.ops.gpu {flags}` on {name}, "
            f"{n_params / 1e6:.2f}M parameters, {time.time() - t0:.0f} s in all\n\n{table(rows)}\n")
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    ok = all(r.get("status") == "FINISHED" and r.get("finite") for r in rows) and not any(
        p.returncode for p in procs.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
