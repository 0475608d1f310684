"""Stage ``dpo``: Direct Preference Optimization of the SFT policy on the ``data`` preference pairs.

Wiring only; the algorithm is :class:`rlhf_lab.algorithms.dpo.DPOModule`. The reference
(``algo.reference.kind``): ``copy`` (a frozen copy of the SFT model, or of the checkpoint
``algo.reference.path`` with the policy's tokenizer), ``lora_disabled`` (the policy's own base with its
LoRA adapters disabled, ``algo.lora.r > 0``; no second copy of the weights), ``precomputed`` (reference
log-probs computed once before training; no reference model in memory while training; at evaluation
points the reference is loaded from disk for ``eval/kl`` only). ``algo.online``: every
``algo.online_every`` steps, pairs are sampled from the current policy and labelled by the world's labeler (on
the gold RM's score with ``gold=rm``, :mod:`rlhf_lab.stages.gold`).
"""

from __future__ import annotations

import random
import time
import warnings
from pathlib import Path
from typing import Callable

import lightning as L
import torch
from omegaconf import DictConfig

from rlhf_lab.world import streams as D
from rlhf_lab.config import world as W
from rlhf_lab.runs import active_run, distributed, tracking
from rlhf_lab.algorithms.dpo import (
    DPOModule,
    collate_dpo_pairs,
    encode_dpo_pairs,
    pair_metrics,
    precompute_reference,
)
from rlhf_lab.config.checks import check_dpo
from rlhf_lab.models import families as F
from rlhf_lab.models.adapters import AdapterDisabled, with_lora
from rlhf_lab.models.sampling import sample
from rlhf_lab.config import data as DS
from rlhf_lab.data.preferences import label_pairs, validate_pairs
from rlhf_lab.config.keys import computes, to_plain
from rlhf_lab.stages import gold as G
from rlhf_lab.stages import heldout, prefs
from rlhf_lab.stages import rm as rm_stage
from rlhf_lab.stages.evaluate import checkpoints_summary, gold_summary, held_out_summary, policy_evaluations
from rlhf_lab.stages.pipeline import run_settings, ensure, generation_spec, job_steps, stage_seed, upstream_run
from rlhf_lab.stages.training import eval_steps, fit, model_size

WHAT = "DPO policy"


def spec(cfg: DictConfig) -> dict:
    check_dpo(cfg.algo)  # DPO's rules, as the CLI checks them, before any upstream stage is built (a direct call)
    data = {k: v for k, v in to_plain(cfg.data).items() if computes(f"data.{k}")}  # not the input's size bounds
    if cfg.data.source == "world":  # what determines the pairs besides the SFT model (stages.prefs.spec)
        data = {**data, "world": W.world_generation_spec(cfg), "gold": to_plain(cfg.world.gold)}
    out = {"sft": str(ensure("sft", cfg)), "data": data, "algo": to_plain(cfg.algo), "labeler": to_plain(cfg.labeler),
           "generation": generation_spec(cfg), "seed": stage_seed(cfg, "dpo", "algo"),
           "steps": job_steps(cfg, "dpo", cfg.algo.steps), **heldout.spec(cfg)}  # reward_model.heldout: its RM
    if G.is_rm(cfg):  # the gold RM labels the pairs (and the online ones); nothing added for the formula
        out["gold_rm"] = G.identity(cfg)
    return out


def online_refresh(cfg, module_ref, tok, max_len: int, seed: int, gold=None) -> Callable[[], list[dict]]:
    """Sample two responses per prompt from the current policy, label them (the labeler on `gold`, a gold-RM
    scorer; None: the formula), attach reference log-probs."""
    n = cfg.algo.online_prompts
    stream = D.prompts(W.world_settings(cfg), "dpo_online", n * 50, split="train")
    rng = random.Random(seed)
    state = {"i": 0}
    g = cfg.generation

    def refresh() -> list[dict]:
        module: DPOModule = module_ref()
        i = state["i"] % len(stream)
        prompts = (stream + stream)[i : i + n]
        state["i"] += n
        policy = module.model
        a = sample(policy, tok, prompts, g.max_new_tokens, g.temperature, g.top_k, g.top_p, g.max_prompt_len,
                   sampler=g.sampler)
        b = sample(policy, tok, prompts, g.max_new_tokens, g.temperature, g.top_k, g.top_p, g.max_prompt_len,
                   sampler=g.sampler)
        pairs = label_pairs(DS.labelling(cfg), prompts, a.responses, b.responses, a.ended, b.ended, rng, "online", gold)
        ex = encode_dpo_pairs(tok, pairs, max_len)
        for e, p in zip(ex, pairs):
            e["gold_agrees"] = p.gold_agrees
        ref = AdapterDisabled(policy) if module.lora_disabled else module.reference
        was = policy.training
        policy.eval()
        precompute_reference(ref, ex, tok.pad_token_id)
        policy.train(was)
        return ex

    return refresh


