"""Reward-model training (``algo=rm``): a scalar head on a decoder, Bradley–Terry loss on preference pairs.

Loss (Ouyang et al. 2022 eq. 1; ``dpo_math.bradley_terry_loss``)::

    L = mean(−log σ(r(x, y_chosen) − r(x, y_rejected) − m)) + center_coef · mean((r_chosen + r_rejected)²)

with the margin ``m`` (``reward_model.margin: true``, Llama 2 eq. 2) taken from the annotator's strength
of preference: the labeler's utility gap u(chosen) − u(rejected), clipped to [0, 1] (world data only).

The backbone (``reward_model`` config group) is the policy family's SFT or pretrained checkpoint
(``source: same``) or the other family's (``source: different``), fully fine-tuned or with LoRA
adapters (``lora_rank > 0``, merged into the weights when saved). ``ensemble: k`` trains k members with
seeds ``seed + 7919·i`` (head init and data order). After training every member is normalised on SFT
samples (the training pairs' responses sampled from the SFT policy) and the held-out pairs are scored:
accuracy against the labeler and against gold, the RM's extra preference for length and filler phrases
relative to gold, Spearman correlation with gold over the held-out (SFT-policy) responses.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import lightning as L
import torch
from omegaconf import DictConfig

from rlhf_lab.runtime import to_plain
from rlhf_lab import distributed, tracking
from rlhf_lab.algorithms.dpo_math import bradley_terry_loss
from rlhf_lab.algorithms.lm import logging_step, warmup_then_linear
from rlhf_lab.reward import RewardScorer, encode_texts, pad_right, rm_forward

MEMBER_SEED_STRIDE = 7919
LENGTH_BUCKETS = ((0, 10, "short"), (10, 20, "medium"), (20, 10**9, "long"))  # mean words of the pair


class RewardModelModule(L.LightningModule):
    """Trains one RM on batches of [chosen..., rejected...] sequences (right-padded)."""

    def __init__(self, model, lr: float, weight_decay: float = 0.0, warmup_steps: int = 20, max_steps: int = 1000,
                 use_margin: bool = False, center_coef: float = 0.0, prefix: str = ""):
        super().__init__()
        self.model = model.train()
        self.lr, self.weight_decay, self.warmup_steps, self.max_steps = lr, weight_decay, warmup_steps, max_steps
        self.use_margin, self.center_coef, self.prefix = bool(use_margin), float(center_coef), prefix
        self._t = None

    def training_step(self, batch, batch_idx):
        t0 = time.perf_counter()
        r = rm_forward(self.model, batch["input_ids"], batch["attention_mask"])
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
            if self._t is not None:
                dt = t0 - self._t
                self.log(f"{p}time/step_s", dt, **kw)
                self.log(f"{p}time/tokens_per_s", float(batch["attention_mask"].sum()) / max(dt, 1e-9), **kw)
        self._t = t0
        return loss

    def configure_optimizers(self):
        params = [q for q in self.model.parameters() if q.requires_grad]
        opt = torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)
        sched = warmup_then_linear(opt, self.warmup_steps, self.max_steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


# ------------------------------------------------------------------------------------------------
# data


def pair_margins(cfg: DictConfig, pairs) -> list[float]:
    """Margin per pair: the labeler's utility gap u(chosen) − u(rejected), clipped to [0, 1]."""
    if cfg.data.source != "world":
        raise ValueError("reward_model.margin=true needs the annotator's strength of preference, which only "
                         "data=world has; set reward_model.margin=false for external preference data")
    from rlhf_lab import data as D

    lab, w = D.labeler(cfg), D.gold_weights(cfg)
    out = []
    for p in pairs:
        gap = lab.utility(p.prompt, p.chosen, p.chosen_ended, w) - lab.utility(p.prompt, p.rejected, p.rejected_ended, w)
        out.append(min(1.0, max(0.0, gap)))
    return out


