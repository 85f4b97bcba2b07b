"""Search across every session: the FsStore FTS5 index, the scan fallback, and fast listing."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.history import add_context, build_history, snippets, user_item
from terrarium import FsStore, MemoryStore, codec
from terrarium import text as text_module
from terrarium.errors import InvalidContextId
from terrarium.model import ContextId, Item
from terrarium.search import InvalidQuery, scan, search
from terrarium.sessions import (
    clear_segment,
    create_compacted_segment,
    restore,
    save_user_input,
)
from terrarium.stores import fts
from terrarium.stores.base import (
    NewEntry,
    Searchable,
    SearchHit,
    SearchQuery,
    iter_lines,
)
from terrarium.stores.fs import search as fs_search
from terrarium.stores.fs.search import SearchIndex, mark_dirty

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FsStore]:
    with FsStore(tmp_path / "sessions") as fs:
        yield fs


def _integrity(store: FsStore) -> None:
    """Both FTS5 tables agree with their content table (a wrong 'delete' breaks this)."""
    conn = sqlite3.connect(store.search_index.path)
    try:
        for table in ("fts", "fts_recent"):
            conn.execute(f"INSERT INTO {table}({table}, rank) VALUES('integrity-check', 1)")
    finally:
        conn.close()


# --------------------------------------------------------------------------- ranking


def test_fs_store_is_searchable_and_the_memory_store_is_not(store: FsStore) -> None:
    """FsStore answers through its index; MemoryStore through the scan."""
    assert isinstance(store, Searchable)
    assert not isinstance(MemoryStore(), Searchable)


def test_a_message_with_the_term_twice_outranks_one_with_it_once(store: FsStore) -> None:
    """bm25: more occurrences in a message of the same length rank higher."""
    add_context(store, "cli:a", "the walrus sat down on a rock", "the walrus saw a walrus there")
    add_context(store, "cli:b", *[f"filler message number {i}" for i in range(20)])
    hits = store.search(SearchQuery("walrus"))
    assert snippets(hits) == ["the walrus saw a walrus there", "the walrus sat down on a rock"]
    assert hits[0].score > hits[1].score


def test_the_rarer_term_weighs_more(store: FsStore) -> None:
    """bm25's idf: two hits with both words, the one repeating the rare word ranks first."""
    common = [f"apple pie number {i}" for i in range(30)]
    add_context(store, "cli:a", *common)
    add_context(store, "cli:b", "apple quince quince", "apple apple quince")
    hits = store.search(SearchQuery("apple quince"))
    assert snippets(hits) == ["apple quince quince", "apple apple quince"]


def test_every_term_must_match(store: FsStore) -> None:
    """Terms are ANDed; a term of several tokens matches as a phrase."""
    add_context(store, "cli:a", "red green blue", "red blue", "don't panic", "don panic t")
    assert snippets(store.search(SearchQuery("green red"))) == ["red green blue"]
    assert snippets(store.search(SearchQuery("don't"))) == ["don't panic"]


def test_snippet_highlights_point_at_the_matched_words(store: FsStore) -> None:
    """Each highlight span covers a matched word in the snippet, markers stripped."""
    long_text = " ".join(["lorem ipsum dolor"] * 30 + ["Zebra crossing"] + ["sit amet"] * 30)
    add_context(store, "cli:a", long_text, "A CAFÉ and a café, then Cafe again")
    (hit,) = store.search(SearchQuery("zebra"))
    assert "\ue000" not in hit.snippet and "\ue001" not in hit.snippet
    assert hit.snippet.startswith("…") and hit.snippet.endswith("…")
    assert [hit.snippet[a:b] for a, b in hit.highlights] == ["Zebra"]
    (hit,) = store.search(SearchQuery("cafe"))
    assert [hit.snippet[a:b] for a, b in hit.highlights] == ["CAFÉ", "café", "Cafe"]


def test_a_hit_names_where_the_item_is(store: FsStore) -> None:
    """context, date, session, segment, seq, role and ts identify the item."""
    head = add_context(store, "irc:#python", "first", "needle here")
    (hit,) = store.search(SearchQuery("needle"))
    read = store.read_segment(head.session_id, head.segment_id)
    line = read.entries[hit.seq - 1]
    assert (hit.context, hit.date) == ("irc:#python", head.date)
    assert (hit.session_id, hit.segment_id, hit.seq) == (head.session_id, head.segment_id, 2)
    assert (hit.role, hit.ts) == ("user", line["ts"])
    assert line["item"]["content"] == "needle here"


