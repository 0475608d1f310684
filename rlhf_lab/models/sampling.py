"""Batched sampling and per-token log-probs for decoder policies.

Prompts are left-padded for generation; responses come back right-padded, with the EOS token inside
the mask and padding after it. Every forward pass gets explicit position ids (cumsum of the attention
mask), so left padding does not shift positions, whatever the architecture.

Two samplers (``generation.sampler``): ``hf``, Hugging Face ``model.generate``; and ``lab`` (the default),
:func:`kv_generate`, a KV-cache loop of our own that reproduces ``generate``'s decoding for ``sample``'s settings
step for step (the same forward passes, their float32 CPU linears through oneDNN to float32 rounding, the same
warpers in the same order, the same draw from torch's random number generator), so that under the same seed it
returns the same tokens, with less per-token overhead
(tests/test_sampling.py checks the equality on every tested architecture; ``benchmarks.run --only sampling``
measures the gain). A model the loop cannot reproduce ``generate`` for (:func:`lab_unsupported`) is sampled
with ``generate``.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlhf_lab.config.choices import Sampler
from rlhf_lab.config.errors import ConfigError
from rlhf_lab.models.adapters import unwrap
from rlhf_lab.models.batching import prompt_groups
from rlhf_lab.models.onednn import onednn_linears

try:
    from transformers.cache_utils import DynamicLayer as CacheLayer
except ImportError:  # transformers before cache layers (< 4.56): decode_loop lets the model build its own cache
    CacheLayer = object

log = logging.getLogger(__name__)

DEFAULT_SAMPLER = Sampler.lab
# generation_config keys that do not change the tokens ``generate`` draws for ``sample``'s arguments: token ids,
# output switches, and the sampling keys ``sample`` passes itself (``use_cache`` must be true: see lab_unsupported)
NEUTRAL_GENERATION_KEYS = frozenset({
    "pad_token_id", "bos_token_id", "eos_token_id", "_from_model_config", "transformers_version",
    "output_attentions", "output_hidden_states", "do_sample", "temperature", "top_k", "top_p", "max_length",
    "max_new_tokens", "use_cache"})


@dataclass
class Rollout:
    prompts: list[str]
    query_ids: torch.Tensor  # [B, P] left-padded
    query_mask: torch.Tensor  # [B, P]
    response_ids: torch.Tensor  # [B, T] right-padded
    response_mask: torch.Tensor  # [B, T], 1 up to and including EOS
    responses: list[str]
    ended: list[bool]  # whether the response ended with EOS (else it hit max_new_tokens)

    @property
    def lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)


def encode_prompts(tokenizer, prompts: list[str], max_prompt_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    if max_prompt_len is not None and enc.input_ids.shape[1] > max_prompt_len:
        longest = max(prompts, key=len)
        raise ConfigError("generation.max_prompt_len", max_prompt_len,
                          f"at least {enc.input_ids.shape[1]} tokens, the longest prompt here (e.g. {longest[:60]!r}), "
                          "or null (no limit)")
    return enc.input_ids, enc.attention_mask


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def trim_padding(query_ids, query_mask, response_ids, response_mask):
    """Some rows of a rollout (left-padded prompts, right-padded responses) without the columns that are padding
    in all of them: the prompts' common left padding and the responses' common right padding. The remaining
    tokens keep their positions (the cumsum of the mask), so a forward pass gives the same log-probs and values
    at the remaining response positions. Returns the four tensors, trimmed."""
    start = query_mask.shape[1] - max(1, int(query_mask.sum(1).max()))
    T = max(1, int(response_mask.sum(1).max()))
    return query_ids[:, start:], query_mask[:, start:], response_ids[:, :T], response_mask[:, :T]


def pack_rollout(query_ids, query_mask, response_ids, response_mask,
                 pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of a rollout (left-padded prompts, right-padded responses) packed without padding
    (:func:`rlhf_lab.models.batching.pack_rows` on each row's prompt + response tokens, :mod:`rlhf_lab.models.packing`).
    Returns the packed ids and position ids [R, W] and ``response_index`` [B, T]: for each response token, the
    index in the flattened [R * W] rows of the position whose output predicts it (the token before it); 0 where
    the response mask is 0. On the rollout's device."""
    from rlhf_lab.models.batching import pack_rows

    q_len, r_len = query_mask.sum(1), response_mask.sum(1)
    seqs = [q[len(q) - n:] + r[:k] for q, r, n, k in
            zip(query_ids.tolist(), response_ids.tolist(), q_len.tolist(), r_len.tolist())]
    ids, pos, last = pack_rows(seqs, pad_id)
    t = torch.arange(response_ids.shape[1])
    index = torch.where(t[None, :] < r_len.cpu()[:, None], last[:, None] - r_len.cpu()[:, None] + t[None, :], 0)
    dev = response_ids.device
    return ids.to(dev), pos.to(dev), index.to(dev)


