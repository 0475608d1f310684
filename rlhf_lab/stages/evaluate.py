"""A job's evaluations: the fixed held-out prompts (world or external data), the policy's metrics on them, the
start-of-run evaluation kept in the cache for every job that would compute the same one, and the job summary's
gold lines."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlhf_lab.world import streams as D
from rlhf_lab.config import world as W
from rlhf_lab.evaluation import summary as S
from rlhf_lab.runs import active_run
from rlhf_lab.runs.cache import announce_reuse, write_json_atomic
from rlhf_lab.data.errors import data_errors
from rlhf_lab.runs.code import cpu_capability
from rlhf_lab.runs.identity import source_digest  # the code's digest, part of the start evaluation's key
from rlhf_lab.config.keys import computed_plain, to_plain
from rlhf_lab.config.errors import ConfigError
from rlhf_lab.config.schema import GenerationConfig, settings
from rlhf_lab.stages.pipeline import cache_for, upstream_run


OOD_NAMES = {"gold_reward": "gold_reward_ood", "gold_reward_se": "gold_reward_ood_se",
             "formula_gold_reward": "formula_gold_reward_ood", "formula_gold_reward_se": "formula_gold_reward_ood_se",
             "proxy_reward": "proxy_reward_ood", "proxy_reward_se": "proxy_reward_ood_se", "n_prompts": "n_prompts_ood"}


def world_gold(cfg: DictConfig):
    """The world's formula as a scorer (:class:`rlhf_lab.evaluation.policy.GoldScorer`) with ``data=world``; None with
    external data. The job's gold (the formula or a gold RM, config group ``gold``) is
    :func:`rlhf_lab.stages.gold.load_gold`."""
    from rlhf_lab.evaluation.policy import GoldScorer

    return GoldScorer(W.gold_weights(cfg)) if cfg.data.source == "world" else None


def evaluation_prompts(cfg: DictConfig, split: str) -> list[str]:
    """The fixed prompts of an evaluation split. World data: :func:`rlhf_lab.world.streams.eval_prompts`. External data
    (``data=jsonl|hf``): the first ``eval.n_prompts`` of the dataset's eval-split prompts, or the first
    ``eval.n_test_prompts`` of its test-split ones (all of them when it has fewer;
    :func:`rlhf_lab.data.preferences.external_prompts`: split by prompt, never a training prompt, eval and test
    disjoint), no ``ood``."""
    if cfg.data.source == "world":
        return D.eval_prompts(W.world_settings(cfg), split, W.eval_size(cfg, split))
    from rlhf_lab.config import data as DS
    from rlhf_lab.data.preferences import external_prompts

    if split == "ood":
        return []
    with data_errors():
        _, eval_prompts, test_prompts = external_prompts(DS.external_data(cfg))
    n = W.eval_size(cfg, split)
    return (eval_prompts if split == "eval" else test_prompts)[:n]


def evaluate(cfg: DictConfig, policy, tok, reference=None, scorer=None, split: str = "eval", gold=None,
             ood: bool = True, heldout=None):
    """Metrics and a samples table of `policy` on fixed evaluation prompts, each list sampled under its own fixed
    seed (common random numbers across evaluations and runs). `gold`: the job's
    (:func:`rlhf_lab.stages.gold.load_gold`); None, the world's formula (upstream pretrain and SFT runs). `heldout`:
    the held-out RM (:mod:`rlhf_lab.stages.heldout`) or None.

    ``split="eval"``: ``eval/*`` on ``eval.n_prompts`` eval-split prompts, with the SEs and the halves A/B.
    ``split="test"``: ``test/*`` on ``eval.n_test_prompts`` test-split prompts, plus, with `ood`, the OOD slice
    (``eval/gold_reward_ood`` and the proxy's, rewards only) on ``eval.n_ood_prompts`` prompts."""
    from rlhf_lab.evaluation.policy import Gold, evaluate_policy

    e = cfg.eval
    g = gold if gold is not None else Gold(world_gold(cfg))
    kw = dict(gen=settings(cfg.generation, GenerationConfig), gold=g.scorer, formula_gold=g.formula, scorer=scorer,
              batch_size=int(e.batch_size), samples_per_prompt=int(e.samples_per_prompt), heldout=heldout)
    seed = lambda s: D.stream_seed(cfg.world.seed, f"{s}/sampling")  # noqa: E731
    if split == "eval":
        return evaluate_policy(policy, tok, evaluation_prompts(cfg, "eval"), reference=reference,
                               n_rows=e.n_samples_logged, prefix="eval/", halves=True, seed=seed("eval"), **kw)
    if split != "test":
        raise ValueError(f"evaluate(split={split!r}): choose eval or test")
    metrics, rows = evaluate_policy(policy, tok, evaluation_prompts(cfg, "test"), reference=reference,
                                    n_rows=e.n_samples_logged, prefix="test/", seed=seed("test"), **kw)
    if e.get("probe_path") and scorer is not None and g.scorer is not None:
        metrics.update(probe_agreement(cfg, policy, kw))
    ood_prompts = evaluation_prompts(cfg, "ood") if ood and int(e.n_ood_prompts) > 0 else []
    if ood_prompts:
        ood, _ = evaluate_policy(policy, tok, ood_prompts, prefix="", seed=seed("ood"),
                                 details=False, **{**kw, "heldout": None})
        metrics.update({f"eval/{OOD_NAMES[k]}": v for k, v in ood.items() if k in OOD_NAMES})
    return metrics, rows


def probe_agreement(cfg: DictConfig, policy, kw: dict) -> dict[str, float]:
    """``probe/proxy_gold_agreement`` (and ``_se``): the proxy RM's accuracy against gold on pairs of a fixed probe
    policy's samples (``eval.probe_path``; two samples per eval-split prompt under a seed of their own), so that every
    RM of a study is measured on the same text, whatever policy each one's job optimises (the RM and the probe are
    fixed within a job: the start's and the end's figures are equal). `kw`: :func:`evaluate`'s sampling settings, with
    the job's proxy scorer and gold."""
    from rlhf_lab.evaluation.policy import evaluate_policy
    from rlhf_lab.models import families as F

    path = str(cfg.eval.probe_path)
    tok = F.load_tokenizer(path, "eval.probe_path")
    probe = F.load_causal_lm(path, tok, "eval.probe_path", **F.load_options(cfg.policy)).eval()
    probe.to(next(policy.parameters()).device)
    args = {**kw, "samples_per_prompt": max(2, int(kw["samples_per_prompt"])), "formula_gold": None, "heldout": None}
    m, _ = evaluate_policy(probe, tok, evaluation_prompts(cfg, "eval"), prefix="probe/", details=False,
                           seed=D.stream_seed(cfg.world.seed, "probe/sampling"), **args)
    return {k: v for k, v in m.items() if k.startswith("probe/proxy_gold_agreement")}


# The config keys that cannot change a policy job's evaluations at its start, where the policy is still the SFT
# policy: its seed (every evaluation samples with the world's own seeds), the KL controller, when later evaluations
# run, and the settings of the rollouts and updates. Every other key (and the code) is part of the start's key.
START_EVAL_IGNORES = (
    "seed", "kl", "generation.dtype", "trainer.max_steps", "eval.every_n_steps", "eval.schedule", "eval.n_points",
    "eval.sqrt_kl_spacing", "eval.test_each_eval", "eval.save_checkpoints", "algo.steps",
    "algo.batch_size", "algo.samples_per_prompt", "algo.ppo_epochs", "algo.num_minibatches", "algo.lr",
    "algo.critic_lr", "algo.clip_eps", "algo.clip_eps_high", "algo.loss_agg", "algo.value_clip_eps", "algo.vf_coef",
    "algo.entropy_coef", "algo.gamma", "algo.lam", "algo.whiten_advantages", "algo.max_grad_norm", "algo.packing",
    "algo.shared_prompt", "algo.trim_minibatches", "algo.compile", "algo.kl_estimator", "algo.kl_in", "algo.baseline",
    "algo.advantage_scale",
    "algo.length_penalty", "algo.missing_eos_penalty", "algo.reward_clip", "algo.checkpoint_every",
    "algo.max_kl", "algo.min_entropy", "algo.max_approxkl",
    "algo.max_entropy_ratio",
    "algo.reference.sync_every")


START_EVAL_FILE = "start_evaluation.json"


def start_evaluation(cfg: DictConfig, stage: str, spec: dict):
    """For ``eval.reuse_start``: the policy job's evaluations at its start (of the SFT policy), kept in the artifact
    cache (``start_eval/``) and reused by every job that would compute the same ones, whatever its seed, β or update
    settings (:data:`START_EVAL_IGNORES`). Reused, they are the computed ones to the last digit: the evaluations
    sample under their own seeds, outside the training's random stream. Returns `(split, compute) -> (metrics, rows)`
    for :class:`rlhf_lab.evaluation.callbacks.PeriodicEval`, or None (``eval.reuse_start=false``)."""
    if not cfg.eval.get("reuse_start", False):
        return None
    config = computed_plain(to_plain(cfg), START_EVAL_IGNORES)
    base = {"job": stage, "sft": str(spec["sft"]), "reference": spec.get("reference"), "config": config,
            "code": source_digest(), "cpu_capability": cpu_capability()}
    cache = cache_for(cfg)

    def start(split: str, compute):
        done: list = []

        def build(tmp: Path):
            done.append(compute())
            write_json_atomic(tmp / START_EVAL_FILE, {"metrics": done[0][0], "rows": done[0][1]})
            return {"split": split}

        try:
            path, built = cache.get_or_build("start_eval", {**base, "split": split}, build)
        except OSError as err:  # a read-only or full cache: the job computes its own, as with reuse_start=false
            print(f"[rlhf-lab] {stage}: could not keep the start-of-run evaluation in the cache ({err}); computed "
                  "by this job (eval.reuse_start=false silences this)", flush=True)
            return done[0] if done else compute()
        if not built:
            announce_reuse(stage, f"start-of-run evaluation ({split}/*) of the SFT policy", path)
        active_run.set_tag(f"rlhf_lab.start_eval.{split}", str(path))
        data = json.loads((path / START_EVAL_FILE).read_text())
        return data["metrics"], data["rows"]

    return start


def gold_summary(first: dict, last: dict, start: str, end: str) -> dict[str, str]:
    """The job summary's ``test gold`` line: test-split gold (± its SE) at the start and at the end of the job, with
    the n of test prompts it stands on (one prompt: no ± but ``no spread``); nothing where the run has no gold
    (external data without a gold RM)."""
    if "test/gold_reward" not in (last or {}):
        return {}
    n = S.metric_n(last, "test/")
    one = n is not None and n < 2

    def fmt(m: dict) -> str:
        return S.figure(m.get("test/gold_reward", float("nan")), None if one else m.get("test/gold_reward_se"))

    note = S.spread_note(n, "test prompt", unknown="test prompts")
    return {"test gold": f"{fmt(first)} -> {fmt(last)} ({start} -> {end}; {note}{'' if one else ', ± SE'})"}


def held_out_summary(ev) -> dict[str, str]:
    """The job summary's gold on the eval prompts (first -> last evaluation, the last one's SE) and on the held-out
    products (start -> end of the job, ± SE), where they were logged, each with its n."""
    out = {}
    g0, g1 = ev.first.get("eval/gold_reward", float("nan")), ev.last.get("eval/gold_reward")
    if g1 is not None:
        n = S.metric_n(ev.last, "eval/")
        se = ev.last.get("eval/gold_reward_se")
        spread = f"SE {se:.3f}" if S.finite(se) and (n is None or n > 1) else "no spread"
        out["eval gold"] = (f"{g0:.3f} -> {g1:.3f} (eval prompts, {spread}"
                            + (f", {S.n_text(n, 'eval prompt')})" if n is not None else ")"))
    t0, t1 = ev.test_first, ev.test_last
    if "eval/gold_reward_ood" in t1:
        n = int(t1["eval/n_prompts_ood"]) if S.finite(t1.get("eval/n_prompts_ood")) else None
        one = n is not None and n < 2
        a, b = (S.figure(m["eval/gold_reward_ood"], None if one else m.get("eval/gold_reward_ood_se"))
                for m in (t0, t1))
        out["ood gold"] = (f"{a} -> {b} (held-out products"
                           + (f", {S.spread_note(n, 'prompt')})" if n is not None else ")"))
    return out


CHECKPOINTS = "checkpoints"  # eval.save_checkpoints: <the job's artifact folder>/checkpoints/step_NNNNNN


def policy_evaluations(cfg: DictConfig, spec: dict, policy, tok, out_dir, at_steps, stage: str | None = None,
                       reference=None, scorer=None, gold=None, extra=None, **kw):
    """A policy job's evaluations (:class:`rlhf_lab.evaluation.callbacks.PeriodicEval`): ``eval/*`` at `at_steps`, the
    start and the end (with `stage`, the start's kept in the cache: :func:`start_evaluation`), ``test/*`` at the start
    and the end, and what a ship study turns on, each off by default: ``eval.test_each_eval`` (``test/*`` at every
    evaluation), ``reward_model.heldout`` (``eval/heldout_reward``: the held-out RM of `spec`'s ``heldout_rm``,
    :mod:`rlhf_lab.stages.heldout`) and ``eval.save_checkpoints`` (the policy of every evaluation as a Hugging Face
    folder, ``<out_dir>/checkpoints/step_NNNNNN`` in the job's artifact folder `out_dir`, tagged
    ``rlhf_lab.checkpoints``). Called inside the job's run.
    `reference`: a model, or a function that returns it at each evaluation; `extra()`: metrics added to every
    ``eval/*`` evaluation (DPO's pair metrics); `kw`: PeriodicEval's `step_fn` and `after`."""
    from rlhf_lab.evaluation.callbacks import PeriodicEval
    from rlhf_lab.models.saving import save_policy, step_folder
    from rlhf_lab.models.sharding import shards
    from rlhf_lab.stages import heldout as H

    e = cfg.eval
    held = H.load_scorer(cfg, spec["heldout_rm"]) if spec.get("heldout_rm") else None
    if held is not None:
        active_run.set_tag("rlhf_lab.upstream.heldout_rm", upstream_run(cfg, spec["heldout_rm"]))
    save = None
    if e.get("save_checkpoints"):
        if shards(OmegaConf.select(cfg, "trainer.strategy._target_")):
            raise ConfigError("eval.save_checkpoints", True, "false with trainer=fsdp / fsdp_cpu (a sharded policy "
                              "is whole only at the end); use trainer=ddp / ddp_cpu")
        root = Path(out_dir).resolve() / CHECKPOINTS
        active_run.set_tag("rlhf_lab.checkpoints", str(root))
        save = lambda step: str(save_policy(policy, tok, step_folder(root, step)))  # noqa: E731

    def run(split: str):
        if held is not None:
            held.to(next(policy.parameters()).device)  # where the policy samples (the trainer moved it)
        ref = reference() if inspect.isfunction(reference) else reference
        metrics, rows = evaluate(cfg, policy, tok, reference=ref, scorer=scorer, split=split, gold=gold, heldout=held)
        if extra is not None and split == "eval":
            metrics.update(extra())
        return metrics, rows

    return PeriodicEval(lambda: run("eval"), at_steps=at_steps, at_start=True, test=lambda: run("test"),
                        start=start_evaluation(cfg, stage, spec) if stage else None,
                        test_each_eval=bool(e.get("test_each_eval")), save=save, **kw)


def checkpoints_summary(ev) -> dict[str, str]:
    """The job summary's ``checkpoints`` line (``eval.save_checkpoints``): how many policies were saved, where, at which
    steps; nothing without them."""
    if not ev.saved:
        return {}
    steps = sorted(ev.saved)
    root = Path(ev.saved[steps[0]]).parent
    return {"checkpoints": f"{len(steps)} policies, one per evaluation (steps {steps[0]} to {steps[-1]}): "
                           f"{root}/step_NNNNNN"}


SHIP = "ship"  # the checkpoint the ship rule ships: <the job's artifact folder>/ship


def ship_callback(cfg: DictConfig, policy, tok, out_dir, proxy, step_fn):
    """A PPO/GRPO/RLOO job's :class:`~rlhf_lab.evaluation.callbacks.ShipCheckpoint`: the ship rule's choice at each
    evaluation, its checkpoint kept as one Hugging Face folder, ``<out_dir>/ship`` (replaced by each better one,
    written beside it and renamed), which ``from_pretrained`` loads; not saved with ``trainer=fsdp*``, where the
    policy is whole only at the end. `proxy()`: the training step's ``objective/scores``. Called inside the run."""
    from rlhf_lab.evaluation.callbacks import ShipCheckpoint
    from rlhf_lab.evaluation.ship_choice import RULE
    from rlhf_lab.models.saving import save_policy
    from rlhf_lab.models.sharding import shards

    active_run.set_tag("rlhf_lab.ship.rule", RULE)
    save = None
    if not shards(OmegaConf.select(cfg, "trainer.strategy._target_")):
        folder = Path(out_dir).resolve() / SHIP
        save = lambda: str(save_policy(policy, tok, folder))  # noqa: E731
    return ShipCheckpoint(proxy, step_fn, save)


def ship_summary(ship, ev) -> dict[str, str]:
    """The job summary's ``ship`` line (:func:`rlhf_lab.evaluation.ship_choice.ship_line`) of `ship`, a
    :class:`~rlhf_lab.evaluation.callbacks.ShipCheckpoint`, beside `ev`'s gold (a :class:`PeriodicEval`); where every
    evaluation was also tested (``eval.test_each_eval``) with a gold, logs ``ship/gold_regret`` on the test prompts.
    The run carries the line as its tag ``rlhf_lab.ship``."""
    from rlhf_lab.evaluation.ship_choice import gold_regret, ship_line

    step = ship.choice.step
    regret = gold_regret(dict(ev.curve), ev.test_curve, step) if step is not None else None
    if regret is not None:
        active_run.log_metrics({"ship/gold_regret": regret}, step=step)
    line = ship_line(ship.choice, ship.path, ev.curve, S.metric_n(ev.last, "eval/"), regret,
                     S.metric_n(ev.test_last, "test/"))
    active_run.set_tag("rlhf_lab.ship", line)
    return {"ship": line}
