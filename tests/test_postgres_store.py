"""PostgresStore specifics: exact lines, concurrency across processes, advisory locks, batched
appends, the derived index over the change cursor (concurrent appends and searches, reindex)
and a schema that can be distributed by session. The cursor itself: test_postgres_changes.py.

The Store contract itself is checked by tests/contract/ on every backend. Every test here
gets a fresh schema in this run's throwaway database (see tests/pg.py).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import random
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pg import fresh_schema, pg_database  # noqa: F401  (a fixture)
from terrarium import index, states

psycopg = pytest.importorskip("psycopg")

from terrarium import codec  # noqa: E402
from terrarium.agent.multi_context_manager import MultiContextManager  # noqa: E402
from terrarium.errors import ConflictError, SegmentNotFound, StoreError  # noqa: E402
from terrarium.index._query import SearchQuery  # noqa: E402
from terrarium.llm.vllm_client import ChatResult  # noqa: E402
from terrarium.model import ContextId, SegmentOrigin  # noqa: E402
from terrarium.sessions import (  # noqa: E402
    append_entry,
    create_segment,
    ensure_head_or_fork,
    restore,
)
from terrarium.stores.base import NewEntry, PodActiveSegmentRef  # noqa: E402
from terrarium.stores.memory import MemoryStore  # noqa: E402
from terrarium.stores.postgres import PostgresStore, _sql  # noqa: E402
from terrarium.stores.postgres._sql import lock_key  # noqa: E402

pytestmark = pytest.mark.postgres

TS = "2026-05-01T12:00:00.000000Z"
MAIN = ContextId("cli", "main")


@pytest.fixture
def schema() -> str:
    return fresh_schema()


@pytest.fixture
def store(pg_database: str, schema: str) -> Iterator[PostgresStore]:  # noqa: F811
    with PostgresStore(pg_database, schema=schema, pool_size=4) as instance:
        yield instance


@pytest.fixture
def sql(pg_database: str, schema: str) -> Iterator[Any]:  # noqa: F811
    """A separate autocommit connection for looking at the tables directly."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        yield conn


def _search(store: PostgresStore, query: SearchQuery) -> list[Any]:
    """``query`` asked of the store's derived index."""
    found = index.of(store)
    assert found is not None
    return found.search(query)


def _entry(token: str) -> NewEntry:
    return NewEntry("item", TS, {"item": {"role": "assistant", "content": token}, "token": token})


def test_lines_are_stored_exactly(store: PostgresStore, sql: Any) -> None:
    """line keeps the JSON byte for byte, a NUL character (which JSONB cannot hold) included;
    reads equal MemoryStore's, key order included; line::jsonb serves ad hoc queries."""
    memory = MemoryStore()
    header = {
        "v": 1,
        "ts": TS,
        "kind": "header",
        "session_id": str(uuid.UUID(int=1)),
        "segment_id": str(uuid.UUID(int=2)),
        "zz_future_key": {"nested": [1, 2.5, None, "é"]},
    }
    plain = {"zeta": 1, "alpha": {"b": 2, "a": 1}, "item": {"role": "user", "content": "hi"}}
    nul = {"item": {"role": "tool", "content": "bytes\x00here"}}
    for s in (store, memory):
        s.create_context(MAIN, header)
        s.append(uuid.UUID(int=1), uuid.UUID(int=2), [NewEntry("custom", TS, plain)])
        s.append(uuid.UUID(int=1), uuid.UUID(int=2), [NewEntry("item", TS, nul)])
    got = store.read_segment(uuid.UUID(int=1), uuid.UUID(int=2))
    want = memory.read_segment(uuid.UUID(int=1), uuid.UUID(int=2))
    assert got == want
    assert [list(line) for line in got.entries] == [list(line) for line in want.entries]
    rows = sql.execute("SELECT seq, kind, ts, line FROM entries ORDER BY seq").fetchall()
    assert [r[3] for r in rows] == [
        codec.encode(line).decode() for line in [want.header, *want.entries]
    ]
    assert rows[1][1:3] == ("custom", TS)
    hits = sql.execute(
        'SELECT seq FROM entries WHERE seq < 2 AND line::jsonb @> \'{"alpha": {"a": 1}}\''
    )
    assert hits.fetchall() == [(1,)]


