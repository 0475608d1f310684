"""Stage ``sft``: supervised fine-tuning of the base model on (prompt -> response) reviews of the world
(train-split prompts only: no OOD product);
the loss is on the response and its EOS only. The SFT model is the policy's starting point and, by
default, the reference and the reward model's backbone."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from omegaconf import DictConfig

from rlhf_lab.models.batching import encode_lm_examples
from rlhf_lab.world import streams as D
from rlhf_lab.config import world as W
from rlhf_lab.models import families as F
from rlhf_lab.config.keys import to_plain
from rlhf_lab.stages.pipeline import ensure, job_stage, job_steps, stage_seed, upstream_run
from rlhf_lab.stages.training import fit_lm
from rlhf_lab.stages.gold import load_gold

WHAT = "SFT policy"


def spec(cfg: DictConfig) -> dict:
    return {
        "base": str(ensure("pretrain", cfg)), "world": W.world_generation_spec(cfg), "sft": to_plain(cfg.sft),
        "seed": stage_seed(cfg, "sft"), "steps": job_steps(cfg, "sft", cfg.sft.steps),
    }


def build(cfg: DictConfig, out_dir: Path, spec: dict) -> dict:
    sc = cfg.sft
    L.seed_everything(spec["seed"], verbose=False)
    base = spec["base"]
    tok = F.load_tokenizer(base, "policy.name_or_path")
    model = F.load_causal_lm(base, tok, "policy.name_or_path", **F.load_options(cfg.policy))
    pairs = D.reviews(W.world_settings(cfg), "sft", sc.n_examples, split="train")
    examples = encode_lm_examples(tok, pairs, sc.max_len, loss_on_prompt=False)
    gold = load_gold(cfg) if job_stage(cfg) == "sft" else None  # upstream: the formula (the model suits any gold)
    return fit_lm(cfg, "sft", model, tok, examples, sc, spec["steps"], out_dir, params={"base": str(base)},
                  upstream={"pretrain": upstream_run(cfg, base)}, gold=gold)
