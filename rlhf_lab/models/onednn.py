"""fp32 linear layers on CPU through oneDNN with their weights reordered once, for passes without gradients.

``F.linear`` on CPU hands a float32 ``x @ W.T`` to a GEMM that lays the weight out for its kernel at every call. For
a decoding step, a few rows against every weight of the model, that copy is most of the work: at the 0.5b shape's
MLP (896 × 4864) a batch of 4 rows read the weight at 7-11 GB/s where one row (a GEMV) reads it at 30-43 GB/s
(``python -m benchmarks.ops.bounds`` measures the machine; issue 70). oneDNN's inner product with the weight reordered
beforehand into its blocked layout (``torch.ops.mkldnn._reorder_linear_weight`` and ``_linear_pointwise``, the pair
``torch.compile``'s freezing pass uses for CPU linears) reads it at 35-46 GB/s at 4 rows. The sums are the same
products added in another order: outputs agree with ``F.linear`` to float32 rounding (a relative 4e-7 measured), not
bit for bit in general (on some CPUs both end in the same kernel and agree to the bit).

:func:`onednn_linears` is a context: inside it every float32 ``nn.Linear`` of a CPU model (peft's LoRA layers keep
theirs as ``base_layer``) computes a forward that needs no gradient with its weight reordered when the context
opened, and any other forward (one autograd records) with ``F.linear``, so a training pass inside it is unchanged.
Reordering costs about a third of a 16-token decoding at the 0.5b shape (0.53 s for its 169 linears, 1.43 GB, on 2
cores), so the copy of a frozen weight (``requires_grad`` false: a LoRA policy's base, a frozen model) is kept beside
its layer and reused while the weight is the same tensor at the same version (an in-place change, e.g. a reference
synced from the policy, bumps the version and it is reordered again). A trained weight changes between rollouts, so
its copy is made anew at each context; the last one is held (:data:`LAST`) until the layer's next reorder, which frees
it just before allocating the new one. The allocator then hands the same memory back: freeing all of them when the
context closed gave the next rollout 1.4 GB of fresh pages to fault in (about 330,000 page faults a rollout at the
0.5b shape, 3-4 s of a GRPO full fine-tuning step on one core where the reorder itself takes 0.3 s; issue 70). It
costs one trained model's size of memory between rollouts. Outside CPU, for other dtypes, or where this torch lacks
the two operators (:func:`available`), it changes nothing.
"""

from __future__ import annotations

import contextlib
import weakref
from functools import partial
from typing import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F


def available() -> bool:
    """Whether this torch build has oneDNN and the two operators the reordered linears call."""
    ops = torch.ops.mkldnn
    return bool(torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
                and hasattr(ops, "_linear_pointwise"))


def reorderable(m: nn.Module) -> bool:
    """A float32 ``nn.Linear`` on CPU with a plain weight (not a sharded DTensor) whose forward is its class's (not
    already replaced)."""
    return (isinstance(m, nn.Linear) and type(m.weight.detach()) is torch.Tensor and m.weight.device.type == "cpu"
            and m.weight.dtype == torch.float32 and (m.bias is None or m.bias.dtype == torch.float32)
            and "forward" not in m.__dict__)


# a frozen linear -> (its weight's data pointer, its version, the weight reordered)
KEPT: "weakref.WeakKeyDictionary[nn.Linear, tuple[int, int, torch.Tensor]]" = weakref.WeakKeyDictionary()
# a trained linear -> its weight's last reordered copy, freed at the layer's next reorder (the memory reused)
LAST: "weakref.WeakKeyDictionary[nn.Linear, torch.Tensor]" = weakref.WeakKeyDictionary()


def kept(m: nn.Linear) -> bool:
    """Whether :data:`KEPT` holds a reordered copy of `m`'s frozen weight as it is now."""
    entry = KEPT.get(m)
    return (entry is not None and not m.weight.requires_grad
            and entry[:2] == (m.weight.detach().data_ptr(), m.weight._version))


def reordered(m: nn.Linear, rows: int) -> torch.Tensor:
    """`m`'s weight reordered for oneDNN: a frozen weight's kept copy while it is the same tensor at the same version
    (:data:`KEPT`), else a new one, kept when the weight is frozen, else held in :data:`LAST` (the previous copy freed
    first, so that the new one reuses its memory)."""
    if kept(m):
        return KEPT[m][2]
    KEPT.pop(m, None)
    LAST.pop(m, None)
    w = m.weight.detach()
    key = (w.data_ptr(), m.weight._version)
    out = torch.ops.mkldnn._reorder_linear_weight(w, batch_size=max(int(rows), 1))
    if m.weight.requires_grad:
        LAST[m] = out
    else:
        KEPT[m] = (*key, out)
    return out


def linear_forward(m: nn.Linear, weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """`m`'s forward with `weight` (its weight reordered) where no gradient is recorded and `x` is float32 on CPU;
    ``F.linear`` otherwise."""
    if (torch.is_grad_enabled() and (x.requires_grad or m.weight.requires_grad)) or x.dtype != torch.float32 \
            or x.device.type != "cpu":
        return F.linear(x, m.weight, m.bias)
    bias = None if m.bias is None else m.bias.detach()
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@contextlib.contextmanager
def onednn_linears(model: nn.Module, rows: int, kept_only: bool = False) -> Iterator[int]:
    """Inside: the reorderable linears of `model` (:func:`reorderable`) compute their gradient-free forwards through
    oneDNN with their weights as they are now, reordered for `rows` rows a call (the decoding batch; another
    number of rows is computed too, with the same result); with `kept_only` only those whose reordered copy is
    already kept (:func:`kept`: for passes of many rows, where a new copy costs more time than it saves, or memory
    a whole model's size for a frozen one). Yields how many linears it reordered; restores them on exit, also when
    the body raises. The weights must not change inside (a training step belongs outside)."""
    if not available():
        yield 0
        return
    done: list[nn.Module] = []
    try:
        for m in model.modules():
            if reorderable(m) and (not kept_only or kept(m)):
                m.forward = partial(linear_forward, m, reordered(m, rows))
                done.append(m)
        yield len(done)
    finally:
        for m in done:
            del m.forward