def test_batched_append_is_one_atomic_insert(store: PostgresStore, sql: Any) -> None:
    """A bulk append of many entries lands whole, in order; a conflicting one lands not at all."""
    session_id, segment_id = create_segment(store, context=MAIN)
    batch = [_entry(f"b{i}") for i in range(500)]
    assert store.append(session_id, segment_id, batch) == 1
    with pytest.raises(ConflictError, match="is at seq 501, the writer expected 3"):
        store.append(session_id, segment_id, batch, expected_seq=3)
    assert store.append(session_id, segment_id, batch[:2], expected_seq=501) == 501
    stored = store.read_segment(session_id, segment_id).entries
    assert [e["token"] for e in stored] == [f"b{i}" for i in range(500)] + ["b0", "b1"]
    assert [e["seq"] for e in stored] == list(range(1, 503))


def test_expected_seq_beyond_the_tail_is_a_conflict(store: PostgresStore) -> None:
    """expected_seq past the tail never leaves a gap: ConflictError, nothing written."""
    session_id, segment_id = create_segment(store, context=MAIN)
    with pytest.raises(ConflictError, match="is at seq 1, the writer expected 5"):
        store.append(session_id, segment_id, [_entry("x")], expected_seq=5)
    with pytest.raises(SegmentNotFound):
        store.append(session_id, uuid.uuid4(), [_entry("x")], expected_seq=1)
    assert store.append(session_id, segment_id, [_entry("a"), _entry("b")]) == 1
    for stale in (-1, 0, 1, 2, 4):  # below the tail (the header, taken seqs) or beyond it
        with pytest.raises(ConflictError, match=f"is at seq 3, the writer expected {stale}"):
            store.append(session_id, segment_id, [_entry("x")], expected_seq=stale)
        with pytest.raises(ConflictError, match=f"is at seq 3, the writer expected {stale}"):
            store.append(session_id, segment_id, [_entry("x"), _entry("y")], expected_seq=stale)
    assert [e["token"] for e in store.read_segment(session_id, segment_id).entries] == ["a", "b"]


def test_another_process_view_is_not_trusted(
    store: PostgresStore,
    pg_database: str,  # noqa: F811
    schema: str,
) -> None:
    """Appends through two stores on one segment interleave correctly (stale seq caches)."""
    session_id, segment_id = create_segment(store, context=MAIN)
    with PostgresStore(pg_database, schema=schema, pool_size=1) as other:
        for i in range(5):
            assert store.append(session_id, segment_id, [_entry(f"a{i}")]) == 2 * i + 1
            assert other.append(session_id, segment_id, [_entry(f"b{i}")]) == 2 * i + 2
        with pytest.raises(ConflictError):
            store.append(session_id, segment_id, [_entry("late")], expected_seq=10)
    assert store.next_seq(session_id, segment_id) == 11


def test_schemas_in_one_database_stay_apart(
    store: PostgresStore,
    pg_database: str,  # noqa: F811
) -> None:
    """Every pooled connection has its store's schema (alone) on its search_path: stores in
    other schemas of the database, one named by a reserved word, see none of its data; a
    schema name that is not a plain lowercase name is refused."""
    session_id, segment_id = create_segment(store, context=MAIN)
    store.append(session_id, segment_id, [_entry("kappa here")])
    with PostgresStore(pg_database, schema="select", pool_size=2) as other:
        try:
            assert other.list_contexts() == []
            assert _search(other, SearchQuery("kappa")) == []
            create_segment(other, context=MAIN)
            assert len(store.list_contexts()) == len(other.list_contexts()) == 1
            assert [h.seq for h in _search(store, SearchQuery("kappa"))] == [1]
        finally:
            with psycopg.connect(pg_database, autocommit=True) as conn:
                conn.execute('DROP SCHEMA "select" CASCADE')
    for bad in ('x"; DROP SCHEMA public; --', "Upper", "1st", ""):
        with pytest.raises(ValueError, match="invalid schema name"):
            PostgresStore(pg_database, schema=bad)


def test_threads_append_to_one_segment(store: PostgresStore) -> None:
    """8 threads appending at once: every acknowledged entry is stored once, seqs gapless."""
    session_id, segment_id = create_segment(store, context=MAIN)
    acked: list[tuple[int, str]] = []
    barrier = threading.Barrier(8)

    def work(worker: int) -> None:
        barrier.wait()
        for i in range(25):
            token = f"{worker}-{i}"
            acked.append((store.append(session_id, segment_id, [_entry(token)]), token))

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stored = store.read_segment(session_id, segment_id).entries
    assert [e["seq"] for e in stored] == list(range(1, 201))
    assert sorted(acked) == sorted((e["seq"], e["token"]) for e in stored)


