"""FsStore's search index: its FTS5 tables, dirty markers, watch windows, refresh and rebuild.

What every searchable or listing backend does, FsStore included, is in tests/contract/
(``test_search.py``, ``test_listing.py``; the scan fallback in ``test_scan.py``).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.bench import run_bench
from helpers.history import QUERY_SYNTAX, add_context, snippets, user_item
from terrarium import FsStore, SqliteStore, codec, states
from terrarium import text as text_module
from terrarium.index import _fts as fts
from terrarium.index import _index as fs_search
from terrarium.index import listing as lister
from terrarium.index import of
from terrarium.index._index import SearchIndex
from terrarium.index._query import SearchQuery
from terrarium.model import ContextId, new_segment_id, new_session_id
from terrarium.sessions import create_segment_with_ids, save_user_input
from terrarium.stores.base import NewEntry, PodActiveSegmentRef, Store, iter_lines
from terrarium.stores.fs._changes import mark_dirty


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FsStore]:
    with FsStore(tmp_path / "sessions") as fs:
        yield fs


def _integrity(store: Store) -> None:
    """Both FTS5 tables agree with their content table (a wrong 'delete' breaks this)."""
    conn = sqlite3.connect(of(store).path)
    try:
        for table in ("fts", "fts_recent"):
            conn.execute(f"INSERT INTO {table}({table}, rank) VALUES('integrity-check', 1)")
    finally:
        conn.close()


# --------------------------------------------------------------------------- ranking


def test_the_rarer_term_weighs_more(store: FsStore) -> None:
    """bm25's idf: two hits with both words, the one repeating the rare word ranks first."""
    common = [f"apple pie number {i}" for i in range(30)]
    add_context(store, "cli:a", *common)
    add_context(store, "cli:b", "apple quince quince", "apple apple quince")
    hits = lister(store).search(SearchQuery("apple quince"))
    assert snippets(hits) == ["apple quince quince", "apple apple quince"]


def test_query_syntax_leaves_the_fts5_tables_sound(store: FsStore) -> None:
    """Messages and queries full of FTS5 and SQL syntax leave both FTS5 tables sound (the
    hits themselves: tests/contract/test_search.py)."""
    add_context(store, "cli:a", *[f"the message says {text} literally" for text in QUERY_SYNTAX])
    for text in QUERY_SYNTAX:
        if text_module.tokenize(text):
            lister(store).search(SearchQuery(text))
    _integrity(store)


# --------------------------------------------------------------------------- incremental


def test_an_append_after_a_search_is_found_reading_only_the_new_bytes(store: FsStore) -> None:
    """The index records per segment the offset it read to, and reads only what follows."""
    head = add_context(store, "cli:a", "alpha one")
    assert snippets(lister(store).search(SearchQuery("alpha"))) == ["alpha one"]
    path = store.folder_of(ContextId("cli", "a"))
    assert path is not None
    segment_file = path / f"{head.segment_id}.jsonl"
    index = of(store)
    assert index.offsets()[head.segment_id] == segment_file.stat().st_size
    before_size, before_read = segment_file.stat().st_size, index.stats.bytes_read

    save_user_input(store, head, "alpha two")
    assert set(snippets(lister(store).search(SearchQuery("alpha")))) == {"alpha one", "alpha two"}
    after_size = segment_file.stat().st_size
    assert index.offsets()[head.segment_id] == after_size
    assert index.stats.bytes_read - before_read == after_size - before_size


def test_an_idle_search_reads_no_segment(store: FsStore) -> None:
    """With nothing changed (and no watched session left), a refresh does no work."""
    clock = FakeClock()
    add_context(store, "cli:a", "alpha one")
    index = SearchIndex(store.root, clock=clock)
    try:
        index.search(SearchQuery("alpha"))
        clock.now += fs_search.WATCH_SECONDS + 1
        index.search(SearchQuery("alpha"))  # the watch's last pass
        assert index.watched() == []
        reads = index.stats.segments_read
        assert not index.refresh()
        assert index.stats.segments_read == reads
    finally:
        index.close()


def test_concurrent_indexers_never_index_an_item_twice(store: FsStore) -> None:
    """Refreshes in several connections (processes) serialise; each item is indexed once."""
    _index_concurrently(store, [SearchIndex(store.root) for _ in range(2)])
    _integrity(store)


