"""Checkpoints named in config by stage and policy preset (``sft@a_tiny``, ``pretrain@a_medium``): the preset's
config, its tokenizer check, and its artifact through :func:`rlhf_lab.stages.pipeline.ensure`; and a config group's
option read as a preset (:func:`preset`: a policy, the gold's labeler)."""

from __future__ import annotations

import copy
import re
from importlib.resources import files
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from rlhf_lab.runs.contents import absolute_if_local
from rlhf_lab.stages.pipeline import ensure


PRESET_STAGES = ("pretrain", "sft")  # stages whose artifact is a causal LM with its tokenizer


def preset_names(group: str) -> list[str]:
    """The options of the config group `group` (``conf/<group>/<name>.yaml``)."""
    return sorted(p.name.removesuffix(".yaml") for p in files("rlhf_lab.conf").joinpath(group).iterdir()
                  if p.name.endswith(".yaml"))


def preset(group: str, name: str, key: str) -> DictConfig:
    """Option `name` of `group` as ``<group>=<name>`` composes it (``conf/<group>/<name>.yaml``, without its defaults
    list); a ValueError naming `key`, the config key that named it, when there is no such option."""
    f = files("rlhf_lab.conf").joinpath(group, f"{name}.yaml")
    if not f.is_file():
        raise ValueError(f"{key}: no {group} preset {name!r}; the presets are {', '.join(preset_names(group))}")
    node = OmegaConf.create(f.read_text())
    with open_dict(node):
        node.pop("defaults", None)
    return node


def parse_preset_ref(value: Any) -> tuple[str, str] | None:
    """``(stage, preset)`` for a value ``<stage>@<policy preset>`` (e.g. ``sft@a_tiny``), else None."""
    if value is None:
        return None
    m = re.fullmatch(r"([a-z]+)@([A-Za-z0-9_.-]+)", str(value).strip())
    if m is None or m.group(1) not in PRESET_STAGES or Path(str(value)).exists():
        return None
    return m.group(1), m.group(2)


def preset_config(cfg: DictConfig, name: str, key: str) -> DictConfig:
    """`cfg` with ``policy`` replaced by the preset `name`, checked to share the policy's tokenizer.

    A family's tokenizer is trained on the family's corpus sample (``pretrain_<family>``: world and
    ``pretrain.n_texts``) with ``vocab_size`` tokens, whatever the size, so two presets of one family with
    the same ``vocab_size`` share it (the family-a presets all do)."""
    p, pol = preset("policy", name, key), cfg.policy

    def tokenizer(q: DictConfig) -> tuple[str, int]:
        return str(q.family), int(q.vocab_size)

    if pol.get("name_or_path"):
        raise ValueError(f"{key}: the preset {name!r} is trained on the world, with the world's tokenizer, but the "
                         f"policy is the checkpoint policy.name_or_path={pol.name_or_path!r}; give {key} a checkpoint "
                         "folder with the policy's tokenizer instead")
    if tokenizer(p) != tokenizer(pol):
        same = [n for n in preset_names("policy") if tokenizer(preset("policy", n, key)) == tokenizer(pol)]
        raise ValueError(f"{key}: the preset {name!r} (family {p.family}, vocab_size {p.vocab_size}) has another "
                         f"tokenizer than the policy (family {pol.family}, vocab_size {pol.vocab_size}); the per-token "
                         f"log-ratios need one tokenizer. Presets that share it: {', '.join(same) or 'none'}")
    c = copy.deepcopy(cfg)
    with open_dict(c):
        c.policy = p
    return c


def checkpoint_path(cfg: DictConfig, value: Any, key: str, tokenizer_of=None) -> str:
    """A checkpoint named in config. ``<stage>@<policy preset>`` (``sft@a_tiny``, ``pretrain@a_medium``) is that
    preset's artifact of `stage`, built first (as its own MLflow run) or reused through :func:`ensure` with every
    other setting of `cfg`; a local folder is returned as its absolute path, any other value (a hub name) as it
    is. With `tokenizer_of` (a
    checkpoint folder, e.g. the policy's SFT) the resolved checkpoint must have the same tokenizer."""
    ref = parse_preset_ref(value)
    if ref is None:
        return str(absolute_if_local(str(value)))  # a local folder as its absolute path: a key sees its content
    stage, name = ref
    path = str(ensure(stage, preset_config(cfg, name, key)))
    if tokenizer_of is not None:
        from rlhf_lab.models import families as F

        if not F.same_tokenizer(F.load_tokenizer(path, key), F.load_tokenizer(tokenizer_of, key)):
            raise ValueError(f"{key}={value}: the checkpoint {path} has another tokenizer than {tokenizer_of}; "
                             "the per-token log-ratios need one tokenizer")
    return path