def build(cfg: DictConfig, out_dir: Path, spec: dict) -> dict:
    warnings.filterwarnings("ignore", message=".*module\\(s\\) in eval mode.*")  # the frozen reference
    ac = cfg.algo
    if ac.online and distributed.n_processes(to_plain(cfg.trainer)) > 1:
        raise ValueError("algo.online=true is not supported with several processes (trainer.devices > 1): "
                         "its generated pairs are not shared across ranks; run online DPO on one process")
    if ac.online and cfg.data.source != "world":
        raise ValueError("algo.online=true labels new pairs with the world's labeler: it needs data=world")
    scorer, tags = None, {}
    if ac.get("proxy_rm"):  # DPO needs no reward model; this only adds eval/proxy_reward
        rm_path = rm_stage.rm_path(cfg)
        scorer = rm_stage.load_scorer(cfg, rm_path)
        tags["rlhf_lab.upstream.rm"] = upstream_run(cfg, rm_path)

    gold = G.load_gold(cfg)  # eval/gold_reward (and the labels of online pairs)
    if gold.source == "rm":
        tags["rlhf_lab.upstream.gold_rm"] = upstream_run(cfg, G.rm_path(cfg))
    sft_path = spec["sft"]
    train_pairs, eval_pairs = prefs.load(cfg)
    validate_pairs(train_pairs, "data")
    seed, steps, max_len = spec["seed"], spec["steps"], ac.max_len
    L.seed_everything(seed, verbose=False)

    tok = F.load_tokenizer(sft_path, "policy.name_or_path")
    policy = F.load_causal_lm(sft_path, tok, "policy.name_or_path", **F.load_options(cfg.policy))
    train_ex = encode_dpo_pairs(tok, train_pairs, max_len)
    eval_ex = encode_dpo_pairs(tok, eval_pairs[: int(ac.get("eval_pairs", 256))], max_len)

    kind = str(ac.reference.kind)
    ref_path = ac.reference.get("path") or sft_path
    if ac.reference.get("path") and not F.same_tokenizer(F.load_tokenizer(ref_path, "algo.reference.path"), tok):
        raise ValueError(f"algo.reference.path={ref_path!r} has a different tokenizer than the policy; "
                         "DPO's log-ratios need the same tokenizer (same model family)")
    load_ref = lambda: F.load_causal_lm(ref_path, tok, "algo.reference.path", **F.load_options(cfg.policy)).eval()  # noqa: E731
    t_pre = time.time()
    if kind == "precomputed":  # reference log-probs once; the reference model is freed before training
        ref = load_ref()
        precompute_reference(ref, train_ex, tok.pad_token_id)
        precompute_reference(ref, eval_ex, tok.pad_token_id)
        del ref
        reference = None
    else:
        reference = load_ref() if kind == "copy" else "lora_disabled"
        precompute_reference(reference if kind == "copy" else policy, eval_ex, tok.pad_token_id)
    t_pre = time.time() - t_pre
    policy = with_lora(policy, ac.lora, "CAUSAL_LM", key="algo.lora")

    holder: dict = {}
    online = None
    if ac.online:
        online = (online_refresh(cfg, lambda: holder["module"], tok, max_len, seed,
                                 gold.scorer if gold.source == "rm" else None), ac.online_every)
    module = DPOModule(policy, reference, beta=ac.beta, loss_type=str(ac.loss_type),
                       label_smoothing=ac.label_smoothing, lr=ac.lr, weight_decay=ac.weight_decay,
                       warmup_steps=ac.warmup_steps, max_steps=steps, online=online, pad_id=tok.pad_token_id,
                       batch_size=ac.batch_size)
    holder["module"] = module

    def eval_reference():
        if module.lora_disabled:
            return AdapterDisabled(module.model)
        return module.reference if module.reference is not None else load_ref()  # precomputed: load for eval only

    params = {"stage": "dpo", "algo": to_plain(ac), "data": spec["data"] if cfg.data.source != "world" else to_plain(cfg.data),
              "labeler": to_plain(cfg.labeler), "world": to_plain(cfg.world), "seed": seed, "steps": steps,
              "sft": str(sft_path), "n_train_pairs": len(train_ex), "n_eval_pairs": len(eval_ex),
              "gold": to_plain(cfg.get("gold"))}
    tags["rlhf_lab.upstream.sft"] = upstream_run(cfg, sft_path)
    with tracking.start_run(run_settings(cfg), "dpo", params=params, tags=tags) as run:
        g = torch.Generator().manual_seed(seed)
        loader = distributed.loader(train_ex, ac.batch_size, g, collate_dpo_pairs(tok.pad_token_id),
                                    drop_last=len(train_ex) >= ac.batch_size, key="algo.batch_size")
        ev = policy_evaluations(cfg, spec, module.model, tok, out_dir, eval_steps(cfg, steps), reference=eval_reference,
                                scorer=scorer, gold=gold,
                                extra=lambda: pair_metrics(module.model, eval_ex, tok.pad_token_id, ac.beta))
        size = model_size(policy)
        active_run.log_metrics({**size, "time/reference_precompute_s": t_pre}, step=0)
        model, train_s = fit(cfg, "dpo", module, loader, module.model, out_dir, steps, "DPO policy", callbacks=[ev],
                             gradient_clip_val=ac.get("max_grad_norm"))
        if not distributed.is_rank_zero():  # rank 0 saves and logs
            return {"stage": "dpo", "train_s": train_s}
        if hasattr(model, "merge_and_unload"):  # save a plain causal LM: downstream stages load it as any policy
            model = model.merge_and_unload()
        model.eval()
        tok.save_pretrained(out_dir)
        model.save_pretrained(out_dir)
        active_run.log_metric("time/train_s", train_s)
        start, last = ev.first, ev.last
        summary = gold_summary(ev.test_first, ev.test_last, "SFT", f"DPO step {steps}")
        summary.update({**held_out_summary(ev), **checkpoints_summary(ev)})
        if "eval/gold_reward" in start and "eval/gold_reward" in last:
            active_run.log_metric("eval/gold_reward_gain", last["eval/gold_reward"] - start["eval/gold_reward"])
        return {"run_id": run.info.run_id, "stage": "dpo", "eval": last, "eval_start": start, "train_s": train_s,
                "test": ev.test_last, "test_start": ev.test_first,
                "reference": kind, "summary": summary, **size}
