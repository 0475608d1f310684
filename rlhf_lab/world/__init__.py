"""The offline synthetic "reviews" world: generator, gold reward, biased labeler."""

from rlhf_lab.world.grammar import opener_product, split_sentences
from rlhf_lab.world.reviews import (
    GoldWeights,
    Labeler,
    ReviewGenerator,
    WorldSpec,
    count_fillers,
    gold_parts,
    gold_reward,
)

__all__ = [
    "GoldWeights", "Labeler", "ReviewGenerator", "WorldSpec", "count_fillers", "gold_parts",
    "gold_reward", "opener_product", "split_sentences",
]
