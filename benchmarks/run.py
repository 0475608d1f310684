"""Run the benchmarks: ``python -m benchmarks.run [--quick] [--only dpo,rm,grpo,sampling,ppo,ppo_trl,memory,scaling] [--threads N]``.

Prints each benchmark's tables as it finishes and writes them, with the date, the machine and the exact
command, to ``benchmarks/results.md`` (written to a temporary file, then renamed). The file is merged section by
section: a run replaces the sections (and summary rows) of the benchmarks it ran and keeps the others, each
section naming the run that wrote it. Exit status 1 when a loss-agreement check fails (for ``sampling``: when our
sampler's tokens differ from ``generate``'s). See benchmarks/README.md
for what each benchmark measures and matches.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

BENCHMARKS = ("dpo", "rm", "grpo", "sampling", "ppo", "ppo_trl", "memory", "scaling")
# benchmarks whose agreement check sets the exit status
AGREEMENT_CHECKED = ("dpo", "rm", "grpo", "sampling", "ppo_trl")

# steps per run / warm-up steps (not timed) / rounds alternating the two sides
SIZES = {
    "full": {
        "dpo": dict(steps=80, warmup=5, rounds=4),
        "rm": dict(steps=80, warmup=5, rounds=4),
        "grpo": dict(steps=10, warmup=2, rounds=4),
        "sampling": dict(steps=16, warmup=2),
        "ppo": dict(steps=8, warmup=2, rounds=3),
        "ppo_trl": dict(steps=10, warmup=2, rounds=4),
        "memory": dict(preset="a_large", steps=2, overrides=["algo.batch_size=16", "generation.max_new_tokens=32"]),
        "scaling": dict(lengths=[16, 32, 64, 128], batches=[8, 16, 32, 64], steps=4, warmup=1),
    },
    "quick": {
        "dpo": dict(steps=12, warmup=3, rounds=1),
        "rm": dict(steps=12, warmup=3, rounds=1),
        "grpo": dict(steps=3, warmup=1, rounds=1),
        "sampling": dict(steps=4, warmup=1),
        "ppo": dict(steps=3, warmup=1, rounds=1),
        "ppo_trl": dict(steps=3, warmup=1, rounds=1),
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


TITLE = "# Benchmarks: rlhf-lab vs Hugging Face TRL"
INTRO = ("Absolute times drift with the machine's load; the ratios compare the two sides measured in the same "
         "invocation, alternating, on the same weights, data and shapes. Each section names the run that wrote it: "
         "`python -m benchmarks.run --only …` rewrites the sections (and summary rows) of the benchmarks it runs and "
         "keeps the others. See benchmarks/README.md.")
RUN_RE = re.compile(r"<!-- run: (.+?) -->\n(.*?)\n<!-- /run -->", re.S)
SECTION_RE = re.compile(r"<!-- section: (\w+); run: (.+?) -->\n(.*?)\n<!-- /section: \1 -->", re.S)
ROW_RE = re.compile(r"^\| `(\w+)` \|.*$", re.M)


def run_key(started: datetime.datetime) -> str:
    return started.strftime("%Y-%m-%d %H:%M:%S %Z").strip()


def run_block(args, argv: list[str], started: datetime.datetime, cores, seconds: float) -> str:
    """This run's entry of the runs list: date, command, machine, versions (the sections it wrote are added when
    the file is written); `cores`: a :class:`benchmarks.common.CoreUse` started with the run."""
    v = versions()
    cmd = "python -m benchmarks.run" + ("" if not argv else " " + shlex.join(argv))
    share = cores.others_share()
    lines = [
        f"- **{run_key(started)}** ({seconds:.0f} s): `{cmd}`" + (" (quick: smoke-check sizes, noisy)" if args.quick
                                                                  else ""),
        f"  - machine: {os.cpu_count()} CPU cores ({platform.machine()}, {platform.system()} {platform.release()}), "
        f"load average {cores.load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end"
        + ("" if share is None else f", other processes {100 * share:.1f}% of the cores' time")
        + f"; torch threads {args.threads} on both sides",
        "  - versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
    ]
    if cores.busy(share):
        lines.append("  - **warning**: other processes shared the cores during this run; expect noisy ratios, and do "
                     "not trust multi-threaded ones")
    return "\n".join(lines)


def summary_rows(sections: dict) -> dict[str, list[str]]:
    """{benchmark: its row of the summary table} for the benchmarks that ran."""
    rows = {}

    def agreement(d) -> str:
        return "loss agrees" if d["agree_ok"] else "LOSS DIFFERS"

    def against_target(d, meets) -> tuple[str, str]:
        """The value cell (the ratio, and the one with algo.compile=true where measured) and whether each meets
        the target (`meets`: ratio -> bool)."""
        value, met = f"{d['ratio']:.2f}×", "met" if meets(d["ratio"]) else "NOT met"
        if "ratio_compiled" in d:
            value += f"; algo.compile=true {d['ratio_compiled']:.2f}×"
            met += "; with algo.compile=true: " + ("met" if meets(d["ratio_compiled"]) else "NOT met")
        return value, met

    if "dpo" in sections:
        d = sections["dpo"].data
        rows["dpo"] = ["DPO throughput, ours/TRL (pairs/s)", f"{d['ratio']:.2f}×", agreement(d)]
    if "rm" in sections:
        d = sections["rm"].data
        rows["rm"] = ["RM throughput, ours/TRL (pairs/s)", f"{d['ratio']:.2f}×", agreement(d)]
    if "grpo" in sections:
        d = sections["grpo"].data
        value, met = against_target(d, lambda r: r >= d["target"])
        rows["grpo"] = ["GRPO throughput, ours/TRL (completions/s)", value, f"{agreement(d)}; target ≥ {d['target']}×: {met}"]
    if "sampling" in sections:
        d = sections["sampling"].data
        rows["sampling"] = ["sampler, ours/HF generate (tokens/s)", f"{d['ratio']:.2f}×",
                            "tokens identical" if d["agree_ok"] else "TOKENS DIFFER"]
    if "ppo" in sections:
        d = sections["ppo"].data
        value = f"{100 * d['overhead']:+.0f}%"
        check = "target ≤ +30%: " + ("met" if d["overhead"] <= 0.30 else "NOT met")
        if "options_ratio" in d:  # the step with the settings before v2 ÷ today's defaults
            value += f"; before v2 ÷ now {d['options_ratio']:.2f}×"
            check += "; target ≥ 1.3×: " + ("met" if d["options_ratio"] >= 1.3 else "NOT met")
        rows["ppo"] = ["PPO step, ours/bare − 1; settings before v2 ÷ today's", value, check]
    if "ppo_trl" in sections:
        d = sections["ppo_trl"].data
        value, met = against_target(d, lambda r: r <= d["target"])
        rows["ppo_trl"] = ["PPO step, ours/TRL 1.9.2 step time", value, f"{agreement(d)}; target ≤ {d['target']}×: {met}"]
    if "memory" in sections:
        d = sections["memory"].data
        rows["memory"] = ["PPO peak RSS, separate/shared_base", f"{d['ratio_rss']:.2f}×",
                          f"model_bytes {d['ratio_model_bytes']:.2f}×"]
    if "scaling" in sections:
        d = sections["scaling"].data
        rows["scaling"] = ["generation time per decoding step, longest/shortest response", f"{d['gen_step_growth']:.2f}",
                           "super-linear" if d["gen_step_growth"] > 1.3 else "at most linear"]
    return {name: [f"`{name}`", *row] for name, row in rows.items()}


def summary(rows: dict[str, list[str]]) -> str:
    from benchmarks.common import table

    return "## Summary\n\n" + table(["benchmark", "what", "value", "check"], list(rows.values())) + "\n"


def parse_results(text: str) -> tuple[dict[str, str], dict[str, str], dict[str, tuple[str, str]]]:
    """A results file's runs {key: block}, summary rows {benchmark: markdown line} and sections
    {benchmark: (run key, markdown)}; what is not inside the markers is not kept (the team-scale section is kept
    separately: the marked sections of ``benchmarks.team`` and ``benchmarks.suite``, :func:`benchmarks.common.marked_section`)."""
    runs = {m.group(1): m.group(2) for m in RUN_RE.finditer(text)}
    summary_text = text.split("## Summary", 1)[1].split("<!--", 1)[0] if "## Summary" in text else ""
    rows = {m.group(1): m.group(0) for m in ROW_RE.finditer(summary_text)}
    sections = {m.group(1): (m.group(2), m.group(3)) for m in SECTION_RE.finditer(text)}
    return runs, rows, sections


def results_text(old: str, key: str, block: str, sections: dict[str, str], rows: dict[str, list[str]]) -> str:
    """The results file: `old`'s runs, summary rows and sections merged with this run's (`key`, `block`, the
    `sections` markdown and summary `rows` of the benchmarks it ran), in ``BENCHMARKS`` order; runs no section
    refers to any more are dropped; the team-scale and suite-throughput sections stay at the end."""
    from benchmarks import suite, team

    old_runs, old_rows, old_sections = parse_results(old)
    merged = {name: old_sections[name] for name in old_sections if name not in sections}
    merged.update({name: (key, md) for name, md in sections.items()})
    runs = {**old_runs, key: block}
    row_lines = {name: line for name, line in old_rows.items() if name not in rows}
    row_lines.update({name: "| " + " | ".join(r) + " |" for name, r in rows.items()})
    order = [b for b in BENCHMARKS if b in merged]
    used = {}
    for name in order:
        used.setdefault(merged[name][0], []).append(name)
    out = [TITLE, "", INTRO, "", "## Runs", ""]
    for k in sorted(used):
        head, *rest = runs[k].split("\n")
        head = re.sub(r"; sections: [\w, ]+$", "", head) + "; sections: " + ", ".join(used[k])
        out += [f"<!-- run: {k} -->", "\n".join([head, *rest]), "<!-- /run -->"]
    out += ["", "## Summary", "", "| benchmark | what | value | check |", "|---|---|---|---|"]
    out += [row_lines[b] for b in BENCHMARKS if b in row_lines]
    for name in order:
        k, md = merged[name]
        out += ["", f"<!-- section: {name}; run: {k} -->", md.rstrip("\n"), f"<!-- /section: {name} -->"]
    from benchmarks.common import marked_section

    for kept in (marked_section(old, team.BEGIN, team.END), marked_section(old, suite.BEGIN, suite.END),
                 marked_section(old, suite.BEGIN_WITH, suite.END_WITH)):
        if kept:
            out += ["", kept]
    return "\n".join(out) + "\n"


def write_results(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and a rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".results.", suffix=".md")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    from benchmarks import common as C

    started, t0, cores = datetime.datetime.now().astimezone(), time.time(), C.CoreUse()

    C.quiet()
    C.set_threads(args.threads)
    sizes = SIZES["quick" if args.quick else "full"]
    work = Path(tempfile.mkdtemp(prefix="rlhf_bench_"))
    try:
        sections = run_all(args, sizes, work)
    except RuntimeError as err:
        from benchmarks.ppo_trl import TRLUnavailable

        if not isinstance(err, TRLUnavailable):
            raise
        print(f"[benchmarks] {err}", file=sys.stderr, flush=True)  # one line: pip could not install TRL 1.9.2
        return 2
    finally:
        shutil.rmtree(work, ignore_errors=True)
        from benchmarks import ppo

        ppo.mlflow_cleanup()

    key = run_key(started)
    block = run_block(args, argv, started, cores, time.time() - t0)
    for sec in sections.values():
        sec.run = key
    rows = summary_rows(sections)
    out = Path(args.out)
    old = out.read_text() if out.exists() else ""
    write_results(out, results_text(old, key, block, {b: s.markdown() for b, s in sections.items()}, rows))
    print("\n" + summary(rows), flush=True)
    print(f"[benchmarks] {time.time() - t0:.0f} s; wrote {out} (sections {', '.join(sections)}; others kept)",
          flush=True)
    ok = all(sections[b].data.get("agree_ok", True) for b in AGREEMENT_CHECKED if b in sections)
    return 0 if ok else 1


def run_all(args, sizes: dict, work: Path) -> dict:
    """Run the selected benchmarks in order; {name: Section}."""
    from benchmarks import common as C

    sections: dict = {}
    print(f"[benchmarks] {'quick' if args.quick else 'full'} run of {','.join(args.only)} "
          f"({args.threads} torch thread(s)); work folder {work}", flush=True)

    if "ppo_trl" in args.only:  # TRL 1.9.2 in its own folder: installed (once) before any benchmark runs
        from benchmarks import ppo_trl

        ppo_trl.ensure_trl()
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
    if "grpo" in args.only:
        from benchmarks import grpo

        done("grpo", grpo.run(C.compose(["algo=grpo"]), wm, tol=AGREEMENT_TOL, **sizes["grpo"]))
    if "sampling" in args.only:
        from benchmarks import sampling

        done("sampling", sampling.run(C.compose(["algo=grpo"]), wm, **sizes["sampling"]))
    if "ppo" in args.only:
        from benchmarks import ppo

        done("ppo", ppo.run(cfg, wm, **sizes["ppo"]))
    if "ppo_trl" in args.only:
        from benchmarks import ppo_trl

        pcfg = ppo_trl.config()  # the shape: hidden 128, 2 layers, 32 response tokens, fixed β
        done("ppo_trl", ppo_trl.run(pcfg, C.make_world_model(pcfg, work / "world_ppo_trl"), tol=AGREEMENT_TOL,
                                    work=work, **sizes["ppo_trl"]))
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
