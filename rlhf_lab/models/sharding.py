"""Sharded training (FSDP2, ``torch.distributed.fsdp.fully_shard``) of a trained model across the job's ranks.

``trainer=fsdp`` (GPUs, NCCL) and ``trainer=fsdp_cpu`` (CPU processes, gloo) run the job stage with Lightning's
``ModelParallelStrategy``. Each training LightningModule's ``configure_model`` hook calls :func:`shard` on the model
it trains: every transformer block (the classes a Hugging Face model lists in ``_no_split_modules``) becomes one
FSDP unit and the rest of the model (embeddings, final norm, head) one more, so that the lab's code may call the
trunk and the head separately, as it does. Each rank then keeps 1/N of the
trained parameters, of their gradients and of the optimizer's state; a unit's full parameters exist only while it
runs (all-gathered before, freed after). Frozen models (a DPO/PPO reference, the reward model) are not sharded:
they hold no gradients or optimizer state, and each rank keeps a full copy.

What runs on one rank only (evaluation, saving) needs the full parameters:

- :func:`gathered` (a context, entered on every rank): all-gathers every unit and keeps it whole until the context
  ends, so rank 0 can evaluate while the other ranks wait; training then goes on sharded.
- :func:`whole` (after training, on every rank): the trained model as a plain, unsharded module on rank 0 (its
  full state dict loaded into a fresh copy of the architecture), which the stage evaluates and saves exactly as
  a model trained on one process (``save_pretrained`` writes a full Hugging Face folder); None on other ranks.

Gradients are averaged over ranks by the reduce-scatter, as DDP's all-reduce does, so with each rank on its slice
of the global batch (``GlobalBatchSampler``) a sharded job follows the single-process one up to float rounding.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch

STRATEGY = "ModelParallelStrategy"  # the Lightning strategy under which the modules shard their model


def shards(target) -> bool:
    """Whether a ``trainer.strategy._target_`` (a dotted class path; or a class name) names the Lightning strategy
    :func:`shard` works under: ``trainer=fsdp*``."""
    return str(target or "").rsplit(".", 1)[-1] == STRATEGY


def shard_trained(module, model: torch.nn.Module, probe: Callable | None = None) -> None:
    """The ``configure_model`` hook of a training LightningModule `module` whose trained model is `model`: shard it
    when the trainer's strategy is the sharded one (:func:`shard`), leave it as it is otherwise."""
    if module._trainer is not None and shards(type(module.trainer.strategy).__name__):
        shard(model, module.device_mesh["data_parallel"], probe)


def _fsdp_modules(model: torch.nn.Module) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model: torch.nn.Module | None) -> bool:
    return model is not None and bool(_fsdp_modules(model))


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face model: its modules whose class is in ``_no_split_modules``."""
    names = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def hf_probe(model: torch.nn.Module, input_ids: torch.Tensor):
    """A forward of a Hugging Face model on `input_ids` (:func:`shard`'s default probe)."""
    return model(input_ids=input_ids)


def shard(model: torch.nn.Module, mesh, probe: Callable | None = None) -> torch.nn.Module:
    """Shard `model` in place over the 1-D device `mesh` (the strategy's ``data_parallel`` mesh): one FSDP unit per
    transformer block, one for the rest. `probe(model, input_ids)` runs one forward of the model (default: a Hugging
    Face model's, :func:`hf_probe`). Idempotent (Lightning may call ``configure_model`` twice)."""
    from torch.distributed.fsdp import fully_shard

    if is_sharded(model):
        return model
    if any(hasattr(m, "peft_config") for m in model.modules()):
        raise ValueError("sharded training (trainer=fsdp, trainer=fsdp_cpu) of a LoRA model is not supported: "
                         "set the stage's lora.r=0, or use trainer=ddp / ddp_cpu")
    units = blocks(model)
    if not units:
        raise ValueError(f"{type(model).__name__} lists no transformer block classes (_no_split_modules), so it "
                         "cannot be sharded block by block: use trainer=ddp / ddp_cpu")
    for b in units:
        fully_shard(b, mesh=mesh)
    in_blocks = {id(p) for b in units for p in b.parameters()}
    rest = [m for m in model.modules() if any(id(p) not in in_blocks for p in m.parameters(recurse=False))]
    if rest:  # embeddings, final norm, head: one group, so a tied embedding/head weight is one parameter
        fully_shard(rest, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # FSDP picks its root at the first forward, which must be the model's own; the lab's code may call the trunk
    # and the head directly (rm_forward, actor_critic), so run one tiny forward now (every rank is here)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        (probe or hf_probe)(model, torch.zeros((1, 1), dtype=torch.long, device=mesh.device_type))
    return model


@contextlib.contextmanager
def gathered(model: torch.nn.Module | None) -> Iterator[None]:
    """Keep every unit of a sharded `model` whole (all-gathered) inside the context, so that forward passes on any
    one rank need no communication (Hugging Face ``generate`` must then be called with ``synced_gpus=False``).
    Every rank must enter it. A no-op for a model that is not sharded."""
    units = _fsdp_modules(model) if model is not None else []
    if not units:
        yield
        return
    for u in units:
        u.set_reshard_after_forward(False, recurse=False)
    handles = [u.unshard(async_op=True) for u in units]
    for h in handles:
        if h is not None:
            h.wait()
    try:
        yield
    finally:
        for u in units:
            u.reshard()
            u.set_reshard_after_forward(True, recurse=False)


def full_state_dict(model: torch.nn.Module, everywhere: bool = False) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict of a sharded `model`: on rank 0 only, on the CPU (other ranks get an empty
    one), or with `everywhere` on every rank, on the model's device. Every rank must call it. A model that is not
    sharded: its ``state_dict()``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not is_sharded(model):
        return model.state_dict()
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=not everywhere))


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded parameter (a DTensor), or `t` itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def whole(model: torch.nn.Module) -> torch.nn.Module | None:
    """After training: the sharded `model` as a plain module of its own class on rank 0 (its full state dict
    loaded into a fresh instance built from ``model.config``), None on other ranks; `model` itself when it is
    not sharded. Every rank must call it."""
    from torch.distributed.fsdp import FSDPModule

    from rlhf_lab.runs.distributed import is_rank_zero

    if not is_sharded(model):
        return model
    sd = full_state_dict(model)
    if not is_rank_zero():
        return None
    cls = next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))
    with torch.device("meta"):
        plain = cls(model.config)
    plain.load_state_dict(sd, assign=True)
    for name, buf in model.named_buffers():  # sharding leaves buffers whole; non-persistent ones are not in `sd`
        owner, _, leaf = name.rpartition(".")
        sub = plain.get_submodule(owner)
        sub.register_buffer(leaf, buf.detach().clone(), persistent=leaf not in sub._non_persistent_buffers_set)
    if hasattr(plain, "tie_weights"):
        plain.tie_weights()
    if getattr(model, "generation_config", None) is not None:
        plain.generation_config = model.generation_config
    return plain.train(model.training)
