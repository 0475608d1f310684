"""A PPO or GRPO step against the machine's limits, ``python -m benchmarks.ops.bounds [--shape tiny|0.5b] [--save]``
(issue 70's breakdown): where each phase's time goes beside the least time the machine's memory bandwidth and matmul
rate allow for it. ``--set KEY=VALUE`` (repeatable) ``--tag NAME``: the step runs with these config overrides, the
section saved as ``bounds_SHAPE_NAME`` beside the plain ``bounds_SHAPE``.

One run measures the machine at the run's torch threads, before and after the steps (the better of the two counts):
its fp32 matmul rate (``ops.gpu.matmul_peak``) and its memory bandwidth (``ops.gpu.stream_bandwidth``, STREAM's copy
and triad; the bounds use the larger). On ``ops.gpu``'s random Qwen2 model of the shape, with the world's tokenizer:

- **Decoding**: seconds per decode step of our sampler (``sampling.kv_generate``) and of Hugging Face ``generate``, at
  batch 1 and at the PPO batch, EOS suppressed: (the best of `repeats` calls for T new tokens − the best for 1) ÷
  (T − 1). A decode step must read every weight once and the whole KV cache (:func:`decode_step_bytes`); its
  bandwidth bound is those bytes ÷ the bandwidth, at the mean context of the steps (padded prompt width + T / 2).
  Reported: bound ÷ measured, 1 at the bound.
- **A decode step's linear layers alone** (:func:`linears_seconds`): q, k, v, o, gate, up and down of every layer
  and the LM head (:func:`decode_linears`), each weight a distinct tensor so that they stream from memory as in a
  decode step, ``F.linear`` over all of them at batch 1 and the PPO batch, in fp32 and in bf16 (the best of 5 passes
  after a warm one): ms and GB/s; our decode step ÷ the fp32 linears' time (the rest is the sampler's own work);
  the bf16 linears' time bounds a bf16 decoding's step. The weights are freed before the steps run.
- **The step**: PPO with LoRA on a shared base (``ops.gpu``'s job ``ppo_lora``), PPO with full fine-tuning (``ppo``)
  and GRPO (``grpo``), at ``ops.gpu``'s job sizes for the shape, each phase timed by ``ppo_steps.run_ours`` (every
  response run to ``max_new_tokens``). Each phase's bytes and FLOPs (:func:`phase_work`): generation reads the
  policy's weights and KV cache at every step; a forward pass computes 2 × parameters × tokens; the update, forward
  and backward, tokens × (4 × the trained trunks' parameters + 2 × the trained parameters) per PPO epoch, which is
  the usual 6 × parameters × tokens with full fine-tuning; with LoRA the frozen weights still cost the forward and
  the activations' gradients, only the weight gradients are the adapters'. Tokens: the prompts' and responses'
  (the passes are packed: no padding). The update's AdamW steps read and write 28 bytes a trained fp32 parameter
  (weight, gradient and two moments read; weight and moments written). Attention's own products, gradient
  clipping and zeroing are left out, so the bounds are lower bounds. Reported per phase: the bandwidth bound, the
  matmul bound, and the larger ÷ measured; for the update, whose passes and optimizer steps run one after the
  other, their sum ÷ measured, and (the headline) its passes' FLOPs at the matmul rate ÷ measured.

At the tiny shape a step is per-call overhead, not bytes or FLOPs: its fractions check the code, not the machine.
"""

from __future__ import annotations

import argparse
import datetime
import math
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks import common as C
from benchmarks.ops import gpu
from rlhf_lab.runs.process import release_memory

RUNS = {"ppo_lora": "PPO, LoRA r=16, shared base", "grpo": "GRPO, full fine-tuning",
        "ppo": "PPO, full fine-tuning (4 models)"}  # ops.gpu's jobs; the largest last
STEPS = {"0.5b": 3, "tiny": 4}  # PPO steps a run, the first a warm-up


