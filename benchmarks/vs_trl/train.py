"""DPO and reward-model training throughput, ours (``DPOModule`` / ``RewardModelModule`` in a Lightning Trainer, as
the stages run them) against TRL's ``DPOTrainer`` / ``RewardTrainer``, with the first-batch agreement of the losses.

Both sides get the same weights (the same ``save_pretrained`` folders), our token ids, batch size, ``max_length``,
loss, AdamW, learning rate, warm-up, clipping, fp32, no gradient checkpointing, dropout off, batches in the same
order and the same number of optimizer steps; what each matches in detail is in benchmarks/README.md.
"""

from __future__ import annotations

import tempfile

import torch
from omegaconf import DictConfig

from benchmarks import common as C

DPO_NOTE = ("Matched as benchmarks/README.md lists (`dpo`): weights, reference (a frozen copy from the same folder, "
            "no precomputation), our token ids (TRL's dataset preparation skipped), batch, `max_length`, sigmoid loss "
            "and β, AdamW, lr, warm-up, clipping at 1.0, fp32, no gradient checkpointing, dropout off, batch order. "
            "Left: TRL's fused, chunked LM head and extra metrics; the Trainer/accelerate loop vs Lightning's.")
RM_NOTE = ("Matched as benchmarks/README.md lists (`rm`): the sequence classifier (same folder, same head), our token "
           "ids, batch, Bradley–Terry loss without margin or centering, AdamW, lr, warm-up, no clipping, fp32, batch "
           "order. Left: ours packs each batch's sequences into rows (`reward_model.packing`) and reads the last token "
           "only; TRL pads to the longest sequence and scores every position; the Trainer/accelerate loop.")


def hf_args(steps: int, batch_size: int, lr: float, weight_decay: float, warmup_steps: int, max_grad_norm,
            out_dir: str, log_every: int = 10) -> dict:
    """TrainingArguments doing our side's work: TRL's defaults that change it (``bf16``, ``gradient_checkpointing``)
    off; no evaluation, saving or reporting; batches in order, the last partial one dropped; AdamW's fused kernel
    (``adamw_torch_fused``, transformers' default on torch >= 2.8), as ours (``rlhf_lab.algorithms.lm.adamw``)."""
    return dict(
        output_dir=out_dir, max_steps=steps, per_device_train_batch_size=batch_size, learning_rate=lr,
        weight_decay=weight_decay, warmup_steps=warmup_steps, lr_scheduler_type="linear", seed=0,
        max_grad_norm=float(max_grad_norm or 0.0), bf16=False, fp16=False, gradient_checkpointing=False,
        use_cpu=True, report_to="none", save_strategy="no", eval_strategy="no", logging_steps=log_every,
        disable_tqdm=True, dataloader_num_workers=0, dataloader_drop_last=True,
        train_sampling_strategy="sequential", optim="adamw_torch_fused", adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8)


def hf_fit(trainer, clock: C.StepClock, every: int = 1) -> C.StepClock:
    """Run a transformers/TRL trainer, `clock` ticking at every `every`-th optimizer step end."""
    from transformers import PrinterCallback, TrainerCallback

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % every == 0:
                clock.tick()

    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(Clock())
    trainer.train()
    return clock


def dpo_models(wm: C.WorldModel, tok, ref_dir=None):
    from rlhf_lab.models import families as Fm

    return Fm.load_causal_lm(wm.lm_dir, tok), Fm.load_causal_lm(ref_dir or wm.lm_dir, tok).eval()


def dpo_ours(wm, tok, ac: DictConfig, steps: int, ref_dir=None):
    from rlhf_lab.algorithms.dpo import DPOModule

    return DPOModule(*dpo_models(wm, tok, ref_dir), beta=float(ac.beta), loss_type="sigmoid", label_smoothing=0.0,
                     lr=float(ac.lr), weight_decay=float(ac.weight_decay), warmup_steps=int(ac.warmup_steps),
                     max_steps=steps, pad_id=tok.pad_token_id, batch_size=int(ac.batch_size))


