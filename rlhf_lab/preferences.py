"""Preference pairs (prompt, chosen, rejected) for reward models and DPO.

Two sources, chosen by the `data` config group:

- ``data=world`` (default): prompts from the world, two responses per prompt sampled from the SFT
  policy (optionally a fraction of pairs from another policy checkpoint, ``data.on_policy_path`` and
  ``data.on_policy_fraction``), labelled by the configured labeler. Each pair also records both
  responses' gold rewards, so held-out accuracy can be measured against the labeler *and* against gold.
  The pairs are a cached artifact, built by the stage ``prefs`` (:mod:`rlhf_lab.stages.prefs`).
- ``data=jsonl`` / ``data=hf``: any JSON-lines file or Hugging Face ``datasets`` source with
  ``prompt``, ``chosen``, ``rejected`` columns (a Hugging Face source through ``datasets.load_dataset``).
  Gold metrics are absent there. Every row of a JSON-lines file is checked (:func:`read_jsonl`): one bad
  row (not UTF-8, invalid JSON, a field missing, null, not a string or empty, chosen == rejected) fails
  the job before anything trains, with the file and line of each bad row.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig

from rlhf_lab import data as D

COLUMNS = ("prompt", "chosen", "rejected")


@dataclass
class PreferencePair:
    prompt: str
    chosen: str
    rejected: str
    chosen_ended: bool = True
    rejected_ended: bool = True
    gold_chosen: float | None = None  # gold reward of each response (None outside the world)
    gold_rejected: float | None = None
    source: str = "sft"  # which policy sampled the responses

    @property
    def gold_agrees(self) -> bool | None:
        if self.gold_chosen is None or self.gold_rejected is None:
            return None
        return self.gold_chosen > self.gold_rejected


def save_pairs(pairs: list[PreferencePair], path: Path) -> None:
    with open(path, "w") as f:
        for p in pairs:
            f.write(json.dumps(asdict(p)) + "\n")


def load_pairs(path: Path) -> list[PreferencePair]:
    with open(path) as f:
        return [PreferencePair(**json.loads(line)) for line in f if line.strip()]


def label_pairs(cfg: DictConfig, prompts: list[str], a: list[str], b: list[str], ended_a: list[bool],
                ended_b: list[bool], rng: random.Random, source: str) -> list[PreferencePair]:
    """Label (a, b) with the configured labeler; ties in text are dropped (they carry no preference)."""
    lab, w = D.labeler(cfg), D.gold_weights(cfg)
    from rlhf_lab.world import gold_reward

    out = []
    for p, ya, yb, ea, eb in zip(prompts, a, b, ended_a, ended_b):
        if ya == yb and ea == eb:
            continue
        first = lab.prefers_first(rng, p, ya, yb, ea, eb, w)
        (c, ec), (r, er) = ((ya, ea), (yb, eb)) if first else ((yb, eb), (ya, ea))
        out.append(PreferencePair(p, c, r, ec, er, gold_reward(p, c, ec, w), gold_reward(p, r, er, w), source))
    return out


@torch.no_grad()
def sample_pairs(cfg: DictConfig, policy_path, prompts: list[str], seed: int, source: str,
                 batch_size: int = 256) -> list[PreferencePair]:
    from rlhf_lab.models.families import load_causal_lm, load_tokenizer
    from rlhf_lab.models.sampling import sample

    tok = load_tokenizer(policy_path, "data.policy")
    model = load_causal_lm(policy_path, tok, "data.policy")
    torch.manual_seed(seed)
    rng = random.Random(seed)
    g = cfg.generation
    pairs: list[PreferencePair] = []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i : i + batch_size]
        ra = sample(model, tok, chunk, g.max_new_tokens, g.temperature, g.top_k, g.top_p, g.max_prompt_len)
        rb = sample(model, tok, chunk, g.max_new_tokens, g.temperature, g.top_k, g.top_p, g.max_prompt_len)
        pairs += label_pairs(cfg, chunk, ra.responses, rb.responses, ra.ended, rb.ended, rng, source)
    return pairs


def load_external(cfg: DictConfig) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(train, eval) pairs from a JSON-lines file (:func:`read_jsonl`) or a Hugging Face dataset."""
    dc = cfg.data
    if dc.source == "jsonl":
        if not dc.get("path"):
            raise ValueError("data=jsonl needs data.path=<file.jsonl> with prompt, chosen, rejected columns")
        pairs = read_jsonl(Path(str(dc.path)).expanduser())
    else:
        import datasets

        ds = datasets.load_dataset(str(dc.name), split=str(dc.get("split", "train")))
        missing = [c for c in COLUMNS if c not in ds.column_names]
        if missing:
            raise ValueError(f"the preference data ({dc.get('name')}) lacks column(s) {missing}; "
                             f"it has {ds.column_names}. Each row needs prompt, chosen, rejected.")
        pairs = [PreferencePair(str(r["prompt"]), str(r["chosen"]), str(r["rejected"]), source="external")
                 for r in ds]
    validate_pairs(pairs, "data")
    rng = random.Random(int(dc.get("seed", 0)))
    rng.shuffle(pairs)
    n_eval = max(1, int(len(pairs) * float(dc.get("eval_fraction", 0.1)))) if len(pairs) > 1 else 0
    return pairs[n_eval:], pairs[:n_eval]


