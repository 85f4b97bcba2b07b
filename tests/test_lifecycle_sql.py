"""SqliteStore and PostgresStore as ``Lifecycle`` stores: what only the database backends have.

The cross-backend contract is tests/contract/test_lifecycle.py; here: each database agrees
with the MemoryStore oracle on a scripted history, archived and trashed contexts leave the hot
tables (and come back whole), every write wakes an archived context, purges leave no row of the
session, and on SQLite a process killed in the middle of archives, unarchives, deletes,
restores and purges leaves every context in exactly one state, readable.
"""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from helpers.history import add_context, places
from pg import fresh_schema, pg_database  # noqa: F401  (a fixture)
from terrarium import index, states
from terrarium.errors import ContextExists, ContextNotFound, NotInTrash, SegmentNotFound
from terrarium.index._listing import Listing
from terrarium.index._query import SearchQuery
from terrarium.model import ContextId, Item, TraceEntry
from terrarium.search import scan, search
from terrarium.sessions import (
    create_compacted_segment,
    fork_at,
    restore,
    save_delta,
    save_user_input,
)
from terrarium.stores.base import Lifecycle, NewEntry, Store
from terrarium.stores.memory import MemoryStore
from terrarium.stores.sqlite import SqliteStore

MAIN = ContextId("cli", "main")
TS = "2026-05-01T12:00:00.000000Z"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A fresh SqliteStore or PostgresStore."""
    if request.param == "sqlite":
        instance: Any = SqliteStore(tmp_path / "terrarium.db")
    else:
        pytest.importorskip("psycopg")
        from terrarium.stores.postgres import PostgresStore

        instance = PostgresStore(request.getfixturevalue("pg_database"), schema=fresh_schema())
    with instance:
        yield instance


def _rows(store: Any, table: str, session_id: Any) -> int:
    """How many rows of ``table`` belong to the session, read with plain SQL (on SQLite,
    entries that no segment owns count as the session's too)."""
    query = f"SELECT count(*) FROM {table} WHERE session_id = "
    if isinstance(store, SqliteStore):
        if table == "entries":  # they name their segment by its key (segments.id)
            query = (
                "SELECT count(*) FROM entries WHERE seg NOT IN (SELECT id FROM segments) "
                "OR seg IN (SELECT id FROM segments WHERE session_id = ?)"
            )
        else:
            query += "?"
        conn = sqlite3.connect(store.path)
        try:
            return int(conn.execute(query, (str(session_id),)).fetchone()[0])
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(store._dsn, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {store.schema}")
        row = conn.execute(query + "%s", (session_id,)).fetchone()
        assert row is not None
        return int(row[0])


HOT = ("contexts", "segments", "entries", "traces")
COLD = ("archived_contexts", "archived_segments")


def _texts(store: Store, context: str) -> list[str]:
    return [str(item.get("content")) for item in restore(store, context).history]


def _history(store: Store) -> None:
    """Contexts with forks, a compaction and a trace, the same in any store."""
    head = add_context(store, "cli:main", "the capybara swims", "a quiet river")
    save_delta(store, head, [Item.assistant("capybaras are calm")])
    fork_at(store, head, 2)
    state = restore(store, "cli:main")
    create_compacted_segment(store, state, [Item.assistant("summary: capybaras")], context=None)
    head = store.get_head(MAIN)
    assert head is not None
    store.append_trace(head.session_id, head.segment_id, [TraceEntry(TS, "delta", {"n": 1})])
    add_context(store, "irc:#python", "capybara news", "nothing else")
    add_context(store, "game:run", "no rodents here")


def _observe(store: Any) -> dict[str, Any]:
    """What a Lifecycle store shows, without ids that differ between stores."""
    assert isinstance(store, Lifecycle)
    hot = {h.context: _texts(store, h.context) for h in store.list_contexts()}
    archived = {
        a.context: (a.date, a.message_count, a.pinned, _texts(store, a.context))
        for a in states.archived_contexts(store)
    }
    trash = [
        (t.context, t.date, t.archived, t.message_count, t.pinned)
        for t in states.trashed_contexts(store)
    ]
    found = {
        (hit.context, hit.seq)
        for hit in _search(store, SearchQuery("capybara", archived=True, limit=100))
    }
    return {
        "hot": hot,
        "archived": archived,
        "trash": trash,
        "pinned": states.pinned_contexts(store),
        "heads": {c: store.get_head(ContextId.parse(c)) is not None for c in [*hot, *archived]},
        "found": found,
    }


def _search(store: Any, query: SearchQuery) -> list[Any]:
    """Every hit, on every branch, hot and archived: the store's index and the archive's scan
    (the MemoryStore oracle has no index: it scans both)."""
    return search(store, msgspec.structs.replace(query, all_branches=True))


def _script(store: Any) -> list[dict[str, Any]]:
    """A history of archives, writes, deletes, restores, pins and purges; what it showed."""
    seen = []
    _history(store)
    assert states.pin_context(store, MAIN)
    assert states.archive_context(store, MAIN) is not None
    assert states.archive_context(store, ContextId.parse("game:run")) is not None
    seen.append(_observe(store))
    save_user_input(store, store.get_head(ContextId.parse("game:run")), "awake again")
    assert states.delete_context(store, MAIN)
    assert states.delete_context(store, ContextId.parse("irc:#python"))
    seen.append(_observe(store))
    add_context(store, "cli:main", "a new main")
    trash = {t.context: t.trash_id for t in states.trashed_contexts(store)}
    with pytest.raises(ContextExists):
        states.restore_trashed(store, trash["cli:main"])
    states.restore_trashed(store, trash["cli:main"], as_context=ContextId.parse("cli:old"))
    states.restore_trashed(store, trash["irc:#python"])
    seen.append(_observe(store))
    assert states.purge_context(store, ContextId.parse("cli:old"))
    assert states.delete_context(store, ContextId.parse("game:run"))
    (entry,) = states.trashed_contexts(store)
    assert states.purge_trashed(store, entry.trash_id)
    seen.append(_observe(store))
    return seen


def test_agrees_with_the_memory_oracle(store: Any) -> None:
    """A scripted history of archives, wakes, deletes, restores (under another id too), pins
    and purges shows the same contexts, states, texts, counts, trash, pins and archived
    search hits as on MemoryStore."""
    assert _script(store) == _script(MemoryStore())


def test_archived_context_leaves_the_hot_tables_and_comes_back_whole(store: Any) -> None:
    """Archiving moves every row of the session out of the hot tables into one archived row
    per segment (compressed: fewer bytes than hot); listing and search skip it, reads by
    reference read it, and unarchiving puts back the same segments, entries, trace, counts
    and search items."""
    _history(store)
    head = store.get_head(MAIN)
    before = restore(store, "cli:main")
    segments = store.list_segments(head.session_id)
    reads = {g: store.read_segment(head.session_id, g) for g in segments}
    trace = store.read_trace(head.session_id, head.segment_id)
    summary = {s.context: s for s in index.listing(store).list_contexts_fast()}["cli:main"]
    hot = {table: _rows(store, table, head.session_id) for table in HOT}
    archived = states.archive_context(store, MAIN)
    assert archived is not None
    assert (archived.context, archived.message_count) == ("cli:main", summary.message_count)
    assert archived.last_active == summary.last_active
    assert 0 < archived.archived_bytes < archived.hot_bytes
    assert {table: _rows(store, table, head.session_id) for table in HOT} == dict.fromkeys(HOT, 0)
    assert _rows(store, "archived_segments", head.session_id) == len(segments)
    assert _rows(store, "sessions", head.session_id) == 1
    assert [h.context for h in store.list_contexts()] == ["game:run", "irc:#python"]
    assert [s.context for s in index.listing(store).list_contexts_fast()] == [
        "game:run",
        "irc:#python",
    ]
    assert {h.context for h in index.listing(store).search(SearchQuery("capybara"))} == {
        "irc:#python"
    }
    assert store.get_head(MAIN) == head and states.is_archived(store, MAIN)
    assert store.list_segments(head.session_id) == segments
    for g in segments:
        assert store.read_segment(head.session_id, g) == reads[g]
        assert store.next_seq(head.session_id, g) == reads[g].next_seq
        stop = store.read_segment(head.session_id, g, stop_seq=1)
        assert stop.entries == reads[g].entries[:1]
    assert store.read_trace(head.session_id, head.segment_id) == trace
    assert restore(store, "cli:main").history == before.history
    assert states.is_archived(store, MAIN), "a read must not unarchive"
    assert states.unarchive_context(store, MAIN) and not states.unarchive_context(store, MAIN)
    assert {s.context: s for s in index.listing(store).list_contexts_fast()}["cli:main"] == summary
    assert {table: _rows(store, table, head.session_id) for table in HOT} == hot
    assert {table: _rows(store, table, head.session_id) for table in COLD} == dict.fromkeys(COLD, 0)
    assert store.read_trace(head.session_id, head.segment_id) == trace
    assert {h.context for h in index.listing(store).search(SearchQuery("capybara"))} == {
        "cli:main",
        "irc:#python",
    }


def test_search_reads_the_archive_only_when_asked(store: Any) -> None:
    """``SearchQuery.archived`` adds hits from archived contexts (:func:`terrarium.search.search`
    scans them beside the store's index), with the usual filters; without it they are left
    out."""
    _history(store)
    assert states.archive_context(store, MAIN) is not None
    assert {h.context for h in search(store, SearchQuery("capybara"))} == {"irc:#python"}
    both = search(store, SearchQuery("capybara", archived=True))
    assert {h.context for h in both} == {"cli:main", "irc:#python"}
    assert all(h.snippet for h in both)
    only = search(store, SearchQuery("capybara", archived=True, context="cli:main"))
    assert {h.context for h in only} == {"cli:main"}
    typed = search(store, SearchQuery("capybara", archived=True, type="irc"))
    assert {h.context for h in typed} == {"irc:#python"}
    assert len(search(store, SearchQuery("capybara", archived=True, limit=1))) == 1


@pytest.mark.parametrize("write", ["append", "append_many", "create_segment", "set_head", "trace"])
def test_every_write_to_an_archived_context_unarchives_it_first(store: Any, write: str) -> None:
    """append (one entry or several), create_segment, set_head and append_trace on an archived
    context move it back to the hot store, then write: nothing is lost, and it is listed and
    found again."""
    head = add_context(store, "cli:main", "capybara one", "capybara two")
    s, g = head.session_id, head.segment_id
    assert states.archive_context(store, MAIN) is not None
    entry = NewEntry("item", TS, {"item": Item.user("capybara three")})
    if write == "append":
        assert store.append(s, g, [entry], expected_seq=3) == 3
    elif write == "append_many":
        assert store.append(s, g, [entry, entry], expected_seq=3) == 3
    elif write == "create_segment":
        from uuid6 import uuid7

        segment = uuid7()
        store.create_segment(s, {"session_id": str(s), "segment_id": str(segment), "ts": TS})
        assert segment in store.list_segments(s)
    elif write == "set_head":
        assert store.set_head(MAIN, g, expected=g).segment_id == g
    else:
        store.append_trace(s, g, [TraceEntry(TS, "delta", {"n": 1})])
        assert len(store.read_trace(s, g)) == 1
    assert not states.is_archived(store, MAIN)
    assert [c.context for c in store.list_contexts()] == ["cli:main"]
    assert _texts(store, "cli:main")[:2] == ["capybara one", "capybara two"]
    assert len(index.listing(store).search(SearchQuery("capybara"))) >= 2
    assert _rows(store, "archived_segments", s) == 0


def test_writes_to_a_trashed_context_fail_and_change_nothing(store: Any) -> None:
    """A trashed session is detached and frozen: every write by reference fails
    (SegmentNotFound) and wakes nothing, reads by reference still read it whole, its id is
    free, and its trash entry is untouched by the attempts."""
    head = add_context(store, "cli:main", "capybara")
    s, g = head.session_id, head.segment_id
    before_read = store.read_segment(s, g)
    assert states.delete_context(store, MAIN)
    (before,) = states.trashed_contexts(store)
    record = store.session_state(s)
    assert "cold" in record and store.session_owner(s) is None
    entry = NewEntry("item", TS, {"item": Item.user("x")})
    for attempt in (
        lambda: store.append(s, g, [entry]),
        lambda: store.append(s, g, [entry, entry]),
        lambda: store.append_trace(s, g, [TraceEntry(TS, "delta", {})]),
        lambda: store.create_segment(s, {"session_id": str(s), "segment_id": str(g), "ts": TS}),
    ):
        with pytest.raises(SegmentNotFound):
            attempt()
    with pytest.raises(ContextNotFound):
        store.set_head(MAIN, g, expected=g)
    assert store.read_segment(s, g) == before_read
    assert store.list_segments(s) == [g] and store.next_seq(s, g) == before_read.next_seq
    assert store.read_trace(s, g) == []
    assert states.trashed_contexts(store) == [before] and store.session_state(s) == record
    assert _rows(store, "archived_segments", s) == 1 and _rows(store, "segments", s) == 0
    assert store.get_head(MAIN) is None and not states.is_archived(store, MAIN)
    add_context(store, "cli:main", "new")
    assert _texts(store, "cli:main") == ["new"]


def test_trash_keeps_state_and_pin_and_restore_checks_the_id(store: Any) -> None:
    """An archived context goes to the trash still archived and pinned, comes back archived
    and pinned (under another id if asked); restoring onto a used id (hot or archived) is
    refused, an unknown trash id is NotInTrash."""
    add_context(store, "cli:main", "capybara")
    assert states.pin_context(store, MAIN)
    assert states.archive_context(store, MAIN) is not None
    with pytest.raises(ContextExists):
        add_context(store, "cli:main", "taken while archived")
    assert states.delete_context(store, MAIN)
    assert states.pinned_contexts(store) == frozenset()
    (trashed,) = states.trashed_contexts(store)
    assert (trashed.context, trashed.archived, trashed.pinned) == ("cli:main", True, True)
    add_context(store, "cli:other")
    assert states.archive_context(store, ContextId.parse("cli:other")) is not None
    with pytest.raises(ContextExists):
        states.restore_trashed(store, trashed.trash_id, as_context=ContextId.parse("cli:other"))
    with pytest.raises(NotInTrash):
        states.restore_trashed(store, "no-such-trash-id")
    head = states.restore_trashed(store, trashed.trash_id, as_context=ContextId.parse("web:back"))
    assert head.context == "web:back"
    assert states.is_archived(store, ContextId.parse("web:back"))
    assert states.pinned_contexts(store) == {"web:back"}
    assert [a.context for a in states.archived_contexts(store, type="web")] == ["web:back"]
    assert states.archived_contexts(store, type="web")[0].pinned
    assert _texts(store, "web:back") == ["capybara"]
    assert states.trashed_contexts(store) == []
    assert not states.purge_trashed(store, trashed.trash_id)


def test_purge_removes_every_row_of_the_session(store: Any) -> None:
    """purge_context (hot or archived) and purge_trashed delete the session everywhere,
    ``sessions`` row (and so its record, pin included) too; trashed and archived sessions
    keep their row."""
    sessions = []
    for name in ("cli:hot", "cli:cold", "cli:bin"):
        head = add_context(store, name, "capybara")
        states.pin_context(store, ContextId.parse(name))
        sessions.append(head.session_id)
    assert states.archive_context(store, ContextId.parse("cli:cold")) is not None
    assert states.delete_context(store, ContextId.parse("cli:bin"))
    for session in sessions:
        assert _rows(store, "sessions", session) == 1
        assert store.session_state(session)["pinned"] is True
    assert states.purge_context(store, ContextId.parse("cli:hot"))
    assert states.purge_context(store, ContextId.parse("cli:cold"))
    assert not states.purge_context(store, ContextId.parse("cli:bin")), "a trashed id is free"
    assert states.purge_trashed(store, states.trashed_contexts(store)[0].trash_id)
    for session in sessions:
        for table in (*HOT, *COLD, "sessions"):
            assert _rows(store, table, session) == 0, table
    assert store.list_contexts() == [] and states.archived_contexts(store) == []
    assert states.pinned_contexts(store) == frozenset() and states.trashed_contexts(store) == []


def test_state_survives_reopening(store: Any, request: pytest.FixtureRequest) -> None:
    """Archive, trash and pins are in the database: another store on it sees them."""
    add_context(store, "cli:main", "capybara")
    add_context(store, "cli:gone", "capybara")
    states.pin_context(store, MAIN)
    states.archive_context(store, MAIN)
    states.delete_context(store, ContextId.parse("cli:gone"))
    if isinstance(store, SqliteStore):
        other: Any = SqliteStore(store.path)
    else:
        from terrarium.stores.postgres import PostgresStore

        other = PostgresStore(store._dsn, schema=store.schema)
    with other:
        assert states.is_archived(other, MAIN) and states.pinned_contexts(other) == {"cli:main"}
        assert [t.context for t in states.trashed_contexts(other)] == ["cli:gone"]
        assert _texts(other, "cli:main") == ["capybara"]


@pytest.mark.parametrize("per_cycle", [40, pytest.param(None, marks=pytest.mark.slow)])
def test_appends_racing_an_archive_lose_nothing(store: Any, per_cycle: int | None) -> None:
    """Writers appending while the context is archived and unarchived again and again: every
    acknowledged entry is in the context once, in order, at the end. By default a writer runs
    at most ``per_cycle`` appends ahead of the archive cycles (each archive moves every row, so
    unpaced writers make the run quadratic in the machine's load); the slow run leaves them
    unpaced."""
    head = add_context(store, "cli:main")
    s, g = head.session_id, head.segment_id
    acked: list[list[str]] = [[], []]
    stop = threading.Event()
    cycles = [0]

    def write(n: int) -> None:
        i = 0
        while not stop.is_set() or i < 5:
            if per_cycle is not None and not stop.is_set() and i >= per_cycle * (cycles[0] + 1):
                time.sleep(0.001)
                continue
            tag = f"{n}.{i}"
            store.append(s, g, [NewEntry("item", TS, {"item": Item.user(tag)})])
            acked[n].append(tag)
            i += 1

    writers = [threading.Thread(target=write, args=(n,)) for n in range(2)]
    for writer in writers:
        writer.start()
    try:
        for _ in range(15):
            states.archive_context(store, MAIN)
            states.unarchive_context(store, MAIN)
            cycles[0] += 1
    finally:
        stop.set()
        for writer in writers:
            writer.join()
    texts = _texts(store, "cli:main")
    assert len(texts) == len(set(texts)) == len(acked[0]) + len(acked[1])
    for tags in acked:
        assert [t for t in texts if t in set(tags)] == tags
    if isinstance(index.listing(store), Listing):
        (summary,) = index.listing(store).list_contexts_fast()
        assert summary.message_count == len(texts)


# --------------------------------------------------------------------------- SIGKILL (SQLite)

_CHILD = r"""
import json, random, sys
from terrarium import states
from terrarium.model import ContextId, Item
from terrarium.sessions import create_segment, save_delta
from terrarium.stores.sqlite import SqliteStore

path, seed, names, size = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
store = SqliteStore(path)
while True:
    name = rng.choice(names)
    ctx = ContextId.parse(name)
    trash = [t for t in states.trashed_contexts(store) if t.context == name]
    if states.is_archived(store, ctx):
        op = rng.choice(["unarchive", "delete", "purge", "append", "pin"])
    elif store.get_head(ctx) is not None:
        op = rng.choice(["archive", "archive", "delete", "purge", "append", "pin"])
    elif trash and rng.random() < 0.7:
        op = "restore"
    else:
        op = "create"
    if op == "create":
        create_segment(store, None, context=name)
        head = store.get_head(ctx)
        save_delta(store, head, [Item.user(f"{name} {i}") for i in range(size)])
    elif op == "append":
        save_delta(store, store.get_head(ctx), [Item.user(f"{name} more")])
    elif op == "archive":
        states.archive_context(store, ctx)
    elif op == "unarchive":
        states.unarchive_context(store, ctx)
    elif op == "delete":
        states.delete_context(store, ctx)
    elif op == "purge":
        states.purge_context(store, ctx)
    elif op == "pin":
        states.pin_context(store, ctx, rng.random() < 0.5)
    else:
        states.restore_trashed(store, trash[0].trash_id)
    print(json.dumps({"op": op, "context": name}), flush=True)
"""


def _check_states(path: Path, names: list[str]) -> None:
    """Every context is in exactly one state, readable, once the store has finished what a
    kill cut in two (a restore attached but still marked trashed, a purge marked but not yet
    deleted: ``finish_lifecycle``, as ``fsck --repair`` runs it); counts agree; no session is
    both hot and frozen, nor frozen without its segments; both FTS5 tables agree with their
    content views (a kill may fall in a slice of the upkeep thread or in items staged for
    it), and a search finds what a scan finds."""
    conn = sqlite3.connect(path)
    try:
        both = conn.execute(
            "SELECT count(*) FROM archived_contexts AS a JOIN segments USING (session_id)"
        ).fetchone()[0]
        headless = conn.execute(
            "SELECT count(*) FROM archived_contexts AS a WHERE NOT EXISTS (SELECT 1 FROM "
            "archived_segments AS g WHERE g.session_id = a.session_id)"
        ).fetchone()[0]
    finally:
        conn.close()
    assert (both, headless) == (0, 0)
    with SqliteStore(path) as store:
        unfinished = states.unfinished_lifecycle(store)
        assert states.finish_lifecycle(store) == len(unfinished)
        assert states.unfinished_lifecycle(store) == []
        query = SearchQuery("more", limit=1000)
        assert places(index.listing(store).search(query)) == places(scan(store, query))
        hot = {s.context: s.message_count for s in index.listing(store).list_contexts_fast()}
        cold = {a.context: a.message_count for a in states.archived_contexts(store)}
        assert not set(hot) & set(cold), "a context is both hot and archived"
        assert states.pinned_contexts(store) <= set(hot) | set(cold)
        for name in names:
            ctx = ContextId.parse(name)
            state = restore(store, ctx) if store.get_head(ctx) is not None else None
            if name in hot or name in cold:
                assert state is not None
                assert len(state.history) == {**hot, **cold}[name]
                assert all(str(i["content"]).startswith(name) for i in state.history)
            else:
                assert state is None


def _check_trash(path: Path) -> None:
    """Every trash entry restores whole, in the state it was deleted in."""
    with SqliteStore(path) as store:
        for number, entry in enumerate(states.trashed_contexts(store)):
            back = ContextId("trash", f"t{number}")
            states.restore_trashed(store, entry.trash_id, as_context=back)
            assert len(restore(store, back).history) == entry.message_count
            assert states.is_archived(store, back) == entry.archived


def _kill_rounds(tmp_path: Path, rounds: int) -> None:
    path = tmp_path / "terrarium.db"
    SqliteStore(path).close()
    names = [f"cli:c{i}" for i in range(6)]
    rng = random.Random(20261125)
    for number in range(rounds):
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(path), str(number), json.dumps(names), "300"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            for _ in range(rng.randint(2, 25)):
                line = child.stdout.readline()
                assert line, child.communicate()[1]
        finally:
            child.kill()
            child.communicate()
        assert child.returncode == -9
        _check_states(path, names)
    _check_trash(path)


def test_sigkill_during_state_changes_leaves_one_readable_state(tmp_path: Path) -> None:
    """A process killed at random points of archive, unarchive, delete, restore, purge and
    wake-on-append over 6 contexts of 300 messages (a few rounds): each context is hot,
    archived or gone, never two, and reads whole; trash entries restore whole."""
    _kill_rounds(tmp_path, 4)


@pytest.mark.slow
def test_sigkill_during_state_changes_long(tmp_path: Path) -> None:
    """The same, 20 rounds."""
    _kill_rounds(tmp_path, 20)


# --------------------------------------------------------------------------- PostgreSQL races


@pytest.mark.postgres
@pytest.mark.parametrize("change", ["delete", "purge"])
def test_delete_or_purge_waiting_on_a_wake_finds_the_context_hot(
    pg_database: str,  # noqa: F811
    change: str,
) -> None:
    """A delete (or purge) of an archived context that waits for a writer's wake to commit
    finds the record changed, looks again, finds the context hot, and trashes (or purges)
    it: it never answers False for a context that exists."""
    psycopg = pytest.importorskip("psycopg")
    from terrarium.stores.postgres import PostgresStore

    with PostgresStore(pg_database, schema=fresh_schema()) as store:
        head = add_context(store, "cli:main", "capybara")
        assert states.archive_context(store, MAIN) is not None
        waker = psycopg.connect(pg_database, autocommit=True)
        try:
            waker.execute(f"SET search_path TO {store.schema}")
            waker.execute("BEGIN")  # a wake: the record's row locked, the rows thawed
            s = head.session_id
            waker.execute("SELECT 1 FROM sessions WHERE session_id = %s FOR UPDATE", (s,))
            store._thaw_rows(waker, s)
            waker.execute("UPDATE sessions SET state = NULL WHERE session_id = %s", (s,))
            (pid,) = waker.execute("SELECT pg_backend_pid()").fetchone()
            outcome: list[bool] = []
            act = states.delete_context if change == "delete" else states.purge_context
            thread = threading.Thread(target=lambda: outcome.append(act(store, MAIN)))
            thread.start()
            while not waker.execute(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid <> %s", (pid,)
            ).fetchone()[0]:
                thread.join(0.01)
            waker.execute("COMMIT")
            thread.join()
        finally:
            waker.close()
        assert outcome == [True]
        assert store.get_head(MAIN) is None and store.list_contexts() == []
        trashed = states.trashed_contexts(store)
        if change == "delete":
            assert [(t.context, t.archived) for t in trashed] == [("cli:main", False)]
        else:
            assert trashed == [] and _rows(store, "sessions", head.session_id) == 0


@pytest.mark.parametrize("look", ["_next_seq", "_hot_ids"])
def test_a_read_finds_a_session_thawed_just_after_it_missed(
    store: Any, monkeypatch: pytest.MonkeyPatch, look: str
) -> None:
    """next_seq and list_segments find a frozen session that a thaw moves back to the hot
    tables just after their look at them missed: their second look reads the hot and the
    frozen rows in one snapshot."""
    head = add_context(store, "cli:main", "hello")
    segments = store.list_segments(head.session_id)
    assert states.archive_context(store, MAIN) is not None
    hot_look = getattr(store, look)

    def look_then_thaw(*args: Any) -> Any:
        monkeypatch.setattr(store, look, hot_look)  # once
        try:
            return hot_look(*args)
        finally:  # a miss, here: a thaw by another connection commits now
            assert states.unarchive_context(store, MAIN)

    monkeypatch.setattr(store, look, look_then_thaw)
    if look == "_next_seq":
        assert store.next_seq(head.session_id, head.segment_id) == 2
    else:
        assert store.list_segments(head.session_id) == segments


def test_a_trace_read_finds_a_session_thawed_between_its_two_looks(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """read_trace of a frozen session that a thaw moves back between its look at the hot
    traces (none) and its look at whether the segment is hot (it is, now) still gives the
    trace: both looks, and the frozen one, read one snapshot."""
    head = add_context(store, "cli:main", "hello")
    store.append_trace(head.session_id, head.segment_id, [TraceEntry(TS, "delta", {"n": 1})])
    expected = store.read_trace(head.session_id, head.segment_id)
    assert len(expected) == 1
    assert states.archive_context(store, MAIN) is not None
    exists = store._segment_exists

    def thaw_then_look(*args: Any) -> Any:
        monkeypatch.setattr(store, "_segment_exists", exists)  # once
        assert states.unarchive_context(store, MAIN)  # another connection's thaw commits now
        return exists(*args)

    monkeypatch.setattr(store, "_segment_exists", thaw_then_look)
    assert store.read_trace(head.session_id, head.segment_id) == expected


def test_a_head_move_finds_its_segment_frozen_just_after_it_read_the_head(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """set_head (a rewind's last step) whose context an archive freezes just after it read the
    hot head wakes the context and moves its head: the new segment is frozen, not missing (the
    lifecycle race once saw a rewind fail with SegmentNotFound)."""
    head = add_context(store, "cli:main", "one", "two")
    fork = fork_at(store, head, 1)
    read_head, frozen = store._head, []

    def read_then_freeze(row: Any) -> Any:
        monkeypatch.setattr(store, "_head", read_head)  # once
        frozen.append(states.archive_context(store, MAIN))  # another connection's freeze
        return read_head(row)

    monkeypatch.setattr(store, "_head", read_then_freeze)
    assert store.set_head(MAIN, fork, expected=head.segment_id).segment_id == fork
    assert frozen != [None]
    assert [i["content"] for i in restore(store, MAIN).history] == ["one"]
    assert not states.is_archived(store, MAIN)
