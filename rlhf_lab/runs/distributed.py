"""Multi-process training: launching the ranks of one job, and what each rank may do.

A job with ``trainer.devices > 1`` runs as one process per device: on one machine :func:`launch` starts ranks
1..N-1 (``python -m rlhf_lab.entry.rank``, the job's resolved config) and runs rank 0 itself; under ``torchrun`` or
SLURM every process runs ``rlhf-lab`` itself and :func:`launch` starts nothing. Lightning's DDP strategy joins them.
The rules every stage follows:

- only the job stage is distributed: rank 0 alone builds the upstream stages (:func:`single_process`) while the
  other ranks wait for the artifact in the cache;
- only rank 0 talks to MLflow, evaluates and publishes the artifact; the others write into ``<output>/.rank<r>``;
- ``batch_size`` keys are global: each of N ranks trains on its 1/N slice of each batch
  (:class:`GlobalBatchSampler`), so a run on N processes sees the same batches as a run on one.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Iterator

import torch

from rlhf_lab.runs.process import environment

_ENV = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK")


def rank() -> int:
    """Global rank of this process (0 when not distributed)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    for var in ("RANK", "SLURM_PROCID"):
        if os.environ.get(var) is not None and (var != "SLURM_PROCID" or int(os.environ.get("SLURM_NTASKS", "1")) > 1):
            return int(os.environ[var])
    return 0


def world_size() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    if os.environ.get("WORLD_SIZE"):
        return int(os.environ["WORLD_SIZE"])
    if os.environ.get("SLURM_NTASKS") and int(os.environ["SLURM_NTASKS"]) > 1:
        return int(os.environ["SLURM_NTASKS"])
    return 1


def is_rank_zero() -> bool:
    return rank() == 0


def work_device(t: dict) -> torch.device:
    """Where a stage's work outside Lightning runs (the prefs stage's sampling, best-of-n): this process's GPU when
    the ``trainer`` settings `t` (plain) ask for one (``accelerator`` gpu, cuda or auto) and one is visible, else the
    CPU. Lightning places the trained stages itself."""
    if str(t.get("accelerator", "cpu")) in ("gpu", "cuda", "auto") and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def n_processes(t: dict) -> int:
    """Processes of the job the ``trainer`` settings `t` (plain) ask for (1 unless ``devices`` > 1 with a DDP-type
    strategy), over all nodes."""
    devices = t.get("devices", 1)
    if devices in (None, "auto"):
        return 1
    if devices == -1:
        devices = torch.cuda.device_count() if t.get("accelerator") in ("gpu", "cuda") else (os.cpu_count() or 1)
    if isinstance(devices, (list, tuple)):
        devices = len(devices)
    n = int(devices)
    if n > 1 and str(t.get("strategy", "auto")) in ("auto", "single_device"):
        raise ValueError(f"trainer.devices={n} needs a multi-process strategy: set trainer.strategy=ddp "
                         "(or use the presets trainer=ddp_cpu / ddp / fsdp / deepspeed)")
    return n * int(t.get("num_nodes", 1) or 1)


def rendezvous_port() -> int:
    """A free port for the ranks' rendezvous, which rank 0's store binds seconds later (after its imports): drawn at
    random below Linux's ephemeral range (32768-60999), so that no port the kernel hands out meanwhile (a bind to port
    0, an outgoing connection, another job's gloo listener) can take it; the kernel's choice where none is free."""
    for port in random.SystemRandom().sample(range(20000, 32768), 64):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Watchdog(threading.Thread):
    """Stops rank 0 when another rank dies: otherwise rank 0 would wait for it in a collective (or the
    process-group rendezvous) until the 30-minute timeout. First a KeyboardInterrupt (the run is marked
    FAILED), then, if rank 0 is stuck in native code, the process exits."""

    def __init__(self, children: list[subprocess.Popen], grace_s: float = 30.0):
        super().__init__(daemon=True, name="rlhf-lab-rank-watchdog")
        self.children, self.grace_s, self.done = children, grace_s, threading.Event()
        self.fired: list[tuple[int, int]] = []

    def run(self) -> None:
        while not self.done.wait(1.0):
            dead = [(r, c.returncode) for r, c in enumerate(self.children, 1) if c.poll() not in (None, 0)]
            if dead:
                self.fired = dead
                print(f"[rlhf-lab] rank(s) {dead} exited with an error (rank, exit code); stopping the job",
                      file=sys.stderr, flush=True)
                _thread.interrupt_main()
                if not self.done.wait(self.grace_s):
                    os._exit(1)
                return


