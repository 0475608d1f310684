"""Preference pairs (prompt, chosen, rejected) for reward models and DPO.

Two sources, chosen by the `data` config group:

- ``data=world`` (default): prompts from the world, two responses per prompt sampled from the SFT
  policy (optionally a fraction of pairs from another policy checkpoint, ``data.on_policy_path`` and
  ``data.on_policy_fraction``), labelled by the configured labeler. Each pair also records both
  responses' gold rewards, so held-out accuracy can be measured against the labeler *and* against gold. The
  gold is the world's formula, or a frozen gold reward model (``gold=rm``: the labeler's biases on top of its
  score, :func:`label_pairs`).
  The pairs are a cached artifact, built by the stage ``prefs`` (:mod:`rlhf_lab.stages.prefs`).
- ``data=jsonl`` / ``data=hf``: a JSON-lines file, or a ``save_to_disk`` folder, parquet file or hub dataset,
  in TRL's standard or conversational format (:mod:`rlhf_lab.data.external`), read within bounds
  (:mod:`rlhf_lab.data.files`); one bad row fails the job before anything trains, naming the place of each
  (:func:`load_examples`). :func:`external_prompts` reads the prompts only (a prompt-only dataset will do) for PPO,
  GRPO and RLOO. Gold metrics are absent unless the gold is a reward model (``gold=rm``), which then labels the
  pairs again through the labeler (:func:`relabel_pairs`).

  **Held out by prompt** (:func:`split_by_prompt`): every distinct prompt (its text as the model sees it,
  after the chat template) goes to ``train``, ``eval`` or ``test`` by a hash of that text, as the world's
  prompts do (:func:`rlhf_lab.world.splits.hash_bucket`; ``data.eval_fraction`` and ``data.test_fraction``
  of the prompts, 0.1 each by default), with every row of that prompt. So the RM's and DPO's held-out pairs
  and the evaluation prompts are never training prompts, even with several pairs per prompt (HH-RLHF,
  UltraFeedback), and eval and test never share a prompt. A dataset whose prompts leave one of the three
  empty fails with :class:`TooFewPrompts` (one line: how many prompts it has and how many each split got).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import torch

from rlhf_lab.data import external as X
from rlhf_lab.config.errors import ConfigError
from rlhf_lab.data.files import MAX_LINE_BYTES, MAX_TOTAL_BYTES, dataset_rows, jsonl_rows, load_hf_dataset
from rlhf_lab.data.external import ChatRenderer
from rlhf_lab.runs.contents import with_contents
from rlhf_lab.world import GoldWeights, Labeler
from rlhf_lab.world.splits import hash_bucket, prompt_hash

HELD_OUT = ("train", "eval", "test")  # the splits of an external dataset's prompts


@dataclass(frozen=True)
class Labelling:
    """How pairs are labelled (``labeler`` group, :func:`rlhf_lab.config.data.labelling`): the labeler with its
    biases, and the world's gold weights, the formula's gold when no gold RM scores the responses."""

    labeler: Labeler
    weights: GoldWeights


@dataclass(frozen=True)
class ExternalData:
    """``data=jsonl|hf`` as its readers take it (:func:`rlhf_lab.config.data.external_data`): the ``data`` group as
    plain containers, and the policy checkpoint (``policy.name_or_path``) whose chat template renders conversational
    rows."""

    data: dict
    policy: str | None = None


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


def label_pairs(labelling: Labelling, prompts: list[str], a: list[str], b: list[str], ended_a: list[bool],
                ended_b: list[bool], rng: random.Random, source: str, gold=None) -> list[PreferencePair]:
    """Label (a, b) with the configured labeler; ties in text are dropped (they carry no preference).

    `gold`: the gold reward the labeler's utility starts from, a scorer ``(prompts, responses, ended) -> scores``
    (a gold reward model, ``gold=rm``); None is the world's formula (``world.gold`` weights). Each pair records both
    responses' gold rewards; the labeler's biases are added on top (:meth:`rlhf_lab.world.Labeler.utility_from_gold`)."""
    lab = labelling.labeler
    keep = [i for i, (ya, yb, ea, eb) in enumerate(zip(a, b, ended_a, ended_b)) if not (ya == yb and ea == eb)]
    ga, gb = gold_scores(labelling.weights, gold, [prompts[i] for i in keep], [a[i] for i in keep], [ended_a[i] for i in keep],
                         [b[i] for i in keep], [ended_b[i] for i in keep])
    out = []
    for j, i in enumerate(keep):
        p, ya, yb, ea, eb = prompts[i], a[i], b[i], ended_a[i], ended_b[i]
        first = lab.prefers_first_given(rng, ga[j], gb[j], ya, yb)
        (c, ec, gc), (r, er, gr) = ((ya, ea, ga[j]), (yb, eb, gb[j])) if first else ((yb, eb, gb[j]), (ya, ea, ga[j]))
        out.append(PreferencePair(p, c, r, ec, er, gc, gr, source))
    return out


def gold_scores(weights: GoldWeights, gold, prompts: list[str], a: list[str], ended_a: list[bool], b: list[str],
                ended_b: list[bool]) -> tuple[list[float], list[float]]:
    """The gold rewards of the responses a and b (one scorer call for both): the formula's exact values when
    `gold` is None (with the world's `weights`), else the scorer's."""
    if gold is None:
        from rlhf_lab.world import gold_reward

        w = weights
        return ([gold_reward(p, y, e, w) for p, y, e in zip(prompts, a, ended_a)],
                [gold_reward(p, y, e, w) for p, y, e in zip(prompts, b, ended_b)])
    if not prompts:
        return [], []
    s = [float(x) for x in gold(prompts + prompts, list(a) + list(b), list(ended_a) + list(ended_b))]
    return s[: len(prompts)], s[len(prompts):]


def relabel_pairs(labelling: Labelling, pairs: list[PreferencePair], gold, rng: random.Random) -> list[PreferencePair]:
    """External pairs labelled again by the labeler on the gold RM's scores (``gold=rm`` with ``data=jsonl|hf``):
    the dataset's own chosen/rejected order is replaced, as the gold RM labels the data in Gao et al. 2022."""
    ones = [True] * len(pairs)
    return label_pairs(labelling, [p.prompt for p in pairs], [p.chosen for p in pairs], [p.rejected for p in pairs], ones,
                       ones, rng, "external", gold)


@torch.no_grad()
def sample_pairs(labelling: Labelling, gen, options: dict, policy_path, prompts: list[str], seed: int, source: str,
                 batch_size: int = 256, gold=None, progress=None,
                 key: str = "policy.name_or_path", device: torch.device | str = "cpu",
                 second: SecondResponse | None = None) -> list[PreferencePair]:
    """Two responses per prompt from the policy checkpoint (named by config `key` in its errors; loaded with
    `options`, ``models.families.load_options``), sampled with the ``generation`` settings `gen`
    (:class:`rlhf_lab.config.schema.GenerationConfig`), labelled by :func:`label_pairs` (`gold`: see there). `progress`:
    a bar whose ``update(n)`` is called with the number of prompts of each batch sampled and labelled. `device`: where
    the policy samples (:func:`rlhf_lab.runs.distributed.work_device`). `second`: None samples the second response too;
    else a :class:`SecondResponse` makes it: a degenerate variant of the first
    (:class:`rlhf_lab.data.degenerate.Variants`), or another checkpoint's sample for the same prompts
    (:class:`Checkpoint`)."""
    policy = Checkpoint(policy_path, options, gen, key, device)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    pairs: list[PreferencePair] = []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i : i + batch_size]
        a, ended_a = policy(chunk)
        b, ended_b = policy(chunk) if second is None else second(chunk, a, ended_a)
        pairs += label_pairs(labelling, chunk, a, b, ended_a, ended_b, rng, source, gold)
        if progress is not None:
            progress.update(len(chunk))
    return pairs


