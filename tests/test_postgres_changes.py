"""PostgreSQL's change cursor (``PostgresStore.changes``) and its derived index per machine.

A position is a snapshot of the server's transactions: a write by a transaction that
commits after a reader took its position is still read next time, which a position taken
from ids (commit order is not id order) would miss, and a write the last read saw is not
named again. Deleted sessions are changes too. Each machine keeps its own index
file, in ``$TERRARIUM_INDEX_DIR``, named by the store's id and where it is, so a copy of the
store gets its own (tests/conftest.py points the folder into a temporary one for every test).
"""

from __future__ import annotations

import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pg import fresh_schema, own_database, pg_database  # noqa: F401  (a fixture)

psycopg = pytest.importorskip("psycopg")

from helpers.history import add_context, snippets  # noqa: E402
from terrarium import codec, index, states  # noqa: E402
from terrarium.index._query import SearchQuery  # noqa: E402
from terrarium.model import ContextId  # noqa: E402
from terrarium.sessions import fork_at, save_user_input  # noqa: E402
from terrarium.stores.base import NewEntry, iter_lines  # noqa: E402
from terrarium.stores.postgres import PostgresStore, _sql  # noqa: E402

pytestmark = pytest.mark.postgres

TS = "2026-05-01T12:00:00.000000Z"


@pytest.fixture
def schema() -> str:
    return fresh_schema()


@pytest.fixture
def store(pg_database: str, schema: str) -> Iterator[PostgresStore]:  # noqa: F811
    with PostgresStore(pg_database, schema=schema, pool_size=2) as instance:
        yield instance


@pytest.fixture
def other(pg_database: str, schema: str) -> Iterator[Any]:  # noqa: F811
    """A second connection, for a transaction held open across the store's calls."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        yield conn


def _search(store: PostgresStore, text: str) -> list[str]:
    found = index.of(store)
    assert found is not None
    return snippets(found.search(SearchQuery(text)))


def _append_in(conn: Any, head: Any, first: int, text: str) -> None:
    """Append one user item to ``head``'s segment at seq ``first`` with the store's own
    statement, in ``conn``'s open transaction."""
    entry = NewEntry("item", TS, {"item": {"role": "user", "content": text}})
    (line,) = iter_lines([entry], first)
    params = {
        "session": head.session_id,
        "segment": head.segment_id,
        "first": first,
        "next": first + 1,
        "kind": "item",
        "ts": TS,
        "line": codec.encode(line).decode(),
    }
    assert conn.execute(_sql.APPEND_ONE, params).fetchone() == (True,)


def test_a_write_committed_after_a_read_is_read_next_time(store: PostgresStore, other: Any) -> None:
    """Transaction A writes session a and stays open; B writes session b and commits; a read
    of the changes names b and not a. Once A commits, the next read from the position that
    read gave names a, and only a: the position never passes a transaction still open."""
    a = add_context(store, "cli:a", "one")
    b = add_context(store, "cli:b", "two")
    _, start = store.changes(None)
    with other.transaction():
        _append_in(other, a, 2, "late")  # A: its id is older than B's
        save_user_input(store, b, "early")  # B, autocommitted
        touched, position = store.changes(start)
        assert touched == [b.session_id]
    assert store.changes(position)[0] == [a.session_id]


def test_the_index_finds_a_write_that_committed_after_its_refresh(
    store: PostgresStore, other: Any
) -> None:
    """The derived index refreshed while a transaction was open finds that transaction's item
    on its next refresh, after the commit."""
    a = add_context(store, "cli:a", "one")
    b = add_context(store, "cli:b", "two")
    assert _search(store, "one") == ["one"]
    with other.transaction():
        _append_in(other, a, 2, "lateword")
        save_user_input(store, b, "earlyword")
        assert _search(store, "earlyword") == ["earlyword"]
        assert _search(store, "lateword") == []
    assert _search(store, "lateword") == ["lateword"]


def test_a_rolled_back_write_is_never_seen(store: PostgresStore, other: Any) -> None:
    """A transaction that rolls back leaves nothing for the index to find, and no position
    waits for it."""
    a = add_context(store, "cli:a", "one")
    assert _search(store, "one") == ["one"]
    with pytest.raises(ZeroDivisionError), other.transaction():
        _append_in(other, a, 2, "gone")
        raise ZeroDivisionError
    assert _search(store, "gone") == []
    save_user_input(store, a, "kept")
    assert _search(store, "kept") == ["kept"]


