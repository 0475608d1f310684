"""The world's settings as the world's code takes them, resolved from the config at a stage's boundary: the streams'
settings (:func:`world_settings`), the text settings, the gold formula's weights, the labeler, the splits, and the
part of the world config an artifact's cache key holds (:func:`world_generation_spec`)."""

from __future__ import annotations

from omegaconf import DictConfig

from rlhf_lab.world import GoldWeights, Labeler, Splits, WorldSpec
from rlhf_lab.world.streams import EVAL_SIZE_KEYS, WorldSettings


def world_settings(cfg: DictConfig) -> WorldSettings:
    return WorldSettings(seed=int(cfg.world.seed), spec=world_spec(cfg), splits=splits(cfg))


def eval_size(cfg: DictConfig, split: str) -> int:
    """How many evaluation prompts of `split` (eval, test or ood) the config asks for (``eval.<size key>``)."""
    return int(cfg.eval[EVAL_SIZE_KEYS[split]])


def world_spec(cfg: DictConfig) -> WorldSpec:
    w = cfg.world
    return WorldSpec(max_sentences=w.max_sentences, mean_sentences=w.mean_sentences, filler_rate=w.filler_rate,
                     adverb_rate=w.adverb_rate, sentiment_noise=w.sentiment_noise)


def gold_weights(cfg: DictConfig) -> GoldWeights:
    return GoldWeights(**dict(cfg.world.gold))


def labeler(cfg: DictConfig) -> Labeler:
    lab = cfg.labeler
    return Labeler(temperature=lab.temperature, length_bonus=lab.length_bonus, filler_bonus=lab.filler_bonus)


def splits(cfg: DictConfig) -> Splits:
    sp = cfg.world.splits
    return Splits(train=float(sp.train), eval=float(sp.eval), test=float(sp.test),
                  ood_products=tuple(str(p) for p in cfg.world.ood_products))


def world_generation_spec(cfg: DictConfig) -> dict:
    """The part of the world config that determines generated text (not the reward), splits included."""
    spec = {k: cfg.world[k] for k in ("name", "seed", "max_sentences", "mean_sentences", "filler_rate",
                                      "adverb_rate", "sentiment_noise")}
    sp = splits(cfg)
    spec["splits"] = {"train": sp.train, "eval": sp.eval, "test": sp.test, "ood_products": list(sp.ood_products)}
    return spec