def encode_pairs(tokenizer, pairs, max_len: int, margins: list[float] | None = None) -> list[dict]:
    n = len(pairs)
    prompts = [p.prompt for p in pairs]
    chosen = encode_texts(tokenizer, prompts, [p.chosen for p in pairs], [p.chosen_ended for p in pairs], max_len)
    rejected = encode_texts(tokenizer, prompts, [p.rejected for p in pairs], [p.rejected_ended for p in pairs], max_len)
    margins = margins or [0.0] * n
    return [{"chosen": c, "rejected": r, "margin": m} for c, r, m in zip(chosen, rejected, margins)]


def collate_pairs(pad_id: int):
    def collate(batch: list[dict]) -> dict:
        ids, mask = pad_right([b["chosen"] for b in batch] + [b["rejected"] for b in batch], pad_id)
        return {"input_ids": ids, "attention_mask": mask,
                "margin": torch.tensor([b["margin"] for b in batch], dtype=torch.float32)}

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
    if len(scorer.members) > 1:
        for k in range(len(scorer.members)):
            m[f"rm/member_{k}/accuracy"] = _mean(_win(c, r) for c, r in zip(raw[k, :n].tolist(), raw[k, n:].tolist()))
        z = scorer.standardized(raw)
        m["rm/ensemble_std"] = float(z.std(0, correction=0).mean())
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


# ------------------------------------------------------------------------------------------------
# training


def _validate(rc) -> None:
    if int(rc.ensemble) < 1:
        raise ValueError(f"reward_model.ensemble must be >= 1, got {rc.ensemble}")
    if int(rc.lora_rank) < 0:
        raise ValueError(f"reward_model.lora_rank must be >= 0 (0 = full fine-tuning), got {rc.lora_rank}")
    if float(rc.conservative_lambda) < 0:
        raise ValueError(f"reward_model.conservative_lambda must be >= 0, got {rc.conservative_lambda}")
    if int(rc.max_len) < 2:
        raise ValueError(f"reward_model.max_len must be >= 2, got {rc.max_len}")


def _with_lora(model, rc):
    from peft import LoraConfig, TaskType, get_peft_model

    r = int(rc.lora_rank)
    targets = rc.get("lora_target_modules")
    lcfg = LoraConfig(task_type=TaskType.SEQ_CLS, r=r, lora_alpha=float(rc.get("lora_alpha") or 2 * r), lora_dropout=0.0,
                      target_modules=list(targets) if targets else None)
    return get_peft_model(model, lcfg)


