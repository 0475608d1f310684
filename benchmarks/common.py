"""What every benchmark shares: process set-up, the world model on disk, preference pairs, step clocks, the
machine's state during a measurement, and the results: each benchmark writes ``benchmarks/results/NAME.json``
(its markdown section, its summary row, its headline numbers) and ``benchmarks/results.md`` is generated from them.

Nothing here talks to a hub: the model is a family-``a`` (Llama-style) decoder with freshly initialised weights and
a tokenizer trained on world texts, saved with ``save_pretrained`` so that both sides of every comparison load the
very same weights with ``from_pretrained``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime
import functools
import gc
import json
import os
import platform
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

for _k in ("HF_HUB_OFFLINE", "TRANSFORMERS_NO_ADVISORY_WARNINGS", "HF_HUB_DISABLE_PROGRESS_BARS"):
    os.environ.setdefault(_k, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).resolve().parent / "results"
AGREEMENT_TOL = 1e-4  # first-batch / first-step agreement, relative above 1


def quiet() -> None:
    """Silence the libraries' progress bars, advisories and warnings (the project's own recipe, plus TRL's)."""
    import logging
    import warnings

    from rlhf_lab.runs.process import quiet_libraries

    quiet_libraries()
    warnings.filterwarnings("ignore")
    for name in ("trl", "accelerate", "datasets", "transformers", "lightning.pytorch.utilities.rank_zero",
                 "lightning.pytorch.accelerators.cuda", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.ERROR)
    with contextlib.suppress(Exception):
        import datasets

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()


OVERRIDES: list[str] = []  # after every compose()'s own: the sizes of a benchmark at another shape (ops.gpu --vs-trl)


