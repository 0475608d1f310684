"""The forward passes of PPO's trained roles: the policy's logits and hidden states at the positions that predict
the response tokens (padded, or packed without padding: :mod:`rlhf_lab.models.packing`), and the critic V(s_t),
a scalar head on a trunk of its own or on the policy's hidden states (``algo.critic=shared``, the shared-base
LoRA mode). The algorithm that uses them: :mod:`rlhf_lab.algorithms.ppo`.
"""

from __future__ import annotations

import torch
from torch import nn

from rlhf_lab.models.adapters import unwrap
from rlhf_lab.models.packing import backbone_of, packed_hidden
from rlhf_lab.models.sampling import positions
from rlhf_lab.models.shared_prefix import shared_prompt_hidden


def lm_forward(model, input_ids, attention_mask, query_len: int):
    """One pass of a causal LM returning (logits, last hidden state) at the positions that predict the
    response tokens (``query_len - 1`` to the second last) — the hidden state feeds a shared value head.
    Runs the backbone and the output embedding explicitly, so the hidden state is the normalised one the
    LM head reads, whatever the architecture; the head skips the prompt positions."""
    lm = unwrap(model)
    backbone = getattr(lm, lm.base_model_prefix)
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions(attention_mask),
                      use_cache=False).last_hidden_state[:, query_len - 1 : -1]  # no cache: a recompute would extend it
    return lm.get_output_embeddings()(hidden), hidden


def lm_forward_packed(model, input_ids, position_ids, response_index, compiled: bool = False):
    """:func:`lm_forward` on a rollout packed without padding (:func:`rlhf_lab.models.sampling.pack_rollout`):
    (logits, last hidden state) [B, T, ·] at the positions that predict the response tokens. ``compiled``: the
    trunk through ``torch.compile`` (:func:`rlhf_lab.models.packing.compiled_trunk`)."""
    hidden = packed_hidden(model, input_ids, position_ids, compiled)[response_index]
    return unwrap(model).get_output_embeddings()(hidden), hidden


def lm_forward_shared(model, q_ids, q_mask, r_ids, r_mask, groups):
    """:func:`lm_forward` with each distinct prompt run once for the rows that share it (``algo.shared_prompt``;
    ``groups``: :func:`rlhf_lab.models.batching.prompt_groups`): (logits, last hidden state) [B, T, ·]."""
    hidden = shared_prompt_hidden(backbone_of(model), q_ids, q_mask, r_ids, r_mask, groups)
    return unwrap(model).get_output_embeddings()(hidden), hidden


def checkpoint_activations(model) -> list[nn.Module]:
    """Hugging Face activation checkpointing of `model`'s decoder layers (``algo.activation_checkpointing``), without
    re-entry (``torch.utils.checkpoint(use_reentrant=False)``): a layer run with gradients keeps only its inputs and
    recomputes the rest in the backward. Returns the checkpointed layers. Transformers checkpoints a layer only while
    it is in training mode, and PPO runs in eval mode (no dropout): :func:`train_checkpointed` sets the layers' own
    flag, not their submodules' (dropout stays off). A family without the support is a ValueError naming the key."""
    lm = unwrap(model)
    if not getattr(lm, "supports_gradient_checkpointing", False):
        raise ValueError(f"algo.activation_checkpointing=true, but {type(lm).__name__} does not support activation "
                         "checkpointing in transformers: set algo.activation_checkpointing=false")
    kwargs = {"use_reentrant": False}
    if hasattr(lm, "activation_checkpointing_enable"):  # transformers >= 5.x's name; gradient_... is its old alias
        lm.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    layers = [m for m in lm.modules() if m is not lm and getattr(m, "gradient_checkpointing", False)
              and not hasattr(m, "base_model_prefix")]  # the layers, not the model classes that hold them
    if not layers:
        raise ValueError(f"algo.activation_checkpointing=true, but no layer of {type(lm).__name__} was checkpointed: "
                         "set algo.activation_checkpointing=false")
    return layers


def train_checkpointed(layers: list[nn.Module]) -> None:
    """The checkpointed layers' own ``training`` flag on (transformers checkpoints only in training mode), their
    submodules left as they are (in eval mode: no dropout); a pass without gradients is not checkpointed."""
    for layer in layers:
        layer.training = True


class ValueModel(nn.Module):
    """The critic V(s_t): a scalar head on a transformer backbone's last hidden state.

    ``backbone=None`` (shared-base mode): the head reads hidden states the policy pass computed."""

    def __init__(self, backbone: nn.Module | None, hidden_size: int, init_head: nn.Linear | None = None):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1)
        with torch.no_grad():
            if init_head is not None:  # InstructGPT: the value function starts as the reward model
                self.head.weight.copy_(init_head.weight.reshape(1, -1))
                self.head.bias.copy_(init_head.bias if init_head.bias is not None else torch.zeros(1))
            else:
                self.head.weight.zero_()
                self.head.bias.zero_()

    def forward(self, input_ids, attention_mask, query_len: int, hidden=None):
        """Values [B, T] of the states before each response token (aligned with response_logprobs).
        ``hidden``: the policy's hidden states at those positions (shared-base mode), from ``lm_forward``."""
        if hidden is None:
            hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions(
                attention_mask), use_cache=False).last_hidden_state[:, query_len - 1 : -1]
        return self.head(hidden).squeeze(-1).float()

    def forward_packed(self, input_ids, position_ids, response_index, hidden=None, compiled: bool = False):
        """:meth:`forward` on a rollout packed without padding (``sampling.pack_rollout``); ``compiled`` as in
        :func:`lm_forward_packed`."""
        if hidden is None:
            hidden = packed_hidden(self.backbone, input_ids, position_ids, compiled)[response_index]
        return self.head(hidden).squeeze(-1).float()

    def forward_shared(self, q_ids, q_mask, r_ids, r_mask, groups, hidden=None):
        """:meth:`forward` with each distinct prompt run once (:func:`lm_forward_shared`)."""
        if hidden is None:
            hidden = shared_prompt_hidden(self.backbone, q_ids, q_mask, r_ids, r_mask, groups)
        return self.head(hidden).squeeze(-1).float()
