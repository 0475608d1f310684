"""Direct Preference Optimization (Rafailov et al. 2023) as a LightningModule, and the `algo=dpo` job.

- Losses (``algo.loss_type``): ``sigmoid`` (DPO eq. 7; conservative DPO with ``algo.label_smoothing``),
  ``ipo``, ``hinge``; the maths is :func:`rlhf_lab.algorithms.dpo_math.preference_loss`.
- The reference (``algo.reference``): ``copy`` (a frozen copy of the SFT model), ``lora_disabled`` (the
  policy's own base with its LoRA adapters disabled, ``algo.lora_rank > 0``; no second copy of the
  weights), ``precomputed`` (reference log-probs computed once before training; no reference model in
  memory while training; at evaluation points the reference is loaded from disk for ``eval/kl`` only).
- Chosen and rejected go through one concatenated forward pass (``[chosen; rejected]`` rows).
- ``algo.online``: every ``algo.online_every`` steps, pairs are sampled from the current policy and
  labelled by the world's labeler (online DPO); training then uses those pairs.

Metrics (TRL's names, ../shared/CONVENTIONS.md): ``loss/dpo``, ``rewards/chosen``, ``rewards/rejected``,
``rewards/margins``, ``rewards/accuracies``, ``logps/chosen``, ``logps/rejected``, ``time/step_s``,
``time/tokens_per_s``; and ``eval/*`` (the same as SFT / PPO) at ``eval.every_n_steps``, the SFT start
being the step-0 evaluation.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Callable

import lightning as L
import torch
from omegaconf import DictConfig

from rlhf_lab.runtime import to_plain
from rlhf_lab import distributed
from rlhf_lab.algorithms.dpo_math import preference_loss
from rlhf_lab.algorithms.lm import logging_step, warmup_then_linear
from rlhf_lab.models.sampling import logprobs_from_logits, positions

REFERENCE_MODES = ("copy", "lora_disabled", "precomputed")


# ------------------------------------------------------------------------------------------------
# per-sequence log-probs of (prompt, response) text pairs


def encode_response(tokenizer, prompt: str, response: str, ended: bool, max_len: int) -> tuple[list[int], int]:
    """Token ids of ``<prompt><" " response>[<eos>]`` (as SFT encodes them) and the prompt's length.

    The EOS is appended when the response ended (it is part of what the policy chose). A response that
    does not fit in `max_len` is truncated; a prompt that leaves no room for a response is an error.
    """
    p = tokenizer(prompt).input_ids
    if len(p) >= max_len:
        raise ValueError(
            f"a prompt is {len(p)} tokens long, which leaves no room for a response within algo.max_len={max_len} "
            f"(prompt: {prompt[:80]!r}); raise algo.max_len or shorten the prompts"
        )
    r = tokenizer(" " + response, add_special_tokens=False).input_ids
    if ended:
        r = r + [tokenizer.eos_token_id]
    return (p + r)[:max_len], len(p)


def pad_right(seqs: list[list[int]], n_prompt: list[int], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``loss_mask`` (1 on response tokens)."""
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), T), dtype=torch.long)
    loss_mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, (s, n_p) in enumerate(zip(seqs, n_prompt)):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        loss_mask[i, n_p : len(s)] = 1
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss_mask}


def sequence_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Σ_t log π(y_t | x, y_<t) over the tokens where `loss_mask` is 1 (right-padded rows) -> [B]."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions(attention_mask)).logits
    # every token after the first is scored; loss_mask picks the response ones
    return logprobs_from_logits(logits, 1, input_ids[:, 1:], loss_mask[:, 1:]).sum(-1)


@torch.no_grad()
def text_logps(model, tokenizer, prompts: list[str], responses: list[str], ended: list[bool] | None = None,
               max_len: int = 96, batch_size: int = 64) -> torch.Tensor:
    """log π(response | prompt), summed over the response tokens (and its EOS when ended) -> [N] (cpu)."""
    ended = ended if ended is not None else [True] * len(prompts)
    enc = [encode_response(tokenizer, p, r, e, max_len) for p, r, e in zip(prompts, responses, ended)]
    dev = next(model.parameters()).device
    out = []
    for i in range(0, len(enc), batch_size):
        chunk = enc[i : i + batch_size]
        b = pad_right([s for s, _ in chunk], [n for _, n in chunk], tokenizer.pad_token_id)
        out.append(sequence_logps(model, *(b[k].to(dev) for k in ("input_ids", "attention_mask", "loss_mask"))).cpu())
    return torch.cat(out) if out else torch.zeros(0)