def launch(trainer: dict, out_dir: Path, target: Callable[[Path], dict], rank_target: str,
           config_yaml: Callable[[], str]) -> dict:
    """Run the job on every rank: ``target(out_dir)`` here (rank 0), and in each other local rank `rank_target`
    (``module:name``, called by :mod:`rlhf_lab.entry.rank` with the config `config_yaml()` and `out_dir`); returns
    rank 0's result. Starts the other ranks only when nothing else (torchrun, SLURM) has; with one process it is a
    plain call. `trainer`: the ``trainer`` settings (plain)."""
    n = n_processes(trainer)
    external = os.environ.get("LOCAL_RANK") is not None or world_size() > 1
    if n <= 1 or external:
        return target(out_dir)
    if int(trainer.get("num_nodes", 1) or 1) > 1:
        raise ValueError("trainer.num_nodes > 1: start one rlhf-lab per node with torchrun or srun (SLURM); "
                         "rlhf-lab starts the ranks itself only on one machine")
    env = {"WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(rendezvous_port()), "NODE_RANK": "0"}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg_file = out_dir / ".rank_config.yaml"  # resolved here: the other ranks have no Hydra context
    cfg_file.write_text(config_yaml())
    # plain subprocesses, not multiprocessing: they start the same from a joblib (loky) worker of a sweep
    cmd = [sys.executable, "-m", "rlhf_lab.entry.rank", str(cfg_file), str(out_dir), rank_target,
           str(torch.get_num_threads())]
    children: list[subprocess.Popen] = []
    watchdog = _Watchdog(children)
    sigint = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is threading.main_thread() and sigint in (signal.SIG_IGN, signal.SIG_DFL, None):
        # the watchdog stops rank 0 through SIGINT (interrupt_main), which does nothing where SIGINT is ignored,
        # as in any process started in the background by a non-interactive shell (`... &`, nohup)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for r in range(1, n):
            children.append(subprocess.Popen(cmd, env={**os.environ, **env, "LOCAL_RANK": str(r), "RANK": str(r)}))
        with environment({**env, "LOCAL_RANK": "0", "RANK": "0"}):
            watchdog.start()
            try:
                result = target(out_dir)
                codes = [c.wait() for c in children]
            except KeyboardInterrupt:
                if watchdog.fired:  # a failure of this job (a sweep goes on), not a user's Ctrl-C
                    raise RuntimeError(f"rank(s) {watchdog.fired} of the job exited with an error (rank, exit code); "
                                       "see their output above") from None
                raise
        failed = [(r, code) for r, code in enumerate(codes, 1) if code != 0]
        if failed:
            raise RuntimeError(f"rank(s) {failed} of the job exited with an error (rank, exit code); see their output above")
        return result
    finally:
        watchdog.done.set()
        if signal.getsignal(signal.SIGINT) is not sigint and sigint is not None:
            signal.signal(signal.SIGINT, sigint)
        for c in children:
            if c.poll() is None:
                c.kill()
        if torch.distributed.is_initialized():  # the next job of a sweep may start its own group
            torch.distributed.destroy_process_group()
        cfg_file.unlink(missing_ok=True)


@contextlib.contextmanager
def single_process() -> Iterator[None]:
    """Inside, this process is a job of its own (rank 0 of 1): the upstream stages that rank 0 builds alone for a
    multi-process job train on whole batches, as a one-process job builds them (the same cache key, the same
    artifact). Before the job's process group starts only: the distributed variables are hidden meanwhile."""
    with environment(dict.fromkeys((*_ENV, "SLURM_PROCID", "SLURM_NTASKS"))):
        yield


def rank_out_dir(out_dir: Path) -> Path:
    """Where this rank writes its artifact: the job's folder on rank 0, a scratch sub-folder elsewhere."""
    if is_rank_zero():
        return Path(out_dir)
    d = Path(out_dir) / f".rank{rank()}"
    d.mkdir(parents=True, exist_ok=True)
    return d


class GlobalBatchSampler(torch.utils.data.Sampler):
    """Batches of ``batch_size`` examples (the global batch) in a seeded random order; each rank yields its strided
    slice ``batch[rank::world_size]``. With one process it yields what ``DataLoader(shuffle=True, generator=g)``
    does, so single-process results do not depend on whether the job could have been distributed."""

    def __init__(self, n: int, batch_size: int, generator: torch.Generator, drop_last: bool = False,
                 rank_: int | None = None, world: int | None = None, key: str = "batch_size"):
        self.world = world_size() if world is None else world
        self.rank = rank() if rank_ is None else rank_
        if batch_size % self.world:
            raise ValueError(f"{key}={batch_size} is the global batch and must be a multiple of the number of "
                             f"processes ({self.world}); set {key} to a multiple of {self.world}")
        self.batches = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(range(n), generator=generator),
                                                     batch_size, drop_last)

    def __iter__(self) -> Iterator[list[int]]:
        for b in self.batches:
            yield b[self.rank :: self.world]

    def __len__(self) -> int:
        return len(self.batches)