def response_mask_from_ids(response_ids: torch.Tensor, eos_id: int) -> tuple[torch.Tensor, list[bool]]:
    is_eos = response_ids == eos_id
    # 1 up to and including the first EOS
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    mask = (~after_eos).long()
    ended = is_eos.any(-1).tolist()
    return mask, ended


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], max_new_tokens: int, temperature: float = 1.0,
           top_k: int = 0, top_p: float = 1.0, max_prompt_len: int | None = None,
           sampler: str = DEFAULT_SAMPLER, shared_prompts: bool = False) -> Rollout:
    """Sample one response per prompt with KV-cached decoding: ``sampler`` ``lab`` (:func:`kv_generate`, falling
    back to ``generate`` where :func:`lab_unsupported` says why) or ``hf`` (Hugging Face ``generate``); both draw
    the same tokens under the same seed. ``temperature`` 0: greedy. ``shared_prompts`` (``algo.shared_prompt``):
    the lab sampler's prefill runs each distinct prompt once."""
    if temperature < 0:
        raise ValueError(f"generation.temperature must be >= 0, got {temperature}")
    if sampler not in tuple(Sampler):
        raise ValueError(f"generation.sampler={sampler!r}; choose one of {', '.join(Sampler)}")
    q_ids, q_mask = encode_prompts(tokenizer, prompts, max_prompt_len)
    dev = next(model.parameters()).device
    q_ids, q_mask = q_ids.to(dev), q_mask.to(dev)
    was_training = model.training
    model.eval()
    try:
        if sampler == "lab" and not _fallback(model, tokenizer):
            r_ids = kv_generate(model, q_ids, q_mask, max_new_tokens, tokenizer.eos_token_id, tokenizer.pad_token_id,
                                temperature, top_k, top_p, shared_prompts)
        else:
            r_ids = hf_generate(model, q_ids, q_mask, max_new_tokens, tokenizer.eos_token_id,
                                tokenizer.pad_token_id, temperature, top_k, top_p)
    finally:
        model.train(was_training)
    mask, ended = response_mask_from_ids(r_ids, tokenizer.eos_token_id)
    r_ids = torch.where(mask.bool(), r_ids, torch.full_like(r_ids, tokenizer.pad_token_id))
    texts = decode_responses(tokenizer, r_ids, mask)
    return Rollout(list(prompts), q_ids, q_mask, r_ids, mask, texts, ended)


