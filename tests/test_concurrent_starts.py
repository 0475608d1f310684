"""Four jobs started at the same moment in a fresh folder: one store, one experiment, four runs, four folders."""

from __future__ import annotations

import os
from pathlib import Path

import mlflow
import pytest

from tests import cli_process, mlflow_template

ROOT = Path(__file__).resolve().parents[1]
JOB = ["algo=pretrain", "policy=a_tiny", "pretrain.n_texts=200", "trainer.max_steps=1", "eval.every_n_steps=0",
       "eval.n_prompts=2", "eval.n_samples_logged=1", "generation.max_new_tokens=4", "trainer.progress_bar=false",
       "trainer.threads=1"]


@pytest.mark.slow
def test_four_jobs_started_together_all_succeed(tmp_path):
    # the store is created by MLflow's migrations, as for a user (not copied from the tests' template)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), **{mlflow_template.MIGRATE: "1"})
    env.pop("MLFLOW_TRACKING_URI", None)
    procs = [cli_process.start([*JOB, f"seed={i}"], cwd=tmp_path, env=env) for i in range(4)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exps = mlflow.search_experiments()
    assert [e.name for e in exps if e.name != "Default"] == ["rlhf-lab"]
    exp = mlflow.get_experiment_by_name("rlhf-lab")
    assert exp.tags.get("mlflow.experimentKind") == "custom_model_development"
    runs = mlflow.search_runs(experiment_names=["rlhf-lab"])
    jobs = runs[runs["tags.rlhf_lab.overrides"].str.contains("seed=")]
    assert len(jobs) == 4 and set(jobs["status"]) == {"FINISHED"}
    folders = {p.parent for p in (tmp_path / "outputs").glob("*/*/.hydra")}
    assert len(folders) == 4
    assert (tmp_path / "mlflow.db.lock").exists()