# ------------------------------------------------------------------------------------------------
# preference examples and batches


def encode_pairs(tokenizer, pairs, max_len: int) -> list[dict]:
    """One example per PreferencePair: chosen and rejected ids with the prompt length of each."""
    out = []
    for p in pairs:
        c, nc = encode_response(tokenizer, p.prompt, p.chosen, p.chosen_ended, max_len)
        r, nr = encode_response(tokenizer, p.prompt, p.rejected, p.rejected_ended, max_len)
        out.append({"chosen": c, "rejected": r, "n_chosen": nc, "n_rejected": nr})
    return out


def collate_pairs(pad_id: int) -> Callable[[list[dict]], dict]:
    """Concatenate a list of examples into one batch: rows [chosen_0..chosen_B-1, rejected_0..rejected_B-1]."""

    def collate(batch: list[dict]) -> dict:
        seqs = [b["chosen"] for b in batch] + [b["rejected"] for b in batch]
        n_p = [b["n_chosen"] for b in batch] + [b["n_rejected"] for b in batch]
        out = pad_right(seqs, n_p, pad_id)
        if all("ref_chosen" in b for b in batch):
            out["ref_chosen"] = torch.tensor([b["ref_chosen"] for b in batch], dtype=torch.float32)
            out["ref_rejected"] = torch.tensor([b["ref_rejected"] for b in batch], dtype=torch.float32)
        return out

    return collate


def disable_dropout(model: torch.nn.Module) -> None:
    """Dropout off (as TRL's DPOTrainer does): log-probs of policy and reference are deterministic."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0


class AdapterDisabled:
    """A callable that runs a peft model with its adapters disabled: the LoRA policy's base as a reference."""

    def __init__(self, peft_model):
        self.model = peft_model

    def __call__(self, *args, **kwargs):
        with self.model.disable_adapter():
            return self.model(*args, **kwargs)

    def parameters(self):
        return self.model.parameters()


@torch.no_grad()
def precompute_reference(reference, examples: list[dict], pad_id: int, batch_size: int = 64) -> None:
    """Write ``ref_chosen`` / ``ref_rejected`` (reference log-probs) into each example, in place."""
    collate = collate_pairs(pad_id)
    dev = next(reference.parameters()).device
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        b = collate([{k: e[k] for k in ("chosen", "rejected", "n_chosen", "n_rejected")} for e in chunk])
        lp = sequence_logps(reference, *(b[k].to(dev) for k in ("input_ids", "attention_mask", "loss_mask"))).cpu()
        for j, e in enumerate(chunk):
            e["ref_chosen"], e["ref_rejected"] = float(lp[j]), float(lp[len(chunk) + j])


# ------------------------------------------------------------------------------------------------
# the LightningModule