class SecondResponse(Protocol):
    """What makes the second response of each pair from the first (``sample_pairs(second=...)``): given the prompts and
    the first responses with whether each ended (EOS), the second responses and whether each ended."""

    def __call__(self, prompts: list[str], responses: list[str], ended: list[bool]) -> tuple[list[str], list[bool]]:
        ...


class Checkpoint:
    """A policy checkpoint that samples one response per prompt with the ``generation`` settings `gen` (from torch's
    random stream, seeded by :func:`sample_pairs`): called with prompts alone, or as a :class:`SecondResponse`, whose
    first responses it does not read: the second response of each pair is then its own sample for the pair's prompt
    (an on-policy response against an SFT one: ``data.on_policy_pairing=sft``)."""

    def __init__(self, path, options: dict, gen, key: str, device: torch.device | str = "cpu"):
        from rlhf_lab.models.families import load_causal_lm, load_tokenizer

        self.tok = load_tokenizer(path, key)
        self.model = load_causal_lm(path, self.tok, key, **options).to(device)
        self.gen = gen

    def __call__(self, prompts: list[str], responses: list[str] | None = None,
                 ended: list[bool] | None = None) -> tuple[list[str], list[bool]]:
        from rlhf_lab.models.sampling import sample

        g = self.gen
        r = sample(self.model, self.tok, prompts, g.max_new_tokens, g.temperature, g.top_k, g.top_p, g.max_prompt_len,
                   sampler=g.sampler)
        return r.responses, r.ended