def _n_trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def train_rm(cfg: DictConfig, out_dir: Path, spec: dict) -> dict:
    """Train the RM (all ensemble members) into out_dir as one MLflow run; returns metadata."""
    from rlhf_lab import pipeline
    from rlhf_lab.models import families as F
    from rlhf_lab.preferences import ensure_preferences, validate_pairs

    rc = cfg.reward_model
    _validate(rc)
    out_dir = Path(out_dir)
    train, held = ensure_preferences(cfg)
    validate_pairs(train, "data")
    backbone, steps, seed = spec["backbone"], int(spec["steps"]), int(spec["seed"])
    tok = F.load_tokenizer(backbone, "reward_model backbone")
    max_len = int(rc.max_len)
    margins = pair_margins(cfg, train) if bool(rc.margin) else None
    examples = encode_pairs(tok, train, max_len, margins)
    n_trunc = sum(len(e["chosen"]) >= max_len or len(e["rejected"]) >= max_len for e in examples)
    if n_trunc:
        print(f"[rlhf-lab] rm: {n_trunc} of {len(examples)} pairs reach reward_model.max_len={max_len} (cut at the start)")

    cache = pipeline.cache_for(cfg)
    upstream = {}
    if cfg.data.source == "world":
        from rlhf_lab.preferences import prefs_spec

        ps = prefs_spec(cfg)
        prefs_path = cache.path("prefs", ps)
        upstream["sft"] = cache.meta(Path(ps["sft"])).get("run_id", ps["sft"])
        upstream["prefs"] = cache.meta(prefs_path).get("run_id", str(prefs_path))
    bb_meta = cache.meta(Path(str(backbone))) if Path(str(backbone)).exists() else {}
    upstream["rm_backbone"] = bb_meta.get("run_id", str(backbone))
    if str(rc.init) == "pretrain":
        upstream["pretrain"] = upstream["rm_backbone"]
    n_on = sum(p.source == "on_policy" for p in train)
    params = {"stage": "rm", "reward_model": to_plain(rc), "data": to_plain(cfg.data), "seed": seed,
              "steps": steps, "backbone": str(backbone), "n_train_pairs": len(train), "n_eval_pairs": len(held),
              "n_on_policy_pairs": n_on}
    k = int(rc.ensemble)
    with tracking.start_run(cfg, "rm", params=params,
                            tags={f"rlhf_lab.upstream.{a}": str(b) for a, b in upstream.items()}) as run:
        t0 = time.time()
        members, n_params, n_train_params = [], 0, 0
        for i in range(k):
            mseed = seed + MEMBER_SEED_STRIDE * i
            L.seed_everything(mseed, verbose=False)
            model = F.load_sequence_scorer(backbone, tok, "reward_model backbone")
            n_params = F.n_params(model)
            if int(rc.lora_rank) > 0:
                model = _with_lora(model, rc)
            n_train_params = _n_trainable(model)
            g = torch.Generator().manual_seed(mseed)
            loader = distributed.loader(examples, int(rc.batch_size), g, collate_pairs(tok.pad_token_id),
                                        key="reward_model.batch_size")
            module = RewardModelModule(model, lr=float(rc.lr), weight_decay=float(rc.weight_decay),
                                       warmup_steps=int(rc.warmup_steps), max_steps=steps, use_margin=bool(rc.margin),
                                       center_coef=float(rc.center_coef), prefix="" if i == 0 else f"member_{i}/")
            trainer = L.Trainer(**pipeline.trainer_kwargs(cfg, out_dir, steps, "rm"), logger=tracking.lightning_logger(cfg))
            trainer.fit(module, loader)
            distributed.check_in_sync(model, f"reward model member {i}")
            if int(rc.lora_rank) > 0:
                model = model.merge_and_unload()
            members.append(model.eval())
        train_s = time.time() - t0
        if not distributed.is_rank_zero():  # rank 0 normalises, evaluates, saves and logs
            return {"stage": "rm", "train_s": train_s}

        scorer = RewardScorer(members, tok, max_len=max_len)
        norm = normalization_set(train, int(rc.get("norm_samples") or 1024), seed)
        raw_stats = scorer.fit_normalization(*norm)
        tok.save_pretrained(out_dir)
        for i, m in enumerate(members):
            m.save_pretrained(out_dir / f"member_{i}")
        scorer.save_norm(out_dir, {"n_norm_samples": len(norm[0]), "normalised_on": "SFT samples of the training pairs",
                                   "backbone": str(backbone), "source": str(rc.source)})

        metrics, rows = evaluate_rm(scorer, held)
        metrics.update({"rm/gain": scorer.gain, "rm/bias": scorer.bias,
                        "rm/raw_mean": float(raw_stats["raw_mean"][0]), "rm/raw_std": float(raw_stats["raw_std"][0]),
                        "rm/train_on_policy_fraction": n_on / len(train), "time/train_s": train_s})
        tracking.log_metrics({k_: v for k_, v in metrics.items() if v == v}, step=steps)  # NaN-free
        tracking.log_params({"n_params": n_params, "n_trainable_params": n_train_params})
        tracking.log_samples_table(rows, "samples/rm_eval_pairs.json")
        keys = ("rm/accuracy", "rm/accuracy_gold", "rm/spearman_gold", "rm/length_preference", "rm/filler_preference")
        line = ", ".join(f"{q.split('/')[1]}={metrics[q]:.3f}" for q in keys if q in metrics)
        return {"run_id": run.info.run_id, "stage": "rm", "eval": metrics, "train_s": train_s, "n_params": n_params,
                "n_trainable_params": n_train_params, "n_members": k, "summary": {"rm eval": line}}


def job(cfg: DictConfig, out_dir: Path):
    from rlhf_lab.reward import rm_spec

    spec = rm_spec(cfg)  # trains upstream stages first (base model, SFT, preference pairs), each cached
    meta = train_rm(cfg, out_dir, spec)
    return meta, ("rm", spec)
