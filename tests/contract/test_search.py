"""Contract: search, for every backend that is ``Searchable`` (``store.search``).

Ranking, filters, freshness after writes and deletes, queries taken as data, Unicode folding
and highlights, and the same hits as FsStore and the scan fallback for the same history. What
only one backend has (FsStore's index files, SQLite's FTS5 tables, PostgreSQL's word folding)
is in that backend's own test file.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from helpers.history import (
    INVALID_FILTERS,
    NOTHING_TO_SEARCH,
    PARITY_QUERIES,
    QUERY_SYNTAX,
    UNICODE_QUERIES,
    UNICODE_TEXTS,
    add_context,
    assert_nothing_to_search,
    build_history,
    places,
    snippets,
    user_item,
)
from helpers.responses import RESPONSES_ITEMS
from terrarium import FsStore, SqliteStore, states
from terrarium.errors import InvalidContextId
from terrarium.index import listing as lister
from terrarium.index._query import Searchable, SearchHit, SearchQuery
from terrarium.model import ContextId, Item
from terrarium.search import InvalidQuery, scan
from terrarium.sessions import (
    clear_segment,
    create_compacted_segment,
    restore,
    save_delta,
    save_user_input,
)
from terrarium.stores.base import NewEntry, PodActiveSegmentRef, Store
from terrarium.text import tokenize

pytestmark = pytest.mark.ability.with_args(Searchable)

TS = "2026-01-01T00:00:00.000000Z"


def _search(store: Store, text: str, **filters: Any) -> list[SearchHit]:
    assert isinstance(lister(store), Searchable)
    return lister(store).search(SearchQuery(text, **filters))


# --------------------------------------------------------------------------- ranking


def test_database_stores_are_searchable(store: Store) -> None:
    """Every backend here answers searches itself, not through the scan fallback."""
    assert isinstance(lister(store), Searchable)


def test_more_occurrences_rank_higher(store: Store) -> None:
    """A message with the term twice outranks one of about the same length with it once."""
    add_context(store, "cli:a", "the walrus sat down on a rock", "the walrus saw a walrus there")
    add_context(store, "cli:b", *[f"filler message number {i}" for i in range(20)])
    hits = _search(store, "walrus")
    assert snippets(hits) == ["the walrus saw a walrus there", "the walrus sat down on a rock"]
    assert hits[0].score > hits[1].score


def test_a_short_message_outranks_a_long_one(store: Store) -> None:
    """Length normalisation: one mention in a short message beats one in a long message."""
    long_text = "marmot " + " ".join(f"word{i}" for i in range(60))
    add_context(store, "cli:a", long_text, "a marmot here")
    assert snippets(_search(store, "marmot"))[0] == "a marmot here"


def test_every_term_must_match_and_a_multi_token_term_is_a_phrase(store: Store) -> None:
    """Terms are ANDed; ``don't`` matches as the phrase don + t."""
    add_context(store, "cli:a", "red green blue", "red blue", "don't panic", "don panic t")
    assert snippets(_search(store, "green red")) == ["red green blue"]
    assert snippets(_search(store, "don't")) == ["don't panic"]


