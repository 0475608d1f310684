"""An upstream stage built in the job's process leaves nothing behind (issue 70: a PPO job that trained its RM first
kept the RM's Lightning module, trainer and AdamW state, held in reference cycles, through its own steps)."""

from __future__ import annotations

import gc
import types
import weakref

import torch

from rlhf_lab.stages import pipeline
from tests.conftest import compose_cfg


class Fitted:
    """What a finished fit leaves: a model whose module and trainer refer to each other (as Lightning's do)."""

    def __init__(self):
        self.weights = torch.zeros(1024)
        self.trainer = types.SimpleNamespace(module=self)


def test_ensure_frees_what_an_upstream_stage_left_in_cycles(tmp_path, monkeypatch):
    left = []

    def build(cfg, out_dir, spec):
        fitted = Fitted()
        left.append(weakref.ref(fitted.weights))
        (out_dir / "model.txt").write_text("trained")
        return {"stage": "prefs"}

    stage = types.SimpleNamespace(WHAT="fake stage", spec=lambda cfg: {"fake": 1}, build=build)
    monkeypatch.setattr(pipeline, "stage_module", lambda name: stage)
    cfg = compose_cfg(["algo=ppo", f"cache_dir={tmp_path / 'cache'}"])
    enabled = gc.isenabled()
    gc.disable()  # only an explicit collection frees a cycle here: what a job sees when no full pass comes
    try:
        path = pipeline.ensure("prefs", cfg)
        assert (path / "model.txt").read_text() == "trained"
        assert len(left) == 1 and left[0]() is None  # the stage's tensors are gone when ensure returns
        pipeline.ensure("prefs", cfg)  # cached: nothing built, nothing to free
        assert len(left) == 1
    finally:
        if enabled:
            gc.enable()