# --------------------------------------------------------------------------- filters


def test_filters_type_context_role_and_limit(store: FsStore) -> None:
    """Each filter narrows the hits; limit caps them."""
    add_context(store, "cli:main", "kiwi from the cli")
    add_context(store, "irc:#python", "kiwi from irc", "kiwi again")
    add_context(store, "irc:#rust", "kiwi from rust", role="assistant")
    q = "kiwi"
    assert len(store.search(SearchQuery(q))) == 4
    assert {h.context for h in store.search(SearchQuery(q, type="irc"))} == {
        "irc:#python",
        "irc:#rust",
    }
    assert {h.context for h in store.search(SearchQuery(q, context="irc:#python"))} == {
        "irc:#python"
    }
    assert [h.context for h in store.search(SearchQuery(q, role="assistant"))] == ["irc:#rust"]
    assert len(store.search(SearchQuery(q, limit=2))) == 2
    assert store.search(SearchQuery(q, type="game")) == []
    assert store.search(SearchQuery(q, context="cli:nope")) == []


def test_since_filters_by_entry_time(store: FsStore) -> None:
    """since keeps entries written on or after a date or a time (UTC)."""
    head = add_context(store, "cli:a")
    for ts, text in [
        ("2025-01-01T10:00:00.000000Z", "plum old"),
        ("2025-06-01T10:00:00.000000Z", "plum middle"),
        ("2025-12-31T23:00:00.000000Z", "plum late"),
    ]:
        store.append(
            head.session_id,
            head.segment_id,
            [NewEntry("user_input", ts, {"item": user_item(text)})],
        )
    assert set(snippets(store.search(SearchQuery("plum", since="2025-06-01")))) == {
        "plum middle",
        "plum late",
    }
    assert snippets(store.search(SearchQuery("plum", since="2025-12-31T22:30:00Z"))) == [
        "plum late"
    ]
    # An offset is converted to UTC: 2026-01-01T00:30+01:00 is 2025-12-31T23:30Z.
    assert store.search(SearchQuery("plum", since="2026-01-01T00:30:00+01:00")) == []


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (SearchQuery("x", limit=0), "limit"),
        (SearchQuery("x", limit=10_000), "limit"),
        (SearchQuery("x", role="robot"), "role"),
        (SearchQuery("x", since="last tuesday"), "since"),
    ],
)
def test_invalid_filters_are_refused(store: FsStore, query: SearchQuery, message: str) -> None:
    """A filter that cannot be valid is an InvalidQuery naming it, on both paths."""
    for run in (store.search, lambda q: scan(store, q)):
        with pytest.raises(InvalidQuery, match=message):
            run(query)
    with pytest.raises(InvalidContextId):
        store.search(SearchQuery("x", context="no-colon"))


# --------------------------------------------------------------------------- queries are data

