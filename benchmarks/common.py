"""Shared pieces of the benchmarks: config, the tiny world model on disk, preference pairs, clocks, tables.

Nothing here talks to a hub: the model is a family-``a`` (Llama-style) decoder with freshly initialised
weights and a tokenizer trained on world texts, saved with ``save_pretrained`` so that both sides of every
comparison load the very same weights with ``from_pretrained``.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

# ------------------------------------------------------------------------------------------------
# process setup


def quiet() -> None:
    """Silence the libraries' progress bars, advisories and warnings (the project's own recipe, plus TRL's)."""
    import logging

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


def set_threads(n: int) -> None:
    """torch intra-op threads for both sides (the project's default is ``trainer.threads: 1``)."""
    torch.set_num_threads(int(n))


def compose(overrides: list[str] | None = None):
    """The project's config composed with Hydra's compose API (as tests/conftest.py does)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_module("rlhf_lab.conf", version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides or []))


# ------------------------------------------------------------------------------------------------
# the model on disk


@dataclass
class WorldModel:
    """A tokenizer + causal LM folder (``lm``), a sequence-classifier (RM) folder of the same backbone (``rm``),
    and beside them ``lm_ref``: the same architecture with other random weights."""

    lm_dir: Path
    rm_dir: Path
    n_params: int
    arch: dict


def make_world_model(cfg, out_dir: Path, seed: int = 0, n_texts: int = 2000) -> WorldModel:
    """Train the family's tokenizer on world texts, build a randomly initialised model, save both.

    The RM folder holds the same backbone with a scalar head (``AutoModelForSequenceClassification``,
    ``num_labels=1``, the way ``rlhf_lab.models.families.load_sequence_scorer`` loads RMs); it is saved once so
    that the head's random initialisation is the same for every later load.
    """
    from rlhf_lab.world import streams as D
    from rlhf_lab.config import world as W
    from rlhf_lab.models import families as Fm

    pc = cfg.policy
    out_dir = Path(out_dir)
    lm_dir, rm_dir = out_dir / "lm", out_dir / "rm"
    corpus = D.reviews(W.world_settings(cfg), f"pretrain_{pc.family}", n_texts)
    tok = Fm.train_tokenizer(str(pc.family), [p + " " + r for p, r in corpus], int(pc.vocab_size))
    torch.manual_seed(seed)
    model = Fm.build_model(str(pc.family), pc.arch, tok)
    tok.save_pretrained(lm_dir)
    model.save_pretrained(lm_dir)
    torch.manual_seed(seed + 100)  # another random model of the same shape: a non-trivial DPO reference
    Fm.build_model(str(pc.family), pc.arch, tok).save_pretrained(out_dir / "lm_ref")
    torch.manual_seed(seed + 1)
    rm = Fm.load_sequence_scorer(lm_dir, tok)
    tok.save_pretrained(rm_dir)
    rm.save_pretrained(rm_dir)
    return WorldModel(lm_dir, rm_dir, Fm.n_params(model), dict(pc.arch))


def load_tokenizer(path: Path):
    from rlhf_lab.models import families as Fm

    return Fm.load_tokenizer(path)


# ------------------------------------------------------------------------------------------------
# data


def make_pairs(cfg, n: int, seed: int = 0):
    """`n` preference pairs from the world: two world responses per prompt, labelled by the config's labeler.

    (The project samples the two responses from the SFT policy; world texts have the same grammar and
    length distribution, and need no trained model.)
    """
    from rlhf_lab.config import world as W
    from rlhf_lab.world import streams as D
    from rlhf_lab.config import data as DS
    from rlhf_lab.data.preferences import label_pairs
    from rlhf_lab.world import ReviewGenerator

    gen = ReviewGenerator(D.stream_seed(cfg.world.seed, f"bench_pairs/{seed}"), W.world_spec(cfg))
    prompts, a, b = [], [], []
    while len(prompts) < n:
        p = gen.prompt()
        ra, rb = gen.response(p), gen.response(p)
        if ra != rb:
            prompts.append(p)
            a.append(ra)
            b.append(rb)
    ended = [True] * n
    pairs = label_pairs(DS.labelling(cfg), prompts, a, b, ended, ended, random.Random(seed), "world")
    assert len(pairs) == n
    return pairs


# ------------------------------------------------------------------------------------------------
# clocks


@dataclass
class StepClock:
    """Wall-clock timestamps at the end of each optimizer step; the rate is taken after `warmup` steps.

    The interval between two consecutive step ends holds everything a step costs in its trainer: fetching
    and collating the batch, forward, backward, optimizer and scheduler step, metric logging.
    """

    warmup: int
    stamps: list[float] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)

    def tick(self) -> None:
        self.stamps.append(time.perf_counter())
        self.threads.append(torch.get_num_threads())

    def step_times(self) -> list[float]:
        s = self.stamps[self.warmup - 1 :] if self.warmup > 0 else self.stamps
        return [b - a for a, b in zip(s, s[1:])]

    def seconds(self) -> float:
        """Total time of the timed steps (after warm-up)."""
        return sum(self.step_times())

    def n_timed(self) -> int:
        return len(self.step_times())


class PhaseTimer:
    """Accumulates wall time per named phase; `wrap(fn, phase)` times every call of fn.

    `end_step()` closes a step: its totals go to `steps` (one dict per timed step) and start again from 0.
    """

    def __init__(self):
        self.totals: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.steps: list[dict[str, float]] = []
        self.enabled = True

    def add(self, phase: str, dt: float) -> None:
        if self.enabled:
            self.totals[phase] = self.totals.get(phase, 0.0) + dt
            self.counts[phase] = self.counts.get(phase, 0) + 1

    @contextlib.contextmanager
    def phase(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def wrap(self, fn, phase):
        """fn timed under `phase` (a name, or a callable of no arguments returning the name at call time)."""

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(phase() if callable(phase) else phase, time.perf_counter() - t0)

        return timed

    def proxy(self, obj, phase: str):
        """`obj` with its calls timed under `phase`; its other attributes (``.to``, ``.members``, …) pass through."""
        return _TimedProxy(obj, self.wrap(obj, phase))

    def end_step(self, **extra: float) -> None:
        if self.enabled:
            self.steps.append({**self.totals, **extra})
        self.totals.clear()
        self.counts.clear()

    def medians(self) -> dict[str, float]:
        """Median over the timed steps of every phase (0 for a step where a phase did not occur): robust to the
        occasional step slowed down by another process on a shared machine."""
        keys = {k for st in self.steps for k in st}
        return {k: median(st.get(k, 0.0) for st in self.steps) for k in keys}


class _TimedProxy:
    def __init__(self, obj, timed_call):
        self._obj, self._call = obj, timed_call

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._obj, name)


def with_rest(phases: list[dict], step_times: list[float], keys: tuple[str, ...] | None = None) -> list[dict]:
    """Each timed step's phases (only `keys`, 0 where missing, when given), plus ``step`` (the interval between step
    ends) and ``update`` = step − the others."""
    out = []
    for ph, dt in zip(phases, step_times):
        if keys is not None:
            ph = {k: ph.get(k, 0.0) for k in keys}
        out.append({**ph, "step": dt, "update": dt - sum(ph.values())})
    return out


def phase_medians(clocks: dict, phases) -> tuple[dict, str]:
    """The median seconds of each phase (`phases`: (key, label) pairs) over the timed steps of every side's clocks
    (``{"ours": [...], "trl": [...]}``, each with ``phases``), and the "where the time goes" table of the two."""
    med = {side: {k: median(ph[k] for c in cs for ph in c.phases) for k, _ in phases} for side, cs in clocks.items()}
    text = ("Where the time goes, median ms per step over the timed steps of all rounds (the phases' medians need not "
            "add up to the step's):\n\n" + table(
                ["phase", "ours ms", "TRL ms", "ratio ours/TRL"],
                [[label, 1000 * med["ours"][k], 1000 * med["trl"][k], med["ours"][k] / med["trl"][k]]
                 for k, label in phases]))
    return med, text


def identical_rows(same: dict[str, bool]) -> tuple[list[list], bool]:
    """The agreement table's rows for inputs both sides must share exactly ({what: identical?}), and whether all are."""
    rows = [[f"identical {label}", str(v), "", "", "ok" if v else "DIFFERS"] for label, v in same.items()]
    return rows, all(same.values())


