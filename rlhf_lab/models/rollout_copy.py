"""``generation.dtype``: the model the PPO family samples its rollouts from, a copy of the policy in a lower precision.

Decoding a few sequences reads every weight once per token, so on a machine where that read bounds it (CPU at the
0.5B shape: ``benchmarks.ops.bounds``) weights of half the bytes decode faster. :class:`RolloutCopy` builds the copy
once (the policy deep-copied with its parameters cast to the dtype; buffers such as rotary frequencies stay as
they are, as when transformers loads a checkpoint in that dtype) and, before each rollout, copies into it the
policy's trainable parameters (LoRA: the adapters; full fine-tuning: all of them), the only ones an update changes,
with ``Tensor.copy_`` (the same rounding as ``Tensor.to``). The responses are then drawn from the copy, while every
other pass of the step uses the policy: the samples are slightly off-policy (docs/configuration.md, ``generation``).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from rlhf_lab.config.errors import ConfigError
from rlhf_lab.models.sharding import is_sharded


# The fix a ConfigError on generation.dtype gives for a sharded policy (here and at composition, config.checks)
SHARDED_FIX = ("null with trainer=fsdp / fsdp_cpu (a sharded policy has no whole copy to sample from), or use "
               "trainer=ddp / ddp_cpu")


def torch_dtype(name) -> torch.dtype:
    """The torch dtype of a ``generation.dtype`` name (``bfloat16``, ``float16``, ``float32``); ConfigError else."""
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ConfigError("generation.dtype", str(name), "null (the policy's own dtype), bfloat16, float16 or float32")
    return dtype


def cast_copy(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A deep copy of `model` whose parameters are `dtype` (never a full-precision copy first: each parameter is
    cast as it is copied), frozen and in eval mode; buffers copied as they are."""
    memo = {id(p): nn.Parameter(p.detach().to(dtype=dtype, copy=True), requires_grad=False)
            for p in model.parameters()}
    out = copy.deepcopy(model, memo)
    return out.requires_grad_(False).eval()


class RolloutCopy:
    """The low-precision copy of `policy` that :meth:`model` returns refreshed: build once, then before each rollout
    ``sampler_model = rollout_copy.model()``."""

    def __init__(self, policy: nn.Module, dtype):
        if is_sharded(policy):
            raise ConfigError("generation.dtype", str(dtype), SHARDED_FIX)
        self.policy, self.dtype = policy, torch_dtype(dtype)
        if all(p.dtype == self.dtype for p in policy.parameters()):  # already in that dtype: the policy itself
            self.copy, self.pairs = policy, []
            return
        self.copy = cast_copy(policy, self.dtype)
        own = dict(self.copy.named_parameters())
        # (the policy's trainable parameter, the copy's): what an optimizer step can change
        self.pairs = [(p, own[name]) for name, p in policy.named_parameters() if p.requires_grad]

    @torch.no_grad()
    def refresh(self) -> None:
        """The copy's trainable parameters set to the policy's, cast to the dtype."""
        for src, dst in self.pairs:
            if dst.device != src.device:  # the policy moved (Lightning's setup): the copy follows it
                self.copy.to(src.device)
            dst.copy_(src)

    def model(self) -> nn.Module:
        """The copy, refreshed from the policy."""
        self.refresh()
        return self.copy