HOSTILE = [
    '"',
    '"quoted"',
    "*",
    "pre*",
    "NEAR(",
    "NEAR(a b)",
    "'; DROP TABLE docs; --",
    "AND OR NOT",
    "a AND b",
    "col:umn",
    "^start",
    "{body}: x",
    "(((",
    "a\x00b",
    "\\",
    "%_",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_query_syntax_is_matched_as_words(store: FsStore, text: str) -> None:
    """FTS5 and SQL syntax in a query is data: no error, and it finds the words it holds."""
    add_context(store, "cli:a", f"the message says {text} literally", "something else entirely")
    words = text_module.tokenize(text)
    if not words:
        with pytest.raises(InvalidQuery):
            store.search(SearchQuery(text))
        return
    hits = store.search(SearchQuery(text))
    # (FTS5's snippet() leaves NUL characters out.)
    assert snippets(hits) == [f"the message says {text} literally".replace("\x00", "")]
    assert [h.seq for h in scan(store, SearchQuery(text))] == [h.seq for h in hits]
    _integrity(store)  # the tables are all still there and sound


@pytest.mark.parametrize("text", ["", "   ", '"', "*", '""', "--", "🎉", "🎉 *", "\x00"])
def test_a_query_with_nothing_to_search_for_is_a_one_line_value_error(
    store: FsStore, text: str
) -> None:
    """Empty queries (or only punctuation/emoji) raise InvalidQuery, a ValueError."""
    add_context(store, "cli:a", "hello")
    for run in (store.search, lambda q: scan(store, q), lambda q: search(MemoryStore(), q)):
        with pytest.raises(InvalidQuery) as caught:
            run(SearchQuery(text))
        assert isinstance(caught.value, ValueError)
        assert "\n" not in str(caught.value) and "nothing to search for" in str(caught.value)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("cafe", "Un café à Paris"),
        ("CAFÉ", "Un café à Paris"),
        ("ÉTÉ", "L'été est chaud"),
        ("東京", "私は東京タワーに行った"),
        ("タワー", "私は東京タワーに行った"),
        ("서울", "서울에 살아요"),
        ("party 🎉", "party 🎉 time"),
        ("naïve", "a naive approach"),
    ],
)
def test_unicode_is_folded_and_cjk_is_found_inside_words(
    store: FsStore, query: str, expected: str
) -> None:
    """Case and accents fold; CJK words are found in text without spaces; emoji are ignored."""
    texts = [
        "Un café à Paris",
        "L'été est chaud",
        "私は東京タワーに行った",
        "서울에 살아요",
        "party 🎉 time",
        "a naive approach",
        "unrelated",
    ]
    add_context(store, "cli:a", *texts)
    hits = store.search(SearchQuery(query))
    assert snippets(hits) == [expected]
    assert snippets(scan(store, SearchQuery(query))) == [expected]
    for hit in hits:
        for a, b in hit.highlights:
            assert text_module.tokenize(hit.snippet[a:b])


def test_marker_characters_in_the_text_cannot_fake_highlights(store: FsStore) -> None:
    """The private-use marker characters in a message are indexed as U+FFFD."""
    add_context(store, "cli:a", "evil \ue000fake\ue001 marker and a real word")
    (hit,) = store.search(SearchQuery("real"))
    assert [hit.snippet[a:b] for a, b in hit.highlights] == ["real"]
    assert "\ue000" not in hit.snippet


# --------------------------------------------------------------------------- incremental


def test_an_append_after_a_search_is_found_reading_only_the_new_bytes(store: FsStore) -> None:
    """The index records per segment the offset it read to, and reads only what follows."""
    head = add_context(store, "cli:a", "alpha one")
    assert snippets(store.search(SearchQuery("alpha"))) == ["alpha one"]
    path = store.folder_of(ContextId("cli", "a"))
    assert path is not None
    segment_file = path / f"{head.segment_id}.jsonl"
    index = store.search_index
    assert index.offsets()[head.segment_id] == segment_file.stat().st_size
    before_size, before_read = segment_file.stat().st_size, index.stats.bytes_read

    save_user_input(store, head, "alpha two")
    assert set(snippets(store.search(SearchQuery("alpha")))) == {"alpha one", "alpha two"}
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


def test_writes_of_another_store_instance_are_found(tmp_path: Path) -> None:
    """Another process's writes (another FsStore on the same root) are seen."""
    root = tmp_path / "sessions"
    with FsStore(root) as reader, FsStore(root) as writer:
        head = add_context(writer, "cli:a", "gamma one")
        assert snippets(reader.search(SearchQuery("gamma"))) == ["gamma one"]
        save_user_input(writer, head, "gamma two")
        save_user_input(writer, head, "gamma three")  # unmarked: within MARK_EVERY
        add_context(writer, "cli:b", "gamma four")
        assert len(reader.search(SearchQuery("gamma"))) == 4


def test_concurrent_indexers_never_index_an_item_twice(store: FsStore) -> None:
    """Refreshes in several connections (processes) serialise; each item is indexed once."""
    heads = [add_context(store, f"cli:c{i}") for i in range(4)]
    indexes = [SearchIndex(store.root) for _ in range(2)]
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
    _integrity(store)


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


def _append_raw(path: Path, seq: int, text: str) -> None:
    line = NewEntry("user_input", "2026-01-01T00:00:00.000000Z", {"item": user_item(text)})
    with open(path, "ab") as out:
        out.write(b"".join(codec.encode_line(x) for x in iter_lines([line], seq)))