def test_concurrent_indexers_of_a_change_cursor_never_index_an_item_twice(
    tmp_path: Path,
) -> None:
    """The same with SQLite stores on one database, each with its own index connection: the
    refreshes follow the change cursor in turn."""
    store = SqliteStore(tmp_path / "t.db")
    others = [SqliteStore(store.path) for _ in range(2)]
    try:
        indexes = [of(other) for other in others]
        assert all(index is not None for index in indexes)
        _index_concurrently(store, [index for index in indexes if index is not None])
        _integrity(store)
    finally:
        for other in (*others, store):
            other.close()


def _index_concurrently(store: Store, indexes: list[SearchIndex]) -> None:
    """Searches through ``indexes`` while another thread appends; then every index holds each
    item once. Closes the indexes."""
    heads = [add_context(store, f"cli:c{i}") for i in range(4)]
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for n in range(60):
                save_user_input(store, heads[n % 4], f"omega {n}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def read(index: SearchIndex) -> None:
        try:
            for _ in range(30):
                index.search(SearchQuery("omega", limit=100))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write)]
    threads += [threading.Thread(target=read, args=(index,)) for index in indexes]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        for index in indexes:
            hits = index.search(SearchQuery("omega", limit=100))
            assert sorted(h.snippet for h in hits) == sorted(f"omega {n}" for n in range(60))
    finally:
        for index in indexes:
            index.close()


class FakeClock:
    """A wall clock the test moves."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_an_unmarked_append_is_found_while_watched_and_after_the_watch_ends(
    store: FsStore,
) -> None:
    """Appends that leave no marker are covered by the watch their session's last mark began."""
    clock = FakeClock()
    head = add_context(store, "cli:a", "delta one")
    folder = store.folder_of(ContextId("cli", "a"))
    assert folder is not None
    segment_file = folder / f"{head.segment_id}.jsonl"
    index = SearchIndex(store.root, clock=clock)
    try:
        assert len(index.search(SearchQuery("delta"))) == 1
        assert index.watched() == [head.session_id]
        _append_raw(segment_file, 2, "delta two")  # a write that left no marker
        assert len(index.search(SearchQuery("delta"))) == 2
        _append_raw(segment_file, 3, "delta three")
        clock.now += fs_search.WATCH_SECONDS + 1
        assert len(index.search(SearchQuery("delta"))) == 3  # the last pass reads it
        assert index.watched() == []
        _append_raw(segment_file, 4, "delta four")  # bypassing FsStore: needs a mark...
        assert len(index.search(SearchQuery("delta"))) == 3
        mark_dirty(store.root, head.session_id)
        assert len(index.search(SearchQuery("delta"))) == 4
        _append_raw(segment_file, 5, "delta five")  # ...or a full refresh
        clock.now += fs_search.WATCH_SECONDS + 1
        index.search(SearchQuery("delta"))
        index.refresh(full=True)
        assert len(index.search(SearchQuery("delta"))) == 5
    finally:
        index.close()


def test_date_folders_moved_out_and_back_by_hand_are_noticed(
    store: FsStore, tmp_path: Path
) -> None:
    """The seed's "archive old date folders" by hand: a date or type folder moved out of the
    root leaves the listing and the hits, and moved back returns to both, with no marker
    and no watch (only the shape of the tree changed)."""
    clock = FakeClock()
    for context, day in (("cli:old", "2025-01-01"), ("cli:new", "2025-02-01"), ("irc:#a", "")):
        session_id, segment_id = new_session_id(), new_segment_id()
        ts = f"{day}T10:00:00Z" if day else None
        create_segment_with_ids(store, session_id, segment_id, context=context, ts=ts)
        save_user_input(store, PodActiveSegmentRef(session_id, segment_id), f"zeta {context}")
    index = SearchIndex(store.root, clock=clock)

    def listed() -> set[str]:
        return {s.context for s in index.list_contexts_fast()}

    def found() -> set[str]:
        return {str(h.context) for h in index.search(SearchQuery("zeta"))}

    try:
        assert listed() == found() == {"cli:old", "cli:new", "irc:#a"}
        clock.now += fs_search.WATCH_SECONDS + 1
        index.refresh()  # the watch's last pass
        assert index.watched() == []
        away = tmp_path / "archive"
        away.mkdir()
        (store.root / "cli" / "2025-01-01").rename(away / "2025-01-01")
        assert listed() == found() == {"cli:new", "irc:#a"}
        (store.root / "irc").rename(away / "irc")
        assert listed() == found() == {"cli:new"}
        (away / "2025-01-01").rename(store.root / "cli" / "2025-01-01")
        (away / "irc").rename(store.root / "irc")
        assert listed() == found() == {"cli:old", "cli:new", "irc:#a"}
    finally:
        index.close()
    _integrity(store)