def kv_token_bytes(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of the KV cache per token and sequence: a key and a value of every KV head in every layer."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def decode_step_bytes(weight_bytes: float, kv_bytes: float, context: float, batch: int) -> float:
    """Bytes a decode step of `batch` sequences at `context` tokens must read: every weight once and the KV cache of
    every sequence (`kv_bytes` per token, :func:`kv_token_bytes`)."""
    return weight_bytes + kv_bytes * context * batch


def _heads(config) -> tuple[int, int, int]:
    """(heads, KV heads, head dim) of a transformers config (``head_dim`` where it says, else hidden ÷ heads)."""
    heads = int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
    return heads, int(getattr(config, "num_key_value_heads", None) or heads), int(head_dim)


def config_kv_bytes(config, dtype_bytes: int) -> int:
    """:func:`kv_token_bytes` of a transformers config (``head_dim`` where it says, else hidden ÷ heads)."""
    _, kv_heads, head_dim = _heads(config)
    return kv_token_bytes(int(config.num_hidden_layers), kv_heads, head_dim, dtype_bytes)


def decode_linears(config) -> list[tuple[int, int]]:
    """The (out, in) weight shapes of the linear layers one decode step runs, in order, for a Qwen2/Llama-style
    config: in each layer q (heads × head dim, hidden), k and v (KV heads × head dim, hidden), o (hidden, heads ×
    head dim), gate and up (intermediate, hidden), down (hidden, intermediate); then the LM head (vocab, hidden),
    which reads the embedding's matrix where the two are tied. Biases, norms and the embedding lookup (a row a
    token) are left out."""
    hidden, inter = int(config.hidden_size), int(config.intermediate_size)
    heads, kv_heads, head_dim = _heads(config)
    q, kv = heads * head_dim, kv_heads * head_dim
    layer = [(q, hidden), (kv, hidden), (kv, hidden), (hidden, q), (inter, hidden), (inter, hidden), (hidden, inter)]
    return layer * int(config.num_hidden_layers) + [(int(config.vocab_size), hidden)]


LINEAR_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def linears_seconds(shapes: list[tuple[int, int]], batches: list[int], passes: int = 5) -> dict:
    """Seconds of one decode step's linear layers alone: ``F.linear`` of a (batch, in) input over every weight of
    `shapes` (:func:`decode_linears`), each a distinct tensor, so that a pass streams them all from memory as a
    decode step does (one weight reused would sit in the cache); per dtype of :data:`LINEAR_DTYPES` and batch, the
    best of `passes` passes after an untimed one. The fp32 weights are made bf16 one at a time (the peak is the
    fp32 weights and one bf16 tensor) and all are freed on return. {dtype: {"bytes": weight bytes, "seconds":
    {batch: s}}}."""
    gen = torch.Generator().manual_seed(0)
    weights = [torch.empty(o, i).uniform_(-0.05, 0.05, generator=gen) for o, i in shapes]
    out = {}
    for name, dtype in LINEAR_DTYPES.items():
        for k, w in enumerate(weights):
            weights[k] = w.to(dtype)  # the fp32 tensor is freed as its bf16 copy takes its place
        del w
        secs = {}
        for b in batches:
            inputs = {i: torch.randn(b, i, generator=gen).to(dtype) for i in {w.shape[1] for w in weights}}

            def one_pass():
                for w in weights:
                    F.linear(inputs[w.shape[1]], w)

            with torch.inference_mode():
                secs[b] = C.best_seconds(one_pass, passes)
        out[name] = {"bytes": sum(w.numel() * w.element_size() for w in weights), "seconds": secs}
    weights.clear()
    return out


@dataclass(frozen=True)
class StepShape:
    """What a step computes on: one trunk's parameters (every model here has the policy's shape), the policy's weight
    bytes, the KV cache's bytes per token, the batch, the prompts' mean tokens and padded width, the response tokens,
    the PPO epochs, whether the critic has a trunk of its own (0/1), the trained parameters, the optimizer steps."""

    params: float
    weight_bytes: float
    kv_bytes: float
    batch: int
    prompt: float
    width: int
    response: int
    epochs: int
    critic_trunk: int
    trained: float
    optimizer_steps: int
    sampler_scale: float = 1.0  # bytes of the sampled model's weights and KV cache ÷ the policy's (generation.dtype)
    reference_scale: float = 1.0  # bytes of the reference's weights ÷ the policy's (algo.reference.dtype)


ADAMW_BYTES = 28  # an fp32 AdamW step: weight, gradient, 2 moments read; weight and 2 moments written


def phase_work(s: StepShape) -> dict[str, tuple[float, float]]:
    """(bytes that must be moved, FLOPs) of each phase of a step. Generation: a prefill over the padded prompts
    and T − 1 decode steps, each reading the policy's weights and the KV cache at context width + t; the forward
    passes read each trunk's weights once and compute 2 × parameters × tokens; the update computes tokens × (4 ×
    trained trunks × parameters + 2 × trained parameters) per epoch and its AdamW steps move 28 bytes a trained
    parameter. A sampled model or reference in another dtype than the fp32 policy (``--set generation.dtype=…``,
    ``algo.reference.dtype``) moves its bytes scaled (``sampler_scale``, ``reference_scale``)."""
    tokens, trunks = s.batch * (s.prompt + s.response), 1 + s.critic_trunk
    gen_bytes = s.sampler_scale * sum(decode_step_bytes(s.weight_bytes, s.kv_bytes, s.width + t, s.batch)
                                      for t in range(s.response))
    return {"generation": (gen_bytes, 2 * s.params * s.batch * (s.width + s.response - 1)),
            "score/rm": (s.weight_bytes, 2 * s.params * tokens),
            "score/reference": (s.reference_scale * s.weight_bytes, 2 * s.params * tokens),
            "score/policy_critic": (trunks * s.weight_bytes, trunks * 2 * s.params * tokens),
            "update": (ADAMW_BYTES * s.trained * s.optimizer_steps,
                       s.epochs * tokens * (4 * trunks * s.params + 2 * s.trained))}


def bound(work: tuple[float, float], bandwidth: float, matmul: float) -> tuple[float, float]:
    """(bandwidth bound, matmul bound) in seconds."""
    nbytes, flops = work
    return nbytes / bandwidth, flops / matmul


def decode_seconds(model, tok, prompts: list[str], new_tokens: int, g, repeats: int) -> dict:
    """Seconds per decode step of each sampler on `prompts` (EOS suppressed): (best of `repeats` calls for
    `new_tokens` tokens − best for 1) ÷ (new_tokens − 1); and the prompts' padded width."""
    from rlhf_lab.models.sampling import encode_prompts, hf_generate, kv_generate

    ids, mask = encode_prompts(tok, prompts)
    args = (tok.eos_token_id, tok.pad_token_id, float(g.temperature), int(g.top_k or 0), float(g.top_p))
    out = {"width": ids.shape[1]}

    def best(fn, n: int) -> float:
        secs = []
        for r in range(repeats):
            torch.manual_seed(r)
            t = time.perf_counter()
            fn(model, ids, mask, n, *args)
            secs.append(time.perf_counter() - t)
        return min(secs)

    with C.suppress_tokens(model, tok.eos_token_id):
        for name, fn in (("lab", kv_generate), ("hf", hf_generate)):
            best(fn, 2)  # warm-up
            out[name] = (best(fn, new_tokens) - best(fn, 1)) / (new_tokens - 1)
    return out


def machine(threads: int, seconds: float) -> dict[str, float]:
    """The fp32 matmul rate (FLOP/s; the best product over `seconds`) and STREAM's copy and triad (bytes/s)."""
    return {"matmul": gpu.matmul_peak(threads, seconds=seconds), **gpu.stream_bandwidth(threads)}


def job_config(job: str, shape: str, wm: C.WorldModel, work: Path, overrides: tuple[str, ...] = ()):
    """The config of ``ops.gpu``'s `job` at `shape` on the CPU: its ``algo`` and ``generation`` overrides, then
    `overrides` (``--set``)."""
    over = [o for o in gpu.job_overrides(job, shape, "cpu", wm.lm_dir, work) if o.startswith(("algo", "generation."))]
    return C.compose(["policy=a_small", *over, *overrides])


def prompt_lengths(cfg, tok, steps: int) -> tuple[float, float]:
    """The mean tokens of a step's prompts and their mean padded width, over the run's steps."""
    from rlhf_lab.models.sampling import encode_prompts

    lens, widths = [], []
    for s in range(steps):
        _, mask = encode_prompts(tok, C.prompt_fn(cfg)(s), cfg.generation.get("max_prompt_len"))
        lens += mask.sum(1).tolist()
        widths.append(mask.shape[1])
    return sum(lens) / len(lens), sum(widths) / len(widths)


PHASES = [("generation", "generation"), ("score/rm", "RM forward"), ("score/reference", "reference forward"),
          ("score/policy_critic", "policy + value forward"), ("update", "update (forward, backward, optimizer)"),
          ("other", "other (gold, advantages, statistics, logging)"), ("step", "step")]


def step_rows(job: str, r: dict, s: StepShape, bandwidth: float, matmul: float) -> tuple[list[list], dict]:
    """The table rows of one run and its {phase: bound ÷ measured} (the larger of a phase's two bounds; their sum for
    the update; the phases' bounds summed for the step), with ``update_matmul``: the update's FLOPs at the matmul
    rate ÷ measured."""
    work, rows, frac, total = phase_work(s), [], {}, 0.0
    for key, label in PHASES:
        secs = r.get(key, 0.0)
        nbytes, flops = work.get(key, (math.nan, math.nan))
        bw_s, mm_s = bound((nbytes, flops), bandwidth, matmul)
        least = bw_s + mm_s if key == "update" else max(bw_s, mm_s) if key in work else math.nan
        total += 0.0 if math.isnan(least) else least
        frac[key] = (total if key == "step" else least) / secs if secs > 0 else math.nan
        rows.append([RUNS[job] if key == "generation" else "", label, 1000 * secs, 100 * secs / r["step"],
                     nbytes / 1e6, flops / 1e9, 1000 * bw_s, 1000 * mm_s, frac[key]])
    frac["update_matmul"] = work["update"][1] / matmul / r["update"]
    return rows, frac


def dtype_scale(dtype) -> float:
    """Bytes of a weight in `dtype` (``generation.dtype``, ``algo.reference.dtype``; None: the policy's) ÷ fp32's."""
    return 1.0 if dtype in (None, "auto") else getattr(torch, str(dtype)).itemsize / 4


def measure(shape: str, jobs: list[str], repeats: int, work: Path, seconds: float = 4.0,
            overrides: tuple[str, ...] = ()) -> dict:
    """The run's measurements at `shape`: the machine's rates before and after (`seconds` of matmuls each time), the
    decode steps, the PPO/GRPO steps (``ppo_steps.run_ours``, one warm-up step) of `jobs` with the config
    `overrides` (``--set``; the decode timings are the plain policy's), and the model's sizes."""
    from benchmarks.ops.ppo_steps import run_ours
    from rlhf_lab.models import families as Fm
    from rlhf_lab.stages.ppo import model_bytes

    size = gpu.SIZES.get(f"{shape}_cpu", gpu.SIZES[shape])
    threads, T, B, steps = int(size["threads"]), int(size["new_tokens"]), int(size["batch"]), STEPS[shape]
    wm = C.make_world_model(C.compose(["policy=a_small"]), work / "world", qwen2=gpu.SHAPES[shape])
    print(f"[bounds] {shape}: {wm.n_params / 1e6:.2f}M parameters, {threads} thread(s); work folder {work}", flush=True)
    raw = {"threads": threads, "new_tokens": T, "steps": steps, "n_params": wm.n_params,
           "measures": [machine(threads, seconds)]}
    torch.set_num_threads(threads)
    tok = C.load_tokenizer(wm.lm_dir)
    model = Fm.load_causal_lm(wm.lm_dir, tok).eval()
    ppo_cfg = job_config("ppo", shape, wm, work)
    raw.update(kv=config_kv_bytes(model.config, next(model.parameters()).element_size()),
               weights=float(model_bytes(model)))
    prompts = C.prompt_fn(ppo_cfg)(0)[:B]  # the first PPO step's prompts, at the PPO job's sampling settings
    raw["decode"] = {b: decode_seconds(model, tok, prompts[:b], T, ppo_cfg.generation, repeats)
                     for b in sorted({1, len(prompts)})}
    shapes = decode_linears(model.config)
    del model
    release_memory()
    raw["linears"] = linears_seconds(shapes, sorted(raw["decode"]))  # its weights freed before the steps run
    release_memory()
    print("[bounds] a decode step's linear layers alone: " + ", ".join(
        f"{n} batch {b} {1000 * s:.3g} ms" for n, v in raw["linears"].items() for b, s in v["seconds"].items()),
        flush=True)
    raw["runs"] = {}
    for job in jobs:
        cfg = job_config(job, shape, wm, work, overrides)
        raw["runs"][job] = {**run_ours(cfg, wm, steps, 1), "lengths": prompt_lengths(cfg, tok, steps),
                            "epochs": int(cfg.algo.ppo_epochs), "batch": int(cfg.algo.batch_size),
                            "minibatches": int(cfg.algo.num_minibatches),
                            "sampler_scale": dtype_scale(cfg.generation.get("dtype")),
                            "reference_scale": dtype_scale(cfg.algo.reference.get("dtype"))}
        release_memory()
        print(f"[bounds] {job}: step {raw['runs'][job]['step']:.3g} s", flush=True)
    raw["measures"].append(machine(threads, seconds))
    raw["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB on Linux
    return raw


def linear_rows(linears: dict, decode: dict, bandwidth: float) -> tuple[str, dict, str]:
    """The table of a decode step's linear layers alone (:func:`linears_seconds`) beside our sampler's decode step
    (:func:`decode_seconds`) at each batch, its data ({dtype: {batch: [ms, GB/s]}}, ``share``: {batch: fp32
    linears ÷ our step}), and the finding that says, from these numbers, what holds decoding below its bandwidth
    bound at the largest batch."""
    fp32, bf16 = linears["fp32"], linears["bf16"]
    rows, data = [], {n: {} for n in linears} | {"share": {}}
    for b, d in decode.items():
        for n, v in linears.items():
            data[n][b] = [1000 * v["seconds"][b], v["bytes"] / v["seconds"][b] / 1e9]
        data["share"][b] = fp32["seconds"][b] / d["lab"]
        rows.append([b, *data["fp32"][b], *data["bf16"][b], 1000 * d["lab"], d["lab"] / fp32["seconds"][b],
                     1000 * (d["lab"] - fp32["seconds"][b]), 1000 * fp32["bytes"] / bandwidth])
    table = (f"A decode step's linear layers alone (``F.linear`` over its {fp32['bytes'] / 1e6:.1f} MB of fp32 "
             f"weights, {bf16['bytes'] / 1e6:.1f} MB in bf16, each weight a distinct tensor; best pass after a "
             "warm one) beside our sampler's decode step:\n\n" + C.table(
                 ["batch", "fp32 linears ms", "fp32 GB/s", "bf16 linears ms", "bf16 GB/s", "ours ms per decode step",
                  "ours ÷ fp32 linears", "the sampler's own ms (the rest)", "fp32 weights' bandwidth bound ms"], rows))
    B, b1 = max(decode), min(decode)
    (ms32, gbs32), (ms16, gbs16), share = data["fp32"][B], data["bf16"][B], data["share"][B]
    ours = 1000 * decode[B]["lab"]
    what = "the fp32 linear layers' kernel" if share >= 0.5 else "the sampler's own work, not the linear layers"
    finding = (f"what holds decoding below its bandwidth bound, at batch {B}: **{what}**. The fp32 linears alone take "
               f"{ms32:.3g} ms of our {ours:.3g} ms decode step ({100 * share:.0f}%; at batch {b1} "
               f"{100 * data['share'][b1]:.0f}%), reading the weights at {gbs32:.3g} GB/s, "
               f"{gbs32 * 1e9 / bandwidth:.2g} of the measured bandwidth ({bandwidth / 1e9:.3g} GB/s); the sampler's "
               f"own work is the other {ours - ms32:.3g} ms. In bf16 the linears take {ms16:.3g} ms ({gbs16:.3g} "
               f"GB/s, {ms32 / ms16:.2g}× fp32's speed): the least a bf16 decoding's step could take with this kernel")
    return table, data, finding


def fill(sec: C.Section, raw: dict) -> None:
    """`sec`'s tables, findings, summary and data from :func:`measure`'s `raw`."""
    measures, threads, T, kv, weights = raw["measures"], raw["threads"], raw["new_tokens"], raw["kv"], raw["weights"]
    best = {k: max(m[k] for m in measures) for k in measures[0]}
    bandwidth, matmul = max(best["copy"], best["triad"]), best["matmul"]
    sec.tables.append(f"The machine, at {threads} torch thread(s), before and after the steps:\n\n" + C.table(
        ["measure", "before", "after", "used for the bounds"],
        [["fp32 matmul, GFLOP/s", measures[0]["matmul"] / 1e9, measures[1]["matmul"] / 1e9, matmul / 1e9],
         ["STREAM copy, GB/s", measures[0]["copy"] / 1e9, measures[1]["copy"] / 1e9, math.nan],
         ["STREAM triad, GB/s", measures[0]["triad"] / 1e9, measures[1]["triad"] / 1e9, bandwidth / 1e9]]))
    dec_rows, dec_frac = [], {}
    for b, d in raw["decode"].items():
        step_bytes = decode_step_bytes(weights, kv, d["width"] + T / 2, b)
        for name, label in (("lab", "ours (kv_generate)"), ("hf", "HF generate")):
            dec_frac[f"{name}_{b}"] = step_bytes / bandwidth / d[name]
            dec_rows.append([label, b, d["width"], T, 1000 * d[name], step_bytes / 1e6, 1000 * step_bytes / bandwidth,
                             dec_frac[f"{name}_{b}"]])
    sec.tables.append(f"Decoding ({raw['n_params']:,} parameters, {weights / 1e6:.1f} MB of weights, {kv} bytes of KV "
                      "cache per token and sequence):\n\n" + C.table(
                          ["sampler", "batch", "prompt width", "new tokens", "ms per decode step", "MB read per step",
                           "bandwidth bound ms", "bound ÷ measured"], dec_rows))
    lin_table, lin_data, lin_finding = linear_rows(raw["linears"], raw["decode"], bandwidth)
    sec.tables.append(lin_table)
    step_rows_all, fracs = [], {}
    for job, r in raw["runs"].items():
        prompt, width = r["lengths"]
        s = StepShape(raw["n_params"], r["policy_bytes"], kv, r["batch"], prompt, round(width),
                      int(r["response_tokens"]), r["epochs"], int(r["critic_trunk"]), r["trainable_params"],
                      r["epochs"] * r["minibatches"], r.get("sampler_scale", 1.0), r.get("reference_scale", 1.0))
        rows, fracs[job] = step_rows(job, r, s, bandwidth, matmul)
        step_rows_all += rows
        sec.findings.append(f"{RUNS[job]}: batch {s.batch}, prompts {prompt:.1f} tokens (padded {width:.1f}), "
                            f"{s.response} response tokens, {s.epochs} PPO epoch(s), {int(s.trained):,} trained "
                            f"parameters, critic trunk {'yes' if s.critic_trunk else 'no'}; "
                            f"{s.batch * s.response / r['step']:.1f} response tokens/s; generation "
                            f"{100 * r['generation'] / r['step']:.0f}% of the step at {fracs[job]['generation']:.2g} "
                            f"of its bound, the update's passes at {fracs[job]['update_matmul']:.2g} of the matmul "
                            "rate")
    if step_rows_all:
        sec.tables.append(f"The step, median over {raw['steps'] - 1} timed steps (1 warm-up) a run:\n\n" + C.table(
            ["run", "phase", "ms/step", "% of step", "MB moved", "GFLOP", "bandwidth bound ms", "matmul bound ms",
             "bound ÷ measured"], step_rows_all))
    B = max(raw["decode"])
    lab = dec_frac[f"lab_{B}"]
    sec.findings.insert(0, f"decoding, ours at batch {B}: **{lab:.2g}** of the bandwidth bound (HF generate "
                        f"{dec_frac[f'hf_{B}']:.2g}); bandwidth {bandwidth / 1e9:.1f} GB/s, matmul "
                        f"{matmul / 1e9:.0f} GFLOP/s at {threads} thread(s)")
    sec.findings.insert(1, lin_finding)
    sec.findings.append(f"peak RSS of the process (all runs, one after the other): {raw['peak_rss_gib']:.2f} GiB")
    sec.summary = ["decoding ÷ bandwidth bound; update ÷ matmul rate",
                   f"decode {lab:.2g}" + "".join(f"; {j} update {f['update_matmul']:.2g}" for j, f in fracs.items()),
                   f"{bandwidth / 1e9:.1f} GB/s, {matmul / 1e9:.0f} GFLOP/s, {threads} thread(s)"]
    sec.data = {"bandwidth": bandwidth, "matmul": matmul, "measures": measures, "decode": dec_frac, "fractions": fracs,
                "linears": lin_data}


def section_name(ap: argparse.ArgumentParser, shape: str, overrides: list[str], tag: str) -> str:
    """The saved section's name: ``bounds_SHAPE``, or with ``--set`` overrides ``bounds_SHAPE_TAG`` (``--tag``, which
    they need), so that a run with overrides never replaces the plain one. A usage error (exit 2) for an override
    that is not KEY=VALUE, a missing or malformed tag."""
    for o in overrides:
        if "=" not in o or not o.split("=", 1)[0]:
            ap.error(f"--set {o}: expected KEY=VALUE, e.g. --set generation.dtype=bfloat16")
    if tag and not all(c.isalnum() or c in "-." for c in tag):
        ap.error(f"--tag {tag}: letters, digits, '-' and '.' only (it names results/bounds_{shape}_TAG.json)")
    if overrides and not tag:
        ap.error("--set needs --tag NAME: the section is saved as bounds_SHAPE_NAME, beside the plain bounds_SHAPE")
    return f"bounds_{shape}_{tag}" if tag else f"bounds_{shape}"


def check_overrides(ap: argparse.ArgumentParser, shape: str, jobs: list[str], overrides: tuple[str, ...]) -> None:
    """Each step run's config with `overrides` composed and checked (the CLI's checks, PPO's rules) before anything is
    measured: a usage error (exit 2) naming the run and the config's one line."""
    from types import SimpleNamespace

    from rlhf_lab.config.checks import composition_error_line, validate
    from rlhf_lab.config.ppo_rules import check_ppo_rules

    if not overrides:
        return
    for job in jobs:
        try:
            cfg = job_config(job, shape, SimpleNamespace(lm_dir=Path("policy")), Path("work"), overrides)
            validate(cfg)
            check_ppo_rules(cfg.algo)
        except Exception as err:  # noqa: BLE001  Hydra's composition errors and ConfigError alike, as one line
            ap.error(f"--set with the {job} run: {composition_error_line(err) or err}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ops.bounds", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(gpu.SHAPES), default="tiny",
                    help="ops.gpu's Qwen2 shape (default tiny; 0.5b needs about 17 GiB and idle cores)")
    ap.add_argument("--only", default=",".join(RUNS), help=f"the step runs, comma-separated (default {','.join(RUNS)})")
    ap.add_argument("--repeats", type=int, default=3, help="decode timings: the best of this many calls")
    ap.add_argument("--note", default="", help="a sentence for the section's note (e.g. what else ran on the cores)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                    help="a config override for the step runs (repeatable), e.g. --set generation.dtype=bfloat16")
    ap.add_argument("--tag", default="", help="with --set: the saved section is bounds_SHAPE_TAG (letters, digits, -)")
    ap.add_argument("--save", action="store_true", help="write the section bounds_SHAPE (with --set: bounds_SHAPE_TAG) "
                                                        "into benchmarks/results/")
    a = ap.parse_args(argv)
    jobs = C.subset(ap, "--only", a.only, RUNS)
    name = section_name(ap, a.shape, a.overrides, a.tag)
    check_overrides(ap, a.shape, jobs, tuple(a.overrides))
    C.quiet()
    started, cores = datetime.datetime.now().astimezone(), C.CoreUse()
    listed = ", ".join(f"`{o}`" for o in a.overrides)
    sec = C.Section(f"A PPO step against the machine's bandwidth and matmul rate at the {a.shape} shape"
                    + (f", with {listed}" if listed else ""),
                    __doc__.split("\n\n", 1)[1].strip() + (f"\n\n{a.note}" if a.note else "") + (
                        f"\n\nThe step runs' config overrides (`--set`): {listed}; the decoding and linear layers' "
                        "tables time the plain fp32 policy." if listed else ""))
    work = Path(tempfile.mkdtemp(prefix="rlhf_bench_bounds_"))
    try:
        fill(sec, measure(a.shape, jobs, a.repeats, work, overrides=tuple(a.overrides)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cmd = f"python -m benchmarks.ops.bounds --shape {a.shape}" + (f" --only {a.only}" if jobs != list(RUNS) else "") + (
        f" --repeats {a.repeats}" if a.repeats != 3 else "") + "".join(f" --set {o}" for o in a.overrides) + (
        f" --tag {a.tag}" if a.tag else "") + (" --note …" if a.note else "")  # the note: below
    md = sec.markdown(C.run_lines(started, time.time() - sec.t0, cmd + (" --save" if a.save else ""), cores))
    print("\n" + md, flush=True)
    if a.save:
        C.save(name, md, [f"{a.shape}: {sec.summary[0]}", *sec.summary[1:]], sec.data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
