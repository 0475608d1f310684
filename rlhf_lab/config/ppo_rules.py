"""PPO's rules across the keys of ``algo`` (PPO and its aliases ``grpo`` and ``rloo``), in one function that every
place that takes the settings calls: the config checks (:func:`rlhf_lab.config.checks.validate`, before anything
runs), the stage (:mod:`rlhf_lab.stages.ppo`, for a config that did not pass the CLI) and
:class:`rlhf_lab.algorithms.ppo.PPOModule` (with the number of processes, which splits the batch). It reads the keys
as attributes, so it takes the ``algo`` node of a config or its typed settings (:class:`~rlhf_lab.config.schema.PPOConfig`)
alike, and raises :class:`~rlhf_lab.config.errors.ConfigError` (one line naming the key). The ranges of single keys are
:func:`rlhf_lab.config.checks.check_ppo`'s; which names a key takes, the schema's (Hydra refuses others)."""

from __future__ import annotations

from typing import Any

from rlhf_lab.algorithms.kl import KL_GRADIENT_ESTIMATORS, KLIn
from rlhf_lab.config.choices import AdvantageScale, Baseline, Critic, Optimizer, ReferenceKind
from rlhf_lab.config.errors import ConfigError

# the defining settings of the jobs that run the PPO stage under their own name (stages/pipeline.py's ALIASES:
# conf/algo/<name>.yaml holds the rest of their settings)
DEFINING = {"grpo": {"critic": Critic.none}, "rloo": {"critic": Critic.none, "baseline": Baseline.loo}}
PPO_FAMILY = ("ppo", *DEFINING)  # the jobs that run the PPO stage (stages/ppo.py)


def check_ppo_rules(a: Any, processes: int = 1) -> None:
    """Raise :class:`ConfigError` on the first rule of ``algo`` that `a` breaks; `processes` share each batch."""
    name, k, critic = str(a.name), int(a.samples_per_prompt), str(a.critic)
    for key, value in DEFINING.get(name, {}).items():
        if str(getattr(a, key)) != value:
            raise ConfigError(f"algo.{key}", str(getattr(a, key)), f"{value} with algo={name} (what {name} is)")
    if name in DEFINING and k < 2:
        raise ConfigError("algo.samples_per_prompt", k, f">= 2 with algo={name} (the group of a prompt's samples)")
    if str(a.kl_in) == KLIn.loss and str(a.kl_estimator) not in KL_GRADIENT_ESTIMATORS:
        raise ConfigError("algo.kl_estimator", str(a.kl_estimator), "k2 or k3 with algo.kl_in=loss (as a loss on the "
                          "policy's own samples, k1's gradient is zero in expectation: the penalty would do nothing)")
    times = f" times the number of processes ({processes})" if processes > 1 else ""
    for per in ("num_minibatches", "samples_per_prompt"):
        if int(a.batch_size) % (int(getattr(a, per)) * processes):
            raise ConfigError("algo.batch_size", int(a.batch_size), f"a multiple of algo.{per}={getattr(a, per)}{times}")
    if critic == Critic.none and str(a.baseline) == Baseline.loo and k < 2:
        raise ConfigError("algo.samples_per_prompt", k, ">= 2 with algo.critic=none algo.baseline=loo (RLOO)")
    if str(a.advantage_scale) == AdvantageScale.group_std and (critic != Critic.none or str(a.baseline) != Baseline.mean
                                                               or k < 2):
        raise ConfigError("algo.advantage_scale", "group_std", "none unless algo.critic=none, algo.baseline=mean and "
                          "algo.samples_per_prompt >= 2 (GRPO's group-normalised advantages)")
    if str(getattr(a, "optimizer", Optimizer.adamw)) == Optimizer.adafactor and not torch_has_adafactor():
        raise ConfigError("algo.optimizer", "adafactor", "adamw on this torch (torch.optim.Adafactor is new in torch "
                          "2.5), or upgrade torch")
    check_reference(a)


def torch_has_adafactor() -> bool:
    """Whether the installed torch has ``torch.optim.Adafactor`` (2.5 and later), read from its version without
    importing torch (the config checks run in a sweep's launching process too)."""
    from importlib.metadata import version

    major, minor = (int("".join(c for c in part if c.isdigit()) or 0) for part in version("torch").split(".")[:2])
    return (major, minor) >= (2, 5)


def check_reference(a: Any) -> None:
    """``algo.reference`` of PPO: a copy (of the SFT policy, or of ``path``, re-synced every ``sync_every`` steps) or
    the LoRA policy's own base (``lora_disabled``); never precomputed log-probs (they need fixed pairs: DPO)."""
    ref = a.reference
    kind, path, sync = str(ref.kind), ref.path, int(ref.sync_every or 0)
    if kind == ReferenceKind.precomputed:
        raise ConfigError("algo.reference.kind", kind, "one of copy, lora_disabled for PPO (precomputed reference "
                          "log-probs need fixed pairs: DPO)")
    if path and sync:
        raise ConfigError("algo.reference.sync_every", sync,
                          "0 when algo.reference.path is set (a re-synced reference is the policy itself)")
    if ref.seed is not None and (int(ref.seed) < 0 or "@" not in str(path or "")):
        raise ConfigError("algo.reference.seed", ref.seed, ">= 0 with algo.reference.path=<stage>@<preset>, else null")
    if kind == ReferenceKind.lora_disabled:
        if path:
            raise ConfigError("algo.reference.path", path, "null with algo.reference.kind=lora_disabled")
        if sync:
            raise ConfigError("algo.reference.sync_every", sync, "0 with algo.reference.kind=lora_disabled")
        if str(a.critic) == Critic.rm:
            raise ConfigError("algo.critic", "rm", "policy, shared or none with algo.reference.kind=lora_disabled")
        if int(a.lora.r) <= 0:
            raise ConfigError("algo.lora.r", int(a.lora.r), "> 0 with algo.reference.kind=lora_disabled (e.g. 16)")
        if getattr(ref, "dtype", None) is not None:
            raise ConfigError("algo.reference.dtype", str(ref.dtype), "null with algo.reference.kind=lora_disabled "
                              "(the reference is the policy's own base, in the policy's dtype)")
