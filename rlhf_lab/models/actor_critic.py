"""The forward passes of PPO's trained roles: the policy's logits and hidden states at the positions that predict
the response tokens (padded, or packed without padding: :mod:`rlhf_lab.models.packing`), and the critic V(s_t),
a scalar head on a trunk of its own or on the policy's hidden states (``algo.critic=shared``, the shared-base
LoRA mode). The algorithm that uses them: :mod:`rlhf_lab.algorithms.ppo`.
"""

from __future__ import annotations

import torch
from torch import nn

from rlhf_lab.models.adapters import unwrap
from rlhf_lab.models.packing import packed_hidden
from rlhf_lab.models.sampling import positions


def lm_forward(model, input_ids, attention_mask, query_len: int):
    """One pass of a causal LM returning (logits, last hidden state) at the positions that predict the
    response tokens (``query_len - 1`` to the second last) — the hidden state feeds a shared value head.
    Runs the backbone and the output embedding explicitly, so the hidden state is the normalised one the
    LM head reads, whatever the architecture; the head skips the prompt positions."""
    lm = unwrap(model)
    backbone = getattr(lm, lm.base_model_prefix)
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask,
                      position_ids=positions(attention_mask)).last_hidden_state[:, query_len - 1 : -1]
    return lm.get_output_embeddings()(hidden), hidden


def lm_forward_packed(model, input_ids, position_ids, response_index, compiled: bool = False):
    """:func:`lm_forward` on a rollout packed without padding (:func:`rlhf_lab.models.sampling.pack_rollout`):
    (logits, last hidden state) [B, T, ·] at the positions that predict the response tokens. ``compiled``: the
    trunk through ``torch.compile`` (:func:`rlhf_lab.models.packing.compiled_trunk`)."""
    hidden = packed_hidden(model, input_ids, position_ids, compiled)[response_index]
    return unwrap(model).get_output_embeddings()(hidden), hidden


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
            hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                                   position_ids=positions(attention_mask)).last_hidden_state[:, query_len - 1 : -1]
        return self.head(hidden).squeeze(-1).float()

    def forward_packed(self, input_ids, position_ids, response_index, hidden=None, compiled: bool = False):
        """:meth:`forward` on a rollout packed without padding (``sampling.pack_rollout``); ``compiled`` as in
        :func:`lm_forward_packed`."""
        if hidden is None:
            hidden = packed_hidden(self.backbone, input_ids, position_ids, compiled)[response_index]
        return self.head(hidden).squeeze(-1).float()
