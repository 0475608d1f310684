"""Structured-config schemas: dataclasses registered in Hydra's ConfigStore, so Hydra checks the types of the
``world``, ``gold``, ``algo``, ``kl``, ``reward_model``, ``generation``, ``eval``, ``trainer`` and ``data`` groups when
it composes the config (``algo.lr=abc`` fails before anything runs); a choice is typed with its StrEnum
(:mod:`rlhf_lab.config.choices`, or beside a light module's code: the KL estimators), so ``algo.critic=nope`` fails
there too. The values and their comments live in ``conf/``'s YAML files, which take their schema through their
defaults list (``defaults: [/schema/algo@_here_: ppo, _self_]``, out of the user-facing groups): every field is
MISSING here. :func:`register` runs when ``rlhf_lab.conf`` is imported. The values' ranges are
:mod:`rlhf_lab.config.checks`'s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, List, Optional, TypeVar

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from rlhf_lab.algorithms.dpo_math import PreferenceLoss
from rlhf_lab.algorithms.kl import KLController, KLEstimator, KLIn
from rlhf_lab.algorithms.rl_math import LossAggregation
from rlhf_lab.config.choices import (
    AdvantageScale,
    AttnImplementation,
    Baseline,
    Critic,
    DataFormat,
    DataSource,
    Dtype,
    EvalSchedule,
    GoldSource,
    KLUnit,
    OnPolicyPairing,
    Optimizer,
    PPOReward,
    ReferenceKind,
    RMInit,
    RMSource,
    Sampler,
)


@dataclass
class GoldConfig:
    sentiment: float = MISSING
    fluency: float = MISSING
    repetition: float = MISSING
    filler: float = MISSING
    eos: float = MISSING
    length: float = MISSING
    length_cap: int = MISSING


@dataclass
class SplitsConfig:
    train: float = MISSING
    eval: float = MISSING
    test: float = MISSING


@dataclass
class WorldConfig:
    name: str = MISSING
    seed: int = MISSING
    max_sentences: int = MISSING
    mean_sentences: float = MISSING
    filler_rate: float = MISSING
    adverb_rate: float = MISSING
    sentiment_noise: float = MISSING
    splits: SplitsConfig = field(default_factory=SplitsConfig)
    ood_products: List[str] = MISSING
    gold: GoldConfig = field(default_factory=GoldConfig)


@dataclass
class CoverConfig:
    """One of ``gold.build.covers``: a policy that hacked a proxy RM (stage ``cover``), its samples in the gold's pairs."""

    seed: int = MISSING  # the cover's seed and its proxy RM's (reward_model.seed)
    beta: float = MISSING  # its fixed KL coefficient (kl.beta)
    steps: int = MISSING  # its PPO steps (algo.steps)
    round: int = 1  # 1: its proxy's pairs labelled by the formula; r > 1: by this gold built from rounds < r


@dataclass
class GoldBuildConfig:
    """``gold.build``: the gold RM trained on the world when ``gold.path`` is null (``gold=rm_world``)."""

    labeler: str = MISSING  # a preset of conf/labeler/
    reward_model: Any = MISSING  # set over the job's reward_model group
    data: Any = MISSING  # set over the job's data group
    covers: List[CoverConfig] = field(default_factory=list)  # their samples are the on-policy pairs (in order)
    cover_gold_data: Optional[Any] = None  # over `data` for the gold that labels a later round's proxies
    cover_overrides: List[str] = field(default_factory=list)  # Hydra overrides of every cover's PPO job


@dataclass
class GoldSourceConfig:
    """The ``gold`` group: the gold reward every run is measured against (the world's formula or a frozen RM)."""

    source: GoldSource = MISSING
    path: Optional[str] = MISSING
    build: Optional[GoldBuildConfig] = MISSING


@dataclass
class LoraConfig:
    r: int = MISSING
    alpha: Optional[float] = MISSING
    dropout: float = MISSING
    target_modules: Any = MISSING


@dataclass
class ReferenceConfig:
    kind: ReferenceKind = MISSING
    path: Optional[str] = MISSING
    sync_every: int = MISSING
    seed: Optional[int] = MISSING
    dtype: Optional[Dtype] = None  # PPO only (conf/algo/ppo.yaml); a default here so DPO's file need not name it


@dataclass
class JobConfig:
    """``algo`` for the jobs whose settings live in another group (pretrain, sft, rm)."""

    name: str = MISSING


