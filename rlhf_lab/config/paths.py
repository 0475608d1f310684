"""Keys that name a checkpoint or a data file are paths on this machine: :func:`check_local_paths` refuses a URL or
any other ``scheme://`` in any of them, and :func:`check_resume_from` wants ``algo.resume_from`` an existing file that
``torch.load(weights_only=True)`` reads. Each raises a one-line :class:`~rlhf_lab.config.errors.ConfigError`; part of
:func:`rlhf_lab.config.checks.validate`."""

from __future__ import annotations

import os
import re
from typing import Any

from omegaconf import DictConfig, ListConfig

from rlhf_lab.config.errors import ConfigError

# the keys that name a checkpoint or a data file (policy.name_or_path, reward_model.path, gold.path,
# algo.reference.path, algo.resume_from, eval.probe_path, data.on_policy_path, data.path, gold.build's, ...)
PATH_KEYS = ("name_or_path", "path", "on_policy_path", "probe_path", "resume_from")
URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")  # http://, https://, s3://, file://, hf://, ...
RESUME = "an existing Lightning checkpoint file of a PPO, GRPO or RLOO job (ppo_step*.ckpt, ppo_last.ckpt) or null"


def check_local_paths(node, prefix: str = "") -> None:
    """Every key that names a checkpoint or data file (its last part one of :data:`PATH_KEYS`, anywhere in the
    config; a list of them too) is a path on this machine, a hub name or null: a URL or any other ``scheme://`` is
    refused. Lightning loads an http(s) checkpoint (``algo.resume_from``) with ``torch.load(weights_only=False)``,
    which runs whatever code its pickle holds."""
    if isinstance(node, DictConfig):
        for k in node.keys():
            try:
                v = node[k]
            except Exception:  # a missing (???) or unresolvable value: the group checks name it
                continue
            key = f"{prefix}{k}"
            if isinstance(v, (DictConfig, ListConfig)) and str(k) not in PATH_KEYS:
                check_local_paths(v, key + ".")
            elif str(k) in PATH_KEYS:
                for value in (list(v) if isinstance(v, ListConfig) else [v]):
                    if isinstance(value, str) and URL_SCHEME.match(value.strip()):
                        raise ConfigError(key, value, "a local path (or a hub name where one is taken): a URL or any "
                                          "scheme:// is refused, checkpoints and data are read from this machine's "
                                          "files only (download it first)")
    elif isinstance(node, ListConfig):
        for i, v in enumerate(node):
            check_local_paths(v, f"{prefix.rstrip('.')}[{i}].")


def check_resume_from(resume: Any) -> None:
    """``algo.resume_from`` (null, or a file on this machine: :func:`check_local_paths` has refused a URL): an existing
    file, read by ``torch.load(weights_only=True)`` (a pickle that needs more than tensors and plain values is refused
    unread, before anything runs; the PPO stage checks it again, and its own pre-emption checkpoint)."""
    if resume is None:
        return
    path = os.path.expanduser(str(resume))
    if not os.path.isfile(path):
        raise ConfigError("algo.resume_from", str(resume), RESUME)
    from rlhf_lab.models.checkpoints import check_weights_only  # here: torch's import is the job's

    check_weights_only(path, "algo.resume_from")