def _append_raw(path: Path, seq: int, text: str) -> None:
    line = NewEntry("user_input", "2026-01-01T00:00:00.000000Z", {"item": user_item(text)})
    with open(path, "ab") as out:
        out.write(b"".join(codec.encode_line(x) for x in iter_lines([line], seq)))


def test_a_torn_tail_is_indexed_only_once_complete(store: FsStore) -> None:
    """Bytes after the last newline are not indexed; the offset stays at the newline."""
    head = add_context(store, "cli:a", "epsilon one")
    lister(store).search(SearchQuery("epsilon"))
    folder = store.folder_of(ContextId("cli", "a"))
    assert folder is not None
    segment_file = folder / f"{head.segment_id}.jsonl"
    line = codec.encode_line(
        {"v": 1, "seq": 2, "ts": "2026-01-01T00:00:00Z", "kind": "user_input"}
        | {"item": user_item("epsilon two")}
    )
    complete_size = segment_file.stat().st_size
    with open(segment_file, "ab") as out:
        out.write(line[:30])
    assert snippets(lister(store).search(SearchQuery("epsilon"))) == ["epsilon one"]
    assert of(store).offsets()[head.segment_id] == complete_size
    with open(segment_file, "ab") as out:
        out.write(line[30:])
    assert len(lister(store).search(SearchQuery("epsilon"))) == 2
    assert of(store).offsets()[head.segment_id] == segment_file.stat().st_size


def test_deleting_a_context_leaves_the_fts5_tables_sound(store: FsStore) -> None:
    """Deleting an indexed context, then making one of the same name, leaves both FTS5 tables
    sound (what search and listing show: tests/contract/)."""
    add_context(store, "cli:a", "zeta kept")
    add_context(store, "cli:b", "zeta gone", "zeta gone too")
    lister(store).search(SearchQuery("zeta"))  # indexes both
    states.delete_context(store, ContextId("cli", "b"))
    add_context(store, "cli:b", "zeta reborn")  # same folder name, a new session
    lister(store).search(SearchQuery("zeta"))
    _integrity(store)


def test_a_deleted_index_is_rebuilt_transparently(store: FsStore) -> None:
    """Deleting search.db (even while open) loses nothing: the next search rebuilds it."""
    add_context(store, "cli:a", "theta one")
    assert len(lister(store).search(SearchQuery("theta"))) == 1
    for suffix in ("", "-wal", "-shm"):
        Path(f"{of(store).path}{suffix}").unlink(missing_ok=True)
    add_context(store, "cli:b", "theta two")
    assert len(lister(store).search(SearchQuery("theta"))) == 2
    assert of(store).path.exists()


def test_a_corrupt_or_foreign_index_is_rebuilt(store: FsStore) -> None:
    """A file that is not our database, or of another schema version, is replaced."""
    add_context(store, "cli:a", "iota one")
    path = of(store).path
    of(store).close()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"this is not a database" * 100)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    with FsStore(store.root) as other:
        assert len(lister(other).search(SearchQuery("iota"))) == 1
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA user_version = 999")
    finally:
        conn.close()
    with FsStore(store.root) as other:
        assert len(lister(other).search(SearchQuery("iota"))) == 1


def test_reindex_rebuilds_the_search_index(store: FsStore) -> None:
    """FsStore.reindex() rebuilds the search index too (and finds unmarked writes)."""
    head = add_context(store, "cli:a", "kappa one")
    assert len(lister(store).search(SearchQuery("kappa"))) == 1
    folder = store.folder_of(ContextId("cli", "a"))
    assert folder is not None
    _append_raw(folder / f"{head.segment_id}.jsonl", 2, "kappa two")
    assert store.reindex() == 1
    assert len(lister(store).search(SearchQuery("kappa"))) == 2
    _integrity(store)


