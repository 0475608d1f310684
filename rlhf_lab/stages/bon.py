"""Stage ``bon``: best-of-n sampling from the SFT policy against the proxy reward model, for
n = 1, 2, 4, …, ``algo.n_max`` in one job (no training).

For each eval prompt N = ``algo.n_max`` responses are sampled and scored by the proxy and the gold. For each n, the
gold and proxy reward of the response best-of-n picks by proxy are estimated without bias from those N samples
(:func:`rlhf_lab.algorithms.rl_math.best_of_n_expectation`: the average over all n-subsets, not one draw); the KL to
the SFT policy is the analytic bound log n − (n − 1)/n. One MLflow run, n as the step (``bon/*``, docs/metrics.md).
"""

from __future__ import annotations

import time
from pathlib import Path

import lightning as L
import torch
from omegaconf import DictConfig

from rlhf_lab.world import streams as D
from rlhf_lab.config import world as W
from rlhf_lab.runs import active_run, tracking
from rlhf_lab.runs.distributed import work_device
from rlhf_lab.algorithms.rl_math import best_of_n_expectation, best_of_n_kl
from rlhf_lab.evaluation.metrics import cluster_mean_se
from rlhf_lab.evaluation.summary import figure, n_text
from rlhf_lab.models import families as F
from rlhf_lab.models.sampling import sample
from rlhf_lab.config.keys import to_plain
from rlhf_lab.stages import gold as G
from rlhf_lab.stages import rm as rm_stage
from rlhf_lab.stages.pipeline import run_settings, ensure, stage_seed, upstream_run
from rlhf_lab.world import gold_reward

WHAT = "best-of-n samples"
CACHED = False


def n_grid(n_max: int) -> list[int]:
    """1, 2, 4, …, up to n_max (a power of two)."""
    if n_max < 1 or n_max & (n_max - 1):
        raise ValueError(f"algo.n_max must be a power of two >= 1, got {n_max}")
    return [2**i for i in range(n_max.bit_length())]


def spec(cfg: DictConfig) -> dict:
    a = cfg.algo
    n_grid(int(a.n_max))
    if int(a.batch_size) <= 0:
        raise ValueError(f"algo.batch_size must be > 0, got {a.batch_size}")
    return {"sft": str(ensure("sft", cfg)), "rm": str(rm_stage.rm_path(cfg)), "seed": stage_seed(cfg, "bon"),
            "n_max": int(a.n_max)}


@torch.no_grad()
def sample_and_score(policy, tok, prompts: list[str], N: int, gen: DictConfig, scorer, gold_w, batch_size: int,
                     gold=None, formula_gold=None):
    """(proxy [P, N], gold [P, N], length [P, N], formula [P, N] or None): N samples per prompt, in batches of
    ``batch_size``. The gold is the formula with weights `gold_w`, or the scorer `gold` (a gold RM) with the formula
    `formula_gold` beside it."""
    flat = [p for p in prompts for _ in range(N)]
    proxy, golds, formula, length = [], [], [], []
    for i in range(0, len(flat), batch_size):
        chunk = flat[i : i + batch_size]
        ro = sample(policy, tok, chunk, int(gen.max_new_tokens), gen.temperature, gen.top_k, gen.top_p,
                    gen.get("max_prompt_len"), sampler=gen.sampler)
        proxy += scorer(chunk, ro.responses, ro.ended).float().reshape(-1).tolist()
        if gold is None:
            golds += [gold_reward(p, r, e, gold_w) for p, r, e in zip(chunk, ro.responses, ro.ended)]
        else:
            golds += [float(x) for x in gold(chunk, ro.responses, ro.ended)]
        if formula_gold is not None:
            formula += [float(x) for x in formula_gold(chunk, ro.responses, ro.ended)]
        length += ro.lengths.tolist()
    shape = (len(prompts), N)
    return (torch.tensor(proxy).reshape(shape), torch.tensor(golds).reshape(shape),
            torch.tensor(length, dtype=torch.float64).reshape(shape),
            torch.tensor(formula).reshape(shape) if formula_gold is not None else None)


