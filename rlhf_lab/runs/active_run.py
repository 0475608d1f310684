"""Logging to the active MLflow run from the code of a stage, a LightningModule or a callback: MLflow's fluent
functions on rank 0, nothing on other ranks. Opening and ending runs is :mod:`rlhf_lab.runs.tracking`'s; these calls
only write to the run it opened, so the leaves (algorithms, evaluation) log without reaching up to it."""

from __future__ import annotations

from typing import Any

import mlflow

from rlhf_lab.runs.distributed import is_rank_zero


def log_metrics(metrics: dict[str, float], step: int | None = None, synchronous: bool = True) -> None:
    """``synchronous=False`` queues the write (a per-step log of a training loop need not wait for the
    store); the queue is flushed when the run ends."""
    if is_rank_zero():
        mlflow.log_metrics(metrics, step=step, synchronous=synchronous)


def log_metric(key: str, value: float, step: int | None = None) -> None:
    if is_rank_zero():
        mlflow.log_metric(key, value, step=step)


def log_params(params: dict[str, Any]) -> None:
    if is_rank_zero():
        mlflow.log_params(params)


def set_tag(key: str, value: str) -> None:
    if is_rank_zero():
        mlflow.set_tag(key, value)


def log_dict(obj: dict, artifact_file: str) -> None:
    if is_rank_zero():
        mlflow.log_dict(obj, artifact_file)


def log_samples_table(rows: list[dict[str, Any]], name: str = "samples.json") -> None:
    if rows and is_rank_zero():
        import pandas as pd

        mlflow.log_table(pd.DataFrame(rows), artifact_file=name)