class DPOModule(L.LightningModule):
    """DPO-family training of `policy` against a reference.

    `reference` is a frozen model (``copy``), ``"lora_disabled"`` (the peft policy with adapters off), or
    None, in which case every batch must carry precomputed ``ref_chosen`` / ``ref_rejected``.
    `online` is an optional ``(refresh, every)``: ``refresh()`` returns new examples (with reference
    log-probs) sampled from the current policy; they replace the data loader's batches.
    """

    def __init__(self, policy, reference, beta: float = 0.1, loss_type: str = "sigmoid", label_smoothing: float = 0.0,
                 lr: float = 3e-4, weight_decay: float = 0.0, warmup_steps: int = 20, max_steps: int = 1000,
                 online: tuple[Callable[[], list[dict]], int] | None = None, pad_id: int = 0, batch_size: int = 32):
        super().__init__()
        preference_loss(*torch.zeros(4, 1), beta=beta, loss_type=loss_type, label_smoothing=label_smoothing)  # validate
        self.model = policy.train()
        disable_dropout(self.model)
        self.lora_disabled = reference == "lora_disabled"
        if self.lora_disabled and not hasattr(policy, "disable_adapter"):
            raise ValueError("algo.reference=lora_disabled needs a LoRA policy (algo.lora_rank > 0)")
        self.reference = None if self.lora_disabled else reference
        if self.reference is not None:
            self.reference.eval().requires_grad_(False)
            disable_dropout(self.reference)
        self.beta, self.loss_type, self.label_smoothing = float(beta), loss_type, float(label_smoothing)
        self.lr, self.weight_decay, self.warmup_steps, self.max_steps = lr, weight_decay, warmup_steps, max_steps
        self.online = online
        self.collate = collate_pairs(pad_id)
        self.batch_size = int(batch_size)
        self._buffer: list[dict] = []
        self._buffer_step = -1
        self._pos = 0
        self._t = None

    # -- log-probs ------------------------------------------------------------------------------
    def policy_logps(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        lp = sequence_logps(self.model, batch["input_ids"], batch["attention_mask"], batch["loss_mask"])
        B = lp.shape[0] // 2
        return lp[:B], lp[B:]

    @torch.no_grad()
    def reference_logps(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        if "ref_chosen" in batch:
            return batch["ref_chosen"], batch["ref_rejected"]
        args = (batch["input_ids"], batch["attention_mask"], batch["loss_mask"])
        if self.lora_disabled:
            with self.model.disable_adapter():
                lp = sequence_logps(self.model, *args)
        elif self.reference is not None:
            lp = sequence_logps(self.reference, *args)
        else:
            raise ValueError("no reference: pass a reference model or batches with precomputed ref_chosen/ref_rejected")
        B = lp.shape[0] // 2
        return lp[:B], lp[B:]

    def loss_and_metrics(self, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        pc, pr = self.policy_logps(batch)
        rc, rr = self.reference_logps(batch)
        losses, chosen_r, rejected_r = preference_loss(pc, pr, rc.to(pc), rr.to(pc), self.beta, self.loss_type,
                                                       self.label_smoothing)
        loss = losses.mean()
        metrics = {
            "loss/dpo": loss.detach(),
            "rewards/chosen": chosen_r.mean(), "rewards/rejected": rejected_r.mean(),
            "rewards/margins": (chosen_r - rejected_r).mean(),
            "rewards/accuracies": (chosen_r > rejected_r).float().mean(),
            "logps/chosen": pc.detach().mean(), "logps/rejected": pr.detach().mean(),
        }
        return loss, metrics

    # -- online pairs -------------------------------------------------------------------------------
    def _online_batch(self):
        refresh, every = self.online
        if not self._buffer or self.global_step - self._buffer_step >= every:
            self._buffer = refresh()
            self._buffer_step, self._pos = self.global_step, 0
            m = {"online/n_pairs": float(len(self._buffer))}
            gold = [e["gold_agrees"] for e in self._buffer if e.get("gold_agrees") is not None]
            if gold:
                m["online/label_gold_agreement"] = sum(gold) / len(gold)
            if self.logger is not None:  # directly: self.log would repeat the value at every step
                self.logger.log_metrics(m, step=self.global_step)
        if not self._buffer:
            return None
        if self._pos >= len(self._buffer):
            random.Random(self.global_step).shuffle(self._buffer)
            self._pos = 0
        chunk = self._buffer[self._pos : self._pos + self.batch_size]
        self._pos += len(chunk)
        return {k: v.to(self.device) for k, v in self.collate(chunk).items()}

    # -- Lightning ----------------------------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        t0 = time.perf_counter()
        if self.online is not None:
            batch = self._online_batch() or batch
        loss, metrics = self.loss_and_metrics(batch)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite DPO loss ({loss.item()}) at step {self.global_step}; lower algo.lr")
        if logging_step(self):
            sync = dict(sync_dist=distributed.world_size() > 1)  # metrics: mean over ranks
            self.log("loss/dpo", metrics.pop("loss/dpo"), prog_bar=True, **sync)
            self.log_dict(metrics, **sync)
            if self._t is not None:
                dt = t0 - self._t
                self.log("time/step_s", dt, **sync)
                self.log("time/tokens_per_s", float(batch["attention_mask"].sum()) / max(dt, 1e-9), **sync)
        self._t = t0
        return loss

    def configure_optimizers(self):
        params = [p for p in self.model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": warmup_then_linear(opt, self.warmup_steps, self.max_steps),
                                                   "interval": "step"}}


# ------------------------------------------------------------------------------------------------
# the job


def check_config(ac: DictConfig) -> None:
    """Fail fast, before any upstream stage is built, on keys that cannot work."""
    preference_loss(*torch.zeros(4, 1), beta=float(ac.beta), loss_type=str(ac.loss_type),
                    label_smoothing=float(ac.label_smoothing))
    if ac.reference not in REFERENCE_MODES:
        raise ValueError(f"algo.reference={ac.reference!r}; choose one of {REFERENCE_MODES}")
    if int(ac.lora_rank) < 0:
        raise ValueError(f"algo.lora_rank must be >= 0, got {ac.lora_rank}")
    if ac.reference == "lora_disabled" and int(ac.lora_rank) == 0:
        raise ValueError("algo.reference=lora_disabled needs a LoRA policy: set algo.lora_rank > 0 (e.g. 8)")
    for k in ("steps", "batch_size", "max_len"):
        if int(ac[k]) <= 0:
            raise ValueError(f"algo.{k} must be > 0, got {ac[k]}")
    if ac.online:
        if ac.reference == "precomputed":
            raise ValueError("algo.online=true samples new pairs, whose reference log-probs cannot be precomputed; "
                             "use algo.reference=copy or lora_disabled")
        if int(ac.online_every) <= 0 or int(ac.online_prompts) <= 0:
            raise ValueError("algo.online_every and algo.online_prompts must be > 0")


def dpo_spec(cfg: DictConfig, sft_path: Path) -> dict:
    from rlhf_lab.pipeline import job_steps, stage_seed

    from rlhf_lab.data import world_generation_spec

    data = to_plain(cfg.data)
    if cfg.data.source == "world":  # what determines the pairs besides the SFT model (preferences.prefs_spec)
        data = {**data, "world": world_generation_spec(cfg), "gold": to_plain(cfg.world.gold)}
    return {"sft": str(sft_path), "data": data, "algo": to_plain(cfg.algo), "labeler": to_plain(cfg.labeler),
            "generation": to_plain(cfg.generation), "seed": stage_seed(cfg, "dpo", "algo"),
            "steps": job_steps(cfg, "dpo", cfg.algo.steps)}


def _lora(policy, ac: DictConfig):
    from peft import LoraConfig, get_peft_model

    lc = LoraConfig(r=int(ac.lora_rank), lora_alpha=int(ac.lora_alpha), lora_dropout=0.0, target_modules="all-linear",
                    task_type="CAUSAL_LM")
    return get_peft_model(policy, lc)


def _online_refresh(cfg, module_ref, tok, max_len: int, seed: int) -> Callable[[], list[dict]]:
    """Sample two responses per prompt from the current policy, label them, attach reference log-probs."""
    from rlhf_lab import data as D
    from rlhf_lab.models.sampling import sample
    from rlhf_lab.preferences import label_pairs

    n = int(cfg.algo.online_prompts)
    stream = D.prompts(cfg, "dpo_online", n * 50)
    rng = random.Random(seed)
    state = {"i": 0}
    g = cfg.generation

    def refresh() -> list[dict]:
        module: DPOModule = module_ref()
        i = state["i"] % len(stream)
        prompts = (stream + stream)[i : i + n]
        state["i"] += n
        policy = module.model
        a = sample(policy, tok, prompts, g.max_new_tokens, g.temperature, g.top_k, g.top_p, g.max_prompt_len)
        b = sample(policy, tok, prompts, g.max_new_tokens, g.temperature, g.top_k, g.top_p, g.max_prompt_len)
        pairs = label_pairs(cfg, prompts, a.responses, b.responses, a.ended, b.ended, rng, "online")
        ex = encode_pairs(tok, pairs, max_len)
        for e, p in zip(ex, pairs):
            e["gold_agrees"] = p.gold_agrees
        ref = AdapterDisabled(policy) if module.lora_disabled else module.reference
        was = policy.training
        policy.eval()
        precompute_reference(ref, ex, tok.pad_token_id)
        policy.train(was)
        return ex

    return refresh


@torch.no_grad()
def pair_metrics(policy, examples: list[dict], pad_id: int, beta: float) -> dict[str, float]:
    """Held-out implicit-reward accuracy and margin (examples carry reference log-probs)."""
    if not examples:
        return {}
    was = policy.training
    policy.eval()
    pcs, prs = [], []
    collate = collate_pairs(pad_id)
    dev = next(policy.parameters()).device
    for i in range(0, len(examples), 64):
        b = collate(examples[i : i + 64])
        lp = sequence_logps(policy, *(b[k].to(dev) for k in ("input_ids", "attention_mask", "loss_mask"))).cpu()
        B = lp.shape[0] // 2
        pcs.append(lp[:B])
        prs.append(lp[B:])
    policy.train(was)
    pc, pr = torch.cat(pcs), torch.cat(prs)
    rc = torch.tensor([e["ref_chosen"] for e in examples])
    rr = torch.tensor([e["ref_rejected"] for e in examples])
    margin = beta * ((pc - rc) - (pr - rr))
    return {"eval/rewards/accuracies": float((margin > 0).float().mean()), "eval/rewards/margins": float(margin.mean())}


def job(cfg: DictConfig, out_dir: Path):
    from rlhf_lab import pipeline as P
    from rlhf_lab import tracking
    from rlhf_lab.callbacks import PeriodicEval
    from rlhf_lab.models import families as Fm
    from rlhf_lab.preferences import ensure_preferences, validate_pairs

    import warnings

    warnings.filterwarnings("ignore", message=".*module\\(s\\) in eval mode.*")  # the frozen reference
    ac = cfg.algo
    check_config(ac)
    if ac.online and distributed.n_processes(cfg) > 1:
        raise ValueError("algo.online=true is not supported with several processes (trainer.devices > 1): "
                         "its generated pairs are not shared across ranks; run online DPO on one process")
    if ac.online and cfg.data.source != "world":
        raise ValueError("algo.online=true labels new pairs with the world's labeler: it needs data=world")
    scorer, tags = None, {}
    if ac.get("proxy_rm"):  # lazy: DPO needs no reward model; this only adds eval/proxy_reward
        try:
            from rlhf_lab import reward as R
        except ImportError as err:
            raise ImportError(f"algo.proxy_rm=true needs rlhf_lab.reward ({err}); set algo.proxy_rm=false") from err
        scorer = R.load_scorer(cfg)
        if hasattr(R, "ensure_rm"):
            rm_run = P.cache_for(cfg).meta(Path(R.ensure_rm(cfg))).get("run_id")
            if rm_run:
                tags["rlhf_lab.upstream.rm"] = rm_run

    sft_path = P.ensure_sft(cfg)
    train_pairs, eval_pairs = ensure_preferences(cfg)
    validate_pairs(train_pairs, "data")
    spec = dpo_spec(cfg, sft_path)
    seed, steps, max_len = spec["seed"], spec["steps"], int(ac.max_len)
    L.seed_everything(seed, verbose=False)

    tok = Fm.load_tokenizer(sft_path, "policy.name_or_path")
    policy = Fm.load_causal_lm(sft_path, tok, "policy.name_or_path")
    train_ex = encode_pairs(tok, train_pairs, max_len)
    eval_ex = encode_pairs(tok, eval_pairs[: int(ac.get("eval_pairs", 256))], max_len)

    mode = str(ac.reference)
    load_ref = lambda: Fm.load_causal_lm(sft_path, tok, "policy.name_or_path").eval()  # noqa: E731
    t_pre = time.time()
    if mode == "precomputed":  # reference log-probs once; the reference model is freed before training
        ref = load_ref()
        precompute_reference(ref, train_ex, tok.pad_token_id)
        precompute_reference(ref, eval_ex, tok.pad_token_id)
        del ref
        reference = None
    else:
        reference = load_ref() if mode == "copy" else "lora_disabled"
        precompute_reference(reference if mode == "copy" else policy, eval_ex, tok.pad_token_id)
    t_pre = time.time() - t_pre
    if int(ac.lora_rank) > 0:
        policy = _lora(policy, ac)

    holder: dict = {}
    online = None
    if ac.online:
        online = (_online_refresh(cfg, lambda: holder["module"], tok, max_len, seed), int(ac.online_every))
    module = DPOModule(policy, reference, beta=float(ac.beta), loss_type=str(ac.loss_type),
                       label_smoothing=float(ac.label_smoothing), lr=float(ac.lr), weight_decay=float(ac.weight_decay),
                       warmup_steps=int(ac.warmup_steps), max_steps=steps, online=online, pad_id=tok.pad_token_id,
                       batch_size=int(ac.batch_size))
    holder["module"] = module

    def eval_reference():
        if module.lora_disabled:
            return AdapterDisabled(module.model)
        return module.reference if module.reference is not None else load_ref()  # precomputed: load for eval only

    def evaluate():
        m, rows = P.evaluate(cfg, module.model, tok, reference=eval_reference(), scorer=scorer)
        m.update(pair_metrics(module.model, eval_ex, tok.pad_token_id, float(ac.beta)))
        return m, rows

    sft_run = P.cache_for(cfg).meta(Path(sft_path)).get("run_id", str(sft_path))
    params = {"stage": "dpo", "algo": to_plain(ac), "data": spec["data"] if cfg.data.source != "world" else to_plain(cfg.data),
              "labeler": to_plain(cfg.labeler), "world": to_plain(cfg.world), "seed": seed, "steps": steps,
              "sft": str(sft_path), "n_train_pairs": len(train_ex), "n_eval_pairs": len(eval_ex),
              "n_params": Fm.n_params(policy),
              "n_trainable": sum(p.numel() for p in policy.parameters() if p.requires_grad)}
    tags["rlhf_lab.upstream.sft"] = sft_run
    with tracking.start_run(cfg, "dpo", params=params, tags=tags) as run:
        g = torch.Generator().manual_seed(seed)
        loader = distributed.loader(train_ex, int(ac.batch_size), g, collate_pairs(tok.pad_token_id),
                                    drop_last=len(train_ex) >= int(ac.batch_size), key="algo.batch_size")
        ev = PeriodicEval(evaluate, every_n_steps=int(cfg.eval.every_n_steps), at_start=True)
        kw = P.trainer_kwargs(cfg, out_dir, steps, "dpo")
        if ac.get("max_grad_norm") is not None:
            kw["gradient_clip_val"] = float(ac.max_grad_norm)
        trainer = L.Trainer(**kw, logger=tracking.lightning_logger(cfg), callbacks=[ev])
        tracking.log_metric("time/reference_precompute_s", t_pre)
        t0 = time.time()
        trainer.fit(module, loader)
        train_s = time.time() - t0
        distributed.check_in_sync(module.model, "DPO policy")
        if not distributed.is_rank_zero():  # rank 0 saves and logs
            return {"stage": "dpo", "train_s": train_s}, None
        model = module.model
        if hasattr(model, "merge_and_unload"):  # save a plain causal LM: downstream stages load it as any policy
            model = model.merge_and_unload()
        model.eval()
        tok.save_pretrained(out_dir)
        model.save_pretrained(out_dir)
        tracking.log_metric("time/train_s", train_s)
        start, last = ev.first, ev.last
        summary = {}
        if "eval/gold_reward" in start and "eval/gold_reward" in last:
            summary["gold"] = f"{start['eval/gold_reward']:.3f} (SFT, step 0) -> {last['eval/gold_reward']:.3f} (DPO)"
            tracking.log_metric("eval/gold_reward_gain", last["eval/gold_reward"] - start["eval/gold_reward"])
        meta = {"run_id": run.info.run_id, "stage": "dpo", "eval": last, "eval_start": start, "train_s": train_s,
                "reference": mode, "summary": summary}
    return meta, ("dpo", spec)