def test_lock_context_is_an_advisory_lock(store: PostgresStore, pg_database: str) -> None:  # noqa: F811
    """While held, another session cannot take the context's advisory lock; after, it can."""
    key = lock_key(store.schema, str(MAIN))
    with psycopg.connect(pg_database, autocommit=True) as other:

        def try_lock() -> bool:
            got = bool(other.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0])
            if got:
                other.execute("SELECT pg_advisory_unlock(%s)", (key,))
            return got

        with store.lock_context(MAIN):
            assert not try_lock()
            with store.lock_context(ContextId("cli", "other")):  # other contexts are free
                pass
        assert try_lock()


def test_lock_context_excludes_other_threads(store: PostgresStore) -> None:
    """Two threads never hold the same context's lock at once."""
    inside = most = 0
    guard = threading.Lock()
    barrier = threading.Barrier(4)

    def work() -> None:
        nonlocal inside, most
        barrier.wait()
        for _ in range(10):
            with store.lock_context(MAIN):
                with guard:
                    inside += 1
                    most = max(most, inside)
                with guard:
                    inside -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most == 1


def test_repr_and_errors_hide_the_password() -> None:
    """Neither repr nor a connection failure shows the DSN's password."""
    secret = "Sup3r-s3cret"
    with pytest.raises(StoreError) as info:
        PostgresStore(f"postgresql://u:{secret}@127.0.0.1:1/db?connect_timeout=2")
    assert secret not in str(info.value)
    assert "u:***@127.0.0.1:1" in str(info.value)


def test_schema_is_distributable_by_session(store: PostgresStore, sql: Any) -> None:
    """Every table but migrations carries session_id; every key of the session tables starts
    with it, so the tables can be distributed (Citus) by session_id unchanged."""
    columns = sql.execute(
        "SELECT c.table_name, c.column_name FROM information_schema.columns AS c "
        "JOIN information_schema.tables AS t USING (table_schema, table_name) "
        "WHERE c.table_schema = %s AND t.table_type = 'BASE TABLE'",  # not the views
        (store.schema,),
    ).fetchall()
    # blobs are content-addressed and shared by sessions, store_meta holds the store's id:
    # reference tables under Citus.
    tables = {t for t, _ in columns} - {"migrations", "blobs", "store_meta"}
    assert tables == {
        "contexts",
        "sessions",
        "segments",
        "entries",
        "traces",
        "session_changes",
        "archived_contexts",
        "archived_segments",
        "blob_refs",
    }
    assert all((t, "session_id") in columns for t in tables)
    keys = sql.execute(
        """SELECT c.conrelid::regclass::text, c.contype, a.attname
           FROM pg_constraint c JOIN pg_attribute a
             ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
           WHERE c.connamespace = %s::regnamespace AND c.contype IN ('p', 'u', 'f')""",
        (store.schema,),
    ).fetchall()
    for table, _, first_column in keys:
        name = table.rsplit(".", 1)[-1].strip('"')
        if name not in ("contexts", "migrations", "blobs", "store_meta"):
            assert first_column == "session_id", (table, first_column)


def test_concurrent_catch_ups_index_each_item_once(store: PostgresStore) -> None:
    """Threads appending to and searching many contexts at once (each search refreshes the
    derived index from the change cursor): afterwards every item is indexed exactly once and
    found."""
    heads = [create_segment(store, context=ContextId("cli", f"c{i}")) for i in range(6)]
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for i in range(25):
                session_id, segment_id = heads[(worker + i) % len(heads)]
                store.append(session_id, segment_id, [_entry(f"gamma w{worker}x{i}")])
                if i % 5 == 0:
                    _search(store, SearchQuery("gamma", limit=5))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    hits = _search(store, SearchQuery("gamma", limit=100))
    assert len({(h.segment_id, h.seq) for h in hits}) == len(hits) == 100
    for w in range(4):
        for i in range(25):
            found = [h.snippet for h in _search(store, SearchQuery(f"gamma w{w}x{i}"))]
            assert found == [f"gamma w{w}x{i}"]


