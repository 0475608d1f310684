"""The reward model's LightningModule and its evaluation: a scalar head on a decoder, Bradley–Terry loss on
preference pairs. The stage that trains it (``algo=rm``) is :mod:`rlhf_lab.stages.rm`.

Loss (Ouyang et al. 2022 eq. 1; ``dpo_math.bradley_terry_loss``)::

    L = mean(−log σ(r(x, y_chosen) − r(x, y_rejected) − m)) + center_coef · mean((r_chosen + r_rejected)²)

with the margin ``m`` (``reward_model.margin: true``, Llama 2 eq. 2) taken from the annotator's strength
of preference: the labeler's utility gap u(chosen) − u(rejected), clipped to [0, 1] (world data only).

After training, every ensemble member is normalised on SFT samples (the training pairs' responses
sampled from the SFT policy) and the held-out pairs are scored (:func:`evaluate_rm`):
accuracy against the labeler and against gold, the RM's extra preference for length and filler phrases
relative to gold, Spearman correlation with gold over the held-out (SFT-policy) responses.
"""

from __future__ import annotations

import random
import time

import torch

from rlhf_lab.runs import distributed
from rlhf_lab.algorithms.dpo_math import bradley_terry_loss
from rlhf_lab.algorithms.lm import TrainingModule, logging_step
from rlhf_lab.world import GoldWeights, Labeler
from rlhf_lab.models.batching import pack_rows, pad_right
from rlhf_lab.models.packing import check_packing
from rlhf_lab.models.reward import RewardScorer, encode_texts, packable, rm_forward, rm_forward_packed

MEMBER_SEED_STRIDE = 7919
LENGTH_BUCKETS = ((0, 10, "short"), (10, 20, "medium"), (20, 10**9, "long"))  # mean words of the pair


class RewardModelModule(TrainingModule):
    """Trains one RM on batches of [chosen..., rejected...] sequences, all in one forward pass: right-padded, or
    packed into rows without padding (:func:`collate_rm_pairs`)."""

    def __init__(self, model, lr: float, weight_decay: float = 0.0, warmup_steps: int = 20, max_steps: int = 1000,
                 use_margin: bool = False, center_coef: float = 0.0, prefix: str = ""):
        super().__init__(model, lr, weight_decay, warmup_steps, max_steps)
        self.use_margin, self.center_coef, self.prefix = bool(use_margin), float(center_coef), prefix
        self._packing_checked = False

    def rewards(self, batch) -> torch.Tensor:
        """r [2B] of a collated batch, chosen first: packed (``position_ids``; the model's packing is checked
        once, :func:`rlhf_lab.models.packing.check_packing`) or right-padded (``attention_mask``)."""
        if "position_ids" in batch:
            if not self._packing_checked:
                if not packable(self.model):
                    raise ValueError(f"reward_model.packing=true needs a decoder reward model with a score head; "
                                     f"{type(self.model).__name__} is not one: set reward_model.packing=false")
                check_packing(self.model, "reward_model.packing")
                self._packing_checked = True
            return rm_forward_packed(self.model, batch["input_ids"], batch["position_ids"], batch["last_index"])
        return rm_forward(self.model, batch["input_ids"], batch["attention_mask"])

    def training_step(self, batch, batch_idx):
        t0 = time.perf_counter()
        r = self.rewards(batch)
        B = r.shape[0] // 2
        rc, rr = r[:B], r[B:]
        loss = bradley_terry_loss(rc, rr, batch["margin"] if self.use_margin else None, self.center_coef)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite RM loss ({loss.item()}) at step {self.global_step}; "
                                     "lower reward_model.lr")
        if logging_step(self):
            p = self.prefix
            kw = dict(batch_size=B, sync_dist=distributed.world_size() > 1)  # metrics: mean over ranks
            self.log(f"{p}loss/rm", loss, prog_bar=True, **kw)
            self.log(f"{p}rewards/chosen", rc.detach().mean(), **kw)
            self.log(f"{p}rewards/rejected", rr.detach().mean(), **kw)
            self.log(f"{p}rewards/margins", (rc - rr).detach().mean(), **kw)
            self.log(f"{p}rewards/accuracies", (rc > rr).float().mean(), **kw)
            self.log_timing(t0, lambda: float(batch["lengths"].sum()), p, **kw)
        self._t = t0
        return loss


# ------------------------------------------------------------------------------------------------
# data