def dpo_trl(wm, tok, ac: DictConfig, steps: int, rows: list[dict], out_dir: str, ref_dir=None):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    class PretokenizedDPOTrainer(DPOTrainer):  # fed our token ids: its prompt extraction and tokenisation skipped
        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            return dataset

    args = DPOConfig(**hf_args(steps, int(ac.batch_size), float(ac.lr), float(ac.weight_decay), int(ac.warmup_steps),
                               ac.get("max_grad_norm"), out_dir),
                     beta=float(ac.beta), loss_type=["sigmoid"], max_length=int(ac.max_len), truncation_mode="keep_start",
                     precompute_ref_log_probs=False, padding_free=False, use_liger_kernel=False, disable_dropout=True,
                     pad_to_multiple_of=None, use_weighting=False, ld_alpha=None, sync_ref_model=False)
    policy, reference = dpo_models(wm, tok, ref_dir)
    return PretokenizedDPOTrainer(model=policy, ref_model=reference, args=args, train_dataset=Dataset.from_list(rows),
                                  processing_class=tok)


def dpo_agreement(wm, tok, ac: DictConfig, batch, rows) -> tuple[list, dict]:
    """Loss, mean chosen/rejected log-probs and gradient norm of both sides on the first batch; the reference has
    other random weights (``lm_ref``): with policy = reference every implementation returns log 2."""
    ours = dpo_ours(wm, tok, ac, 10, ref_dir=wm.ref_dir)
    loss, m = ours.loss_and_metrics(batch)
    loss.backward()
    with tempfile.TemporaryDirectory() as tmp:
        tr = dpo_trl(wm, tok, ac, 10, rows, tmp, ref_dir=wm.ref_dir)
        tb = tr.data_collator(rows[: int(ac.batch_size)])
        tr.model.train()
        tl = tr.compute_loss(tr.model, tb)
        tl.backward()
        tm = tr._metrics["train"]
        same = torch.equal(tb["input_ids"], batch["input_ids"]) and torch.equal(tb["completion_mask"],
                                                                                batch["loss_mask"])
    return [("loss", float(loss), float(tl)),
            ("logps/chosen", float(m["logps/chosen"]), tm["logps/chosen"][-1]),
            ("logps/rejected", float(m["logps/rejected"]), tm["logps/rejected"][-1]),
            ("grad_norm", C.grad_norm(ours.model), C.grad_norm(tr.model))], {"input ids and loss masks": same}


def rm_ours(wm, tok, rc: DictConfig, steps: int):
    from rlhf_lab.algorithms.rm import RewardModelModule
    from rlhf_lab.models import families as Fm

    return RewardModelModule(Fm.load_sequence_scorer(wm.rm_dir, tok), lr=float(rc.lr), weight_decay=float(rc.weight_decay),
                             warmup_steps=int(rc.warmup_steps), max_steps=steps, use_margin=False, center_coef=0.0)


def rm_trl(wm, tok, rc: DictConfig, steps: int, rows: list[dict], out_dir: str):
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    from rlhf_lab.models import families as Fm

    args = RewardConfig(**hf_args(steps, int(rc.batch_size), float(rc.lr), float(rc.weight_decay),
                                  int(rc.warmup_steps), None, out_dir),
                        max_length=int(rc.max_len), center_rewards_coefficient=None, disable_dropout=True,
                        pad_to_multiple_of=None)
    return RewardTrainer(model=Fm.load_sequence_scorer(wm.rm_dir, tok), args=args,
                         train_dataset=Dataset.from_list(rows), processing_class=tok)


def rm_agreement(wm, tok, rc: DictConfig, batch, rows) -> tuple[list, dict]:
    """Loss, mean chosen/rejected reward and gradient norm of both sides on the first batch."""
    from rlhf_lab.algorithms.dpo_math import bradley_terry_loss

    B, ids, n = int(rc.batch_size), batch["input_ids"], batch["lengths"].tolist()
    if "attention_mask" in batch:  # the token ids of each sequence of our batch, padded or packed (collate_rm_pairs)
        seqs = [row[:k] for row, k in zip(ids.tolist(), n)]
    else:
        seqs = [ids.reshape(-1).tolist()[e - k + 1: e + 1] for e, k in zip(batch["last_index"].tolist(), n)]
    ours = rm_ours(wm, tok, rc, 10)
    r = ours.rewards(batch)  # what training_step computes
    loss = bradley_terry_loss(r[:B], r[B:], None, 0.0)
    loss.backward()
    with tempfile.TemporaryDirectory() as tmp:
        tr = rm_trl(wm, tok, rc, 10, rows, tmp)
        tb = tr.data_collator(rows[:B])
        tr.model.train()
        tl, out = tr.compute_loss(tr.model, dict(tb), return_outputs=True)
        tl.backward()
        lg = out.logits.squeeze(-1).detach()
        same = [row[m.bool()].tolist() for row, m in zip(tb["input_ids"], tb["attention_mask"])] == seqs
    return [("loss", float(loss), float(tl)), ("reward/chosen", float(r[:B].mean()), float(lg[:B].mean())),
            ("reward/rejected", float(r[B:].mean()), float(lg[B:].mean())),
            ("grad_norm", C.grad_norm(ours.model), C.grad_norm(tr.model))], {"token ids of every sequence": same}


