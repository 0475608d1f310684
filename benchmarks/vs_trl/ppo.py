"""PPO step time, ours (``PPOModule`` in a Lightning Trainer, as the ``ppo`` stage runs it) against TRL 1.9.2's
``PPOTrainer`` (``trl.experimental.ppo``: TRL ≥ 1.16 has no PPO), and first-step agreement of the two on the same
rollout. TRL 1.9.2 runs in its own process (:mod:`benchmarks.vs_trl.ppo_side`, which never imports ``rlhf_lab``), from
a folder it is installed into once (``pip install --no-deps --target``); the parent writes what both sides share and
the child returns its step-end times, phase times and first-step quantities as JSON.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest.mock import patch

import torch
from omegaconf import DictConfig

from benchmarks import common as C
from benchmarks.common import Section, StepClock, WorldModel, load_tokenizer, table, with_rest

NOTE = ("Matched as benchmarks/README.md lists (`ppo_trl`; `trl_settings` maps our config and refuses a setting TRL's "
        "PPO has no equivalent of): policy, reference, reward model and value head weights; the prompts in order; batch "
        "64, 4 PPO epochs × 4 minibatches; 32 response tokens with EOS and pad suppressed while sampling on both sides; "
        "temperature 1; γ, λ; β on the k1 KL in the reward; clip ranges, `vf_coef`; whitened advantages; one two-group "
        "AdamW clipping the joint gradient norm at 1.0; fp32, dropout off. Left: each side's sampler, scoring path, "
        "padding, statistics and loop (the table of differences by design below).")

TRL_VERSION = "1.9.2"
# the shape: Llama-style family a, hidden 128, 2 layers (the default preset a_small is hidden 64); 32 response
# tokens; a fixed β (TRL's kl_coef; the default adaptive controller moves β by < 1% per step at these sizes)
OVERRIDES = ["policy.arch.hidden=128", "policy.arch.layers=2", "generation.max_new_tokens=32", "kl=fixed"]
TARGET = 0.67  # ours ≤ 0.67 × TRL's step time
PHASE_KEYS = ("generation", "score", "forward")  # timed phases of a step; the rest of it is the update


class TRLUnavailable(RuntimeError):
    """TRL 1.9.2 could not be installed into its folder (the message is one line)."""


def config() -> DictConfig:
    return C.compose(OVERRIDES)


def ensure_trl() -> Path:
    """The folder holding TRL 1.9.2 (``$RLHF_LAB_BENCH_CACHE``, default ``~/.cache/rlhf_lab_bench``, then
    ``trl-1.9.2``; ``pip install --no-deps --target``, once, into a temporary folder renamed into place);
    :class:`TRLUnavailable` with pip's last line when pip fails."""
    root = os.environ.get("RLHF_LAB_BENCH_CACHE") or Path.home() / ".cache" / "rlhf_lab_bench"
    d = Path(root).expanduser() / f"trl-{TRL_VERSION}"
    if (d / "trl" / "__init__.py").exists():
        return d
    d.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".trl-{TRL_VERSION}-", dir=d.parent))
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "--target",
           str(tmp), f"trl=={TRL_VERSION}"]
    print(f"[ppo_trl] installing trl=={TRL_VERSION} into {d}", flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0 or not (tmp / "trl" / "__init__.py").exists():
        shutil.rmtree(tmp, ignore_errors=True)
        last = ((p.stderr or p.stdout).strip().splitlines() or ["no output"])[-1]
        raise TRLUnavailable(f"ppo_trl: `pip install --no-deps --target {d} trl=={TRL_VERSION}` failed "
                             f"(exit {p.returncode}): {last}")
    try:
        os.replace(tmp, d)
    except OSError:  # another process installed it first
        shutil.rmtree(tmp, ignore_errors=True)
        if not (d / "trl" / "__init__.py").exists():
            raise
    return d


def run_trl(job: dict, work: Path, name: str) -> dict:
    """One run of :mod:`benchmarks.vs_trl.ppo_side` on `job` (written to `work`), TRL 1.9.2 first on PYTHONPATH."""
    path, out = work / f"{name}.json", work / f"{name}.out.json"
    path.write_text(json.dumps({**job, "out": str(out)}))
    threads = str(job["threads"])
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
           "PYTHONPATH": os.pathsep.join([str(ensure_trl()), *filter(None, [os.environ.get("PYTHONPATH")])])}
    p = subprocess.run([sys.executable, "-m", "benchmarks.vs_trl.ppo_side", str(path)], cwd=C.ROOT, env=env,
                       capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"the TRL {TRL_VERSION} side ({name}) failed with exit status {p.returncode}:\n"
                           + (p.stderr or p.stdout)[-4000:])
    res = json.loads(out.read_text())
    if res["trl_version"] != TRL_VERSION:
        raise RuntimeError(f"the TRL side ran trl {res['trl_version']} ({res['trl_file']}), not {TRL_VERSION}")
    return res


