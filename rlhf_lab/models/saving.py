"""A policy saved as a Hugging Face folder while it trains (``eval.save_checkpoints``): the checkpoint of an
evaluation, which ``from_pretrained`` loads as any policy, so that the step a ship rule picks can be shipped."""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

from rlhf_lab.models.adapters import unwrap


def step_folder(root: Path | str, step: int) -> Path:
    """The folder of step `step`'s checkpoint under `root`: ``step_000120``."""
    return Path(root) / f"step_{int(step):06d}"


def save_policy(model, tokenizer, folder: Path | str) -> Path:
    """Write `model` and `tokenizer` to `folder` with ``save_pretrained``: into a temporary folder beside it, then
    renamed, so that a folder of that name is a whole checkpoint (one left by an earlier try is replaced). A LoRA
    policy is saved merged (a plain causal LM), merged in a copy: `model` itself keeps training with its adapters."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    plain = unwrap(copy.deepcopy(model).merge_and_unload()) if hasattr(model, "merge_and_unload") else model
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
    return folder
