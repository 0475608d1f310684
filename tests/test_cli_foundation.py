"""End-to-end: the SFT job on tiny sizes through the pipeline, cache reuse, MLflow contents."""

from __future__ import annotations

import mlflow
import pytest

from rlhf_lab import stages

pytestmark = pytest.mark.slow  # trains models: deselect with -m 'not slow'


def _runs(db):
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    return mlflow.search_runs(experiment_names=["rlhf-lab"])


def test_sft_job_end_to_end_writes_finished_run_and_reuses_base(tiny_cfg, tmp_path):
    db = tmp_path / "mlflow.db"
    cache = tmp_path / "cache"
    cfg = tiny_cfg("algo=sft", f"cache_dir={cache}", mlflow_db=db)
    meta = stages.run_job(cfg, tmp_path / "out1")
    runs = _runs(db)
    assert sorted(runs["tags.rlhf_lab.stage"]) == ["pretrain", "sft"]
    assert set(runs["status"]) == {"FINISHED"}
    sft = runs[runs["tags.rlhf_lab.stage"] == "sft"].iloc[0]
    pre = runs[runs["tags.rlhf_lab.stage"] == "pretrain"].iloc[0]
    assert sft["tags.rlhf_lab.upstream.pretrain"] == pre["run_id"]
    assert sft["params.sft.lr"] == str(cfg.sft.lr)
    for k in ("eval/gold_reward", "eval/length", "eval/filler_rate", "eval/distinct_2", "loss/lm"):
        assert f"metrics.{k}" in runs.columns and sft[f"metrics.{k}"] == sft[f"metrics.{k}"]  # not NaN
    assert -3.0 < meta["eval"]["eval/gold_reward"] < 1.5
    # the SFT model samples text of the world (not noise): most responses end with EOS
    assert meta["eval"]["eval/eos_rate"] > 0.3
    # a second identical call reuses the cached base model: one more run (sft), no new pretrain run
    stages.run_job(cfg, tmp_path / "out2")
    runs = _runs(db)
    assert sorted(runs["tags.rlhf_lab.stage"]) == ["pretrain", "sft", "sft"]


def test_unknown_algo_is_a_clear_error(tiny_cfg, tmp_path):
    cfg = tiny_cfg("algo=sft")
    cfg.algo.name = "nope"
    with pytest.raises(ValueError, match="algo='nope' is not a known algorithm"):
        stages.run_job(cfg, tmp_path)
