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

``python -m benchmarks.ops.memory --options [--shape 0.5b|tiny]`` (:func:`options_main`): PPO with full fine-tuning
at ``ops.gpu``'s Qwen2 shape, each memory option of issue 70 (the shared critic, a bf16 reference, a bf16 RM,
activation checkpointing, Adafactor) alone and together, one fresh worker process a row: peak RSS and step time.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks import common as C
from benchmarks.common import Section, table
from rlhf_lab.runs.process import release_memory

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


def watch_rss(limit_mb: float) -> None:
    """A daemon thread that ends this process with :data:`OVER_LIMIT` as soon as its RSS passes `limit_mb`: a mode
    that does not fit is reported as such in seconds, not after minutes of page reclaim or the out-of-memory killer."""
    import threading

    def watch():
        while True:
            with contextlib.suppress(OSError), open("/proc/self/status") as f:
                rss = next((int(ln.split()[1]) / 1024.0 for ln in f if ln.startswith("VmRSS:")), 0.0)
                if rss > limit_mb:
                    print(json.dumps({"over_limit_mb": limit_mb, "peak_mb": _rss_mb()}), flush=True)
                    os._exit(OVER_LIMIT)
            time.sleep(0.2)

    threading.Thread(target=watch, daemon=True).start()


OVER_LIMIT = 3  # a worker's exit status when watch_rss stopped it


def bf16_scorer_when_asked(cfg) -> None:
    """``reward_model.dtype`` for the benchmark's RM (``common.make_scorer`` loads it in fp32): the RM folder read in
    that dtype, as ``stages.rm.load_scorer`` reads a trained RM with the key set."""
    if cfg.reward_model.get("dtype") is None:
        return
    from rlhf_lab.models import families as Fm
    from rlhf_lab.models.reward import RewardScorer

    def make_scorer(cfg, wm, tok):
        rm = Fm.load_sequence_scorer(wm.rm_dir, tok, **Fm.load_options(cfg.reward_model)).eval()
        return RewardScorer([rm], tok, normalize=True, max_len=int(cfg.reward_model.max_len))

    C.make_scorer = make_scorer


def full_length_steps(cfg, wm, steps: int, warmup: int) -> dict:
    """`steps` PPO steps of the module ``common.ppo_module`` builds, every response run to ``max_new_tokens`` (EOS
    suppressed); the median step time after `warmup` steps (no per-phase split: ``ppo_steps.run_ours`` has it)."""
    from rlhf_lab.stages.ppo import model_bytes

    tok = C.load_tokenizer(wm.lm_dir)
    module, clock = C.ppo_module(cfg, wm, tok), C.StepClock(warmup)
    with C.patched_sample(lambda model, tk, prompts: C.suppress_tokens(model, tk.eos_token_id)), C.mlflow_run():
        C.fit(module, None, steps, clock)
    return {"step": C.median(clock.step_times()),
            "model_bytes": float(model_bytes(module.policy, module.reference, module.critic, *module.scorer.members)),
            "trainable_params": float(sum(p.numel() for p in module.parameters() if p.requires_grad))}


def worker(args: dict) -> dict:
    """In a fresh process: baseline RSS after imports and a kernel warm-up, then peak RSS over a few PPO steps."""
    C.quiet()
    torch.set_num_threads(int(args["threads"]))
    if args.get("limit_mb"):
        watch_rss(float(args["limit_mb"]))
    import lightning  # noqa: F401
    import mlflow  # noqa: F401
    import peft  # noqa: F401
    import transformers  # noqa: F401

    from benchmarks.ops.ppo_steps import run_ours
    from rlhf_lab.algorithms import ppo as _ppo  # noqa: F401
    from rlhf_lab.models import families as Fm
    from rlhf_lab.models import reward as _reward  # noqa: F401

    cfg = C.compose(args["overrides"])
    bf16_scorer_when_asked(cfg)
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
    # return freed heap to the OS (release_memory: collection, malloc_trim) and reset the peak RSS to the current RSS
    # (Linux /proc/self/clear_refs ← 5): the later peak is measured from the live memory now, not from a transient
    # peak during the imports; `reset` False if the kernel does not allow it (the peak then includes that)
    release_memory()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = True
    except OSError:
        reset = False
    base = _rss_mb()
    t0 = time.time()
    out = (full_length_steps if args.get("full_length_steps") else run_ours)(cfg, wm, int(args["steps"]), 1)
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


