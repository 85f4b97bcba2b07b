"""Schema migrations: the registry's rules, and every database backend migrating on open.

Each backend registers one step, ``m001_initial`` (the 15 steps before the first release were
squashed into it; ``tests/test_schema.py`` checks it builds their schema). A database that
records exactly those 15 names is at ``m001_initial`` and keeps opening, its records
rewritten; one that records a step this version does not know is refused.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.history import add_context
from pg import fresh_schema, pg_database  # noqa: F401  (a fixture)
from terrarium.errors import FormatVersionError
from terrarium.index import listing as lister
from terrarium.index._query import SearchQuery
from terrarium.model import ContextId
from terrarium.sessions import restore, save_user_input
from terrarium.stores.migrations import PRE_SQUASH, Migrations
from terrarium.stores.sqlite import SqliteStore
from terrarium.stores.sqlite import migrations as sqlite_backend

TS = "2026-05-01T12:00:00.000000Z"


# --------------------------------------------------------------------------- the registry


def test_registry_refuses_duplicate_names() -> None:
    """Registering a migration name twice is refused."""
    registry: Migrations[Any] = Migrations("test")

    def m001_initial(conn: Any) -> None: ...

    registry(m001_initial)
    with pytest.raises(ValueError, match="already registered"):
        registry(m001_initial)


def test_registry_refuses_bad_and_out_of_order_names() -> None:
    """Names are mNNN_what; numbers must grow in registration order."""
    registry: Migrations[Any] = Migrations("test")

    def m002_second(conn: Any) -> None: ...

    def m001_first(conn: Any) -> None: ...

    def initial(conn: Any) -> None: ...

    registry(m002_second)
    with pytest.raises(ValueError, match="numbered after"):
        registry(m001_first)
    with pytest.raises(ValueError, match="mNNN_"):
        registry(initial)
    assert registry.names == ["m002_second"]


def test_pending_refuses_unknown_names() -> None:
    """A recorded migration this version does not know means a newer terrarium wrote it."""
    registry: Migrations[Any] = Migrations("test")

    def m001_initial(conn: Any) -> None: ...

    def m002_more(conn: Any) -> None: ...

    registry(m001_initial)
    registry(m002_more)
    assert [m.name for m in registry.pending(["m001_initial"], where="db")] == ["m002_more"]
    with pytest.raises(FormatVersionError, match="newer terrarium"):
        registry.pending(["m001_initial", "m003_from_the_future"], where="db")


def test_the_squashed_list_alone_counts_as_the_first_step() -> None:
    """Exactly the pre-squash names mean the first step; a list missing one, or with one more,
    names steps this version does not know."""
    registry: Migrations[Any] = Migrations("test", squashed=PRE_SQUASH)

    def m001_initial(conn: Any) -> None: ...

    def m002_after_the_squash(conn: Any) -> None: ...

    registry(m001_initial)
    registry(m002_after_the_squash)
    assert registry.squashed(list(reversed(PRE_SQUASH))) == list(PRE_SQUASH[1:])
    assert [m.name for m in registry.pending(PRE_SQUASH, where="db")] == ["m002_after_the_squash"]
    assert registry.squashed(["m001_initial"]) == []
    for applied in (PRE_SQUASH[:-1], (*PRE_SQUASH, "m002_after_the_squash")):
        assert registry.squashed(applied) == []
        with pytest.raises(FormatVersionError, match="newer terrarium"):
            registry.pending(applied, where="db")
    assert Migrations("test").squashed(PRE_SQUASH) == []  # a registry that squashed nothing


def test_every_backend_registers_one_initial_step() -> None:
    """SQLite and PostgreSQL schemas evolve in step: the same migration names, in order, from
    the same squash."""
    pytest.importorskip("psycopg")
    from terrarium.stores import postgres

    assert sqlite_backend.MIGRATIONS.names == postgres.MIGRATIONS.names == ["m001_initial"]
    for registry in (sqlite_backend.MIGRATIONS, postgres.MIGRATIONS):
        assert registry.squashed(PRE_SQUASH) == list(PRE_SQUASH[1:])


def _check_context(store: Any) -> None:
    """cli:old reads back, lists with its counts, and takes a new message that search finds."""
    assert restore(store, "cli:old").history == [{"role": "user", "content": "hi"}]
    head = store.get_head(ContextId("cli", "old"))
    assert head is not None
    save_user_input(store, head, "and a late reply")
    assert lister(store).list_contexts_fast()[0].message_count == 2
    assert [hit.seq for hit in lister(store).search(SearchQuery("late"))] == [2]


# --------------------------------------------------------------------------- SQLite


def _sqlite_names(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [row[0] for row in conn.execute("SELECT name FROM migrations ORDER BY rowid")]
    finally:
        conn.close()


def _record_sqlite(path: Path, names: tuple[str, ...]) -> None:
    """Replace the database's migration records by ``names``."""
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DELETE FROM migrations")
        conn.executemany("INSERT INTO migrations VALUES (?, ?)", [(n, TS) for n in names])
    conn.close()


