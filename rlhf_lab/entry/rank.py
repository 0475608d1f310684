"""One rank of a multi-process job started by :func:`rlhf_lab.runs.distributed.launch`:
``python -m rlhf_lab.entry.rank CONFIG OUT TARGET THREADS`` with ``LOCAL_RANK``/``RANK``/``WORLD_SIZE``/``MASTER_*``
in the environment. It loads the job's resolved config (``CONFIG``, YAML: the rank has no Hydra context) and calls
``TARGET`` (``module:name``, :func:`rlhf_lab.stages.pipeline.run_rank`) with it and the job's output folder.

A rank that finished its work ends with ``os._exit(0)`` (its output flushed), skipping the interpreter's teardown:
after a sharded (FSDP2, gloo) job, the process's exit with torch 2.13 sometimes aborts ("terminate called without an
active exception", exit -6, in the main thread with no Python frame left: native code's teardown), after the rank's work and
while rank 0 still writes the job's results, which the launcher's watchdog then stops as a failed rank: 2 of 16 tiny
``trainer=fsdp_cpu`` PPO jobs (test_preemption's) before this exit, 0 of 25 with it. A rank
whose work raised exits the normal way, with its traceback and a non-zero status."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from rlhf_lab.runs.process import quiet_libraries


def main(argv: list[str] | None = None) -> None:
    cfg_file, out_dir, target, threads = (argv if argv is not None else sys.argv[1:])
    quiet_libraries()
    torch.set_num_threads(int(threads))
    mod, attr = target.split(":")
    fn = getattr(importlib.import_module(mod), attr)
    try:
        fn(OmegaConf.load(cfg_file), Path(out_dir))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
