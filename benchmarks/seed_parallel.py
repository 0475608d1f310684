"""Does seed-parallel training pay on CPU? ``python -m benchmarks.seed_parallel [--seeds 4] [--rounds 4]``.

The lever performance v3 names for the claims suite's jobs per hour: the seeds of one arm trained together in one
process as a batch of independent models. Measured here on the part of a job that dominates it, the PPO update's
policy pass (forward, backward, AdamW), for K policies of the default preset (``policy=a_small``, random weights,
one per seed, the world's tokenizer) on minibatches of 16 sequences:

- one after the other (today: one job per seed): each model's forward and backward, one AdamW (foreach) per model;
- as one batch of models: the parameters stacked (``torch.func.stack_module_state``), the forward through
  ``torch.func.functional_call`` under ``vmap`` and its gradient with ``torch.func.grad``, one AdamW (foreach) over
  the stacked parameters.

Both sides compute the same loss (minus the mean log-probability of the response tokens) on the same tokens;
the check is that each model's gradient in the batch equals its gradient alone (largest absolute difference).
Sequences are full length and carry no attention mask: under ``vmap``, transformers' mask construction for padded
or packed batches is data-dependent control flow, which ``vmap`` refuses, so a batch of models would need masks of
its own; and ``scaled_dot_product_attention`` on the CPU has no batching rule (``vmap`` loops over it), hence
``--attn eager`` to time attention as plain batched matmuls. Prints the ratio; writes nothing (the measured
figures are in benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.seed_parallel", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=4, help="models trained together, K (default 4)")
    ap.add_argument("--rounds", type=int, default=4, help="timed rounds of 10 minibatches per side (default 4)")
    ap.add_argument("--batch", type=int, default=16, help="sequences per minibatch (default 16, a PPO minibatch)")
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens per sequence (default 16)")
    ap.add_argument("--response", type=int, default=48, help="response tokens per sequence (default 48)")
    ap.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa", help="attention implementation (sdpa)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as trainer.threads)")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.seeds < 1:
        ap.error("--rounds and --seeds must be at least 1")

    import torch
    from torch.func import functional_call, grad, stack_module_state, vmap
    from transformers import AutoModelForCausalLM

    from benchmarks import common as C

    C.quiet()
    C.set_threads(args.threads)
    wm = C.make_world_model(C.compose([]), Path(tempfile.mkdtemp(prefix="rlhf_bench_seeds_")) / "world")
    K, B, q, r = args.seeds, args.batch, args.prompt, args.response
    models = []
    for k in range(K):  # one policy per seed: the saved architecture, weights drawn with seed k
        m = AutoModelForCausalLM.from_pretrained(wm.lm_dir, attn_implementation=args.attn)
        torch.manual_seed(k)
        m.apply(m._init_weights)
        models.append(m.eval())  # PPO runs without dropout
    vocab = models[0].config.vocab_size
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=True) for m in models]
    params, buffers = stack_module_state(models)  # [K, ...] copies of every parameter and buffer
    stacked_opt = torch.optim.AdamW(list(params.values()), lr=1e-4, foreach=True)
    skeleton = copy.deepcopy(models[0])  # the architecture functional_call runs (a copy keeps tied weights tied)
    g = torch.Generator().manual_seed(0)

    def loss_of(logits, ids):
        logp = torch.log_softmax(logits[:, q - 1:-1].float(), -1).gather(-1, ids[:, q:, None])
        return -logp.mean()

    def one_loss(p, b, ids):
        return loss_of(functional_call(skeleton, (p, b), (ids,), {"use_cache": False}).logits, ids)

    batched_grad = vmap(grad(one_loss))

    def batch() -> torch.Tensor:
        return torch.randint(0, vocab, (K, B, q + r), generator=g)

    def one_after_the_other(ids) -> None:
        for k, (m, opt) in enumerate(zip(models, opts)):
            loss_of(m(ids[k], use_cache=False).logits, ids[k]).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    def together(ids) -> None:
        grads = batched_grad(params, buffers, ids)
        for name, p in params.items():
            p.grad = grads[name]
        stacked_opt.step()
        stacked_opt.zero_grad(set_to_none=True)

    # the check: each model's gradient in the batch equals its gradient alone (before any update)
    ids = batch()
    grads = batched_grad(params, buffers, ids)
    for k, m in enumerate(models):
        loss_of(m(ids[k], use_cache=False).logits, ids[k]).backward()
    diff = max(float((grads[n][k] - p.grad).abs().max()) for k, m in enumerate(models)
               for n, p in m.named_parameters())
    scale = max(float(p.grad.abs().max()) for m in models for p in m.parameters())
    for m in models:
        m.zero_grad(set_to_none=True)

    for _ in range(3):  # warm-up
        one_after_the_other(batch())
        together(batch())
    secs: dict[str, list[float]] = {"one after the other": [], "together": []}
    sides = (("one after the other", one_after_the_other), ("together", together))
    for i in range(args.rounds):
        for name, fn in (sides if i % 2 == 0 else sides[::-1]):
            data = [batch() for _ in range(10)]
            t0 = time.perf_counter()
            for ids in data:
                fn(ids)
            secs[name].append(time.perf_counter() - t0)
    ms = {k: 1000 * sum(v) / (10 * len(v)) for k, v in secs.items()}
    ratio = sum(secs["one after the other"]) / sum(secs["together"])
    print(f"[seed_parallel] {K} models of {wm.n_params:,} parameters ({args.attn} attention), minibatches of {B} × "
          f"({q} + {r}) tokens, {args.threads} thread(s)")
    print(f"[seed_parallel] largest gradient difference, a model in the batch vs alone: {diff:.2e} "
          f"(largest gradient element {scale:.2e})")
    print(f"[seed_parallel] per minibatch of all {K} models (forward, backward, AdamW): one after the other "
          f"{ms['one after the other']:.1f} ms, together {ms['together']:.1f} ms; one after the other ÷ together "
          f"{ratio:.2f}× (rounds: " + ", ".join(
              f"{a / b:.2f}" for a, b in zip(secs["one after the other"], secs["together"])) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
