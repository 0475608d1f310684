"""``trainer.accelerator`` and ``trainer.devices``: the values Lightning and rlhf-lab's launcher take
(:func:`check_accelerator`, :func:`check_devices`, part of :func:`rlhf_lab.config.checks.validate`), and what the job
asks of the machine it runs on (:func:`check_machine`: a GPU where torch sees none, more GPUs or other ids than it
has, more CPU processes than cores), which the CLI checks where the job runs. Each raises a one-line
:class:`~rlhf_lab.config.errors.ConfigError`."""

from __future__ import annotations

import os

from omegaconf import DictConfig, ListConfig

from rlhf_lab.config.errors import ConfigError
from rlhf_lab.config.rules import choice, get


def check_accelerator(t: DictConfig) -> None:
    """``trainer.accelerator``: one of Lightning's names (its AcceleratorRegistry's, and its aliases gpu and auto)."""
    if get(t, "accelerator") is None or str(get(t, "accelerator")) in ("cpu", "gpu", "auto"):
        return
    from lightning.pytorch.accelerators import AcceleratorRegistry  # here: Lightning's import is the job's

    choice(t, "trainer", "accelerator", ("cpu", "gpu", "auto",
                                         *sorted(set(AcceleratorRegistry.available_accelerators()) - {"cpu"})))


DEVICES = ">= 1 (processes or GPUs), -1 (every GPU), 'auto' or a list of ids"


def device_ids(n):
    """``trainer.devices`` as Lightning reads it: an int, ``auto``, or a list of ids (a string of digits is a count,
    ``"0,1"`` a list); None for what is none of these (``abc``, ``1.5``, ``True``)."""
    if isinstance(n, str):
        text = n.strip()
        if text == "auto" or text.lstrip("-").isdigit():
            return "auto" if text == "auto" else int(text)
        parts = [x.strip() for x in text.split(",") if x.strip()]
        return [int(x) for x in parts] if "," in text and parts and all(x.isdigit() for x in parts) else None
    if isinstance(n, int) and not isinstance(n, bool):
        return n
    if isinstance(n, (list, tuple, ListConfig)):
        ids = list(n)
        return ids if all(isinstance(i, int) and not isinstance(i, bool) for i in ids) else None
    return None


def check_devices(t: DictConfig) -> None:
    """``trainer.devices``: a count ≥ 1, ``auto``, a list of distinct device ids ≥ 0, or -1: Lightning's every device,
    which is every GPU; with ``accelerator=cpu`` Lightning takes only a count of processes, so -1 or a list there is an
    error, and more than one device needs a multi-process strategy (:func:`rlhf_lab.runs.distributed.n_processes`).
    What this machine has (its GPUs) is :func:`check_machine`'s."""
    given = get(t, "devices")
    n = device_ids(given)
    cpu = str(get(t, "accelerator")) == "cpu"
    if n is None or (isinstance(n, list) and not n):
        raise ConfigError("trainer.devices", given if not isinstance(given, ListConfig) else list(given), DEVICES)
    if isinstance(n, list) and (cpu or min(n) < 0 or len(set(n)) < len(n)):
        raise ConfigError("trainer.devices", list(n), "a number of processes >= 1 with trainer.accelerator=cpu (a "
                          "list of ids names GPUs: trainer=gpu or trainer=ddp)" if cpu else
                          "a list of distinct GPU ids >= 0 (each device once)")
    if n == -1 and cpu:
        raise ConfigError("trainer.devices", n, "a number of processes >= 1 with trainer.accelerator=cpu (-1, every "
                          "device, means every GPU: trainer=gpu or trainer=ddp)")
    if isinstance(n, int) and (n == 0 or n < -1):
        raise ConfigError("trainer.devices", n, DEVICES)
    count = len(n) if isinstance(n, list) else n if isinstance(n, int) else 1
    check_processes(t, count)


def check_processes(t: DictConfig, count: int) -> None:
    """More than one device runs a process on each, which only a multi-process strategy joins (the rule of
    :func:`rlhf_lab.runs.distributed.n_processes`, read from it)."""
    if count <= 1:
        return
    from rlhf_lab.runs.distributed import n_processes  # here: torch's import is the job's, not the sweep's

    try:
        n_processes({"devices": count, "strategy": "ddp" if isinstance(t.get("strategy"), DictConfig) else
                     str(get(t, "strategy") or "auto"), "accelerator": str(get(t, "accelerator"))})
    except ValueError:
        raise ConfigError("trainer.devices", count, f"1 with trainer.strategy={get(t, 'strategy')} (more devices are "
                          "more processes, which need a multi-process strategy: trainer=ddp_cpu, ddp, fsdp or "
                          "deepspeed, or trainer.strategy=ddp)") from None


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity, where the system has one; else the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_machine(cfg: DictConfig) -> None:
    """What the job asks of this machine, checked where it runs (the CLI, after :func:`validate`): a GPU accelerator
    on a machine where torch sees none, more GPUs than it has, a GPU id it does not have, or more CPU processes
    (``trainer=ddp_cpu trainer.devices=99``) than it has cores."""
    t = cfg.get("trainer")
    if not isinstance(t, DictConfig):
        return
    accelerator = str(get(t, "accelerator"))
    if accelerator == "cpu":
        n, cores = device_ids(get(t, "devices")), cpu_cores()
        if isinstance(n, int) and n > cores:
            raise ConfigError("trainer.devices", n, f"<= {cores}, the CPU cores this machine gives the job (each "
                              "device is a process with trainer.accelerator=cpu)")
        return
    if accelerator not in ("gpu", "cuda", "mps"):
        return
    import torch

    if accelerator == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError("trainer.accelerator", accelerator, "cpu or auto on this machine, which has no MPS "
                              "device torch can use (trainer=cpu)")
        return
    gpus = torch.cuda.device_count()
    if gpus == 0:
        raise ConfigError("trainer.accelerator", accelerator, "cpu or auto on this machine, which has no GPU torch can "
                          "use (torch.cuda.device_count() is 0): trainer=cpu, or run the job where there is one")
    n = device_ids(get(t, "devices"))
    if isinstance(n, int) and n > gpus:
        raise ConfigError("trainer.devices", n, f"<= {gpus}, the GPUs this machine has (or -1: every GPU)")
    if isinstance(n, list) and max(n) >= gpus:
        raise ConfigError("trainer.devices", list(n), f"GPU ids in [0, {gpus}), the GPUs this machine has")
    if n == -1:
        check_processes(t, gpus)
