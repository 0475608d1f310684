"""Checkpoints a job cannot use, as the user sees them: :class:`CheckpointError`, one line naming the config key, the
folder and what is wrong with it (the CLI prints it and exits 2, as any config error).

A checkpoint folder is broken when it is missing or empty, has no tokenizer, a config.json without weights, an invalid
config.json, or weights that do not fit the model its config.json describes, which transformers loads quietly (the
missing weights newly initialised, the others dropped): :func:`check_loaded` reads its loading report. Refused before
anything is read: a model this machine's memory cannot hold (:func:`too_large`; a ``vocab_size`` of 4e8 once tried to
allocate 51 GB), and a training checkpoint ``torch.load(weights_only=True)`` cannot read (:func:`check_weights_only`:
unpickling it could run code). :mod:`rlhf_lab.models.families` loads through these checks.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

from rlhf_lab.config.errors import ConfigError

FOLDER_FIX = "point {key} at a folder written by save_pretrained (config.json, its weights and the tokenizer files)"
WEIGHT_FILES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)  # transformers' names
# a tokenizer's files: a fast tokenizer's tokenizer.json, else its config and vocabulary (vocab.*, merges.txt, a
# SentencePiece *.model)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "merges.txt")
N_EXAMPLES = 2  # weight names quoted in a message


class CheckpointError(ConfigError):
    """A checkpoint (a folder or hub name given by a config key) that cannot be used as it is: ``str(err)`` is one
    line, ``<key>='<folder>': <problem>; <fix>``. A :class:`~rlhf_lab.config.errors.ConfigError`: the CLI prints it
    and exits with status 2."""

    def __init__(self, key: str, where: Any, problem: str, fix: str | None = None) -> None:
        self.key, self.value, self.allowed, self.problem = key, str(where), fix, problem
        ValueError.__init__(self, f"{key}={str(where)!r}: {problem}" + (f"; {fix}" if fix else ""))

    def __reduce__(self):  # pickled with its own arguments (a multirun's launcher may send it to another process)
        return type(self), (self.key, self.value, self.problem, self.allowed)


class CheckpointNotFound(CheckpointError, FileNotFoundError):
    """No checkpoint where the key points: no such folder, a folder without a checkpoint, a hub name this machine
    cannot load. Also a FileNotFoundError (and so an OSError)."""


def folder_fix(key: str) -> str:
    """The fix of a broken checkpoint folder named by `key`."""
    return FOLDER_FIX.format(key=key)


def local_folder(name_or_path: Any) -> Path | None:
    """`name_or_path` as a folder when it is one on this machine, else None (a hub name)."""
    p = Path(str(name_or_path)).expanduser()
    return p if p.is_dir() else None


def has_tokenizer_files(folder: Any) -> bool:
    """Whether a folder holds a tokenizer's files (:data:`TOKENIZER_FILES`, or a SentencePiece ``*.model``)."""
    return any(f.name in TOKENIZER_FILES or f.suffix == ".model" for f in Path(folder).expanduser().iterdir())


def weights_file(name_or_path: Any) -> str:
    """The name of the weights file(s) of a checkpoint, for a message: the first of :data:`WEIGHT_FILES` in the
    folder (``model.safetensors``), else ``its weights``."""
    folder = local_folder(name_or_path)
    found = [f for f in WEIGHT_FILES if folder is not None and (folder / f).is_file()]
    return found[0] if found else "its weights"


