"""Schema migrations: the registry's rules, and every database backend migrating on open.

Each backend is migrated from a blank database and from its oldest schema (only
``m001_initial`` applied, with data written the way that version wrote it), and refuses a
database that records a migration it does not know.
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pg import fresh_schema, pg_database  # noqa: F401  (a fixture)
from terrarium import codec
from terrarium.errors import FormatVersionError
from terrarium.model import ContextId, TraceEntry
from terrarium.sessions import restore, save_user_input
from terrarium.stores.base import PodActiveSegmentRef, SearchQuery
from terrarium.stores.migrations import Migrations
from terrarium.stores.sqlite import SqliteStore
from terrarium.stores.sqlite import migrations as sqlite_backend

TS = "2026-05-01T12:00:00.000000Z"
SESSION, SEGMENT = uuid.UUID(int=11), uuid.UUID(int=12)
HEADER = {
    "v": 1,
    "seq": 0,
    "ts": TS,
    "kind": "header",
    "session_id": str(SESSION),
    "segment_id": str(SEGMENT),
    "context": "cli:old",
    "origin": {"kind": "root"},
    "system_prompt": "be brief",
    "config": {},
    "history": [],
}
ENTRY = {
    "v": 1,
    "seq": 1,
    "ts": TS,
    "kind": "user_input",
    "item": {"role": "user", "content": "hi"},
}


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


def test_every_backend_registers_the_same_steps() -> None:
    """SQLite and PostgreSQL schemas evolve in step: the same migration names, in order."""
    pytest.importorskip("psycopg")
    from terrarium.stores import postgres

    assert sqlite_backend.MIGRATIONS.names == postgres.MIGRATIONS.names
    assert sqlite_backend.MIGRATIONS.names[0] == "m001_initial"


# --------------------------------------------------------------------------- SQLite


def _sqlite_names(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [row[0] for row in conn.execute("SELECT name FROM migrations ORDER BY rowid")]
    finally:
        conn.close()


def test_sqlite_migrates_blank(tmp_path: Path) -> None:
    """A new database gets every migration, in order, each recorded once."""
    path = tmp_path / "t.db"
    SqliteStore(path).close()
    SqliteStore(path).close()  # reopening applies nothing twice
    assert _sqlite_names(path) == sqlite_backend.MIGRATIONS.names


def _old_sqlite(path: Path, stop_after: str) -> sqlite3.Connection:
    """A database migrated up to ``stop_after`` (at least m001), holding cli:old as that
    version wrote it: HEADER and ENTRY; the caller closes the connection."""
    conn = sqlite3.connect(path, isolation_level=None)
    names = sqlite_backend.migrate(conn, where="old", stop_after=stop_after)
    assert names == sqlite_backend.MIGRATIONS.names[: len(names)] and names[-1] == stop_after
    s, g = str(SESSION), str(SEGMENT)
    conn.execute("INSERT INTO contexts VALUES ('cli:old', 'cli', ?, ?, ?, ?)", (s, g, TS, TS))
    conn.execute("INSERT INTO sessions VALUES (?, 'cli:old', ?)", (s, TS))
    conn.execute("INSERT INTO segments VALUES (?, ?, ?)", (s, g, TS))
    for line in (HEADER, ENTRY):
        conn.execute(
            "INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?)",
            (s, g, line["seq"], line["kind"], TS, codec.encode(line).decode()),
        )
    return conn


def test_sqlite_migrates_from_oldest_schema(tmp_path: Path) -> None:
    """A database at m001 with data in it is upgraded on open; its data reads back."""
    path = tmp_path / "old.db"
    _old_sqlite(path, "m001_initial").close()
    assert _sqlite_names(path) == ["m001_initial"]
    with SqliteStore(path) as store:
        assert _sqlite_names(path) == sqlite_backend.MIGRATIONS.names
        state = restore(store, "cli:old")
        assert state.system_prompt == "be brief"
        assert state.history == [{"role": "user", "content": "hi"}]
        store.append_trace(SESSION, SEGMENT, [TraceEntry(TS, "chunk", {"n": 1})])
        assert store.read_trace(SESSION, SEGMENT) == [
            {"ts": TS, "event": "chunk", "data": {"n": 1}}
        ]


def test_sqlite_m004_moves_search_and_counts_onto_entry_ids(tmp_path: Path) -> None:
    """A database at m003, its newest item in search_recent only (as that version left it),
    is upgraded: entries keep their arrival order as ids, every item is found, the heads get
    their listing counts, and later appends are searched and counted."""
    path = tmp_path / "m003.db"
    conn = _old_sqlite(path, "m002_traces")
    s, g = str(SESSION), str(SEGMENT)
    try:
        sqlite_backend.migrate(conn, where="old", stop_after="m003_search")  # indexes "hi"
        late = ENTRY | {"seq": 2, "item": {"role": "assistant", "content": "hello late"}}
        conn.execute(
            "INSERT INTO entries VALUES (?, ?, 2, 'user_input', ?, ?)",
            (s, g, TS, codec.encode(late).decode()),
        )
        tags = f"s{s.replace('-', '')} rassistant t{b'cli'.hex()}"
        conn.execute(
            "INSERT INTO search_docs VALUES (2, ?, ?, 2, 'assistant', ?, 'hello late', ?)",
            (s, g, TS, tags),
        )
        conn.execute(
            "INSERT INTO search_recent (rowid, body, tags) VALUES (2, 'hello late', ?)", (tags,)
        )
        assert conn.execute("SELECT hw FROM search_meta").fetchone() == (1,)
    finally:
        conn.close()
    with SqliteStore(path) as store:
        assert _sqlite_names(path) == sqlite_backend.MIGRATIONS.names
        conn = sqlite3.connect(path)
        try:
            ids = conn.execute("SELECT id, seq FROM entries ORDER BY id").fetchall()
            meta = conn.execute("SELECT wm, hw FROM search_meta").fetchone()
            for table in ("search_fts", "search_recent"):
                conn.execute(f"INSERT INTO {table}({table}, rank) VALUES('integrity-check', 1)")
        finally:
            conn.close()
        assert ids == [(1, 0), (2, 1), (3, 2)] and meta == (3, 2)
        assert [hit.seq for hit in store.search(SearchQuery("hi"))] == [1]
        assert [hit.seq for hit in store.search(SearchQuery("late"))] == [2]
        [summary] = store.list_contexts_fast()
        assert (summary.message_count, summary.last_active) == (2, TS)
        head = store.get_head(ContextId("cli", "old"))
        assert head is not None
        save_user_input(store, head, "and a late reply")
        assert {hit.seq for hit in store.search(SearchQuery("late"))} == {2, 3}
        assert store.list_contexts_fast()[0].message_count == 3


def test_sqlite_refuses_newer_database(tmp_path: Path) -> None:
    """A database with a migration unknown to this version is refused on open."""
    path = tmp_path / "new.db"
    SqliteStore(path).close()
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("INSERT INTO migrations VALUES ('m999_from_the_future', ?)", (TS,))
    conn.close()
    with pytest.raises(FormatVersionError, match=r"newer terrarium.*m999_from_the_future"):
        SqliteStore(path)


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
    assert _sqlite_names(path) == sqlite_backend.MIGRATIONS.names


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


@pytest.mark.postgres
def test_postgres_migrates_blank(pg: tuple[Any, str], pg_database: str) -> None:  # noqa: F811
    """A new schema gets every migration, in order, each recorded once."""
    from terrarium.stores import postgres

    conn, schema = pg
    postgres.PostgresStore(pg_database, schema=schema).close()
    postgres.PostgresStore(pg_database, schema=schema).close()
    assert _pg_names(conn, schema) == postgres.MIGRATIONS.names


def _insert_m001_context(conn: Any, schema: str, lines: list[dict[str, Any]]) -> None:
    """``cli:old`` written as the first schema's tables hold it (``lines``: header first)."""
    q = f'"{schema}"'
    conn.execute(
        f"INSERT INTO {q}.contexts VALUES ('cli:old', 'cli', %s, %s, %s, %s)",
        (SESSION, SEGMENT, TS, TS),
    )
    conn.execute(f"INSERT INTO {q}.sessions VALUES (%s, 'cli:old', %s)", (SESSION, TS))
    conn.execute(f"INSERT INTO {q}.segments VALUES (%s, %s, %s)", (SESSION, SEGMENT, TS))
    for line in lines:
        text = codec.encode(line).decode()
        conn.execute(
            f"INSERT INTO {q}.entries VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s)",
            (SESSION, SEGMENT, line["seq"], line["kind"], TS, text, text),
        )


