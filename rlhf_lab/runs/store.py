"""Opening a sqlite MLflow store: created once, under a file lock, and refused in one line when it cannot be opened.

MLflow creates a sqlite store's tables when a process first opens it (some 60 schema migrations) without a lock of
its own: two processes that open a new store at the same moment both migrate it, and one fails or leaves it
half-migrated. :func:`open_store` opens it under :func:`store_lock` (``mlflow.db.lock`` beside it): one process
creates it, the others wait. A store whose tables or schema revision are not what MLflow expects is
:class:`StoreError`, one line with MLflow's reason and the fix (:func:`broken_store_line`). A tracking server
migrates its own store: nothing is done here for it.
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from pathlib import Path

SQLITE = "sqlite:///"
# what MLflow or SQLite says when a store's tables or schema revision are not what MLflow expects
BROKEN_SCHEMA = ("out-of-date database schema", "already exists", "duplicate column", "no such table",
                 "no such column", "can't locate revision")


class StoreError(RuntimeError):
    """A sqlite store that cannot be opened (:func:`broken_store_line`), as one line."""


def sqlite_file(uri: str) -> Path | None:
    """The file of a ``sqlite:///`` URI (``~`` expanded), or None for any other store."""
    if not uri.startswith(SQLITE):
        return None
    return Path(uri[len(SQLITE):]).expanduser()


def store_lock(uri: str) -> contextlib.AbstractContextManager:
    """A file lock next to a sqlite store (``mlflow.db.lock``, its folder created); no lock for other stores."""
    db = sqlite_file(uri)
    if db is None:
        return contextlib.nullcontext()
    from filelock import FileLock

    db.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(db) + ".lock", timeout=600)


def open_store(uri: str) -> None:
    """Open the sqlite store at `uri` once in this process, under :func:`store_lock`: MLflow creates (migrates) a new
    one there while any other process that opens it waits. :class:`StoreError` for a store MLflow cannot open because
    of its tables or schema (:data:`BROKEN_SCHEMA`); any other error as MLflow raised it. Nothing for other stores."""
    db = sqlite_file(uri)
    if db is None:
        return
    import mlflow
    import sqlalchemy

    with store_lock(uri):
        try:
            mlflow.MlflowClient(uri)  # opens (and, for a new file, creates) the store; MLflow keeps it for this URI
        except (mlflow.exceptions.MlflowException, sqlalchemy.exc.SQLAlchemyError) as err:
            if not any(s in str(err).lower() for s in BROKEN_SCHEMA):
                raise
            raise StoreError(broken_store_line(db, uri, err)) from None


def stored_runs(db: Path) -> int | None:
    """How many runs the sqlite file `db` holds (read with sqlite3, not MLflow), or None when it cannot be read."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            return int(conn.execute("select count(*) from runs").fetchone()[0])
    except sqlite3.Error:
        return None


def broken_store_line(db: Path, uri: str, err: Exception) -> str:
    """One line: the store, MLflow's reason (its first line) and the fix: a store without runs is removed and made
    again by the next start; one with runs is backed up and migrated by MLflow's own command."""
    reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    runs = stored_runs(db)
    if not runs:
        fix = f"it holds no runs: remove it (rm {db}) and start again, and the next start creates it anew"
    else:
        fix = (f"it holds {runs} runs: back it up (cp {db} {db}.bak), then run `mlflow db upgrade {uri}`, or point "
               "tracking.uri at a new file")
    return (f"the MLflow store {db} cannot be opened: its tables are half-created or half-migrated (a process stopped "
            f"while MLflow created or upgraded them?; MLflow: {reason}); {fix}")


def exit_on_broken_store(uri: str) -> None:
    """:func:`open_store`, with a :class:`StoreError` as one line on stderr and exit status 2 (a job's or a sweep's
    start, before any work)."""
    try:
        open_store(uri)
    except StoreError as err:
        print(f"rlhf-lab: {err}", file=sys.stderr)
        raise SystemExit(2) from None