# --options: PPO with full fine-tuning, each memory option alone on top of today's setting (four full models: policy,
# critic with a trunk of its own, a reference copy, the RM; AdamW), then together: {row: (overrides, what it changes)}
FULL_FT = ["algo.lora.r=0", "algo.reference.kind=copy", "algo.critic=policy"]
OPTIONS = {
    "full fine-tuning (today)": ([], "nothing: 4 models, AdamW (2 fp32 states per trained parameter)"),
    "algo.critic=shared": (["algo.critic=shared"], "the value head reads the policy's trunk: one trunk trained by "
                           "L_clip + vf_coef·L_V (the value loss moves the policy), no critic trunk or its AdamW state"),
    "algo.reference.dtype=bfloat16": (["algo.reference.dtype=bfloat16"], "log π_ref from bf16 weights (logits cast to "
                                      "fp32; the KL in fp32): rounding of ~1e-3 nats a token at the tiny shape"),
    "reward_model.dtype=bfloat16": (["reward_model.dtype=bfloat16"], "the RM scores in bf16 (its normalisation in "
                                    "fp32); with a trained RM via reward_model.path, else the key retrains the RM"),
    "algo.activation_checkpointing=true": (["algo.activation_checkpointing=true"], "nothing (the same gradients to "
                                           "float noise); one more forward of the trained trunks per update pass"),
    "algo.optimizer=adafactor": (["algo.optimizer=adafactor"], "another optimiser: factored second moment, no first "
                                 "moment, steps relative to the weights' RMS (lr means ρ)"),
    "all but the optimizer": (["algo.critic=shared", "algo.reference.dtype=bfloat16", "reward_model.dtype=bfloat16",
                               "algo.activation_checkpointing=true"], "the shared critic's and bf16's changes; AdamW"),
    "all": (["algo.critic=shared", "algo.reference.dtype=bfloat16", "reward_model.dtype=bfloat16",
             "algo.activation_checkpointing=true", "algo.optimizer=adafactor"], "all of the above"),
}
# the jobs' sizes at each shape (ops.gpu's 0.5b CPU run: batch 4, 16 response tokens, one AdamW step per rollout)
OPTION_SIZES = {"0.5b": {"steps": 3, "threads": 2}, "tiny": {"steps": 2, "threads": 1}}
OPTION_OVERRIDES = ["algo.batch_size=4", "generation.max_new_tokens=16", "generation.max_prompt_len=64",
                    "algo.ppo_epochs=1", "algo.num_minibatches=1", "algo.lr=1e-6", "algo.critic_lr=1e-6"]


