"""Search over every ``Searchable`` store: FsStore (its FTS5 index), SqliteStore, PostgresStore.

The tests that name no backend run once per searchable backend (``searchable`` fixture); the
PostgreSQL runs need a server (see ``tests/pg.py``). The ones at the end check what only one
backend has: SQLite's two FTS5 tables and its migration, PostgreSQL's word folding.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.conftest import make_fs, make_postgres, make_sqlite
from pg import fresh_schema, pg_database  # noqa: F401  (the postgres backend's database)
from terrarium import ContextId, FsStore, codec
from terrarium.errors import InvalidContextId
from terrarium.model import Item, SegmentStartState
from terrarium.search import InvalidQuery, scan
from terrarium.sessions import (
    clear_segment,
    create_compacted_segment,
    create_segment,
    fork_at,
    restore,
    save_delta,
    save_user_input,
)
from terrarium.stores import fts
from terrarium.stores import sqlite as sqlite_backend
from terrarium.stores.base import (
    Listing,
    NewEntry,
    PodActiveSegmentRef,
    PodMetadata,
    Searchable,
    SearchHit,
    SearchQuery,
    Store,
)
from terrarium.stores.sqlite import SqliteStore
from terrarium.text import tokenize

FACTORIES: dict[str, Callable[[Path, pytest.FixtureRequest], Store]] = {
    "fs": make_fs,
    "sqlite": make_sqlite,
    "postgres": make_postgres,
}
BACKENDS = ["fs", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
TS = "2026-01-01T00:00:00.000000Z"


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh, empty store of each searchable backend; closed after the test."""
    instance = FACTORIES[request.param](tmp_path, request)
    try:
        yield instance
    finally:
        instance.close()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[SqliteStore]:
    """A SqliteStore, for the tests of its own search tables."""
    with SqliteStore(tmp_path / "terrarium.db") as instance:
        yield instance


def _search(store: Store, text: str, **filters: Any) -> list[SearchHit]:
    assert isinstance(store, Searchable)
    return store.search(SearchQuery(text, **filters))


def _context(store: Store, context: str, *texts: str, role: str = "user") -> PodMetadata:
    """Create ``context`` and log ``texts`` as items of ``role``."""
    create_segment(store, None, context=context)
    head = store.get_head(ContextId.parse(context))
    assert head is not None
    if texts:
        save_delta(store, head, [{"role": role, "content": text} for text in texts])
    return head


def _texts(hits: list[SearchHit]) -> list[str]:
    return [hit.snippet for hit in hits]


def _where(hits: list[SearchHit]) -> set[tuple[str, int]]:
    return {(hit.context, hit.seq) for hit in hits}


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


# --------------------------------------------------------------------------- ranking


def test_database_stores_are_searchable(store: Store) -> None:
    """Every backend here answers searches itself, not through the scan fallback."""
    assert isinstance(store, Searchable)


def test_more_occurrences_rank_higher(store: Store) -> None:
    """A message with the term twice outranks one of about the same length with it once."""
    _context(store, "cli:a", "the walrus sat down on a rock", "the walrus saw a walrus there")
    _context(store, "cli:b", *[f"filler message number {i}" for i in range(20)])
    hits = _search(store, "walrus")
    assert _texts(hits) == ["the walrus saw a walrus there", "the walrus sat down on a rock"]
    assert hits[0].score > hits[1].score


def test_a_short_message_outranks_a_long_one(store: Store) -> None:
    """Length normalisation: one mention in a short message beats one in a long message."""
    long_text = "marmot " + " ".join(f"word{i}" for i in range(60))
    _context(store, "cli:a", long_text, "a marmot here")
    assert _texts(_search(store, "marmot"))[0] == "a marmot here"


def test_every_term_must_match_and_a_multi_token_term_is_a_phrase(store: Store) -> None:
    """Terms are ANDed; ``don't`` matches as the phrase don + t."""
    _context(store, "cli:a", "red green blue", "red blue", "don't panic", "don panic t")
    assert _texts(_search(store, "green red")) == ["red green blue"]
    assert _texts(_search(store, "don't")) == ["don't panic"]