def test_deleted_and_purged_sessions_are_changes(store: PostgresStore) -> None:
    """A delete to the trash, a restore and a detached session's purge each name the session;
    the index stops, then starts again, listing the context."""
    a = add_context(store, "cli:a", "one")
    listing = index.of(store)
    assert listing is not None
    assert [s.context for s in listing.list_contexts_fast()] == ["cli:a"]
    _, start = store.changes(None)
    assert states.delete_context(store, ContextId.parse("cli:a"))
    touched, after_delete = store.changes(start)
    assert touched == [a.session_id]
    assert listing.list_contexts_fast() == []
    (trashed,) = states.trashed_contexts(store)
    assert states.restore_trashed(store, trashed.trash_id) is not None
    touched, _ = store.changes(after_delete)
    assert touched == [a.session_id]
    assert [s.context for s in listing.list_contexts_fast()] == ["cli:a"]
    store.detach_context(ContextId.parse("cli:a"), a.session_id, expected={}, state={})
    _, before_purge = store.changes(None)
    assert store.delete_session(a.session_id)
    touched, _ = store.changes(before_purge)
    assert touched == [a.session_id]
    assert listing.list_contexts_fast() == []


def test_a_position_from_no_store_reads_everything(store: PostgresStore) -> None:
    """A position past every transaction id this server handed out is no position of this
    store's (a copied index file, another server's), nor is text that is no snapshot: the
    reader reads everything, and the position then given reads nothing new."""
    add_context(store, "cli:a", "one")
    far, invalid = 99_999_999_999, 2**62
    for position in (f"{far}:{far + 5}:{far + 1},{far + 3}", f"{invalid}:{invalid}:", "7", ""):
        touched, now = store.changes(position)
        assert touched is None
        assert store.changes(now)[0] == []


