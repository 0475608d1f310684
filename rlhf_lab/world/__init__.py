"""The offline synthetic "reviews" world: generator, gold reward, biased labeler."""

from rlhf_lab.world.grammar import opener_product, prompt_focus, prompt_space, split_sentences
from rlhf_lab.world.reviews import (
    GoldWeights,
    Labeler,
    ReviewGenerator,
    WorldSpec,
    count_fillers,
    gold_parts,
    gold_reward,
)
from rlhf_lab.world.splits import ALL_SPLITS, PRETRAIN, SPLITS, Splits, check_split, prompt_hash

__all__ = [
    "GoldWeights", "Labeler", "ReviewGenerator", "WorldSpec", "count_fillers", "gold_parts",
    "gold_reward", "opener_product", "prompt_focus", "prompt_space", "split_sentences",
    "ALL_SPLITS", "PRETRAIN", "SPLITS", "Splits", "check_split", "prompt_hash",
]