@pytest.mark.postgres
def test_postgres_migrates_from_oldest_schema(pg: tuple[Any, str], pg_database: str) -> None:  # noqa: F811
    """A schema at m001 with data in it is upgraded on open; its data reads back."""
    from terrarium.stores import postgres

    conn, schema = pg
    assert postgres.migrate(conn, schema, where="old", stop_after="m001_initial") == [
        "m001_initial"
    ]
    _insert_m001_context(conn, schema, [HEADER, ENTRY])
    assert _pg_names(conn, schema) == ["m001_initial"]
    with postgres.PostgresStore(pg_database, schema=schema) as store:
        assert _pg_names(conn, schema) == postgres.MIGRATIONS.names
        state = restore(store, ContextId("cli", "old"))
        assert state.system_prompt == "be brief"
        assert state.history == [{"role": "user", "content": "hi"}]
        store.append_trace(SESSION, SEGMENT, [TraceEntry(TS, "chunk", {"n": 1})])
        assert store.read_trace(SESSION, SEGMENT) == [
            {"ts": TS, "event": "chunk", "data": {"n": 1}}
        ]


@pytest.mark.postgres
def test_postgres_m004_counts_forks_and_keeps_search(pg: tuple[Any, str], pg_database: str) -> None:  # noqa: F811
    """A schema at m003 with a chain of forks is upgraded: each segment's row gets its tail,
    counts and a base that follows the forks, the index keeps what m003 indexed, and later
    appends are counted and found."""
    from terrarium.stores import postgres

    conn, schema = pg
    postgres.migrate(conn, schema, where="old", stop_after="m002_traces")
    q = f'"{schema}"'
    root, fork, fork2 = uuid.UUID(int=21), uuid.UUID(int=22), uuid.UUID(int=23)
    item = {"role": "user", "content": "old words"}
    segments = {
        root: [HEADER | {"segment_id": str(root), "history": [item]}, ENTRY, ENTRY | {"seq": 2}],
        fork: [
            HEADER
            | {"segment_id": str(fork), "history": None}
            | {"origin": {"kind": "fork", "parent": str(root), "at_seq": 1}},
            ENTRY,
        ],
        fork2: [
            HEADER
            | {"segment_id": str(fork2), "history": None}
            | {"origin": {"kind": "fork", "parent": str(fork), "at_seq": None}},
        ],
    }
    conn.execute(
        f"INSERT INTO {q}.contexts VALUES ('cli:old', 'cli', %s, %s, %s, %s)",
        (SESSION, fork2, TS, TS),
    )
    conn.execute(f"INSERT INTO {q}.sessions VALUES (%s, 'cli:old', %s)", (SESSION, TS))
    for segment, lines in segments.items():
        conn.execute(f"INSERT INTO {q}.segments VALUES (%s, %s, %s)", (SESSION, segment, TS))
        for line in lines:
            text = codec.encode(line).decode()
            conn.execute(
                f"INSERT INTO {q}.entries VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s)",
                (SESSION, segment, line["seq"], line["kind"], TS, text, text),
            )
    postgres.migrate(conn, schema, where="old", stop_after="m003_search")
    with postgres.PostgresStore(pg_database, schema=schema) as store:
        assert _pg_names(conn, schema) == postgres.MIGRATIONS.names
        rows = conn.execute(
            f"SELECT segment_id, next_seq, items, base_items, indexed_seq, dirty, type "
            f"FROM {q}.segments ORDER BY segment_id"
        ).fetchall()
        assert rows == [
            (root, 3, 2, 1, 2, False, "cli"),
            (fork, 2, 1, 2, 1, False, "cli"),
            (fork2, 1, 0, 3, 0, False, "cli"),
        ]
        [summary] = store.list_contexts_fast()
        state = restore(store, ContextId("cli", "old"))
        assert summary.message_count == len(state.history) == 3
        assert {(h.segment_id, h.seq) for h in store.search(SearchQuery("old words"))} == {
            (root, 0)
        }
        head = store.get_head(ContextId("cli", "old"))
        assert head is not None
        save_user_input(store, head, "new words")
        assert store.list_contexts_fast()[0].message_count == 4
        assert [(h.segment_id, h.seq) for h in store.search(SearchQuery("new"))] == [(fork2, 1)]


