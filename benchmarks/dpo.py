"""DPO training throughput, ours (``rlhf_lab.algorithms.dpo.DPOModule`` in a Lightning Trainer, as the ``dpo`` stage
runs it) against TRL's ``DPOTrainer``, and first-batch agreement of the two losses.

Matched: model weights (both load the same ``save_pretrained`` folder), the reference (a second frozen copy
loaded from the same folder, no precomputation on either side), the token ids (TRL gets the ids our
``dpo.encode_dpo_pairs`` produces, as ``prompt_ids`` / ``chosen_ids`` / ``rejected_ids``, so its own tokenisation
is bypassed), batch size, ``max_length``, sigmoid loss and β, AdamW and its learning rate, warm-up steps,
gradient clipping at 1.0, fp32, no gradient checkpointing, dropout off, batches in the same order, the same
number of optimizer steps. What is left is each side's own work per step: TRL's fused, chunked LM head and
the extra metrics it computes (entropy, mean logits, top-1 accuracy), the Trainer/accelerate machinery vs
Lightning's.
"""

from __future__ import annotations

import tempfile
import time

import torch
from omegaconf import DictConfig

from benchmarks.common import Section, WorldModel, load_tokenizer
from benchmarks.train_sides import (alternate, grad_norm, hf_common_args, hf_fit, lightning_fit, throughput,
                                    training_section)

AGREE_KEYS = ["loss", "logps/chosen", "logps/rejected", "grad_norm"]


def _examples(tok, pairs, max_len: int) -> list[dict]:
    from rlhf_lab.algorithms.dpo import encode_dpo_pairs

    return encode_dpo_pairs(tok, pairs, max_len)


def trl_rows(examples: list[dict]) -> list[dict]:
    """Our encoded examples as TRL's pre-tokenized columns: the prompt and each completion (with its EOS)."""
    rows = []
    for e in examples:
        n = e["n_chosen"]
        if e["n_rejected"] != n or e["chosen"][:n] != e["rejected"][:n]:
            raise ValueError("chosen and rejected must share the prompt's token ids")
        rows.append({"prompt_ids": e["chosen"][:n], "chosen_ids": e["chosen"][n:], "rejected_ids": e["rejected"][n:]})
    return rows


def _trl_trainer_cls():
    from trl import DPOTrainer

    class PretokenizedDPOTrainer(DPOTrainer):
        """DPOTrainer fed token ids: its dataset preparation (prompt extraction, EOS, tokenisation) is skipped."""

        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            return dataset

    return PretokenizedDPOTrainer


def ours_module(wm: WorldModel, tok, ac: DictConfig, steps: int, ref_dir=None):
    from rlhf_lab.algorithms.dpo import DPOModule
    from rlhf_lab.models import families as Fm

    policy = Fm.load_causal_lm(wm.lm_dir, tok)
    reference = Fm.load_causal_lm(ref_dir or wm.lm_dir, tok).eval()
    return DPOModule(policy, reference, beta=float(ac.beta), loss_type="sigmoid", label_smoothing=0.0, lr=float(ac.lr),
                     weight_decay=float(ac.weight_decay), warmup_steps=int(ac.warmup_steps), max_steps=steps,
                     pad_id=tok.pad_token_id, batch_size=int(ac.batch_size))


def trl_trainer(wm: WorldModel, tok, ac: DictConfig, steps: int, rows: list[dict], out_dir: str, ref_dir=None):
    from datasets import Dataset
    from trl import DPOConfig

    from rlhf_lab.models import families as Fm

    args = DPOConfig(**hf_common_args(steps, int(ac.batch_size), float(ac.lr), float(ac.weight_decay),
                                      int(ac.warmup_steps), 0, ac.get("max_grad_norm"), out_dir),
                     beta=float(ac.beta), loss_type=["sigmoid"], max_length=int(ac.max_len),
                     truncation_mode="keep_start",
                     precompute_ref_log_probs=False, padding_free=False, use_liger_kernel=False, disable_dropout=True,
                     pad_to_multiple_of=None, use_weighting=False, ld_alpha=None, sync_ref_model=False)
    policy = Fm.load_causal_lm(wm.lm_dir, tok)
    reference = Fm.load_causal_lm(ref_dir or wm.lm_dir, tok).eval()
    return _trl_trainer_cls()(model=policy, ref_model=reference, args=args, train_dataset=Dataset.from_list(rows),
                              processing_class=tok)


