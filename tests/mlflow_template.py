"""A fresh MLflow sqlite store in the tests is a copy of one that MLflow created (the test run's speed, nothing else).

MLflow creates a sqlite store's tables by running its schema migrations one by one (alembic, some 60 of them): about
1 s of CPU, which the first job of every test folder paid, some 100 times in a run. `install()` wraps
`mlflow.store.db.utils._initialize_tables`, which MLflow calls when a store has no tables yet: for a sqlite file it
copies, with SQLite's backup API, a store that the real function created once for this MLflow version (kept in the
temp folder, written then renamed); for any other store, or with ``RLHF_LAB_TESTS_MIGRATE_STORES=1`` in the
environment, it runs the real migrations. Everything after the tables (the default experiment, the lab's experiment,
the runs) is created as it would be. tests/test_mlflow_template.py checks that a copied store is the migrated one:
same tables, same schema, same alembic revision; tests/test_concurrent_starts.py creates its store the real way.

conftest.py installs it in the test workers; tests/cli_process.py in its fork server, whose jobs inherit it.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from pathlib import Path

MIGRATE = "RLHF_LAB_TESTS_MIGRATE_STORES"


def template_path() -> Path:
    import mlflow

    return Path(tempfile.gettempdir()) / f"rlhf-lab-tests-mlflow-{mlflow.__version__}.db"


def template(migrate) -> Path:
    """The store that `migrate` (MLflow's own `_initialize_tables`) created, built once for this MLflow version."""
    import sqlalchemy
    from filelock import FileLock

    path = template_path()
    if path.exists():
        return path
    with FileLock(f"{path}.lock"):
        if not path.exists():
            part = path.with_name(f"{path.name}.{os.getpid()}.part")
            part.unlink(missing_ok=True)
            engine = sqlalchemy.create_engine(f"sqlite:///{part}")
            try:
                migrate(engine)
            finally:
                engine.dispose()
            os.replace(part, path)
    return path


def install() -> None:
    from mlflow.store.db import utils

    migrate = getattr(utils._initialize_tables, "migrate", utils._initialize_tables)

    def initialize_tables(engine) -> None:
        database = engine.url.database
        if engine.url.get_backend_name() != "sqlite" or database in (None, "", ":memory:") or os.environ.get(MIGRATE):
            return migrate(engine)
        source = sqlite3.connect(template(migrate))
        target = engine.raw_connection()
        try:
            source.backup(target.driver_connection)
        finally:
            target.close()
            source.close()

    initialize_tables.migrate = migrate
    utils._initialize_tables = initialize_tables