def loader(examples, batch_size: int, generator: torch.Generator, collate_fn, drop_last: bool = False,
           key: str = "batch_size") -> torch.utils.data.DataLoader:
    """A training DataLoader over ``examples`` with a global ``batch_size`` (see :class:`GlobalBatchSampler`)."""
    sampler = GlobalBatchSampler(len(examples), batch_size, generator, drop_last, key=key)
    # the generator also seeds the loader's base seed, as with shuffle=True: the same stream as a plain DataLoader
    return torch.utils.data.DataLoader(examples, batch_sampler=sampler, collate_fn=collate_fn, generator=generator)


def all_reduce_mean(values: dict[str, float]) -> dict[str, float]:
    """The mean over ranks of each value (same keys on every rank); identity when not distributed."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()) or world_size() == 1:
        return values
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    torch.distributed.all_reduce(t)
    t /= world_size()
    return dict(zip(keys, t.tolist()))


def replicated_params(module: torch.nn.Module) -> list[torch.Tensor]:
    """The trainable parameters every rank holds whole (not the shards of ``trainer=fsdp``, DTensors)."""
    from torch.distributed.tensor import DTensor

    return [p for p in module.parameters() if p.requires_grad and not isinstance(p, DTensor)]


def gather_objects(obj) -> list:
    """`obj` of every rank, in rank order (``[obj]`` when not distributed). Every rank must call it."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()) or world_size() == 1:
        return [obj]
    out: list = [None] * world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def own(per_rank, what: str):
    """This rank's entry of a list :func:`gather_objects` made (a value that is not a list: every rank's)."""
    if not isinstance(per_rank, list):
        return per_rank
    if len(per_rank) != world_size():
        raise ValueError(f"{what} was saved by {len(per_rank)} process(es), this job runs {world_size()}: resume it "
                         f"with trainer.devices={len(per_rank)}")
    return per_rank[rank()]


def check_in_sync(module: torch.nn.Module, what: str) -> None:
    """Raise if the trainable parameters differ across ranks (e.g. gradients that were not all-reduced)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()) or world_size() == 1:
        return
    if not replicated_params(module):  # sharded: each rank holds its own slice, kept consistent by FSDP
        return
    with torch.no_grad():  # sum of |p|: equal on every rank when the gradients were in sync
        c = torch.stack([p.detach().double().abs().sum() for p in replicated_params(module)]).sum().reshape(1)
    lo, hi = c.clone(), c.clone()
    torch.distributed.all_reduce(lo, op=torch.distributed.ReduceOp.MIN)
    torch.distributed.all_reduce(hi, op=torch.distributed.ReduceOp.MAX)
    if (hi - lo).abs().item() > 1e-6 * max(1.0, abs(hi.item())):
        raise RuntimeError(f"{what}: parameters differ across ranks after training ({lo.item()} vs {hi.item()}); "
                           "gradients were not synchronised")

