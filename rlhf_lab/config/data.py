"""The data settings as the data code takes them, resolved from the config at a stage's boundary: how pairs are
labelled (:func:`labelling`: the ``labeler`` group and the world's gold weights) and ``data=jsonl|hf``
(:func:`external_data`)."""

from __future__ import annotations

from omegaconf import DictConfig

from rlhf_lab.config.keys import to_plain
from rlhf_lab.config.world import gold_weights, labeler
from rlhf_lab.data.preferences import ExternalData, Labelling


def labelling(cfg: DictConfig) -> Labelling:
    return Labelling(labeler=labeler(cfg), weights=gold_weights(cfg))


def external_data(cfg: DictConfig) -> ExternalData:
    policy = cfg.get("policy")
    path = policy.get("name_or_path") if policy is not None else None
    return ExternalData(data=to_plain(cfg.data), policy=str(path) if path else None)
