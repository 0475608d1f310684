"""Padding-free batches for decoders: sequences packed into rows (:func:`rlhf_lab.models.batching.pack_rows`) with position
ids that restart at every sequence. Given no attention mask and no cache, transformers derives the
block-diagonal causal mask from those position ids (its packed-sequence masks), so no compute is spent on
padding and the sequences do not see each other. :func:`check_packing` verifies that a model does this.
Used by RM training (``reward_model.packing``) and the PPO update (``algo.packing``).
"""

from __future__ import annotations

import functools

import torch

from rlhf_lab.models.adapters import unwrap

PACKING_PROBE = ([5, 9, 7, 11, 6], [8, 4, 10])  # two sequences of token ids (mod the vocabulary size)


def backbone_of(model) -> torch.nn.Module:
    """The transformer trunk of a (peft-wrapped) Hugging Face model (its ``base_model_prefix``), or the model
    itself when it is a trunk (a critic's backbone)."""
    hf = unwrap(model)
    trunk = getattr(hf, hf.base_model_prefix, None)
    return hf if trunk is None else trunk


def packed_hidden(model, input_ids: torch.Tensor, position_ids: torch.Tensor, compiled: bool = False) -> torch.Tensor:
    """The trunk's last hidden states of packed rows, flattened to [R * W, H] (index them with
    ``pack_rows``' last-token indices or ``sampling.pack_rollout``'s response indices). ``compiled``: through
    :func:`compiled_trunk` (``algo.compile``) instead of eagerly."""
    h = (compiled_trunk() if compiled else trunk_states)(backbone_of(model), input_ids, position_ids)
    return h.reshape(-1, h.shape[-1])


def trunk_states(trunk: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """A trunk's last hidden states [R, W, H] of packed rows."""
    return trunk(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state


@functools.cache
def compiled_trunk():
    """:func:`trunk_states` under ``torch.compile`` (inductor, ``dynamic=True``: one set of kernels for every row
    length), made once per process: the policy's, the critic's and the reference's trunks of one architecture share
    its compiled code, and a warm joblib worker's later jobs pay no compile. Fuses the trunk's elementwise
    operations; the arithmetic then differs from the eager pass by float noise."""
    return torch.compile(trunk_states, dynamic=True)


@torch.no_grad()
def check_packing(model, key: str) -> None:
    """Raises ValueError unless the model keeps sequences packed into one row apart: the trunk's last hidden
    state at the end of each of two short sequences, packed vs alone, must agree to 1% of its norm (float noise,
    also in bf16, is far below; attending across the sequences changes it by tens of percent). ``key``: the
    config key that turns packing off, named in the error."""
    from rlhf_lab.models.batching import pack_rows

    trunk = backbone_of(model)
    seqs = [[t % int(trunk.config.vocab_size) for t in s] for s in PACKING_PROBE]
    dev = next(trunk.parameters()).device
    was_training = trunk.training
    trunk.eval()
    try:
        ids, pos, last = (t.to(dev) for t in pack_rows(seqs, 0, width=sum(map(len, seqs))))
        packed = packed_hidden(trunk, ids, pos)[last].float()
        alone = torch.stack([trunk(input_ids=torch.tensor([s], device=dev), use_cache=False).last_hidden_state[0, -1]
                             for s in seqs]).float()
    finally:
        trunk.train(was_training)
    err = float(((packed - alone).norm(dim=-1) / alone.norm(dim=-1).clamp(min=1e-6)).max())
    if not err <= 1e-2:
        raise ValueError(f"{key}=true, but {type(unwrap(model)).__name__} mixes sequences packed into one row (their "
                         f"last hidden states differ by {100 * err:.1f}% from those of the sequences alone): "
                         f"set {key}=false")