def test_highlights_point_at_the_matched_words(store: Store) -> None:
    """Spans cover each matched word of the snippet (accents and case folded), no markers."""
    long_text = " ".join(["lorem ipsum dolor"] * 30 + ["Zebra crossing"] + ["sit amet"] * 30)
    add_context(store, "cli:a", long_text, "A CAFÉ and a café, then Cafe again", "don't stop")
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
    head = add_context(store, "irc:#python", "first", "needle here")
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
    add_context(store, "cli:main", "kiwi from the cli")
    add_context(store, "irc:#python", "kiwi from irc", "kiwi again")
    add_context(store, "irc:#rust", "kiwi from rust", role="assistant")
    add_context(store, "ir:c", "kiwi in a type that prefixes another")
    assert len(_search(store, "kiwi")) == 5
    assert {h.context for h in _search(store, "kiwi", type="irc")} == {"irc:#python", "irc:#rust"}
    assert {h.context for h in _search(store, "kiwi", type="ir")} == {"ir:c"}
    assert places(_search(store, "kiwi", context="irc:#python")) == {
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
    assert set(snippets(_search(store, "plum", since="2025-06-01"))) == {"plum middle", "plum late"}
    assert snippets(_search(store, "plum", since="2025-12-31T22:30:00Z")) == ["plum late"]
    assert _search(store, "plum", since="2026-01-01T00:30:00+01:00") == []


@pytest.mark.parametrize(("query", "message"), INVALID_FILTERS)
def test_invalid_filters_are_refused(store: Store, query: SearchQuery, message: str) -> None:
    """A filter that cannot be valid is an InvalidQuery naming it."""
    assert isinstance(lister(store), Searchable)
    with pytest.raises(InvalidQuery, match=message):
        lister(store).search(query)
    with pytest.raises(InvalidContextId):
        lister(store).search(SearchQuery("x", context="no-colon"))


# --------------------------------------------------------------------------- freshness, deletes


def test_an_appended_entry_is_found_at_once(store: Store) -> None:
    """An acknowledged append is searchable by the next search, of any store instance."""
    head = add_context(store, "cli:a", "alpha one")
    assert snippets(_search(store, "alpha")) == ["alpha one"]
    save_user_input(store, head, "alpha two")
    assert set(snippets(_search(store, "alpha"))) == {"alpha one", "alpha two"}
    save_delta(store, head, [Item.assistant("alpha three"), Item.system("alpha four")])
    hits = _search(store, "alpha")
    assert {(h.snippet, h.role) for h in hits} >= {("alpha three", "assistant")}
    assert len(hits) == 4


def test_appends_of_another_store_instance_are_found(store: Store, other: Store) -> None:
    """A second store on the same database (another process, in effect) sees the first's
    writes at once."""
    head = add_context(store, "cli:a", "gamma one")
    assert snippets(_search(other, "gamma")) == ["gamma one"]
    save_user_input(store, head, "gamma two")
    add_context(store, "cli:b", "gamma three")
    assert len(_search(other, "gamma")) == 3
    save_user_input(store, head, "gamma four")
    save_user_input(store, head, "gamma five")  # two in a row: FsStore marks neither (MARK_EVERY)
    assert len(_search(other, "gamma")) == 5


def test_a_deleted_context_disappears(store: Store) -> None:
    """Deleting a context removes its items; a new context of the same name starts afresh."""
    add_context(store, "cli:a", "zeta kept")
    add_context(store, "cli:b", "zeta gone", "zeta gone too")
    assert len(_search(store, "zeta")) == 3
    assert states.delete_context(store, ContextId("cli", "b"))
    assert snippets(_search(store, "zeta")) == ["zeta kept"]
    assert _search(store, "zeta", context="cli:b") == []
    add_context(store, "cli:b", "zeta reborn")
    assert set(snippets(_search(store, "zeta"))) == {"zeta kept", "zeta reborn"}


def test_history_left_by_clear_and_compaction_stays_findable(store: Store) -> None:
    """Old segments stay searchable; a header's history is found with seq 0."""
    head = add_context(store, "cli:a", "eta before the clear")
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
    head = add_context(store, "cli:a", "theta words")
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
    assert snippets(_search(store, "theta")) == ["theta words"]


# --------------------------------------------------------------------------- queries are data


@pytest.mark.parametrize("text", QUERY_SYNTAX)
def test_query_syntax_is_matched_as_words(store: Store, text: str) -> None:
    """FTS5, tsquery and SQL syntax in a query is data: no error, and it finds the message
    that holds its words; the store is intact afterwards."""
    add_context(store, "cli:a", f"the message says {text} literally", "something else entirely")
    if not tokenize(text):
        with pytest.raises(InvalidQuery, match="nothing to search for"):
            _search(store, text)
        return
    hits = _search(store, text)
    # (FTS5's snippet() and PostgreSQL leave NUL characters out.)
    assert snippets(hits) == [f"the message says {text} literally".replace("\x00", "")]
    assert [h.seq for h in hits] == [h.seq for h in scan(store, SearchQuery(text))]
    assert restore(store, "cli:a").history[0]["content"] == f"the message says {text} literally"
    assert len(_search(store, "something")) == 1


@pytest.mark.parametrize("text", NOTHING_TO_SEARCH)
def test_a_query_with_nothing_to_search_for_is_a_one_line_value_error(
    store: Store, text: str
) -> None:
    """Empty queries (or only punctuation, emoji) raise InvalidQuery, a ValueError."""
    add_context(store, "cli:a", "hello")
    assert_nothing_to_search(lambda: _search(store, text))


@pytest.mark.parametrize(("query", "expected"), UNICODE_QUERIES)
def test_unicode_is_folded_and_cjk_is_found_inside_words(
    store: Store, query: str, expected: str
) -> None:
    """Case and accents fold; CJK words are found in text without spaces; emoji are ignored."""
    add_context(store, "cli:a", *UNICODE_TEXTS)
    hits = _search(store, query)
    assert snippets(hits) == [expected]
    for hit in hits:
        assert hit.highlights
        for a, b in hit.highlights:
            assert tokenize(hit.snippet[a:b])


def test_adjacent_matches_are_highlighted_alike_by_every_backend_and_the_scan(
    store: Store,
) -> None:
    """Two CJK words in a row, each a match, are two highlights that touch, not one, on FTS5,
    PostgreSQL and the scan fallback alike (one rule: ``terrarium.text.match_spans``)."""
    add_context(store, "cli:a", "東京大阪 と 京都")
    expected = ((0, 2), (2, 4))
    [hit] = _search(store, "東京 大阪")
    assert (hit.snippet, hit.highlights) == ("東京大阪 と 京都", expected)
    [scanned] = scan(store, SearchQuery("東京 大阪"))
    assert (scanned.snippet, scanned.highlights) == ("東京大阪 と 京都", expected)


def test_a_long_message_full_of_matches_gets_a_short_highlighted_snippet(store: Store) -> None:
    """A message longer than FTS5's ``snippet()`` handles quickly (``fts.LONG_BODY``) that
    holds the word thousands of times: one hit, a window at its start, each highlight on the
    word, as the scan fallback cuts it."""
    body = "intro words " + "alert " * 5000 + "the end"
    add_context(store, "cli:big", body)
    [hit] = _search(store, "alert")
    assert len(hit.snippet) < 400 and hit.snippet.startswith("intro words alert")
    assert len(hit.highlights) > 10
    assert all(hit.snippet[a:b] == "alert" for a, b in hit.highlights)
    [scanned] = scan(store, SearchQuery("alert"))
    if type(store).__name__ != "PostgresStore":  # ts_headline picks its own window
        assert (hit.snippet, hit.highlights) == (scanned.snippet, scanned.highlights)


def test_odd_text_is_stored_and_found(store: Store) -> None:
    """NUL and separator characters, and the private-use marker characters, in a message."""
    head = add_context(store, "cli:a", "evil \ue000fake\ue001 marker and a real word")
    store.append(
        head.session_id,
        head.segment_id,
        [
            NewEntry("item", TS, {"item": user_item("nul\x00inside iota")}),
            NewEntry("item", TS, {"item": user_item("unit\x1fseparator iota")}),
        ],
    )
    (hit,) = _search(store, "real")
    assert [hit.snippet[a:b] for a, b in hit.highlights] == ["real"]
    assert "\ue000" not in hit.snippet
    assert len(_search(store, "iota")) == 2
    assert len(_search(store, "separator")) == 1


# --------------------------------------------------------------------------- parity


def test_the_same_data_gives_the_same_hits_on_every_backend(
    store: Store, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Same history, same query: the same set of (context, seq) on this backend, on FsStore
    and by the scan; on SQLite and FsStore (both FTS5 bm25) also the same scores, snippets
    and highlights."""
    build_history(store)
    with FsStore(tmp_path / "reference") as reference:
        build_history(reference)
        for query in PARITY_QUERIES:
            got = _search(store, query.text, **_filters(query))
            want = lister(reference).search(query)
            assert want, f"the parity data should match {query}"
            assert places(got) == places(want) == places(scan(store, query)), query
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


# --------------------------------------------------------------------------- Responses items


@pytest.mark.parametrize(
    ("word", "role"),
    [
        ("zebrafish", "user"),  # input_text
        ("axolotl", "assistant"),  # output_text
        ("platypus", "assistant"),  # refusal
        ("quokkas", "assistant"),  # reasoning summary
        ("narwhals", "tool"),  # function_call_output
    ],
)
def test_search_finds_responses_text(
    store: Store, main: PodActiveSegmentRef, word: str, role: str
) -> None:
    """The text parts of Responses items are searchable, with the role they play."""
    save_delta(store, main, copy.deepcopy(RESPONSES_ITEMS))
    hits = lister(store).search(SearchQuery(word))
    assert [(hit.context, hit.role) for hit in hits] == [("cli:main", role)]
    assert word in hits[0].snippet.replace("\ue000", "").replace("\ue001", "")