def median(xs) -> float:
    xs = list(xs)
    return statistics.median(xs) if xs else float("nan")


# ------------------------------------------------------------------------------------------------
# output


def table(headers: list[str], rows: list[list]) -> str:
    """A markdown table; floats are printed with 4 significant digits."""

    def cell(v) -> str:
        if isinstance(v, float):
            if v != v:
                return "n/a"
            return f"{v:.4g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.2e}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


@dataclass
class Section:
    """One benchmark's output: a title, a short note on what is measured and matched, tables, findings."""

    title: str
    note: str = ""
    tables: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    data: dict = field(default_factory=dict)  # headline numbers for the summary
    run: str = ""  # the run that wrote it (its date), set when the results file is written

    def markdown(self) -> str:
        out = [f"## {self.title}", ""]
        if self.note:
            out += [self.note, ""]
        for t in self.tables:
            out += [t, ""]
        for f in self.findings:
            out.append(f"- {f}")
        if self.findings:
            out.append("")
        out.append(f"_({self.seconds:.0f} s" + (f"; run of {self.run}" if self.run else "") + ")_")
        return "\n".join(out) + "\n"


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
    """Whether other processes shared the cores while a benchmark measured: the machine's busy CPU time minus this
    process tree's own (its jobs are waited for, so their CPU time is counted as ours), over the measurement's
    wall time × cores. The load average alone cannot tell: a benchmark's own warm-up job raises it. Where there is
    no ``/proc/stat`` only the load average is reported. `detached`: the benchmark's own processes that run detached
    (a daemon nobody waits for, e.g. ``pg_ctl``'s PostgreSQL), whose time counts as others': the line names them
    and the flag falls back on the load average at the start."""

    def __init__(self, detached: str | None = None):
        self.t0, self.load0, self.cpu0, self.detached = time.time(), os.getloadavg()[0], cpu_seconds(), detached

    def others_share(self) -> float | None:
        """Other processes' CPU time since the start ÷ (wall time × cores); None without /proc/stat."""
        now = cpu_seconds()
        if self.cpu0 is None or now is None:
            return None
        others = (now[0] - self.cpu0[0]) - (now[1] - self.cpu0[1])
        return max(0.0, others) / max(1e-9, (time.time() - self.t0) * (os.cpu_count() or 1))

    def busy(self, share: float | None) -> bool:
        """Whether to flag the measurement: other processes' `share` (:meth:`others_share`) above
        :data:`OTHERS_BUSY`; where the share is unknown or holds detached processes of the benchmark's own, the load
        average at the start above 0.5."""
        if share is None or self.detached:
            return self.load0 > 0.5
        return share > OTHERS_BUSY

    def machine_line(self) -> str:
        """The results file's machine line: cores, load averages, other processes' share, and the flag."""
        share = self.others_share()
        line = (f"- machine: {os.cpu_count()} CPU cores, load average {self.load0:.2f} at the start, "
                f"{os.getloadavg()[0]:.2f} at the end")
        if share is None:
            line += " (other processes' share of the cores not measured: no /proc/stat)"
        else:
            among = f", {self.detached} among them," if self.detached else ""
            line += f"; other processes{among} used {100 * share:.1f}% of the cores' time during the measurement"
        return line + (" — **other jobs shared the cores**: the wall times are upper bounds and the ratios noisy"
                       if self.busy(share) else "")


