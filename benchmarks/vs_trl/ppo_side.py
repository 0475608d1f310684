"""TRL 1.9.2's ``PPOTrainer`` side of ``benchmarks.vs_trl.ppo``, in a process of its own:
``python -m benchmarks.vs_trl.ppo_side JOB.json``, with the folder holding TRL 1.9.2 first on ``PYTHONPATH``.

Self-contained on purpose: torch, transformers, datasets and TRL, never ``rlhf_lab`` (checked and reported back).
Mode ``timed``: ``PPOTrainer.train()`` with the step-end times and the phase times; mode ``check``: one step on the
parent's rollout, permutations and scores, returning TRL's quantities (read from ``train``'s frame at the step's end),
each minibatch's losses and gradient norm. Results go to the job's ``out`` file as JSON.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path

TRL_VERSION = "1.9.2"

for _k, _v in {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
               "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TOKENIZERS_PARALLELISM": "false",
               "TRL_EXPERIMENTAL_SILENCE": "1"}.items():
    os.environ.setdefault(_k, _v)


def build(job: dict, steps: int, norms: list[float]):
    """The trainer: models from the job's folders, the prompts in the job's order (no shuffling)."""
    import torch
    from datasets import Dataset
    from torch.utils.data import DataLoader
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, PrinterCallback
    from transformers.trainer_callback import ProgressCallback
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    tok = AutoTokenizer.from_pretrained(job["lm_dir"])
    tok.padding_side = "left"  # as our prompts (left-padded to the batch's longest)
    policy = AutoModelForCausalLM.from_pretrained(job["lm_dir"])
    ref = AutoModelForCausalLM.from_pretrained(job["ref_dir"])
    rm = AutoModelForSequenceClassification.from_pretrained(job["rm_dir"], num_labels=1)
    value = AutoModelForSequenceClassification.from_pretrained(job["value_dir"], num_labels=1)
    # the value head as our critic's: a linear layer with a bias, weight and bias 0 (the saved classifier's head is
    # zero and has no bias: Llama's `score` is bias-free)
    w = value.score.weight.detach()
    head = torch.nn.Linear(w.shape[1], 1, bias=True)
    with torch.no_grad():
        head.weight.copy_(w[:1])
        head.bias.zero_()
    value.score = head
    batch = int(job["config"]["per_device_train_batch_size"])
    rows = job["prompts"][: steps * batch]
    if len(rows) < steps * batch:
        raise ValueError(f"the job has {len(rows)} prompts, {steps} steps need {steps * batch}")
    args = PPOConfig(**{**job["config"], "total_episodes": steps * batch})
    # one AdamW over the policy and the value model, each with its own learning rate (as ours: one optimizer, two
    # parameter groups), clipping the joint gradient norm at max_grad_norm before each step: the norms before
    # clipping go to `norms`
    o, params, vparams = job["optim"], [p for p in policy.parameters() if p.requires_grad], list(value.parameters())

    class ClippedAdamW(torch.optim.AdamW):
        def step(self, closure=None):
            if o.get("max_grad_norm"):
                norms.append(float(torch.nn.utils.clip_grad_norm_(params + vparams, float(o["max_grad_norm"]))))
            return super().step(closure)

    opt = ClippedAdamW([{"params": params, "lr": float(o["policy_lr"])},
                        {"params": vparams, "lr": float(o["value_lr"])}],
                       eps=float(o["eps"]), weight_decay=float(o["weight_decay"]), foreach=True)
    trainer = PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=ref, reward_model=rm,
                         value_model=value, train_dataset=Dataset.from_dict({"input_ids": rows}),
                         optimizers=(opt, None))
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    # the prompts in the job's order (TRL's own dataloader shuffles)
    trainer.dataloader = DataLoader(trainer.train_dataset, batch_size=batch, shuffle=False,
                                    collate_fn=trainer.data_collator, drop_last=True)
    return trainer, tok


def run_timed(job: dict) -> dict:
    import torch
    from transformers import TrainerCallback
    from trl.experimental.ppo import ppo_trainer as PT

    steps = int(job["steps"])
    norms: list[float] = []
    trainer, _tok = build(job, steps, norms)
    current, phases, stamps, threads = {}, [], [], []  # this step's {phase: s}; per step: those, end time, threads

    base_generation, base_reward, base_forward = PT.batch_generation, PT.get_reward, PT.forward

    def timed(fn, phase):  # `phase(model)`: the phase a call's seconds go to (None: not timed)
        def wrapped(model, *a, **k):
            t0 = time.perf_counter()
            try:
                return fn(model, *a, **k)
            finally:
                if name := phase(model):
                    current[name] = current.get(name, 0.0) + time.perf_counter() - t0
        return wrapped

    def hook(_module, _inputs, out):  # the suppressed tokens' logits −inf (as benchmarks.common.suppress_tokens)
        out[..., job["suppress"]] = float("-inf")
        return out

    def batch_generation(model, *a, **k):
        with model.get_output_embeddings().register_forward_hook(hook):  # the handle removes the hook at the end
            return base_generation(model, *a, **k)

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())
            threads.append(torch.get_num_threads())
            phases.append(dict(current))
            current.clear()

    trainer.add_callback(Clock())
    PT.batch_generation, PT.get_reward, PT.forward = (
        timed(batch_generation, lambda m: "generation"),
        timed(base_reward, lambda m: "score" if m is trainer.reward_model else "forward"),
        timed(base_forward, lambda m: None if torch.is_grad_enabled() else "forward"))
    try:
        trainer.train()
    finally:
        PT.batch_generation, PT.get_reward, PT.forward = base_generation, base_reward, base_forward
    return {"stamps": stamps, "phases": phases, "threads": threads}


def run_check(job: dict) -> dict:
    import numpy as np
    import torch
    from transformers import TrainerCallback
    from trl.experimental.ppo import ppo_trainer as PT

    norms: list[float] = []
    trainer, tok = build(job, 1, norms)
    qr = torch.tensor(job["query_responses"])
    scores = torch.tensor(job["scores"], dtype=torch.float32)
    perms = [np.array(p) for p in job["perms"]]
    rec: dict = {"losses": [], "same_queries": None}
    temperature = float(job["config"]["temperature"])

    def batch_generation(model, queries, batch_size, pad_token_id, generation_config):
        # our rollout: its query + response ids, and the logits `generate` would have returned for them (a forward
        # pass of the policy, divided by the temperature as generate's warper does)
        P = queries.shape[1]
        rec["same_queries"] = bool(P < qr.shape[1] and torch.equal(queries, qr[:, :P]))
        with torch.no_grad():
            logits = PT.forward(model, qr, pad_token_id).logits[:, P - 1 : -1] / (temperature + 1e-7)
        return qr.clone(), logits

    base_reward, base_masked_mean = PT.get_reward, PT.masked_mean

    def get_reward(model, *a, **k):
        out = base_reward(model, *a, **k)
        if model is trainer.reward_model:  # TRL's own score on the ids, recorded; ours goes on
            rec["trl_scores"] = out[1].tolist()
            return out[0], scores.to(out[1].dtype), out[2]
        return out

    it = iter(perms)
    base_permutation = np.random.permutation

    def permutation(n, *a, **k):
        if n == len(qr):
            rec["update"] = True
            return next(it)
        return base_permutation(n, *a, **k)

    def masked_mean(values, mask, *a, **k):
        out = base_masked_mean(values, mask, *a, **k)
        if rec.get("update") and values.requires_grad:  # the value loss, then the policy loss, of each minibatch
            rec["losses"].append(float(out))
        return out

    class Capture(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            f = sys._getframe()  # up to PPOTrainer.train's frame
            while f is not None and not (f.f_code.co_name == "train"
                                         and f.f_globals.get("__name__", "").endswith("ppo_trainer")):
                f = f.f_back
            if f is None:
                raise RuntimeError("PPOTrainer.train's frame not found from its callback")
            loc = f.f_locals
            for k in ("scores", "logprobs", "ref_logprobs", "values", "kl", "non_score_reward", "rewards",
                      "advantages", "returns", "padding_mask", "query_responses"):
                rec[k] = loc[k].tolist()
            rec["context_length"] = int(loc["context_length"])

    trainer.add_callback(Capture())
    PT.batch_generation, PT.get_reward, PT.masked_mean = batch_generation, get_reward, masked_mean
    np.random.permutation = permutation
    try:
        trainer.train()
    finally:
        PT.get_reward, PT.masked_mean = base_reward, base_masked_mean
        np.random.permutation = base_permutation
    losses = rec.pop("losses")
    return {**rec, "vf_loss": [0.5 * v for v in losses[0::2]], "pg_loss": losses[1::2], "grad_norm": norms,
            "log": {k: v for k, v in trainer.state.log_history[-1].items() if isinstance(v, (int, float))},
            "pad_token_id": tok.pad_token_id}


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    import torch

    torch.set_num_threads(int(job["threads"]))
    warnings.filterwarnings("ignore")  # quiet: the libraries' warnings, logs and progress bars
    for name in ("trl", "accelerate", "datasets", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import datasets
    import transformers

    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    import trl

    if trl.__version__ != TRL_VERSION:
        print(f"ppo_trl_side: needs trl {TRL_VERSION} first on PYTHONPATH, found {trl.__version__} at {trl.__file__}",
              file=sys.stderr)
        return 3
    torch.manual_seed(int(job.get("seed", 0)))
    out = run_check(job) if job["mode"] == "check" else run_timed(job)
    out.update(trl_version=trl.__version__, trl_file=trl.__file__, rlhf_lab_imported="rlhf_lab" in sys.modules)
    Path(job["out"]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
