"""The ``store`` fixture: every contract test runs once per backend in :data:`BACKENDS`.

To add a backend, write a factory ``make_x(tmp_path, request) -> Store`` and register it in
:data:`BACKENDS`; give it marks (``pytest.mark.postgres``) in :data:`BACKEND_MARKS`. A factory
may call ``pytest.skip`` when its server is not available. The fixture closes the store after
the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pg import fresh_schema, pg_database  # noqa: F401  (the "postgres" backend's database)
from terrarium import ContextId, FsStore, MemoryStore, PodActiveSegmentRef, Store, create_segment

StoreFactory = Callable[[Path, pytest.FixtureRequest], Store]


def make_memory(tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    """The reference store."""
    return MemoryStore()


def make_fs(tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    """A filesystem store in a fresh directory."""
    return FsStore(tmp_path / "sessions")


def make_sqlite(tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    """A SQLite store in a fresh database file."""
    from terrarium.stores.sqlite import SqliteStore

    return SqliteStore(tmp_path / "terrarium.db")


def make_postgres(tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    """A PostgreSQL store in a fresh schema of this run's throwaway database (tests/pg.py)."""
    from terrarium.stores.postgres import PostgresStore

    return PostgresStore(request.getfixturevalue("pg_database"), schema=fresh_schema())


# ---- backend registry ----------------------------------------------------------------------
# One entry per backend; every test in tests/contract/ runs against each of them.
# "sqlite" (SqliteStore) and "postgres" (PostgresStore) factories are registered here too.
BACKENDS: dict[str, StoreFactory] = {
    "memory": make_memory,
    "fs": make_fs,
    "sqlite": make_sqlite,
    "postgres": make_postgres,
}

#: Marks applied to a backend's parametrisation, e.g. ``{"postgres": [pytest.mark.postgres]}``.
BACKEND_MARKS: dict[str, list[pytest.MarkDecorator]] = {"postgres": [pytest.mark.postgres]}


@pytest.fixture(params=[pytest.param(name, marks=BACKEND_MARKS.get(name, [])) for name in BACKENDS])
def backend(request: pytest.FixtureRequest) -> str:
    """The name of the backend under test (a key of :data:`BACKENDS`)."""
    return str(request.param)


@pytest.fixture
def store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Store]:
    """A fresh, empty store of each backend; closed after the test."""
    instance = BACKENDS[backend](tmp_path, request)
    try:
        yield instance
    finally:
        instance.close()


@pytest.fixture
def xfail_on(backend: str, request: pytest.FixtureRequest) -> Callable[..., None]:
    """``xfail_on("fs", reason=...)``: mark this test a strict xfail on the named backends."""

    def mark(*names: str, reason: str) -> None:
        if backend in names:
            request.applymarker(pytest.mark.xfail(strict=True, reason=reason))

    return mark


@pytest.fixture
def main(store: Store) -> PodActiveSegmentRef:
    """Context ``cli:main`` freshly created with an empty root segment: its head ref."""
    session_id, segment_id = create_segment(store, context=ContextId("cli", "main"))
    return PodActiveSegmentRef(session_id, segment_id)