def hf_generate(model, q_ids, q_mask, max_new_tokens: int, eos_id: int, pad_id: int, temperature: float = 1.0,
                top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The tokens Hugging Face ``generate`` appends to the left-padded prompts [B, P]: [B, T], T <= max_new_tokens
    (pad after a row's EOS). Each process decodes on its own (``synced_gpus=False``, which ``generate`` would
    otherwise turn on for a sharded model: a sharded model is sampled inside ``sharding.gathered``)."""
    kwargs = dict(do_sample=temperature > 0, max_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=eos_id,
                  synced_gpus=False)
    if temperature > 0:
        kwargs.update(temperature=temperature, top_k=int(top_k or 0), top_p=float(top_p))
    return model.generate(input_ids=q_ids, attention_mask=q_mask, **kwargs)[:, q_ids.shape[1]:]


_WARNED: set[str] = set()


def _fallback(model, tokenizer) -> bool:
    """Whether ``lab`` falls back to ``generate`` for this model (warned once per reason)."""
    why = lab_unsupported(model, tokenizer)
    if why and why not in _WARNED:
        _WARNED.add(why)
        log.warning("generation.sampler=lab: sampling with Hugging Face generate instead, %s", why)
    return why is not None


def lab_unsupported(model, tokenizer) -> str | None:
    """Why :func:`kv_generate` cannot reproduce ``generate`` for this model and tokenizer (None: it can): an
    encoder-decoder; a forward without a KV cache or position ids; a generation_config that asks ``generate``
    for more than ``sample``'s settings (e.g. a repetition penalty, or no cache); no pad or EOS token."""
    base = unwrap(model)
    if getattr(base, "config", None) is None:
        return f"{type(base).__name__} has no transformers config"
    if getattr(base.config, "is_encoder_decoder", False):
        return "the model is an encoder-decoder"
    if cache_argument(base) is None or "position_ids" not in inspect.signature(base.forward).parameters:
        return f"{type(base).__name__}.forward takes no KV cache or no position_ids"
    gc = getattr(base, "generation_config", None)
    diff = gc.to_diff_dict() if gc is not None else {}
    extra = {k: v for k, v in diff.items() if k not in NEUTRAL_GENERATION_KEYS}
    if gc is not None and gc.use_cache is False:
        extra["use_cache"] = False
    if extra:
        return f"the model's generation_config sets {extra}"
    if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
        return "the tokenizer has no pad or no EOS token"
    return None


def cache_argument(base) -> str | None:
    """The name of the KV-cache argument of the model's forward (``cache`` in transformers 5, ``past_key_values``
    before), None if it takes none."""
    params = inspect.signature(base.forward).parameters
    return next((name for name in ("cache", "past_key_values") if name in params), None)


def kv_generate(model, q_ids, q_mask, max_new_tokens: int, eos_id: int, pad_id: int, temperature: float = 1.0,
                top_k: int = 0, top_p: float = 1.0, shared_prompts: bool = False) -> torch.Tensor:
    """What :func:`hf_generate` returns, by a KV-cache loop of our own: [B, T], T <= max_new_tokens.

    As ``generate`` does (transformers' ``GenerationMixin._sample``): one prefill forward over the left-padded prompts
    with position ids cumsum(mask) − 1 (the mask dropped when nothing is padded), then one forward per token with
    the model's cache, the mask grown by one and the positions by one; the LM head on the last position only; the
    float32 logits through :func:`warp_scores`, softmax, one draw per row (:func:`draw_tokens`, every row, finished
    ones too) or argmax when ``temperature`` is 0; finished rows get the pad token; it stops when every row has
    emitted EOS or after ``max_new_tokens``. The decode steps take the padding mask as the 4-D boolean mask that
    transformers' SDPA masking would build from it (for SDPA attention with no sliding or linear layers), which
    saves building it at every step. The loop runs in ``torch.inference_mode`` (less bookkeeping per operation than
    ``no_grad``, the same arithmetic), with the model's float32 CPU linears through oneDNN with their weights
    reordered once for the whole loop (:func:`~rlhf_lab.models.onednn.onednn_linears`: the same products summed in
    another order, so logits equal ``generate``'s to float32 rounding and the tokens with them unless a draw falls
    within that rounding of a boundary); the tokens come back as an ordinary tensor. With ``shared_prompts``, rows
    with the same prompt share its prefill: each distinct prompt runs once and its KV cache and logits are indexed out
    to its rows (:func:`rlhf_lab.models.batching.prompt_groups`; the same logits to float32 rounding)."""
    with torch.inference_mode(), onednn_linears(model, q_ids.shape[0]):
        out = decode_loop(model, q_ids, q_mask, max_new_tokens, eos_id, pad_id, temperature, top_k, top_p,
                          shared_prompts)
    return out.clone()  # outside inference mode: a tensor autograd may use later (e.g. as embedding indices)


def decode_loop(model, q_ids, q_mask, max_new_tokens: int, eos_id: int, pad_id: int, temperature: float,
                top_k: int, top_p: float, shared_prompts: bool = False) -> torch.Tensor:
    """:func:`kv_generate`'s loop."""
    base = unwrap(model)
    cache_kw = cache_argument(base)
    B, P = q_ids.shape
    padded = not bool(q_mask.bool().all())
    full_mask = torch.cat([q_mask, q_mask.new_ones(B, max_new_tokens)], dim=1) if padded else None
    pos = positions(q_mask)
    extra = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(base.forward).parameters else {}
    out = q_ids.new_full((B, max_new_tokens), pad_id)
    unfinished = torch.ones(B, dtype=torch.long, device=q_ids.device)
    inputs, attn, step_mask = q_ids, q_mask if padded else None, full_mask
    cache = preallocated_cache(base, P + max_new_tokens)
    group, pos_in = None, pos
    if shared_prompts:
        first, rows_prompt = prompt_groups(q_ids, q_mask)
        if len(first) < B:  # the prefill over each distinct prompt once
            group, inputs, pos_in, attn = rows_prompt, q_ids[first], pos[first], (q_mask[first] if padded else None)
    for t in range(max_new_tokens):
        res = model(input_ids=inputs, attention_mask=attn, position_ids=pos_in, use_cache=True, **{cache_kw: cache},
                    **extra)
        cache = res[cache_kw]
        logits = res.logits
        if t == 0 and group is not None:  # the prefill's keys, values and logits out to the prompts' rows
            cache.batch_select_indices(group)
            logits = logits[group]
        if t == 0 and padded and sdpa_mask_ok(base, cache):
            step_mask = full_mask.bool()[:, None, None, :]
        scores = logits[:, -1].to(copy=True, dtype=torch.float32)
        if temperature > 0:
            nxt = draw_tokens(F.softmax(warp_scores(scores, temperature, top_k, top_p), dim=-1))
        else:
            nxt = scores.argmax(-1)
        nxt = nxt * unfinished + pad_id * (1 - unfinished)
        out[:, t] = nxt
        unfinished = unfinished & (nxt != eos_id)
        if not bool(unfinished.any()):
            return out[:, : t + 1]
        inputs, pos = nxt[:, None], pos[:, -1:] + 1
        pos_in = pos
        if padded:
            attn = step_mask[..., : P + t + 1]
    return out


def preallocated_cache(base, capacity: int):
    """The cache :func:`decode_loop` starts from: transformers' ``DynamicCache`` for the model's config with each
    full-attention layer a :class:`PreallocatedLayer` of `capacity` positions (sliding-window or linear-attention
    layers stay transformers' own); None (the model builds its own cache) where transformers has no such cache."""
    if CacheLayer is object:
        return None
    from transformers.cache_utils import DynamicCache

    try:
        cache = DynamicCache(config=base.config)
    except (TypeError, ValueError, AttributeError):  # a config transformers' cache cannot read
        return None
    layers = getattr(cache, "layers", None)
    if not layers:
        return None
    cache.layers = [PreallocatedLayer(capacity) if type(layer) is CacheLayer else layer for layer in layers]
    return cache


class PreallocatedLayer(CacheLayer):
    """A full-attention KV-cache layer whose keys and values live in buffers allocated once, for `capacity`
    positions (prompt + new tokens), each update written in place and the filled part returned as a view.
    transformers' ``DynamicLayer`` concatenates instead, copying the whole cache at every token; the attention
    sees the same keys and values either way (the samplers' tokens are identical, tests/test_sampling.py). Past
    `capacity` the buffers double."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity, self.length = int(capacity), 0

    @staticmethod
    def positions(like: torch.Tensor, n: int) -> torch.Tensor:
        """An uninitialised buffer [batch, heads, n, head_dim] shaped, typed and placed like `like`."""
        return like.new_empty(*like.shape[:2], n, like.shape[-1])

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> None:
        self.device = key_states.device
        self._keys = self.positions(key_states, self.capacity)
        self._values = self.positions(value_states, self.capacity)
        self.keys, self.values = self._keys[:, :, :0], self._values[:, :, :0]
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self._keys.shape[-2]:
            grow = max(end, 2 * self._keys.shape[-2]) - self._keys.shape[-2]
            self._keys = torch.cat([self._keys, self.positions(self._keys, grow)], dim=-2)
            self._values = torch.cat([self._values, self.positions(self._values, grow)], dim=-2)
        self._keys[:, :, self.length:end] = key_states
        self._values[:, :, self.length:end] = value_states
        self.length = end
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """The rows ``indices`` of the buffers (a shared prefill's prompts out to their rows)."""
        if self.is_initialized:
            self._keys, self._values = self._keys[indices], self._values[indices]
            self.keys, self.values = self._keys[:, :, :self.length], self._values[:, :, :self.length]


def sdpa_mask_ok(base, cache) -> bool:
    """Whether the decode steps may take the padding mask as a 4-D boolean mask: SDPA attention (the mask
    transformers builds for it at one query position is the padding mask, broadcast) and a cache of full
    attention layers only."""
    if getattr(base.config, "_attn_implementation", None) != "sdpa":
        return False
    return not any(getattr(cache, "is_sliding", [True])) and not any(getattr(cache, "is_linear", [False]))


def warp_scores(scores: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The scores [B, V] after transformers' sampling warpers for these settings, in ``generate``'s order and with
    its arithmetic: ``TemperatureLogitsWarper`` (unless 1), ``TopKLogitsWarper`` (k > 0), ``TopPLogitsWarper``
    (p < 1); removed tokens get −inf."""
    if temperature != 1.0:
        scores = scores / temperature
    if top_k:
        k = min(max(int(top_k), 1), scores.size(-1))
        scores = scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        remove = sorted_scores.softmax(dim=-1).cumsum(dim=-1) <= (1 - float(top_p))
        remove[..., -1:] = 0  # keep at least one token
        scores = scores.masked_fill(remove.scatter(1, order, remove), float("-inf"))
    return scores


def draw_tokens(probs: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs`` [B, V]: the token ``torch.multinomial(probs, 1)`` draws, consuming the same
    random numbers.

    On CPU, torch draws a single sample as argmax(p / E), E ~ Exp(1) from ``exponential_``, each E being
    −log1p(−u) for a double-precision uniform u; the same uniforms come from ``torch.rand(..., dtype=float64)``
    and the vectorised transform is cheaper than ``exponential_``'s serial one. Elsewhere: ``torch.multinomial``
    itself. ``probs`` come from a softmax (no negative value); a row with a NaN (NaN logits, or every token
    filtered) is an error, as in ``torch.multinomial`` (argmax picks a NaN where there is one, so checking the
    picked values suffices)."""
    if probs.device.type != "cpu":
        return torch.multinomial(probs, num_samples=1).squeeze(1)
    noise = (-torch.log1p(-torch.rand(probs.shape, dtype=torch.float64, device=probs.device))).to(probs.dtype)
    ratio = probs / noise
    picked = ratio.argmax(-1)
    if bool(ratio.gather(-1, picked[:, None]).isnan().any()):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    return picked


def decode_responses(tokenizer, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    out = []
    for ids, m in zip(response_ids.tolist(), response_mask.tolist()):
        ids = [t for t, k in zip(ids, m) if k]
        out.append(tokenizer.decode(ids, skip_special_tokens=True).strip())
    return out


def response_logprobs(model, query_ids, query_mask, response_ids, response_mask, temperature: float = 1.0,
                      with_entropy: bool = False):
    """Per-token log π(y_t | x, y_<t) of the response tokens (logits divided by the sampling temperature).

    Returns logp [B, T] (0 where the mask is 0) and, if asked, the per-token entropy [B, T]. The LM head
    runs only at the T positions that predict response tokens (``logits_to_keep``), not over the prompt.
    """
    input_ids = torch.cat([query_ids, response_ids], dim=1)
    attn = torch.cat([query_mask, response_mask], dim=1)
    T = response_ids.shape[1]
    logits = model(input_ids=input_ids, attention_mask=attn, position_ids=positions(attn), logits_to_keep=T + 1).logits
    return token_logprobs(logits[:, :-1], response_ids, response_mask, temperature, with_entropy)


def logprobs_from_logits(logits, query_len: int, response_ids, response_mask, temperature: float = 1.0,
                         with_entropy: bool = False):
    """`response_logprobs` from the logits [B, P+T, V] of a forward pass over query + response."""
    return token_logprobs(logits[:, query_len - 1 : -1], response_ids, response_mask, temperature, with_entropy)


def token_logprobs(logits, token_ids, mask, temperature: float = 1.0, with_entropy: bool = False,
                   entropy_grad: bool = True):
    """log π of ``token_ids`` [B, T] from the logits [B, T, V] that predict them (0 where ``mask`` is 0),
    and, if asked, the per-token entropy (without a gradient when ``entropy_grad`` is false: a metric only)."""
    logits = logits.float()
    if temperature and temperature != 1.0:
        logits = logits / temperature
    logp_all = F.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1) * mask
    if not with_entropy:
        return logp
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(logp_all.exp() * logp_all).sum(-1) * mask
    return logp, entropy
