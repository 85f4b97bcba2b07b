"""open_store(): which URL opens which backend, and errors that never show a password."""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pg import as_url, pg_database  # noqa: F401  (a fixture)
from terrarium.errors import StoreError, StoreURLError
from terrarium.stores.base import Store
from terrarium.stores.fs import FsStore
from terrarium.stores.sqlite import SqliteStore
from terrarium.stores.url import open_store, redact_url

SECRET = "s3cr3t-Pa55"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TERRARIUM_STORE", raising=False)


@pytest.fixture
def opened() -> Iterator[list[Store]]:
    """Stores opened by a test, closed after it."""
    stores: list[Store] = []
    yield stores
    for store in stores:
        store.close()


def _open(opened: list[Store], url: Any) -> Any:
    store = open_store(url)
    opened.append(store)
    return store


# --------------------------------------------------------------------------- filesystem


@pytest.mark.parametrize(
    ("url", "where"),
    [
        ("./sessions", "sessions"),
        ("sessions", "sessions"),
        ("fs:./data/s", "data/s"),
        ("fs:rel", "rel"),
        ("file:rel", "rel"),
    ],
)
def test_paths_and_fs_urls_open_fs_store(
    opened: list[Store], tmp_path: Path, url: str, where: str
) -> None:
    """A bare path, fs: and file: URLs open an FsStore there (relative to the cwd)."""
    store = _open(opened, url)
    assert isinstance(store, FsStore)
    assert store.root == tmp_path / where


def test_absolute_file_urls_and_path_objects(opened: list[Store], tmp_path: Path) -> None:
    """file:///abs, fs:///abs, file://localhost/abs and os.PathLike values open an FsStore."""
    for url in (
        f"file://{tmp_path}/a",
        f"fs://{tmp_path}/b",
        f"file://localhost{tmp_path}/c",
        tmp_path / "d",
        str(tmp_path / "e"),
    ):
        store = _open(opened, url)
        assert isinstance(store, FsStore)
    assert [s.root.name for s in opened] == ["a", "b", "c", "d", "e"]


def test_fs_durability_option(opened: list[Store]) -> None:
    """?durability= chooses the FsStore durability; an unknown value is an error."""
    store = _open(opened, "fs:s?durability=fsync")
    assert store.durability == "fsync"
    with pytest.raises(StoreURLError, match="durability"):
        open_store("fs:s?durability=maybe")


def test_default_is_env_then_sessions(
    opened: list[Store], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no URL: $TERRARIUM_STORE if set, else ./sessions."""
    store = _open(opened, None)
    assert isinstance(store, FsStore)
    assert store.root == tmp_path / "sessions"
    monkeypatch.setenv("TERRARIUM_STORE", "sqlite:from-env.db")
    store = _open(opened, None)
    assert isinstance(store, SqliteStore)
    assert store.path == tmp_path / "from-env.db"


# --------------------------------------------------------------------------- SQLite


def test_sqlite_urls(opened: list[Store], tmp_path: Path) -> None:
    """sqlite:///abs/path.db is absolute; sqlite:relative.db is relative to the cwd."""
    absolute = _open(opened, f"sqlite://{tmp_path}/abs/one.db")
    relative = _open(opened, "sqlite:two.db")
    options = _open(opened, "sqlite:three.db?synchronous=full")
    assert isinstance(absolute, SqliteStore)
    assert absolute.path == tmp_path / "abs" / "one.db"
    assert relative.path == tmp_path / "two.db"
    assert options.synchronous == "FULL"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("sqlite:", "names no path"),
        ("sqlite://", "names no path"),
        ("sqlite://somehost/x.db", "names host 'somehost'"),
        ("sqlite:x.db?synchronous=sometimes", "unknown synchronous mode"),
        ("sqlite:x.db?journal=off", "unknown option 'journal'"),
        ("sqlite:x.db#frag", "fragment"),
        ("fs:s?durability", "malformed query string"),
        ("mysql://root@db/x", "unknown scheme 'mysql'"),
        ("", "empty"),
        ("postgresql://%zz", 'invalid percent-encoded token: "%zz"'),  # libpq's is two lines
    ],
)
def test_malformed_urls_name_the_problem(url: str, problem: str) -> None:
    """Each malformed URL raises StoreURLError naming what is wrong, on one line."""
    with pytest.raises(StoreURLError, match=problem.replace("(", r"\(")) as caught:
        open_store(url)
    assert "\n" not in str(caught.value)


# --------------------------------------------------------------------------- passwords


@pytest.mark.parametrize(
    "url",
    [
        f"mysql://admin:{SECRET}@db.example/x",
        f"redis://:{SECRET}@cache/0",
        f"sqlite://admin:{SECRET}@host/x.db",
        f"fs://admin:{SECRET}@host/x",
        f"postgresql://admin:{SECRET}@db.example/x?bogus_option=1",
        f"postgresql://admin:{SECRET}@db.example/x?password={SECRET}&nonsense=2",
    ],
)
def test_password_never_in_url_errors(url: str) -> None:
    """A password in a rejected URL appears neither in the message nor in the repr."""
    pytest.importorskip("psycopg")
    with pytest.raises(StoreURLError) as info:
        open_store(url)
    for text in (str(info.value), repr(info.value)):
        assert SECRET not in text
        assert "***" in text
    assert info.value.__cause__ is None or SECRET not in str(info.value.__cause__)


def test_password_never_in_connection_errors() -> None:
    """A server that cannot be reached gives a StoreError without the password."""
    pytest.importorskip("psycopg")
    with pytest.raises(StoreError) as info:
        open_store(f"postgresql://admin:{SECRET}@127.0.0.1:1/x?connect_timeout=2")
    assert not isinstance(info.value, StoreURLError)
    for text in (str(info.value), repr(info.value)):
        assert SECRET not in text
    assert info.value.__cause__ is None


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:pw@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        (
            "postgresql://h/db?password=pw&sslmode=require",
            "postgresql://h/db?password=***&sslmode=require",
        ),
        ("postgresql://u:p/w@d@h:5432,h2/db", "postgresql://u:***@h:5432,h2/db"),
        ("host=h user=u password=pw dbname=d", "host=h user=u password=*** dbname=d"),
        ("host=h password='p w' dbname=d", "host=h password=*** dbname=d"),
        ("./sessions", "./sessions"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    """redact_url masks the password of URLs and libpq key=value strings, nothing else."""
    assert redact_url(url) == shown


def test_missing_psycopg_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without psycopg, a PostgreSQL URL raises ImportError naming the extra to install."""
    real_import = builtins.__import__

    def no_psycopg(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.split(".")[0] in ("psycopg", "psycopg_pool"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_psycopg)
    with pytest.raises(ImportError, match=r"pip install 'terrarium-sessions\[postgres\]'") as info:
        open_store(f"postgres://admin:{SECRET}@db/x")
    assert SECRET not in str(info.value)


# --------------------------------------------------------------------------- PostgreSQL


@pytest.mark.postgres
@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_postgres_urls_open_postgres_store(
    opened: list[Store],
    pg_database: str,  # noqa: F811
    scheme: str,
) -> None:
    """postgresql:// and postgres:// URLs open a PostgresStore; its repr hides the password."""
    from terrarium.stores.postgres import PostgresStore

    url = as_url(pg_database, password=SECRET)  # trust auth: the password is ignored
    url = url.replace("postgresql://", f"{scheme}://", 1)
    store = _open(opened, url)
    assert isinstance(store, PostgresStore)
    assert SECRET not in repr(store)
    assert store.schema == "terrarium"
    assert isinstance(store.list_contexts(), list)