def trl_settings(cfg: DictConfig) -> dict:
    """Our PPO config as TRL 1.9.2 ``PPOConfig`` arguments (``config``) and the optimizer's settings (``optim``);
    ValueError for a setting TRL's PPO has no equivalent of."""
    a, g, kl = cfg.algo, cfg.generation, cfg.kl
    unmatched = {
        "critic": (str(a.critic), "policy"), "kl_in": (str(a.kl_in), "reward"), "kl": (str(kl.name), "fixed"),
        "whiten_advantages": (bool(a.whiten_advantages), True), "loss_agg": (str(a.loss_agg), "token_mean"),
        "entropy_coef": (float(a.entropy_coef), 0.0), "length_penalty": (float(a.length_penalty), 0.0),
        "missing_eos_penalty": (float(a.missing_eos_penalty), 0.0), "reward_clip": (a.get("reward_clip"), None),
        "clip_eps_high": (a.get("clip_eps_high"), None), "samples_per_prompt": (int(a.samples_per_prompt), 1),
        "lora.r": (int(a.lora.r), 0), "reference.kind": (str(a.reference.kind), "copy"),
        "reference.path": (a.reference.get("path"), None), "reference.sync_every": (int(a.reference.sync_every), 0),
        "reward": (str(a.reward), "rm"), "generation.top_k": (int(g.top_k or 0), 0),
        "generation.top_p": (float(g.top_p), 1.0),
    }
    bad = {k: v for k, (v, want) in unmatched.items() if v != want}
    if bad or str(a.kl_estimator) not in ("k1", "k3") or float(g.temperature) <= 0:
        raise ValueError(f"the ppo_trl benchmark compares settings TRL 1.9.2's PPOTrainer has too; not these: {bad}, "
                         f"kl_estimator={a.kl_estimator}, temperature={g.temperature}")
    B = int(a.batch_size)
    config = dict(
        per_device_train_batch_size=B, gradient_accumulation_steps=1, num_mini_batches=int(a.num_minibatches),
        num_ppo_epochs=int(a.ppo_epochs), local_rollout_forward_batch_size=B, response_length=int(g.max_new_tokens),
        temperature=float(g.temperature), stop_token=None, stop_token_id=None, missing_eos_penalty=None,
        num_sample_generations=0, kl_coef=float(kl.beta), kl_estimator=str(a.kl_estimator),
        cliprange=float(a.clip_eps), cliprange_value=float(a.value_clip_eps), vf_coef=float(a.vf_coef),
        gamma=float(a.gamma), lam=float(a.lam), whiten_rewards=False, learning_rate=float(a.lr),
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_epsilon=1e-5,
        max_grad_norm=float(a.max_grad_norm or 0.0), bf16=False, fp16=False, gradient_checkpointing=False,
        use_cpu=True, seed=0, report_to="none", save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        logging_steps=1,
    )
    optim = dict(policy_lr=float(a.lr), value_lr=float(a.critic_lr), eps=1e-5, weight_decay=0.0,
                 max_grad_norm=a.get("max_grad_norm"))
    return {"config": config, "optim": optim}


def shared_job(cfg: DictConfig, wm: WorldModel, tok, steps: int, work: Path, threads: int) -> dict:
    """What both sides share, for the TRL side: the model folders (the value model written here: the policy's weights
    as a sequence classifier with a zero head), the prompts' ids (those our module draws at steps 0 … steps-1, in
    order, as ours tokenizes them, without the padding), the settings."""
    from rlhf_lab.models import families as Fm
    from rlhf_lab.models.sampling import encode_prompts

    value_dir = work / "value"
    if not value_dir.exists():
        value = Fm.load_sequence_scorer(wm.lm_dir, tok)
        with torch.no_grad():
            value.score.weight.zero_()
        value.save_pretrained(value_dir)
        tok.save_pretrained(value_dir)
    s, fn, rows = trl_settings(cfg), C.prompt_fn(cfg), []
    for step in range(steps):
        ids, mask = encode_prompts(tok, fn(step), cfg.generation.get("max_prompt_len"))
        rows += [i[m.bool()].tolist() for i, m in zip(ids, mask)]
    return {"lm_dir": str(wm.lm_dir), "ref_dir": str(wm.lm_dir), "rm_dir": str(wm.rm_dir), "value_dir": str(value_dir),
            "prompts": rows, "config": {**s["config"], "output_dir": str(work / "trl_out")},
            "optim": s["optim"], "suppress": suppressed(tok), "threads": int(threads), "seed": 0}


