"""Policy evaluation on held-out prompts: gold and proxy reward, KL to the reference, diversity.

The same function (and so the same metric names, docs/metrics.md) serves SFT, PPO and DPO.
`eval/kl` is the sequence-level KL(π‖π_ref) in nats: the sum over response tokens of the k1 estimate
log π(y_t) − log π_ref(y_t) on samples from π, averaged over samples (unbiased).
"""

from __future__ import annotations

from typing import Callable

import torch

from rlhf_lab.metrics import distinct_n, filler_rate, unique_rate
from rlhf_lab.models.sampling import Rollout, response_logprobs, sample
from rlhf_lab.world import GoldWeights, count_fillers, gold_reward

Scorer = Callable[[list[str], list[str], list[bool]], torch.Tensor]


@torch.no_grad()
def evaluate_policy(policy, tokenizer, prompts: list[str], gen, gold_w: GoldWeights, reference=None,
                    scorer: Scorer | None = None, batch_size: int = 64, n_rows: int = 16):
    """Sample once per prompt; return ({metric: value}, rows of a samples table)."""
    metrics: dict[str, float] = {}
    gold, proxy, kls, ents, lengths, texts, ended_all, ps = [], [], [], [], [], [], [], []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i : i + batch_size]
        ro: Rollout = sample(policy, tokenizer, chunk, gen.max_new_tokens, gen.temperature, gen.top_k, gen.top_p,
                             gen.get("max_prompt_len"))
        logp, ent = response_logprobs(policy, ro.query_ids, ro.query_mask, ro.response_ids, ro.response_mask,
                                      gen.temperature or 1.0, with_entropy=True)
        n_tok = ro.response_mask.sum(-1).clamp(min=1)
        ents += (ent.sum(-1) / n_tok).tolist()
        if reference is not None:
            ref_logp = response_logprobs(reference, ro.query_ids, ro.query_mask, ro.response_ids,
                                         ro.response_mask, gen.temperature or 1.0)
            kls += ((logp - ref_logp) * ro.response_mask).sum(-1).tolist()
        if scorer is not None:
            proxy += scorer(chunk, ro.responses, ro.ended).tolist()
        gold += [gold_reward(p, r, e, gold_w) for p, r, e in zip(chunk, ro.responses, ro.ended)]
        lengths += ro.lengths.tolist()
        texts += ro.responses
        ended_all += ro.ended
        ps += chunk
    mean = lambda xs: float(sum(xs) / len(xs)) if xs else float("nan")  # noqa: E731
    metrics["eval/gold_reward"] = mean(gold)
    if proxy:
        metrics["eval/proxy_reward"] = mean(proxy)
    if kls:
        metrics["eval/kl"] = mean(kls)
    metrics["eval/length"] = mean(lengths)
    metrics["eval/filler_rate"] = filler_rate(texts)
    metrics["eval/distinct_1"] = distinct_n(texts, 1)
    metrics["eval/distinct_2"] = distinct_n(texts, 2)
    metrics["eval/unique_rate"] = unique_rate(texts)
    metrics["eval/entropy"] = mean(ents)
    metrics["eval/eos_rate"] = mean([float(e) for e in ended_all])
    rows = []
    for j in range(min(n_rows, len(texts))):
        row = {"prompt": ps[j], "response": texts[j], "gold": round(gold[j], 4), "ended": ended_all[j],
               "fillers": count_fillers(texts[j])}
        if proxy:
            row["proxy"] = round(proxy[j], 4)
        rows.append(row)
    return metrics, rows
