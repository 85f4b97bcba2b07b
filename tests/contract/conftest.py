"""The ``store`` fixture: every contract test runs once per backend in :data:`BACKENDS`.

To add a backend, write a factory ``make_x(tmp_path, request) -> Store``, register it in
:data:`BACKENDS` and its class in :data:`STORE_CLASSES`; give it marks (``pytest.mark.postgres``)
in :data:`BACKEND_MARKS`. A factory may call ``pytest.skip`` when its server is not available.
The fixture closes the store after the test.

Optional abilities (``Searchable``, ``Listing`` from :mod:`terrarium.stores.base`) gate tests:
a module says ``pytestmark = pytest.mark.ability.with_args(Searchable)`` (``with_args``, as a
lone class argument would be taken for the decorated object) and its tests are parametrised
over only the backends whose store class has the ability (the same ``runtime_checkable``
protocol check as ``isinstance``, made on the class at collection); the fixture then checks the
instance too. A backend lacking the ability gets no test item at all, rather than one item per
test that skips: skipping would print the backend's absence on every run (``-ra``) and count
tests that never ran. A new backend learns what it must do from ``tests/contract/`` alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import terrarium
from pg import fresh_schema, pg_database  # noqa: F401  (the "postgres" backend's database)
from terrarium import ContextId, FsStore, MemoryStore, PodActiveSegmentRef, Store, create_segment
from terrarium.index import SearchIndex, listing

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
# One entry per backend; every test in tests/contract/ runs against each of them (the tests of
# an optional ability, against each that has it).
BACKENDS: dict[str, StoreFactory] = {
    "memory": make_memory,
    "fs": make_fs,
    "sqlite": make_sqlite,
    "postgres": make_postgres,
}

#: Each backend's store class, by its name in ``terrarium``: what its abilities are read from.
STORE_CLASSES: dict[str, str] = {
    "memory": "MemoryStore",
    "fs": "FsStore",
    "sqlite": "SqliteStore",
    "postgres": "PostgresStore",
}


def reopen_fs(store: Store, request: pytest.FixtureRequest) -> Store:
    """Another FsStore on the same root."""
    assert isinstance(store, FsStore)
    return FsStore(store.root)


def reopen_sqlite(store: Store, request: pytest.FixtureRequest) -> Store:
    """Another SqliteStore on the same database file."""
    assert isinstance(store, terrarium.SqliteStore)
    return terrarium.SqliteStore(store.path)


def reopen_postgres(store: Store, request: pytest.FixtureRequest) -> Store:
    """Another PostgresStore (its own connection pool) on the same schema."""
    assert isinstance(store, terrarium.PostgresStore)
    return terrarium.PostgresStore(request.getfixturevalue("pg_database"), schema=store.schema)


#: How to open a second store on a backend's data: another process, in effect. The memory
#: store has none (its data lives in one object).
REOPEN: dict[str, Callable[[Store, pytest.FixtureRequest], Store]] = {
    "fs": reopen_fs,
    "sqlite": reopen_sqlite,
    "postgres": reopen_postgres,
}

#: The backends whose listing and search the derived index answers (``terrarium.index.of``):
#: they have its abilities (the tests reach them through ``terrarium.index.listing``).
INDEXED = frozenset({"fs", "memory", "sqlite", "postgres"})

#: Marks applied to a backend's parametrisation, e.g. ``{"postgres": [pytest.mark.postgres]}``.
BACKEND_MARKS: dict[str, list[pytest.MarkDecorator]] = {"postgres": [pytest.mark.postgres]}


def has_ability(backend: str, ability: type) -> bool:
    """Whether the backend's store class has ``ability``, a ``runtime_checkable`` protocol.

    A class that cannot be imported (a missing extra) counts as having it: its factory then
    fails in the test, as it does in every other contract test, instead of the test vanishing.
    """
    try:
        cls = getattr(terrarium, STORE_CLASSES[backend])
    except ImportError:
        return True
    return issubclass(cls, ability) or (backend in INDEXED and issubclass(SearchIndex, ability))


def _abilities(node: pytest.Item | pytest.Function) -> list[type]:
    return [ability for mark in node.iter_markers("ability") for ability in mark.args]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "ability(*protocols): run only on backends whose store has these abilities"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise ``backend`` over every backend that has the test's abilities."""
    if "backend" not in metafunc.fixturenames:
        return
    needs = _abilities(metafunc.definition)
    names = [name for name in BACKENDS if all(has_ability(name, a) for a in needs)]
    params = [pytest.param(name, marks=BACKEND_MARKS.get(name, [])) for name in names]
    metafunc.parametrize("backend", params)


@pytest.fixture
def store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Store]:
    """A fresh, empty store of each backend (``backend``, a key of :data:`BACKENDS`, names it);
    closed after the test. Under ``pytest.mark.ability``, an instance with those abilities."""
    instance = BACKENDS[backend](tmp_path, request)
    try:
        for ability in _abilities(request.node):
            found = isinstance(instance, ability) or isinstance(listing(instance), ability)
            assert found, f"{backend}: not {ability.__name__}"
        yield instance
    finally:
        instance.close()


@pytest.fixture
def other(backend: str, store: Store, request: pytest.FixtureRequest) -> Iterator[Store]:
    """A second store on the same data as ``store`` (see :data:`REOPEN`); closed after."""
    if backend not in REOPEN:
        pytest.skip(f"no second {backend} store can open the same data")
    instance = REOPEN[backend](store, request)
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
