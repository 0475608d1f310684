"""The held-out reward model of ``reward_model.heldout``: what a careful practitioner trains beside the proxy, on
preference pairs the proxy never saw, to read the policy's samples with an RM that was not optimised against.

A policy job (ppo, grpo, rloo, dpo) with it also has the ``rm`` stage train a second RM: the proxy's recipe with one
member, on pairs of its own (:data:`rlhf_lab.stages.prefs.HELDOUT_STREAM`: none of the proxy's prompts, other seeds;
the same eval pairs). Every evaluation then logs ``eval/heldout_reward`` (and ``_se``), normalised as the proxy is.
World data only: a dataset's training pairs are all the proxy's. It can see the proxy's *errors*, where RMs of other
data disagree, but not a bias of the labeler both RMs learned from (length, filler).
"""

from __future__ import annotations

import copy
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from rlhf_lab.config.errors import ConfigError
from rlhf_lab.config.keys import to_plain
from rlhf_lab.models import families as F
from rlhf_lab.models.reward import RewardScorer
from rlhf_lab.stages.pipeline import ensure

KEY = "reward_model.heldout"


def wanted(cfg: DictConfig) -> bool:
    """Whether the job trains and reads the held-out RM (``reward_model.heldout``)."""
    rc = cfg.get("reward_model")
    return bool(rc is not None and rc.get("heldout"))


def heldout_config(cfg: DictConfig) -> DictConfig:
    """The config whose ``rm`` stage is the held-out RM: `cfg` with one member and its pairs marked ``data.heldout``
    (:func:`rlhf_lab.stages.prefs.spec`). A :class:`~rlhf_lab.config.errors.ConfigError` (one line, exit 2) with
    external data or a given RM (``reward_model.path``: its pairs are not known here)."""
    if cfg.data.source != "world":
        raise ConfigError(KEY, True, f"false with data={cfg.data.source}: every training pair of a dataset is the "
                                     "proxy's; train another RM on pairs of your own (algo=rm) instead")
    if cfg.reward_model.get("path"):
        raise ConfigError(KEY, True, "false with reward_model.path set: the pairs of a given RM are not known here, "
                                     "so none can be held out from it")
    c = copy.deepcopy(cfg)
    with open_dict(c):
        c.data = OmegaConf.create({**to_plain(cfg.data), "heldout": True})  # a mark no schema has: an untyped node
        c.reward_model.ensemble = 1
        c.reward_model.heldout = False
    return c


def spec(cfg: DictConfig) -> dict:
    """A policy job's spec entry: ``{"heldout_rm": folder}`` (the held-out RM, built first when missing) with
    ``reward_model.heldout``, else nothing (the specs of jobs without it are as before)."""
    return {"heldout_rm": str(ensure("rm", heldout_config(cfg)))} if wanted(cfg) else {}


def load_scorer(cfg: DictConfig, path) -> RewardScorer:
    """The held-out RM of `path` (:func:`spec`) as a scorer, normalised as ``reward_model.normalize`` says."""
    rc = cfg.reward_model
    return RewardScorer.from_path(Path(path), normalize=rc.normalize, conservative_lambda=0.0,
                                  options=F.load_options(rc), key=KEY)