def pair_margins(pairs, labeler: Labeler, weights: GoldWeights, world_data: bool) -> list[float]:
    """Margin per pair: the labeler's utility gap u(chosen) − u(rejected), clipped to [0, 1], with u the gold the
    pair records (the formula, or a gold RM's score) plus the labeler's biases; pairs without recorded gold use
    the world's formula (`weights`), which only the world's data (`world_data`, ``data=world``) has."""
    recorded = all(p.gold_chosen is not None and p.gold_rejected is not None for p in pairs)
    if not world_data and not recorded:
        raise ValueError("reward_model.margin=true needs the annotator's strength of preference, which only "
                         "data=world (or a gold RM, gold=rm) has; set reward_model.margin=false for external "
                         "preference data")
    from rlhf_lab.world import gold_reward

    out = []
    for p in pairs:
        gc = p.gold_chosen if recorded else gold_reward(p.prompt, p.chosen, p.chosen_ended, weights)
        gr = p.gold_rejected if recorded else gold_reward(p.prompt, p.rejected, p.rejected_ended, weights)
        gap = labeler.utility_from_gold(gc, p.chosen) - labeler.utility_from_gold(gr, p.rejected)
        out.append(min(1.0, max(0.0, gap)))
    return out


def encode_rm_pairs(tokenizer, pairs, max_len: int, margins: list[float] | None = None) -> list[dict]:
    n = len(pairs)
    prompts = [p.prompt for p in pairs]
    chosen = encode_texts(tokenizer, prompts, [p.chosen for p in pairs], [p.chosen_ended for p in pairs], max_len)
    rejected = encode_texts(tokenizer, prompts, [p.rejected for p in pairs], [p.rejected_ended for p in pairs], max_len)
    margins = margins or [0.0] * n
    return [{"chosen": c, "rejected": r, "margin": m} for c, r, m in zip(chosen, rejected, margins)]


def collate_rm_pairs(pad_id: int, packed: bool = False):
    """Batches of pairs as one forward pass's inputs, the B chosen sequences first, then the B rejected ones:
    right-padded (``input_ids``, ``attention_mask`` [2B, T]) or, with ``packed``, packed into rows as long as the
    longest sequence (``input_ids``, ``position_ids`` [R, W], ``last_index`` [2B]: :func:`rlhf_lab.models.batching.pack_rows`).
    Also ``lengths`` [2B] (tokens per sequence) and ``margin`` [B]."""

    def collate(batch: list[dict]) -> dict:
        seqs = [b["chosen"] for b in batch] + [b["rejected"] for b in batch]
        out = {"lengths": torch.tensor([len(s) for s in seqs]),
               "margin": torch.tensor([b["margin"] for b in batch], dtype=torch.float32)}
        if packed:
            out["input_ids"], out["position_ids"], out["last_index"] = pack_rows(seqs, pad_id)
        else:
            out["input_ids"], out["attention_mask"] = pad_right(seqs, pad_id)
        return out

    return collate


# ------------------------------------------------------------------------------------------------
# evaluation


def _win(a: float, b: float) -> float:
    return 1.0 if a > b else 0.5 if a == b else 0.0


def _mean(xs) -> float:
    xs = list(xs)
    return float(sum(xs) / len(xs)) if xs else float("nan")


