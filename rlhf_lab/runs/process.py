"""Process set-up shared by every entry point: the libraries' warnings silenced (:func:`quiet_libraries`), what a
sweep hands its jobs through the environment (here, not in ``tracking``: the sweep callback, which Hydra loads in
every run, then imports neither Lightning nor MLflow), atomic writes, the job's clock (``time/startup_s``,
``time/setup_s``) and the memory a finished stage leaves (:func:`release_memory`). A leaf module (it imports nothing
from rlhf_lab).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import sys
import time
from typing import Iterator


# {"process": when the process (a sweep worker's later job: the job) started, "job": when the CLI handed the checked
# config to the stage}, set by rlhf_lab.entry.run around the job (here: a joblib worker gets the CLI's task function
# pickled by value, its globals copied); empty when a stage is called directly
JOB_CLOCK: dict[str, float] = {}


JOBS_STARTED = [0]  # jobs this process has started (a sweep worker runs several)


def start_job_clock(entered: float) -> float:
    """Start the job's clock (now) and return it; `entered`: when the job entered the CLI. The process's start is
    ``rlhf_lab.STARTED`` (the package's first import) for its first job, `entered` for a warm worker's later ones."""
    now = time.time()
    first = JOBS_STARTED[0] == 0
    JOB_CLOCK.update(process=getattr(sys.modules.get("rlhf_lab"), "STARTED", entered) if first else entered, job=now)
    JOBS_STARTED[0] += 1
    return now


def stop_job_clock() -> None:
    """The job is over: a stage called later in this process (the API, a test) reports no start-up or setup."""
    JOB_CLOCK.clear()


def job_phases(now: float | None = None) -> dict[str, float]:
    """``time/startup_s`` (process start to the job's stage: imports, config composition and checks, the tracking
    store's first contact) and ``time/setup_s`` (from there to `now`, e.g. the start of training: the heavy imports,
    upstream stages built or loaded from the cache, models loaded), for what :data:`JOB_CLOCK` holds."""
    now = time.time() if now is None else now
    out = {}
    if "process" in JOB_CLOCK and "job" in JOB_CLOCK:
        out["time/startup_s"] = JOB_CLOCK["job"] - JOB_CLOCK["process"]
    if "job" in JOB_CLOCK:
        out["time/setup_s"] = now - JOB_CLOCK["job"]
    return out


# the folder a sweep was launched in, handed to its jobs (rlhf_lab/entry/sweeps.py): a job on a Ray or SLURM worker
# runs in another working folder, and the config's relative paths (cache_dir, a sqlite store) mean the launch's
LAUNCH_DIR_ENV = "RLHF_LAB_LAUNCH_DIR"


PARENT_ENV = "RLHF_LAB_PARENT_RUN_ID"  # set by the sweep callback (rlhf_lab/entry/sweeps.py) around every job


SWEPT_ENV = "RLHF_LAB_SWEPT_KEYS"


def release_memory() -> None:
    """Hand back what a finished stage left in this process before the next one starts: its objects in reference
    cycles (a Lightning trainer, its module and optimizer refer to each other, so a fit's model, gradients and
    optimizer states wait for the cyclic garbage collector, whose full passes are rare), then, with glibc, the heap's
    free pages (``malloc_trim(0)``; freed tensors below its mmap threshold stay in the heap otherwise). Measured after
    an upstream RM stage built in a PPO job's process (89.6M-parameter Qwen2): 2.45 GiB of RSS, 1.33 GiB after the
    collection, 0.67 GiB after the trim (0.61 GiB before the stage)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc (macOS, musl): the collection only
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def write_atomic(path: os.PathLike | str, data: bytes | str) -> None:
    """Write `data` to `path` through a uniquely named temporary file in the same folder (``mkstemp``: mode 0600,
    never through a symbolic link), flushed to disk, then renamed over `path` (a symbolic link there is replaced): a
    reader sees the old file or the new one, and a killed writer leaves no half file."""
    import tempfile

    path = os.fspath(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def environment(values: dict[str, str | None]) -> Iterator[None]:
    """`values` set in this process's environment while the block runs (the processes it starts inherit them; None
    unsets a variable), then the environment as it was."""
    saved = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def quiet_libraries() -> None:
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import warnings

    import lightning  # noqa: F401  (imported first: they set their loggers' levels on import)
    import mlflow  # noqa: F401
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    for name in ("lightning", "lightning.pytorch", "lightning.pytorch.utilities.rank_zero", "lightning.fabric",
                 "mlflow", "mlflow.store.db.utils", "mlflow.tracking.fluent", "alembic", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", category=FutureWarning)


def launch_path(path: str | os.PathLike) -> str:
    """A relative path of the config (``cache_dir``, a sqlite store's file) taken from the folder the sweep was
    launched in (``RLHF_LAB_LAUNCH_DIR``, set for its jobs) when there is one; otherwise unchanged (relative to
    the working folder, which is the launch folder)."""
    path = os.path.expanduser(str(path))
    base = os.environ.get(LAUNCH_DIR_ENV)
    return os.path.join(base, path) if base and not os.path.isabs(path) else path
