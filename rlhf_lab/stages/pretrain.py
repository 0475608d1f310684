"""Stage ``pretrain``: a tokenizer and a base causal LM of one model family, trained on the world's corpus.

The model is ``cfg.policy`` (family, ``arch``, ``vocab_size``); a reward-model backbone of another
family or size is pretrained by passing a config whose ``policy`` is that backbone
(:func:`rlhf_lab.stages.rm.backbone_path`). Family ``b`` draws a different corpus sample than ``a``.
The corpus is "web text": reviews of the ``pretrain`` split (train-bucket prompts of every product, the
held-out OOD products included, so the tokenizer and base LM know their names; no eval, test or ood
prompt; :mod:`rlhf_lab.world.splits`).
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
from omegaconf import DictConfig

from rlhf_lab.models.batching import encode_lm_examples
from rlhf_lab.world import streams as D
from rlhf_lab.config import world as W
from rlhf_lab.models import families as F
from rlhf_lab.config.keys import to_plain
from rlhf_lab.stages.pipeline import job_stage, job_steps, stage_seed
from rlhf_lab.stages.training import fit_lm
from rlhf_lab.stages.gold import load_gold

WHAT = "base model"


def spec(cfg: DictConfig) -> dict:
    m = cfg.policy
    return {
        "family": m.family, "arch": to_plain(m.arch), "vocab_size": m.vocab_size,
        "world": W.world_generation_spec(cfg), "pretrain": to_plain(cfg.pretrain),
        "seed": stage_seed(cfg, "pretrain"), "steps": job_steps(cfg, "pretrain", cfg.pretrain.steps),
    }


def build(cfg: DictConfig, out_dir: Path, spec: dict) -> dict:
    m, pc = cfg.policy, cfg.pretrain
    family = str(m.family)
    L.seed_everything(spec["seed"], verbose=False)
    corpus = D.reviews(W.world_settings(cfg), f"pretrain_{family}", pc.n_texts, split="pretrain")  # "web text": OOD products too
    tok = F.train_tokenizer(family, [p + " " + r for p, r in corpus], m.vocab_size)
    model = F.build_model(family, m.arch, tok)
    examples = encode_lm_examples(tok, corpus, pc.max_len, loss_on_prompt=True)
    gold = load_gold(cfg) if job_stage(cfg) == "pretrain" else None  # upstream: the formula (any gold's base)
    return fit_lm(cfg, "pretrain", model, tok, examples, pc, spec["steps"], out_dir,
                  params={"family": family, "arch": to_plain(m.arch)}, gold=gold)
