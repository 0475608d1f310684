"""Scaling of our PPO step with the response length and the batch size: ``python -m benchmarks.ops.scaling [--quick]``.

Our ``PPOModule`` as in the breakdown benchmark (``benchmarks.ops.ppo_steps.run_ours``), with every response forced to
exactly ``generation.max_new_tokens`` tokens (EOS suppressed during sampling), for response lengths
16 … 128 at the default batch size and for batch sizes 8 … 64 at the default response length. Per token
means per generated token (batch × length); for generation also per decoding step (÷ length), which stays
flat if the KV-cached sampler's cost grows linearly with the length.
"""

from __future__ import annotations

import sys

from omegaconf import DictConfig

from benchmarks import common as C
from benchmarks.common import Section, WorldModel, table
from benchmarks.ops.ppo_steps import run_ours, with_overrides


def run(cfg: DictConfig, wm: WorldModel, work, lengths: list[int], batches: list[int], steps: int,
        warmup: int) -> Section:
    B0, T0 = int(cfg.algo.batch_size), int(cfg.generation.max_new_tokens)
    sec = Section("PPO scaling with response length and batch size (ours)", __doc__.split("\n\n", 1)[1].strip())

    len_rows, per_step = [], {}
    for T in lengths:
        r = run_ours(with_overrides(cfg, {"generation.max_new_tokens": int(T)}), wm, steps, warmup)
        tok = B0 * T
        per_step[T] = r["generation"] / T
        len_rows.append([T, 1000 * r["step"], 1e6 * r["step"] / tok, 1000 * r["generation"],
                         1e6 * r["generation"] / tok, 1000 * r["generation"] / T, 1000 * r["update"],
                         100 * r["generation"] / r["step"]])
    sec.tables.append(f"Response length (batch {B0}):\n\n" + table(
        ["tokens", "step ms", "step µs/token", "generation ms", "gen µs/token", "gen ms/decoding step", "update ms",
         "gen % of step"], len_rows))

    b_rows = []
    for B in batches:
        r = run_ours(with_overrides(cfg, {"algo.batch_size": int(B)}), wm, steps, warmup)
        tok = B * T0
        b_rows.append([B, 1000 * r["step"], 1e6 * r["step"] / tok, 1000 * r["generation"], 1e6 * r["generation"] / tok,
                       1000 * r["update"], 100 * r["generation"] / r["step"]])
    sec.tables.append(f"Batch size ({T0} response tokens):\n\n" + table(
        ["batch", "step ms", "step µs/token", "generation ms", "gen µs/token", "update ms", "gen % of step"], b_rows))

    lo, hi = min(lengths), max(lengths)
    growth = per_step[hi] / per_step[lo]
    verdict = ("at most linear: the per-step cost even falls with length, as the fixed costs of a generate call "
               "(prefill, set-up) are spread over more steps" if growth < 0.9 else
               "≈ linear growth of generation time with length" if growth <= 1.3 else
               "super-linear: each decoding step gets slower as the sequence grows")
    sec.findings.append(f"generation time per decoding step at {hi} tokens / at {lo} tokens = **{growth:.2f}** "
                        f"({verdict})")
    sec.findings.append(f"{steps} PPO steps per point of which {warmup} warm-up; medians over the timed steps")
    sec.summary = ["generation time per decoding step, longest/shortest response", f"{growth:.2f}",
                   "super-linear" if growth > 1.3 else "at most linear"]
    sec.data = {"gen_step_growth": growth}
    return sec


SIZES = {"full": {"scaling": dict(lengths=[16, 32, 64, 128], batches=[8, 16, 32, 64], steps=4, warmup=1)},
         "quick": {"scaling": dict(lengths=[16, 64], batches=[8, 32], steps=2, warmup=1)}}

if __name__ == "__main__":
    sys.exit(C.main("python -m benchmarks.ops.scaling", {"scaling": run}, SIZES))
