"""The tests' fresh MLflow stores (copies of a template, tests/mlflow_template.py) are the stores MLflow migrates."""

from __future__ import annotations

import sqlite3

import mlflow

from tests import mlflow_template


def schema(db) -> tuple[list, list]:
    """Each table's and index's definition, its lines sorted (alembic's table rebuilds order a table's constraints
    differently from one migration run to the next), and the store's alembic revision."""
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name").fetchall()
        revision = con.execute("SELECT version_num FROM alembic_version").fetchall()
    lines = lambda sql: sorted(line.strip().rstrip(",") for line in (sql or "").splitlines())  # noqa: E731
    return [(kind, name, table, lines(sql)) for kind, name, table, sql in rows], revision


def test_a_copied_store_has_the_migrated_stores_schema_revision_and_default_experiment(tmp_path, monkeypatch):
    calls = []
    real = mlflow.store.db.utils._initialize_tables
    monkeypatch.setattr(mlflow.store.db.utils, "_initialize_tables", lambda e: calls.append(e.url.database) or real(e))
    stores = {}
    for name, migrate in (("migrated", "1"), ("copied", "")):
        monkeypatch.setenv(mlflow_template.MIGRATE, migrate)
        db = tmp_path / f"{name}.db"
        client = mlflow.MlflowClient(f"sqlite:///{db}")
        stores[name] = schema(db), [e.name for e in client.search_experiments()]
    assert calls == [str(tmp_path / "migrated.db"), str(tmp_path / "copied.db")]  # each store created once
    (tables, revision), experiments = stores["migrated"]
    assert len(tables) > 20 and len(revision) == 1 and experiments == ["Default"]
    assert stores["copied"] == stores["migrated"]
    assert mlflow_template.template_path().exists()
