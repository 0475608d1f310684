"""Peak memory of PPO, ``python -m benchmarks.ops.memory [--quick]``: four separate models (policy, frozen reference copy, critic with its own backbone, RM)
against ``algo.reference.kind=lora_disabled algo.lora.r=16`` (LoRA adapters on one base: the reference is the base with the adapters
disabled, the critic a value head on the policy's hidden states; the RM stays a separate model).

Each mode runs in a fresh subprocess (``python -m benchmarks.ops.memory --worker ...``) that imports everything,
sets up its MLflow store, pages in the kernels' code on a toy model, returns freed heap to the OS and resets
the peak RSS to the current RSS (``malloc_trim``, ``/proc/self/clear_refs``), and records the peak RSS as
its baseline; then it builds the models and runs a few PPO steps (``benchmarks.ops.ppo_steps.run_ours``, as in
the breakdown). The peak RSS is ``VmHWM``: what ``getrusage(RUSAGE_SELF).ru_maxrss`` reports for a process
that inherited no high-water mark from its parent. Reported: peak RSS − baseline, and
``rlhf_lab.stages.ppo.model_bytes`` (the distinct parameter and buffer storages of the four roles). A
larger preset than the other benchmarks' makes the weights, rather than the allocator's noise, visible.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks import common as C
from benchmarks.common import Section, table

MODES = {"separate": ["algo.reference.kind=copy", "algo.critic=policy"],
         "shared_base": ["algo.reference.kind=lora_disabled", "algo.lora.r=16", "algo.critic=policy"]}


def _rss_mb() -> float:
    """Peak RSS of this process so far, MiB: the memory map's high-water mark ``VmHWM``.

    ``getrusage(RUSAGE_SELF).ru_maxrss`` reports the same mark, but also keeps the high-water mark of the
    parent's memory that a subprocess inherits across fork + exec (the parent here is the benchmark runner,
    hundreds of MiB after the other benchmarks), so it is only the fallback where /proc is missing.
    """
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def worker(args: dict) -> dict:
    """In a fresh process: baseline RSS after imports and a kernel warm-up, then peak RSS over a few PPO steps."""
    C.quiet()
    torch.set_num_threads(int(args["threads"]))
    import lightning  # noqa: F401
    import mlflow  # noqa: F401
    import peft  # noqa: F401
    import transformers  # noqa: F401

    from benchmarks.ops.ppo_steps import run_ours
    from rlhf_lab.algorithms import ppo as _ppo  # noqa: F401
    from rlhf_lab.models import families as Fm
    from rlhf_lab.models import reward as _reward  # noqa: F401

    cfg = C.compose(args["overrides"])
    C.mlflow_store()
    wm = C.WorldModel(Path(args["lm_dir"]), Path(args["rm_dir"]), 0, {})
    # page in the code of the kernels PPO uses (forward, backward, AdamW, generate) on a toy model: the baseline
    # holds the libraries' code, the difference the models, optimizer states and activations
    tok = Fm.load_tokenizer(wm.lm_dir)
    toy = Fm.build_model("a", {"hidden": 32, "layers": 1, "heads": 4}, tok)
    ids = torch.randint(4, len(tok), (2, 8))
    opt = torch.optim.AdamW(toy.parameters())
    toy(input_ids=ids).logits.log_softmax(-1).mean().backward()
    opt.step()
    with torch.no_grad():
        toy.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=4,
                     pad_token_id=tok.pad_token_id)
    del toy, opt, tok, ids
    gc.collect()
    # return freed heap to the OS (malloc_trim) and reset the peak RSS to the current RSS (Linux
    # /proc/self/clear_refs ← 5): the later peak is measured from the live memory now, not from a transient peak
    # during the imports; `reset` False if the kernel does not allow it (the peak then includes that)
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = True
    except OSError:
        reset = False
    base = _rss_mb()
    t0 = time.time()
    out = run_ours(cfg, wm, int(args["steps"]), 1)
    return {"baseline_mb": base, "peak_mb": _rss_mb(), "peak_reset": reset, "model_bytes": out["model_bytes"],
            "trainable_params": out["trainable_params"], "step_s": out["step"], "seconds": time.time() - t0}


def run(cfg, wm, work: Path, overrides: list[str], preset: str, steps: int) -> Section:
    threads = torch.get_num_threads()
    overrides = overrides + [f"policy={preset}"]
    cfg = C.compose(overrides)
    wm = C.make_world_model(cfg, work / f"memory_{preset}")
    env, res = {**os.environ, "PYTHONPATH": str(C.ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}, {}
    for mode in MODES:  # each in a fresh `--worker` process
        args = {"overrides": overrides + MODES[mode], "lm_dir": str(wm.lm_dir), "rm_dir": str(wm.rm_dir),
                "steps": steps, "threads": threads}
        p = subprocess.run([sys.executable, "-m", "benchmarks.ops.memory", "--worker", json.dumps(args)], cwd=C.ROOT,
                           env=env, capture_output=True, text=True)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            raise RuntimeError(f"memory worker ({mode}) failed:\n{p.stderr[-3000:]}")
        res[mode] = json.loads(lines[-1])
    rows = [[mode, r["peak_mb"] - r["baseline_mb"], r["model_bytes"] / 2**20, int(r["trainable_params"]),
             r["baseline_mb"], 1000 * r["step_s"]] for mode, r in res.items()]
    s, b = res["separate"], res["shared_base"]
    d_sep, d_sh = s["peak_mb"] - s["baseline_mb"], b["peak_mb"] - b["baseline_mb"]
    ratio_rss = d_sep / d_sh if d_sh > 0 else float("nan")
    ratio_bytes = s["model_bytes"] / b["model_bytes"]
    rows.append(["ratio separate/shared_base", ratio_rss, ratio_bytes, s["trainable_params"] / b["trainable_params"],
                 float("nan"), s["step_s"] / b["step_s"]])
    sec = Section("PPO peak memory: separate models vs shared base (LoRA)", __doc__.split("\n\n", 1)[1].strip())
    sec.tables.append(table(["mode", "peak RSS − baseline (MiB)", "model_bytes (MiB)", "trainable params",
                             "baseline RSS (MiB)", "ms/PPO step"], rows))
    a = cfg.algo
    if not all(r["peak_reset"] for r in res.values()):
        sec.findings.append("the kernel did not allow resetting the peak RSS: the baseline is the peak after the "
                            "imports")
    sec.findings.append(f"settings: policy={preset} {wm.arch} ({wm.n_params} parameters), batch {int(a.batch_size)}, "
                        f"{int(cfg.generation.max_new_tokens)} response tokens, LoRA r={int(a.lora.r)} "
                        f"({a.lora.target_modules}), {steps} PPO steps per process (1 warm-up), "
                        f"torch threads {threads}")
    sec.summary = ["PPO peak RSS, separate/shared_base", f"{ratio_rss:.2f}×", f"model_bytes {ratio_bytes:.2f}×"]
    sec.data = {"ratio_rss": ratio_rss, "ratio_model_bytes": ratio_bytes, "res": res}
    return sec


OVERRIDES = ["algo.batch_size=16", "generation.max_new_tokens=32"]
SIZES = {"full": {"memory": dict(preset="a_large", steps=2, overrides=OVERRIDES)},
         "quick": {"memory": dict(preset="a_medium", steps=2, overrides=OVERRIDES)}}

if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:  # internal: one mode in a fresh process
        print(json.dumps(worker(json.loads(sys.argv[2]))), flush=True)
    else:
        sys.exit(C.main("python -m benchmarks.ops.memory", {"memory": run}, SIZES))