def test_common_words_are_ranked_among_recent_matches(
    store: FsStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past RANK_WINDOW matches, ranking uses fts_recent; results stay full and correct."""
    monkeypatch.setattr(fts, "RANK_WINDOW", 5)
    monkeypatch.setattr(fs_search, "RECENT_SIZE", 8)
    for i in range(6):
        add_context(store, f"cli:c{i}", *[f"lambda item {i} {j}" for j in range(5)])
    hits = lister(store).search(SearchQuery("lambda", limit=7))
    assert len(hits) == 7 and all("lambda" in h.snippet for h in hits)
    rare = lister(store).search(SearchQuery("lambda", context="cli:c0", limit=20))
    assert len(rare) == 5  # few matches: ranked in full
    old = lister(store).search(SearchQuery("lambda", since="2000-01-01", limit=20))
    assert len(old) == 20
    conn = sqlite3.connect(of(store).path)
    try:
        recent = conn.execute("SELECT value FROM meta WHERE key = 'recent_count'").fetchone()
        assert int(recent[0]) <= 2 * 8
    finally:
        conn.close()
    states.delete_context(store, ContextId("cli", "c5"))
    assert len(lister(store).search(SearchQuery("lambda", limit=30))) == 25
    _integrity(store)


def test_among_few_matches_a_very_common_term_only_filters(
    store: FsStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A term in most rows is not weighed (bm25 gives it ~0), but every hit still has it."""
    monkeypatch.setattr(fts, "RANK_WINDOW", 3)
    add_context(store, "cli:a", *[f"mu filler {i}" for i in range(40)])
    add_context(store, "cli:b", "mu nu nu", "nu alone", "mu nu")
    hits = lister(store).search(SearchQuery("mu nu"))
    assert snippets(hits) == ["mu nu nu", "mu nu"]
    only_nu = lister(store).search(SearchQuery("nu"))
    assert {h.snippet: round(h.score, 9) for h in hits} == {
        h.snippet: round(h.score, 9) for h in only_nu if h.snippet != "nu alone"
    }
    assert [hits[0].snippet[a:b] for a, b in hits[0].highlights] == ["mu", "nu", "nu"]


# --------------------------------------------------------------------------- listing


def test_listing_does_not_open_session_files(store: FsStore) -> None:
    """Once indexed, listing reads the database only."""
    for i in range(5):
        add_context(store, f"cli:c{i}", "hello")
    lister(store).list_contexts_fast()
    of(store).clock = lambda: 1e12  # every watch ended: one last pass...
    lister(store).list_contexts_fast()
    reads = of(store).stats.segments_read
    assert len(lister(store).list_contexts_fast()) == 5  # ...and now nothing to read
    assert of(store).stats.segments_read == reads


# --------------------------------------------------------------------------- benchmark


def test_the_search_benchmark_runs(tmp_path: Path) -> None:
    """benchmarks/bench_search.py --quick runs to the end (no timing is asserted)."""
    result = run_bench("bench_search.py", "--quick", tmp=tmp_path)
    assert "search p50" in result.stdout


def test_a_memory_store_keeps_its_index_in_a_private_folder_it_removes() -> None:
    """MemoryStore's derived index lives in a private temporary folder (``0700``, its
    database ``0600``) that closing the store removes; a search after an append reads only
    the session that changed."""
    from terrarium.stores.memory import MemoryStore

    store = MemoryStore()
    add_context(store, "cli:a", "omega one")
    add_context(store, "cli:b", "omega two")
    found = of(store)
    assert found is not None
    assert snippets(found.search(SearchQuery("omega"))) == ["omega two", "omega one"]
    folder = found.path.parent
    assert folder.stat().st_mode & 0o777 == 0o700
    assert found.path.stat().st_mode & 0o777 == 0o600
    sessions = found.stats.sessions
    head = store.get_head(ContextId.parse("cli:a"))
    assert head is not None
    save_user_input(store, head, "omega three")
    assert len(found.search(SearchQuery("omega"))) == 3
    assert found.stats.sessions == sessions + 1
    store.close()
    assert not folder.exists()


def test_closing_a_memory_store_while_its_index_reads_it_does_not_deadlock() -> None:
    """A refresh holds the index's lock while it takes the store's (``changes``); closing the
    store must not hold the store's lock while it waits for the index's."""
    from terrarium.stores.memory import MemoryStore

    store = MemoryStore()
    add_context(store, "cli:a", "omega one")
    found = of(store)
    assert found is not None
    with found._lock:  # as a refresh holds it
        closing = threading.Thread(target=store.close)
        closing.start()
        closing.join(0.2)  # close is now waiting for the index's lock
        reading = threading.Thread(target=store.changes, args=(None,))
        reading.start()
        reading.join(5)
        assert not reading.is_alive()  # the store's lock is free meanwhile
    closing.join(5)
    assert not closing.is_alive()
