"""SqliteStore specifics: WAL, durability setting, threads and processes, atomic(), locks, and
its change cursor (what the derived index reads).

The Store contract itself is checked by tests/contract/ on every backend; these tests cover
what only this backend has.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import sqlite3
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from helpers.history import add_context, places, snippets
from terrarium import codec, index, states
from terrarium.copy import copy_store
from terrarium.errors import ConflictError, IndexUnavailable, SegmentNotFound, StoreError
from terrarium.index._query import SearchHit, SearchQuery
from terrarium.model import ContextId
from terrarium.search import scan
from terrarium.sessions import create_segment, save_user_input
from terrarium.stores import _db
from terrarium.stores.base import NewEntry
from terrarium.stores.memory import MemoryStore
from terrarium.stores.sqlite import SqliteStore

TS = "2026-05-01T12:00:00.000000Z"
MAIN = ContextId("cli", "main")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "terrarium.db"


@pytest.fixture
def store(db: Path) -> Any:
    with SqliteStore(db) as instance:
        yield instance


def _entry(token: str) -> NewEntry:
    return NewEntry("item", TS, {"item": {"role": "assistant", "content": token}, "token": token})


def _raw(db: Path, query: str, *params: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(query, params).fetchall()
    finally:
        conn.close()


def test_wal_and_normal_synchronous_by_default(store: SqliteStore, db: Path) -> None:
    """The database is in WAL mode and the store's connections use synchronous=NORMAL."""
    assert _raw(db, "PRAGMA journal_mode") == [("wal",)]
    with store._read() as conn:
        assert conn.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL
    assert "synchronous='NORMAL'" in repr(store)


def test_synchronous_full_and_bad_modes(db: Path) -> None:
    """synchronous=FULL is applied; an unknown mode or an in-memory path is refused."""
    with SqliteStore(db, synchronous="full") as store, store._read() as conn:
        assert conn.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL
    with pytest.raises(ValueError, match="unknown synchronous mode"):
        SqliteStore(db, synchronous="sometimes")
    with pytest.raises(ValueError, match="MemoryStore"):
        SqliteStore(":memory:")


def test_not_a_database_is_a_store_error(tmp_path: Path) -> None:
    """Opening a file that is not SQLite fails with StoreError naming the file."""
    path = tmp_path / "notes.txt"
    path.write_bytes(b"this is not a database, just some text " * 100)
    with pytest.raises(StoreError, match=r"notes\.txt"):
        SqliteStore(path)


