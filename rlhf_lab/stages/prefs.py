"""Stage ``prefs``: preference pairs sampled from the SFT policy and labelled by the world's labeler.

Two responses per prompt (``data.n_train`` train-split prompts, ``data.n_eval`` eval-split ones), optionally with a
fraction of the training pairs from other checkpoints (``data.on_policy_path``, ``data.on_policy_fraction``,
``data.on_policy_pairing``), a fraction pairing an SFT response with a degenerate variant of itself
(``data.degenerate_fraction``) and SFT pairs at several temperatures (``data.sft_temperatures``): the coverage a gold
RM needs. Each pair records both responses' gold rewards (the formula's or a gold RM's), on which the labeler adds its
biases. One cached artifact (``train.jsonl``, ``eval.jsonl``) shared by every RM and DPO job that needs it. External
pairs (``data=jsonl|hf``) are no stage: :func:`load` reads them.

The held-out RM's pairs (:mod:`rlhf_lab.stages.heldout` marks its config ``data.heldout``) are the same recipe on
train-split prompts of a stream of their own (:data:`HELDOUT_STREAM`), none a prompt of the proxy's pairs, with seeds
offset by :data:`HELDOUT_SEED`; their eval pairs are the proxy's.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

from omegaconf import DictConfig

from rlhf_lab.world import streams as D
from rlhf_lab.config import world as W
from rlhf_lab.config.schema import GenerationConfig, settings
from rlhf_lab.models import families as F
from rlhf_lab.runs import active_run, tracking
from rlhf_lab.runs.distributed import work_device
from rlhf_lab.data.degenerate import KINDS as DEGENERATE_KINDS, Variants
from rlhf_lab.data.errors import data_errors
from rlhf_lab.config import data as DS
from rlhf_lab.config.checks import check_pairs
from rlhf_lab.config.choices import OnPolicyPairing
from rlhf_lab.data.preferences import (
    Checkpoint,
    PreferencePair,
    load_external,
    load_pairs,
    relabel_pairs,
    sample_pairs,
    save_pairs,
    validate_pairs,
)
from rlhf_lab.runs.progress import work_bar
from rlhf_lab.config.keys import to_plain
from rlhf_lab.stages import gold as G
from rlhf_lab.stages.pipeline import run_settings, ensure, generation_spec, upstream_run

WHAT = "preference pairs"
HELDOUT_STREAM = "prefs_heldout"  # the held-out RM's training prompts (none of the "prefs" stream's)
HELDOUT_SEED = 1000  # added to data.seed for the held-out RM's training pairs (its eval pairs are the proxy's)


def spec(cfg: DictConfig) -> dict:
    dc = cfg.data
    s = {
        "sft": str(ensure("sft", cfg)), "world": W.world_generation_spec(cfg), "gold": to_plain(cfg.world.gold),
        "labeler": to_plain(cfg.labeler), "generation": generation_spec(cfg), "n_train": dc.n_train,
        "n_eval": dc.n_eval, "seed": dc.seed,
        "on_policy_path": on_policy_paths(dc.get("on_policy_path")),
        "on_policy_fraction": float(dc.get("on_policy_fraction") or 0.0),
    }
    if s["on_policy_fraction"] == 0.0:  # no pair comes from it: a path set for other jobs changes nothing here
        s["on_policy_path"] = None
    elif dc.get("on_policy_pairing", OnPolicyPairing.self) != OnPolicyPairing.self:  # in the spec only when used
        s["on_policy_pairing"] = str(dc.on_policy_pairing)
    # the gold recipe's coverage (issue 43), in the spec only when used: every key computed before stays valid
    if float(dc.get("degenerate_fraction") or 0.0) > 0:  # with the kinds: a new kind is new pairs, never stale ones
        s["degenerate_fraction"], s["degenerate_kinds"] = float(dc.degenerate_fraction), list(DEGENERATE_KINDS)
    if dc.get("sft_temperatures"):
        s["sft_temperatures"] = [float(t) for t in dc.sft_temperatures]
    if G.is_rm(cfg):  # the gold RM labels the pairs (none added for the formula: earlier keys stay valid)
        s["gold_rm"] = G.identity(cfg)
    if dc.get("heldout"):  # the held-out RM's pairs (stages/heldout.py): in the spec only then
        s["heldout"] = HELDOUT_STREAM
    check_pairs(dc, "data", cfg.generation.get("temperature"))  # the CLI checked them; a caller of the API may not
    return s


def on_policy_paths(value) -> str | list[str] | None:
    """``data.on_policy_path`` as the pairs' spec holds it: one folder as its text (the keys made before lists were
    allowed stay valid), several as a list of texts, none as None."""
    if not value:
        return None
    if isinstance(value, str):
        return value
    paths = [str(v) for v in value]
    return paths[0] if len(paths) == 1 else paths


def on_policy_parts(spec: dict, prompts: list[str]) -> list[tuple[str, list[str], int]]:
    """(checkpoint folder, prompts, seed) of each part of the on-policy pairs: the prompts split evenly over the
    folders of ``data.on_policy_path`` in order, part i sampled with seed ``data.seed + 1 + 100 * i``."""
    path = spec["on_policy_path"]
    paths = [path] if isinstance(path, str) else list(path or [])
    parts = even_split(prompts, len(paths))
    return [(p, chunk, spec["seed"] + 1 + 100 * i) for i, (p, chunk) in enumerate(zip(paths, parts))]


def even_split(items: list[str], n: int) -> list[list[str]]:
    """`items` in `n` consecutive parts whose sizes differ by at most one (none for n = 0)."""
    return [items[i * len(items) // n : (i + 1) * len(items) // n] for i in range(n)]


def sft_parts(spec: dict, gen: GenerationConfig,
              prompts: list[str]) -> list[tuple[GenerationConfig, list[str], int, str]]:
    """(generation settings, prompts, seed, source) of each part of the SFT pairs: one part at the ``generation``
    temperature (seed ``data.seed``), or, with ``data.sft_temperatures``, the prompts split evenly over those
    temperatures in order (part i with seed ``data.seed + 10 * i``). A part at another temperature than
    ``generation.temperature`` is recorded as source ``sft@<t>``, so that the RM is normalised on the SFT samples
    the policy starts from only (:func:`rlhf_lab.algorithms.rm.normalization_set`)."""
    temps = spec.get("sft_temperatures")
    if not temps:
        return [(gen, prompts, spec["seed"], "sft")]
    parts = []
    for i, (t, chunk) in enumerate(zip(temps, even_split(prompts, len(temps)))):
        same = t == float(gen.temperature)
        parts.append((gen if same else replace(gen, temperature=t), chunk, spec["seed"] + 10 * i,
                      "sft" if same else f"sft@{t:g}"))
    return parts


def build(cfg: DictConfig, out_dir: Path, spec: dict) -> dict:
    params = {"stage": "prefs", "data": to_plain(cfg.data), "labeler": to_plain(cfg.labeler),
              "generation": to_plain(cfg.generation), "world": to_plain(cfg.world), "sft": spec["sft"],
              "gold": to_plain(cfg.get("gold"))}
    tags = {"rlhf_lab.upstream.sft": upstream_run(cfg, spec["sft"])}
    gold = G.label_scorer(cfg)  # None: the formula
    if gold is not None:
        params["gold_rm"] = str(G.rm_path(cfg))
        tags["rlhf_lab.upstream.gold_rm"] = upstream_run(cfg, G.rm_path(cfg))
    with tracking.start_run(run_settings(cfg), "prefs", params=params, tags=tags) as run:
        n_on = int(round(spec["n_train"] * spec["on_policy_fraction"]))
        n_deg = int(round(spec["n_train"] * spec.get("degenerate_fraction", 0.0)))
        train_prompts = D.prompts(W.world_settings(cfg), "prefs", spec["n_train"], split="train")
        held_prompts = D.prompts(W.world_settings(cfg), "prefs_eval", spec["n_eval"], split="eval")
        held_seed = spec["seed"] + 2
        if spec.get("heldout"):  # the held-out RM's: other prompts, other seeds, the same eval pairs
            train_prompts = D.prompts_outside(W.world_settings(cfg), spec["heldout"], len(train_prompts),
                                              set(train_prompts))
            spec = {**spec, "seed": spec["seed"] + HELDOUT_SEED}
        seed = spec["seed"]
        labelling, gen = DS.labelling(cfg), settings(cfg.generation, GenerationConfig)  # typed
        options = F.load_options(cfg.policy)
        dev = work_device(to_plain(cfg.trainer))  # trainer=gpu: the policy samples on the GPU
        if gold is not None:
            gold.to(dev)
        with work_bar("prefs", len(train_prompts) + len(held_prompts), "pair", bool(cfg.trainer.progress_bar)) as bar:
            train = []
            for g, chunk, s, src in sft_parts(spec, gen, train_prompts[n_on + n_deg:]):
                train += sample_pairs(labelling, g, options, spec["sft"], chunk, s, src, gold=gold, progress=bar,
                                      device=dev)
            sft_second = (Checkpoint(spec["sft"], options, gen, "policy.name_or_path", dev)
                          if n_on and spec.get("on_policy_pairing") == OnPolicyPairing.sft else None)
            for path, chunk, s in on_policy_parts(spec, train_prompts[:n_on]):  # against an SFT sample, or its own
                train += sample_pairs(labelling, gen, options, path, chunk, s, "on_policy", gold=gold, progress=bar,
                                      key="data.on_policy_path", device=dev, second=sft_second)
            if n_deg:  # an SFT response against a degenerate variant of itself (rlhf_lab.data.degenerate)
                train += sample_pairs(labelling, gen, options, spec["sft"], train_prompts[n_on : n_on + n_deg],
                                      seed + 3, "degenerate", gold=gold, progress=bar, device=dev,
                                      second=Variants(seed, gen.max_new_tokens))
            held = sample_pairs(labelling, gen, options, spec["sft"], held_prompts, held_seed, "sft", gold=gold,
                                progress=bar, device=dev)
        validate_pairs(train, "data")
        save_pairs(train, Path(out_dir) / "train.jsonl")
        save_pairs(held, Path(out_dir) / "eval.jsonl")
        agree = [p.gold_agrees for p in train]
        stats = {"prefs/n_train": len(train), "prefs/n_eval": len(held),
                 "prefs/label_gold_agreement": sum(agree) / len(agree)}
        if n_deg:
            stats["prefs/n_degenerate"] = sum(p.source == "degenerate" for p in train)
        if gold is not None:  # how often the gold RM orders a pair as the world's formula does
            stats["prefs/gold_formula_agreement"] = gold_formula_agreement(cfg, train)
        active_run.log_metrics(stats, step=0)
        return {"run_id": run.info.run_id, "stage": "prefs", "n_train": len(train), "n_eval": len(held),
                "label_gold_agreement": stats["prefs/label_gold_agreement"]}


def gold_formula_agreement(cfg: DictConfig, pairs: list[PreferencePair]) -> float:
    """Over the pairs whose two responses differ in the formula, the fraction whose recorded (gold RM) rewards
    order them as the formula does (a tie of the gold RM counts ½)."""
    from rlhf_lab.world import gold_reward

    w = W.gold_weights(cfg)
    wins = []
    for p in pairs:
        fc, fr = gold_reward(p.prompt, p.chosen, p.chosen_ended, w), gold_reward(p.prompt, p.rejected, p.rejected_ended, w)
        if fc != fr:
            d = (p.gold_chosen - p.gold_rejected) * (1.0 if fc > fr else -1.0)
            wins.append(1.0 if d > 0 else 0.5 if d == 0 else 0.0)
    return sum(wins) / len(wins) if wins else float("nan")


def load(cfg: DictConfig) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(train, eval) preference pairs for the configured `data` source; world pairs come from the cache. External
    pairs with a gold RM (``gold=rm``) are labelled again by the labeler on its scores (seeds ``data.seed`` and
    ``data.seed + 2``, as the world's train and held-out pairs) and carry its gold rewards."""
    if cfg.data.source != "world":
        with data_errors():  # one line naming file and line, exit 2 (the CLI); no run has started yet
            train, held = load_external(DS.external_data(cfg))
        gold = G.label_scorer(cfg)
        if gold is None:
            return train, held
        seed = int(cfg.data.get("seed", 0))
        return (relabel_pairs(DS.labelling(cfg), train, gold, random.Random(seed)),
                relabel_pairs(DS.labelling(cfg), held, gold, random.Random(seed + 2)))
    path = ensure("prefs", cfg)
    return load_pairs(path / "train.jsonl"), load_pairs(path / "eval.jsonl")
