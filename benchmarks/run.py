"""Run the benchmarks: ``python -m benchmarks.run [--quick] [--only dpo,rm,ppo,memory,scaling] [--threads N]``.

Prints each benchmark's tables as it finishes and writes them, with the date, the machine and the exact
command, to ``benchmarks/results.md`` (written to a temporary file, then renamed). Exit status 1 when a
loss-agreement check fails. See benchmarks/README.md for what each benchmark measures and matches.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

BENCHMARKS = ("dpo", "rm", "ppo", "memory", "scaling")

# steps per run / warm-up steps (not timed) / rounds alternating the two sides
SIZES = {
    "full": {
        "dpo": dict(steps=80, warmup=5, rounds=4),
        "rm": dict(steps=80, warmup=5, rounds=4),
        "ppo": dict(steps=8, warmup=2, rounds=3),
        "memory": dict(preset="a_large", steps=2, overrides=["algo.batch_size=16", "generation.max_new_tokens=32"]),
        "scaling": dict(lengths=[16, 32, 64, 128], batches=[8, 16, 32, 64], steps=4, warmup=1),
    },
    "quick": {
        "dpo": dict(steps=12, warmup=3, rounds=1),
        "rm": dict(steps=12, warmup=3, rounds=1),
        "ppo": dict(steps=3, warmup=1, rounds=1),
        "memory": dict(preset="a_medium", steps=2, overrides=["algo.batch_size=16", "generation.max_new_tokens=32"]),
        "scaling": dict(lengths=[16, 64], batches=[8, 32], steps=2, warmup=1),
    },
}
AGREEMENT_TOL = 1e-4


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes and few steps: a smoke check (< 2 min)")
    ap.add_argument("--only", default=",".join(BENCHMARKS), help=f"comma-separated subset of {','.join(BENCHMARKS)}")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both sides (default 1, the project's "
                    "trainer.threads)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results.md"), help="the results file")
    args = ap.parse_args(argv)
    args.only = [b.strip() for b in args.only.split(",") if b.strip()]
    bad = [b for b in args.only if b not in BENCHMARKS]
    if bad:
        ap.error(f"unknown benchmark(s) {bad}; choose from {','.join(BENCHMARKS)}")
    return args


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "trl", "accelerate", "lightning", "peft", "datasets"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def header(args, argv: list[str], started: datetime.datetime, load_start, load_end, seconds: float) -> str:
    v = versions()
    cmd = "python -m benchmarks.run" + ("" if not argv else " " + shlex.join(argv))
    lines = [
        "# Benchmarks: rlhf-lab vs Hugging Face TRL",
        "",
        f"- date: {started.strftime('%Y-%m-%d %H:%M:%S %Z').strip()} ({seconds:.0f} s)",
        f"- command: `{cmd}`" + (" (quick: smoke-check sizes, noisy)" if args.quick else ""),
        f"- machine: {os.cpu_count()} CPU cores ({platform.machine()}, {platform.system()} {platform.release()}), "
        f"load average {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end; torch threads {args.threads} "
        "on both sides",
        "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
    ]
    busy = load_start[0] + args.threads > (os.cpu_count() or 1) + 0.5
    if busy:
        lines.append(f"- **warning**: the cores were busy (load average {load_start[0]:.1f} on {os.cpu_count()} cores "
                     f"before this run's {args.threads} thread(s)); expect noisy ratios, and do not trust "
                     "multi-threaded ones")
    lines += [
        "",
        "Absolute times drift with the machine's load; the ratios compare the two sides measured in the same "
        "invocation, alternating, on the same weights, data and shapes. See benchmarks/README.md.",
        "",
    ]
    return "\n".join(lines)


def summary(sections: dict) -> str:
    from benchmarks.common import table

    rows = []
    if "dpo" in sections:
        d = sections["dpo"].data
        rows.append(["DPO throughput, ours/TRL (pairs/s)", f"{d['ratio']:.2f}×",
                     "loss agrees" if d["agree_ok"] else "LOSS DIFFERS"])
    if "rm" in sections:
        d = sections["rm"].data
        rows.append(["RM throughput, ours/TRL (pairs/s)", f"{d['ratio']:.2f}×",
                     "loss agrees" if d["agree_ok"] else "LOSS DIFFERS"])
    if "ppo" in sections:
        d = sections["ppo"].data
        rows.append(["PPO step, ours/bare − 1", f"{100 * d['overhead']:+.0f}%",
                     "target ≤ +30%: " + ("met" if d["overhead"] <= 0.30 else "NOT met")])
        if "options_ratio" in d:
            rows.append(["PPO step, before v2 ÷ now (world-length responses)", f"{d['options_ratio']:.2f}×",
                         "target ≥ 1.3×: " + ("met" if d["options_ratio"] >= 1.3 else "NOT met")])
    if "memory" in sections:
        d = sections["memory"].data
        rows.append(["PPO peak RSS, separate/shared_base", f"{d['ratio_rss']:.2f}×",
                     f"model_bytes {d['ratio_model_bytes']:.2f}×"])
    if "scaling" in sections:
        d = sections["scaling"].data
        rows.append(["generation time per decoding step, longest/shortest response", f"{d['gen_step_growth']:.2f}",
                     "super-linear" if d["gen_step_growth"] > 1.3 else "at most linear"])
    return "## Summary\n\n" + table(["benchmark", "value", "check"], rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    started, t0, load_start = datetime.datetime.now().astimezone(), time.time(), os.getloadavg()

    from benchmarks import common as C

    C.quiet()
    C.set_threads(args.threads)
    sizes = SIZES["quick" if args.quick else "full"]
    work = Path(tempfile.mkdtemp(prefix="rlhf_bench_"))
    try:
        sections = run_all(args, sizes, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        from benchmarks import ppo

        for d in ppo._MLFLOW_DIR:
            shutil.rmtree(d, ignore_errors=True)

    out = Path(args.out)
    from benchmarks.previous import merge
    from benchmarks.team import kept_section

    # a --only run keeps the other benchmarks' sections of the file (benchmarks/previous.py)
    text = merge(header(args, argv, started, load_start, os.getloadavg(), time.time() - t0), summary(sections),
                 {b: sections[b].markdown() for b in BENCHMARKS if b in sections},
                 out.read_text() if out.exists() else "", BENCHMARKS)

    kept = kept_section(out.read_text()) if out.exists() else ""  # python -m benchmarks.team's section stays
    text += ("\n" + kept + "\n") if kept else ""
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".results.", suffix=".md")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, out)
    print("\n" + summary(sections), flush=True)
    print(f"[benchmarks] {time.time() - t0:.0f} s; wrote {out}", flush=True)
    ok = all(sections[b].data.get("agree_ok", True) for b in ("dpo", "rm") if b in sections)
    return 0 if ok else 1


def run_all(args, sizes: dict, work: Path) -> dict:
    """Run the selected benchmarks in order; {name: Section}."""
    from benchmarks import common as C

    sections: dict = {}
    print(f"[benchmarks] {'quick' if args.quick else 'full'} run of {','.join(args.only)} "
          f"({args.threads} torch thread(s)); work folder {work}", flush=True)

    cfg = C.compose([])  # policy=a_small, algo=ppo: the project's defaults
    wm = C.make_world_model(cfg, work / "world")

    def done(name: str, sec) -> None:
        sections[name] = sec
        print("\n" + sec.markdown(), flush=True)

    if "dpo" in args.only:
        from benchmarks import dpo

        dcfg = C.compose(["algo=dpo"])
        pairs = C.make_pairs(dcfg, sizes["dpo"]["steps"] * int(dcfg.algo.batch_size))
        done("dpo", dpo.run(dcfg, wm, pairs, tol=AGREEMENT_TOL, **sizes["dpo"]))
    if "rm" in args.only:
        from benchmarks import rm

        rcfg = C.compose(["algo=rm"])
        pairs = C.make_pairs(rcfg, sizes["rm"]["steps"] * int(rcfg.reward_model.batch_size))
        done("rm", rm.run(rcfg, wm, pairs, tol=AGREEMENT_TOL, **sizes["rm"]))
    if "ppo" in args.only:
        from benchmarks import ppo

        done("ppo", ppo.run(cfg, wm, **sizes["ppo"]))
    if "memory" in args.only:
        from benchmarks import memory

        s = sizes["memory"]
        done("memory", memory.run(s["overrides"], s["preset"], s["steps"], args.threads, work))
    if "scaling" in args.only:
        from benchmarks import scaling

        done("scaling", scaling.run(cfg, wm, **sizes["scaling"]))
    return sections


if __name__ == "__main__":
    sys.exit(main())