def test_highlights_point_at_the_matched_words(store: Store) -> None:
    """Spans cover each matched word of the snippet (accents and case folded), no markers."""
    long_text = " ".join(["lorem ipsum dolor"] * 30 + ["Zebra crossing"] + ["sit amet"] * 30)
    _context(store, "cli:a", long_text, "A CAFÉ and a café, then Cafe again", "don't stop")
    (hit,) = _search(store, "zebra")
    assert "\ue000" not in hit.snippet and "\ue001" not in hit.snippet
    assert hit.snippet.startswith("…") and hit.snippet.endswith("…")
    assert len(hit.snippet) < len(long_text) / 2
    assert [hit.snippet[a:b] for a, b in hit.highlights] == ["Zebra"]
    (hit,) = _search(store, "cafe")
    assert hit.snippet == "A CAFÉ and a café, then Cafe again"
    assert [hit.snippet[a:b] for a, b in hit.highlights] == ["CAFÉ", "café", "Cafe"]
    (hit,) = _search(store, "DON'T")
    assert [hit.snippet[a:b] for a, b in hit.highlights] == ["don't"]


def test_a_hit_names_where_the_item_is(store: Store) -> None:
    """context, date, session, segment, seq, role and ts identify the item."""
    head = _context(store, "irc:#python", "first", "needle here")
    (hit,) = _search(store, "needle")
    read = store.read_segment(head.session_id, head.segment_id)
    line = read.entries[hit.seq - 1]
    assert (hit.context, hit.date) == ("irc:#python", head.date)
    assert (hit.session_id, hit.segment_id, hit.seq) == (head.session_id, head.segment_id, 2)
    assert (hit.role, hit.ts) == ("user", line["ts"])
    assert line["item"]["content"] == "needle here"


# --------------------------------------------------------------------------- filters


def test_filters_type_context_role_and_limit(store: Store) -> None:
    """Each filter narrows the hits; limit caps them; unknown type or context finds nothing."""
    _context(store, "cli:main", "kiwi from the cli")
    _context(store, "irc:#python", "kiwi from irc", "kiwi again")
    _context(store, "irc:#rust", "kiwi from rust", role="assistant")
    _context(store, "ir:c", "kiwi in a type that prefixes another")
    assert len(_search(store, "kiwi")) == 5
    assert {h.context for h in _search(store, "kiwi", type="irc")} == {"irc:#python", "irc:#rust"}
    assert {h.context for h in _search(store, "kiwi", type="ir")} == {"ir:c"}
    assert _where(_search(store, "kiwi", context="irc:#python")) == {
        ("irc:#python", 1),
        ("irc:#python", 2),
    }
    assert [h.context for h in _search(store, "kiwi", role="assistant")] == ["irc:#rust"]
    assert len(_search(store, "kiwi", limit=2)) == 2
    assert _search(store, "kiwi", type="game") == []
    assert _search(store, "kiwi", context="cli:nope") == []
    assert _search(store, "kiwi", role="tool") == []


def test_since_filters_by_entry_time(store: Store) -> None:
    """since keeps entries written on or after a date or a time (UTC)."""
    head = _context(store, "cli:a")
    for ts, text in [
        ("2025-01-01T10:00:00.000000Z", "plum old"),
        ("2025-06-01T10:00:00.000000Z", "plum middle"),
        ("2025-12-31T23:00:00.000000Z", "plum late"),
    ]:
        store.append(
            head.session_id, head.segment_id, [NewEntry("user_input", ts, {"item": _user(text)})]
        )
    assert set(_texts(_search(store, "plum", since="2025-06-01"))) == {"plum middle", "plum late"}
    assert _texts(_search(store, "plum", since="2025-12-31T22:30:00Z")) == ["plum late"]
    assert _search(store, "plum", since="2026-01-01T00:30:00+01:00") == []


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (SearchQuery("x", limit=0), "limit"),
        (SearchQuery("x", limit=10_000), "limit"),
        (SearchQuery("x", role="robot"), "role"),
        (SearchQuery("x", since="last tuesday"), "since"),
    ],
)
def test_invalid_filters_are_refused(store: Store, query: SearchQuery, message: str) -> None:
    """A filter that cannot be valid is an InvalidQuery naming it."""
    assert isinstance(store, Searchable)
    with pytest.raises(InvalidQuery, match=message):
        store.search(query)
    with pytest.raises(InvalidContextId):
        store.search(SearchQuery("x", context="no-colon"))


# --------------------------------------------------------------------------- freshness, deletes