@pytest.mark.postgres
def test_postgres_refuses_newer_schema(pg: tuple[Any, str], pg_database: str) -> None:  # noqa: F811
    """A schema with a migration unknown to this version is refused on open."""
    from terrarium.stores import postgres

    conn, schema = pg
    postgres.PostgresStore(pg_database, schema=schema).close()
    conn.execute(f'INSERT INTO "{schema}".migrations (name) VALUES (%s)', ("m999_future",))
    with pytest.raises(FormatVersionError, match=r"newer terrarium.*m999_future"):
        postgres.PostgresStore(pg_database, schema=schema)


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
    assert _pg_names(conn, schema) == postgres.MIGRATIONS.names


def test_sqlite_m005_lets_sessions_be_detached(tmp_path: Path) -> None:
    """A database at m004 is upgraded: its sessions keep their contexts (none is listed as
    detached), and a detached session can then be created and attached."""
    from terrarium.sessions import attach_context, create_segment, detached_sessions

    path = tmp_path / "m004.db"
    conn = _old_sqlite(path, "m003_search")
    try:
        sqlite_backend.migrate(conn, where="old", stop_after="m004_derived_state")
    finally:
        conn.close()
    assert _sqlite_names(path)[-1] == "m004_derived_state"
    with SqliteStore(path) as store:
        assert _sqlite_names(path) == sqlite_backend.MIGRATIONS.names
        assert detached_sessions(store) == []
        conn = sqlite3.connect(path)
        try:
            rows = conn.execute("SELECT session_id, context, created_at FROM sessions").fetchall()
        finally:
            conn.close()
        assert rows == [(str(SESSION), "cli:old", TS)]
        session_id, segment_id = create_segment(store)
        assert detached_sessions(store) == [session_id]
        attach_context(store, "cli:new", PodActiveSegmentRef(session_id, segment_id))
        assert [h.context for h in store.list_contexts()] == ["cli:new", "cli:old"]
        assert restore(store, "cli:old").history == [{"role": "user", "content": "hi"}]


