"""The study report inside a sweep's parent MLflow run, so that the MLflow UI shows the study.

Called by the sweep callback (:mod:`rlhf_lab.entry.sweeps`) at the end of a multirun, in the launching process:
the report of the sweep's own jobs (:func:`rlhf_lab.analysis.study_report.write_report` on the parent's children:
README.md and its PNGs) goes into the parent run's artifacts under ``study_report/``. The best setting is chosen
on the eval split (mean final ``eval/gold_reward``, the metric ``study/best_eval_gold``) and reported on the test
split, as the report's "gold final" (mean ``test/gold_reward``, the metric ``study/best_final_gold``); the
setting becomes the tag ``rlhf_lab.best_setting``, and a one-paragraph summary naming each figure's split, the
report's table of settings and where its figure is the run's description (tag ``mlflow.note.content``, shown on
the run's page).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from rlhf_lab.analysis.run_figure import FIGURE as RUN_FIGURE
from rlhf_lab.analysis.study_runs import load_study
from rlhf_lab.analysis.study_report import STUDY_HISTORY_KEYS, BestSetting, best_setting, setting_table, write_report

ARTIFACT_DIR = "study_report"
STUDY_FIGURE = f"{ARTIFACT_DIR}/gold_vs_sqrt_kl.png"  # the study report's figure of gold and proxy against √KL
BEST_GOLD = "study/best_final_gold"  # the best setting's gold final: test split, as in the study report
BEST_EVAL_GOLD = "study/best_eval_gold"  # its eval-split gold, on which it was chosen
BEST_SETTING_TAG = "rlhf_lab.best_setting"
NOTE_COLUMNS = ("setting", "seeds", "gold start", "gold final", "drop from peak", "proxy final", "KL final")
NOTE_LIMIT = 8000  # the longest tag value MLflow stores (a longer description is refused)


def split_gold(split: str) -> str:
    """How the note names the gold final of :class:`rlhf_lab.analysis.study_report.BestSetting` (its ``split``)."""
    return {"test": "test-split gold (`test/gold_reward`)",
            "last eval": "last eval-split gold (`eval/gold_reward`; no test split logged)"}.get(
        split, "gold final (`test/gold_reward`, the last `eval/gold_reward` where no test split was logged)")


def summary_note(study: str | None, best: BestSetting | None, n_finished: int, n_jobs: int) -> str:
    """The parent run's description: the best setting, chosen on the eval split, and its gold on the test split
    (the figure the study report gives for it), and where the report is."""
    head = f"Study `{study}`" if study else "Sweep"
    if best is None:
        figure = "no finished job logged `eval/gold_reward`"
    else:
        runs = f"mean over {best.n} run{'s' if best.n > 1 else ''}"
        figure = (f"best setting `{best.setting}`: {split_gold(best.split)} **{best.gold:.3f}** ({runs}; chosen on "
                  f"eval-split gold, `eval/gold_reward` {best.eval_gold:.3f})")
    return (f"{head}: {figure}; {n_finished} of {n_jobs} jobs finished. "
            f"Report with plots: artifacts `{ARTIFACT_DIR}/README.md`.")


def description(note: str, runs: list, files: list[str]) -> str:
    """The parent run's description: `note` (:func:`summary_note`), then the study report's table of settings
    (:func:`rlhf_lab.analysis.study_report.setting_table`, finished runs; the :data:`NOTE_COLUMNS`, narrow enough for the
    run page) and where its figure is, when it has them; a
    table that would make it longer than :data:`NOTE_LIMIT` is left to the report."""
    finished = [r for r in runs if r.status == "FINISHED"]
    if not finished:
        return note
    figure = (f"\n\nFigure (gold and proxy reward gain against √KL): artifacts `{STUDY_FIGURE}`; each job's run "
              f"has its own `{RUN_FIGURE}`." if STUDY_FIGURE.split("/")[-1] in files else "")
    full = f"{note}\n\n{setting_table(finished, NOTE_COLUMNS)}{figure}"
    return full if len(full) <= NOTE_LIMIT else f"{note}{figure}"


def publish_study_report(client, run_id: str, study: str | None, uri: str, job_stages: list[str]) -> dict:
    """Write the report of the sweep `run_id`'s jobs of `job_stages` and log it, its headline metric and tags
    into that run (through `client`, an ``MlflowClient`` on `uri`); returns what was logged."""
    runs, parents = load_study(study, uri, client=client, stages=job_stages, parent=run_id,
                                history_keys=STUDY_HISTORY_KEYS)
    best = best_setting(runs)
    with tempfile.TemporaryDirectory(prefix="rlhf_lab_report_") as tmp:
        path = write_report(study, runs, parents, Path(tmp) / ARTIFACT_DIR, uri, parent=run_id)
        client.log_artifacts(run_id, str(path.parent), artifact_path=ARTIFACT_DIR)
        files = sorted(p.name for p in path.parent.iterdir())
    n_finished = sum(r.status == "FINISHED" for r in runs)
    if best is not None:
        client.log_metric(run_id, BEST_GOLD, best.gold)
        client.log_metric(run_id, BEST_EVAL_GOLD, best.eval_gold)
        client.set_tag(run_id, BEST_SETTING_TAG, best.setting)
    client.set_tag(run_id, "mlflow.note.content", description(summary_note(study, best, n_finished, len(runs)), runs,
                                                              files))
    return {"files": files, "best": best, "n_runs": len(runs)}
