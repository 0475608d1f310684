"""Sampling speed: our KV-cache sampler (``generation.sampler=lab``, ``sampling.kv_generate``) against Hugging Face
``model.generate`` (``sampler=hf``, ``sampling.hf_generate``), and whether they draw the same tokens.

Matched: the model (the benchmark's family-``a`` policy, loaded once, in eval mode), the prompts (a GRPO rollout
batch: ``algo.batch_size`` = prompts × ``algo.samples_per_prompt`` of our ``prompt_stream``, a fresh draw per call,
tokenized once, left-padded), the settings (``generation.max_new_tokens``, temperature, top-k, top-p) and the seed:
each call of one side is paired with a call of the other on the same prompts from the same ``torch.manual_seed``,
the order alternating from pair to pair. EOS is suppressed in the timed calls (as in the GRPO and PPO benchmarks),
so every row runs ``max_new_tokens`` decoding steps on both sides. Timed: the sampler call alone (no
tokenization or decoding), in wall-clock time (the headline tokens/s) and in CPU time of the process. Checked on every call, timed or not: the same tokens and the same state of torch's
random number generator afterwards; also on untimed calls with EOS allowed (rows ending at different steps) and
with top-k and top-p. A difference fails the run.
"""

from __future__ import annotations

import time

import torch
from omegaconf import DictConfig

from benchmarks.common import Section, WorldModel, compose, load_tokenizer, median, prompt_fn, suppress_tokens, table

EXTRA_SETTINGS = [(1.0, 20, 0.9), (0.7, 0, 0.8), (0.0, 0, 1.0)]  # untimed identity checks: (temperature, top_k, top_p)


def paired_call(fns: dict, order: tuple[str, str], seed: int, args: tuple) -> tuple[dict, dict, bool]:
    """Both samplers on the same arguments from the same seed, in `order`: ({side: wall seconds}, {side: CPU
    seconds of this process}, identical?)."""
    secs, cpu, out, rng = {}, {}, {}, {}
    for side in order:
        torch.manual_seed(seed)
        t0, c0 = time.perf_counter(), time.process_time()
        out[side] = fns[side](*args)
        secs[side], cpu[side] = time.perf_counter() - t0, time.process_time() - c0
        rng[side] = torch.get_rng_state()
    a, b = order
    same = out[a].shape == out[b].shape and torch.equal(out[a], out[b]) and torch.equal(rng[a], rng[b])
    return secs, cpu, same


def run(cfg: DictConfig, wm: WorldModel, work, steps: int, warmup: int) -> Section:
    from rlhf_lab.models import families as Fm
    from rlhf_lab.models.sampling import encode_prompts, hf_generate, kv_generate, lab_unsupported

    sec = Section("Sampling speed (our KV-cache sampler vs Hugging Face generate)", __doc__.split("\n\n", 1)[1].strip())
    cfg = compose(["algo=grpo"])
    g = cfg.generation
    tok = load_tokenizer(wm.lm_dir)
    model = Fm.load_causal_lm(wm.lm_dir, tok).eval()
    if why := lab_unsupported(model, tok):
        raise RuntimeError(f"the lab sampler cannot sample this model: {why}")
    fns = {"ours": kv_generate, "hf": hf_generate}
    T, settings = int(g.max_new_tokens), (float(g.temperature), int(g.top_k), float(g.top_p))

    def args(step: int, s=settings) -> tuple:  # the left-padded prompts of the GRPO rollout batch of `step`
        G = int(cfg.algo.samples_per_prompt)
        ids, mask = encode_prompts(tok, [p for p in prompt_fn(cfg)(step) for _ in range(G)], g.get("max_prompt_len"))
        return (model, ids, mask, T, tok.eos_token_id, tok.pad_token_id, *s)

    checks = []
    for i, s in enumerate([settings, *EXTRA_SETTINGS]):  # EOS allowed
        a = args(1000 + i, s)
        *_, same = paired_call(fns, ("ours", "hf"), seed=i, args=a)
        checks.append([f"EOS allowed, temperature {s[0]}, top_k {s[1]}, top_p {s[2]}", a[1].shape[0], same])

    times, cpu_times, timed_same = {"ours": [], "hf": []}, {"ours": [], "hf": []}, []
    with suppress_tokens(model, tok.eos_token_id):
        for step in range(warmup + steps):
            order = ("ours", "hf") if step % 2 == 0 else ("hf", "ours")
            secs, cpu, same = paired_call(fns, order, seed=step, args=args(step))
            timed_same.append(same)
            if step >= warmup:
                for side in secs:
                    times[side].append(secs[side])
                    cpu_times[side].append(cpu[side])
    checks.append([f"EOS suppressed (the timed calls), temperature {settings[0]}, top_k {settings[1]}, "
                   f"top_p {settings[2]}", f"{len(timed_same)} calls", all(timed_same)])
    identical = all(bool(c[2]) for c in checks)

    B = int(cfg.algo.batch_size)
    med = {side: median(ts) for side, ts in times.items()}
    cpu_med = {side: median(ts) for side, ts in cpu_times.items()}
    rate = {side: B * T / med[side] for side in med}
    ratio, cpu_ratio = rate["ours"] / rate["hf"], cpu_med["hf"] / cpu_med["ours"]
    per_pair = [h / o for o, h in zip(times["ours"], times["hf"])]
    sec.tables.append(table(
        ["sampler", "tokens/s", "ms per call", "ms per decoding step", "CPU ms per call", "timed calls",
         "ratio ours/HF"],
        [["ours (generation.sampler=lab: sampling.kv_generate)", rate["ours"], 1000 * med["ours"],
          1000 * med["ours"] / T, 1000 * cpu_med["ours"], len(times["ours"]), ratio],
         ["HF (generation.sampler=hf: model.generate)", rate["hf"], 1000 * med["hf"], 1000 * med["hf"] / T,
          1000 * cpu_med["hf"], len(times["hf"]), 1.0]]))
    sec.tables.append("Same tokens and the same random-number state afterwards, under the same seed:\n\n" + table(
        ["calls", "batch", "identical"], [[c[0], c[1], "yes" if c[2] else "NO: TOKENS DIFFER"] for c in checks]))
    sec.findings.append(
        f"a call = {B} rows ({B // int(cfg.algo.samples_per_prompt)} prompts × {int(cfg.algo.samples_per_prompt)}), "
        f"{T} new tokens each; policy {wm.arch}; {steps} timed pairs after {warmup} warm-up, order alternating; "
        f"per-pair ratios: median {median(per_pair):.2f}, range {min(per_pair):.2f}–{max(per_pair):.2f}; "
        f"torch threads {torch.get_num_threads()}")
    sec.findings.append(f"tokens/s ours/HF **{ratio:.2f}×** (medians of wall-clock times); in CPU time of this "
                        f"process, which other jobs on the cores disturb less, {cpu_ratio:.2f}×; tokens identical to "
                        "generate's: " + ("**yes**" if identical else "**NO**"))
    sec.summary = ["sampler, ours/HF generate (tokens/s)", f"{ratio:.2f}×",
                   "tokens identical" if identical else "TOKENS DIFFER"]
    sec.ok, sec.data = identical, {"ratio": ratio, "cpu_ratio": cpu_ratio}
    return sec
