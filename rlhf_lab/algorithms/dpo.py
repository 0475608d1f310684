"""Direct Preference Optimization (Rafailov et al. 2023) as a LightningModule; the stage that runs it
(``algo=dpo``) is :mod:`rlhf_lab.stages.dpo`.

- Losses (``algo.loss_type``): ``sigmoid`` (DPO eq. 7; conservative DPO with ``algo.label_smoothing``),
  ``ipo``, ``hinge``; the maths is :func:`rlhf_lab.algorithms.dpo_math.preference_loss`.
- The reference (``algo.reference.kind``): a frozen model (``copy``), the policy's own base with its LoRA
  adapters disabled (``lora_disabled``), or reference log-probs precomputed into the batches.
- Chosen and rejected go through one concatenated forward pass (``[chosen; rejected]`` rows).
- ``algo.online``: every ``algo.online_every`` steps, pairs are sampled from the current policy and
  labelled by the world's labeler (online DPO); training then uses those pairs.

Metrics (TRL's names, docs/metrics.md): ``loss/dpo``, ``rewards/chosen``, ``rewards/rejected``,
``rewards/margins``, ``rewards/accuracies``, ``logps/chosen``, ``logps/rejected``, ``time/step_s``,
``time/tokens_per_s``; and ``eval/*`` (the same as SFT / PPO) at ``eval.every_n_steps``, the SFT start
being the step-0 evaluation.
"""

from __future__ import annotations

import random
import time
from typing import Callable

import torch

from rlhf_lab.runs import distributed
from rlhf_lab.models.batching import pad_right
from rlhf_lab.algorithms.dpo_math import preference_loss
from rlhf_lab.algorithms.lm import TrainingModule, logging_step
from rlhf_lab.models.sampling import logprobs_from_logits, positions



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