MAX_LISTED_ERRORS = 10


def row_error(row) -> str | None:
    """What is wrong with one decoded JSONL row (None: a good row)."""
    if not isinstance(row, dict):
        return f"not a JSON object ({type(row).__name__})"
    missing = [c for c in COLUMNS if c not in row]
    if missing:
        return f"lacks column(s) {missing}; it has {sorted(row)}"
    for c in COLUMNS:
        v = row[c]
        if v is None:
            return f"{c} is null"
        if not isinstance(v, str):
            return f"{c} is {type(v).__name__}, not a string"
        if not v.strip():
            return f"{c} is empty"
    if row["chosen"] == row["rejected"]:
        return "chosen == rejected (the row carries no preference)"
    return None


def read_jsonl(path: Path) -> list[PreferencePair]:
    """Preference pairs of a JSON-lines file, every row checked; any bad row fails the job.

    A row is bad when it is not UTF-8, not valid JSON, not an object, lacks prompt/chosen/rejected, has
    one of them null, not a string or empty (blank), or has chosen == rejected. The error names the file
    and line of each bad row (the first :data:`MAX_LISTED_ERRORS`) and how many there are. Blank lines
    are skipped."""
    if not path.exists():
        raise FileNotFoundError(f"data.path={str(path)!r}: no such file")
    pairs, errors, n_rows = [], [], 0
    with open(path, "rb") as f:
        for i, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                errors.append(f"{path}:{i}: not UTF-8 ({err.reason} at byte {err.start})")
                n_rows += 1
                continue
            if not line.strip():
                continue
            n_rows += 1
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                errors.append(f"{path}:{i}: invalid JSON ({err.msg} at column {err.colno})")
                continue
            problem = row_error(row)
            if problem:
                errors.append(f"{path}:{i}: {problem}")
            else:
                pairs.append(PreferencePair(row["prompt"], row["chosen"], row["rejected"], source="external"))
    if errors:
        shown = "\n  ".join(errors[:MAX_LISTED_ERRORS])
        more = f"\n  ... and {len(errors) - MAX_LISTED_ERRORS} more" if len(errors) > MAX_LISTED_ERRORS else ""
        raise ValueError(f"data.path={str(path)!r}: {len(errors)} bad row(s) of {n_rows}; fix or remove them:"
                         f"\n  {shown}{more}")
    if not pairs:
        raise ValueError(f"data.path={str(path)!r}: the preference dataset is empty; nothing to train on")
    return pairs


def validate_pairs(pairs: list[PreferencePair], key: str) -> None:
    if not pairs:
        raise ValueError(f"{key}: the preference dataset is empty; nothing to train on")
    if all(p.chosen == p.rejected for p in pairs):
        raise ValueError(f"{key}: chosen == rejected in every pair; the data carries no preference")