def test_reindex_rebuilds_the_search_index(store: PostgresStore) -> None:
    """reindex rebuilds the derived index from the entries, headers' histories included; a
    lost index file is built again on the next search."""
    session_id, segment_id = create_segment(store, context=MAIN)
    store.append(session_id, segment_id, [_entry("delta one"), _entry("delta two")])
    before = _search(store, SearchQuery("delta"))
    assert len(before) == 2
    assert index.reindex(store) == 1
    assert _search(store, SearchQuery("delta")) == before
    found = index.of(store)
    assert found is not None
    found.path.unlink()
    assert _search(store, SearchQuery("delta")) == before


# --------------------------------------------------------------------------- many processes


def _agent(dsn: str, schema: str, worker: int, contexts: list[str], out: str, barrier: Any) -> None:
    """Child process: append to shared contexts, some optimistic (forking on conflict).

    Writes the acknowledged entries: [context, session, segment, seq, token].
    """
    rng = random.Random(worker)
    acked: list[list[Any]] = []
    with PostgresStore(dsn, schema=schema, pool_size=2) as store:
        barrier.wait(timeout=60)
        for i in range(30):
            ctx = ContextId.parse(contexts[(worker * 7 + i) % len(contexts)])
            token = f"w{worker}-{i}"
            data = {"item": {"role": "assistant", "content": token}, "token": token}
            head = store.get_head(ctx)
            assert head is not None
            if rng.random() < 0.5:  # a plain append to the head: must always succeed
                entry = append_entry(store, head, "item", data)
                ref = PodActiveSegmentRef(head.session_id, head.segment_id)
            else:  # optimistic: with the view we read; on conflict fork and write there
                expected = store.next_seq(head.session_id, head.segment_id)
                try:
                    entry = append_entry(store, head, "item", data, expected_seq=expected)
                    ref = PodActiveSegmentRef(head.session_id, head.segment_id)
                except ConflictError:
                    segment = ensure_head_or_fork(store, ctx, head, expected)
                    ref = PodActiveSegmentRef(head.session_id, segment)
                    entry = append_entry(store, ref, "item", data)
            acked.append([str(ctx), str(ref.session_id), str(ref.segment_id), entry.seq, token])
    Path(out).write_text(json.dumps(acked))