def run(algo: str, wm: C.WorldModel, steps: int, warmup: int, rounds: int) -> C.Section:
    """``algo``: dpo or rm."""
    from torch.utils.data import DataLoader

    from rlhf_lab.algorithms import dpo, rm

    dpo_side = algo == "dpo"
    cfg = C.compose([f"algo={algo}"])
    c = cfg.algo if dpo_side else cfg.reward_model
    B, packed = int(c.batch_size), bool(c.get("packing", False))
    sec = C.Section("DPO training throughput (ours vs TRL DPOTrainer)" if dpo_side else
                    "RM training throughput (ours vs TRL RewardTrainer)", DPO_NOTE if dpo_side else RM_NOTE)
    tok = C.load_tokenizer(wm.lm_dir if dpo_side else wm.rm_dir)
    pairs = C.make_pairs(cfg, steps * B)
    if dpo_side:
        examples = dpo.encode_dpo_pairs(tok, pairs, int(c.max_len))
        rows, collate = [], dpo.collate_dpo_pairs(tok.pad_token_id)
        for e in examples:  # as TRL's pre-tokenized columns: the prompt and each completion (with its EOS)
            n = e["n_chosen"]
            if e["n_rejected"] != n or e["chosen"][:n] != e["rejected"][:n]:
                raise ValueError("chosen and rejected must share the prompt's token ids")
            rows.append({"prompt_ids": e["chosen"][:n], "chosen_ids": e["chosen"][n:],
                         "rejected_ids": e["rejected"][n:]})
    else:
        examples = rm.encode_rm_pairs(tok, pairs, int(c.max_len))
        rows = [{"chosen_ids": e["chosen"], "rejected_ids": e["rejected"]} for e in examples]
        collate = rm.collate_rm_pairs(tok.pad_token_id, packed)
    agree, ok = C.agreement(*(dpo_agreement if dpo_side else rm_agreement)(wm, tok, c, collate(examples[:B]), rows))

    def run_side(side: str) -> C.StepClock:
        clock = C.StepClock(warmup)
        if side == "ours":
            module = dpo_ours(wm, tok, c, steps) if dpo_side else rm_ours(wm, tok, c, steps)
            loader = DataLoader(examples, batch_size=B, shuffle=False, collate_fn=collate, drop_last=True)
            C.fit(module, loader, steps, clock, grad_clip=c.get("max_grad_norm") if dpo_side else None)
            return clock
        with tempfile.TemporaryDirectory() as tmp:
            return hf_fit((dpo_trl if dpo_side else rm_trl)(wm, tok, c, steps, rows, tmp), clock)

    clocks = C.alternate(rounds, run_side)
    o, t = C.rate(clocks["ours"], B), C.rate(clocks["trl"], B)
    ratio = o["rate"] / t["rate"]
    sec.tables.append(C.table(["side", "pairs/s", "ms/step", "timed steps", "ratio ours/TRL"], [
        ["ours (DPOModule + Lightning)" if dpo_side else "ours (RewardModelModule + Lightning)", o["rate"], o["ms"],
         o["n"], ratio], ["TRL DPOTrainer" if dpo_side else "TRL RewardTrainer", t["rate"], t["ms"], t["n"], 1.0]]))
    sec.tables.append(("First batch, same initial weights (reference: other random weights, so the loss is not log 2):"
                       if dpo_side else "First batch, same initial weights:") + "\n\n" + C.agreement_table(agree))
    shape = (f"batch {B} pairs ({2 * B} rows), max_len {int(c.max_len)}, β {float(c.beta)}" if dpo_side else
             f"batch {B} pairs ({2 * B} sequences{', packed' if packed else ', padded'}), max_len {int(c.max_len)}")
    sec.findings.append(f"settings: {shape}, lr {float(c.lr)}, "
                        + C.runs_line(steps, warmup, rounds, C.per_round(clocks["ours"], clocks["trl"]), clocks))
    sec.summary = [f"{algo.upper()} throughput, ours/TRL (pairs/s)", f"{ratio:.2f}×",
                   "loss agrees" if ok else "LOSS DIFFERS"]
    sec.ok, sec.data = ok, {"ratio": ratio, "agree": agree}
    return sec
