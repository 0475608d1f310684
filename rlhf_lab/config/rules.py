"""The vocabulary of the config checks (:mod:`rlhf_lab.config.checks`): rules on one value (:func:`positive`,
:func:`at_least`, :func:`optional`, ...), how a group's keys are read and checked against them (:func:`need_all`,
:func:`choice`, :func:`required`), and the checks on every key (unknown keys added with ``+``, numbers that are not
finite or negative, seeds out of range). Each raises :class:`~rlhf_lab.config.errors.ConfigError` (one line)."""

from __future__ import annotations

import math
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

Rule = Callable[[Any], bool]


def positive(v: Any) -> bool:
    return v is not None and v > 0


def non_negative(v: Any) -> bool:
    return v is not None and v >= 0


def at_least(n: float) -> Rule:
    return lambda v: v is not None and v >= n


def unit_interval(v: Any) -> bool:
    return v is not None and 0 <= v <= 1


def fraction_below_one(v: Any) -> bool:
    return v is not None and 0 <= v < 1


def open_unit(v: Any) -> bool:
    return v is not None and 0 < v < 1


def optional(rule: Rule) -> Rule:
    return lambda v: v is None or rule(v)


RULE_TEXT: dict[Any, str] = {positive: "> 0", non_negative: ">= 0", unit_interval: "in [0, 1]",
                             fraction_below_one: "in [0, 1)"}


def get(node: DictConfig, key: str) -> Any:
    """The (resolved) value of ``key`` under ``node``; None when absent or null."""
    return OmegaConf.select(node, key, default=None, throw_on_missing=False)


ABSENT = object()


def need(node: DictConfig, prefix: str, key: str, rule: Rule, allowed: str | None = None) -> None:
    v = get(node, key)
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    if not (rule(v) if v is None else number and rule(v)):
        raise ConfigError(f"{prefix}.{key}", v, allowed or RULE_TEXT.get(rule, "valid"))


def need_all(node: DictConfig, prefix: str, rules: dict[str, Rule | tuple[Rule, str]]) -> None:
    """Check each key that the node has (a key it lacks belongs to another variant of the group)."""
    for key, rule in rules.items():
        if OmegaConf.select(node, key, default=ABSENT, throw_on_missing=False) is ABSENT:
            continue
        rule, allowed = rule if isinstance(rule, tuple) else (rule, None)
        need(node, prefix, key, rule, allowed)


def choice(node: DictConfig, prefix: str, key: str, options: tuple[str, ...]) -> str:
    v = get(node, key)
    if str(v) not in options:
        raise ConfigError(f"{prefix}.{key}", v, "one of " + ", ".join(options))
    return str(v)


def required(node: DictConfig, prefix: str, key: str) -> None:
    missing = OmegaConf.is_missing(node, key) if key in node.keys() else False
    if missing or get(node, key) in (None, ""):
        raise ConfigError(f"{prefix}.{key}", "???" if missing else get(node, key), "set (it is required)")


TRAINING = {"steps": (at_least(1), ">= 1"), "batch_size": (at_least(1), ">= 1"), "lr": positive,
            "weight_decay": non_negative, "warmup_steps": non_negative, "max_len": (at_least(2), ">= 2")}
LORA = {"lora.r": non_negative, "lora.dropout": fraction_below_one, "lora.alpha": (optional(positive), "> 0 or null")}