def compose(overrides: list[str] | None = None):
    """The project's config composed with Hydra's compose API (as tests/conftest.py does), :data:`OVERRIDES` last."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_module("rlhf_lab.conf", version_base="1.3"):
        return hydra_compose("config", overrides=[*(overrides or []), *OVERRIDES])


@dataclass
class WorldModel:
    """A tokenizer + causal LM folder (``lm``), a sequence-classifier (RM) folder of the same backbone (``rm``), and
    beside them ``lm_ref``: the same architecture with other random weights (a non-trivial reference)."""

    lm_dir: Path
    rm_dir: Path
    n_params: int
    arch: dict

    @property
    def ref_dir(self) -> Path:
        return self.lm_dir.parent / "lm_ref"


def make_world_model(cfg, out_dir: Path, seed: int = 0, n_texts: int = 2000, qwen2: dict | None = None) -> WorldModel:
    """Train the family's tokenizer on world texts, build a randomly initialised model (the family's at the config's
    arch, or a Qwen2 of the `qwen2` dimensions; ``vocab_size`` None: the tokenizer's), save both; the RM folder holds
    the same backbone with a scalar head (as ``families.load_sequence_scorer`` loads RMs), saved once so that the
    head's random initialisation is the same for every later load."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rlhf_lab.config import world as W
    from rlhf_lab.models import families as Fm
    from rlhf_lab.world import streams as D

    pc, out_dir = cfg.policy, Path(out_dir)
    lm_dir, rm_dir = out_dir / "lm", out_dir / "rm"
    corpus = D.reviews(W.world_settings(cfg), f"pretrain_{pc.family}", n_texts)
    tok = Fm.train_tokenizer(str(pc.family), [p + " " + r for p, r in corpus], int(pc.vocab_size))
    dims = qwen2 and {**qwen2, "vocab_size": qwen2.get("vocab_size") or len(tok), "max_position_embeddings": 512,
                      "tie_word_embeddings": True, "pad_token_id": tok.pad_token_id,
                      "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}

    def build():
        return AutoModelForCausalLM.from_config(Qwen2Config(**dims)) if dims else Fm.build_model(
            str(pc.family), pc.arch, tok)

    torch.manual_seed(seed)
    model = build()
    tok.save_pretrained(lm_dir)
    model.save_pretrained(lm_dir)
    torch.manual_seed(seed + 100)
    build().save_pretrained(out_dir / "lm_ref")
    torch.manual_seed(seed + 1)
    rm = Fm.load_sequence_scorer(lm_dir, tok)
    tok.save_pretrained(rm_dir)
    rm.save_pretrained(rm_dir)
    return WorldModel(lm_dir, rm_dir, Fm.n_params(model), dict(qwen2 or pc.arch))


def load_tokenizer(path: Path):
    from rlhf_lab.models import families as Fm

    return Fm.load_tokenizer(path)


def make_pairs(cfg, n: int, seed: int = 0):
    """`n` preference pairs from the world: two world responses per prompt, labelled by the config's labeler (the
    project samples them from the SFT policy; world texts have the same grammar and lengths)."""
    from rlhf_lab.config import data as DS
    from rlhf_lab.config import world as W
    from rlhf_lab.data.preferences import label_pairs
    from rlhf_lab.world import ReviewGenerator
    from rlhf_lab.world import streams as D

    gen = ReviewGenerator(D.stream_seed(cfg.world.seed, f"bench_pairs/{seed}"), W.world_spec(cfg))
    prompts, a, b = [], [], []
    while len(prompts) < n:
        p = gen.prompt()
        ra, rb = gen.response(p), gen.response(p)
        if ra != rb:
            prompts.append(p)
            a.append(ra)
            b.append(rb)
    pairs = label_pairs(DS.labelling(cfg), prompts, a, b, [True] * n, [True] * n, random.Random(seed), "world")
    assert len(pairs) == n
    return pairs


def prompt_fn(cfg):
    """PPO's and GRPO's prompts, as the stages draw them: ``step -> prompts`` (``stages.ppo.prompt_stream``)."""
    from rlhf_lab.stages.ppo import prompt_stream

    return prompt_stream(cfg, int(cfg.seed), int(cfg.algo.batch_size) // int(cfg.algo.samples_per_prompt))


def make_scorer(cfg, wm: WorldModel, tok):
    """The reward: the randomly initialised RM of the model folder through ``RewardScorer``."""
    from rlhf_lab.models import families as Fm
    from rlhf_lab.models.reward import RewardScorer

    rm = Fm.load_sequence_scorer(wm.rm_dir, tok).eval()
    return RewardScorer([rm], tok, normalize=True, max_len=int(cfg.reward_model.max_len))


def ppo_module(cfg, wm: WorldModel, tok, reference_dir=None):
    """``PPOModule`` with the config's algo (checked by its rules, rlhf_lab.config.ppo_rules, before any model), as
    ``stages.ppo.build`` makes it (models by ``build_models``), the RM of :func:`make_scorer`."""
    from rlhf_lab.algorithms.ppo import PPOModule
    from rlhf_lab.config import world as W
    from rlhf_lab.models import families as Fm
    from rlhf_lab.config.ppo_rules import check_ppo_rules
    from rlhf_lab.stages.ppo import build_models

    a = cfg.algo
    check_ppo_rules(a)
    scorer = make_scorer(cfg, wm, tok)
    torch.manual_seed(0)
    policy, reference, critic = build_models(a, wm.lm_dir, tok, scorer)
    if reference_dir is not None:
        reference = Fm.load_causal_lm(reference_dir, tok).requires_grad_(False).eval()
    return PPOModule(policy, reference, critic, tok, scorer, prompt_fn(cfg), a, cfg.kl, cfg.generation,
                     W.gold_weights(cfg))


@dataclass
class StepClock:
    """Wall-clock stamps at the end of each optimizer step (with the torch threads then); the timed steps are those
    after `warmup`: the interval between two step ends holds everything a step costs in its trainer."""

    warmup: int
    stamps: list[float] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)
    phases: list[dict] = field(default_factory=list)  # per timed step: seconds per phase

    def tick(self) -> None:
        self.stamps.append(time.perf_counter())
        self.threads.append(torch.get_num_threads())

    def step_times(self) -> list[float]:
        s = self.stamps[self.warmup - 1:] if self.warmup > 0 else self.stamps
        return [b - a for a, b in zip(s, s[1:])]

    def mean(self) -> float:
        return sum(st := self.step_times()) / len(st)


def fit(module, loader=None, steps: int = 1, clock: StepClock | None = None, callbacks=(), grad_clip=None) -> None:
    """Train `module` for `steps` optimizer steps (PPO: ``steps`` PPO steps) as the project's jobs do (CPU, fp32, no
    checkpointing), without progress bar or logger; `clock` ticks at every step end."""
    import lightning as L

    class Clock(L.Callback):
        def on_train_batch_end(self, *args):
            clock.tick()

    with tempfile.TemporaryDirectory() as tmp:
        L.Trainer(max_steps=steps * getattr(module, "updates_per_step", 1), accelerator="cpu", devices=1,
                  precision="32-true", enable_checkpointing=False, enable_model_summary=False, default_root_dir=tmp,
                  num_sanity_val_steps=0, enable_progress_bar=False, logger=False, log_every_n_steps=10,
                  gradient_clip_val=float(grad_clip) if grad_clip else None,
                  callbacks=([Clock()] if clock else []) + list(callbacks)).fit(module, loader)


def alternate(rounds: int, run_side, sides: tuple[str, ...] = ("ours", "trl"), seed_round: bool = False) -> dict:
    """`rounds` runs of each side, the order reversed every other round, each from ``torch.manual_seed(0)`` (with
    `seed_round`: the round's number). Each side starts on a collected heap: the last side's models, held in
    reference cycles (a Lightning trainer and its module), are freed before this side loads its own."""
    out: dict[str, list] = {side: [] for side in sides}
    for r in range(rounds):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            gc.collect()
            torch.manual_seed(r if seed_round else 0)
            out[side].append(run_side(side))
    return out


def rate(clocks: list[StepClock], per_step: int = 1) -> dict:
    """Items per second and ms per step over the timed steps of all `clocks`."""
    secs, n = sum(sum(c.step_times()) for c in clocks), sum(len(c.step_times()) for c in clocks)
    return {"rate": n * per_step / secs, "ms": 1000 * secs / n, "n": n, "step": secs / n}


def per_round(ours: list[StepClock], trl: list[StepClock]) -> list[float]:
    """Per-round ratios of the step times, TRL ÷ ours (= throughput ours/TRL)."""
    return [t.mean() / o.mean() for o, t in zip(ours, trl)]


def runs_line(steps: int, warmup: int, rounds: int, ratios: list[float], clocks: dict) -> str:
    """The runs in a finding: steps, warm-up, rounds, the per-round `ratios`, the torch threads seen by `clocks`."""
    return (f"{steps} steps per run of which {warmup} warm-up, {rounds} round(s) alternating the order; per-round "
            f"ratios {', '.join(f'{x:.2f}' for x in ratios)}; torch threads seen during the steps: "
            f"{sorted({n for cs in clocks.values() for c in cs for n in c.threads})}")


def median(xs) -> float:
    return statistics.median(xs) if (xs := list(xs)) else float("nan")


def with_rest(phases: list[dict], step_times: list[float], keys=None) -> list[dict]:
    """Each timed step's phases (only `keys`, 0 where missing, when given) plus ``step`` and ``update`` = step −
    the others."""
    out = []
    for ph, dt in zip(phases, step_times):
        ph = {k: ph.get(k, 0.0) for k in keys} if keys is not None else ph
        out.append({**ph, "step": dt, "update": dt - sum(ph.values())})
    return out


def phase_table(clocks: dict, phases, sides: dict | None = None) -> tuple[dict, str]:
    """Median seconds per phase (`phases`: (key, label)) over the timed steps of ``{"ours": [...], "trl": [...]}``
    clocks (more sides of ours allowed: `sides` {side: its column's name}, ``trl`` last), and the "where the time
    goes" table."""
    sides = sides or {"ours": "ours", "trl": "TRL"}
    med = {s: {k: median(ph[k] for c in cs for ph in c.phases) for k, _ in phases} for s, cs in clocks.items()}
    ours = [s for s in sides if s != "trl"]
    return med, ("Where the time goes, median ms per step over the timed steps of all rounds (the phases' medians "
                 "need not add up to the step's):\n\n" + table(
                     ["phase", *[f"{sides[s]} ms" for s in sides], *[f"ratio {sides[s]}/TRL" for s in ours]],
                     [[label, *[1000 * med[s][k] for s in sides], *[med[s][k] / med["trl"][k] for s in ours]]
                      for k, label in phases]))


def agreement(rows: list[tuple], same: dict[str, bool], tol: float = AGREEMENT_TOL, mask=None) -> tuple[list, bool]:
    """Agreement table rows and whether all agree. `rows`: (label, ours, TRL) scalars or tensors; tensors are shown
    by their mean (|mean| with label starting "|") over `mask` (per-token [B, T]) and checked on their largest
    element-wise difference; each within `tol` (relative above 1). `same`: inputs both sides must share exactly."""
    out, ok = [], True
    for label, o, t in rows:
        if isinstance(o, torch.Tensor):
            o, t = o.detach().float(), t.detach().float()
            if mask is not None and o.dim() == 2:
                o, t = o[mask.bool()], t[mask.bool()]
            diff, scale = float((o - t).abs().max()), float(t.abs().max())
            o, t = (float(o.abs().mean()), float(t.abs().mean())) if "mean |" in label else (float(o.mean()),
                                                                                          float(t.mean()))
        else:
            diff, scale = abs(o - t), abs(t)
        good = diff <= tol * max(1.0, scale)
        ok &= good
        out.append([label, o, t, diff, "ok" if good else "DIFFERS"])
    out += [[f"identical {label}", str(v), "", "", "ok" if v else "DIFFERS"] for label, v in same.items()]
    return out, ok and all(same.values())


def agreement_table(rows: list, tol: float = AGREEMENT_TOL) -> str:
    return table(["quantity", "ours", "TRL", "abs diff (largest element-wise)", f"within {tol:g} (relative above 1)"],
                 rows)


def grad_norm(*models) -> float:
    """L2 norm of all parameter gradients of `models` together (0 when none)."""
    gs = [p.grad.detach().flatten() for m in models for p in m.parameters() if p.grad is not None]
    return float(torch.cat(gs).norm()) if gs else 0.0


def lm_head_hook(model, hook):
    """`hook` on the model's LM head (it may edit the logits in place) until the returned handle's ``with`` ends."""
    from rlhf_lab.models.adapters import unwrap

    return unwrap(model).get_output_embeddings().register_forward_hook(hook)


def suppress_tokens(model, *ids: int):
    """While active, the LM head's logits of `ids` (EOS: every sampled response runs to full length) are −inf."""
    ids = list(ids)

    def hook(_module, _inputs, out):
        out[..., ids] = float("-inf")
        return out

    return lm_head_hook(model, hook)


@contextlib.contextmanager
def patched_sample(wrap):
    """``rlhf_lab.algorithms.ppo.sample`` called inside ``wrap(model, tok, prompts)`` (a context manager)."""
    from unittest.mock import patch

    from rlhf_lab.algorithms import ppo

    base = ppo.sample

    def sample(model, tok, prompts, *args, **kw):
        with wrap(model, tok, prompts):
            return base(model, tok, prompts, *args, **kw)

    with patch.object(ppo, "sample", sample):
        yield


@functools.cache
def mlflow_store() -> str:
    """A throw-away sqlite MLflow store for this process (the jobs log to ``sqlite:///mlflow.db``), removed at exit."""
    import mlflow

    folder = tempfile.mkdtemp(prefix="bench_mlflow_")
    atexit.register(shutil.rmtree, folder, True)
    mlflow.set_tracking_uri(f"sqlite:///{folder}/mlflow.db")
    mlflow.set_experiment("benchmarks")
    return folder


def mlflow_run():
    """An MLflow run to log into (``PPOModule`` logs its metrics at every step)."""
    import mlflow

    mlflow_store()
    return mlflow.start_run()


def rlhf_lab(args: list[str], cwd: Path, env: dict | None = None, timeout: float = 900,
             check: bool = True) -> tuple[float, subprocess.CompletedProcess]:
    """``rlhf-lab ARGS`` in `cwd` (`env`: variables over the environment; ``PYTHONPATH`` this checkout's by default):
    (wall seconds, the finished process); RuntimeError on a non-zero exit when `check`."""
    full = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    full.pop("MLFLOW_TRACKING_URI", None)
    Path(cwd).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "rlhf_lab.entry.run", *args], cwd=cwd, capture_output=True, text=True,
                       env=full, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"rlhf-lab {shlex.join(args)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    return time.perf_counter() - t0, r