def preference_metrics(pairs, s_chosen, s_rejected) -> dict[str, float]:
    """Held-out metrics from the RM's scores of each pair's chosen and rejected responses.

    - rm/accuracy: fraction of pairs the RM orders as the labeler did (a tie counts 1/2);
    - rm/accuracy_gold: the same against gold, over pairs whose gold rewards differ;
    - rm/length_preference: over pairs whose responses differ in word count, the rate at which the RM
      prefers the longer response minus the rate at which gold does (> 0: the RM likes length more
      than gold); rm/filler_preference likewise for the response with more filler phrases;
    - accuracy by the pair's mean length (short < 10 words <= medium < 20 <= long) and by filler presence.
    Gold metrics are absent when the pairs carry no gold rewards (external data).
    """
    from rlhf_lab.world import count_fillers

    sc, sr = [float(x) for x in s_chosen], [float(x) for x in s_rejected]
    if not (len(pairs) == len(sc) == len(sr)):
        raise ValueError("one chosen and one rejected score per pair")
    if not pairs:
        return {}
    has_gold = all(p.gold_chosen is not None and p.gold_rejected is not None for p in pairs)
    acc = [_win(c, r) for c, r in zip(sc, sr)]
    m: dict[str, float] = {"rm/accuracy": _mean(acc), "rm/n_eval_pairs": float(len(pairs))}
    gold_acc = [None] * len(pairs)
    if has_gold:
        for i, p in enumerate(pairs):
            if p.gold_chosen != p.gold_rejected:
                gold_acc[i] = _win(sc[i], sr[i]) if p.gold_chosen > p.gold_rejected else _win(sr[i], sc[i])
        m["rm/accuracy_gold"] = _mean(a for a in gold_acc if a is not None)
        m["rm/label_gold_agreement"] = _mean(float(p.gold_chosen > p.gold_rejected) for p in pairs
                                             if p.gold_chosen != p.gold_rejected)

    def feature_preference(feature, name: str):
        rm_w, gold_w, lab_w = [], [], []
        for p, c, r in zip(pairs, sc, sr):
            fc, fr = feature(p.chosen), feature(p.rejected)
            if fc == fr:
                continue
            c_more = fc > fr  # is "chosen" the response with more of the feature?
            rm_w.append(_win(c, r) if c_more else _win(r, c))
            lab_w.append(1.0 if c_more else 0.0)
            if has_gold:
                gold_w.append(_win(p.gold_chosen, p.gold_rejected) if c_more else _win(p.gold_rejected, p.gold_chosen))
        if not rm_w:
            return
        m[f"rm/{name}_win_rate"] = _mean(rm_w)
        m[f"rm/label_{name}_win_rate"] = _mean(lab_w)
        if has_gold:
            m[f"rm/gold_{name}_win_rate"] = _mean(gold_w)
            m[f"rm/{'length' if name == 'longer' else 'filler'}_preference"] = _mean(rm_w) - _mean(gold_w)

    feature_preference(lambda t: len(t.split()), "longer")
    feature_preference(count_fillers, "more_filler")

    def bucket_metrics(name: str, member):
        idx = [i for i, p in enumerate(pairs) if member(p)]
        if not idx:
            return
        m[f"rm/accuracy_{name}"] = _mean(acc[i] for i in idx)
        m[f"rm/n_pairs_{name}"] = float(len(idx))
        if has_gold:
            g = [gold_acc[i] for i in idx if gold_acc[i] is not None]
            if g:
                m[f"rm/accuracy_gold_{name}"] = _mean(g)

    for lo, hi, name in LENGTH_BUCKETS:
        bucket_metrics(f"len_{name}", lambda p, lo=lo, hi=hi: lo <= (len(p.chosen.split()) + len(p.rejected.split())) / 2 < hi)
    bucket_metrics("filler", lambda p: count_fillers(p.chosen) + count_fillers(p.rejected) > 0)
    bucket_metrics("no_filler", lambda p: count_fillers(p.chosen) + count_fillers(p.rejected) == 0)
    return m


def spearman(x, y) -> float:
    from scipy.stats import spearmanr

    if len(x) < 3:
        return float("nan")
    return float(spearmanr(list(x), list(y)).statistic)


def evaluate_rm(scorer: RewardScorer, pairs) -> tuple[dict[str, float], list[dict]]:
    """rm/* metrics of a scorer on held-out pairs, and a few rows for a samples table."""
    if not pairs:
        return {}, []
    n = len(pairs)
    prompts = [p.prompt for p in pairs] * 2
    responses = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    ended = [p.chosen_ended for p in pairs] + [p.rejected_ended for p in pairs]
    raw = scorer.member_scores(prompts, responses, ended)
    s = scorer.combine(raw)
    m = preference_metrics(pairs, s[:n].tolist(), s[n:].tolist())
    m["rm/reward_mean"] = float(s.mean())
    m["rm/reward_std"] = float(s.std(correction=0))
    if scorer.n_members > 1:
        for k in range(scorer.n_members):
            m[f"rm/member_{k}/accuracy"] = _mean(_win(c, r) for c, r in zip(raw[k, :n].tolist(), raw[k, n:].tolist()))
        m["rm/ensemble_std"] = float(scorer.spread(raw).mean())
    if all(p.gold_chosen is not None for p in pairs):
        gold = [p.gold_chosen for p in pairs] + [p.gold_rejected for p in pairs]
        m["rm/spearman_gold"] = spearman(s.tolist(), gold)
    rows = []
    for i, p in enumerate(pairs[:16]):
        rows.append({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected, "rm_chosen": round(float(s[i]), 4),
                     "rm_rejected": round(float(s[n + i]), 4), "gold_chosen": p.gold_chosen, "gold_rejected": p.gold_rejected})
    return m, rows


def normalization_set(train, n: int, seed: int) -> tuple[list[str], list[str], list[bool]]:
    """Up to n distinct responses of the training pairs sampled from the SFT policy (all, for external data)."""
    seen, items = set(), []
    for p in train:
        if p.source not in ("sft", "external"):
            continue
        for r, e in ((p.chosen, p.chosen_ended), (p.rejected, p.rejected_ended)):
            if (p.prompt, r, e) not in seen:
                seen.add((p.prompt, r, e))
                items.append((p.prompt, r, e))
    random.Random(seed).shuffle(items)
    items = items[:n]
    return [i[0] for i in items], [i[1] for i in items], [i[2] for i in items]
