"""Speed against Hugging Face TRL, side by side: ``python -m benchmarks.vs_trl [--quick] [--only dpo,rm,grpo,sampling,ppo]
[--threads N]``.

Prints each benchmark's section as it finishes and writes it, with the date, the machine and the exact command, to
``benchmarks/results/NAME.json``, then regenerates ``benchmarks/results.md`` (the other benchmarks' sections are
kept as they are). Exit status 1 when an agreement check fails (``sampling``: when our sampler's tokens differ from
``generate``'s), 2 (one line) when ``ppo`` cannot install TRL 1.9.2. See benchmarks/README.md.
"""

from __future__ import annotations

import sys

from benchmarks.common import main
from benchmarks.vs_trl import grpo, ppo, sampling, train

RUNNERS = {
    "dpo": lambda cfg, wm, work, **size: train.run("dpo", wm, **size),
    "rm": lambda cfg, wm, work, **size: train.run("rm", wm, **size),
    "grpo": grpo.run,
    "sampling": sampling.run,
    "ppo": ppo.run,
}
# steps per run / warm-up steps (not timed) / rounds alternating the sides
SIZES = {
    "full": {"dpo": dict(steps=80, warmup=5, rounds=4), "rm": dict(steps=80, warmup=5, rounds=4),
             "grpo": dict(steps=10, warmup=2, rounds=4), "sampling": dict(steps=16, warmup=2),
             "ppo": dict(steps=10, warmup=2, rounds=4)},
    "quick": {"dpo": dict(steps=12, warmup=3, rounds=1), "rm": dict(steps=12, warmup=3, rounds=1),
              "grpo": dict(steps=3, warmup=1, rounds=1), "sampling": dict(steps=4, warmup=1),
              "ppo": dict(steps=3, warmup=1, rounds=1)},
}


if __name__ == "__main__":
    try:
        sys.exit(main("python -m benchmarks.vs_trl", RUNNERS, SIZES,  # TRL 1.9.2 installed (once) before any run
                      setup=lambda only: ppo.ensure_trl() if "ppo" in only else None))
    except ppo.TRLUnavailable as err:
        print(f"[benchmarks] {err}", file=sys.stderr, flush=True)  # one line: pip could not install TRL 1.9.2
        sys.exit(2)
