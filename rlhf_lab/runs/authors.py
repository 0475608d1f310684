"""Who made a run: the author that reports and ``skip_finished`` compare with the user running them.

MLflow records a run's author as the run's ``user_id`` and its tag ``mlflow.user``: the name of the process's MLflow
login (``MLFLOW_TRACKING_USERNAME`` or ``~/.mlflow/credentials``), else the operating-system user
(:func:`current_author`, what MLflow's client stamps). On the team server the author is the login that created the
run, stamped by the server and unchangeable by users (:mod:`rlhf_lab.server.guard`). A run made without an author
(MLflow's ``unknown``: ``MlflowClient.create_run`` without the tag, which the team server never stores) counts as
the current user's. Reports read, and ``skip_finished`` reuses, only the current author's runs unless asked for
every author's (``tracking.all_authors=true``, ``rlhf-lab-report --all-authors``, or :data:`ALL_AUTHORS_ENV`)."""

from __future__ import annotations

import os

AUTHOR_TAG = "mlflow.user"  # MLflow's tag for a run's author (mlflow.utils.mlflow_tags.MLFLOW_USER)
NO_AUTHOR = ("", "unknown")  # what MLflow records for a run created without an author
ALL_AUTHORS_ENV = "RLHF_LAB_ALL_AUTHORS"  # "1": reports read every author's runs (rlhf-lab-report --all-authors)


def current_author() -> str:
    """The author MLflow's client records on the runs this process creates (its login, else the OS user)."""
    from mlflow.tracking.context.default_context import DefaultRunContext

    return DefaultRunContext().tags()[AUTHOR_TAG]


def run_author(run) -> str:
    """The author of an MLflow run: its ``user_id``, else its ``mlflow.user`` tag; "" when it records none."""
    for user in (run.info.user_id, run.data.tags.get(AUTHOR_TAG)):
        if user and user not in NO_AUTHOR:
            return user
    return ""


def all_authors_asked() -> bool:
    """Whether this process was asked to read every author's runs (:data:`ALL_AUTHORS_ENV` set to 1)."""
    return os.environ.get(ALL_AUTHORS_ENV, "").strip().lower() in ("1", "true", "yes")


def authored_by(runs, author: str | None) -> list:
    """The `runs` (MLflow runs) whose author is `author` or that record none; all of them when `author` is None."""
    if author is None:
        return list(runs)
    return [r for r in runs if run_author(r) in ("", author)]


def wanted_author(all_authors: bool | None = None) -> str | None:
    """The author whose runs to read: None (every author) when `all_authors` is true, or when it is None and
    :data:`ALL_AUTHORS_ENV` asks for it; else :func:`current_author`."""
    every = all_authors_asked() if all_authors is None else all_authors
    return None if every else current_author()
