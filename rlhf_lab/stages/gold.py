"""The gold reward of a run (config group ``gold``): the world's formula, or a frozen reward model.

- ``gold=formula`` (default): the world's formula g(x, y) (weights ``world.gold``) with ``data=world``; external
  data has no formula and no gold metric.
- ``gold=rm`` with ``gold.path``: a trained RM artifact folder (e.g. an ``algo=rm`` job's ``artifact`` folder),
  loaded as ``reward_model.path`` is and never trained: Gao et al. 2022's setup, in which a large "gold" RM labels
  the data of smaller proxy RMs. It works on any data.
- ``gold=rm_world``: ``gold=rm`` whose RM is built on the world (``gold.build``, :func:`build_config`) and cached.

The gold labels the preference pairs (the labeler's biases on top; external pairs are relabelled) and gives every
gold metric (``*/gold_reward*``, ``objective/gold``, the RM's ``*_gold``) and ``algo.reward=gold``; with an RM gold on
the world the formula is logged beside it under the ``formula_gold`` names. An RM gold's unit is its normalised score
(mean 0, std 1 on the SFT samples of its own pairs), not the formula's. Its content digest (:func:`identity`) enters
the spec of the pairs and of everything trained on them; the formula adds nothing, so earlier keys stay valid. An
upstream pretrain or SFT run (the same model for any gold) is evaluated with the formula.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from rlhf_lab.config.checks import check_gold
from rlhf_lab.config.choices import GoldSource
from rlhf_lab.config.keys import to_plain
from rlhf_lab.runs.contents import path_digest
from rlhf_lab.evaluation.policy import Gold
from rlhf_lab.models.reward import RewardScorer
from rlhf_lab.stages.evaluate import world_gold
from rlhf_lab.stages.pipeline import ensure
from rlhf_lab.stages.presets import preset

BUILD_JOB = "gold_rm"  # algo.name of the config that builds the gold RM: no stage of it is the job


def is_rm(cfg: DictConfig) -> bool:
    """Whether the gold is a reward model (``gold.source=rm``); a config without the group has the formula."""
    g = cfg.get("gold")
    return g is not None and str(g.source) == GoldSource.rm


def build_config(cfg: DictConfig) -> DictConfig:
    """The config whose ``rm`` stage is the gold RM of ``gold.build``: `cfg` with the formula as its gold (its pairs
    are labelled by the formula), the labeler preset ``gold.build.labeler``, ``gold.build.reward_model`` and
    ``gold.build.data`` set over the job's groups, and an ``algo`` that is no stage (every stage is upstream: group
    seeds and steps). The config has passed :func:`rlhf_lab.config.checks.check_gold` (:func:`rm_path`)."""
    b = cfg.gold.build
    c = copy.deepcopy(cfg)
    with open_dict(c):
        c.gold = {"source": "formula", "path": None, "build": None}
        c.labeler = preset("labeler", str(b.labeler), "gold.build.labeler")
        c.reward_model = OmegaConf.merge(c.reward_model, b.get("reward_model") or {})
        c.data = OmegaConf.merge(c.data, b.get("data") or {})
        if b.get("covers"):  # the policies that hacked proxies, made first: their samples are the on-policy pairs
            c.data.on_policy_path = cover_folders(cfg)
        c.algo = {"name": BUILD_JOB}
    return c


COVER_STUDY = "gold_cover"  # the study of the cover policies' runs
COVER_EVERY = 10  # a cover's evaluations: every 10 PPO steps
SHARED_GROUPS = ("world", "policy", "generation", "pretrain", "sft", "trainer", "tracking", "cache_dir")


COVER_FOLDERS: dict[str, list[str]] = {}


def cover_folders(cfg: DictConfig) -> list[str]:
    """The folders of ``gold.build.covers``' policies (stage ``cover``, each built first when missing), in order;
    resolved once per process for the same world, policy and gold (each is a Hydra composition and a cache look-up)."""
    key = json.dumps(to_plain({k: cfg[k] for k in (*SHARED_GROUPS, "gold")}), sort_keys=True, default=str)
    if key not in COVER_FOLDERS:
        COVER_FOLDERS[key] = [str(ensure("cover", cover_config(cfg, cover))) for cover in cfg.gold.build.covers]
    return COVER_FOLDERS[key]


def cover_config(cfg: DictConfig, cover: DictConfig) -> DictConfig:
    """The config of one of ``gold.build.covers`` (stage ``cover``): the default PPO job (``algo=ppo kl=fixed``: its
    proxy RM, the pairs it learns and their labeler at their defaults) on the job's world and policy (its
    :data:`SHARED_GROUPS`), with the cover's seed (its proxy's ``reward_model.seed`` too), ``kl.beta`` and
    ``algo.steps``, an evaluation every :data:`COVER_EVERY` steps, study :data:`COVER_STUDY`, and
    ``gold.build.cover_overrides`` (say, LoRA for a large policy); the same for every job of a study, whatever its
    algorithm and arms. A cover of round r > 1 trained against a proxy whose pairs this gold,
    built from the covers of rounds below r (``gold.build.cover_gold_data`` over its data), labelled."""
    b = cfg.gold.build
    c = default_config(["algo=ppo", "kl=fixed", f"eval.every_n_steps={COVER_EVERY}",
                        *[str(o) for o in b.get("cover_overrides") or []], f"kl.beta={float(cover.beta)}",
                        f"algo.steps={int(cover.steps)}", f"seed={int(cover.seed)}",
                        f"reward_model.seed={int(cover.seed)}", f"study={COVER_STUDY}"])
    with open_dict(c):
        for key in SHARED_GROUPS:
            c[key] = copy.deepcopy(cfg[key])
        if c.generation.get("dtype") is not None:  # a job's rollout precision: not its gold's covers (one per study)
            c.generation.dtype = None
        if int(cover.get("round", 1)) > 1:
            earlier = copy.deepcopy(cfg.gold)
            earlier.build.covers = [x for x in b.covers if int(x.get("round", 1)) < int(cover.round)]
            earlier.build.data = OmegaConf.merge(earlier.build.data, b.get("cover_gold_data") or {})
            earlier.build.cover_gold_data = None
            c.gold = earlier
    return c


def default_config(overrides: list[str]) -> DictConfig:
    """The config ``rlhf-lab <overrides>`` composes (Hydra's compose API: inside a run, its initialised Hydra)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return compose("config", overrides=overrides)
    with initialize_config_module("rlhf_lab.conf", version_base="1.3"):
        return compose("config", overrides=overrides)


def rm_path(cfg: DictConfig) -> Path:
    """The gold RM's artifact folder: ``gold.path`` as it is, else the RM of ``gold.build`` (built first when missing,
    with its pairs, backbone and SFT, each as its own MLflow run; then cached). The ``gold`` group is checked first
    as the CLI checks it (:func:`rlhf_lab.config.checks.check_gold`: one line naming ``gold.path``)."""
    check_gold(cfg)
    given = cfg.gold.get("path")
    return Path(str(given)).expanduser() if given else Path(ensure("rm", build_config(cfg)))


def identity(cfg: DictConfig) -> dict | None:
    """The gold as part of a cache spec: None for the formula (earlier keys stay valid), else the gold RM's content
    digest (weights, tokenizer, ``rm_norm.json``; not the cache's bookkeeping files:
    :func:`rlhf_lab.runs.contents.path_digest`), so a copy of it elsewhere is the same gold and weights copied over
    it another one."""
    if not is_rm(cfg):
        return None
    return {"source": "rm", "digest": path_digest(rm_path(cfg).resolve())}


def load_scorer(cfg: DictConfig) -> RewardScorer:
    """The gold RM as a scorer: normalised (its rm_norm.json), the mean of its members, never trained."""
    return RewardScorer.from_path(rm_path(cfg), normalize=True, conservative_lambda=0.0,
                                  key="gold.path" if cfg.gold.get("path") else "gold RM")


def label_scorer(cfg: DictConfig) -> RewardScorer | None:
    """The gold the labeler starts from: the gold RM, or None for the formula (its exact values)."""
    return load_scorer(cfg) if is_rm(cfg) else None


def load_gold(cfg: DictConfig) -> Gold:
    """The job's gold: the formula (None with external data), or the gold RM with the formula beside it."""
    formula = world_gold(cfg)
    if not is_rm(cfg):
        return Gold(formula, None, "formula")
    return Gold(load_scorer(cfg), formula, "rm")


def describe(cfg: DictConfig) -> str:
    """One line for a job summary: which gold the run's gold metrics are."""
    if not is_rm(cfg):
        return "the world's formula" if cfg.data.source == "world" else "none (external data)"
    g = cfg.gold
    where = str(g.path) if g.get("path") else f"gold.build ({rm_path(cfg)})"
    return f"gold RM {where}: its normalised score" + (", the formula as formula_gold_reward"
                                                       if cfg.data.source == "world" else "")
