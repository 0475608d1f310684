"""Stage ``rm``: a reward model trained on preference pairs (Bradley–Terry), normalised and evaluated.

The backbone (``reward_model`` config group) is the policy family's SFT or pretrained checkpoint
(``source: same``, the InstructGPT recipe) or the other family's (``source: different``), fully fine-tuned
or with LoRA adapters (``reward_model.lora.r > 0``, merged into the weights when saved). ``ensemble: k``
trains k members with seeds ``seed + 7919·i``. After training every member is normalised on SFT samples
and the held-out pairs are scored (:func:`rlhf_lab.algorithms.rm.evaluate_rm`). The artifact's layout
and the scorer: :mod:`rlhf_lab.models.reward`.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from rlhf_lab.runs import active_run, distributed, tracking
from rlhf_lab.runs.contents import absolute_if_local
from rlhf_lab.config.checks import check_reward_model
from rlhf_lab.data.external import DEFAULT_COLUMNS, columns_of
from rlhf_lab.algorithms.rm import (
    MEMBER_SEED_STRIDE,
    RewardModelModule,
    collate_rm_pairs,
    encode_rm_pairs,
    evaluate_rm,
    normalization_set,
    pair_margins,
)
from rlhf_lab.evaluation.summary import n_text
from rlhf_lab.models import families as F
from rlhf_lab.models.adapters import with_lora
from rlhf_lab.models.reward import HELDOUT_SPREAD, RewardScorer, packable
from rlhf_lab.data.preferences import validate_pairs
from rlhf_lab.config import world as W
from rlhf_lab.config.keys import to_plain
from rlhf_lab.stages import gold as G
from rlhf_lab.stages import prefs
from rlhf_lab.stages.pipeline import run_settings, cache_for, ensure, job_steps, stage_seed, upstream_run
from rlhf_lab.stages.training import fit, model_size

WHAT = "reward model"
# keys that act when the RM is used, not trained (heldout: a policy job also trains another RM, stages/heldout.py)
USE_TIME_KEYS = ("normalize", "conservative_lambda", "seed", "heldout")
LOADING_KEYS = ("dtype", "attn_implementation", "path")  # in the key only when set (null keeps older keys valid)
COMPUTE_KEYS = ("packing",)  # how the loss is computed, not what (the same to float noise): not in the key


def backbone_cfg(cfg: DictConfig) -> DictConfig:
    """The RM backbone as a model config (family, arch, vocab_size, name_or_path, dtype, attn_implementation),
    validated: the `policy` of the config that builds its base model and SFT, which the RM group's
    interpolations (``${policy.dtype}``, ...) then read."""
    rc = cfg.reward_model
    source = str(rc.source)
    if source == "pretrained":
        raise ValueError("reward_model.source=pretrained has no world backbone to build: see backbone_path")
    fam, pfam = str(rc.family), str(cfg.policy.family)
    if source == "same" and fam != pfam:
        raise ValueError(f"reward_model.source=same but reward_model.family={fam!r} differs from policy.family={pfam!r}; "
                         "use reward_model=different_source for an RM of another family")
    if source == "different" and fam == pfam:
        raise ValueError(f"reward_model.source=different but reward_model.family={fam!r} is the policy's family; "
                         "set reward_model.family to the other family")
    return OmegaConf.create({"family": fam, "vocab_size": rc.vocab_size, "arch": to_plain(rc.arch),
                             "name_or_path": rc.get("name_or_path"), "dtype": rc.get("dtype"),
                             "attn_implementation": rc.get("attn_implementation")})


def backbone_path(cfg: DictConfig):
    """The checkpoint the RM starts from: the backbone family's SFT or pretrained model (built if missing).

    With ``init: sft`` and the policy's own family and size this is the policy's SFT checkpoint (the
    InstructGPT recipe); another size or family gets its own SFT run on the same world data. With
    ``source: pretrained`` it is ``reward_model.name_or_path`` as it is (``minilm``: the installed MiniLM,
    :func:`rlhf_lab.models.families.pretrained_path`), with no world stage."""
    rc = cfg.reward_model
    if str(rc.source) == "pretrained":
        if not rc.get("name_or_path"):
            raise ValueError("reward_model.source=pretrained needs reward_model.name_or_path (a folder, a hub name "
                             "or minilm)")
        return absolute_if_local(F.pretrained_path(str(rc.name_or_path)))
    c = copy.deepcopy(cfg)
    with open_dict(c):
        c.policy = backbone_cfg(cfg)
    return ensure("pretrain" if str(rc.init) == "pretrain" else "sft", c)


def backbone_key(cfg: DictConfig, backbone) -> str:
    """The key the user set that names the RM's backbone, for the one-line errors of loading it:
    ``reward_model.name_or_path`` (``source: pretrained``, or a folder of its own), ``policy.name_or_path`` when the
    backbone is the user's policy folder itself (a same-source RM on the user's model: ``reward_model.name_or_path``
    is ``${policy.name_or_path}``), else ``reward_model backbone`` (a base or SFT model the lab built)."""
    rc = cfg.reward_model
    if str(rc.source) == "pretrained":
        return "reward_model.name_or_path"
    folder = rc.get("name_or_path")
    if not folder or Path(str(folder)).expanduser().resolve() != Path(str(backbone)).expanduser().resolve():
        return "reward_model backbone"
    return "policy.name_or_path" if folder == cfg.policy.get("name_or_path") else "reward_model.name_or_path"


def data_identity(cfg: DictConfig) -> dict:
    """What determines the preference pairs the RM trains on (part of the RM's cache key, which sees a local data
    file or folder and the policy whose chat template renders the rows by their content: ArtifactCache.keyed)."""
    dc = cfg.data
    if dc.source == "world":
        return {"source": "world", "prefs": str(cache_for(cfg).path("prefs", prefs.spec(cfg)))}
    ident = {"source": str(dc.source), "eval_fraction": float(dc.get("eval_fraction", 0.1)),
             "test_fraction": float(dc.get("test_fraction", 0.1)), "held_out": "by_prompt",
             "seed": int(dc.get("seed", 0))}
    cols = columns_of(dc)
    if dc.get("format", "auto") != "auto" or cols != DEFAULT_COLUMNS or dc.get("chat_template"):
        ident.update(format=str(dc.get("format", "auto")), columns=cols, chat_template=dc.get("chat_template"))
    if dc.source == "jsonl":
        p = Path(str(dc.path)).expanduser() if dc.get("path") else None
        ident.update(path=str(p.resolve()) if p else None)
    else:
        name = str(dc.get("name"))
        p = Path(name).expanduser()
        ident.update(name=str(p.resolve()) if p.exists() else name, split=str(dc.get("split", "train")))
    if cfg.policy.get("name_or_path"):  # conversational rows are rendered with the policy's chat template
        ident["template_of"] = str(absolute_if_local(str(cfg.policy.name_or_path)))
    if G.is_rm(cfg):  # the gold RM relabels the pairs through the labeler (prefs.load)
        ident.update(gold_rm=G.identity(cfg), labeler=to_plain(cfg.labeler))
    return ident


def spec(cfg: DictConfig) -> dict:
    rc = to_plain(cfg.reward_model)
    return {
        "backbone": str(backbone_path(cfg)), "data": data_identity(cfg),
        "reward_model": {k: v for k, v in rc.items()
                         if k not in USE_TIME_KEYS + COMPUTE_KEYS and not (k in LOADING_KEYS and v is None)},
        "seed": stage_seed(cfg, "rm", "reward_model"), "steps": job_steps(cfg, "rm", cfg.reward_model.steps),
    }


def rm_path(cfg: DictConfig):
    """The reward model the other stages use: ``reward_model.path`` (a trained RM artifact folder, e.g. the
    ``artifact`` folder of an ``algo=rm`` job, used as it is; checked as the CLI checks it, :func:`check_reward_model`)
    or the cached RM of this config (built if missing)."""
    check_reward_model(cfg.reward_model)
    given = cfg.reward_model.get("path")
    # absolute: a spec's key sees its content (runs.contents.local_path)
    return Path(str(given)).expanduser().absolute() if given else ensure("rm", cfg)


def load_scorer(cfg: DictConfig, path=None) -> RewardScorer:
    """The configured reward model (its artifact `path`, else built first when missing), as a scorer with
    its use-time settings."""
    rc = cfg.reward_model
    return RewardScorer.from_path(path or ensure("rm", cfg), normalize=rc.normalize,
                                  conservative_lambda=float(rc.get("conservative_lambda") or 0.0),
                                  options=F.load_options(rc), key="reward_model.path" if rc.get("path") else WHAT)


def build(cfg: DictConfig, out_dir: Path, spec: dict) -> dict:
    """Train the RM (all ensemble members) into out_dir as one MLflow run; returns metadata."""
    rc = cfg.reward_model
    check_reward_model(rc)  # also run by the CLI before anything loads
    out_dir = Path(out_dir)
    train, held = prefs.load(cfg)
    validate_pairs(train, "data")
    backbone, steps, seed = spec["backbone"], int(spec["steps"]), int(spec["seed"])
    key = backbone_key(cfg, backbone)
    tok = F.load_tokenizer(backbone, key)
    max_len = rc.max_len
    margins = (pair_margins(train, W.labeler(cfg), W.gold_weights(cfg), cfg.data.source == "world")
               if rc.margin else None)
    examples = encode_rm_pairs(tok, train, max_len, margins)
    n_trunc = sum(len(e["chosen"]) >= max_len or len(e["rejected"]) >= max_len for e in examples)
    if n_trunc:
        print(f"[rlhf-lab] rm: {n_trunc} of {len(examples)} pairs reach reward_model.max_len={max_len} (cut at the start)")

    upstream = {}
    if cfg.data.source == "world":
        ps = prefs.spec(cfg)
        upstream["sft"] = upstream_run(cfg, ps["sft"])
        upstream["prefs"] = upstream_run(cfg, cache_for(cfg).path("prefs", ps))
    upstream["rm_backbone"] = upstream_run(cfg, backbone)
    if str(rc.init) == "pretrain" and str(rc.source) != "pretrained":
        upstream["pretrain"] = upstream["rm_backbone"]
    n_on = sum(p.source == "on_policy" for p in train)
    if G.is_rm(cfg):
        upstream["gold_rm"] = upstream_run(cfg, G.rm_path(cfg))
    params = {"stage": "rm", "reward_model": to_plain(rc), "data": to_plain(cfg.data), "seed": seed,
              "steps": steps, "backbone": str(backbone), "n_train_pairs": len(train), "n_eval_pairs": len(held),
              "n_on_policy_pairs": n_on, "gold": to_plain(cfg.get("gold"))}
    k = rc.ensemble
    with tracking.start_run(run_settings(cfg), "rm", params=params,
                            tags={f"rlhf_lab.upstream.{a}": str(b) for a, b in upstream.items()}) as run:
        t0 = time.time()
        members, size = [], {}
        for i in range(k):
            mseed = seed + MEMBER_SEED_STRIDE * i
            L.seed_everything(mseed, verbose=False)
            model = with_lora(F.load_sequence_scorer(backbone, tok, key, **F.load_options(rc)), rc.lora,
                              "SEQ_CLS", key="reward_model.lora")
            size = model_size(model)
            if i == 0:
                active_run.log_metrics(size, step=0)
            g = torch.Generator().manual_seed(mseed)
            packed = bool(rc.packing) and packable(model)  # an encoder RM (MiniLM) reads every token: padded
            loader = distributed.loader(examples, rc.batch_size, g, collate_rm_pairs(tok.pad_token_id, packed),
                                        key="reward_model.batch_size")
            module = RewardModelModule(model, lr=rc.lr, weight_decay=rc.weight_decay,
                                       warmup_steps=rc.warmup_steps, max_steps=steps, use_margin=rc.margin,
                                       center_coef=rc.center_coef, prefix="" if i == 0 else f"member_{i}/")
            label = "rm" if k == 1 else f"rm member {i + 1}/{k}"
            model, _ = fit(cfg, "rm", module, loader, model, out_dir, steps, f"reward model member {i}", label=label)
            if model is None:  # trainer=fsdp / fsdp_cpu: whole on rank 0 only
                continue
            if int(rc.lora.r) > 0:
                model = model.merge_and_unload()
            members.append(model.eval())
        train_s = time.time() - t0
        if not distributed.is_rank_zero():  # rank 0 normalises, evaluates, saves and logs
            return {"stage": "rm", "train_s": train_s}

        # normalised and evaluated where the stage trained (Lightning hands the members back on the CPU)
        scorer = RewardScorer(members, tok, max_len=max_len).to(distributed.work_device(to_plain(cfg.trainer)))
        norm = normalization_set(train, int(rc.get("norm_samples") or 1024), seed)
        raw_stats = scorer.fit_normalization(*norm)
        tok.save_pretrained(out_dir)
        for i, m in enumerate(members):
            m.save_pretrained(out_dir / f"member_{i}")
        metrics, rows = evaluate_rm(scorer, held)
        extra = {"n_norm_samples": len(norm[0]), "normalised_on": "SFT samples of the training pairs",
                 "backbone": str(backbone), "source": str(rc.source)}
        if "rm/ensemble_std" in metrics:  # an ensemble's: the level a gold's disagreement is read against (eval/gold_rm_std)
            extra[HELDOUT_SPREAD] = metrics["rm/ensemble_std"]
        scorer.save_norm(out_dir, extra)
        metrics.update({"rm/gain": scorer.gain, "rm/bias": scorer.bias,
                        "rm/raw_mean": float(raw_stats["raw_mean"][0]), "rm/raw_std": float(raw_stats["raw_std"][0]),
                        "rm/train_on_policy_fraction": n_on / len(train), "time/train_s": train_s})
        active_run.log_metrics({k_: v for k_, v in metrics.items() if v == v}, step=steps)  # NaN-free
        active_run.log_samples_table(rows, "samples/rm_eval_pairs.json")
        keys = ("rm/accuracy", "rm/accuracy_gold", "rm/spearman_gold", "rm/length_preference", "rm/filler_preference")
        line = ", ".join(f"{q.split('/')[1]}={metrics[q]:.3f}" for q in keys if q in metrics)
        line += f" ({n_text(len(held), 'eval pair')})"  # the n every held-out figure stands on
        return {"run_id": run.info.run_id, "stage": "rm", "eval": metrics, "train_s": train_s, **size,
                "n_members": k, "summary": {"rm eval": line}}
