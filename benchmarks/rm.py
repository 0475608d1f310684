"""Reward-model training throughput, ours (``rlhf_lab.algorithms.rm.RewardModelModule`` in a Lightning Trainer,
as ``rm.train_rm`` runs it) against TRL's ``RewardTrainer``, and first-batch agreement of the two losses.

Matched: the sequence classifier (``AutoModelForSequenceClassification``, ``num_labels=1``, loaded by both
sides from the same folder, so the scalar head's random initialisation is the same), the token ids (TRL
gets the ids our ``rm.encode_rm_pairs`` produces as ``chosen_ids`` / ``rejected_ids``: prompt + response + EOS,
at most ``reward_model.max_len``), batch size, the Bradley–Terry loss without margin or centering, AdamW
and its learning rate, warm-up steps, no gradient clipping (``train_rm`` sets none, so TRL's default
``max_grad_norm=1.0`` is turned off), fp32, no gradient checkpointing, batches in the same order, the same
number of optimizer steps. Left: ours packs each batch's sequences into rows as long as its longest one
(``reward_model.packing``, the default; same pairs per step, no compute on padding) and reads the backbone
and the head at each sequence's last token (``rm_forward_packed``); TRL pads the batch to its longest
sequence (its ``RewardTrainer`` has no padding-free mode) and calls the classifier, which scores every
position and pools the last non-pad one; the Trainer/accelerate machinery vs Lightning's.
"""

from __future__ import annotations

import tempfile
import time

from omegaconf import DictConfig

from benchmarks.common import Section, WorldModel, load_tokenizer
from benchmarks.train_sides import (alternate, grad_norm, hf_common_args, hf_fit, lightning_fit, throughput,
                                    training_section)

AGREE_KEYS = ["loss", "reward/chosen", "reward/rejected", "grad_norm"]


def trl_rows(examples: list[dict]) -> list[dict]:
    return [{"chosen_ids": e["chosen"], "rejected_ids": e["rejected"]} for e in examples]


def ours_module(wm: WorldModel, tok, rc: DictConfig, steps: int):
    from rlhf_lab.algorithms.rm import RewardModelModule
    from rlhf_lab.models import families as Fm

    model = Fm.load_sequence_scorer(wm.rm_dir, tok)
    return RewardModelModule(model, lr=float(rc.lr), weight_decay=float(rc.weight_decay),
                             warmup_steps=int(rc.warmup_steps), max_steps=steps, use_margin=False, center_coef=0.0)


def trl_trainer(wm: WorldModel, tok, rc: DictConfig, steps: int, rows: list[dict], out_dir: str):
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    from rlhf_lab.models import families as Fm

    args = RewardConfig(**hf_common_args(steps, int(rc.batch_size), float(rc.lr), float(rc.weight_decay),
                                         int(rc.warmup_steps), 0, None, out_dir),
                        max_length=int(rc.max_len), center_rewards_coefficient=None, disable_dropout=True,
                        pad_to_multiple_of=None)
    model = Fm.load_sequence_scorer(wm.rm_dir, tok)
    return RewardTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)


def _loader(examples, tok, batch_size: int, packed: bool):
    from torch.utils.data import DataLoader

    from rlhf_lab.algorithms.rm import collate_rm_pairs

    return DataLoader(examples, batch_size=batch_size, shuffle=False,
                      collate_fn=collate_rm_pairs(tok.pad_token_id, packed), drop_last=True)


def _sequences(batch: dict) -> list[list[int]]:
    """The token ids of each sequence of a collated batch, padded or packed (``collate_rm_pairs``)."""
    ids, n = batch["input_ids"], batch["lengths"].tolist()
    if "attention_mask" in batch:
        return [row[:k] for row, k in zip(ids.tolist(), n)]
    flat = ids.reshape(-1).tolist()
    return [flat[e - k + 1 : e + 1] for e, k in zip(batch["last_index"].tolist(), n)]


def first_batch_agreement(wm: WorldModel, tok, rc: DictConfig, examples, rows) -> dict:
    """Loss, mean chosen/rejected reward and gradient norm of both sides on the first batch."""
    from rlhf_lab.algorithms.dpo_math import bradley_terry_loss
    from rlhf_lab.algorithms.rm import collate_rm_pairs

    B = int(rc.batch_size)
    ours = ours_module(wm, tok, rc, 10)
    batch = collate_rm_pairs(tok.pad_token_id, bool(rc.packing))(examples[:B])
    r = ours.rewards(batch)  # what training_step computes
    loss = bradley_terry_loss(r[:B], r[B:], None, 0.0)
    loss.backward()
    o = {"loss": float(loss), "reward/chosen": float(r[:B].mean()), "reward/rejected": float(r[B:].mean()),
         "grad_norm": grad_norm(ours.model)}
    with tempfile.TemporaryDirectory() as tmp:
        tr = trl_trainer(wm, tok, rc, 10, rows, tmp)
        tb = tr.data_collator(rows[:B])
        tr.model.train()
        tl, out = tr.compute_loss(tr.model, dict(tb), return_outputs=True)
        tl.backward()
        lg = out.logits.squeeze(-1).detach()
        t = {"loss": float(tl), "reward/chosen": float(lg[:B].mean()), "reward/rejected": float(lg[B:].mean()),
             "grad_norm": grad_norm(tr.model)}
        same_ids = [row[m.bool()].tolist() for row, m in zip(tb["input_ids"], tb["attention_mask"])] == _sequences(batch)
    return {"ours": o, "trl": t, "same_ids": same_ids}


def run(cfg: DictConfig, wm: WorldModel, pairs, steps: int, warmup: int, rounds: int, tol: float) -> Section:
    from rlhf_lab.algorithms.rm import encode_rm_pairs

    t_start = time.time()
    rc = cfg.reward_model
    tok = load_tokenizer(wm.rm_dir)
    examples = encode_rm_pairs(tok, pairs, int(rc.max_len))
    rows = trl_rows(examples)
    B = int(rc.batch_size)
    if len(examples) < steps * B:
        raise ValueError(f"RM benchmark needs {steps * B} pairs, got {len(examples)}")

    agree = first_batch_agreement(wm, tok, rc, examples, rows)
    packed = bool(rc.packing)

    def run_side(side: str):
        if side == "ours":
            return lightning_fit(ours_module(wm, tok, rc, steps), _loader(examples, tok, B, packed), steps, warmup, None)
        with tempfile.TemporaryDirectory() as tmp:
            return hf_fit(trl_trainer(wm, tok, rc, steps, rows, tmp), warmup)

    tp = throughput(alternate(rounds, run_side), B)
    return training_section(
        "RM training throughput (ours vs TRL RewardTrainer)", __doc__.split("\n\n", 1)[1].strip(),
        "ours (RewardModelModule + Lightning)", "TRL RewardTrainer", tp, agree, AGREE_KEYS, tol,
        "First batch, same initial weights:", "identical token ids of every sequence",
        f"batch {B} pairs ({2 * B} sequences{', packed' if packed else ', padded'}), max_len {int(rc.max_len)}, "
        f"lr {float(rc.lr)}, {steps} steps per run of "
        f"which {warmup} warm-up, {rounds} round(s) alternating the order", t_start)
