"""Reward models as used by the other stages: the artifact folder and the scorer.

An RM artifact folder (written by the stage ``rm``, :mod:`rlhf_lab.stages.rm`) holds

- the RM's tokenizer at the top level (``tokenizer.json`` ...),
- one sequence classifier (``num_labels=1``) per ensemble member in ``member_0/``, ``member_1/``, ...
  (a LoRA-tuned RM is saved with its adapters merged, so every member loads the same way),
- ``rm_norm.json``: the normalisation measured after training on SFT samples, and the encoding's
  ``max_len``. ``gain``/``bias`` map the (aggregated) score to mean 0 and std 1 on those samples; in an
  ensemble every member is first standardised on its own (``member_gain``/``member_bias``, identity
  for a single model), so that the members' spread is comparable.

Scoring is text in, score out: the RM reads ``prompt + " " + response`` encoded with *its own*
tokenizer, followed by the RM tokenizer's EOS token when the response ended with EOS. A policy of
another family is scored by decoding its samples with the policy tokenizer and re-encoding them
with the RM's (:meth:`RewardScorer.score_tokens`), in batches.

Score with normalisation: ``gain * (mean_k z_k - conservative_lambda * std_k z_k) + bias`` with
``z_k = member_gain_k * raw_k + member_bias_k`` (population std; 0 for one member), so a single RM
gives ``gain * raw + bias``. Without normalisation the members' raw scores are aggregated the same way
and no affine map is applied.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Sequence

import torch

from rlhf_lab.models.batching import pad_right
from rlhf_lab.models.adapters import unwrap
from rlhf_lab.models.shared_prefix import common_prefixes, shared_prefix_states
from rlhf_lab.models.checkpoints import CheckpointError, CheckpointNotFound

NORM_FILE = "rm_norm.json"
MEMBER_DIR = "member_{}"
HELDOUT_SPREAD = "heldout_member_std"  # rm_norm.json of an ensemble: its members' mean std on its held-out pairs


# ------------------------------------------------------------------------------------------------
# encoding and the forward pass shared by training and scoring


def encode_texts(tokenizer, prompts: Sequence[str], responses: Sequence[str], ended: Sequence[bool],
                 max_len: int) -> list[list[int]]:
    """Token ids of ``prompt + " " + response`` (+ EOS when ended); over-long inputs keep their end."""
    if not (len(prompts) == len(responses) == len(ended)):
        raise ValueError(
            f"prompts, responses and ended must have the same length, got {len(prompts)}, {len(responses)}, {len(ended)}"
        )
    texts = [f"{p} {r}" for p, r in zip(prompts, responses)]
    enc = tokenizer(texts).input_ids if texts else []
    eos = end_token_id(tokenizer)
    out = []
    for ids, e in zip(enc, ended):
        ids = list(ids) + ([eos] if e else [])
        out.append(ids[-max_len:])  # the scalar head reads the last token: keep the end (and its EOS)
    return out


def end_token_id(tokenizer) -> int:
    """The token that marks an ended response: EOS, or SEP for an encoder's tokenizer without one (BERT)."""
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    if eos is None:
        raise ValueError("the reward model's tokenizer has neither an EOS nor a SEP token to mark an ended response")
    return eos


MEAN_POOLED_TYPES = ("bert",)  # encoders whose RM head reads the mean embedding (MiniLM is a BERT)


def is_encoder(hf) -> bool:
    """A bidirectional encoder classifier (BERT, MiniLM: ``model_type`` in :data:`MEAN_POOLED_TYPES`) with its
    linear ``classifier`` head (possibly wrapped by peft), not a decoder's ``score``."""
    return (getattr(hf.config, "model_type", None) in MEAN_POOLED_TYPES and getattr(hf, "score", None) is None
            and getattr(hf, "classifier", None) is not None)