def run_lines(started, secs: float, cmd: str, cores: CoreUse) -> list[str]:
    """The date and machine lines that open a standalone benchmark's section of results.md (`cores`: started
    with the measurement)."""
    return [f"- date: {started.strftime('%Y-%m-%d %H:%M:%S %Z').strip()} ({secs:.0f} s); command: `{cmd}`",
            cores.machine_line()]


# ------------------------------------------------------------------------------------------------
# the job runs of a sweep the standalone benchmarks launched (benchmarks.team, benchmarks.suite)


def finished_job_runs(client, study: str) -> list:
    """The FINISHED job runs (tag ``rlhf_lab.job``) of `study` in `client`'s store, experiment ``rlhf-lab``."""
    exp = client.get_experiment_by_name("rlhf-lab")
    runs = client.search_runs([exp.experiment_id], f"tags.`rlhf_lab.study` = '{study}' and "
                              "tags.`rlhf_lab.job` = 'true'", max_results=1000)
    return [r for r in runs if r.info.status == "FINISHED"]


# ------------------------------------------------------------------------------------------------
# sections of results.md written by the standalone benchmarks (benchmarks.team, benchmarks.suite)


def marked_section(text: str, begin: str, end: str) -> str:
    """The block from the marker `begin` to the marker `end` in `text` (markers included), or ''."""
    m = re.search(re.escape(begin) + ".*?" + re.escape(end), text, re.S)
    return m.group(0) if m else ""


def write_marked_section(path: Path, begin: str, end: str, section: str) -> None:
    """Replace the `begin` … `end` block of `path` with `section` (or append it), through a temporary file in the
    same folder and a rename."""
    import tempfile

    old = path.read_text() if path.exists() else ""
    new = old.replace(marked_section(old, begin, end), section) if begin in old else old.rstrip("\n") + "\n\n" + section + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".results.", suffix=".md")
    with os.fdopen(fd, "w") as f:
        f.write(new)
    os.replace(tmp, path)