def is_new_head(name: str, model) -> bool:
    """Whether a weight name lies outside the model's backbone (``model.base_model_prefix``): a task head, such as the
    scalar ``score``/``classifier`` head of a sequence classifier or a causal LM's ``lm_head``/``embed_out``."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    return bool(prefix) and not name.startswith(prefix + ".")


def count(n: int, what: str = "weight") -> str:
    """``1 weight``, ``2 weights``."""
    return f"{n} {what}{'' if n == 1 else 's'}"


def examples(names) -> str:
    """The first :data:`N_EXAMPLES` of some weight names (sorted), for a message."""
    names = sorted(names)
    more = ", ..." if len(names) > N_EXAMPLES else ""
    return ", ".join(names[:N_EXAMPLES]) + more


def load_problems(info: dict, model, new_head: bool = False) -> list[str]:
    """What transformers' loading report `info` (``output_loading_info=True``) says is wrong with the weights of
    `model`, as phrases for one line; empty when the checkpoint fits. ``new_head``: the model is a sequence classifier
    built from a backbone checkpoint, whose head outside the backbone may be missing (newly initialised) and whose
    own heads outside the backbone may be unexpected (dropped). Tied weights are not in the report (transformers ties
    them after loading)."""
    allowed = (lambda name: is_new_head(name, model)) if new_head else (lambda name: False)
    missing = [k for k in info.get("missing_keys") or () if not allowed(k)]
    unexpected = [k for k in info.get("unexpected_keys") or () if not allowed(k)]
    mismatched = list(info.get("mismatched_keys") or ())
    n_model = len(model.state_dict())
    problems = []
    if missing:
        problems.append(f"{len(missing)} of {count(n_model)} missing from it (newly initialised: {examples(missing)})")
    if unexpected:
        problems.append(f"{count(len(unexpected))} in it that the model has no place for ({examples(unexpected)})")
    if mismatched:
        name, saved, wanted = sorted(mismatched)[0]
        problems.append(f"{len(mismatched)} of {count(n_model)} of another shape in it (e.g. {name}: "
                        f"{list(saved)} saved, {list(wanted)} in the model)")
    problems += [line.strip().splitlines()[0] for line in info.get("error_msgs") or () if line.strip()]
    return problems


def check_loaded(info: dict, model, key: str, name_or_path: Any, new_head: bool = False) -> None:
    """Raise :class:`CheckpointError` when the weights loaded into `model` from `name_or_path` (named by config `key`)
    do not fit it (:func:`load_problems`); the message names the weights file and the architecture of config.json."""
    problems = load_problems(info, model, new_head)
    if not problems:
        return
    arch = ", ".join(getattr(model.config, "architectures", None) or [type(model).__name__])
    raise CheckpointError(key, name_or_path, f"{weights_file(name_or_path)} does not match its config.json ({arch}): "
                          + "; ".join(problems), f"point {key} at a checkpoint whose weights and config.json "
                          "were saved together (save_pretrained)")


def available_memory() -> int:
    """Bytes of memory this machine can still give (psutil's ``available``), or less when a cgroup (v2) limit leaves
    this process less."""
    import psutil

    free = int(psutil.virtual_memory().available)
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit.isdigit():
            free = min(free, int(limit) - used)
    except (OSError, ValueError):
        pass
    return free


def human_bytes(n: float) -> str:
    """``n`` bytes for a reader, in powers of 1000: ``51.2 GB``, ``300.0 MB``."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def too_large(key: str, where: Any, params: int, n_bytes: int, dtype: str, available: int) -> CheckpointError | None:
    """The error of a model of `params` parameters (`n_bytes` in `dtype`) that the `available` memory cannot hold,
    named by config `key` and its folder `where`; None when it fits."""
    if n_bytes <= available:
        return None
    return CheckpointError(key, where, f"its config.json describes a model of {params:,} parameters ({human_bytes(n_bytes)} "
                           f"in {dtype}), more than the {human_bytes(available)} of memory this machine has available: "
                           "not loaded", f"point {key} at a smaller model (or a config.json with the sizes it was "
                           "saved with), load it in a smaller dtype, or run on a machine with more memory")


def check_weights_only(path: Any, key: str) -> None:
    """Raise :class:`CheckpointError` (one line naming `key` and `path`) unless the training checkpoint `path` loads
    with ``torch.load(weights_only=True)``: tensors, numbers, strings and containers, the whole of what Lightning saves
    for rlhf-lab's jobs. A pickle that needs anything else (an object of any class, a function to call) is refused
    unread: unpickling it could run code. Memory-mapped (``mmap=True``): the tensors are not read into memory."""
    import pickle

    import torch

    fix = ("resume only from a checkpoint a PPO, GRPO or RLOO job of rlhf-lab wrote (ppo_step*.ckpt, ppo_last.ckpt "
           "or its pre-emption checkpoint); remove this file or point the key elsewhere")
    try:
        torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as err:  # torch's message: what it refused on the line "WeightsUnpickler error: ..."
        found = re.search(r"WeightsUnpickler error: ([^\n]*)", re.sub(r"\x1b\[[0-9;]*m", "", str(err)))
        why = f" ({found.group(1).split('. ')[0].strip()[:200]})" if found else ""
        raise CheckpointError(key, path, f"not loadable with torch.load(weights_only=True){why}: a pickle that could "
                              "run code as it is read, refused unread", fix) from err
    except (RuntimeError, OSError, EOFError, ValueError) as err:
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise CheckpointError(key, path, f"not a checkpoint torch.save wrote in its zip format ({type(err).__name__}: "
                              f"{first})", fix) from err
