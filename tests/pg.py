"""Throwaway PostgreSQL databases for tests.

Which server:

* ``TERRARIUM_TEST_POSTGRES_DSN`` set: that server; if it cannot be reached, tests fail.
* else ``CI=true``: ``postgresql://postgres@127.0.0.1:5432/postgres``; unreachable fails.
* else the same default DSN is tried with a one-second timeout, and if it does not answer the
  PostgreSQL tests are skipped with one line saying how to run them.

Each test run creates one database, ``terrarium_test_<random>``, and drops it at the end. Use
the session-scoped fixture :func:`pg_database` (import it into a test module or conftest), and
:func:`fresh_schema` for a schema of one's own within it, so that tests never see each other's
data. Importing this module never needs psycopg; using the fixture does.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
ENV_VAR = "TERRARIUM_TEST_POSTGRES_DSN"
SKIP_MESSAGE = (
    "PostgreSQL tests skipped: set TERRARIUM_TEST_POSTGRES_DSN=postgresql://user@host/db "
    "to run them"
)

_lock = threading.Lock()
_state: dict[str, Any] = {"users": 0, "dsn": None, "admin": None, "name": None, "error": None}


def _server_dsn() -> tuple[str, bool]:
    """The maintenance DSN and whether an unreachable server is a failure (not a skip)."""
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        return explicit, True
    return DEFAULT_DSN, os.environ.get("CI", "").lower() == "true"


def _create() -> str:
    import psycopg
    from psycopg.conninfo import make_conninfo

    admin, required = _server_dsn()
    try:
        conn = psycopg.connect(admin, autocommit=True, connect_timeout=1 if not required else 10)
    except psycopg.OperationalError as exc:
        if required:
            pytest.fail(f"PostgreSQL at {ENV_VAR} or the CI default is unreachable: {exc}")
        pytest.skip(SKIP_MESSAGE)
    name = f"terrarium_test_{uuid.uuid4().hex[:12]}"
    with conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    _state.update(admin=admin, name=name, dsn=make_conninfo(admin, dbname=name))
    return str(_state["dsn"])


def _drop() -> None:
    import psycopg

    admin, name = _state["admin"], _state["name"]
    _state.update(admin=None, name=None, dsn=None)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """The DSN of this run's throwaway database (created once, dropped at the end).

    Modules and conftests that import this fixture share one database: the last of them to
    finish drops it.
    """
    with _lock:
        if _state["error"] is not None:
            pytest.skip(_state["error"])
        if _state["dsn"] is None:
            try:
                _create()
            except pytest.skip.Exception as exc:
                _state["error"] = str(exc.msg)
                raise
        _state["users"] += 1
        dsn = str(_state["dsn"])
    try:
        yield dsn
    finally:
        with _lock:
            _state["users"] -= 1
            if _state["users"] == 0:
                _drop()


def fresh_schema() -> str:
    """A new schema name, so that a store starts empty within the shared test database."""
    return f"t_{uuid.uuid4().hex[:16]}"


def as_url(dsn: str, **changes: str) -> str:
    """The ``postgresql://`` URL form of a libpq DSN (for tests of store URLs)."""
    from urllib.parse import quote

    from psycopg.conninfo import conninfo_to_dict

    params = {**conninfo_to_dict(dsn), **changes}
    user = quote(str(params.pop("user", "")), safe="")
    password = params.pop("password", None)
    auth = f"{user}:{quote(str(password), safe='')}@" if password else (f"{user}@" if user else "")
    host = str(params.pop("host", ""))
    port = params.pop("port", None)
    dbname = quote(str(params.pop("dbname", "")), safe="")
    netloc = f"{auth}{host}:{port}" if port else f"{auth}{host}"
    query = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in params.items())
    return f"postgresql://{netloc}/{dbname}" + (f"?{query}" if query else "")


def own_database(pg_dsn: str) -> Iterator[str]:
    """A database of the caller's own next to ``pg_dsn`` (the :func:`pg_database` fixture's, so
    the server was found or the test skipped), dropped at the end: for the command line, whose
    PostgreSQL store is the default schema of the database its URL names. Wrap it in a
    fixture: ``yield from own_database(pg_database)``."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    admin, _ = _server_dsn()
    name = f"terrarium_own_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_conninfo(admin, dbname=name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def empty_default_schema(dsn: str) -> str:
    """Drop the default schema of the database ``dsn`` names (a store there starts empty);
    its ``postgresql://`` URL."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS terrarium CASCADE")
    return as_url(dsn)


def store_url(kind: str, folder: Path, name: str, request: pytest.FixtureRequest) -> str:
    """A new store's URL of ``kind`` (``fs``, ``sqlite`` or ``postgres``): ``folder / name``
    (``.db`` for SQLite), or the ``pg_own`` fixture's database, emptied."""
    if kind == "fs":
        return str(folder / name)
    if kind == "sqlite":
        return f"sqlite:///{folder / name}.db"
    return empty_default_schema(request.getfixturevalue("pg_own"))
