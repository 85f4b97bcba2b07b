"""SqliteStore specifics: WAL, durability setting, threads and processes, atomic(), locks, and
its search tables (two FTS5 tables, batched catch-ups, reindex).

The Store contract itself is checked by tests/contract/ on every backend; these tests cover
what only this backend has.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from helpers.history import add_context, build_history, places, snippets
from terrarium import codec, states
from terrarium.errors import ConflictError, SegmentNotFound, StoreError
from terrarium.model import ContextId
from terrarium.search import scan
from terrarium.sessions import create_segment, save_user_input
from terrarium.stores import fts
from terrarium.stores import sqlite as sqlite_backend
from terrarium.stores.base import NewEntry, SearchQuery
from terrarium.stores.memory import MemoryStore
from terrarium.stores.sqlite import SqliteStore, _upkeep

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
    """4 processes appending to one context lose nothing and duplicate nothing; their upkeep
    threads, racing to index what each other's appends staged, leave both FTS5 tables sound
    and every item found once."""
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
    _integrity(store)  # as the processes left it
    for worker in range(4):
        query = SearchQuery(f"p{worker}", limit=200)
        hits = store.search(query)
        assert len(hits) == 100 and places(hits) == places(scan(store, query))
    _integrity(store)


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
    """lock_context holds an flock on {db}-locks/{type}/{name} that another process sees."""
    lock_file = db.with_name(f"{db.name}-locks") / "irc" / "#python"

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


# --------------------------------------------------------------------------- search tables


def _integrity(store: SqliteStore) -> None:
    """Both FTS5 tables agree with their content views (a wrong 'delete' breaks this)."""
    conn = sqlite3.connect(store.path)
    try:
        for table in ("search_fts", "search_recent"):
            conn.execute(f"INSERT INTO {table}({table}, rank) VALUES('integrity-check', 1)")
        hw, floor = conn.execute("SELECT hw, floor FROM search_meta").fetchone()
        assert floor <= hw + 1
    finally:
        conn.close()


def _small_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make SqliteStore's search tables move at a toy scale."""
    monkeypatch.setattr(sqlite_backend, "SEARCH_BATCH", 4)
    monkeypatch.setattr(sqlite_backend, "SEARCH_RECENT", 10)
    monkeypatch.setattr(fts, "RANK_WINDOW", 6)