def finished_job_runs(client, study: str) -> list:
    """The FINISHED job runs (tag ``rlhf_lab.job``) of `study` in `client`'s store, experiment ``rlhf-lab``."""
    exp = client.get_experiment_by_name("rlhf-lab")
    runs = client.search_runs([exp.experiment_id], f"tags.`rlhf_lab.study` = '{study}' and "
                              "tags.`rlhf_lab.job` = 'true'", max_results=1000)
    return [r for r in runs if r.info.status == "FINISHED"]


def cpu_seconds() -> tuple[float, float] | None:
    """(CPU seconds every process of this machine has used since boot, CPU seconds this process and its reaped
    descendants have used), from Linux's ``/proc/stat`` and ``os.times()``; None where there is no /proc/stat."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in first[1:9])
    t = os.times()
    return ((user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK"),
            t.user + t.system + t.children_user + t.children_system)


OTHERS_BUSY = 0.05  # the share of the cores' time other processes may use before a measurement is flagged


class CoreUse:
    """Whether other processes shared the cores during a measurement: the machine's busy CPU time minus this process
    tree's own (its jobs are waited for, so their time is ours), over wall time × cores. The load average cannot
    tell (a benchmark's own warm-up job raises it); it decides only without ``/proc/stat`` or when the benchmark has
    `detached` processes of its own (a daemon nobody waits for), whose time counts as others' (the line names them)."""

    def __init__(self, detached: str | None = None):
        self.t0, self.load0, self.cpu0, self.detached = time.time(), os.getloadavg()[0], cpu_seconds(), detached

    def machine_line(self) -> str:
        now = cpu_seconds()
        share = None if self.cpu0 is None or now is None else max(0.0, (now[0] - self.cpu0[0]) - (
            now[1] - self.cpu0[1])) / max(1e-9, (time.time() - self.t0) * (os.cpu_count() or 1))
        line = (f"- machine: {os.cpu_count()} CPU cores ({platform.machine()}, {platform.system()} "
                f"{platform.release()}), torch threads {torch.get_num_threads()}, load average {self.load0:.2f} at "
                f"the start, {os.getloadavg()[0]:.2f} at the end")
        if share is None:
            line += " (other processes' share of the cores not measured: no /proc/stat)"
        else:
            among = f", {self.detached} among them," if self.detached else ""
            line += f"; other processes{among} used {100 * share:.1f}% of the cores' time during the measurement"
        busy = self.load0 > 0.5 if share is None or self.detached else share > OTHERS_BUSY
        return line + (" — **other jobs shared the cores**: the wall times are upper bounds and the ratios noisy"
                       if busy else "")


def run_lines(started: datetime.datetime, secs: float, cmd: str, cores: CoreUse) -> list[str]:
    """The lines that open a section: date, command, machine, versions (`cores`: started with the measurement)."""
    import importlib.metadata as md

    machine, versions = cores.machine_line(), [f"python {platform.python_version()}"]
    for pkg in ("torch", "transformers", "trl", "accelerate", "lightning", "peft", "datasets", "mlflow"):
        try:
            versions.append(f"{pkg} {md.version(pkg)}")
        except md.PackageNotFoundError:
            versions.append(f"{pkg} not installed")
    return [f"- date: {started.strftime('%Y-%m-%d %H:%M:%S %Z').strip()} ({secs:.0f} s); command: `{cmd}`",
            machine, f"- versions: {', '.join(versions)}"]


def table(headers: list[str], rows: list[list]) -> str:
    """A markdown table; floats with 4 significant digits, NaN as n/a."""

    def cell(v) -> str:
        if isinstance(v, float):
            return "n/a" if v != v else f"{v:.4g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.2e}"
        return str(v)

    return "\n".join(["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
                     + ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows])


@dataclass
class Section:
    """One benchmark's output: a title, a note on what is measured and matched, tables, findings; `summary`: its
    row of results.md's summary (what, value, check); `ok`: False when an agreement check failed."""

    title: str
    note: str = ""
    tables: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    summary: list[str] | None = None
    ok: bool = True
    data: dict = field(default_factory=dict)
    t0: float = field(default_factory=time.time)

    def markdown(self, head: list[str] = ()) -> str:
        out = [f"## {self.title}", "", *head, ""] + ([self.note, ""] if self.note else [])
        for t in self.tables:
            out += [t, ""]
        out += [f"- {f}" for f in self.findings] + ([""] if self.findings else [])
        return "\n".join(out + [f"_({time.time() - self.t0:.0f} s)_"]) + "\n"


ORDER = ("dpo", "rm", "grpo", "sampling", "ppo", "ppo_steps", "memory", "memory_options", "sharding", "cpu_0.5b",
         "gpu_0.5b", "bounds_0.5b", "bounds_tiny", "scaling", "team", "suite", "suite_with")
TITLE = "# Benchmarks: rlhf-lab vs Hugging Face TRL, and operations"
INTRO = ("Generated from `benchmarks/results/*.json`: each benchmark run rewrites its own file and this document (do "
         "not edit it by hand). Absolute times drift with the machine's load; the ratios compare the sides measured in "
         "the same invocation, alternating, on the same weights, data and shapes. Each section opens with the run "
         "that wrote it. See benchmarks/README.md.")


def order_of(name: str) -> int:
    """A section's place in :data:`ORDER`: its own, or for a tagged variant ``NAME_TAG`` of a section in it (e.g.
    ``bounds_0.5b_bf16``, ``benchmarks.ops.bounds --set … --tag bf16``) that section's; ``len(ORDER)`` else."""
    if name in ORDER:
        return ORDER.index(name)
    bases = [b for b in ORDER if name.startswith(b + "_")]
    return ORDER.index(max(bases, key=len)) if bases else len(ORDER)


def render(folder: Path = RESULTS_DIR) -> str:
    """results.md from the JSON files of `folder`: the summary, then every section, in :data:`ORDER` (a tagged
    variant after its section, :func:`order_of`)."""
    res = {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")}
    names = sorted(res, key=lambda n: (order_of(n), n not in ORDER, n))
    rows = [[f"`{n}`", *res[n]["summary"]] for n in names if res[n].get("summary")]
    out = [TITLE, "", INTRO, "", "## Summary", "", table(["benchmark", "what", "value", "check"], rows)]
    return "\n".join(out + ["\n" + res[n]["markdown"].rstrip("\n") for n in names]) + "\n"


def save(name: str, markdown: str, summary=None, data=None, folder: Path = RESULTS_DIR,
         out: Path | None = None) -> Path:
    """Write `name`'s JSON into `folder` and regenerate `out` (``folder``'s sibling results.md by default) through a
    temporary file and a rename."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({"summary": summary, "markdown": markdown, "data": data or {}},
                                                    indent=1, ensure_ascii=False, default=float) + "\n")
    out = Path(out or folder.parent / "results.md")
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".results.", suffix=".md")
    with os.fdopen(fd, "w") as f:
        f.write(render(folder))
    os.replace(tmp, out)
    return out


def best_seconds(fn, repeats: int, warm: int = 1) -> float:
    """The least wall time of `repeats` calls of `fn`, after `warm` untimed calls."""
    for _ in range(warm):
        fn()
    secs = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        secs.append(time.perf_counter() - t)
    return min(secs)


def subset(ap: argparse.ArgumentParser, flag: str, value: str, known) -> list[str]:
    """The comma-separated names of `value` (option `flag` of `ap`), each one of `known`, else `ap`'s usage error."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    if set(names) - set(known):
        ap.error(f"{flag}: {', '.join(sorted(set(names) - set(known)))} not among {', '.join(known)}")
    return names


def main(prog: str, runners: dict, sizes: dict, argv: list[str] | None = None, setup=None) -> int:
    """The command of a group of world-model benchmarks: ``--quick``, ``--only``, ``--threads``, ``--results``.
    `runners`: {name: run(cfg, wm, work, **sizes[mode][name]) -> Section}; `setup(names)` runs first. Exit status 1
    when a check fails."""
    ap = argparse.ArgumentParser(prog=prog, description=sys.modules["__main__"].__doc__)
    ap.add_argument("--quick", action="store_true", help="tiny sizes and few steps: a smoke check")
    ap.add_argument("--only", default=",".join(runners), help=f"comma-separated subset of {','.join(runners)}")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, the project's trainer.threads)")
    ap.add_argument("--results", default=str(RESULTS_DIR), help="the folder of the results' JSON files; results.md "
                    "is written beside it")
    args = ap.parse_args(argv)
    only = subset(ap, "--only", args.only, runners)
    quiet()
    torch.set_num_threads(args.threads)
    if setup:
        setup(only)
    size = sizes["quick" if args.quick else "full"]
    work = Path(tempfile.mkdtemp(prefix="rlhf_bench_"))
    ok = True
    print(f"[benchmarks] {'quick' if args.quick else 'full'} run of {','.join(only)} ({args.threads} torch "
          f"thread(s)); work folder {work}", flush=True)
    try:
        cfg = compose([])  # policy=a_small, algo=ppo: the project's defaults
        wm = make_world_model(cfg, work / "world")
        for name in only:
            started, cores = datetime.datetime.now().astimezone(), CoreUse()
            sec = runners[name](cfg, wm, work, **size[name])
            cmd = f"{prog} --only {name}" + (" --quick" if args.quick else "") + (
                f" --threads {args.threads}" if args.threads != 1 else "")
            md = sec.markdown(run_lines(started, time.time() - sec.t0, cmd, cores))
            print("\n" + md, flush=True)
            out = save(name, md, sec.summary, sec.data, Path(args.results))
            print(f"[benchmarks] wrote {Path(args.results) / name}.json and {out}", flush=True)
            ok &= sec.ok
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1