@dataclass
class PPOConfig(JobConfig):
    steps: int = MISSING
    batch_size: int = MISSING
    samples_per_prompt: int = MISSING
    ppo_epochs: int = MISSING
    num_minibatches: int = MISSING
    lr: float = MISSING
    critic_lr: float = MISSING
    clip_eps: float = MISSING
    clip_eps_high: Optional[float] = MISSING
    loss_agg: LossAggregation = MISSING
    advantage_scale: AdvantageScale = MISSING
    value_clip_eps: float = MISSING
    vf_coef: float = MISSING
    entropy_coef: float = MISSING
    gamma: float = MISSING
    lam: float = MISSING
    whiten_advantages: bool = MISSING
    max_grad_norm: Optional[float] = MISSING
    packing: bool = MISSING
    shared_prompt: bool = MISSING
    trim_minibatches: bool = MISSING
    compile: bool = MISSING
    activation_checkpointing: bool = MISSING
    optimizer: Optimizer = MISSING
    kl_estimator: KLEstimator = MISSING
    kl_in: KLIn = MISSING
    reward: PPOReward = MISSING
    critic: Critic = MISSING
    baseline: Baseline = MISSING
    length_penalty: float = MISSING
    missing_eos_penalty: float = MISSING
    reward_clip: Optional[float] = MISSING
    lora: LoraConfig = field(default_factory=LoraConfig)
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    checkpoint_every: int = MISSING
    resume_from: Optional[str] = MISSING
    max_kl: Optional[float] = MISSING
    min_entropy: Optional[float] = MISSING
    max_approxkl: Optional[float] = MISSING
    max_entropy_ratio: Optional[float] = MISSING


@dataclass
class BoNConfig(JobConfig):
    n_max: int = MISSING
    batch_size: int = MISSING


@dataclass
class DPOConfig(JobConfig):
    beta: float = MISSING
    loss_type: PreferenceLoss = MISSING
    label_smoothing: float = MISSING
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    steps: int = MISSING
    batch_size: int = MISSING
    lr: float = MISSING
    weight_decay: float = MISSING
    warmup_steps: int = MISSING
    max_grad_norm: Optional[float] = MISSING
    max_len: int = MISSING
    online: bool = MISSING
    online_every: int = MISSING
    online_prompts: int = MISSING
    proxy_rm: bool = MISSING
    seed: int = MISSING
    eval_pairs: int = MISSING


@dataclass
class KLConfig:
    name: KLController = MISSING
    beta: float = MISSING
    target: Optional[float] = MISSING
    horizon: Optional[float] = MISSING
    unit: KLUnit = MISSING


@dataclass
class ArchConfig:
    hidden: int = MISSING
    layers: int = MISSING
    heads: int = MISSING


@dataclass
class RewardModelConfig:
    source: RMSource = MISSING
    init: RMInit = MISSING
    family: str = MISSING
    name_or_path: Optional[str] = MISSING
    vocab_size: int = MISSING
    arch: ArchConfig = field(default_factory=ArchConfig)
    steps: int = MISSING
    batch_size: int = MISSING
    lr: float = MISSING
    weight_decay: float = MISSING
    warmup_steps: int = MISSING
    max_len: int = MISSING
    margin: bool = MISSING
    center_coef: float = MISSING
    packing: bool = MISSING
    lora: LoraConfig = field(default_factory=LoraConfig)
    ensemble: int = MISSING
    conservative_lambda: float = MISSING
    normalize: bool = MISSING
    norm_samples: int = MISSING
    path: Optional[str] = MISSING
    dtype: Optional[Dtype] = MISSING
    attn_implementation: Optional[AttnImplementation] = MISSING
    seed: int = MISSING
    heldout: bool = False  # a default here too (conf/reward_model/base.yaml): a user's own file need not name it


@dataclass
class GenerationConfig:
    max_new_tokens: int = MISSING
    temperature: float = MISSING
    top_k: int = MISSING
    top_p: float = MISSING
    max_prompt_len: Optional[int] = MISSING
    sampler: Sampler = MISSING
    # the PPO family's rollouts from a copy of the policy in this dtype (rlhf_lab/models/rollout_copy.py); null: the
    # policy itself. A default here so a user's own generation file need not name it
    dtype: Optional[Dtype] = None


@dataclass
class EvalConfig:
    schedule: EvalSchedule = MISSING
    every_n_steps: int = MISSING
    n_points: int = MISSING
    sqrt_kl_spacing: float = MISSING
    n_prompts: int = MISSING
    samples_per_prompt: int = MISSING
    n_test_prompts: int = MISSING
    n_ood_prompts: int = MISSING
    n_samples_logged: int = MISSING
    batch_size: int = MISSING
    reuse_start: bool = MISSING
    probe_path: Optional[str] = MISSING
    # defaults here too (conf/eval/default.yaml sets them): a user's own group file need not name them
    test_each_eval: bool = False
    save_checkpoints: bool = False