def test_sqlite_migrates_blank(tmp_path: Path) -> None:
    """A new database gets every migration, in order, each recorded once."""
    path = tmp_path / "t.db"
    SqliteStore(path).close()
    SqliteStore(path).close()  # reopening applies nothing twice
    assert _sqlite_names(path) == ["m001_initial"]


def test_sqlite_opens_a_database_made_before_the_squash(tmp_path: Path) -> None:
    """A database recording the 15 old steps opens, read-only too, and works; its records
    now say m001_initial."""
    path = tmp_path / "old.db"
    with SqliteStore(path) as store:
        add_context(store, "cli:old", "hi")
    _record_sqlite(path, PRE_SQUASH)
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        sqlite_backend.check_readable(conn, where="old")  # no refusal, nothing written
    finally:
        conn.close()
    assert _sqlite_names(path) == list(PRE_SQUASH)
    with SqliteStore(path) as store:
        assert _sqlite_names(path) == ["m001_initial"]
        _check_context(store)


def test_sqlite_refuses_newer_database(tmp_path: Path) -> None:
    """A database with a migration unknown to this version is refused on open, the 15 old
    steps with one more too."""
    path = tmp_path / "new.db"
    SqliteStore(path).close()
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("INSERT INTO migrations VALUES ('m999_from_the_future', ?)", (TS,))
    conn.close()
    with pytest.raises(FormatVersionError, match=r"newer terrarium.*m999_from_the_future"):
        SqliteStore(path)
    _record_sqlite(path, (*PRE_SQUASH, "m016_from_the_future"))
    with pytest.raises(FormatVersionError, match=r"newer terrarium.*m016_from_the_future"):
        SqliteStore(path)
    assert len(_sqlite_names(path)) == 16  # refused, not rewritten


def test_sqlite_failed_migration_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A migration that fails is rolled back with its record: no half-applied schema."""
    registry: Migrations[sqlite3.Connection] = Migrations("sqlite")
    registry(sqlite_backend.m001_initial)

    def m002_breaks(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("boom")

    registry(m002_breaks)
    monkeypatch.setattr(sqlite_backend, "MIGRATIONS", registry)
    path = tmp_path / "t.db"
    with pytest.raises(RuntimeError, match="boom"):
        SqliteStore(path)
    assert _sqlite_names(path) == ["m001_initial"]
    conn = sqlite3.connect(path)
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    finally:
        conn.close()
    assert "half_done" not in tables
    assert "contexts" in tables


def test_sqlite_concurrent_opens_migrate_once(tmp_path: Path) -> None:
    """Threads opening one blank database at once each succeed; each step is applied once."""
    path = tmp_path / "t.db"
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def open_it() -> None:
        barrier.wait()
        try:
            SqliteStore(path).close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert _sqlite_names(path) == ["m001_initial"]


# --------------------------------------------------------------------------- PostgreSQL


@pytest.fixture
def pg(pg_database: str) -> Iterator[tuple[Any, str]]:  # noqa: F811
    """A connection to the test database and a fresh schema name in it."""
    import psycopg

    with psycopg.connect(pg_database, autocommit=True) as conn:
        yield conn, fresh_schema()


def _pg_names(conn: Any, schema: str) -> list[str]:
    rows = conn.execute(f'SELECT name FROM "{schema}".migrations ORDER BY applied_at, name')
    return [row[0] for row in rows]


def _record_pg(conn: Any, schema: str, names: tuple[str, ...]) -> None:
    """Replace the schema's migration records by ``names``."""
    with conn.transaction():
        conn.execute(f'DELETE FROM "{schema}".migrations')
        for name in names:
            conn.execute(f'INSERT INTO "{schema}".migrations (name) VALUES (%s)', (name,))


