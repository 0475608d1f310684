"""The choices of the config's keys whose code lives where the config cannot import it (in ``stages/``, or in modules
that import transformers or Lightning, which a sweep's launching process never loads), one StrEnum each: the type of
its field in :mod:`rlhf_lab.config.schema` (Hydra refuses any other value when it composes the config) and the names
the implementing code compares with, imported from here. A member's name is its value (OmegaConf reads an enum's
value by its name). The choices of the light modules live beside their code: the KL estimators, ``kl_in`` and the
controllers (:mod:`rlhf_lab.algorithms.kl`), the loss aggregations (``rl_math``), DPO's losses (``dpo_math``)."""

from __future__ import annotations

from enum import StrEnum


class GoldSource(StrEnum):
    """``gold.source`` (:mod:`rlhf_lab.stages.gold`)."""

    formula = "formula"  # the world's formula
    rm = "rm"  # a frozen gold reward model (gold.path, or built on the world: gold=rm_world)


class ReferenceKind(StrEnum):
    """``algo.reference.kind`` (PPO: copy or lora_disabled; DPO: all three)."""

    copy = "copy"  # a frozen copy of the SFT policy (or of algo.reference.path)
    lora_disabled = "lora_disabled"  # the LoRA policy's own base, adapters disabled
    precomputed = "precomputed"  # reference log-probs computed once before training (fixed pairs: offline DPO)


class Critic(StrEnum):
    """``algo.critic`` of PPO and its kin (:func:`rlhf_lab.stages.ppo.build_models`)."""

    rm = "rm"  # initialised from the reward model (InstructGPT)
    policy = "policy"  # from the SFT policy
    shared = "shared"  # a value head on the policy's own trunk
    none = "none"  # no critic (GRPO, RLOO)


class Optimizer(StrEnum):
    """``algo.optimizer`` of PPO and its kin (:meth:`rlhf_lab.algorithms.ppo.PPOModule.configure_optimizers`)."""

    adamw = "adamw"  # AdamW: two fp32 states (first and second moment) per parameter
    adafactor = "adafactor"  # torch.optim.Adafactor (torch >= 2.5): a factored second moment, no first moment


class PPOReward(StrEnum):
    """``algo.reward``: what PPO maximises."""

    rm = "rm"  # the proxy reward model
    gold = "gold"  # the gold reward itself (an upper bound)


class Baseline(StrEnum):
    """``algo.baseline`` without a critic: the group's mean or leave-one-out (RLOO)."""

    mean = "mean"
    loo = "loo"


class AdvantageScale(StrEnum):
    """``algo.advantage_scale``: none, or divided by the group's std (GRPO)."""

    none = "none"
    group_std = "group_std"


class KLUnit(StrEnum):
    """``kl.unit``: the KL the controller sees, a response's sum or the per-token mean."""

    sequence = "sequence"
    token = "token"


class DataSource(StrEnum):
    """``data.source``: the world's pairs, or external rows (:mod:`rlhf_lab.data.external`)."""

    world = "world"
    jsonl = "jsonl"
    hf = "hf"


class DataFormat(StrEnum):
    """``data.format`` of external rows: TRL's standard or conversational format, or found from the first row."""

    auto = "auto"
    standard = "standard"
    conversational = "conversational"


class OnPolicyPairing(StrEnum):
    """``data.on_policy_pairing``: what an on-policy sample (``data.on_policy_path``) is paired with."""

    self = "self"  # a second sample of the same checkpoint (pairs among its own texts)
    sft = "sft"  # an SFT sample for the same prompt: places its texts on the SFT samples' scale (a gold's coverage)


class Dtype(StrEnum):
    """``dtype`` of a model group (``policy``, ``reward_model``); null: transformers' default."""

    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class AttnImplementation(StrEnum):
    """``attn_implementation`` of a model group; null: transformers' default."""

    eager = "eager"
    sdpa = "sdpa"
    flash_attention_2 = "flash_attention_2"
    flex_attention = "flex_attention"


class RMSource(StrEnum):
    """``reward_model.source``: the backbone of the RM (:mod:`rlhf_lab.stages.rm`)."""

    same = "same"  # the policy family's SFT checkpoint
    different = "different"  # the other family's base model
    pretrained = "pretrained"  # a pretrained checkpoint used as it is (reward_model.name_or_path)


class RMInit(StrEnum):
    """``reward_model.init``: which checkpoint of the backbone's family the RM starts from."""

    sft = "sft"
    pretrain = "pretrain"


class Sampler(StrEnum):
    """``generation.sampler`` (:mod:`rlhf_lab.models.sampling`): both draw the same tokens."""

    lab = "lab"  # the lab's own loop over the KV cache
    hf = "hf"  # transformers' generate


class EvalSchedule(StrEnum):
    """``eval.schedule`` (:mod:`rlhf_lab.evaluation.callbacks`)."""

    every = "every"  # every eval.every_n_steps
    log = "log"  # eval.n_points log-spaced steps
    kl = "kl"  # at sqrt-KL spacing, decided as training goes (evaluation/schedule.py; PPO's kin only)
