"""Claim C6: memory of PPO with separate model copies vs a shared LoRA base (reference = adapters off).

    python reports/ppo_hacking/memory.py --hidden 768 --layers 12 --steps 2

Builds a randomly initialised family-a (Llama-style) policy of the given size (weights do not matter for
memory), then for each mode runs `--steps` PPO steps (oracle gold reward, critic from the policy) in a
fresh subprocess and reports the models' parameter+buffer bytes (distinct storages) and the process's
peak RSS, absolute and above the RSS measured after the imports.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def child(args) -> None:
    import lightning as L
    import mlflow
    import torch
    from hydra import compose, initialize_config_module

    from rlhf_lab import data as D
    from rlhf_lab.algorithms import ppo
    from rlhf_lab.models.adapters import unwrap
    from rlhf_lab.stages import ppo as ppo_stage
    from rlhf_lab.models import families as F

    torch.set_num_threads(1)
    base_rss = rss_mb()
    with initialize_config_module("rlhf_lab.conf", version_base="1.3"):
        cfg = compose("config", overrides=[
            "algo=ppo", "algo.reward=gold", *(["algo.reference.kind=lora_disabled", "algo.lora.r=16"] if args.mode == 'shared' else []), "algo.batch_size=16",
            "algo.num_minibatches=2", "algo.ppo_epochs=1", "generation.max_new_tokens=16"])
    tok = F.load_tokenizer(args.ckpt)
    policy, reference, critic = ppo_stage.build_models(cfg.algo, args.ckpt, tok)
    scorer = ppo_stage.GoldScorer(D.gold_weights(cfg))
    module = ppo.PPOModule(policy, reference, critic, tok, scorer, lambda s: D.prompts(cfg, f"mem/{s}", 16),
                           cfg.algo, cfg.kl, cfg.generation, D.gold_weights(cfg))
    mlflow.set_tracking_uri(f"sqlite:///{args.db}")
    with mlflow.start_run():
        trainer = L.Trainer(max_steps=args.steps * module.updates_per_step, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                            default_root_dir=tempfile.mkdtemp())
        trainer.fit(module)
    print(json.dumps({"mode": args.mode, "model_bytes": ppo_stage.model_bytes(policy, reference, critic),
                      "trainable_params": sum(p.numel() for p in module.parameters() if p.requires_grad),
                      "policy_params": F.n_params(unwrap(policy)),
                      "rss_after_imports_mb": base_rss, "peak_rss_mb": rss_mb(), "peak_above_imports_mb": rss_mb() - base_rss,
                      "step_s": module.last_stats.get("time/step_s")}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--mode", default=None)
    ap.add_argument("--ckpt", default=None)
    ap.add_argument("--db", default=None)
    args = ap.parse_args()
    if args.mode:
        return child(args)
    from rlhf_lab.models import families as F
    from rlhf_lab.world import ReviewGenerator

    tmp = Path(tempfile.mkdtemp())
    texts = [p + " " + r for p, r in ReviewGenerator(0).reviews(2000)]
    tok = F.train_tokenizer("a", texts, 384)
    model = F.build_model("a", {"hidden": args.hidden, "layers": args.layers, "heads": args.heads}, tok)
    tok.save_pretrained(tmp)
    model.save_pretrained(tmp)
    print(f"policy: family a, hidden {args.hidden}, layers {args.layers}: {F.n_params(model) / 1e6:.1f}M parameters")
    del model
    rows = []
    for mode in ("separate", "shared"):
        out = subprocess.run([sys.executable, __file__, "--mode", mode, "--ckpt", str(tmp), "--db", str(tmp / "m.db"),
                              "--steps", str(args.steps)], capture_output=True, text=True, env=dict(os.environ))
        line = [x for x in out.stdout.splitlines() if x.startswith("{")]
        if not line:
            print(out.stdout[-2000:], out.stderr[-4000:])
            raise SystemExit(f"{mode} failed")
        rows.append(json.loads(line[-1]))
    print("| mode | models' bytes (MiB) | trainable params | peak RSS (MiB) | peak RSS above imports (MiB) | step (s) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['model_bytes'] / 2**20:.0f} | {r['trainable_params'] / 1e6:.2f}M | {r['peak_rss_mb']:.0f} | "
              f"{r['peak_above_imports_mb']:.0f} | {r['step_s']:.1f} |")


if __name__ == "__main__":
    main()