@pytest.mark.postgres
def test_postgres_migrates_blank(pg: tuple[Any, str], pg_database: str) -> None:  # noqa: F811
    """A new schema gets every migration, in order, each recorded once."""
    from terrarium.stores import postgres

    conn, schema = pg
    postgres.PostgresStore(pg_database, schema=schema).close()
    postgres.PostgresStore(pg_database, schema=schema).close()
    assert _pg_names(conn, schema) == ["m001_initial"]


@pytest.mark.postgres
def test_postgres_opens_a_schema_made_before_the_squash(
    pg: tuple[Any, str],
    pg_database: str,  # noqa: F811
) -> None:
    """A schema recording the 15 old steps opens and works; its records now say m001_initial."""
    from terrarium.stores import postgres

    conn, schema = pg
    with postgres.PostgresStore(pg_database, schema=schema) as store:
        add_context(store, "cli:old", "hi")
    _record_pg(conn, schema, PRE_SQUASH)
    with postgres.PostgresStore(pg_database, schema=schema) as store:
        assert _pg_names(conn, schema) == ["m001_initial"]
        _check_context(store)


@pytest.mark.postgres
def test_postgres_refuses_newer_schema(pg: tuple[Any, str], pg_database: str) -> None:  # noqa: F811
    """A schema with a migration unknown to this version is refused on open, the 15 old steps
    with one more too."""
    from terrarium.stores import postgres

    conn, schema = pg
    postgres.PostgresStore(pg_database, schema=schema).close()
    conn.execute(f'INSERT INTO "{schema}".migrations (name) VALUES (%s)', ("m999_future",))
    with pytest.raises(FormatVersionError, match=r"newer terrarium.*m999_future"):
        postgres.PostgresStore(pg_database, schema=schema)
    _record_pg(conn, schema, (*PRE_SQUASH, "m016_future"))
    with pytest.raises(FormatVersionError, match=r"newer terrarium.*m016_future"):
        postgres.PostgresStore(pg_database, schema=schema)
    assert len(_pg_names(conn, schema)) == 16  # refused, not rewritten


@pytest.mark.postgres
def test_postgres_failed_migration_leaves_nothing(
    pg: tuple[Any, str],
    pg_database: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A migration that fails is rolled back with its record: no half-applied schema."""
    from terrarium.stores import postgres
    from terrarium.stores.postgres import migrations as pg_backend

    registry: Migrations[Any] = Migrations("postgres")
    registry(pg_backend.m001_initial)

    def m002_breaks(conn: Any) -> None:
        conn.execute("CREATE TABLE half_done (x integer)")
        raise RuntimeError("boom")

    registry(m002_breaks)
    monkeypatch.setattr(pg_backend, "MIGRATIONS", registry)
    conn, schema = pg
    with pytest.raises(RuntimeError, match="boom"):
        postgres.PostgresStore(pg_database, schema=schema)
    assert _pg_names(conn, schema) == ["m001_initial"]
    tables = {
        row[0]
        for row in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        )
    }
    assert "half_done" not in tables
    assert "contexts" in tables


@pytest.mark.postgres
def test_postgres_concurrent_opens_migrate_once(
    pg: tuple[Any, str],
    pg_database: str,  # noqa: F811
) -> None:
    """Threads opening one blank schema at once each succeed; each step is applied once."""
    from terrarium.stores import postgres

    conn, schema = pg
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def open_it() -> None:
        barrier.wait()
        try:
            postgres.PostgresStore(pg_database, schema=schema, pool_size=1).close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert _pg_names(conn, schema) == ["m001_initial"]