def test_each_machine_builds_its_own_index(
    store: PostgresStore,
    pg_database: str,  # noqa: F811
    schema: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The index file lives in this machine's index folder (0700; the file 0600), named by
    the store's id; a second machine (another folder) builds its own from the store and finds
    the same; another schema is another store, with another id."""
    add_context(store, "cli:a", "alpha")
    first, second = tmp_path / "one", tmp_path / "two"
    monkeypatch.setenv("TERRARIUM_INDEX_DIR", str(first))
    assert _search(store, "alpha") == ["alpha"]
    name = f"{store.store_id()}.search.db"
    assert [p.name for p in first.iterdir() if p.suffix == ".db"] == [name]
    assert stat.S_IMODE(first.stat().st_mode) == 0o700
    assert stat.S_IMODE((first / name).stat().st_mode) == 0o600
    monkeypatch.setenv("TERRARIUM_INDEX_DIR", str(second))
    with PostgresStore(pg_database, schema=schema, pool_size=1) as elsewhere:
        assert elsewhere.store_id() == store.store_id()
        assert _search(elsewhere, "alpha") == ["alpha"]
        assert (second / name).exists()
    head = store.get_head(ContextId.parse("cli:a"))
    assert head is not None
    save_user_input(store, head, "beta")
    assert _search(store, "beta") == ["beta"]  # the first machine's index follows
    with PostgresStore(pg_database, schema=fresh_schema(), pool_size=1) as another:
        assert another.store_id() != store.store_id()


def _agrees(store: PostgresStore, *words: str) -> None:
    """The store's derived index lists what a recount of its heads finds, and its search
    finds ``words`` (one hit each) and nothing of ``"alpha"`` unless asked for."""
    found = index.of(store)
    assert found is not None
    listed = sorted(s.context for s in found.list_contexts_fast())
    assert listed == sorted(str(h.context) for h in store.list_contexts())
    for word in ("alpha", "beta", "gamma"):
        assert _search(store, word) == ([word] if word in words else [])


def test_a_copied_schema_keeps_an_index_of_its_own(
    store: PostgresStore,
    other: Any,
    pg_database: str,  # noqa: F811
) -> None:
    """A schema whose ``store_meta`` was copied from another store's carries its store id,
    yet gets its own index file on this machine: neither store's listing or search shows the
    other's contexts, each in turn refreshing after the other wrote."""
    add_context(store, "cli:a", "alpha")
    _agrees(store, "alpha")
    copy_schema = fresh_schema()
    with PostgresStore(pg_database, schema=copy_schema, pool_size=1) as copy:
        (made,) = other.execute("SELECT value FROM store_meta").fetchone()
        other.execute(
            f'UPDATE "{copy_schema}".store_meta SET value = %s WHERE key = %s', (made, "store_id")
        )
        add_context(copy, "cli:b", "beta")
        _agrees(copy, "beta")
        add_context(store, "cli:c", "gamma")
        _agrees(store, "alpha", "gamma")
        _agrees(copy, "beta")


@pytest.fixture
def database(pg_database: str) -> Iterator[str]:  # noqa: F811
    """A database of the test's own (``CREATE DATABASE ... TEMPLATE`` needs one that no one
    else is connected to)."""
    yield from own_database(pg_database)


def test_a_copied_database_keeps_an_index_of_its_own(database: str) -> None:
    """A database made by ``CREATE DATABASE ... TEMPLATE`` from a store's database is a copy
    of the store, with its store id: it gets an index file of its own, and each store's
    listing and search show its own contexts only. The original reached by another host name
    (``localhost``, not ``127.0.0.1``) still shares its index file."""
    with PostgresStore(database, pool_size=1) as store:
        add_context(store, "cli:a", "alpha")
        _agrees(store, "alpha")
    name = psycopg.conninfo.conninfo_to_dict(database)["dbname"]
    with _copied(database, name) as copied:
        with PostgresStore(database, pool_size=1) as store, PostgresStore(copied) as copy:
            add_context(copy, "cli:b", "beta")
            _agrees(copy, "alpha", "beta")
            add_context(store, "cli:c", "gamma")
            _agrees(store, "alpha", "gamma")
            _agrees(copy, "alpha", "beta")
            assert copy.store_id() != store.store_id()
            elsewhere = psycopg.conninfo.make_conninfo(database, host="localhost")
            with PostgresStore(elsewhere, pool_size=1) as again:
                assert again.store_id() == store.store_id()


@contextmanager
def _copied(dsn: str, name: str) -> Iterator[str]:
    """A copy of database ``name`` made by ``CREATE DATABASE ... TEMPLATE``, dropped after."""
    copy = f"{name}_copy"
    with psycopg.connect(dsn, dbname="postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{copy}" TEMPLATE "{name}"')
    try:
        yield psycopg.conninfo.make_conninfo(dsn, dbname=copy)
    finally:
        with psycopg.connect(dsn, dbname="postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{copy}" WITH (FORCE)')


def test_a_server_that_hides_its_system_identifier_still_names_the_index(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where ``pg_control_system()`` is kept from the role (some hosted servers), the index
    is named by the store's id and its database's and schema's oids, the cluster's part
    ``x``, and the index serves."""
    made, _, database, schema = store.store_id().rsplit("-", 3)
    hidden = _sql.STORE_ID.replace("pg_control_system()", "pg_control_hidden_here()")
    monkeypatch.setattr(_sql, "STORE_ID", hidden)
    assert store.store_id() == f"{made}-x-{database}-{schema}"
    add_context(store, "cli:a", "alpha")
    _agrees(store, "alpha")


def test_a_first_build_reads_a_page_of_sessions_in_a_few_statements(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first build reads the store a page of sessions at a time: their heads and segments
    in one statement, their lines in one per ``LINES`` lines (a session over that in one of
    its own), not a statement or more per session. It lists and finds what an index walked
    session by session does: a fork's two segments, a session read in one of its own."""
    from terrarium.index import _cursor

    monkeypatch.setattr(_cursor, "PAGE", 100)
    monkeypatch.setattr(_cursor, "LINES", 400)
    for n in range(230):
        add_context(store, f"cli:c{n:03d}", f"word{n}", "reply")
    big = add_context(store, "cli:big", *(f"long{n}" for n in range(450)))
    forked = fork_at(store, big, 2)
    store.set_head(ContextId.parse("cli:big"), forked, expected=big.segment_id)
    save_user_input(store, big, "offbranch")
    add_context(store, "cli:cold", "frozen")
    assert states.archive_context(store, ContextId.parse("cli:cold")) is not None
    statements: list[object] = []
    execute = psycopg.Cursor.execute

    def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        statements.append(query)
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    found = index.of(store)
    assert found is not None
    listed = found.list_contexts_fast()
    monkeypatch.undo()
    pages = 3  # 231 sessions, 100 a page; the big one's lines in a read of their own
    assert len(statements) <= 3 + 2 * pages + 1, statements
    assert listed == index.walked(store).list_contexts_fast()
    assert len(listed) == 231
    assert _search(store, "word229") == ["word229"]
    assert _search(store, "long449") == ["long449"]
    assert _search(store, "offbranch") == ["offbranch"]
    assert _search(store, "frozen") == []