def test_a_torn_tail_is_indexed_only_once_complete(store: FsStore) -> None:
    """Bytes after the last newline are not indexed; the offset stays at the newline."""
    head = add_context(store, "cli:a", "epsilon one")
    store.search(SearchQuery("epsilon"))
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
    assert snippets(store.search(SearchQuery("epsilon"))) == ["epsilon one"]
    assert store.search_index.offsets()[head.segment_id] == complete_size
    with open(segment_file, "ab") as out:
        out.write(line[30:])
    assert len(store.search(SearchQuery("epsilon"))) == 2
    assert store.search_index.offsets()[head.segment_id] == segment_file.stat().st_size


def test_a_deleted_context_disappears(store: FsStore) -> None:
    """Deleting a context removes its items from results and listing."""
    add_context(store, "cli:a", "zeta kept")
    add_context(store, "cli:b", "zeta gone", "zeta gone too")
    assert len(store.search(SearchQuery("zeta"))) == 3
    assert store.delete_context(ContextId("cli", "b"))
    assert snippets(store.search(SearchQuery("zeta"))) == ["zeta kept"]
    assert [s.context for s in store.list_contexts_fast()] == ["cli:a"]
    add_context(store, "cli:b", "zeta reborn")  # same folder name, a new session
    assert set(snippets(store.search(SearchQuery("zeta")))) == {"zeta kept", "zeta reborn"}
    _integrity(store)


def test_history_left_by_clear_and_compaction_stays_findable(store: FsStore) -> None:
    """Old segments stay indexed; a header's history is indexed with seq 0."""
    head = add_context(store, "cli:a", "eta before the clear")
    state = restore(store, "cli:a")
    new = create_compacted_segment(
        store, state, [Item.assistant("eta summary of it")], context="cli:a"
    )
    clear_segment(store, restore(store, "cli:a"), context="cli:a")
    hits = {h.snippet: h for h in store.search(SearchQuery("eta"))}
    assert set(hits) == {"eta before the clear", "eta summary of it"}
    assert (hits["eta summary of it"].segment_id, hits["eta summary of it"].seq) == (new, 0)
    assert hits["eta before the clear"].segment_id == head.segment_id


def test_a_deleted_index_is_rebuilt_transparently(store: FsStore) -> None:
    """Deleting search.db (even while open) loses nothing: the next search rebuilds it."""
    add_context(store, "cli:a", "theta one")
    assert len(store.search(SearchQuery("theta"))) == 1
    for suffix in ("", "-wal", "-shm"):
        Path(f"{store.search_index.path}{suffix}").unlink(missing_ok=True)
    add_context(store, "cli:b", "theta two")
    assert len(store.search(SearchQuery("theta"))) == 2
    assert store.search_index.path.exists()


def test_a_corrupt_or_foreign_index_is_rebuilt(store: FsStore) -> None:
    """A file that is not our database, or of another schema version, is replaced."""
    add_context(store, "cli:a", "iota one")
    path = store.search_index.path
    store.search_index.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"this is not a database" * 100)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    with FsStore(store.root) as other:
        assert len(other.search(SearchQuery("iota"))) == 1
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA user_version = 999")
    finally:
        conn.close()
    with FsStore(store.root) as other:
        assert len(other.search(SearchQuery("iota"))) == 1


def test_reindex_rebuilds_the_search_index(store: FsStore) -> None:
    """FsStore.reindex() rebuilds the search index too (and finds unmarked writes)."""
    head = add_context(store, "cli:a", "kappa one")
    assert len(store.search(SearchQuery("kappa"))) == 1
    folder = store.folder_of(ContextId("cli", "a"))
    assert folder is not None
    _append_raw(folder / f"{head.segment_id}.jsonl", 2, "kappa two")
    assert store.reindex() == 1
    assert len(store.search(SearchQuery("kappa"))) == 2
    _integrity(store)