def test_eight_processes_share_twenty_contexts(
    store: PostgresStore,
    pg_database: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """8 processes append to the same 20 contexts at once: every acknowledged entry is there
    exactly once, nothing else is, and each context's history is a valid fork tree."""
    contexts = [f"game:room{i}" for i in range(20)]
    for name in contexts:
        create_segment(store, context=name)
    # A fork server that imported this module (and so terrarium and psycopg) once: each agent
    # is a fresh fork of it, instead of 8 interpreters importing them at once.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    barrier = ctx.Barrier(8)
    outs = [tmp_path / f"acked-{w}.json" for w in range(8)]
    procs = [
        ctx.Process(
            target=_agent,
            args=(pg_database, store.schema, w, contexts, str(outs[w]), barrier),
        )
        for w in range(8)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0] * 8
    acked = [tuple(row) for out in outs for row in json.loads(out.read_text())]
    assert len(acked) == 8 * 30

    found: list[tuple[Any, ...]] = []
    for name in contexts:
        head = store.get_head(ContextId.parse(name))
        assert head is not None
        segments = store.list_segments(head.session_id)
        assert head.segment_id in segments
        reads = {g: store.read_segment(head.session_id, g) for g in segments}
        roots = [g for g, r in reads.items() if r.header["origin"]["kind"] == "root"]
        assert len(roots) == 1
        for segment_id, read in reads.items():
            origin = SegmentOrigin.from_dict(read.header["origin"])
            if origin.kind != "root":  # a fork: its parent is in the session, its point exists
                assert origin.parent in reads
                assert origin.at_seq is not None
                assert 0 <= origin.at_seq < reads[origin.parent].next_seq
            assert [e["seq"] for e in read.entries] == list(range(1, read.next_seq))
            found += [
                (name, str(head.session_id), str(segment_id), e["seq"], e["token"])
                for e in read.entries
            ]
        for segment_id in reads:  # following parents always reaches the root: no cycles
            seen = {segment_id}
            while segment_id not in roots:
                segment_id = uuid.UUID(reads[segment_id].header["origin"]["parent"])
                assert segment_id not in seen
                seen.add(segment_id)
        restore(store, name)  # the head replays
    assert sorted(found) == sorted(acked)


def test_delete_racing_appends_leaves_no_orphans(store: PostgresStore, sql: Any) -> None:
    """Appends racing a delete_context either land before it (and go with it into the trash)
    or fail with SegmentNotFound: no entry of the deleted session stays in the hot tables, and
    a purge leaves nothing (its ``sessions`` row waits in the trash until then)."""
    session_id, segment_id = create_segment(store, context=MAIN)
    started = threading.Event()
    outcome: list[BaseException] = []

    def keep_appending() -> None:
        try:
            for i in range(100_000):
                store.append(session_id, segment_id, [_entry(str(i))])
                if i == 20:
                    started.set()
        except BaseException as exc:  # reported below
            outcome.append(exc)
        finally:
            started.set()

    writers = [threading.Thread(target=keep_appending) for _ in range(3)]
    for writer in writers:
        writer.start()
    started.wait()
    assert states.delete_context(store, MAIN)
    for writer in writers:
        writer.join()
    assert [type(exc) for exc in outcome] == [SegmentNotFound] * 3
    for table in ("entries", "segments", "traces", "contexts"):
        count = sql.execute(f"SELECT count(*) FROM {table} WHERE session_id = %s", (session_id,))
        assert count.fetchone() == (0,), table
    (trashed,) = states.trashed_contexts(store)
    assert states.purge_trashed(store, trashed.trash_id)
    for table in ("sessions", "archived_contexts", "archived_segments"):
        count = sql.execute(f"SELECT count(*) FROM {table} WHERE session_id = %s", (session_id,))
        assert count.fetchone() == (0,), table


class _Echo:
    """A model that answers at once with the last message it was sent."""

    on_trace = None

    async def chat(self, messages: Any, **params: Any) -> ChatResult:
        text = f"echo: {messages[-1]['content']}"
        message = {"role": "assistant", "content": text}
        return ChatResult(
            message=message, text=text, usage=None, finish_reason="stop", model="echo"
        )


def test_a_turn_is_four_round_trips_and_sees_another_writer(
    store: PostgresStore,
    pg_database: str,  # noqa: F811
    schema: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A turn on a cached context waits for the server four times: the lock with the read of
    its head and tail pipelined after it, the input's append, the reply's append, the unlock.
    Counted (a statement outside a pipeline, or a whole pipeline, is one round trip), not
    timed. Another process's append between turns is still seen."""
    trips: list[list[str]] = []
    execute, pipeline = psycopg.Connection.execute, psycopg.Connection.pipeline

    def counted(conn: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if conn.pgconn.pipeline_status == psycopg.pq.PipelineStatus.OFF:
            trips.append([])
        trips[-1].append(str(query))
        return execute(conn, query, *args, **kwargs)

    @contextmanager
    def counted_pipeline(conn: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        trips.append([])
        with pipeline(conn, *args, **kwargs) as pipe:
            yield pipe

    manager = MultiContextManager(_Echo(), store=store)  # type: ignore[arg-type]
    try:
        assert asyncio.run(manager.process_with_context("cli:main", "one")) == "echo: one"
        monkeypatch.setattr(psycopg.Connection, "execute", counted)
        monkeypatch.setattr(psycopg.Connection, "pipeline", counted_pipeline)
        assert asyncio.run(manager.process_with_context("cli:main", "two")) == "echo: two"
        assert trips == [
            [_sql.LOCK, _sql.HEAD_TAIL],
            [_sql.APPEND_ONE],  # the input
            [_sql.APPEND_MANY],  # the reply, the end of its run and of the turn
            [_sql.UNLOCK],
        ], trips
        with PostgresStore(pg_database, schema=schema) as other:
            head = other.get_head(MAIN)
            assert head is not None
            append_entry(
                other, head, "user_input", {"item": {"role": "user", "content": "another"}}
            )
        reply = asyncio.run(manager.process_with_context("cli:main", "three"))
        assert "another" in reply and "three" in reply  # the users' two messages, folded
    finally:
        manager.close()


def test_the_read_of_a_frozen_segment_sees_one_snapshot(store: PostgresStore, sql: Any) -> None:
    """read_segment's miss path reads the hot and the frozen rows in one snapshot: a change
    committed between its statements (a thaw) is not half seen."""
    create_segment(store, context=MAIN)
    with store._snapshot() as conn:
        before = conn.execute("SELECT updated_at FROM contexts").fetchall()
        sql.execute("UPDATE contexts SET updated_at = 'later'")
        assert conn.execute("SELECT updated_at FROM contexts").fetchall() == before
    assert sql.execute("SELECT updated_at FROM contexts").fetchall() == [("later",)]
