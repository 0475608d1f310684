"""Policy evaluation on a fixed set of held-out prompts: gold and proxy reward with their standard errors,
KL to the reference, diversity.

The same function (and so the same metric names, docs/metrics.md) serves SFT, PPO and DPO; the caller
picks the prompts (the eval, test or ood split, :func:`rlhf_lab.world.streams.eval_prompts`) and the prefix.
`<prefix>kl` is the sequence-level KL(π‖π_ref) in nats: the sum over response tokens of the k1 estimate
log π(y_t) − log π_ref(y_t) on samples from π, averaged over samples (unbiased).

Uncertainty: each prompt gets ``samples_per_prompt`` responses; `<prefix>gold_reward` is the mean of the
per-prompt means and `<prefix>gold_reward_se` its standard error clustered by prompt (sd of the
per-prompt means / √#prompts, :func:`rlhf_lab.evaluation.metrics.cluster_mean_se`); the same for the proxy reward.
``halves=True`` adds the two fixed halves of the prompts (:func:`rlhf_lab.evaluation.metrics.half_a`) as
`<prefix>gold_reward_a|_b` with their `_se`, for the split-half drop from the peak
(:func:`rlhf_lab.analysis.quantities.split_half_drop`). With a gold reward model (``gold=rm``) the gold is its score and
the world's formula is measured on the same samples as `<prefix>formula_gold_reward` (SE and halves likewise). With
``samples_per_prompt`` ≥ 2, a proxy and a gold, `<prefix>proxy_gold_agreement` is the proxy's accuracy against gold
on pairs of one prompt's responses (:func:`rlhf_lab.evaluation.metrics.pair_agreement`; SE clustered by prompt): how well the
RM ranks the evaluated policy's own samples (at step 0 the SFT policy's). ``seed`` samples with a fixed torch seed inside a forked
RNG: every evaluation of a run (and of every run) draws the same random numbers, and the training's RNG
stream does not depend on when or how often it evaluates.

Signals a user without a gold has, for choosing the checkpoint to ship: a proxy of several members
(``reward_model.ensemble`` ≥ 2) also logs `<prefix>proxy_ensemble_std`, the mean over samples of the population std
of its members' standardised scores (units of the SFT samples' spread; the measure of ``rm/ensemble_std``); a
held-out RM (``reward_model.heldout``, :mod:`rlhf_lab.stages.heldout`) logs `<prefix>heldout_reward` and its SE, the
same samples scored by an RM trained on pairs the proxy never saw.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

from rlhf_lab.config.schema import GenerationConfig
from rlhf_lab.evaluation.metrics import cluster_mean_se, distinct_n, filler_rate, half_a, pair_agreement, unique_rate
from rlhf_lab.models.sampling import Rollout, response_logprobs, sample
from rlhf_lab.world import GoldWeights, count_fillers, gold_reward

Scorer = Callable[[list[str], list[str], list[bool]], torch.Tensor]


class GoldScorer:
    """The world's gold reward g(x, y) as a scorer (``algo.reward=gold``, and the gold of every evaluation
    on world data)."""

    def __init__(self, w: GoldWeights):
        self.w = w

    def __call__(self, prompts, responses, ended) -> torch.Tensor:
        return torch.tensor([gold_reward(p, r, e, self.w) for p, r, e in zip(prompts, responses, ended)])


def as_gold_scorer(gold: GoldWeights | Scorer | None) -> Scorer | None:
    """A gold scorer from the world's weights (the formula), a scorer, or None (no gold: external data)."""
    return GoldScorer(gold) if isinstance(gold, GoldWeights) else gold


@dataclass(frozen=True)
class Gold:
    """The gold reward of a run (config group ``gold``; :func:`rlhf_lab.stages.gold.load_gold`).

    ``scorer``: the configured gold, behind every ``*/gold_reward*`` metric and the labels (the world's formula, a
    gold reward model, or None: no gold). ``formula``: the world's formula logged beside a gold RM under the
    ``formula_gold_reward`` names (None when the gold is the formula itself, or the data has no formula)."""

    scorer: Scorer | None
    formula: Scorer | None = None
    source: str = "formula"


@contextlib.contextmanager
def seeded_sampling(seed: int | None):
    """Sample under torch seed `seed` and restore the global RNG state afterwards (no-op for None)."""
    if seed is None:
        yield
        return
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if cuda else []):
        torch.manual_seed(int(seed))
        yield