def _loader(examples, tok, batch_size: int):
    from torch.utils.data import DataLoader

    from rlhf_lab.algorithms.dpo import collate_dpo_pairs

    return DataLoader(examples, batch_size=batch_size, shuffle=False, collate_fn=collate_dpo_pairs(tok.pad_token_id),
                      drop_last=True)


def first_batch_agreement(wm: WorldModel, tok, ac: DictConfig, examples, rows) -> dict:
    """Loss, mean chosen/rejected log-probs and gradient norm of both sides on the first batch.

    The reference here has other (random) weights than the policy, so that the loss is not the trivial
    log 2 that any implementation gets when policy == reference.
    """
    from rlhf_lab.algorithms.dpo import collate_dpo_pairs

    B = int(ac.batch_size)
    ours = ours_module(wm, tok, ac, 10, ref_dir=wm.lm_dir.parent / "lm_ref")
    batch = collate_dpo_pairs(tok.pad_token_id)(examples[:B])
    loss, m = ours.loss_and_metrics(batch)
    loss.backward()
    o = {"loss": float(loss), "logps/chosen": float(m["logps/chosen"]), "logps/rejected": float(m["logps/rejected"]),
         "grad_norm": grad_norm(ours.model)}
    with tempfile.TemporaryDirectory() as tmp:
        tr = trl_trainer(wm, tok, ac, 10, rows, tmp, ref_dir=wm.lm_dir.parent / "lm_ref")
        tb = tr.data_collator(rows[:B])
        tr.model.train()
        tl = tr.compute_loss(tr.model, tb)
        tl.backward()
        tm = tr._metrics["train"]
        t = {"loss": float(tl), "logps/chosen": tm["logps/chosen"][-1], "logps/rejected": tm["logps/rejected"][-1],
             "grad_norm": grad_norm(tr.model)}
        same_ids = torch.equal(tb["input_ids"], batch["input_ids"]) and torch.equal(
            tb["completion_mask"], batch["loss_mask"])
    return {"ours": o, "trl": t, "same_ids": same_ids}


def run(cfg: DictConfig, wm: WorldModel, pairs, steps: int, warmup: int, rounds: int, tol: float) -> Section:
    t_start = time.time()
    ac = cfg.algo
    tok = load_tokenizer(wm.lm_dir)
    examples = _examples(tok, pairs, int(ac.max_len))
    rows = trl_rows(examples)
    B = int(ac.batch_size)
    n_needed = steps * B
    if len(examples) < n_needed:
        raise ValueError(f"DPO benchmark needs {n_needed} pairs, got {len(examples)}")

    agree = first_batch_agreement(wm, tok, ac, examples, rows)

    def run_side(side: str):
        if side == "ours":
            return lightning_fit(ours_module(wm, tok, ac, steps), _loader(examples, tok, B), steps, warmup,
                                 ac.get("max_grad_norm"))
        with tempfile.TemporaryDirectory() as tmp:
            return hf_fit(trl_trainer(wm, tok, ac, steps, rows, tmp), warmup)

    tp = throughput(alternate(rounds, run_side), B)
    return training_section(
        "DPO training throughput (ours vs TRL DPOTrainer)", __doc__.split("\n\n", 1)[1].strip(),
        "ours (DPOModule + Lightning)", "TRL DPOTrainer", tp, agree, AGREE_KEYS, tol,
        "First batch, same initial weights (reference: other random weights, so the loss is not log 2):",
        "identical input ids and loss masks",
        f"batch {B} pairs ({2 * B} rows), max_len {int(ac.max_len)}, β {float(ac.beta)}, lr {float(ac.lr)}, "
        f"{steps} steps per run of which {warmup} warm-up, {rounds} round(s) alternating the order", t_start)

