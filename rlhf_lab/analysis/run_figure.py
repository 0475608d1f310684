"""The figure of one policy run inside its own MLflow run, so that the MLflow UI shows proxy and gold on one chart.

Called at the end of every policy job (ppo, grpo, rloo, dpo, bon) by the CLI (:mod:`rlhf_lab.entry.run`) once
the stage is done, not by the stages (their code digests, the cache keys, do not cover ``analysis/``): the run's
logged histories are read back from the store (a resumed job's run holds them all, from step 0) and drawn by :func:`rlhf_lab.analysis.plots.plot_run_rewards` into the artifact
:data:`FIGURE` of the run (gold and proxy reward against the step and against √KL; a run without a gold: proxy and
KL only).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from rlhf_lab.analysis.plots import RUN_CURVES, plot_run_rewards
from rlhf_lab.analysis.study_runs import BON_SERIES, POLICY_STAGES, read_histories, run_data

FIGURE = "proxy_vs_gold.png"  # the artifact's name, at the top of the run's artifacts
FIGURE_KEYS = tuple(k for key, _, _ in RUN_CURVES for k in (key, BON_SERIES[key])) + ("eval/kl", "bon/kl")


def log_run_figure(client, run_id: str) -> list[str]:
    """Draw the run `run_id`'s reward curves and log them into it as :data:`FIGURE` (through `client`, an
    ``MlflowClient``); returns the metrics drawn ([]: the run logged no gold and no proxy reward, nothing logged)."""
    rd = read_histories(client, run_data(client.get_run(run_id)), FIGURE_KEYS)
    with tempfile.TemporaryDirectory(prefix="rlhf_lab_figure_") as tmp:
        path = Path(tmp) / FIGURE
        drawn = plot_run_rewards(rd, path)
        if drawn:
            client.log_artifact(run_id, str(path))
    return drawn


def log_job_figure(stage: str, uri: str, run_id: str) -> None:
    """A policy job's figure of proxy and gold reward into its run (:func:`log_run_figure`); other
    stages log none. A failure to draw it is said in one line and never fails the job."""
    if stage not in POLICY_STAGES:
        return
    import sys

    from mlflow import MlflowClient

    try:
        log_run_figure(MlflowClient(uri), run_id)
    except Exception as err:  # the job's results are in the store whatever happens here
        print(f"[rlhf-lab] {stage}: no {FIGURE} in run {run_id} ({type(err).__name__}: {err})", file=sys.stderr)