def chat_renderer(src: ExternalData) -> ChatRenderer:
    """The chat template for conversational data: ``data.chat_template``, else the template of the policy
    checkpoint's tokenizer (``policy.name_or_path``), else :data:`rlhf_lab.data.external.DEFAULT_CHAT_TEMPLATE`;
    with that tokenizer's BOS and EOS texts (a leading BOS is dropped when the tokenizer adds one itself)."""
    template = src.data.get("chat_template")
    if not src.policy:
        return ChatRenderer(template)
    from rlhf_lab.models.families import load_tokenizer

    tok = load_tokenizer(src.policy, "policy.name_or_path")
    own = tok.chat_template
    if isinstance(own, dict):  # several named templates: the default one
        own = own.get("default")
    adds_bos = tok.bos_token_id is not None and tok("x").input_ids[:1] == [tok.bos_token_id]
    return ChatRenderer(template or own, tok.bos_token, tok.eos_token, strip_bos=adds_bos)


def external_rows(dc: dict):
    """(rows, key) of the configured external source (`dc`: the ``data`` group, plain): (where, row) pairs and the
    key that names the source."""
    if dc["source"] == "jsonl":
        if not dc.get("path"):
            raise ValueError("data=jsonl needs data.path=<file.jsonl> with prompt, chosen, rejected columns")
        path = Path(str(dc["path"])).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"data.path={str(path)!r}: no such file")
        rows = jsonl_rows(path, dc.get("max_line_bytes", MAX_LINE_BYTES), dc.get("max_total_bytes", MAX_TOTAL_BYTES))
        return rows, f"data.path={str(path)!r}"  # the bounds: null is no limit (rlhf_lab.data.files)
    if not dc.get("name"):
        raise ValueError("data=hf needs data.name=<save_to_disk folder, .parquet/.jsonl file or hub name>")
    name, split = str(dc["name"]), str(dc.get("split", "train"))
    line_bound = dc.get("max_line_bytes", MAX_LINE_BYTES)  # a row's bound too (rlhf_lab.data.files.row_bytes)
    ds = load_hf_dataset(name, split, dc.get("max_total_bytes", MAX_TOTAL_BYTES), line_bound)
    return dataset_rows(ds, f"{name}[{split}]", line_bound), f"data.name={name!r}"


class TooFewPrompts(ConfigError):
    """An external dataset whose distinct prompts leave train, eval or test empty (``str(err)`` is one line:
    how many distinct prompts it has, how many each split got, and what would do)."""

    def __init__(self, key: str, counts: dict[str, int], eval_fraction: float, test_fraction: float) -> None:
        n = sum(counts.values())
        about = math.ceil(3 / min(eval_fraction, test_fraction, 1 - eval_fraction - test_fraction))
        self.key, self.value, self.counts = key, n, counts
        self.allowed = "a dataset with at least 1 distinct prompt in each of train, eval and test"
        ValueError.__init__(self, (
            f"{key}: {n} distinct prompt(s), split by a hash of the text into train {counts['train']}, eval "
            f"{counts['eval']}, test {counts['test']} (data.eval_fraction={eval_fraction}, data.test_fraction="
            f"{test_fraction}); each split needs at least 1 (eval and test are held out, never trained on): use a "
            f"dataset with more distinct prompts (about {about} or more at these fractions) or larger fractions"))


def split_by_prompt(examples: list[X.Example], eval_fraction: float, test_fraction: float,
                    key: str = "data") -> dict[str, list[X.Example]]:
    """The rows of each split (:data:`HELD_OUT`), every row in the split of its prompt:
    ``hash_bucket(prompt, 1 - eval_fraction - test_fraction, eval_fraction)``, so all rows of a prompt are
    in one split and a prompt's split depends on its text alone. Rows keep their order. Raises
    :class:`TooFewPrompts` when a split has no prompt (no evaluation ever falls back to training prompts)."""
    train = 1.0 - eval_fraction - test_fraction
    out: dict[str, list[X.Example]] = {s: [] for s in HELD_OUT}
    for e in examples:
        out[hash_bucket(e.prompt, train, eval_fraction)].append(e)
    counts = {s: len({e.prompt for e in rows}) for s, rows in out.items()}
    if not all(counts.values()):
        raise TooFewPrompts(key, counts, eval_fraction, test_fraction)
    return out


