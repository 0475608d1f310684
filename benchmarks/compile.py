"""Does ``torch.compile`` pay on CPU for the PPO update? ``python -m benchmarks.compile [--rounds 4]``.

The PPO update's policy pass (``rlhf_lab.models.actor_critic.lm_forward``: backbone, LM head at the response
positions) with its backward pass and an AdamW step, on the default policy (``policy=a_small``, random weights,
the world's tokenizer), minibatches of 16 sequences whose prompt and response lengths vary from minibatch to
minibatch as trimmed PPO minibatches do. Eager against ``torch.compile(lm_forward, dynamic=True)`` (inductor,
one set of kernels for every length), in the same process, alternating which goes first, on the same shapes;
the compiler's warm-up (its first three shapes) is timed apart. Prints the ratio and the warm-up; writes nothing.

What it is for: the ratio per minibatch against the warm-up paid once per process (each job of a sweep is a new
process) tells whether compiling pays for a job of a given length. benchmarks/README.md has the measured figures.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.compile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4, help="timed rounds of 10 minibatches per side (default 4)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as trainer.threads)")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    from benchmarks import common as C
    from rlhf_lab.models.actor_critic import lm_forward

    C.quiet()
    C.set_threads(args.threads)
    wm = C.make_world_model(C.compose([]), Path(tempfile.mkdtemp(prefix="rlhf_bench_compile_")) / "world")
    model = AutoModelForCausalLM.from_pretrained(wm.lm_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    shapes = [(16, 8 + int(torch.randint(0, 6, (1,), generator=g)), 10 + int(torch.randint(0, 20, (1,), generator=g)))
              for _ in range(10 * args.rounds + 3)]

    def step(forward, batch: int, q: int, r: int) -> None:
        ids = torch.randint(0, vocab, (batch, q + r), generator=g)
        logits, _ = forward(model, ids, torch.ones_like(ids), q)
        logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, q:, None]).mean()
        (-logp).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    compiled = torch.compile(lm_forward, dynamic=True)
    t0 = time.perf_counter()
    for s in shapes[-3:]:
        step(compiled, *s)
    warmup = time.perf_counter() - t0
    for s in shapes[-3:]:
        step(lm_forward, *s)
    secs: dict[str, list[float]] = {"eager": [], "compiled": []}
    for i in range(args.rounds):
        order = (("eager", lm_forward), ("compiled", compiled))
        for name, forward in (order if i % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            for s in shapes[10 * i:10 * (i + 1)]:
                step(forward, *s)
            secs[name].append(time.perf_counter() - t0)
    ms = {k: 1000 * sum(v) / (10 * len(v)) for k, v in secs.items()}
    ratio = sum(secs["eager"]) / sum(secs["compiled"])
    print(f"[compile] {wm.n_params:,} parameters, {args.threads} thread(s); compiler warm-up (3 shapes): {warmup:.1f} s")
    print(f"[compile] per minibatch (forward, backward, AdamW): eager {ms['eager']:.1f} ms, compiled "
          f"{ms['compiled']:.1f} ms; eager ÷ compiled {ratio:.2f}× (rounds: "
          + ", ".join(f"{e / c:.2f}" for e, c in zip(secs["eager"], secs["compiled"])) + ")")
    saved = (ms["eager"] - ms["compiled"]) / 1000
    if saved > 0:
        print(f"[compile] the warm-up pays after about {warmup / saved:.0f} minibatches of this size; a default PPO step "
              f"has 16 (4 epochs × 4 minibatches) policy passes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
