"""The gold reward of a run (config group ``gold``): the world's formula, or a frozen reward model.

- ``gold=formula`` (default): the world's formula g(x, y) (weights ``world.gold``) with ``data=world``; external
  data has no formula and no gold metric.
- ``gold=rm`` with ``gold.path``: a trained RM artifact folder (the ``artifact`` folder of an ``algo=rm`` job, or a
  cached RM), loaded as ``reward_model.path`` is (:class:`rlhf_lab.models.reward.RewardScorer`), never trained:
  Gao et al. 2022's setup, in which a large "gold" RM labels the data of smaller proxy RMs. It works on any data.
- ``gold=rm_world``: ``gold=rm`` whose RM is built on the world (``gold.build``, :func:`build_config`): a large
  same-source RM trained on the formula's labels, cached like any stage, so a study needs no folder.

What the gold is used for (each stage asks here): the labels of the preference pairs (the labeler's biases on top
of the gold, :func:`rlhf_lab.data.preferences.label_pairs`; external pairs are relabelled) and the gold rewards they
record (``rm/accuracy_gold``, ``rm/spearman_gold``, ``prefs/label_gold_agreement``); every ``*/gold_reward*``
metric of the job (``eval/``, ``test/``, ``bon/``), ``objective/gold`` and the reward-hacking monitor; and
``algo.reward=gold``. With an RM gold on the world, the formula is logged beside it under the ``formula_gold``
names (:class:`rlhf_lab.evaluation.policy.Gold`), so one run carries both measures.

Scale: with an RM gold, ``eval/gold_reward`` is the gold RM's normalised score, ``gain · raw + bias`` of its
``rm_norm.json``: mean 0 and standard deviation 1 on the SFT samples it was normalised on (its own training pairs'
responses); not the formula's units.

Cache: the gold RM's content digest (:func:`identity`) is part of the spec of the preference pairs, hence of every
RM and DPO policy trained on them, and of the RM and DPO specs of external data; the formula adds nothing, so every
key computed before this group existed is unchanged. An upstream pretrain or SFT run (its model is the same for any
gold) is evaluated with the formula; the job is evaluated with the configured gold.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from rlhf_lab.config.choices import GoldSource
from rlhf_lab.config.keys import to_plain
from rlhf_lab.runs.contents import path_digest
from rlhf_lab.evaluation.policy import Gold
from rlhf_lab.models.reward import NORM_FILE, RewardScorer
from rlhf_lab.stages.evaluate import world_gold
from rlhf_lab.stages.pipeline import ensure

BUILD_JOB = "gold_rm"  # algo.name of the config that builds the gold RM: no stage of it is the job
FOLDER_HINT = "give the artifact folder of an algo=rm job (or gold=rm_world to build a gold RM on the world)"


def source(cfg: DictConfig) -> str:
    """``gold.source``: formula or rm (a config without the group is the formula)."""
    g = cfg.get("gold")
    s = "formula" if g is None else str(g.source)
    if s not in tuple(GoldSource):
        raise ValueError(f"gold.source={s!r}; choose one of {', '.join(GoldSource)} (gold=formula|rm|rm_world)")
    return s


def is_rm(cfg: DictConfig) -> bool:
    return source(cfg) == "rm"


def labeler_preset(name: str) -> DictConfig:
    """A labeler as ``labeler=<name>`` composes it (``conf/labeler/<name>.yaml``)."""
    from importlib.resources import files

    folder = files("rlhf_lab.conf").joinpath("labeler")
    f = folder.joinpath(f"{name}.yaml")
    if not f.is_file():
        names = sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))
        raise ValueError(f"gold.build.labeler: no labeler preset {name!r}; the presets are {', '.join(names)}")
    return OmegaConf.create(f.read_text())


def build_config(cfg: DictConfig) -> DictConfig:
    """The config whose ``rm`` stage is the gold RM of ``gold.build``: `cfg` with the formula as its gold (its pairs
    are labelled by the formula), the labeler preset ``gold.build.labeler``, ``gold.build.reward_model`` and
    ``gold.build.data`` set over the job's groups, and an ``algo`` that is no stage (every stage is upstream: group
    seeds and steps)."""
    b = cfg.gold.get("build")
    if b is None:
        raise ValueError(f"gold.path is required with gold=rm: {FOLDER_HINT}")
    if cfg.data.source != "world":
        raise ValueError(f"gold.path is required with data={cfg.data.source}: gold=rm_world builds its RM on the "
                         "world's formula; give gold=rm gold.path=<a reward-model artifact folder>")
    c = copy.deepcopy(cfg)
    with open_dict(c):
        c.gold = {"source": "formula", "path": None, "build": None}
        c.labeler = labeler_preset(str(b.labeler))
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
    with its pairs, backbone and SFT, each as its own MLflow run; then cached)."""
    g = cfg.gold
    if "path" in g.keys() and OmegaConf.is_missing(g, "path"):
        raise ValueError(f"gold.path is required with gold=rm: {FOLDER_HINT}")
    given = g.get("path")
    if given:
        p = Path(str(given)).expanduser()
        if not (p / NORM_FILE).is_file():
            raise FileNotFoundError(f"gold.path={str(given)!r} is not a reward-model artifact folder (no {NORM_FILE}); "
                                    f"{FOLDER_HINT}")
        return p
    return Path(ensure("rm", build_config(cfg)))


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