@pytest.mark.parametrize("table", ["notes", "sessions"])
def test_another_programs_database_is_refused_untouched(
    tmp_path: Path, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SQLite file holding tables but no terrarium schema is another program's: opening it
    is a one-line error naming the file and a table, and adds nothing to it (before, a plain
    ``terrarium list`` added 30 tables, or half a schema where a table name was taken)."""
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute(f"CREATE TABLE {table} (x)")
    conn.commit()
    conn.close()
    before = _raw(path, "SELECT type, name FROM sqlite_master")
    message = rf"^{re.escape(str(path))}: not a terrarium database .*'{table}'"
    with pytest.raises(StoreError, match=message) as caught:
        SqliteStore(path)
    assert "\n" not in str(caught.value)
    assert _raw(path, "SELECT type, name FROM sqlite_master") == before
    monkeypatch.setattr(_db, "writable", lambda path: False)  # read-only: refused alike,
    with pytest.raises(StoreError, match="not a terrarium database"):
        SqliteStore(path)  # not asked to be migrated
    assert _raw(path, "SELECT type, name FROM sqlite_master") == before


def test_a_database_without_the_change_cursor_says_to_copy_it(db: Path, tmp_path: Path) -> None:
    """A database of a development build before the change cursor (no ``changes`` table) still
    reads; listing and search fail in one line that says how to copy it into a new store."""
    with SqliteStore(db) as store:
        create_segment(store, context=MAIN)
        head = store.get_head(MAIN)
        assert head is not None
        save_user_input(store, head, "kept")
    conn = sqlite3.connect(db)
    for trigger in ("changes_on_head", "changes_on_move", "changes_on_drop"):
        conn.execute(f"DROP TRIGGER {trigger}")
    conn.execute("DROP TABLE changes")
    conn.commit()
    conn.close()
    with SqliteStore(db) as old:
        assert [e["item"]["content"] for e in restore_items(old)] == ["kept"]
        with pytest.raises(StoreError, match=r"earlier development build.*terrarium copy sqlite"):
            index.listing(old).list_contexts_fast()
        with SqliteStore(tmp_path / "new.db") as new:
            copy_store(old, new)
            assert [r.context for r in index.listing(new).list_contexts_fast()] == [str(MAIN)]


def restore_items(store: SqliteStore) -> list[dict[str, Any]]:
    head = store.get_head(MAIN)
    assert head is not None
    return store.read_segment(head.session_id, head.segment_id).entries


def test_closed_store_refuses_calls(db: Path) -> None:
    """After close(), calls fail with StoreError rather than touching a closed connection."""
    store = SqliteStore(db)
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.get_head(MAIN)


def test_lines_are_stored_exactly_and_read_like_memory(store: SqliteStore, db: Path) -> None:
    """Each entry's JSON is stored byte for byte; reads equal MemoryStore's, key order too."""
    memory = MemoryStore()
    header = {
        "v": 1,
        "ts": TS,
        "kind": "header",
        "session_id": str(uuid.UUID(int=1)),
        "segment_id": str(uuid.UUID(int=2)),
        "zz_future_key": {"nested": [1, 2.5, None, "é"]},
    }
    data = {"zeta": 1, "alpha": {"b": 2, "a": 1}, "item": {"role": "user", "content": "x\x00y"}}
    for s in (store, memory):
        s.create_context(MAIN, header)
        s.append(uuid.UUID(int=1), uuid.UUID(int=2), [NewEntry("custom_kind", TS, data)])
    got = store.read_segment(uuid.UUID(int=1), uuid.UUID(int=2))
    want = memory.read_segment(uuid.UUID(int=1), uuid.UUID(int=2))
    assert got == want
    assert [list(line) for line in got.entries] == [list(line) for line in want.entries]
    assert list(got.header) == list(want.header)
    [(line, kind, ts)] = _raw(db, "SELECT line, kind, ts FROM entries WHERE seq = 1")
    assert line == codec.encode(want.entries[0]).decode()
    assert (kind, ts) == ("custom_kind", TS)


def test_atomic_nests_on_savepoints(store: SqliteStore) -> None:
    """atomic() commits its calls together; an inner block that raises rolls back alone."""
    session_id, segment_id = create_segment(store, context=MAIN)
    with store.atomic():
        store.append(session_id, segment_id, [_entry("a")])
        with pytest.raises(RuntimeError), store.atomic():
            store.append(session_id, segment_id, [_entry("b")])
            assert store.next_seq(session_id, segment_id) == 3  # sees its own writes
            raise RuntimeError("inner")
        store.append(session_id, segment_id, [_entry("c")])
    with pytest.raises(RuntimeError), store.atomic():
        store.append(session_id, segment_id, [_entry("d")])
        raise RuntimeError("outer")
    tokens = [e["token"] for e in store.read_segment(session_id, segment_id).entries]
    assert tokens == ["a", "c"]


def test_threads_append_to_one_segment(store: SqliteStore) -> None:
    """8 threads appending at once: every acknowledged entry is stored once, seqs gapless."""
    session_id, segment_id = create_segment(store, context=MAIN)
    acked: list[tuple[int, str]] = []
    barrier = threading.Barrier(8)

    def work(worker: int) -> None:
        barrier.wait()
        for i in range(40):
            token = f"{worker}-{i}"
            acked.append((store.append(session_id, segment_id, [_entry(token)]), token))

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stored = store.read_segment(session_id, segment_id).entries
    assert [e["seq"] for e in stored] == list(range(1, 321))
    assert sorted(acked) == sorted((e["seq"], e["token"]) for e in stored)


def test_threads_with_expected_seq_conflict_never_clobber(store: SqliteStore) -> None:
    """Writers racing with expected_seq: each seq is won by exactly one; losers get Conflict."""
    session_id, segment_id = create_segment(store, context=MAIN)
    won: list[str] = []
    lost = 0
    guard = threading.Lock()
    barrier = threading.Barrier(6)

    def work(worker: int) -> None:
        nonlocal lost
        barrier.wait()
        for i in range(30):
            token = f"{worker}-{i}"
            expected = store.next_seq(session_id, segment_id)
            try:
                store.append(session_id, segment_id, [_entry(token)], expected_seq=expected)
            except ConflictError:
                with guard:
                    lost += 1
            else:
                with guard:
                    won.append(token)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stored = store.read_segment(session_id, segment_id).entries
    assert sorted(won) == sorted(e["token"] for e in stored)
    assert len(won) + lost == 180
    assert [e["seq"] for e in stored] == list(range(1, len(won) + 1))


def _process_worker(
    path: str, session_id: str, segment_id: str, worker: int, count: int, out: str, barrier: Any
) -> None:
    """Child process: append ``count`` entries, then write the acknowledged (seq, token)s."""
    acked = []
    with SqliteStore(path) as store:
        barrier.wait(timeout=60)
        for i in range(count):
            token = f"p{worker}-{i}"
            seq = store.append(uuid.UUID(session_id), uuid.UUID(segment_id), [_entry(token)])
            acked.append([seq, token])
    Path(out).write_text(json.dumps(acked))


def test_four_processes_append_to_one_context(store: SqliteStore, db: Path, tmp_path: Path) -> None:
    """4 processes appending to one context lose nothing and duplicate nothing, and the
    derived index finds every item once."""
    session_id, segment_id = create_segment(store, context=MAIN)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    outs = [tmp_path / f"acked-{w}.json" for w in range(4)]
    procs = [
        ctx.Process(
            target=_process_worker,
            args=(str(db), str(session_id), str(segment_id), w, 100, str(outs[w]), barrier),
        )
        for w in range(4)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0, 0, 0, 0]
    acked = sorted(tuple(pair) for out in outs for pair in json.loads(out.read_text()))
    stored = store.read_segment(session_id, segment_id).entries
    assert [e["seq"] for e in stored] == list(range(1, 401))
    assert acked == sorted((e["seq"], e["token"]) for e in stored)
    for worker in range(4):
        query = SearchQuery(f"p{worker}", limit=200)
        hits = _search(store, f"p{worker}", limit=200)
        assert len(hits) == 100 and places(hits) == places(scan(store, query))


_TRY_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    print("busy")
else:
    print("free")
"""


def test_lock_context_excludes_other_processes(store: SqliteStore, db: Path) -> None:
    """lock_context holds an flock on {db}-locks/{type}/{name} that another process sees; the
    file stays while the context does."""
    lock_file = db.with_name(f"{db.name}-locks") / "irc" / "#python"
    create_segment(store, context="irc:#python")

    def probe() -> str:
        result = subprocess.run(
            [sys.executable, "-c", _TRY_LOCK, str(lock_file)],
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout.strip()

    with store.lock_context(ContextId("irc", "#python")):
        assert lock_file.exists()
        assert probe() == "busy"
    assert probe() == "free"


def test_lock_context_excludes_other_threads(store: SqliteStore) -> None:
    """Two threads never hold the same context's lock at once."""
    inside = 0
    most = 0
    guard = threading.Lock()
    barrier = threading.Barrier(4)

    def work() -> None:
        nonlocal inside, most
        barrier.wait()
        for _ in range(50):
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


def test_lock_files_live_beside_the_database(store: SqliteStore, db: Path) -> None:
    """Lock files go to {db}-locks/, never inside another folder, whatever the name."""
    with store.lock_context(ContextId("web", "..\\..\\etc:*?")):
        pass
    made = [p.relative_to(db.parent) for p in db.parent.rglob("*") if p.is_file()]
    assert all(str(p).startswith(db.name) for p in made)
    assert os.path.isdir(f"{db}-locks")


def test_delete_racing_appends_leaves_no_orphans(store: SqliteStore, db: Path) -> None:
    """Appends racing a delete_context either land before it (and go with it into the trash)
    or fail with SegmentNotFound: no entry of the deleted session stays in the hot tables, and
    a purge leaves nothing of it (its ``sessions`` row waits in the trash until then)."""
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
    for table in ("segments", "traces"):
        rows = _raw(db, f"SELECT count(*) FROM {table} WHERE session_id = ?", str(session_id))
        assert rows == [(0,)], table
    orphans = "SELECT count(*) FROM entries WHERE seg NOT IN (SELECT id FROM segments)"
    assert _raw(db, orphans) == [(0,)]
    (trashed,) = states.trashed_contexts(store)
    assert states.purge_trashed(store, trashed.trash_id)
    for table in ("sessions", "archived_contexts", "archived_segments"):
        rows = _raw(db, f"SELECT count(*) FROM {table} WHERE session_id = ?", str(session_id))
        assert rows == [(0,)], table


# --------------------------------------------------------------------------- segment keys
# A store caches each segment's integer key (segments.id) with its seq guess; these would append to
# the wrong segment if a cached key could name another one.


def _tokens(store: SqliteStore, head: Any) -> list[str]:
    """The ``token`` (or the item's text) of each entry of the head's segment."""
    read = store.read_segment(head.session_id, head.segment_id)
    return [e.get("token") or e["item"]["content"] for e in read.entries]


def test_an_append_to_a_purged_segment_never_lands_in_a_new_one(db: Path) -> None:
    """Another store (a process of its own) purges a context this store appended to, and
    creates a segment whose entries reach the seq this store would propose next: this
    store's append fails with SegmentNotFound, and the new segment is untouched (the purged
    segment's key is never handed out again)."""
    with SqliteStore(db) as mine, SqliteStore(db) as other:
        head = add_context(mine, "cli:gone", "one")
        mine.append(head.session_id, head.segment_id, [_entry("two")])  # next: seq 3
        assert states.purge_context(other, ContextId("cli", "gone"))
        new = add_context(other, "cli:new", "x", "y")  # seqs 0, 1, 2
        with pytest.raises(SegmentNotFound):
            mine.append(head.session_id, head.segment_id, [_entry("three")])
        assert _tokens(other, new) == ["x", "y"]


@pytest.mark.parametrize("texts", [("one",), ("one", "two")], ids=["one entry", "several"])
def test_a_key_read_in_a_rolled_back_transaction_is_forgotten(
    store: SqliteStore, texts: tuple[str, ...]
) -> None:
    """A segment created and appended to inside a transaction that rolls back leaves no key
    behind: the next segment, which takes the same key, never gets this one's appends."""

    class Boom(Exception):
        pass

    with pytest.raises(Boom), store.atomic():
        head = add_context(store, "cli:undone", *texts)  # one append of len(texts) entries
        raise Boom
    others = [text.upper() for text in texts]  # up to the seq before the one proposed next
    new = add_context(store, "cli:new", *others)
    with pytest.raises(SegmentNotFound):
        store.append(head.session_id, head.segment_id, [_entry("late")])
    assert _tokens(store, new) == others


def test_an_append_follows_a_segment_woken_with_a_new_key(db: Path) -> None:
    """Another store archives a context this store appended to, creates a segment, and
    unarchives the context, whose segment gets a new key: this store's next appends land in
    that segment, at the right seqs."""
    with SqliteStore(db) as mine, SqliteStore(db) as other:
        head = add_context(mine, "cli:main", "one")
        mine.append(head.session_id, head.segment_id, [_entry("two")])
        assert states.archive_context(other, MAIN) is not None
        new = add_context(other, "cli:other", "x")
        assert states.unarchive_context(other, MAIN)
        assert mine.append(head.session_id, head.segment_id, [_entry("three")]) == 3
        assert mine.append(head.session_id, head.segment_id, [_entry("four")], expected_seq=4)
        assert _tokens(other, head) == ["one", "two", "three", "four"]
        assert _tokens(other, new) == ["x"]


# --------------------------------------------------------------------------- change cursor


def _search(store: SqliteStore, text: str, limit: int = 10) -> list[SearchHit]:
    found = index.of(store)
    assert found is not None
    return found.search(SearchQuery(text, limit=limit))


def test_entry_ids_a_delete_frees_are_never_handed_out_again(store: SqliteStore) -> None:
    """Deleting the newest context frees no entry id for the next entries (the change cursor
    reads past the newest id it saw); what comes next is searched and counted."""
    add_context(store, "cli:a", "rho first")
    add_context(store, "cli:b", "rho second", "rho third")
    assert len(_search(store, "rho")) == 3  # everything read
    (newest,) = _raw(store.path, "SELECT max(id) FROM entries")[0]
    assert states.delete_context(store, ContextId("cli", "b"))
    head = add_context(store, "cli:c", "rho fourth", "rho fifth", "rho sixth")
    sql = (
        "SELECT min(e.id) FROM entries AS e JOIN segments AS g ON g.id = e.seg "
        "WHERE g.session_id = ?"
    )
    assert _raw(store.path, sql, str(head.session_id))[0][0] > newest
    assert snippets(_search(store, "rho")) == ["rho sixth", "rho fifth", "rho fourth", "rho first"]
    counts = {s.context: s.message_count for s in index.listing(store).list_contexts_fast()}
    assert counts == {"cli:a": 1, "cli:c": 3}


def test_a_rolled_back_append_leaves_nothing_to_find(store: SqliteStore) -> None:
    """The index reads committed entries only: a search inside a transaction misses its own
    uncommitted items, a rollback leaves nothing behind, and what comes after is found."""
    head = add_context(store, "cli:a", "mu kept")

    class Boom(Exception):
        pass

    with pytest.raises(Boom), store.atomic():
        save_user_input(store, head, "mu rolled back")
        assert snippets(_search(store, "mu")) == ["mu kept"]
        raise Boom
    assert snippets(_search(store, "mu")) == ["mu kept"]
    save_user_input(store, head, "mu after")
    assert snippets(_search(store, "mu")) == ["mu after", "mu kept"]


def test_a_linked_index_file_beside_the_database_is_never_written_through(
    tmp_path: Path,
) -> None:
    """The derived index beside a SQLite store (``{db}.search.db``) is never opened through a
    link planted there: the file it names stays untouched, and a search says why in one line."""
    folder = tmp_path / "store"
    folder.mkdir()
    outside = tmp_path / "outside.db"
    outside.write_bytes(b"")
    (folder / "terrarium.db.search.db").symlink_to(outside)
    with SqliteStore(folder / "terrarium.db") as linked:
        add_context(linked, "cli:main", "walrus one")
        with pytest.raises(IndexUnavailable, match=r"search\.db: a link"):
            _search(linked, "walrus")
    assert outside.read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside.db", "store"]


@pytest.mark.parametrize("planted", ["terrarium.db-locks", "terrarium.db-locks/cli"])
def test_a_lock_folder_linked_out_of_the_databases_folder_is_refused(
    tmp_path: Path, planted: str
) -> None:
    """A context's lock (``{db}-locks/{type}/{name}``) is never made through a link out of the
    database's folder: the turn is refused in one line, and nothing is created outside."""
    folder = tmp_path / "store"
    outside = tmp_path / "outside"
    (folder / planted).parent.mkdir(parents=True)
    outside.mkdir()
    (folder / planted).symlink_to(outside, target_is_directory=True)
    with SqliteStore(folder / "terrarium.db") as linked:
        with pytest.raises(StoreError, match="outside"), linked.lock_context(MAIN):
            pass
    assert list(outside.iterdir()) == []