@pytest.mark.postgres
def test_postgres_m005_lets_sessions_be_detached(pg: tuple[Any, str], pg_database: str) -> None:  # noqa: F811
    """A schema at m004 is upgraded: its sessions keep their contexts, and a detached session
    can then be created and attached."""
    from terrarium.sessions import attach_context, create_segment, detached_sessions
    from terrarium.stores import postgres

    conn, schema = pg
    postgres.migrate(conn, schema, where="old", stop_after="m004_derived_state")
    with postgres.PostgresStore(pg_database, schema=schema) as store:
        create_segment(store, context="cli:old")
        assert _pg_names(conn, schema) == postgres.MIGRATIONS.names
        assert detached_sessions(store) == []
        session_id, segment_id = create_segment(store)
        assert detached_sessions(store) == [session_id]
        attach_context(store, "cli:new", PodActiveSegmentRef(session_id, segment_id))
        assert [h.context for h in store.list_contexts()] == ["cli:new", "cli:old"]
        assert detached_sessions(store) == []


@pytest.mark.postgres
def test_postgres_m011_keeps_search_rows_without_their_text(
    pg: tuple[Any, str],
    pg_database: str,  # noqa: F811
) -> None:
    """A schema at m010 whose search rows hold the items' texts is upgraded: the rows keep
    their ids and ``tsv`` but no text, hits still show their snippets (read from the lines),
    and new rows are numbered after the old ones."""
    from terrarium.stores import postgres

    conn, schema = pg
    postgres.migrate(conn, schema, where="old", stop_after="m002_traces")
    header = HEADER | {"history": [{"role": "user", "content": "a kestrel in the header"}]}
    entry = ENTRY | {"item": {"role": "user", "content": "a Kestrel flew by"}}
    _insert_m001_context(conn, schema, [header, entry])
    q = f'"{schema}"'
    postgres.migrate(conn, schema, where="old", stop_after="m010_listing_sorts")
    rows = f"SELECT seq, n, id, type, role, ts, tsv::text FROM {q}.search_docs ORDER BY id"
    before = conn.execute(rows).fetchall()
    assert [(seq, n) for seq, n, *_ in before] == [(0, 0), (1, 0)]
    with postgres.PostgresStore(pg_database, schema=schema) as store:
        assert _pg_names(conn, schema) == postgres.MIGRATIONS.names
        assert conn.execute(rows).fetchall() == before
        columns = conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = 'search_docs'",
            (schema,),
        ).fetchall()
        assert {c for (c,) in columns} == {
            "session_id", "segment_id", "seq", "n", "id", "type", "role", "ts", "tsv"
        }  # fmt: skip
        hits = store.search(SearchQuery("kestrel"))
        assert {(h.seq, h.snippet) for h in hits} == {
            (0, "a kestrel in the header"),
            (1, "a Kestrel flew by"),
        }
        assert all(h.snippet[a:b].lower() == "kestrel" for h in hits for a, b in h.highlights)
        head = store.get_head(ContextId("cli", "old"))
        assert head is not None
        save_user_input(store, head, "another kestrel")
        [new] = store.search(SearchQuery("another kestrel"))
        assert new.seq == 2 and new.snippet == "another kestrel"
        (last,) = conn.execute(f"SELECT max(id) FROM {q}.search_docs").fetchone() or (0,)
        assert last > before[-1][2]


