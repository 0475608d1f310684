"""The vocabulary of the config checks (:mod:`rlhf_lab.config.checks`): rules on one value, each with its words
(:class:`Rule`: ``positive``, :func:`at_least`, :func:`optional`, ...), how a group's keys are read and checked against
them (:func:`need_all`, :func:`choice`, :func:`required`), and the checks on every key (unknown keys added with
``+``, numbers that are not finite or negative, seeds out of range). Each raises a one-line
:class:`~rlhf_lab.config.errors.ConfigError`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from omegaconf import DictConfig, OmegaConf

from rlhf_lab.config.errors import ConfigError, UnknownKey


def flat_keys(node: Any, prefix: str = "") -> list[str]:
    """Every dotted key of a config (inner nodes too): ``algo``, ``algo.lr``, ``algo.lora.r``, ..."""
    out = []
    if isinstance(node, DictConfig):
        for k in node.keys():
            key = f"{prefix}{k}"
            out.append(key)
            child = node._get_node(k)
            if isinstance(child, DictConfig):
                out += flat_keys(child, key + ".")
    return out


def check_added_keys(cfg: DictConfig, overrides: Iterable[str], groups: Iterable[str]) -> None:
    """``+key=value`` (``++key=value``) may only select an option of a config group (``+rm_size=medium``) or set
    Hydra's own node (``+hydra.launcher...``): a key it adds to the config is a typo Hydra would otherwise accept.
    Raises :class:`UnknownKey` naming the closest existing key."""
    groups = set(groups)
    for o in overrides:
        if not o.startswith("+") or "=" not in o:
            continue
        key = o.split("=", 1)[0].lstrip("+").split("@", 1)[0]
        if key in groups or "/" in key or key.split(".")[0] == "hydra":
            continue
        raise UnknownKey(key, o, [k for k in flat_keys(cfg) if k != key and not k.startswith(key + ".")])


# Numbers whose negative values mean something: the gold formula's weights, the labeler's biases, Lightning's
# devices=-1 (every device). Every other number of the config is a count, size, rate, coefficient or seed.
NEGATIVE_OK = ("world.gold.", "labeler.length_bonus", "labeler.filler_bonus", "trainer.devices")
SEED_LIMIT = 2 ** 32  # numpy's and torch's seeds


def check_numbers(node: Any, prefix: str = "") -> None:
    """Every number of the config is finite (NaN and infinity mean nothing in any key: null switches an option
    off), and ≥ 0 outside :data:`NEGATIVE_OK`; every ``seed`` is an integer in [0, 2³²)."""
    if not isinstance(node, DictConfig):
        return
    for k in node.keys():
        key = f"{prefix}{k}"
        try:
            v = node[k]
        except Exception:  # a missing (???) or unresolvable value: the group checks name it
            continue
        if isinstance(v, DictConfig):
            check_numbers(v, key + ".")
            continue
        if k == "seed" and v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < SEED_LIMIT):
            raise ConfigError(key, v, f"an integer in [0, {SEED_LIMIT})")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if not math.isfinite(v):
            raise ConfigError(key, v, "a finite number (null switches an option off)")
        if v < 0 and not key.startswith(NEGATIVE_OK):
            raise ConfigError(key, v, ">= 0")


# -- rules -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A rule on one number: whether it `holds`, the words for what it allows (``> 0``), and whether null is
    allowed too (:func:`optional`)."""

    holds: Callable[[Any], bool]
    text: str
    allows_none: bool = False


positive = Rule(lambda v: v > 0, "> 0")
non_negative = Rule(lambda v: v >= 0, ">= 0")
unit_interval = Rule(lambda v: 0 <= v <= 1, "in [0, 1]")
fraction_below_one = Rule(lambda v: 0 <= v < 1, "in [0, 1)")
open_unit = Rule(lambda v: 0 < v < 1, "in (0, 1)")
up_to_one = Rule(lambda v: 0 < v <= 1, "in (0, 1]")


def at_least(n: int) -> Rule:
    return Rule(lambda v: v >= n, f">= {n}")


def optional(rule: Rule, text: str | None = None) -> Rule:
    """`rule`, or null (the option switched off)."""
    return Rule(rule.holds, text or f"{rule.text} or null", allows_none=True)


def get(node: DictConfig, key: str) -> Any:
    """The (resolved) value of ``key`` under ``node``; None when absent or null."""
    return OmegaConf.select(node, key, default=None, throw_on_missing=False)


ABSENT = object()


def need_all(node: DictConfig, prefix: str, rules: dict[str, Rule]) -> None:
    """Check each key that the node has (a key it lacks belongs to another variant of the group): a number the rule
    holds for, or null where the rule allows it."""
    for key, rule in rules.items():
        v = OmegaConf.select(node, key, default=ABSENT, throw_on_missing=False)
        if v is ABSENT:
            continue
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        if not (rule.allows_none if v is None else number and rule.holds(v)):
            raise ConfigError(f"{prefix}.{key}", v, rule.text)


def choice(node: DictConfig, prefix: str, key: str, options: tuple[str, ...]) -> str:
    v = get(node, key)
    if str(v) not in options:
        raise ConfigError(f"{prefix}.{key}", v, "one of " + ", ".join(options))
    return str(v)


def required(node: DictConfig, prefix: str, key: str) -> None:
    missing = OmegaConf.is_missing(node, key) if key in node.keys() else False
    if missing or get(node, key) in (None, ""):
        raise ConfigError(f"{prefix}.{key}", "???" if missing else get(node, key), "set (it is required)")


TRAINING = {"steps": at_least(1), "batch_size": at_least(1), "lr": positive, "weight_decay": non_negative,
            "warmup_steps": non_negative, "max_len": at_least(2)}
LORA = {"lora.r": non_negative, "lora.dropout": fraction_below_one, "lora.alpha": optional(positive)}
