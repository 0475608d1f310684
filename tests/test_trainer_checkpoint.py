"""The trainers' checkpoint writer (stages.training.FileCheckpointIO): the checkpoint streamed to its file, never held
whole in memory as Lightning's own writer does (issue 70: the end-of-job checkpoint of full-fine-tuning PPO)."""

from __future__ import annotations

import tracemalloc

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from rlhf_lab.stages.training import FileCheckpointIO, trainer_kwargs
from tests.conftest import compose_cfg

MB = 2 ** 20


def python_peak(fn) -> int:
    """Peak bytes Python's allocator held during `fn()` (where Lightning's in-memory copy lives; torch's own
    tensors and the zip writer's C++ buffers are not traced)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_checkpoint_is_streamed_to_its_file_with_lightnings_bytes(tmp_path):
    ckpt = {"state_dict": {"w": torch.arange(8 * MB, dtype=torch.float32)}, "epoch": 3}  # 32 MiB
    ours, theirs = tmp_path / "sub" / "ours.ckpt", tmp_path / "theirs.ckpt"
    lightning_peak = python_peak(lambda: TorchCheckpointIO().save_checkpoint(ckpt, theirs))
    our_peak = python_peak(lambda: FileCheckpointIO().save_checkpoint(ckpt, ours))
    assert lightning_peak > 32 * MB  # the whole checkpoint in a BytesIO: what this writer avoids
    assert our_peak < 4 * MB
    assert ours.read_bytes() == theirs.read_bytes()  # the same file
    assert [p.name for p in ours.parent.iterdir()] == ["ours.ckpt"]  # no temporary left beside it
    back = torch.load(ours, weights_only=True)
    assert torch.equal(back["state_dict"]["w"], ckpt["state_dict"]["w"]) and back["epoch"] == 3


def test_every_stage_trainer_writes_checkpoints_with_it(tmp_path):
    import lightning as L

    kw = trainer_kwargs(compose_cfg(["algo=ppo", "trainer.progress_bar=false"]), tmp_path, 2, "ppo")
    trainer = L.Trainer(**kw, logger=False)
    assert isinstance(trainer.strategy.checkpoint_io, FileCheckpointIO)