@torch.no_grad()
def evaluate_policy(policy, tokenizer, prompts: list[str], gen: GenerationConfig, gold: GoldWeights | Scorer | None,
                    reference=None, scorer: Scorer | None = None, batch_size: int = 64, n_rows: int = 16,
                    samples_per_prompt: int = 1, prefix: str = "eval/", halves: bool = False, seed: int | None = None,
                    details: bool = True, formula_gold: Scorer | None = None, heldout: Scorer | None = None):
    """Sample `samples_per_prompt` responses per prompt with the ``generation`` settings `gen`; return
    ({metric: value}, rows of a samples table).

    ``details=False`` skips the policy and reference forward passes (entropy, KL) and the text statistics:
    only the rewards and their SEs, for a cheap extra slice. ``gold``: the world's gold weights or a gold
    scorer (a gold RM; one of several members also logs `<prefix>gold_rm_std`, their mean disagreement, and
    `<prefix>gold_rm_std_ratio`, that over its level on the gold's held-out pairs); None logs no gold metric (external
    data). ``formula_gold``: the world's formula beside a
    gold RM, logged as `<prefix>formula_gold_reward` (with its SE and halves) on the same samples. ``heldout``: the
    held-out RM, logged as `<prefix>heldout_reward` (with its SE); a proxy `scorer` of several members also logs
    `<prefix>proxy_ensemble_std` (module docstring)."""
    gold_fn = as_gold_scorer(gold)
    k = int(samples_per_prompt)
    if k < 1:
        raise ValueError(f"eval.samples_per_prompt must be >= 1, got {k}")
    flat = [p for p in prompts for _ in range(k)]
    groups = [i for i in range(len(prompts)) for _ in range(k)]
    golds, formula, proxy, kls, ents, lengths, texts, ended_all, spread = [], [], [], [], [], [], [], [], []
    held, proxy_spread = [], []
    ensemble_gold = getattr(gold_fn, "n_members", 1) > 1  # a gold RM of several members: log their disagreement
    ensemble_proxy = getattr(scorer, "n_members", 1) > 1  # a proxy of several: their disagreement, a gold-free signal
    with seeded_sampling(seed):
        for i in range(0, len(flat), batch_size):
            chunk = flat[i : i + batch_size]
            ro: Rollout = sample(policy, tokenizer, chunk, gen.max_new_tokens, gen.temperature, gen.top_k, gen.top_p,
                                 gen.max_prompt_len, sampler=gen.sampler)
            if details:
                logp, ent = response_logprobs(policy, ro.query_ids, ro.query_mask, ro.response_ids,
                                              ro.response_mask, gen.temperature or 1.0, with_entropy=True)
                n_tok = ro.response_mask.sum(-1).clamp(min=1)
                ents += (ent.sum(-1) / n_tok).tolist()
                if reference is not None:
                    ref_logp = response_logprobs(reference, ro.query_ids, ro.query_mask, ro.response_ids,
                                                 ro.response_mask, gen.temperature or 1.0)
                    kls += ((logp - ref_logp) * ro.response_mask).sum(-1).tolist()
            if ensemble_proxy:
                p, sd = scorer.scores_and_spread(chunk, ro.responses, ro.ended)
                proxy += p.tolist()
                proxy_spread += sd.tolist()
            elif scorer is not None:
                proxy += scorer(chunk, ro.responses, ro.ended).tolist()
            if heldout is not None:
                held += heldout(chunk, ro.responses, ro.ended).tolist()
            if gold_fn is not None:
                if ensemble_gold:
                    g, sd = gold_fn.scores_and_spread(chunk, ro.responses, ro.ended)
                    spread += sd.tolist()
                else:
                    g = gold_fn(chunk, ro.responses, ro.ended)
                golds += [float(x) for x in g]
            if formula_gold is not None:
                formula += [float(x) for x in formula_gold(chunk, ro.responses, ro.ended)]
            lengths += ro.lengths.tolist()
            texts += ro.responses
            ended_all += ro.ended
    mean = lambda xs: float(sum(xs) / len(xs)) if xs else float("nan")  # noqa: E731
    metrics: dict[str, float] = {f"{prefix}n_prompts": float(len(prompts))}  # the n of every figure (SEs over prompts)
    gold_measures = {name: vals for name, vals in (("gold_reward", golds), ("formula_gold_reward", formula)) if vals}
    rewards = {**gold_measures, **{name: vals for name, vals in (("proxy_reward", proxy), ("heldout_reward", held))
                                   if vals}}
    for name, vals in rewards.items():
        metrics[f"{prefix}{name}"], metrics[f"{prefix}{name}_se"] = cluster_mean_se(vals, groups)
    if proxy_spread:
        metrics[f"{prefix}proxy_ensemble_std"] = mean(proxy_spread)
    if spread:  # the gold's members disagree more off the text they were trained on: out of its depth
        metrics[f"{prefix}gold_rm_std"] = mean(spread)
        if gold_fn.heldout_spread:  # an ensemble gold is a RewardScorer
            metrics[f"{prefix}gold_rm_std_ratio"] = mean(spread) / float(gold_fn.heldout_spread)
    if proxy and golds and k >= 2:  # the proxy's accuracy against gold on pairs of these responses (C17)
        values, pair_groups = pair_agreement(proxy, golds, groups)
        if values:
            metrics[f"{prefix}proxy_gold_agreement"], metrics[f"{prefix}proxy_gold_agreement_se"] = cluster_mean_se(
                values, pair_groups)
    if halves and gold_measures:
        in_a = half_a(prompts)
        for half, want in (("a", True), ("b", False)):
            sel = [j for j, g in enumerate(groups) if in_a[g] == want]
            for name, vals in gold_measures.items():
                m, se = cluster_mean_se([vals[j] for j in sel], [groups[j] for j in sel])
                metrics[f"{prefix}{name}_{half}"], metrics[f"{prefix}{name}_{half}_se"] = m, se
    if not details:
        return metrics, []
    if kls:
        metrics[f"{prefix}kl"] = mean(kls)
    metrics[f"{prefix}length"] = mean(lengths)
    metrics[f"{prefix}filler_rate"] = filler_rate(texts)
    metrics[f"{prefix}distinct_1"] = distinct_n(texts, 1)
    metrics[f"{prefix}distinct_2"] = distinct_n(texts, 2)
    metrics[f"{prefix}unique_rate"] = unique_rate(texts)
    metrics[f"{prefix}entropy"] = mean(ents)
    metrics[f"{prefix}eos_rate"] = mean([float(e) for e in ended_all])
    rows = []
    for j in range(min(n_rows, len(texts))):
        row = {"prompt": flat[j], "response": texts[j], "ended": ended_all[j], "fillers": count_fillers(texts[j])}
        if golds:
            row["gold"] = round(golds[j], 4)
        if formula:
            row["formula_gold"] = round(formula[j], 4)
        if proxy:
            row["proxy"] = round(proxy[j], 4)
        rows.append(row)
    return metrics, rows