def pad_with_loss_mask(seqs: list[list[int]], n_prompt: list[int], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``loss_mask`` (1 on response tokens)."""
    ids, attn = pad_right(seqs, pad_id)
    loss_mask = torch.zeros_like(attn)
    for i, (s, n_p) in enumerate(zip(seqs, n_prompt)):
        loss_mask[i, n_p : len(s)] = 1
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss_mask}


def sequence_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Σ_t log π(y_t | x, y_<t) over the tokens where `loss_mask` is 1 (right-padded rows) -> [B]."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions(attention_mask)).logits
    # every token after the first is scored; loss_mask picks the response ones
    return logprobs_from_logits(logits, 1, input_ids[:, 1:], loss_mask[:, 1:]).sum(-1)


# ------------------------------------------------------------------------------------------------
# preference examples and batches


def encode_dpo_pairs(tokenizer, pairs, max_len: int) -> list[dict]:
    """One example per PreferencePair: chosen and rejected ids with the prompt length of each."""
    out = []
    for p in pairs:
        c, nc = encode_response(tokenizer, p.prompt, p.chosen, p.chosen_ended, max_len)
        r, nr = encode_response(tokenizer, p.prompt, p.rejected, p.rejected_ended, max_len)
        out.append({"chosen": c, "rejected": r, "n_chosen": nc, "n_rejected": nr})
    return out


def collate_dpo_pairs(pad_id: int) -> Callable[[list[dict]], dict]:
    """Concatenate a list of examples into one batch: rows [chosen_0..chosen_B-1, rejected_0..rejected_B-1]."""

    def collate(batch: list[dict]) -> dict:
        seqs = [b["chosen"] for b in batch] + [b["rejected"] for b in batch]
        n_p = [b["n_chosen"] for b in batch] + [b["n_rejected"] for b in batch]
        out = pad_with_loss_mask(seqs, n_p, pad_id)
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


@torch.no_grad()
def pair_logps(model, examples: list[dict], pad_id: int, batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ log π of each example's chosen and of its rejected response under `model` ([N] each, on the CPU), in batches
    of `batch_size` examples."""
    if not examples:
        return torch.zeros(0), torch.zeros(0)
    collate, dev = collate_dpo_pairs(pad_id), next(model.parameters()).device
    chosen, rejected = [], []
    for i in range(0, len(examples), batch_size):
        b = collate(examples[i : i + batch_size])
        lp = sequence_logps(model, *(b[k].to(dev) for k in ("input_ids", "attention_mask", "loss_mask"))).cpu()
        chosen.append(lp[: lp.shape[0] // 2])
        rejected.append(lp[lp.shape[0] // 2 :])
    return torch.cat(chosen), torch.cat(rejected)


def precompute_reference(reference, examples: list[dict], pad_id: int, batch_size: int = 64) -> None:
    """Write ``ref_chosen`` / ``ref_rejected`` (reference log-probs) into each example, in place."""
    chosen, rejected = pair_logps(reference, examples, pad_id, batch_size)
    for e, c, r in zip(examples, chosen.tolist(), rejected.tolist()):
        e["ref_chosen"], e["ref_rejected"] = c, r


# ------------------------------------------------------------------------------------------------
# the LightningModule


class DPOModule(TrainingModule):
    """DPO-family training of `policy` against a reference.

    `reference` is a frozen model (``copy``), ``"lora_disabled"`` (the peft policy with adapters off), or
    None, in which case every batch must carry precomputed ``ref_chosen`` / ``ref_rejected``.
    `online` is an optional ``(refresh, every)``: ``refresh()`` returns new examples (with reference
    log-probs) sampled from the current policy; they replace the data loader's batches.
    """

    def __init__(self, policy, reference, beta: float = 0.1, loss_type: str = "sigmoid", label_smoothing: float = 0.0,
                 lr: float = 3e-4, weight_decay: float = 0.0, warmup_steps: int = 20, max_steps: int = 1000,
                 online: tuple[Callable[[], list[dict]], int] | None = None, pad_id: int = 0, batch_size: int = 32):
        super().__init__(policy, lr, weight_decay, warmup_steps, max_steps)
        preference_loss(*torch.zeros(4, 1), beta=beta, loss_type=loss_type, label_smoothing=label_smoothing,
                        chosen_lengths=torch.ones(1), rejected_lengths=torch.ones(1))  # validate
        disable_dropout(self.model)
        self.lora_disabled = reference == "lora_disabled"
        if self.lora_disabled and not hasattr(policy, "disable_adapter"):
            raise ValueError("algo.reference.kind=lora_disabled needs a LoRA policy (algo.lora.r > 0)")
        self.reference = None if self.lora_disabled else reference
        if self.reference is not None:
            self.reference.eval().requires_grad_(False)
            disable_dropout(self.reference)
        self.beta, self.loss_type, self.label_smoothing = float(beta), loss_type, float(label_smoothing)
        self.online = online
        self.collate = collate_dpo_pairs(pad_id)
        self.batch_size = int(batch_size)
        self._buffer: list[dict] = []
        self._buffer_step = -1
        self._pos = 0

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
        n = batch["loss_mask"][:, 1:].sum(-1)  # response tokens per row (IPO averages its log-probs over them)
        losses, chosen_r, rejected_r = preference_loss(pc, pr, rc.to(pc), rr.to(pc), self.beta, self.loss_type,
                                                       self.label_smoothing, n[: pc.shape[0]], n[pc.shape[0]:])
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
            self.log_timing(t0, lambda: float(batch["attention_mask"].sum()), **sync)
        self._t = t0
        return loss


@torch.no_grad()
def pair_metrics(policy, examples: list[dict], pad_id: int, beta: float) -> dict[str, float]:
    """Held-out implicit-reward accuracy and margin (examples carry reference log-probs)."""
    if not examples:
        return {}
    was = policy.training
    policy.eval()
    pc, pr = pair_logps(policy, examples, pad_id)
    policy.train(was)
    rc = torch.tensor([e["ref_chosen"] for e in examples])
    rr = torch.tensor([e["ref_rejected"] for e in examples])
    margin = beta * ((pc - rc) - (pr - rr))
    return {"eval/rewards/accuracies": float((margin > 0).float().mean()), "eval/rewards/margins": float(margin.mean())}