EXAMPLES_MEMO: dict[str, dict[str, list[X.Example]]] = {}


def data_memo_key(src: ExternalData, *extra) -> str:
    """What determines the rows read from ``data=jsonl|hf``: the data config and the policy checkpoint (its chat
    template), a local file or folder of either by its content (:func:`rlhf_lab.runs.contents.with_contents`: a
    file or folder rewritten in place is read again), and `extra`."""
    what = with_contents({"data": src.data, "policy": {"name_or_path": str(src.policy)}})
    return json.dumps([what, *extra], sort_keys=True, default=str)


def load_examples(src: ExternalData, prompt_only: bool = False) -> dict[str, list[X.Example]]:
    """The rows of ``data=jsonl|hf`` as text, every row checked (:func:`rlhf_lab.data.external.read_examples`),
    by split of their prompt (:func:`split_by_prompt`, ``data.eval_fraction``, ``data.test_fraction``); the
    training rows shuffled with ``data.seed``. Read once per process and configuration (the job reads them before
    training to fail early, then its stages use them): callers must not change the lists."""
    memo_key = data_memo_key(src, prompt_only)
    if memo_key not in EXAMPLES_MEMO:
        dc = src.data
        rows, key = external_rows(dc)
        ex = X.read_examples(rows, X.columns_of(dc), str(dc.get("format", "auto")), lambda: chat_renderer(src),
                             prompt_only=prompt_only, key=key)
        out = split_by_prompt(ex, float(dc.get("eval_fraction", 0.1)), float(dc.get("test_fraction", 0.1)), key)
        random.Random(int(dc.get("seed", 0))).shuffle(out["train"])
        EXAMPLES_MEMO[memo_key] = out
    return EXAMPLES_MEMO[memo_key]


def load_external(src: ExternalData) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(train, eval) preference pairs of ``data=jsonl|hf`` (:func:`load_examples`), in either format; the
    test split's pairs are not used (its prompts are: :func:`external_prompts`)."""
    split = load_examples(src)
    to_pairs = lambda xs: [PreferencePair(e.prompt, e.chosen, e.rejected, source="external") for e in xs]  # noqa: E731
    return to_pairs(split["train"]), to_pairs(split["eval"])


PROMPTS_MEMO: dict[str, tuple[list[str], list[str], list[str]]] = {}


def external_prompts(src: ExternalData) -> tuple[list[str], list[str], list[str]]:
    """(train, eval, test) distinct prompts of ``data=jsonl|hf`` (a prompt-only dataset will do; the same
    split as :func:`load_external`'s pairs): train in row order, eval and test in the order of their hash
    (a fixed pseudo-random order, so the first ``eval.n_prompts`` are a sample, whatever the file's order);
    read once per process and configuration."""
    memo_key = data_memo_key(src)
    if memo_key not in PROMPTS_MEMO:
        split = load_examples(src, prompt_only=True)
        distinct = {s: list(dict.fromkeys(e.prompt for e in split[s])) for s in HELD_OUT}
        held = lambda s: sorted(distinct[s], key=prompt_hash)  # noqa: E731
        PROMPTS_MEMO[memo_key] = distinct["train"], held("eval"), held("test")
    return PROMPTS_MEMO[memo_key]


def read_jsonl(path: Path, columns: dict | None = None, fmt: str = "auto", renderer_fn=None) -> list[PreferencePair]:
    """Preference pairs of a JSON-lines file, every row checked; any bad row fails the job.

    A row is bad when it is not UTF-8, not valid JSON, not an object, lacks prompt/chosen/rejected, has
    one of them null, of the wrong type for the format or empty (blank), or has chosen == rejected. The
    error names the file and line of each bad row (the first :data:`MAX_LISTED_ERRORS`) and how many there
    are. Blank lines are skipped. Both formats (:mod:`rlhf_lab.data.external`)."""
    if not path.exists():
        raise FileNotFoundError(f"data.path={str(path)!r}: no such file")
    ex = X.read_examples(jsonl_rows(path), columns or X.DEFAULT_COLUMNS, fmt, renderer_fn,
                         key=f"data.path={str(path)!r}")
    return [PreferencePair(e.prompt, e.chosen, e.rejected, source="external") for e in ex]


def validate_pairs(pairs: list[PreferencePair], key: str) -> None:
    if not pairs:
        raise ValueError(f"{key}: the preference dataset is empty; nothing to train on")
    if all(p.chosen == p.rejected for p in pairs):
        raise ValueError(f"{key}: chosen == rejected in every pair; the data carries no preference")