def options_main(argv: list[str]) -> int:
    """``python -m benchmarks.ops.memory --options [--shape 0.5b|tiny] [--limit-gb G] [--save]``: PPO with full
    fine-tuning at ops.gpu's shape, each row of :data:`OPTIONS` in a fresh worker process (peak RSS over the PPO steps,
    the median step time after a warm-up step); a worker whose RSS passes --limit-gb is stopped and its row says so.
    ``--save``: the section ``memory_options`` of results.md."""
    import argparse
    import datetime
    import tempfile

    from benchmarks.ops.gpu import SHAPES

    ap = argparse.ArgumentParser(prog="python -m benchmarks.ops.memory --options", description=options_main.__doc__)
    ap.add_argument("--shape", choices=sorted(OPTION_SIZES), default="0.5b")
    ap.add_argument("--limit-gb", type=float, default=20.0, help="stop a worker past this RSS (GiB; default 20)")
    ap.add_argument("--only", default=None, help="a comma-separated subset of the rows' numbers (1-based)")
    ap.add_argument("--save", action="store_true", help="write the section memory_options into benchmarks/results/")
    a = ap.parse_args(argv)
    rows_asked = list(OPTIONS)
    if a.only:
        rows_asked = [rows_asked[int(i) - 1] for i in a.only.split(",")]
    C.quiet()
    size, started, cores, t0 = OPTION_SIZES[a.shape], datetime.datetime.now().astimezone(), C.CoreUse(), time.time()
    work = Path(tempfile.mkdtemp(prefix="rlhf_bench_memopt_"))
    wm = C.make_world_model(C.compose(["policy=a_small"]), work / "world", qwen2=SHAPES[a.shape])
    print(f"[memory --options] {a.shape}: {wm.n_params / 1e6:.2f}M parameters; work folder {work}", flush=True)
    env = {**os.environ, "PYTHONPATH": str(C.ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    sec = Section(f"PPO with full fine-tuning at the {a.shape} shape: memory options",
                  "Each row a fresh process (`--worker`: imports and a kernel warm-up, then the baseline), "
                  f"{size['steps']} PPO steps (1 warm-up) of {' '.join(OPTION_OVERRIDES)} with {' '.join(FULL_FT)}, "
                  f"every response run to max_new_tokens (EOS suppressed), {size['threads']} torch threads, the Qwen2 model of "
                  f"ops.gpu's `{a.shape}` shape ({wm.n_params:,} parameters); the peak RSS is VmHWM, as in `memory`; "
                  f"a process whose RSS passed {a.limit_gb:g} GiB was stopped there.")
    rows = []
    for name in rows_asked:
        over, what = OPTIONS[name]
        args = {"overrides": ["policy=a_small", *OPTION_OVERRIDES, *FULL_FT, *over], "lm_dir": str(wm.lm_dir),
                "rm_dir": str(wm.rm_dir), "steps": size["steps"], "threads": size["threads"],
                "limit_mb": a.limit_gb * 1024, "full_length_steps": True}
        p = subprocess.run([sys.executable, "-m", "benchmarks.ops.memory", "--worker", json.dumps(args)], cwd=C.ROOT,
                           env=env, capture_output=True, text=True)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        r = json.loads(lines[-1]) if lines else {}
        if p.returncode == OVER_LIMIT:
            rows.append([name, f"> {a.limit_gb:g} GiB (stopped)", math.nan, math.nan, math.nan, what])
        elif p.returncode or not lines:
            print(p.stderr[-3000:], file=sys.stderr)
            rows.append([name, f"failed (exit {p.returncode})", math.nan, math.nan, math.nan, what])
        else:
            rows.append([name, r["peak_mb"] / 1024, (r["peak_mb"] - r["baseline_mb"]) / 1024, r["step_s"],
                         int(r["trainable_params"]), what])
        print(f"[memory --options] {name}: {rows[-1][1:5]}", flush=True)
    sec.tables.append(table(["option", "peak RSS (GiB)", "peak − baseline (GiB)", "s/PPO step", "trainable params",
                             "what it changes in the algorithm"], rows))
    fits = [r[0] for r in rows if isinstance(r[1], float)]
    sec.summary = [f"PPO full fine-tuning at {a.shape}: rows under {a.limit_gb:g} GiB", f"{len(fits)}/{len(rows)}",
                   ""]
    cmd = f"python -m benchmarks.ops.memory --options --shape {a.shape}" + (f" --only {a.only}" if a.only else "")
    md = sec.markdown(C.run_lines(started, time.time() - t0, cmd + (" --save" if a.save else ""), cores))
    print("\n" + md, flush=True)
    if a.save:
        C.save("memory_options" if a.shape == "0.5b" else f"memory_options_{a.shape}", md, sec.summary)
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return 0 if all(not str(r[1]).startswith("failed") for r in rows) else 1


OVERRIDES = ["algo.batch_size=16", "generation.max_new_tokens=32"]
SIZES = {"full": {"memory": dict(preset="a_large", steps=2, overrides=OVERRIDES)},
         "quick": {"memory": dict(preset="a_medium", steps=2, overrides=OVERRIDES)}}

if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:  # internal: one mode in a fresh process
        print(json.dumps(worker(json.loads(sys.argv[2]))), flush=True)
    elif sys.argv[1:2] == ["--options"]:  # PPO full fine-tuning's memory options (issue 70)
        sys.exit(options_main(sys.argv[2:]))
    else:
        sys.exit(C.main("python -m benchmarks.ops.memory", {"memory": run}, SIZES))