def rm_forward(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Scalar reward [B] of right-padded inputs: a decoder's head reads the last attended token; an encoder's
    (:func:`is_encoder`) reads the mean of its last hidden states over the attended tokens (sentence-transformers'
    pooled embedding).

    Reads the backbone and the scalar head directly (not the classifier's own pooling, which finds the
    last token by comparing ids with pad_token_id and so would skip an EOS when pad == EOS).
    """
    from rlhf_lab.models.sampling import positions

    hf = unwrap(model)
    backbone = getattr(hf, hf.base_model_prefix, None)
    encoder = is_encoder(hf)
    head = hf.classifier if encoder else getattr(hf, "score", None)
    if backbone is None or head is None:  # an architecture without the usual layout: its own pooling
        return model(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0].float()
    h = backbone(input_ids=input_ids, attention_mask=attention_mask,
                 position_ids=positions(attention_mask)).last_hidden_state
    if encoder:
        m = attention_mask.to(h.dtype).unsqueeze(-1)
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1.0)
        return head(pooled)[:, 0].float()
    last = attention_mask.long().sum(-1) - 1
    h_last = h[torch.arange(h.shape[0], device=h.device), last]
    return head(h_last)[:, 0].float()


def packable(model) -> bool:
    """Whether :func:`rm_forward_packed` applies: a decoder with the usual backbone + ``score`` head layout."""
    hf = unwrap(model)
    return (not is_encoder(hf) and getattr(hf, hf.base_model_prefix, None) is not None
            and getattr(hf, "score", None) is not None)


def rm_forward_packed(model, input_ids: torch.Tensor, position_ids: torch.Tensor, last_index: torch.Tensor) -> torch.Tensor:
    """Scalar reward [N] of N sequences packed into rows by :func:`rlhf_lab.models.batching.pack_rows` (no compute on
    padding, :mod:`rlhf_lab.models.packing`): the scalar head at each sequence's last token (``last_index`` into
    the flattened rows). Decoders only (:func:`packable`)."""
    from rlhf_lab.models.packing import packed_hidden

    return unwrap(model).score(packed_hidden(model, input_ids, position_ids)[last_index])[:, 0].float()


def rm_forward_shared(model, prefix_ids, prefix_mask, group, suffix_ids, suffix_mask) -> torch.Tensor:
    """Scalar reward [B] of ``prefix[group[b]] + suffix[b]`` (prefixes left-padded, suffixes right-padded), each
    prefix run once (:func:`rlhf_lab.models.shared_prefix.shared_prefix_states`): the scalar head at each suffix's
    last token. Decoders only (:func:`packable`)."""
    from rlhf_lab.models.packing import backbone_of

    _, h = shared_prefix_states(backbone_of(model), prefix_ids, prefix_mask, group, suffix_ids, suffix_mask)
    last = suffix_mask.long().sum(1) - 1
    return unwrap(model).score(h[torch.arange(h.shape[0], device=h.device), last])[:, 0].float()


# ------------------------------------------------------------------------------------------------
# the scorer


def aggregate(z: torch.Tensor, conservative_lambda: float = 0.0) -> torch.Tensor:
    """Ensemble score from member scores z [K, B]: mean − λ·std (population std, 0 for K = 1)."""
    if z.dim() != 2 or z.shape[0] == 0:
        raise ValueError(f"member scores must have shape [K, B] with K >= 1, got {tuple(z.shape)}")
    mean = z.mean(0)
    if conservative_lambda:
        return mean - float(conservative_lambda) * z.std(0, correction=0)
    return mean


def affine_to_standard(x: torch.Tensor) -> tuple[float, float]:
    """(gain, bias) such that gain * x + bias has mean 0 and std 1 (population std)."""
    x = x.double()
    if x.numel() < 2:
        raise ValueError("normalising the RM needs at least two samples")
    std = float(x.std(correction=0))
    if not std > 1e-8:
        raise ValueError(f"the RM gives (nearly) the same score to every normalisation sample (std {std:.2e}); "
                         "it cannot be normalised")
    return 1.0 / std, -float(x.mean()) / std


def read_norm(path: Path, key: str = "reward model") -> dict:
    """The ``rm_norm.json`` of an RM artifact folder (named by config `key`); a folder without one, or with one that is
    no JSON object with ``n_members``, ``gain`` and ``bias``, is a
    :class:`~rlhf_lab.models.checkpoints.CheckpointError`."""
    norm_file = Path(path) / NORM_FILE
    if not norm_file.exists():
        raise CheckpointNotFound(key, path, f"not a reward-model folder (no {NORM_FILE})", "train one with algo=rm")
    fix = "give the artifact folder of an algo=rm job as it was written"
    try:
        info = json.loads(norm_file.read_text())
    except ValueError as err:
        raise CheckpointError(key, path, f"{NORM_FILE} is not valid JSON ({err})", fix) from err
    missing = [k for k in ("n_members", "gain", "bias") if not isinstance(info, dict) or k not in info]
    if missing:
        raise CheckpointError(key, path, f"{NORM_FILE} has no {', '.join(missing)}", fix)
    return info


class RewardScorer:
    """Scores (prompt, response, ended) triples with an RM (or an ensemble of RMs); no gradients.

    ``gain``/``bias`` (floats) are the final affine map; ``member_gain``/``member_bias`` ([K] tensors)
    standardise each member of an ensemble (all 1 / 0 for a single model).
    """

    def __init__(self, members: list, tokenizer, gain: float = 1.0, bias: float = 0.0,
                 member_gain: Sequence[float] | None = None, member_bias: Sequence[float] | None = None,
                 normalize: bool = True, conservative_lambda: float = 0.0, max_len: int = 128, batch_size: int = 128,
                 heldout_spread: float | None = None):
        if not members:
            raise ValueError("a RewardScorer needs at least one member model")
        k = len(members)
        self.members = [m.eval() for m in members]
        self.tokenizer = tokenizer
        self.gain, self.bias = float(gain), float(bias)
        self.member_gain = torch.tensor(list(member_gain) if member_gain is not None else [1.0] * k, dtype=torch.float32)
        self.member_bias = torch.tensor(list(member_bias) if member_bias is not None else [0.0] * k, dtype=torch.float32)
        if self.member_gain.numel() != k or self.member_bias.numel() != k:
            raise ValueError(f"member_gain/member_bias need one value per member ({k}), "
                             f"got {self.member_gain.numel()}/{self.member_bias.numel()}")
        self.normalize = bool(normalize)
        self.conservative_lambda = float(conservative_lambda)
        if self.conservative_lambda < 0:
            raise ValueError(f"reward_model.conservative_lambda must be >= 0, got {conservative_lambda}")
        self.max_len, self.batch_size = int(max_len), int(batch_size)
        self.heldout_spread = heldout_spread  # an ensemble's disagreement on its held-out pairs (eval/gold_rm_std_ratio)
        self.shared_prefix = False  # inside sharing_prefixes()

    @classmethod
    def from_path(cls, path, normalize: bool = True, conservative_lambda: float = 0.0,
                  options: dict | None = None, key: str = "reward model") -> "RewardScorer":
        """The RM artifact at `path` (named by config `key`, e.g. ``reward_model.path``, in its errors); `options`:
        dtype and attention implementation of its members (:func:`rlhf_lab.models.families.load_options`). Every
        member loads whole, its scalar head included: a missing member folder or a member whose weights do not fit
        its config.json is a :class:`~rlhf_lab.models.checkpoints.CheckpointError`."""
        from rlhf_lab.models.families import load_sequence_scorer, load_tokenizer

        path = Path(path)
        info = read_norm(path, key)
        tok = load_tokenizer(path, key)
        members = [load_sequence_scorer(path / MEMBER_DIR.format(i), tok, key, new_head=False,
                                        **(options or {})).eval() for i in range(int(info["n_members"]))]
        return cls(members, tok, info["gain"], info["bias"], info.get("member_gain"), info.get("member_bias"),
                   normalize=normalize, conservative_lambda=conservative_lambda, max_len=int(info.get("max_len", 128)),
                   heldout_spread=info.get(HELDOUT_SPREAD))

    def save_norm(self, path, extra: dict | None = None) -> None:
        info = {"n_members": len(self.members), "gain": self.gain, "bias": self.bias,
                "member_gain": self.member_gain.tolist(), "member_bias": self.member_bias.tolist(),
                "max_len": self.max_len, **(extra or {})}
        (Path(path) / NORM_FILE).write_text(json.dumps(info, indent=2))

    def to(self, device) -> "RewardScorer":
        self.members = [m.to(device) for m in self.members]
        return self

    @property
    def device(self) -> torch.device:
        return next(self.members[0].parameters()).device

    @torch.no_grad()
    def member_scores(self, prompts: Sequence[str], responses: Sequence[str], ended: Sequence[bool]) -> torch.Tensor:
        """Raw (unnormalised) scores of every member, [K, B] float32. With :attr:`shared_prefix`, where prompts repeat
        and every member is a decoder, the responses to one prompt share one pass over their common tokens
        (:meth:`shared_prefix_scores`)."""
        seqs = encode_texts(self.tokenizer, prompts, responses, ended, self.max_len)
        out = torch.zeros(len(self.members), len(seqs), dtype=torch.float32)
        if not seqs:
            return out
        if self.shared_prefix and len(set(prompts)) < len(prompts) and all(packable(m) for m in self.members):
            split = common_prefixes(seqs, list(prompts))
            if split is not None:
                return self.shared_prefix_scores(*split, out)
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))  # similar lengths share a batch
        dev = self.device
        for j in range(0, len(order), self.batch_size):
            idx = order[j : j + self.batch_size]
            ids, mask = pad_right([seqs[i] for i in idx], self.tokenizer.pad_token_id)
            ids, mask = ids.to(dev), mask.to(dev)
            for k, m in enumerate(self.members):
                out[k, idx] = rm_forward(m, ids, mask).float().cpu()
        return out

    @contextlib.contextmanager
    def sharing_prefixes(self):
        """Inside: :attr:`shared_prefix` (PPO's rollout scores with ``algo.shared_prompt``; evaluations stay out)."""
        self.shared_prefix = True
        try:
            yield
        finally:
            self.shared_prefix = False

    def shared_prefix_scores(self, prefixes: list[list[int]], group: list[int], suffixes: list[list[int]],
                             out: torch.Tensor) -> torch.Tensor:
        """``out`` [K, B] filled with each member's scores of ``prefixes[group[b]] + suffixes[b]``
        (:func:`rlhf_lab.models.shared_prefix.common_prefixes`), by :func:`rm_forward_shared` over whole prompts'
        rows, about ``batch_size`` rows a pass."""
        pad, dev = self.tokenizer.pad_token_id, self.device
        rows_of: dict[int, list[int]] = {}
        for i, g in enumerate(group):
            rows_of.setdefault(g, []).append(i)
        chunk: dict[int, int] = {}  # a pass's prompts: {prompt: its index in the pass}
        n_rows = 0
        for n, g in enumerate(rows_of):
            chunk[g] = len(chunk)
            n_rows += len(rows_of[g])
            if n + 1 < len(rows_of) and n_rows < self.batch_size:
                continue
            rows = [i for c in chunk for i in rows_of[c]]
            p_ids, p_mask = (t.flip(1).to(dev) for t in pad_right([prefixes[c][::-1] for c in chunk], pad))
            local = torch.tensor([chunk[group[i]] for i in rows], device=dev)
            s_ids, s_mask = (t.to(dev) for t in pad_right([suffixes[i] for i in rows], pad))
            for k, m in enumerate(self.members):
                out[k, rows] = rm_forward_shared(m, p_ids, p_mask, local, s_ids, s_mask).float().cpu()
            chunk, n_rows = {}, 0
        return out

    def standardized(self, raw: torch.Tensor) -> torch.Tensor:
        """Members' scores after their own standardisation, [K, B]."""
        return self.member_gain[:, None] * raw + self.member_bias[:, None]

    @property
    def n_members(self) -> int:
        return len(self.members)

    def scores_and_spread(self, prompts: Sequence[str], responses: Sequence[str],
                          ended: Sequence[bool]) -> tuple[torch.Tensor, torch.Tensor]:
        """The scorer's output and its members' disagreement on each sample: the population std of their standardised
        scores (0 for one member), in units of the SFT samples' spread the members were standardised on."""
        raw = self.member_scores(prompts, responses, ended)
        return self.combine(raw), self.spread(raw)

    def spread(self, raw: torch.Tensor) -> torch.Tensor:
        """The members' disagreement on each sample from raw member scores [K, B]: the population std of their
        standardised scores, [B] (the measure of ``rm/ensemble_std`` and ``eval/gold_rm_std``)."""
        return self.standardized(raw).std(0, correction=0)

    def combine(self, raw: torch.Tensor) -> torch.Tensor:
        """The scorer's output from raw member scores [K, B]."""
        if not self.normalize:
            return aggregate(raw, self.conservative_lambda)
        return self.gain * aggregate(self.standardized(raw), self.conservative_lambda) + self.bias

    def __call__(self, prompts: Sequence[str], responses: Sequence[str], ended: Sequence[bool]) -> torch.Tensor:
        return self.combine(self.member_scores(prompts, responses, ended))

    def score_tokens(self, policy_tokenizer, prompts: Sequence[str], response_ids: torch.Tensor,
                     response_mask: torch.Tensor, ended: Sequence[bool]) -> torch.Tensor:
        """Score policy samples given as token ids of the *policy's* tokenizer (decode, re-encode)."""
        from rlhf_lab.models.sampling import decode_responses

        return self(prompts, decode_responses(policy_tokenizer, response_ids, response_mask), ended)

    def fit_normalization(self, prompts: Sequence[str], responses: Sequence[str], ended: Sequence[bool]) -> dict:
        """Measure the normalisation on these samples (e.g. SFT samples): output mean 0, std 1 there."""
        raw = self.member_scores(prompts, responses, ended)
        if len(self.members) > 1:
            mg, mb = zip(*(affine_to_standard(r) for r in raw))
        else:
            mg, mb = (1.0,), (0.0,)
        self.member_gain = torch.tensor(mg, dtype=torch.float32)
        self.member_bias = torch.tensor(mb, dtype=torch.float32)
        self.gain, self.bias = affine_to_standard(self.standardized(raw).mean(0))
        return {"raw_mean": raw.mean(1).tolist(), "raw_std": raw.std(1, correction=0).tolist()}
