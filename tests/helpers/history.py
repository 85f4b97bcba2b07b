"""Writing and reading back search test data the same way in any store."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from terrarium import states
from terrarium.errors import InvalidQuery
from terrarium.index._query import SearchHit, SearchQuery
from terrarium.model import ContextId, Item, SegmentStartState
from terrarium.sessions import (
    clear_segment,
    create_compacted_segment,
    create_segment,
    fork_at,
    restore,
    save_delta,
    save_user_input,
)
from terrarium.stores.base import PodMetadata, Store


def add_context(store: Store, context: str, *texts: str, role: str = "user") -> PodMetadata:
    """Create ``context`` and log ``texts`` as items of ``role``."""
    create_segment(store, None, context=context)
    head = store.get_head(ContextId.parse(context))
    assert head is not None
    if texts:
        save_delta(store, head, [{"role": role, "content": text} for text in texts])
    return head


def snippets(hits: list[SearchHit]) -> list[str]:
    """Each hit's snippet, in order."""
    return [hit.snippet for hit in hits]


def places(hits: list[SearchHit]) -> set[tuple[str, int]]:
    """Where the hits are: the set of (context, seq)."""
    return {(hit.context, hit.seq) for hit in hits}


def user_item(text: str) -> dict[str, Any]:
    """A user message item."""
    return {"role": "user", "content": text}


def build_history(store: Store) -> None:
    """The same history in any store: several contexts, roles, a fork, a compaction, a clear,
    and a deleted context."""
    texts = [
        "The quick brown fox jumps over the lazy dog",
        "A quick reply: the fox is quick",
        "Dogs and foxes are not the same animal",
        "café society meets in the café",
        "東京タワーは東京にあります",
        "The brown bear, the brown fox and the red fox",
    ]
    add_context(store, "cli:main", *texts[:3])
    head = add_context(store, "irc:#python", *texts[3:])
    save_delta(store, head, [Item.assistant("the fox answered quickly"), Item.system("fox alert")])
    fork_at(store, head, 2)
    state = restore(store, "irc:#python")
    create_compacted_segment(store, state, [Item.assistant("summary: a fox story")], context=None)
    other = add_context(store, "game:run-1", "no animals here", "a fox appears", role="assistant")
    clear_segment(store, restore(store, "game:run-1"), context="game:run-1")
    save_user_input(store, other, "after the clear, the fox again")
    create_segment(
        store,
        SegmentStartState(history=[Item.user("imported fox memories"), Item.assistant("ok")]),
        context="web:imported",
    )
    add_context(store, "cli:gone", "a fox that is deleted")
    states.delete_context(store, ContextId("cli", "gone"))


# ---- queries shared by the search and scan contracts (tests/contract/) ------------------------

#: Query syntax of FTS5, tsquery and SQL, each to be matched as the words it holds.
QUERY_SYNTAX = [
    '"',
    '"quoted"',
    "*",
    "pre*",
    "NEAR(",
    "NEAR(a b)",
    "'; DROP TABLE entries; --",
    "'; DROP TABLE docs; --",
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

#: Queries without a letter or digit: each is an InvalidQuery, "nothing to search for".
NOTHING_TO_SEARCH = ["", "   ", '"', "*", '""', "--", "🎉", "🎉 *", "\x00", "\n"]


def assert_nothing_to_search(run: Callable[[], object]) -> None:
    """``run()`` raises a one-line InvalidQuery, a ValueError: nothing to search for."""
    with pytest.raises(InvalidQuery) as caught:
        run()
    assert isinstance(caught.value, ValueError)
    assert "\n" not in str(caught.value) and "nothing to search for" in str(caught.value)


#: Filters that cannot be valid, each with a word of the InvalidQuery's message.
INVALID_FILTERS = [
    (SearchQuery("x", limit=0), "limit"),
    (SearchQuery("x", limit=10_000), "limit"),
    (SearchQuery("x", role="robot"), "role"),
    (SearchQuery("x", since="last tuesday"), "since"),
]

#: Messages in several scripts, for :data:`UNICODE_QUERIES`.
UNICODE_TEXTS = [
    "Un café à Paris",
    "L'été est chaud",
    "私は東京タワーに行った",
    "서울에 살아요",
    "party 🎉 time",
    "a naive approach",
    "die Straße ist lang",
    "unrelated",
]

#: (query, the one message of :data:`UNICODE_TEXTS` it finds): case and accents fold, CJK words
#: are found inside text without spaces, emoji are ignored.
UNICODE_QUERIES = [
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
]

#: Queries that each match some of :func:`build_history`.
PARITY_QUERIES = [
    SearchQuery("fox"),
    SearchQuery("quick fox"),
    SearchQuery("the"),
    SearchQuery("brown fox"),
    SearchQuery("brown fox", limit=2),
    SearchQuery("fox", type="irc"),
    SearchQuery("fox", role="assistant"),
    SearchQuery("fox", context="game:run-1"),
    SearchQuery("CAFE"),
    SearchQuery("東京"),
    SearchQuery("fox", since="2000-01-01"),
    SearchQuery("memories"),
    SearchQuery("lazy dog"),
]