@dataclass
class TrainerConfig:
    accelerator: str = MISSING
    devices: Any = MISSING  # a count, -1 (every GPU; not with accelerator=cpu), "auto" or a list of device ids
    num_nodes: int = MISSING
    strategy: Any = MISSING  # a name or a {_target_: ...} Strategy config
    precision: Any = MISSING  # "32-true", "bf16-mixed", 16, ...
    max_steps: Optional[int] = MISSING
    log_every_n_steps: int = MISSING
    threads: Optional[int] = MISSING
    progress_bar: bool = MISSING


@dataclass
class WorldDataConfig:
    source: DataSource = MISSING
    n_train: int = MISSING
    n_eval: int = MISSING
    seed: int = MISSING
    on_policy_path: Any = MISSING  # a folder, a list of folders or null
    on_policy_fraction: float = MISSING
    on_policy_pairing: OnPolicyPairing = MISSING
    degenerate_fraction: float = MISSING
    sft_temperatures: Optional[List[float]] = MISSING


@dataclass
class ColumnsConfig:
    """``data.columns``: the dataset's column for each field (null prompt: derived from chosen/rejected)."""

    prompt: Optional[str] = MISSING
    chosen: Optional[str] = MISSING
    rejected: Optional[str] = MISSING


@dataclass
class JsonlDataConfig:
    source: DataSource = MISSING
    path: str = MISSING
    format: DataFormat = MISSING  # auto | standard | conversational (rlhf_lab/data/external.py)
    columns: ColumnsConfig = field(default_factory=ColumnsConfig)
    chat_template: Optional[str] = MISSING
    eval_fraction: float = MISSING
    test_fraction: float = MISSING
    seed: int = MISSING
    max_line_bytes: Optional[int] = MISSING  # bounds on the input (rlhf_lab/data/files.py); null: no limit
    max_total_bytes: Optional[int] = MISSING


@dataclass
class HfDataConfig:
    source: DataSource = MISSING
    name: str = MISSING
    split: str = MISSING
    format: DataFormat = MISSING
    columns: ColumnsConfig = field(default_factory=ColumnsConfig)
    chat_template: Optional[str] = MISSING
    eval_fraction: float = MISSING
    test_fraction: float = MISSING
    seed: int = MISSING
    max_line_bytes: Optional[int] = MISSING  # of a row, and of a line of a .jsonl file (rlhf_lab/data/files.py)
    max_total_bytes: Optional[int] = MISSING  # of a local file or folder (rlhf_lab/data/files.py); null: no limit


SCHEMAS = {
    ("world", "world_schema"): WorldConfig,
    ("gold", "gold_schema"): GoldSourceConfig,
    ("algo", "job_schema"): JobConfig,
    ("algo", "ppo_schema"): PPOConfig,
    ("algo", "dpo_schema"): DPOConfig,
    ("algo", "bon_schema"): BoNConfig,
    ("kl", "kl_schema"): KLConfig,
    ("reward_model", "reward_model_schema"): RewardModelConfig,
    ("generation", "generation_schema"): GenerationConfig,
    ("eval", "eval_schema"): EvalConfig,
    ("trainer", "trainer_schema"): TrainerConfig,
    ("data", "world_schema"): WorldDataConfig,
    ("data", "jsonl_schema"): JsonlDataConfig,
    ("data", "hf_schema"): HfDataConfig,
}


T = TypeVar("T")


def settings(node: Any, schema: type[T]) -> T:
    """A config group as the dataclass `schema` of this module: the typed settings a stage hands to the code below it
    (``settings(cfg.algo, PPOConfig)``). A node that lost its type (the config of a rank that ``rlhf-lab`` started
    itself, read back from YAML) is typed again by merging it into the schema."""
    if OmegaConf.get_type(node) is not schema:
        node = OmegaConf.merge(OmegaConf.structured(schema), node)
    return OmegaConf.to_object(node)


def register() -> None:
    """The schemas, and the resolver ``${rlhf_lab.pid:}`` (this process's id: a unique ``hydra.run.dir``)."""
    OmegaConf.register_new_resolver("rlhf_lab.pid", os.getpid, replace=True)
    cs = ConfigStore.instance()
    for (group, name), node in SCHEMAS.items():  # group schema/<group>: out of the groups users choose from
        cs.store(group=f"schema/{group}", name=name.removesuffix("_schema"), node=node)
