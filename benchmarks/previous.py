"""What a ``--only`` run keeps of the results file it rewrites: the sections (and summary rows) of the benchmarks it
did not run, each marked with the run it comes from, so that ``python -m benchmarks.run --only rm`` refreshes the
RM section without wiping the others.

Sections are found by their titles' beginnings (:data:`TITLES`) and summary rows by their labels' (:data:`ROWS`);
keep both in step with the titles the benchmark modules give their sections and ``run.summary``'s labels.
"""

from __future__ import annotations

import re

TITLES = {"dpo": "## DPO training throughput", "rm": "## RM training throughput", "ppo": "## PPO step-time breakdown",
          "memory": "## PPO peak memory", "scaling": "## PPO scaling"}
ROWS = {"dpo": "| DPO throughput", "rm": "| RM throughput", "ppo": "| PPO step", "memory": "| PPO peak RSS",
        "scaling": "| generation time per decoding step"}
KEPT_MARK = "_(kept from an earlier run:"


def kept(old: str, ran: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(names, summary rows, sections) of the old results file's benchmarks that are not in `ran`, in the file's
    order. A kept section gets a line naming the run it comes from (the old file's date and command), unless it
    already has one."""
    date = re.search(r"^- date: (.*?)(?: \(\d+ s\))?$", old, re.M)
    cmd = re.search(r"^- command: `(.*?)`", old, re.M)
    origin = f"{KEPT_MARK} {date.group(1) if date else 'date unknown'}, `{cmd.group(1) if cmd else '?'}`)_"
    body = old.split("<!-- team-scale", 1)[0]  # python -m benchmarks.team's section is kept by run.py itself
    chunks = re.split(r"(?m)^(?=## )", body)
    names, rows, sections = [], [], []
    for name, title in TITLES.items():
        if name in ran:
            continue
        sec = next((c for c in chunks if c.startswith(title)), None)
        if sec is None:
            continue
        head, _, rest = sec.partition("\n")
        if KEPT_MARK not in rest:
            sec = f"{head}\n\n{origin}\n{rest}"
        names.append(name)
        sections.append(sec.rstrip("\n") + "\n")
        summary = next((c for c in chunks if c.startswith("## Summary")), "")
        rows += [line for line in summary.splitlines() if line.startswith(ROWS[name])]
    return names, rows, sections


def merge(head: str, summary_md: str, ran: dict[str, str], old: str, order) -> str:
    """The results file's text: `head`, the summary (this run's rows and the kept ones, in `order`) and the
    sections (this run's, `ran`: name → markdown, and the kept ones, in `order`); the team section is left to
    the caller. Without an old file, or when every benchmark ran, just this run's."""
    names, rows, secs = kept(old, list(ran))
    if names:
        head = head.replace("\n\nAbsolute", f"\n- sections kept from an earlier run (not run by this command): "
                            f"{', '.join(names)}; each names its run\n\nAbsolute", 1)
        lines = summary_md.rstrip("\n").split("\n") + rows
        table, data = lines[:4], lines[4:]  # "## Summary", "", the table's header and rule

        def rank(line: str) -> int:
            return next((i for i, b in enumerate(order) if line.startswith(ROWS[b])), len(order))

        summary_md = "\n".join(table + sorted(data, key=rank)) + "\n"
    by_name = {**dict(zip(names, secs)), **ran}
    return head + "\n" + summary_md + "\n" + "\n".join(by_name[b] for b in order if b in by_name)