def suppressed(tok) -> list[int]:
    """The tokens whose logits are −inf while sampling, on both sides: EOS (every response runs to full length) and
    the pad token (TRL reads a sampled pad as the end of the response; ours keeps it as a token)."""
    return sorted({int(tok.eos_token_id), int(tok.pad_token_id)})


PHASES = [
    ("generation", "generation (ours: our KV-cache sampler, prompt tokenization, decoding; TRL: `batch_generation`, "
                   "`model.generate` with `output_scores`: its old log-probs)"),
    ("score", "reward model (ours: `RewardScorer` on the decoded text; TRL: `get_reward` on the ids)"),
    ("forward", "no-grad passes (ours: policy + critic (old log-probs, entropy, values) and reference; TRL: reference "
                "and value model)"),
    ("update", "the rest: 4 × 4 minibatch updates, advantages, metrics, logging"),
    ("step", "step"),
]


def first_step_agreement(cfg: DictConfig, wm: WorldModel, tok, job: dict, work: Path) -> dict:
    """Both sides' first PPO step on the same rollout, each through its own code (benchmarks/README.md, `ppo_trl`,
    "First-step agreement"): ours one real ``training_step``, recorded from outside; TRL one ``train`` step of
    ``PPOTrainer`` on that rollout (``ppo_side``, mode ``check``) with our permutations and scores."""
    from benchmarks.vs_trl.grpo import StepRecorder
    from rlhf_lab.algorithms import ppo
    from rlhf_lab.models.reward import encode_texts

    a = cfg.algo
    B = int(a.batch_size)
    module = C.ppo_module(cfg, wm, tok, reference_dir=wm.ref_dir)
    recorder = StepRecorder(module, B, (module.policy, module.critic))
    rec = recorder.rec
    rec.update(pg=[], vf=[])
    base_mb = module.minibatch_loss

    def minibatch_loss(*args, **kw):
        loss, st = base_mb(*args, **kw)
        rec["pg"].append(float(st["loss/policy"]))
        rec["vf"].append(float(st["loss/value"]))
        return loss, st

    module.minibatch_loss = minibatch_loss
    recorder.run(C.patched_sample(lambda model, tk, _p: C.suppress_tokens(model, *suppressed(tk))),
                 patch.object(ppo, "per_token_rewards", recorder.first_call("rewards", ppo.per_token_rewards)))
    ro, scores = rec["rollout"][2], rec["score"][2]
    (_shaped, kl_t, _mask, beta), _, rewards = rec["rewards"]
    (_qr, old_logp, ref_logp, old_values, advantages, returns, _beta), _, _ = rec["update"]
    mask = ro.response_mask
    query_responses = torch.cat([ro.query_ids, ro.response_ids], 1)
    rows = [i[m.bool()].tolist() for i, m in zip(ro.query_ids, ro.query_mask)]
    res = run_trl({**job, "mode": "check", "ref_dir": str(wm.ref_dir), "prompts": rows,
                   "query_responses": query_responses.tolist(), "perms": [p.tolist() for p in rec["perm"]],
                   "scores": scores.tolist()}, work, "check")

    def T(key: str) -> torch.Tensor:
        return torch.tensor(res[key], dtype=torch.float32)

    st, log = module.last_stats, res["log"]
    checked = [  # (label, ours, TRL): per-token tensors by their largest element-wise difference, scalars as they are
        ("old log-prob per token (TRL: from the logits `batch_generation` returns), mean", old_logp, T("logprobs")),
        ("reference log-prob per token, mean", ref_logp, T("ref_logprobs")),
        ("value per token (zero head: 0), mean", old_values, T("values")),
        ("KL k1 per token, log π_old − log π_ref, mean", kl_t, T("kl")),
        ("objective/kl: KL summed over the response, batch mean (each side's metric)", st["objective/kl"],
         log["objective/kl"]),
        ("objective/non_score_reward: −β·KL per response, batch mean (each side's metric)",
         st["objective/non_score_reward"], log["objective/non_score_reward"]),
        ("per-token reward −β·KL_t + score at the last token, mean", rewards, T("rewards")),
        ("advantage per token, GAE(1, 0.95) whitened, mean |A|", advantages, T("advantages")),
        ("return per token (value target), mean", returns, T("returns")),
        *[row for i in (1, 2) for row in (
            (f"policy loss, minibatch {i} ({'ratio 1' if i == 1 else 'after one AdamW step'})", rec["pg"][i - 1],
             res["pg_loss"][i - 1]),
            (f"value loss, minibatch {i}", rec["vf"][i - 1], res["vf_loss"][i - 1]),
            (f"gradient norm (policy + value) before clipping, minibatch {i}", rec["grad"][i - 1],
             res["grad_norm"][i - 1]))],
        ("policy loss, mean over the step's 16 minibatches (each side's metric; TRL `loss/policy_avg`)",
         st["loss/policy"], log["loss/policy_avg"]),
        ("value loss, mean over the 16 minibatches (TRL `loss/value_avg`)", st["loss/value"], log["loss/value_avg"]),
    ]
    # the score differs by design (ours re-encodes the decoded text): shown; checked on the responses whose text the
    # RM's tokenizer encodes back to the very ids TRL scores
    enc = encode_texts(module.scorer.tokenizer, ro.prompts, ro.responses, ro.ended, 10**6)
    sel = torch.tensor([e == q + r[: int(n)] for e, q, r, n in
                        zip(enc, rows, ro.response_ids.tolist(), mask.sum(1).tolist())])
    o, t = scores.float(), T("trl_scores")
    n, k = len(o), int(sel.sum())
    if k:
        checked.insert(0, (f"RM score, the {k} responses whose text encodes back to the same ids", o[sel], t[sel]))
    same = {
        "prompt ids (TRL's collated batch = our left-padded prompts)": bool(res["same_queries"]),
        "query + response ids": torch.equal(torch.tensor(res["query_responses"]), query_responses),
        "response masks (TRL: no padding)": torch.equal((~torch.tensor(res["padding_mask"])).long(), mask.long())
        and int(res["context_length"]) == ro.query_ids.shape[1],
    }
    table_rows, ok = C.agreement(checked, same, mask=mask)
    table_rows.insert(0, ["RM score, mean over all responses (TRL: on the token ids; ours: on the decoded text, "
                          "re-encoded)", float(o.mean()), float(t.mean()), float((o - t).abs().max()),
                          f"by design, not checked: {n - k} of {n} decoded texts encode to other ids (TRL gets our "
                          "scores)"])
    return {"rows": table_rows, "ok": ok, "beta": float(beta), "rlhf_lab_imported": res["rlhf_lab_imported"],
            "n_tokens": int(mask.sum(1)[0])}