def test_an_appended_entry_is_found_at_once(store: Store) -> None:
    """An acknowledged append is searchable by the next search, of any store instance."""
    head = _context(store, "cli:a", "alpha one")
    assert _texts(_search(store, "alpha")) == ["alpha one"]
    save_user_input(store, head, "alpha two")
    assert set(_texts(_search(store, "alpha"))) == {"alpha one", "alpha two"}
    save_delta(store, head, [Item.assistant("alpha three"), Item.system("alpha four")])
    hits = _search(store, "alpha")
    assert {(h.snippet, h.role) for h in hits} >= {("alpha three", "assistant")}
    assert len(hits) == 4


def test_appends_of_another_store_instance_are_found(
    tmp_path: Path, request: pytest.FixtureRequest, store: Store
) -> None:
    """A second store on the same database (another process, in effect) sees the first's
    writes at once."""
    if isinstance(store, FsStore):
        other: Store = FsStore(store.root)
    elif isinstance(store, SqliteStore):
        other = SqliteStore(store.path)
    else:
        from terrarium.stores.postgres import PostgresStore

        assert isinstance(store, PostgresStore)
        other = PostgresStore(request.getfixturevalue("pg_database"), schema=store.schema)
    try:
        head = _context(store, "cli:a", "gamma one")
        assert _texts(_search(other, "gamma")) == ["gamma one"]
        save_user_input(store, head, "gamma two")
        _context(store, "cli:b", "gamma three")
        assert len(_search(other, "gamma")) == 3
    finally:
        other.close()


def test_a_deleted_context_disappears(store: Store) -> None:
    """Deleting a context removes its items; a new context of the same name starts afresh."""
    _context(store, "cli:a", "zeta kept")
    _context(store, "cli:b", "zeta gone", "zeta gone too")
    assert len(_search(store, "zeta")) == 3
    assert store.delete_context(ContextId("cli", "b"))
    assert _texts(_search(store, "zeta")) == ["zeta kept"]
    assert _search(store, "zeta", context="cli:b") == []
    _context(store, "cli:b", "zeta reborn")
    assert set(_texts(_search(store, "zeta"))) == {"zeta kept", "zeta reborn"}


def test_history_left_by_clear_and_compaction_stays_findable(store: Store) -> None:
    """Old segments stay searchable; a header's history is found with seq 0."""
    head = _context(store, "cli:a", "eta before the clear")
    state = restore(store, "cli:a")
    new = create_compacted_segment(
        store, state, [Item.assistant("eta summary of it")], context="cli:a"
    )
    clear_segment(store, restore(store, "cli:a"), context="cli:a")
    hits = {h.snippet: h for h in _search(store, "eta")}
    assert set(hits) == {"eta before the clear", "eta summary of it"}
    assert (hits["eta summary of it"].segment_id, hits["eta summary of it"].seq) == (new, 0)
    assert hits["eta before the clear"].segment_id == head.segment_id


def test_items_without_text_are_not_hits(store: Store) -> None:
    """Tool calls without content, images and non-history entries are never hits."""
    head = _context(store, "cli:a", "theta words")
    store.append(
        head.session_id,
        head.segment_id,
        [
            NewEntry("item", TS, {"item": {"role": "assistant", "content": None}}),
            NewEntry("item", TS, {"item": {"role": "user", "content": [{"type": "image_url"}]}}),
            NewEntry("extension", TS, {"domain": "x", "data": {"content": "theta"}}),
            NewEntry("item", TS, {"item": "not a mapping"}),
            NewEntry(
                "item", TS, {"item": {"role": "user", "content": [{"type": "text", "text": "θ"}]}}
            ),
        ],
    )
    assert _texts(_search(store, "theta")) == ["theta words"]


# --------------------------------------------------------------------------- queries are data

INJECTIONS = [
    '"',
    '"quoted"',
    "*",
    "pre*",
    "NEAR(",
    "NEAR(a b)",
    "'; DROP TABLE entries; --",
    "'); DELETE FROM search_docs; --",
    "AND OR NOT",
    "a AND b",
    "x OR y",
    "-minus !bang <-> & |",
    "col:umn",
    "^start",
    "{body}: x",
    "(((",
    "a\x00b",
    "\\",
    "%_",
    "$1 %s %(t0)s ?",
]