def test_recent_and_full_tables_stay_consistent(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past SEARCH_RECENT items, searches use search_fts and still find every match of a rare
    word; common words give full pages; deletes leave both tables sound."""
    _small_windows(monkeypatch)
    for i in range(8):
        add_context(store, f"cli:c{i}", *[f"lambda item {i} {j} w{i}x{j}" for j in range(5)])
    with store.atomic():  # a bulk import: many items in one append
        add_context(store, "cli:bulk", *[f"lambda bulk {j} rare{j % 3}" for j in range(23)])
    add_context(store, "cli:tail", "lambda tail one", "lambda tail two")  # under a batch: not read
    conn = sqlite3.connect(store.path)
    try:
        sql = "SELECT wm, (SELECT max(id) FROM entries) FROM search_meta"
        wm, top = conn.execute(sql).fetchone()
    finally:
        conn.close()
    assert 0 < top - wm < sqlite_backend.SEARCH_BATCH  # the derived tables lag the log
    assert snippets(store.search(SearchQuery("tail"))) == ["lambda tail two", "lambda tail one"]
    _integrity(store)
    conn = sqlite3.connect(store.path)
    try:
        wm, hw, floor = conn.execute("SELECT wm, hw, floor FROM search_meta").fetchone()
        (total,) = conn.execute("SELECT count(*) FROM search_docs").fetchone()
        (top,) = conn.execute("SELECT max(id) FROM entries").fetchone()
    finally:
        conn.close()
    assert wm == top and hw == total == 8 * 5 + 23 + 2  # the search read everything first
    assert 1 < floor <= hw + 1  # search_recent holds only the newest items
    for word in ("w0x1", "w7x4", "rare1", "bulk", "tail"):  # in one FTS5 table or both
        assert places(store.search(SearchQuery(word, limit=50))) == places(
            scan(store, SearchQuery(word, limit=50))
        ), word
    for text, filters in [  # few matches, a common word or a filter: ranked by the rare words
        ("w0x1 lambda", {}),
        ("rare1 lambda", {"type": "cli"}),
        ("tail lambda", {"role": "user"}),
        ("item", {"context": "cli:c3"}),
        ("rare2", {"since": "2000-01-01"}),
    ]:
        query = SearchQuery(text, limit=50, **filters)
        hits = store.search(query)
        assert hits and places(hits) == places(scan(store, query)), query
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    hits = store.search(SearchQuery("lambda", limit=7))
    assert len(hits) == 7 and all("lambda" in h.snippet for h in hits)
    assert len(store.search(SearchQuery("lambda", context="cli:c0", limit=20))) == 5
    assert len(store.search(SearchQuery("lambda", since="2000-01-01", limit=60))) == 60
    for context in ("cli:c0", "cli:bulk", "cli:c7"):
        assert states.delete_context(store, ContextId.parse(context))
        _integrity(store)
    assert len(store.search(SearchQuery("lambda", limit=100))) == 32
    add_context(store, "cli:after", "lambda after the deletes")
    assert snippets(store.search(SearchQuery("after"))) == ["lambda after the deletes"]
    _integrity(store)


def _meta(store: SqliteStore) -> tuple[int, int]:
    """(what the derived tables have read up to, the newest entry id)."""
    conn = sqlite3.connect(store.path)
    try:
        row = conn.execute("SELECT wm, (SELECT max(id) FROM entries) FROM search_meta").fetchone()
    finally:
        conn.close()
    return row[0], row[1]


def test_appends_bring_the_index_up_every_batch(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without any search, the append that makes SEARCH_BATCH entries wait reads them all."""
    monkeypatch.setattr(sqlite_backend, "SEARCH_BATCH", 4)
    head = add_context(store, "cli:a")  # one entry: the header
    save_user_input(store, head, "kappa one")
    save_user_input(store, head, "kappa two")
    wm, top = _meta(store)
    assert top - wm == 3
    save_user_input(store, head, "kappa three")  # the fourth entry waiting: all are read
    assert _meta(store) == (top + 1, top + 1)
    assert len(store.search(SearchQuery("kappa"))) == 3


def _staged(store: SqliteStore) -> int:
    """How many items wait in ``search_docs`` past ``hw``, in neither FTS5 table."""
    sql = "SELECT count(*) FROM search_docs WHERE id > (SELECT hw FROM search_meta)"
    return int(_raw(store.path, sql)[0][0])


def test_appends_stage_items_and_the_upkeep_thread_indexes_them(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The append's catch-up adds the items to ``search_docs`` only; the upkeep thread adds
    them to both FTS5 tables, a slice at a time, and a search finds them either way."""
    monkeypatch.setattr(sqlite_backend, "SEARCH_BATCH", 4)
    monkeypatch.setattr(sqlite_backend, "INDEX_EVERY", 4)
    monkeypatch.setattr(_upkeep, "SLICE", 3)
    kick = store._upkeep.kick
    monkeypatch.setattr(store._upkeep, "kick", lambda **_: None)  # the thread does not run yet
    head = add_context(store, "cli:a")
    for i in range(12):  # entries 2-13 after the header: batches read up to 4, 8 and 12
        save_user_input(store, head, f"rho {i}")
    assert _meta(store) == (12, 13) and _staged(store) == 11
    _integrity(store)  # staged items are in neither table's content view
    monkeypatch.setattr(store._upkeep, "kick", kick)
    for i in range(12, 15):  # the third makes a batch: read, staged, and a kick
        save_user_input(store, head, f"rho {i}")
    assert store._upkeep.settle()
    assert _staged(store) == 0 and _meta(store) == (16, 16)
    _integrity(store)
    query = SearchQuery("rho", limit=20)
    assert places(store.search(query)) == places(scan(store, query))
    assert len(store.search(query)) == 15


def test_appends_kick_the_upkeep_thread_every_index_every_entries(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each kick costs the thread a slice of FTS5 work and merge steps, so the appends kick it
    to index once INDEX_EVERY entries have come, not at every batch they stage; and ask for
    a WAL checkpoint once every CHECKPOINT_EVERY entries only."""
    monkeypatch.setattr(sqlite_backend, "SEARCH_BATCH", 2)
    monkeypatch.setattr(sqlite_backend, "INDEX_EVERY", 6)
    monkeypatch.setattr(sqlite_backend, "CHECKPOINT_EVERY", 12)
    kicks: list[tuple[int, bool]] = []
    head = add_context(store, "cli:a")  # entry 1
    monkeypatch.setattr(
        store._upkeep, "kick", lambda checkpoint=True: kicks.append((_meta(store)[1], checkpoint))
    )
    for i in range(24):  # entries 2-25; batches at every second one
        save_user_input(store, head, f"chi {i}")
    assert kicks == [(6, False), (12, True), (18, False), (24, True)]
    assert _staged(store) == 23


def test_a_failing_upkeep_slice_leaves_the_items_staged(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An indexing slice that fails (here a full disk) rolls back and is logged: the items
    stay staged, both FTS5 tables sound; the thread's next kick, once the disk has room,
    indexes them."""
    monkeypatch.setattr(sqlite_backend, "SEARCH_BATCH", 2)
    monkeypatch.setattr(sqlite_backend, "INDEX_EVERY", 2)
    index = _upkeep.index_staged
    full = [True]

    def failing(conn: sqlite3.Connection, recent: int, most: int | None = None) -> bool:
        if full[0]:
            index(conn, recent, most)  # its writes are in the slice's transaction...
            raise sqlite3.OperationalError("database or disk is full")  # ...rolled back
        return index(conn, recent, most)

    monkeypatch.setattr(_upkeep, "index_staged", failing)
    head = add_context(store, "cli:a")
    for i in range(5):
        save_user_input(store, head, f"psi {i}")
    assert store._upkeep.settle()
    assert "search index upkeep deferred" in caplog.text and "disk is full" in caplog.text
    assert _staged(store) == 5
    _integrity(store)
    full[0] = False
    store._upkeep.kick()
    assert store._upkeep.settle()
    assert _staged(store) == 0
    _integrity(store)
    query = SearchQuery("psi", limit=20)
    assert len(store.search(query)) == 5
    assert places(store.search(query)) == places(scan(store, query))


def test_a_search_indexes_staged_items_itself(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no upkeep thread (none was kicked), the next search indexes what is staged, so
    what it ranks is the FTS5 tables' alone, and the tables stay sound."""
    monkeypatch.setattr(sqlite_backend, "SEARCH_BATCH", 2)
    monkeypatch.setattr(store._upkeep, "kick", lambda **_: None)
    head = add_context(store, "cli:a")
    for i in range(5):  # entries 2-6: batches read up to 2, 4 and 6, so none waits
        save_user_input(store, head, f"sigma {i}")
    assert _staged(store) == 5 and _meta(store) == (6, 6)
    query = SearchQuery("sigma", limit=20)
    assert places(store.search(query)) == places(scan(store, query))
    assert _staged(store) == 0
    _integrity(store)


def test_purging_a_context_drops_its_staged_items(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A purge (which does not catch up first) removes the context's staged items from
    ``search_docs`` and its indexed ones from both tables; the other context's staged items
    are indexed later as usual."""
    monkeypatch.setattr(sqlite_backend, "SEARCH_BATCH", 2)
    monkeypatch.setattr(store._upkeep, "kick", lambda **_: None)
    gone = add_context(store, "cli:gone", "tau gone 0")
    store.search(SearchQuery("tau"))  # indexed
    kept = add_context(store, "cli:kept")
    for i in range(3):
        save_user_input(store, gone, f"tau gone {i + 1}")
        save_user_input(store, kept, f"tau kept {i}")
    assert _staged(store) >= 4
    assert states.purge_context(store, ContextId.parse("cli:gone"))
    sql = "SELECT count(*) FROM search_docs WHERE session_id = ?"
    assert _raw(store.path, sql, str(gone.session_id)) == [(0,)]
    _integrity(store)
    hits = store.search(SearchQuery("tau", limit=20))
    assert sorted(h.snippet for h in hits) == [f"tau kept {i}" for i in range(3)]
    _integrity(store)


def test_a_failed_catch_up_never_fails_the_append(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The append's entry is in before its batch catch-up runs: if that fails (a busy
    database), the append still succeeds, and the next search catches up."""
    monkeypatch.setattr(sqlite_backend, "SEARCH_BATCH", 2)
    head = add_context(store, "cli:a")
    real = sqlite_backend._catch_up

    def busy(conn: sqlite3.Connection, **_: Any) -> int:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(sqlite_backend, "_catch_up", busy)
    entry = save_user_input(store, head, "lambda kept")
    assert "catch-up deferred" in caplog.text
    monkeypatch.setattr(sqlite_backend, "_catch_up", real)
    assert [(h.seq, h.snippet) for h in store.search(SearchQuery("lambda"))] == [
        (entry.seq, "lambda kept")
    ]


def test_search_recent_is_emptied_then_refilled_newest_first(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past twice SEARCH_RECENT items search_recent is emptied in the catch-up, not rebuilt
    under the write lock, and the upkeep thread refills it with the newest items, a slice at
    a time; at every step both FTS5 tables agree with their content and searches find what a
    scan finds. A read that finds it short (its writer stopped) has the thread refill it."""
    _small_windows(monkeypatch)
    monkeypatch.setattr(_upkeep, "SLICE", 3)
    kick = store._upkeep.kick
    monkeypatch.setattr(store._upkeep, "kick", lambda **_: None)  # no refill yet
    for i in range(5):
        add_context(store, f"cli:c{i}", *[f"mu item {i} {j} m{i}x{j}" for j in range(5)])
    store.search(SearchQuery("mu"))  # reads every entry: 25 items, 2 x 10 passed
    _integrity(store)
    hw, floor = _raw(store.path, "SELECT hw, floor FROM search_meta")[0]
    assert hw == 25 and floor > hw - 10 + 1  # emptied (up to hw), not yet refilled
    for word in ("mu", "m0x1", "m4x4"):
        query = SearchQuery(word, limit=50)
        assert places(store.search(query)) == places(scan(store, query)), word
    monkeypatch.setattr(store._upkeep, "kick", kick)
    store.search(SearchQuery("mu"))  # nothing to catch up, search_recent short: a kick
    assert store._upkeep.settle()
    assert _raw(store.path, "SELECT hw, floor FROM search_meta") == [(25, 16)]
    (held,) = _raw(store.path, "SELECT count(*) FROM search_recent WHERE search_recent MATCH 'mu'")
    assert held == (10,)
    _integrity(store)
    assert places(store.search(SearchQuery("mu", limit=50))) == places(
        scan(store, SearchQuery("mu", limit=50))
    )


def test_the_upkeep_thread_merges_between_its_slices(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While it indexes staged items, the upkeep thread runs a merge step of each FTS5 table
    every round, not only once the items are in: a level left to gather ``crisismerge``
    segments is merged whole inside one slice's commit."""
    monkeypatch.setattr(sqlite_backend, "SEARCH_BATCH", 2)
    monkeypatch.setattr(_upkeep, "SLICE", 2)
    steps: list[str] = []
    index, merge = _upkeep.index_staged, _upkeep._merge

    def indexing(conn: sqlite3.Connection, recent: int, most: int | None = None) -> bool:
        steps.append("index")
        return index(conn, recent, most)

    def merging(conn: sqlite3.Connection, table: str) -> bool:
        steps.append(table)
        return merge(conn, table)

    monkeypatch.setattr(_upkeep, "index_staged", indexing)
    monkeypatch.setattr(_upkeep, "_merge", merging)
    kick = store._upkeep.kick
    monkeypatch.setattr(store._upkeep, "kick", lambda **_: None)
    head = add_context(store, "cli:a")
    for i in range(12):
        save_user_input(store, head, f"phi {i}")
    assert _staged(store) >= 10
    kick()
    assert store._upkeep.settle()
    assert steps.count("index") >= 6  # six slices of two items (and one that finds none)
    assert steps[:3] == ["index", "search_fts", "search_recent"]
    assert "index" in steps[3:]  # more slices after the merges: they are interleaved
    assert _staged(store) == 0
    _integrity(store)


def test_the_upkeep_thread_checkpoints_the_wal(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every CHECKPOINT_EVERY entries the upkeep thread copies the WAL back into the database
    (before SQLite's automatic checkpoint would, in an append). Kicks for staged items are
    kept out of the first part: they would checkpoint too."""
    monkeypatch.setattr(sqlite_backend, "CHECKPOINT_EVERY", 10**9)
    monkeypatch.setattr(sqlite_backend, "SEARCH_BATCH", 10**9)
    head = add_context(store, "cli:a")
    size = store.path.stat().st_size
    for i in range(100):  # ~100 pages and the search tables': under 1000, in the WAL alone
        save_user_input(store, head, f"nu {i} " + "x" * 2000)
    assert store.path.stat().st_size == size
    monkeypatch.setattr(sqlite_backend, "CHECKPOINT_EVERY", 1)
    save_user_input(store, head, "nu last")
    assert store._upkeep.settle()
    assert store.path.stat().st_size > size + 100 * 2000
    assert len(store.search(SearchQuery("nu", limit=500))) == 101
    _integrity(store)


def test_the_upkeep_thread_stops_when_idle_and_starts_again(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store left open without appends holds no thread: it stops after IDLE_EXIT seconds
    without a kick, and the next kick starts another."""
    monkeypatch.setattr(_upkeep, "IDLE_EXIT", 0.5)
    monkeypatch.setattr(sqlite_backend, "CHECKPOINT_EVERY", 1)
    head = add_context(store, "cli:a")
    save_user_input(store, head, "omicron one")
    first = store._upkeep._thread  # started by that append's kick
    assert first is not None
    first.join(30)
    assert not first.is_alive() and store._upkeep._thread is None
    save_user_input(store, head, "omicron two")
    assert store._upkeep.settle()
    second = store._upkeep._thread
    assert second is not None and second is not first
    assert len(store.search(SearchQuery("omicron"))) == 2


# Python 3.12+ warns that a fork with threads alive may deadlock: the upkeep is why it does not.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_appends_and_starts_its_own_upkeep(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child forked while the parent's upkeep thread held the append gate still appends
    (its gate is new) and kicks an upkeep thread of its own."""
    head = add_context(store, "cli:a")
    save_user_input(store, head, "xi parent")
    store._upkeep.kick()
    with store._upkeep.gate:  # forked while held
        pid = os.fork()
        if pid == 0:  # the child: no pytest here, only an exit status
            code = 1
            try:
                store._idle = []  # SQLite connections must not cross a fork: new ones
                sqlite_backend.CHECKPOINT_EVERY = 1
                save_user_input(store, head, "xi child")
                code = 0 if store._upkeep.settle(10) else 2
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sorted(h.snippet for h in store.search(SearchQuery("xi"))) == [
        "xi child",
        "xi parent",
    ]


def test_ids_a_delete_frees_are_read_again(store: SqliteStore) -> None:
    """Deleting the newest context frees the newest entry ids; the entries that take them
    next are still searched and counted."""
    add_context(store, "cli:a", "rho first")
    add_context(store, "cli:b", "rho second", "rho third")
    assert len(store.search(SearchQuery("rho"))) == 3  # everything read
    before = _meta(store)
    assert states.delete_context(store, ContextId("cli", "b"))
    head = add_context(store, "cli:c", "rho fourth", "rho fifth", "rho sixth")
    conn = sqlite3.connect(store.path)
    try:
        sql = (
            "SELECT min(e.id) FROM entries AS e JOIN segments AS g ON g.id = e.seg "
            "WHERE g.session_id = ?"
        )
        (first,) = conn.execute(sql, (str(head.session_id),)).fetchone()
    finally:
        conn.close()
    assert first <= before[1]  # the freed ids were handed out again
    assert snippets(store.search(SearchQuery("rho", limit=10))) == [
        "rho sixth",
        "rho fifth",
        "rho fourth",
        "rho first",
    ]
    counts = {s.context: s.message_count for s in store.list_contexts_fast()}
    assert counts == {"cli:a": 1, "cli:c": 3}
    _integrity(store)


def test_reindex_rebuilds_the_derived_tables(store: SqliteStore) -> None:
    """reindex rebuilds search and listing counts from the entries alone."""
    build_history(store)
    queries = [SearchQuery("fox"), SearchQuery("the", limit=50), SearchQuery("東京")]
    hits = [store.search(query) for query in queries]
    listing = store.list_contexts_fast()
    conn = sqlite3.connect(store.path, isolation_level=None)
    try:  # damage every derived table
        conn.execute("DELETE FROM search_docs WHERE id % 2 = 0")
        conn.execute("UPDATE contexts SET message_count = 99, last_active = 'x'")
    finally:
        conn.close()
    assert store.reindex() == len(listing)
    assert [store.search(query) for query in queries] == hits
    assert store.list_contexts_fast() == listing
    _integrity(store)


def test_a_rolled_back_append_leaves_nothing_to_find(store: SqliteStore) -> None:
    """A search inside a transaction indexes its uncommitted items in that transaction: a
    rollback takes them too, and they are never found afterwards."""
    head = add_context(store, "cli:a", "mu kept")

    class Boom(Exception):
        pass

    with pytest.raises(Boom), store.atomic():
        save_user_input(store, head, "mu rolled back")
        assert len(store.search(SearchQuery("mu"))) == 2  # seen inside the transaction
        raise Boom
    assert snippets(store.search(SearchQuery("mu"))) == ["mu kept"]
    _integrity(store)