@pytest.mark.postgres
def test_postgres_m012_switches_the_append_notes_off(
    pg: tuple[Any, str],
    pg_database: str,  # noqa: F811
) -> None:
    """A schema at m011, whose appends always notify, is upgraded: the appends' trigger is off
    until a feed joins, and a joined feed hears an append."""
    from terrarium.sessions import create_segment
    from terrarium.stores import postgres

    conn, schema = pg
    postgres.migrate(conn, schema, where="old", stop_after="m011_search_rows_without_text")
    state = (
        "SELECT tgenabled FROM pg_trigger WHERE tgname = 'segments_notify' "
        "AND tgrelid = %s::regclass"
    )
    where = (f'"{schema}".segments',)
    assert conn.execute(state, where).fetchone() == ("O",)
    with postgres.PostgresStore(pg_database, schema=schema) as store:
        assert _pg_names(conn, schema) == postgres.MIGRATIONS.names
        assert conn.execute(state, where).fetchone() == ("D",)
        session_id, _ = create_segment(store, context="cli:old")
        with store.change_feed() as feed:
            assert conn.execute(state, where).fetchone() == ("O",)
            head = store.get_head(ContextId("cli", "old"))
            assert head is not None
            save_user_input(store, head, "heard?")
            assert feed.wait(30) == f"session:{session_id}"
        assert conn.execute(state, where).fetchone() == ("D",)


# --------------------------------------------------------------------------- SQLite: m013

M012 = "m012_notify_only_when_listened"