@pytest.mark.parametrize("text", INJECTIONS)
def test_query_syntax_is_matched_as_words(store: Store, text: str) -> None:
    """FTS5, tsquery and SQL syntax in a query is data: no error, and it finds the message
    that holds its words; the store is intact afterwards."""
    _context(store, "cli:a", f"the message says {text} literally", "something else entirely")
    if not tokenize(text):
        with pytest.raises(InvalidQuery, match="nothing to search for"):
            _search(store, text)
        return
    hits = _search(store, text)
    # (FTS5's snippet() and PostgreSQL leave NUL characters out.)
    assert _texts(hits) == [f"the message says {text} literally".replace("\x00", "")]
    assert [h.seq for h in hits] == [h.seq for h in scan(store, SearchQuery(text))]
    assert restore(store, "cli:a").history[0]["content"] == f"the message says {text} literally"
    assert len(_search(store, "something")) == 1


@pytest.mark.parametrize("text", ["", "   ", '"', "*", '""', "--", "🎉", "🎉 *", "\x00", "\n"])
def test_a_query_with_nothing_to_search_for_is_a_one_line_value_error(
    store: Store, text: str
) -> None:
    """Empty queries (or only punctuation, emoji) raise InvalidQuery, a ValueError."""
    _context(store, "cli:a", "hello")
    with pytest.raises(InvalidQuery) as caught:
        _search(store, text)
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
        ("京タ", "私は東京タワーに行った"),
        ("서울", "서울에 살아요"),
        ("party 🎉", "party 🎉 time"),
        ("🎉party", "party 🎉 time"),
        ("naïve", "a naive approach"),
        ("straße", "die Straße ist lang"),
    ],
)
def test_unicode_is_folded_and_cjk_is_found_inside_words(
    store: Store, query: str, expected: str
) -> None:
    """Case and accents fold; CJK words are found in text without spaces; emoji are ignored."""
    texts = [
        "Un café à Paris",
        "L'été est chaud",
        "私は東京タワーに行った",
        "서울에 살아요",
        "party 🎉 time",
        "a naive approach",
        "die Straße ist lang",
        "unrelated",
    ]
    _context(store, "cli:a", *texts)
    hits = _search(store, query)
    assert _texts(hits) == [expected]
    for hit in hits:
        assert hit.highlights
        for a, b in hit.highlights:
            assert tokenize(hit.snippet[a:b])


def test_adjacent_matches_are_highlighted_alike_by_every_backend_and_the_scan(
    store: Store,
) -> None:
    """Two CJK words in a row, each a match, are two highlights that touch, not one, on FTS5,
    PostgreSQL and the scan fallback alike (one rule: ``terrarium.text.match_spans``)."""
    _context(store, "cli:a", "東京大阪 と 京都")
    expected = ((0, 2), (2, 4))
    [hit] = _search(store, "東京 大阪")
    assert (hit.snippet, hit.highlights) == ("東京大阪 と 京都", expected)
    [scanned] = scan(store, SearchQuery("東京 大阪"))
    assert (scanned.snippet, scanned.highlights) == ("東京大阪 と 京都", expected)


def test_odd_text_is_stored_and_found(store: Store) -> None:
    """NUL and separator characters, and the private-use marker characters, in a message."""
    head = _context(store, "cli:a", "evil \ue000fake\ue001 marker and a real word")
    store.append(
        head.session_id,
        head.segment_id,
        [
            NewEntry("item", TS, {"item": _user("nul\x00inside iota")}),
            NewEntry("item", TS, {"item": _user("unit\x1fseparator iota")}),
        ],
    )
    (hit,) = _search(store, "real")
    assert [hit.snippet[a:b] for a, b in hit.highlights] == ["real"]
    assert "\ue000" not in hit.snippet
    assert len(_search(store, "iota")) == 2
    assert len(_search(store, "separator")) == 1


# --------------------------------------------------------------------------- parity


def _build(store: Store) -> None:
    """The same history in any store: several contexts, roles, a fork, a compaction, a clear."""
    texts = [
        "The quick brown fox jumps over the lazy dog",
        "A quick reply: the fox is quick",
        "Dogs and foxes are not the same animal",
        "café society meets in the café",
        "東京タワーは東京にあります",
        "The brown bear, the brown fox and the red fox",
    ]
    _context(store, "cli:main", *texts[:3])
    head = _context(store, "irc:#python", *texts[3:])
    save_delta(store, head, [Item.assistant("the fox answered quickly"), Item.system("fox alert")])
    fork_at(store, head, 2)
    state = restore(store, "irc:#python")
    create_compacted_segment(store, state, [Item.assistant("summary: a fox story")], context=None)
    other = _context(store, "game:run-1", "no animals here", "a fox appears", role="assistant")
    clear_segment(store, restore(store, "game:run-1"), context="game:run-1")
    save_user_input(store, other, "after the clear, the fox again")
    create_segment(
        store,
        SegmentStartState(history=[Item.user("imported fox memories"), Item.assistant("ok")]),
        context="web:imported",
    )
    _context(store, "cli:gone", "a fox that is deleted")
    store.delete_context(ContextId("cli", "gone"))