def run(cfg: DictConfig, wm: WorldModel, work: Path, steps: int, warmup: int, rounds: int) -> Section:
    from benchmarks.vs_trl.grpo import run_ours

    cfg = config()  # the shape: hidden 128, 2 layers, 32 response tokens, fixed β
    sec = Section(f"PPO step time (ours vs TRL {TRL_VERSION} PPOTrainer)", NOTE)
    a, g = cfg.algo, cfg.generation
    trl_settings(cfg)  # fail before any work on a setting TRL has no equivalent of
    ensure_trl()
    work = Path(work) / "ppo_trl"
    wm = C.make_world_model(cfg, work / "world")
    tok = load_tokenizer(wm.lm_dir)
    B = int(a.batch_size)
    job = shared_job(cfg, wm, tok, steps, work, torch.get_num_threads())
    agree = first_step_agreement(cfg, wm, tok, job, work)
    runs, walls = itertools.count(), []
    names = {"generation": "time/rollout_s", "score": "time/score_s", "forward": "time/forward_s"}
    compiled_cfg = copy.deepcopy(cfg)
    compiled_cfg.algo.compile = True

    def run_side(side: str) -> StepClock:
        if side == "trl":
            res = run_trl({**job, "mode": "timed", "steps": steps}, work, f"timed_{next(runs)}")
            if len(res["stamps"]) != steps:
                raise RuntimeError(f"the TRL side ran {len(res['stamps'])} PPO steps, not {steps}")
            clock = StepClock(warmup, stamps=res["stamps"], threads=res["threads"])
            clock.phases = with_rest(res["phases"][warmup:], clock.step_times(), PHASE_KEYS)
            clock.rlhf_lab_imported = res["rlhf_lab_imported"]
            return clock
        t0 = time.perf_counter()  # the compile is paid in the first compiled run's first step (once per process)
        clock = run_ours(compiled_cfg if side == "ours_compiled" else cfg, wm, tok, steps, warmup, names, suppressed,
                         PHASE_KEYS)  # EOS and pad suppressed; phases: the module's time/* statistics
        walls.append((side, time.perf_counter() - t0))
        return clock

    clocks = C.alternate(rounds, run_side, ("ours", "ours_compiled", "trl"))
    o, oc, t = (C.rate(clocks[s], B) for s in ("ours", "ours_compiled", "trl"))
    ratio, ratio_c = o["step"] / t["step"], oc["step"] / t["step"]
    per_round = [1 / r for r in C.per_round(clocks["ours"], clocks["trl"])]
    med, phase_text = C.phase_table({k: clocks[k] for k in ("ours", "trl")}, PHASES)
    isolated = not any(c.rlhf_lab_imported for c in clocks["trl"]) and not agree["rlhf_lab_imported"]
    compiled_walls = [w for side, w in walls if side == "ours_compiled"]
    sec.tables.append(table(["side", "ms/step", "responses/s", "timed steps", "step time ratio ours/TRL"], [
        ["ours (PPOModule, algo=ppo, + Lightning)", o["ms"], o["rate"], o["n"], ratio],
        ["ours with `algo.compile=true` (opt-in: the trunks' packed passes through torch.compile)", oc["ms"], oc["rate"],
         oc["n"], ratio_c],
        [f"TRL {TRL_VERSION} PPOTrainer (own process)", t["ms"], t["rate"], t["n"], 1.0]]))
    sec.tables.append(phase_text)
    sec.tables.append(
        f"First step, same initial weights, the same {B} responses ({agree['n_tokens']} tokens each, sampled by ours "
        f"with EOS and pad suppressed), the same minibatch permutations; reference: other random weights (`lm_ref`) on "
        f"both sides, so the KL is not 0; β {agree['beta']:g}. Each side through its own code; TRL's RM score on the "
        f"ids is shown and then replaced by ours:\n\n" + C.agreement_table(agree["rows"]))
    met, met_c = ("met" if r <= TARGET else "NOT met" for r in (ratio, ratio_c))
    sec.findings += [
        f"a step = one rollout of {B} responses ({int(g.max_new_tokens)} tokens each, EOS and pad suppressed on both "
        f"sides) + scoring + {int(a.ppo_epochs)} × {int(a.num_minibatches)} AdamW steps; policy {wm.arch} "
        f"({wm.n_params:,} parameters), fp32; " + C.runs_line(steps, warmup, rounds, per_round, clocks)
        + f"; TRL side imported rlhf_lab: {'no' if isolated else 'YES'}",
        f"step time ours/TRL **{ratio:.2f}×** with the defaults (target ≤ {TARGET}×: {met})",
        f"with `algo.compile=true` (an option, off by default: its float noise makes another run): **{ratio_c:.2f}×** "
        f"(target ≤ {TARGET}×: {met_c}), {o['step'] / oc['step']:.2f}× faster than the defaults after the warm-up; the "
        f"compile is paid once per process, in the first run's first step: its {steps} steps took "
        f"{compiled_walls[0]:.0f} s, later runs {min(compiled_walls[1:] or [float('nan')]):.0f} s (the losses of the "
        f"compiled passes match the eager ones: tests/test_ppo_units.py)",
        f"generation is {100 * med['ours']['generation'] / med['ours']['step']:.0f}% of our step and "
        f"{100 * med['trl']['generation'] / med['trl']['step']:.0f}% of TRL's on the same shapes (ours: our KV-cache "
        f"sampler, TRL: `model.generate`)"]
    sec.summary = [f"PPO step, ours/TRL {TRL_VERSION} step time", f"{ratio:.2f}×; algo.compile=true {ratio_c:.2f}×",
                   f"{'loss agrees' if agree['ok'] else 'LOSS DIFFERS'}; target ≤ {TARGET}×: {met}; with "
                   f"algo.compile=true: {met_c}"]
    sec.ok, sec.data = agree["ok"], {"ratio": ratio, "ratio_compiled": ratio_c, "phases": med, "per_round": per_round}
    return sec