def _sql_rows(path: Path, statement: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(statement).fetchall()
    finally:
        conn.close()


# Every entry with its segment's ids, on m013's keys and on the keys before them.
ENTRY_ROWS = (
    "SELECT e.id, g.session_id, g.segment_id, e.seq, e.kind, e.ts, e.line FROM entries AS e "
    "JOIN segments AS g ON g.id = e.seg ORDER BY e.id"
)
OLD_ENTRY_ROWS = "SELECT id, session_id, segment_id, seq, kind, ts, line FROM entries ORDER BY id"
VIEW_ROWS = (
    "SELECT * FROM transcript ORDER BY context, position",
    "SELECT * FROM transcript_lineage ORDER BY context, depth",
    "SELECT * FROM transcript_items ORDER BY context, depth DESC, seq, n",
)


def test_sqlite_m013_keys_a_blank_database_by_segment(tmp_path: Path) -> None:
    """A new database keys its segments by an AUTOINCREMENT integer and its entries by
    (segment key, seq) alone, without the two text ids; the views read them."""
    from terrarium.sessions import create_segment

    path = tmp_path / "t.db"
    with SqliteStore(path) as store:
        create_segment(store, context="cli:new")
        head = store.get_head(ContextId("cli", "new"))
        assert head is not None
        save_user_input(store, head, "hello keys")
    columns = {
        table: [row[1] for row in _sql_rows(path, f"PRAGMA table_info({table})")]
        for table in ("segments", "entries")
    }
    assert columns == {
        "segments": ["id", "session_id", "segment_id", "created_at"],
        "entries": ["id", "seg", "seq", "kind", "ts", "line"],
    }
    [(schema,)] = _sql_rows(path, "SELECT sql FROM sqlite_schema WHERE name = 'segments'")
    assert "AUTOINCREMENT" in schema
    indexes = _sql_rows(path, "SELECT name FROM sqlite_schema WHERE tbl_name = 'entries'")
    [(index,)] = [row for row in indexes if row[0] != "entries"]
    assert [row[2] for row in _sql_rows(path, f"PRAGMA index_info({index})")] == ["seg", "seq"]
    assert _sql_rows(path, "SELECT seq, text FROM transcript WHERE context = 'cli:new'") == [
        (1, "hello keys")
    ]


def _m013_history(store: SqliteStore) -> None:
    """A store worth migrating: build_history's contexts (forks, a compaction, a clear, an
    import, one in the trash), a head that continues a fork, two archived contexts (one from
    the middle of the entry ids, which leaves a gap in them), a pin, a detached session, a
    trace, a blob, and derived state read up to all but the last three entries."""
    from helpers.history import add_context, build_history
    from terrarium.sessions import create_segment, fork_at

    build_history(store)
    assert store.archive_context(ContextId("game", "run-1")) is not None
    head = store.get_head(ContextId("cli", "main"))
    assert head is not None
    fork = fork_at(store, head, 2)  # the head continues its parent up to seq 2 of 3
    store.set_head(ContextId("cli", "main"), fork, expected=head.segment_id)
    add_context(store, "cli:cold", "an archived walrus")
    assert store.archive_context(ContextId("cli", "cold")) is not None
    assert store.pin_context(ContextId("cli", "main"))
    session_id, segment_id = create_segment(store)
    save_user_input(store, PodActiveSegmentRef(session_id, segment_id), "a detached walrus")
    head = store.get_head(ContextId("cli", "main"))
    assert head is not None
    store.append_trace(head.session_id, head.segment_id, [TraceEntry(TS, "chunk", {"n": 1})])
    save_user_input(store, head, "a blob walrus " + "w" * 70_000)
    store.search(SearchQuery("fox"))  # the derived state reads every entry
    for text in ("a late walrus", "another late walrus", "the last late walrus"):
        save_user_input(store, head, text)  # fewer than SEARCH_BATCH: left for the catch-up


def _observed(store: SqliteStore) -> dict[str, Any]:
    """What the store gives back of the data of ``_m013_history``."""
    from terrarium.sessions import restore_by_segment

    contexts = [h.context for h in store.list_contexts()] + ["cli:cold", "game:run-1"]
    [detached] = store.detached_sessions()
    [segment] = store.list_segments(detached)
    main = store.get_head(ContextId("cli", "main"))
    assert main is not None
    return {
        "restores": {context: restore(store, context) for context in contexts},
        "detached": restore_by_segment(store, detached, segment),
        "trace": store.read_trace(main.session_id, main.segment_id),
        "hits": [
            store.search(SearchQuery(word, limit=50))
            for word in ("fox", "walrus", "late", "imported", "東京")
        ],
        "archived hits": store.search(SearchQuery("walrus", archived=True)),
        "listing": store.list_contexts_fast(),
        "archived": store.archived_contexts(),
        "trash": [(t.context, t.message_count) for t in store.trashed_contexts()],
        "pins": store.pinned_contexts(),
    }


def test_sqlite_m013_upgrades_a_store_with_history(tmp_path: Path) -> None:
    """A database at m012 is upgraded: every entry keeps its id, seq, kind, ts and line under
    its segment; the derived state's watermark still names the entries it read (the three
    after it are found once caught up); restores, searches and listing are the ones before;
    the views give the same rows as m006's; new entries and segments get ids above the old."""
    from helpers.old_sqlite import downgrade
    from terrarium.sessions import create_segment

    built, path = tmp_path / "built.db", tmp_path / "m012.db"
    with SqliteStore(built) as store:
        _m013_history(store)
    downgrade(built, path, M012)
    entries = _sql_rows(built, ENTRY_ROWS)
    assert _sql_rows(path, OLD_ENTRY_ROWS) == entries
    views = [_sql_rows(path, statement) for statement in VIEW_ROWS]  # m006's, on the old keys
    meta = _sql_rows(path, "SELECT wm, hw, floor FROM search_meta")
    assert meta[0][0] == entries[-4][0]  # three entries wait for the catch-up
    assert entries[-1][0] > len(entries)  # ids with a gap
    with SqliteStore(built) as store:
        expected = _observed(store)
    with SqliteStore(path) as store:
        assert _sqlite_names(path) == sqlite_backend.MIGRATIONS.names
        assert _sql_rows(path, ENTRY_ROWS) == entries
        assert _sql_rows(path, "SELECT wm, hw, floor FROM search_meta") == meta
        assert [_sql_rows(path, statement) for statement in VIEW_ROWS] == views
        assert _observed(store) == expected
        assert len(expected["hits"][2]) == 3  # the late entries, found
        keys = _sql_rows(path, "SELECT max(id) FROM segments")[0][0]
        create_segment(store, context="cli:after")
        head = store.get_head(ContextId("cli", "after"))
        assert head is not None
        save_user_input(store, head, "after the upgrade")
    new = _sql_rows(path, ENTRY_ROWS)[len(entries) :]
    assert [row[3] for row in new] == [0, 1] and new[0][0] > entries[-1][0]
    assert _sql_rows(path, "SELECT max(id) FROM segments")[0][0] == keys + 1


def test_sqlite_m013_keeps_entries_no_segment_names(tmp_path: Path) -> None:
    """An entry whose segment has no ``segments`` row (written by hand: the store never does)
    survives the upgrade, under a segment made for it, created at its first entry's time."""
    path = tmp_path / "m012.db"
    conn = _old_sqlite(path, "m003_search")
    try:
        sqlite_backend.migrate(conn, where="old", stop_after=M012)
        conn.execute("DELETE FROM segments")
        before = conn.execute(OLD_ENTRY_ROWS).fetchall()
    finally:
        conn.close()
    with SqliteStore(path) as store:
        assert _sql_rows(path, ENTRY_ROWS) == before
        assert _sql_rows(path, "SELECT created_at FROM segments") == [(TS,)]
        assert restore(store, "cli:old").history == [{"role": "user", "content": "hi"}]


# --------------------------------------------------------------------------- m015 (SQLite)


def _m015_history(store: Any) -> None:
    """Contexts in every lifecycle state m007's rows could hold: hot and pinned, archived and
    pinned, trashed from hot (pinned), trashed from the archive, and plain hot."""
    from helpers.history import add_context

    for name in ("cli:pinned", "cli:cold", "cli:bin", "cli:cold-bin", "cli:plain"):
        add_context(store, name, f"{name} walrus", "more")
    for name in ("cli:pinned", "cli:cold", "cli:bin"):
        assert store.pin_context(ContextId.parse(name))
    for name in ("cli:cold", "cli:cold-bin"):
        assert store.archive_context(ContextId.parse(name)) is not None
    for name in ("cli:bin", "cli:cold-bin"):
        assert store.delete_context(ContextId.parse(name))


def _m015_observed(store: Any) -> dict[str, Any]:
    contexts = ["cli:pinned", "cli:cold", "cli:plain"]
    return {
        "restores": {context: restore(store, context) for context in contexts},
        "listing": store.list_contexts_fast(),
        "archived": store.archived_contexts(),
        "trash": store.trashed_contexts(),
        "pins": store.pinned_contexts(),
        "hits": store.search(SearchQuery("walrus", archived=True)),
        "detached": store.detached_sessions(),
    }


def test_sqlite_m015_carries_archive_trash_and_pins_into_state_records(tmp_path: Path) -> None:
    """A database at m014 whose archived, trashed and pinned contexts are m007's rows is
    upgraded: each becomes its session's state record (a trashed session detached), pins and
    the old archive columns go, and the store shows the same archive, trash, pins, listing,
    restores and hits; every trash entry then restores in its state, pin included, and a
    write wakes an archived context."""
    from helpers.old_sqlite import downgrade

    built, path = tmp_path / "built.db", tmp_path / "m014.db"
    with SqliteStore(built) as store:
        _m015_history(store)
        expected = _m015_observed(store)
    downgrade(built, path, "m014_staged_search_items")
    assert _sql_rows(path, "SELECT count(*) FROM pins") == [(3,)]
    assert _sql_rows(path, "SELECT count(trash_id), count(*) FROM archived_contexts") == [(2, 3)]
    with SqliteStore(path) as store:
        assert _sqlite_names(path) == sqlite_backend.MIGRATIONS.names
        assert _m015_observed(store) == expected
        tables = {row[0] for row in _sql_rows(path, "SELECT name FROM sqlite_schema")}
        assert "pins" not in tables
        columns = [row[1] for row in _sql_rows(path, "PRAGMA table_info(archived_contexts)")]
        assert columns == [
            "session_id",
            "context",
            "type",
            "segment_id",
            "created_at",
            "updated_at",
        ]
        for entry in store.trashed_contexts():
            back = ContextId("back", entry.context.split(":")[1])
            store.restore_trashed(entry.trash_id, as_context=back)
            assert store.is_archived(back) == entry.archived
            assert (str(back) in store.pinned_contexts()) == entry.pinned
            assert len(restore(store, back).history) == entry.message_count
        head = store.get_head(ContextId("cli", "cold"))
        assert head is not None
        save_user_input(store, head, "awake")
        assert not store.is_archived(ContextId("cli", "cold"))
        assert store.pinned_contexts() == {"cli:pinned", "cli:cold", "back:bin"}


# A PostgreSQL schema of this version taken back to m014: the records become m007's rows.
_PG_TO_M014 = (
    "CREATE TABLE pins (session_id uuid PRIMARY KEY, pinned_at text NOT NULL)",
    "INSERT INTO pins SELECT session_id, created_at FROM sessions "
    "WHERE (state::jsonb ->> 'pinned')::boolean",
    """CREATE TABLE m007_archived (session_id uuid PRIMARY KEY, context text NOT NULL,
        type text NOT NULL, segment_id uuid NOT NULL, created_at text NOT NULL,
        updated_at text NOT NULL, archived_at text NOT NULL, last_active text NOT NULL,
        message_count integer NOT NULL, hot_bytes bigint NOT NULL,
        archived_bytes bigint NOT NULL, trash_id text, deleted_at text, deleted_from text)""",
    """INSERT INTO m007_archived SELECT a.session_id, a.context, a.type, a.segment_id,
        a.created_at, a.updated_at, r #>> '{archived,archived_at}',
        r #>> '{archived,last_active}', (r #>> '{archived,message_count}')::int,
        (r #>> '{cold,hot_bytes}')::bigint, (r #>> '{cold,cold_bytes}')::bigint, NULL, NULL, NULL
        FROM archived_contexts AS a JOIN (SELECT session_id, state::jsonb AS r FROM sessions)
        AS s USING (session_id)""",
    """INSERT INTO m007_archived SELECT session_id, t ->> 'context',
        split_part(t ->> 'context', ':', 1), (t ->> 'segment_id')::uuid, created_at,
        t ->> 'deleted_at', coalesce(r #>> '{archived,archived_at}', t ->> 'deleted_at'),
        coalesce(r #>> '{archived,last_active}', ''), (t ->> 'message_count')::int,
        (r #>> '{cold,hot_bytes}')::bigint, (t ->> 'bytes')::bigint, t ->> 'trash_id',
        t ->> 'deleted_at', CASE WHEN r ? 'archived' THEN 'archived' ELSE 'hot' END
        FROM (SELECT *, state::jsonb AS r, state::jsonb -> 'trashed' AS t FROM sessions) AS s
        WHERE t IS NOT NULL""",
    "UPDATE sessions SET context = state::jsonb #>> '{trashed,context}' "
    "WHERE state::jsonb ? 'trashed'",
    "DROP TABLE archived_contexts",
    "ALTER TABLE m007_archived RENAME TO archived_contexts",
    "ALTER TABLE sessions DROP COLUMN state",
    "DELETE FROM migrations WHERE name = 'm015_session_states'",
)


@pytest.mark.postgres
def test_postgres_m015_carries_archive_trash_and_pins_into_state_records(
    pg: tuple[Any, str],
    pg_database: str,  # noqa: F811
) -> None:
    """A schema at m014 whose archived, trashed and pinned contexts are m007's rows is
    upgraded: the store shows the same archive, trash, pins, listing, restores and hits, and
    every trash entry restores in its state, pin included."""
    from terrarium.stores import postgres

    conn, schema = pg
    with postgres.PostgresStore(pg_database, schema=schema) as store:
        _m015_history(store)
        expected = _m015_observed(store)
    with conn.transaction():
        conn.execute(f"SET LOCAL search_path TO {schema}")
        for statement in _PG_TO_M014:
            conn.execute(statement)
        assert conn.execute(
            "SELECT count(trash_id), count(*) FROM archived_contexts"
        ).fetchone() == (2, 3)
    with postgres.PostgresStore(pg_database, schema=schema) as store:
        assert _pg_names(conn, schema) == postgres.MIGRATIONS.names
        assert _m015_observed(store) == expected
        for entry in store.trashed_contexts():
            back = ContextId("back", entry.context.split(":")[1])
            store.restore_trashed(entry.trash_id, as_context=back)
            assert store.is_archived(back) == entry.archived
            assert (str(back) in store.pinned_contexts()) == entry.pinned
            assert len(restore(store, back).history) == entry.message_count
        assert store.pinned_contexts() == {"cli:pinned", "cli:cold", "back:bin"}