PARITY_QUERIES = [
    SearchQuery("fox"),
    SearchQuery("quick fox"),
    SearchQuery("the"),
    SearchQuery("brown fox"),
    SearchQuery("fox", type="irc"),
    SearchQuery("fox", role="assistant"),
    SearchQuery("fox", context="game:run-1"),
    SearchQuery("CAFE"),
    SearchQuery("東京"),
    SearchQuery("fox", since="2000-01-01"),
    SearchQuery("memories"),
    SearchQuery("lazy dog"),
]


def test_the_same_data_gives_the_same_hits_on_every_backend(
    store: Store, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Same history, same query: the same set of (context, seq) on this backend, on FsStore
    and by the scan; on SQLite and FsStore (both FTS5 bm25) also the same scores, snippets
    and highlights."""
    _build(store)
    with FsStore(tmp_path / "reference") as reference:
        _build(reference)
        for query in PARITY_QUERIES:
            got = _search(store, query.text, **_filters(query))
            want = reference.search(query)
            assert want, f"the parity data should match {query}"
            assert _where(got) == _where(want) == _where(scan(store, query)), query
            assert [h.score for h in got] == sorted((h.score for h in got), reverse=True)
            if not isinstance(store, FsStore | SqliteStore):
                continue
            assert sorted(_full(got)) == sorted(_full(want)), query


def _filters(query: SearchQuery) -> dict[str, Any]:
    return {
        "type": query.type,
        "context": query.context,
        "since": query.since,
        "role": query.role,
        "limit": query.limit,
    }


def _full(hits: list[SearchHit]) -> list[tuple[Any, ...]]:
    return [(h.context, h.seq, round(h.score, 9), h.snippet, h.highlights) for h in hits]


def test_listing_is_sorted_like_context_ids(store: Store) -> None:
    """list_contexts orders by (type, name), as ContextId does, even where the text differs."""
    for context in ("a-b:y", "a:x", "ab:z", "a:x-1", "b:#1"):
        create_segment(store, None, context=context)
    heads = [head.context for head in store.list_contexts()]
    assert heads == [str(c) for c in sorted(ContextId.parse(h) for h in heads)]
    assert heads[0] == "a:x"


# --------------------------------------------------------------------------- SQLite


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


def test_sqlite_recent_and_full_tables_stay_consistent(
    db: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past SEARCH_RECENT items, searches use search_fts and still find every match of a rare
    word; common words give full pages; deletes leave both tables sound."""
    _small_windows(monkeypatch)
    for i in range(8):
        _context(db, f"cli:c{i}", *[f"lambda item {i} {j} w{i}x{j}" for j in range(5)])
    with db.atomic():  # a bulk import: many items in one append
        _context(db, "cli:bulk", *[f"lambda bulk {j} rare{j % 3}" for j in range(23)])
    _context(db, "cli:tail", "lambda tail one", "lambda tail two")  # under a batch: not read
    conn = sqlite3.connect(db.path)
    try:
        sql = "SELECT wm, (SELECT max(id) FROM entries) FROM search_meta"
        wm, top = conn.execute(sql).fetchone()
    finally:
        conn.close()
    assert 0 < top - wm < sqlite_backend.SEARCH_BATCH  # the derived tables lag the log
    assert _texts(db.search(SearchQuery("tail"))) == ["lambda tail two", "lambda tail one"]
    _integrity(db)
    conn = sqlite3.connect(db.path)
    try:
        wm, hw, floor = conn.execute("SELECT wm, hw, floor FROM search_meta").fetchone()
        (total,) = conn.execute("SELECT count(*) FROM search_docs").fetchone()
        (top,) = conn.execute("SELECT max(id) FROM entries").fetchone()
    finally:
        conn.close()
    assert wm == top and hw == total == 8 * 5 + 23 + 2  # the search read everything first
    assert 1 < floor <= hw + 1  # search_recent holds only the newest items
    for word in ("w0x1", "w7x4", "rare1", "bulk", "tail"):  # in one FTS5 table or both
        assert _where(db.search(SearchQuery(word, limit=50))) == _where(
            scan(db, SearchQuery(word, limit=50))
        ), word
    for text, filters in [  # few matches, a common word or a filter: ranked by the rare words
        ("w0x1 lambda", {}),
        ("rare1 lambda", {"type": "cli"}),
        ("tail lambda", {"role": "user"}),
        ("item", {"context": "cli:c3"}),
        ("rare2", {"since": "2000-01-01"}),
    ]:
        query = SearchQuery(text, limit=50, **filters)
        hits = db.search(query)
        assert hits and _where(hits) == _where(scan(db, query)), query
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    hits = db.search(SearchQuery("lambda", limit=7))
    assert len(hits) == 7 and all("lambda" in h.snippet for h in hits)
    assert len(db.search(SearchQuery("lambda", context="cli:c0", limit=20))) == 5
    assert len(db.search(SearchQuery("lambda", since="2000-01-01", limit=60))) == 60
    for context in ("cli:c0", "cli:bulk", "cli:c7"):
        assert db.delete_context(ContextId.parse(context))
        _integrity(db)
    assert len(db.search(SearchQuery("lambda", limit=100))) == 32
    _context(db, "cli:after", "lambda after the deletes")
    assert _texts(db.search(SearchQuery("after"))) == ["lambda after the deletes"]
    _integrity(db)


def _meta(store: SqliteStore) -> tuple[int, int]:
    """(what the derived tables have read up to, the newest entry id)."""
    conn = sqlite3.connect(store.path)
    try:
        row = conn.execute("SELECT wm, (SELECT max(id) FROM entries) FROM search_meta").fetchone()
    finally:
        conn.close()
    return row[0], row[1]


def test_sqlite_appends_bring_the_index_up_every_batch(
    db: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without any search, the append that makes SEARCH_BATCH entries wait reads them all."""
    monkeypatch.setattr(sqlite_backend, "SEARCH_BATCH", 4)
    head = _context(db, "cli:a")  # one entry: the header
    save_user_input(db, head, "kappa one")
    save_user_input(db, head, "kappa two")
    wm, top = _meta(db)
    assert top - wm == 3
    save_user_input(db, head, "kappa three")  # the fourth entry waiting: all are read
    assert _meta(db) == (top + 1, top + 1)
    assert len(db.search(SearchQuery("kappa"))) == 3


def test_sqlite_a_failed_catch_up_never_fails_the_append(
    db: SqliteStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The append's entry is in before its batch catch-up runs: if that fails (a busy
    database), the append still succeeds, and the next search catches up."""
    monkeypatch.setattr(sqlite_backend, "SEARCH_BATCH", 2)
    head = _context(db, "cli:a")
    real = sqlite_backend._catch_up

    def busy(conn: sqlite3.Connection, **_: Any) -> int:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(sqlite_backend, "_catch_up", busy)
    entry = save_user_input(db, head, "lambda kept")
    assert "catch-up deferred" in caplog.text
    monkeypatch.setattr(sqlite_backend, "_catch_up", real)
    assert [(h.seq, h.snippet) for h in db.search(SearchQuery("lambda"))] == [
        (entry.seq, "lambda kept")
    ]


def test_sqlite_ids_a_delete_frees_are_read_again(db: SqliteStore) -> None:
    """Deleting the newest context frees the newest entry ids; the entries that take them
    next are still searched and counted."""
    _context(db, "cli:a", "rho first")
    _context(db, "cli:b", "rho second", "rho third")
    assert len(db.search(SearchQuery("rho"))) == 3  # everything read
    before = _meta(db)
    assert db.delete_context(ContextId("cli", "b"))
    head = _context(db, "cli:c", "rho fourth", "rho fifth", "rho sixth")
    conn = sqlite3.connect(db.path)
    try:
        sql = "SELECT min(id) FROM entries WHERE session_id = ?"
        (first,) = conn.execute(sql, (str(head.session_id),)).fetchone()
    finally:
        conn.close()
    assert first <= before[1]  # the freed ids were handed out again
    assert _texts(db.search(SearchQuery("rho", limit=10))) == [
        "rho sixth",
        "rho fifth",
        "rho fourth",
        "rho first",
    ]
    counts = {s.context: s.message_count for s in db.list_contexts_fast()}
    assert counts == {"cli:a": 1, "cli:c": 3}
    _integrity(db)


def test_sqlite_reindex_rebuilds_the_derived_tables(db: SqliteStore) -> None:
    """reindex rebuilds search and listing counts from the entries alone."""
    _build(db)
    queries = [SearchQuery("fox"), SearchQuery("the", limit=50), SearchQuery("東京")]
    hits = [db.search(query) for query in queries]
    listing = db.list_contexts_fast()
    conn = sqlite3.connect(db.path, isolation_level=None)
    try:  # damage every derived table
        conn.execute("DELETE FROM search_docs WHERE id % 2 = 0")
        conn.execute("UPDATE contexts SET message_count = 99, last_active = 'x'")
    finally:
        conn.close()
    assert db.reindex() == len(listing)
    assert [db.search(query) for query in queries] == hits
    assert db.list_contexts_fast() == listing
    _integrity(db)


def test_sqlite_a_rolled_back_append_leaves_nothing_to_find(db: SqliteStore) -> None:
    """A search inside a transaction indexes its uncommitted items in that transaction: a
    rollback takes them too, and they are never found afterwards."""
    head = _context(db, "cli:a", "mu kept")

    class Boom(Exception):
        pass

    with pytest.raises(Boom), db.atomic():
        save_user_input(db, head, "mu rolled back")
        assert len(db.search(SearchQuery("mu"))) == 2  # seen inside the transaction
        raise Boom
    assert _texts(db.search(SearchQuery("mu"))) == ["mu kept"]
    _integrity(db)


def test_sqlite_migration_indexes_existing_history(tmp_path: Path) -> None:
    """A database from before search (m002) gets its history indexed on open."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        sqlite_backend.migrate(conn, where="old", stop_after="m002_traces")
        s, g = str(uuid.UUID(int=1)), str(uuid.UUID(int=2))
        conn.execute("INSERT INTO contexts VALUES ('irc:#old', 'irc', ?, ?, ?, ?)", (s, g, TS, TS))
        conn.execute("INSERT INTO sessions VALUES (?, 'irc:#old', ?)", (s, TS))
        conn.execute("INSERT INTO segments VALUES (?, ?, ?)", (s, g, TS))
        lines = [
            {
                "v": 1,
                "seq": 0,
                "ts": TS,
                "kind": "header",
                "session_id": s,
                "segment_id": g,
                "history": [_user("nu from the header")],
            },
            {"v": 1, "seq": 1, "ts": TS, "kind": "user_input", "item": _user("nu from an entry")},
            {"v": 1, "seq": 2, "ts": TS, "kind": "usage", "model": "nu"},
        ]
        for line in lines:
            conn.execute(
                "INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?)",
                (s, g, line["seq"], line["kind"], TS, codec.encode(line).decode()),
            )
    finally:
        conn.close()
    with SqliteStore(path) as store:
        hits = store.search(SearchQuery("nu", type="irc"))
        assert {(h.seq, h.snippet) for h in hits} == {
            (0, "nu from the header"),
            (1, "nu from an entry"),
        }
        head = store.get_head(ContextId("irc", "#old"))
        assert head is not None
        save_user_input(store, head, "nu appended")
        assert len(store.search(SearchQuery("nu"))) == 3
        _integrity(store)


# --------------------------------------------------------------------------- PostgreSQL


@pytest.mark.parametrize(
    "text",
    [
        "plain ascii, with punctuation!",
        "Ünïcödé ÉTÉ straße",
        "東京タワー",
        "İstanbul ﬁ ǅ",
        "a_b-c.d",
    ],
)
def test_postgres_search_words_keep_the_length_and_the_words(text: str) -> None:
    """search_words is one character for one (headlines map back by offset) and leaves only
    FsStore's words, folded."""
    pytest.importorskip("psycopg")
    from terrarium.stores.postgres import search_words
    from terrarium.text import prepare_text

    prepared = prepare_text(text)
    words = search_words(prepared)
    assert len(words) == len(prepared)
    assert all(c == " " or tokenize(c) for c in words)
    if text.isascii():
        assert words.split() == tokenize(text)


@pytest.mark.postgres
def test_postgres_migration_indexes_existing_history(pg_database: str) -> None:  # noqa: F811
    """A schema from before search (m002) gets its history indexed on open."""
    import psycopg

    from terrarium.stores import postgres

    schema = fresh_schema()
    s, g = uuid.UUID(int=1), uuid.UUID(int=2)
    header = {"v": 1, "seq": 0, "ts": TS, "kind": "header", "session_id": str(s)}
    header |= {"segment_id": str(g), "history": [_user("xi from the header")]}
    entry = {"v": 1, "seq": 1, "ts": TS, "kind": "item", "item": _user("xi from an entry")}
    with psycopg.connect(pg_database, autocommit=True) as conn:
        postgres.migrate(conn, schema, where="old", stop_after="m002_traces")
        q = f'"{schema}"'
        conn.execute(
            f"INSERT INTO {q}.contexts VALUES ('irc:#old', 'irc', %s, %s, %s, %s)", (s, g, TS, TS)
        )
        conn.execute(f"INSERT INTO {q}.sessions VALUES (%s, 'irc:#old', %s)", (s, TS))
        conn.execute(f"INSERT INTO {q}.segments VALUES (%s, %s, %s)", (s, g, TS))
        for line in (header, entry):
            text = codec.encode(line).decode()
            conn.execute(
                f"INSERT INTO {q}.entries VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s)",
                (s, g, line["seq"], line["kind"], TS, text, text),
            )
    with postgres.PostgresStore(pg_database, schema=schema) as store:
        hits = store.search(SearchQuery("xi", type="irc"))
        assert {(h.seq, h.snippet) for h in hits} == {
            (0, "xi from the header"),
            (1, "xi from an entry"),
        }
        assert json.dumps([h.context for h in hits]) == '["irc:#old", "irc:#old"]'


@pytest.mark.postgres
def test_postgres_common_words_are_ranked_among_recent_matches(
    pg_database: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past RANK_WINDOW matches, the most recent matches are ranked; pages stay full."""
    from terrarium.stores import postgres

    monkeypatch.setattr(postgres, "RANK_WINDOW", 5)
    with postgres.PostgresStore(pg_database, schema=fresh_schema()) as store:
        _context(store, "cli:old", "omicron " * 30 + "old")  # the best match, but old
        for i in range(6):
            _context(store, f"cli:c{i}", *[f"omicron item {i} {j}" for j in range(3)])
        hits = store.search(SearchQuery("omicron", limit=5))
        assert len(hits) == 5 and "cli:old" not in {h.context for h in hits}
        assert _where(store.search(SearchQuery("omicron", context="cli:old"))) == {("cli:old", 1)}


# --------------------------------------------------------------------------- listing


def test_fast_listing_agrees_with_restoring_every_context(store: Store) -> None:
    """list_contexts_fast gives each context's date, message count and last activity as a
    restore of it would, forks, compactions and clears included, without restoring any."""
    assert isinstance(store, Listing)
    _build(store)
    head = store.get_head(ContextId.parse("cli:main"))
    assert head is not None
    forked = fork_at(store, head, 2)
    moved = store.set_head(ContextId.parse("cli:main"), forked, expected=head.segment_id)
    save_user_input(store, moved, "on the fork")
    deeper = fork_at(store, moved, 1)  # a fork of a fork: two parents' prefixes
    store.set_head(ContextId.parse("cli:main"), deeper, expected=forked)
    summaries = store.list_contexts_fast()
    heads = store.list_contexts()
    assert [s.context for s in summaries] == [h.context for h in heads]
    for summary, head in zip(summaries, heads, strict=True):
        state = restore(store, head.context)
        assert summary.date == head.date
        assert (summary.created_at, summary.last_active) == (head.created_at, state.last_active)
        assert summary.message_count == len(state.history), head.context
    assert [s.context for s in store.list_contexts_fast("irc")] == ["irc:#python"]
    assert store.list_contexts_fast("nope") == []


def test_fast_listing_counts_a_branch_written_before_it_became_the_head(store: Store) -> None:
    """Entries appended to a segment before the head moves onto it are counted once, and the
    old head's later entries not at all."""
    assert isinstance(store, Listing)
    head = _context(store, "cli:a", "one", "two")
    branch = PodActiveSegmentRef(head.session_id, fork_at(store, head, 1))
    save_user_input(store, branch, "on the branch")
    save_user_input(store, branch, "still on the branch")
    store.set_head(ContextId.parse("cli:a"), branch.segment_id, expected=head.segment_id)
    save_user_input(store, head, "on the old head, after it moved")
    save_user_input(store, branch, "on the new head")
    [summary] = store.list_contexts_fast()
    state = restore(store, "cli:a")
    assert summary.message_count == len(state.history) == 4
    assert summary.last_active == state.last_active
