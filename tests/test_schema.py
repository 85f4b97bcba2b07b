"""A fresh database's schema is exactly the recorded one, on every database backend.

``tests/fixtures/schema_*.txt`` were dumped (``tests/helpers/schema_dump.py``) from the
schema the 15 migration steps built before they were squashed into one ``m001_initial``
(both since rewritten on purpose: their search tables and listing counts gave way to the
change cursor of the derived index); ``m001_initial`` must build the same tables, columns,
indexes, views, functions and triggers.
``TERRARIUM_WRITE_SCHEMA=1`` writes the fixtures from the current code instead of checking.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from helpers.schema_dump import postgres_schema, sqlite_schema
from pg import fresh_schema, pg_database  # noqa: F401  (a fixture)
from terrarium.stores.sqlite import SqliteStore

FIXTURES = Path(__file__).parent / "fixtures"


def _check(name: str, found: str) -> None:
    fixture = FIXTURES / name
    if os.environ.get("TERRARIUM_WRITE_SCHEMA") == "1":
        fixture.write_text(found, encoding="utf-8")
    assert found.splitlines() == fixture.read_text(encoding="utf-8").splitlines()


def test_sqlite_schema_is_the_recorded_one(tmp_path: Path) -> None:
    """A new SQLite database has exactly the recorded schema."""
    path = tmp_path / "t.db"
    SqliteStore(path).close()
    conn = sqlite3.connect(path)
    try:
        _check("schema_sqlite.txt", sqlite_schema(conn))
    finally:
        conn.close()


@pytest.mark.postgres
def test_postgres_schema_is_the_recorded_one(pg_database: str) -> None:  # noqa: F811
    """A new PostgreSQL schema has exactly the recorded tables, indexes, views, functions
    and triggers."""
    import psycopg

    from terrarium.stores.postgres import PostgresStore

    schema = fresh_schema()
    PostgresStore(pg_database, schema=schema).close()
    with psycopg.connect(pg_database, autocommit=True) as conn:
        _check("schema_postgres.txt", postgres_schema(conn, schema))