def build(cfg: DictConfig, out_dir: Path, spec: dict) -> dict:
    a = cfg.algo
    L.seed_everything(spec["seed"], verbose=False)
    tok = F.load_tokenizer(spec["sft"], "policy.name_or_path")
    dev = work_device(to_plain(cfg.trainer))  # trainer=gpu: sampled and scored on the GPU
    policy = F.load_causal_lm(spec["sft"], tok, "policy.name_or_path", **F.load_options(cfg.policy)).eval().to(dev)
    scorer = rm_stage.load_scorer(cfg, spec["rm"]).to(dev)
    gold_rm = G.load_gold(cfg)  # the formula, or a gold RM with the formula beside it
    if gold_rm.source == "rm":
        gold_rm.scorer.to(dev)
    prompts = D.eval_prompts(W.world_settings(cfg), "eval", W.eval_size(cfg, "eval"))
    params = {"stage": "bon", "algo": to_plain(a), "generation": to_plain(cfg.generation),
              "world": to_plain(cfg.world), "labeler": to_plain(cfg.labeler), "seed": spec["seed"],
              "sft": spec["sft"], "n_prompts": len(prompts), "gold": to_plain(cfg.get("gold"))}
    if cfg.get("reward_model") is not None:
        params["reward_model"] = to_plain(cfg.reward_model)
    tags = {"rlhf_lab.upstream.sft": upstream_run(cfg, spec["sft"]), "rlhf_lab.upstream.rm": upstream_run(cfg, spec["rm"])}
    if gold_rm.source == "rm":
        tags["rlhf_lab.upstream.gold_rm"] = upstream_run(cfg, G.rm_path(cfg))
    with tracking.start_run(run_settings(cfg), "bon", params=params, tags=tags) as run:
        t0 = time.time()
        proxy, gold, length, formula = sample_and_score(
            policy, tok, prompts, spec["n_max"], cfg.generation, scorer, W.gold_weights(cfg), int(a.batch_size),
            gold=gold_rm.scorer if gold_rm.source == "rm" else None, formula_gold=gold_rm.formula)
        curve = {}
        for n in n_grid(spec["n_max"]):
            per_prompt = best_of_n_expectation(proxy, gold, n).tolist()  # one value per prompt: the units of the SE
            gold_mean, gold_se = cluster_mean_se(per_prompt, range(len(per_prompt)))
            m = {"bon/gold_reward": gold_mean, "bon/gold_reward_se": gold_se,
                 "bon/proxy_reward": best_of_n_expectation(proxy, proxy, n).mean().item(),
                 "bon/kl": best_of_n_kl(n),
                 "bon/length": best_of_n_expectation(proxy, length, n).mean().item()}
            if formula is not None:
                m["bon/formula_gold_reward"] = best_of_n_expectation(proxy, formula, n).mean().item()
            active_run.log_metrics(m, step=n)
            curve[n] = m
        train_s = time.time() - t0
        active_run.log_metrics({"time/train_s": train_s}, step=spec["n_max"])
        best = max(curve, key=lambda n: curve[n]["bon/gold_reward"])
        c1, cN = curve[1], curve[spec["n_max"]]
        summary = {
            "eval gold": f"{figure(c1['bon/gold_reward'], c1['bon/gold_reward_se'])} (best of 1) -> "
                         f"{figure(cN['bon/gold_reward'], cN['bon/gold_reward_se'])} (best of {spec['n_max']}); "
                         f"best {curve[best]['bon/gold_reward']:.3f} at best of {best} "
                         f"({n_text(len(prompts), 'eval prompt')}, ± SE over prompts)",
            "proxy": f"{c1['bon/proxy_reward']:.3f} -> {cN['bon/proxy_reward']:.3f}",
            "kl": f"{cN['bon/kl']:.2f} nats at n={spec['n_max']} (analytic)",
            "samples": f"{proxy.numel()} ({len(prompts)} prompts × {spec['n_max']}) in {train_s:.0f} s",
        }
        return {"run_id": run.info.run_id, "stage": "bon", "curve": curve, "summary": summary, "train_s": train_s}
