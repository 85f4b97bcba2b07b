"""Contract: the scan fallback (``terrarium.search.scan``), for every backend, memory included.

The scan reads every segment of every context, so it works on any store; ``search`` answers
with it where a store has no index of its own (``MemoryStore``). It refuses the queries the
indexes refuse, folds Unicode as they do, and ranks by FTS5's bm25 as FsStore's index does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from helpers.history import (
    INVALID_FILTERS,
    NOTHING_TO_SEARCH,
    PARITY_QUERIES,
    UNICODE_QUERIES,
    UNICODE_TEXTS,
    add_context,
    assert_nothing_to_search,
    build_history,
    snippets,
)
from terrarium import FsStore, SqliteStore
from terrarium.index import listing as lister
from terrarium.index._query import Searchable, SearchHit, SearchQuery
from terrarium.search import InvalidQuery, scan, search
from terrarium.stores.base import Store


def test_search_gives_the_hits_of_the_store_index_placed(store: Store) -> None:
    """Every backend has an index (the derived one): ``search`` asks it,
    then places the hits and keeps each message once, so its hits are the index's, in the
    index's order."""
    assert isinstance(lister(store), Searchable)
    build_history(store)
    for query in PARITY_QUERIES:
        wide = msgspec.structs.replace(query, limit=100)
        own = lister(store).search(wide)
        found = search(store, msgspec.structs.replace(wide, all_branches=True))
        unplaced = [msgspec.structs.replace(hit, message=None, branch="head") for hit in found]
        assert unplaced == [hit for hit in own if hit in unplaced], query
        assert bool(found) == bool(own), query


@pytest.mark.parametrize(("query", "message"), INVALID_FILTERS)
def test_the_scan_refuses_invalid_filters(store: Store, query: SearchQuery, message: str) -> None:
    """A filter that cannot be valid is an InvalidQuery naming it, from the scan too."""
    with pytest.raises(InvalidQuery, match=message):
        scan(store, query)


@pytest.mark.parametrize("text", NOTHING_TO_SEARCH)
def test_the_scan_refuses_a_query_with_nothing_to_search_for(store: Store, text: str) -> None:
    """Empty queries (or only punctuation, emoji) are a one-line InvalidQuery, a ValueError,
    from the scan and from ``search`` on every store."""
    add_context(store, "cli:a", "hello")
    assert_nothing_to_search(lambda: scan(store, SearchQuery(text)))
    assert_nothing_to_search(lambda: search(store, SearchQuery(text)))


@pytest.mark.parametrize(("query", "expected"), UNICODE_QUERIES)
def test_the_scan_folds_unicode_and_finds_cjk_inside_words(
    store: Store, query: str, expected: str
) -> None:
    """The scan folds case and accents, finds CJK words in text without spaces and ignores
    emoji, as the indexes do."""
    add_context(store, "cli:a", *UNICODE_TEXTS)
    assert snippets(scan(store, SearchQuery(query))) == [expected]


@pytest.mark.parametrize("query", PARITY_QUERIES, ids=lambda q: repr(q.text))
def test_the_scan_ranks_as_the_fs_index_does(
    store: Store, tmp_path: Path, query: SearchQuery
) -> None:
    """Same history, same query: the scan of any store finds the hits FsStore's FTS5 index
    finds, with the same roles and bm25 scores, best first; on a store with an FTS5 index
    (FsStore, SqliteStore) the same hits as that index, to the timestamp."""
    build_history(store)
    scanned = scan(store, query)
    with FsStore(tmp_path / "reference") as reference:
        build_history(reference)
        indexed = lister(reference).search(query)
    assert indexed, "the parity data should match every query"
    assert _key(scanned) == _key(indexed)
    assert [h.score for h in indexed] == sorted((h.score for h in indexed), reverse=True)
    if isinstance(store, FsStore | SqliteStore):
        assert _key(scanned, ts=True) == _key(lister(store).search(query), ts=True)


def _key(hits: list[SearchHit], *, ts: bool = False) -> list[tuple[Any, ...]]:
    return sorted(
        (h.context, h.seq, h.role, round(h.score, 9)) + ((h.ts,) if ts else ()) for h in hits
    )