def test_common_words_are_ranked_among_recent_matches(
    store: FsStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past RANK_WINDOW matches, ranking uses fts_recent; results stay full and correct."""
    monkeypatch.setattr(fts, "RANK_WINDOW", 5)
    monkeypatch.setattr(fs_search, "RECENT_SIZE", 8)
    for i in range(6):
        add_context(store, f"cli:c{i}", *[f"lambda item {i} {j}" for j in range(5)])
    hits = store.search(SearchQuery("lambda", limit=7))
    assert len(hits) == 7 and all("lambda" in h.snippet for h in hits)
    rare = store.search(SearchQuery("lambda", context="cli:c0", limit=20))
    assert len(rare) == 5  # few matches: ranked in full
    old = store.search(SearchQuery("lambda", since="2000-01-01", limit=20))
    assert len(old) == 20
    conn = sqlite3.connect(store.search_index.path)
    try:
        recent = conn.execute("SELECT value FROM meta WHERE key = 'recent_count'").fetchone()
        assert int(recent[0]) <= 2 * 8
    finally:
        conn.close()
    store.delete_context(ContextId("cli", "c5"))
    assert len(store.search(SearchQuery("lambda", limit=30))) == 25
    _integrity(store)


def test_among_few_matches_a_very_common_term_only_filters(
    store: FsStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A term in most rows is not weighed (bm25 gives it ~0), but every hit still has it."""
    monkeypatch.setattr(fts, "RANK_WINDOW", 3)
    add_context(store, "cli:a", *[f"mu filler {i}" for i in range(40)])
    add_context(store, "cli:b", "mu nu nu", "nu alone", "mu nu")
    hits = store.search(SearchQuery("mu nu"))
    assert snippets(hits) == ["mu nu nu", "mu nu"]
    only_nu = store.search(SearchQuery("nu"))
    assert {h.snippet: round(h.score, 9) for h in hits} == {
        h.snippet: round(h.score, 9) for h in only_nu if h.snippet != "nu alone"
    }
    assert [hits[0].snippet[a:b] for a, b in hits[0].highlights] == ["mu", "nu", "nu"]


# --------------------------------------------------------------------------- parity


PARITY_QUERIES = [
    SearchQuery("fox"),
    SearchQuery("quick fox"),
    SearchQuery("the"),
    SearchQuery("brown fox", limit=2),
    SearchQuery("fox", type="irc"),
    SearchQuery("fox", role="assistant"),
    SearchQuery("fox", context="game:run-1"),
    SearchQuery("CAFE"),
    SearchQuery("東京"),
    SearchQuery("fox", since="2000-01-01"),
]


def _key(hits: list[SearchHit]) -> list[tuple[Any, ...]]:
    return sorted((h.context, h.seq, h.role, round(h.score, 9), h.ts) for h in hits)


@pytest.mark.parametrize("query", PARITY_QUERIES, ids=lambda q: repr(q.text))
def test_the_index_and_the_scan_agree(store: FsStore, query: SearchQuery) -> None:
    """Same data, same query: the FTS5 index and the scan find the same hits, same scores."""
    build_history(store)
    indexed = store.search(query)
    scanned = scan(store, query)
    assert indexed, "the parity data should match every query"
    assert _key(indexed) == _key(scanned)
    assert [h.score for h in indexed] == sorted((h.score for h in indexed), reverse=True)
    memory = MemoryStore()
    build_history(memory)
    from_memory = search(memory, query)
    assert [(h.context, h.seq, round(h.score, 9)) for h in sorted(from_memory, key=_hit_key)] == [
        (h.context, h.seq, round(h.score, 9)) for h in sorted(indexed, key=_hit_key)
    ]


def _hit_key(hit: SearchHit) -> tuple[Any, ...]:
    return (hit.context, hit.seq, hit.score, hit.snippet)


# --------------------------------------------------------------------------- listing


def test_listing_does_not_open_session_files(store: FsStore) -> None:
    """Once indexed, listing reads the database only."""
    for i in range(5):
        add_context(store, f"cli:c{i}", "hello")
    store.list_contexts_fast()
    store.search_index.clock = lambda: 1e12  # every watch ended: one last pass...
    store.list_contexts_fast()
    reads = store.search_index.stats.segments_read
    assert len(store.list_contexts_fast()) == 5  # ...and now nothing to read
    assert store.search_index.stats.segments_read == reads


# --------------------------------------------------------------------------- benchmark


def test_the_search_benchmark_runs(tmp_path: Path) -> None:
    """benchmarks/bench_search.py --quick runs to the end (no timing is asserted)."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_search.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "search p50" in result.stdout
