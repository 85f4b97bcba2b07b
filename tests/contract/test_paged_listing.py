"""Contract: pages of the listing, on every backend.

The derived index's ``Reader.page`` (the dashboard's sessions list) answers one page, filtered
and sorted; walking every page by its last row's key must give exactly what ``_page_of`` picks
from the whole ``list_contexts_fast`` listing, for every order and filter.
"""

from __future__ import annotations

import heapq
import itertools
import operator
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from msgspec import structs

from terrarium import contexts, states
from terrarium.errors import InvalidQuery
from terrarium.index import _listing
from terrarium.index import listing as lister
from terrarium.index._listing import LISTING_SORTS, ContextSummary, ListingQuery
from terrarium.model import ContextId
from terrarium.sessions import create_segment
from terrarium.stores.base import NewEntry, Store

#: (context, messages, day of its last message): ties in every order, several types, names
#: that differ only in case or by a character outside ASCII.
CONTEXTS = [
    ("cli:main", 3, "2026-11-01"),
    ("cli:Main2", 3, "2026-11-01"),
    ("cli:zeta", 0, ""),
    ("irc:#python", 5, "2026-11-03"),
    ("irc:#Über", 1, "2026-11-02"),
    ("irc:#über-alles", 2, "2026-11-02"),
    ("game:pokemon_run1", 5, "2026-11-03"),
    ("game:chess", 1, "2026-10-30"),
    ("web:session_abc", 2, "2026-11-01"),
    ("web:SESSION_abd", 4, "2026-11-04"),
]


def _fill(store: Store) -> None:
    for number, (context, messages, day) in enumerate(CONTEXTS):
        create_segment(store, None, context=context)
        head = store.get_head(ContextId.parse(context))
        assert head is not None
        entries = [
            NewEntry(
                "user_input",
                f"{day}T10:{number:02d}:{i:02d}.000000Z",
                {"item": {"role": "user", "content": f"{context} {i}"}},
            )
            for i in range(messages)
        ]
        if entries:
            store.append(head.session_id, head.segment_id, entries)


def _sort_key(query: ListingQuery) -> Callable[[ContextSummary], tuple[Any, str]]:
    """The key rows are ordered by (largest first): the sort's field, then the context id."""
    return operator.attrgetter(_listing.COLUMNS[query.sort], "context")


def _matches(query: ListingQuery, row: ContextSummary) -> bool:
    """The filters' rule: the contexts named, the type, the text in the id ignoring case, and
    the days of last activity, inclusive."""
    day = row.last_active[:10]
    return (
        (query.contexts is None or row.context in query.contexts)
        and (query.type is None or row.context.startswith(query.type + ":"))
        and (not query.text or query.text.casefold() in row.context.casefold())
        and (query.since is None or day >= query.since)
        and (query.until is None or day <= query.until)
    )


def _page_of(rows: Iterable[ContextSummary], query: ListingQuery) -> list[ContextSummary]:
    """The reference: the page ``query`` names, picked from a whole listing ``rows``."""
    _listing.check(query)
    key, after = _sort_key(query), query.after
    picked = (row for row in rows if _matches(query, row) and (after is None or key(row) < after))
    return heapq.nlargest(query.limit, picked, key=key)


def _page(store: Store, query: ListingQuery) -> list[ContextSummary]:
    """One page of the hot contexts, as the dashboard reads it."""
    return contexts.listing_index(store).read(lambda reader: reader.page(query))


def _types(store: Store) -> list[str]:
    return contexts.listing_index(store).read(lambda reader: reader.types())


def _walk(store: Store, query: ListingQuery) -> list[list[ContextSummary]]:
    """Every page of ``query`` (of ``query.limit`` rows), each after the last one's key."""
    pages = []
    key = _sort_key(query)
    while True:
        page = _page(store, query)
        assert len(page) <= query.limit
        if not page:
            return pages
        pages.append(page)
        query = ListingQuery(**{**_fields(query), "after": key(page[-1])})


def _fields(query: ListingQuery) -> dict[str, object]:
    return {name: getattr(query, name) for name in ListingQuery.__slots__}


FILTERS = [
    {},
    {"type": "irc"},
    {"type": "nope"},
    {"text": "main"},
    {"text": "ÜBER"},
    {"text": "session_ab"},
    {"since": "2026-11-02"},
    {"until": "2026-11-01"},
    {"since": "2026-11-01", "until": "2026-11-02", "type": "web"},
    {"contexts": ("cli:main", "irc:#Über", "web:SESSION_abd", "nope")},
    {"contexts": ("cli:main", "irc:#Über"), "type": "irc"},
    {"contexts": ()},
]


@pytest.mark.parametrize("limit", [1, 3, 50])
def test_pages_walk_the_listing_in_each_order_and_filter(store: Store, limit: int) -> None:
    """For every order and filter, the pages, each after the previous one's last key, are the
    whole listing filtered and sorted (largest first, ties by context id), split in pages of
    ``limit``: no row twice, none left out."""
    _fill(store)
    everything = lister(store).list_contexts_fast()
    assert len(everything) == len(CONTEXTS)
    for sort, filters in itertools.product(LISTING_SORTS, FILTERS):
        query = ListingQuery(sort=sort, limit=limit, **filters)  # type: ignore[arg-type]
        expected = _page_of(everything, ListingQuery(**{**_fields(query), "limit": 99}))
        pages = _walk(store, query)
        # A page also carries each context's tokens, which the whole listing leaves out.
        walked = [structs.replace(row, tokens=None) for page in pages for row in page]
        assert walked == expected, (sort, filters)
        assert all(len(page) == limit for page in pages[:-1])


def test_the_filters_pick_what_they_say(store: Store) -> None:
    """The reference page itself: type, text in the id ignoring case (ASCII or not), and the
    days of last activity, inclusive."""
    _fill(store)

    def ids(**filters: object) -> list[str]:
        query = ListingQuery(**{"limit": 99, **filters})  # type: ignore[arg-type]
        return [row.context for row in _page(store, query)]

    assert ids(type="irc") == ["irc:#python", "irc:#über-alles", "irc:#Über"]
    assert ids(text="ÜBER") == ["irc:#über-alles", "irc:#Über"]
    assert ids(text="session_ab") == ["web:SESSION_abd", "web:session_abc"]
    assert ids(since="2026-11-03", until="2026-11-04") == [
        "web:SESSION_abd",
        "game:pokemon_run1",
        "irc:#python",
    ]
    assert ids(until="2026-10-30") == ["game:chess"]
    assert ids(type="cli", sort="messages") == ["cli:main", "cli:Main2", "cli:zeta"]
    by_messages = _page(store, ListingQuery(sort="messages", limit=3))
    assert [(r.message_count, r.context) for r in by_messages] == [
        (5, "irc:#python"),
        (5, "game:pokemon_run1"),
        (4, "web:SESSION_abd"),
    ]


def test_a_page_follows_writes(store: Store) -> None:
    """A page reflects writes made since the last one: a new message moves its context to
    the front of the last-active order, a deleted context leaves."""
    _fill(store)
    head = store.get_head(ContextId.parse("game:chess"))
    assert head is not None
    store.append(
        head.session_id,
        head.segment_id,
        [
            NewEntry(
                "user_input",
                "2099-01-01T00:00:00.000000Z",
                {"item": {"role": "user", "content": "e4"}},
            )
        ],
    )
    assert states.delete_context(store, ContextId.parse("irc:#python"))
    first = _page(store, ListingQuery(limit=2))
    assert [(r.context, r.message_count) for r in first] == [
        ("game:chess", 2),
        ("cli:zeta", 0),  # last active when it was created: today
    ]
    assert "irc:#python" not in {r.context for r in _page(store, ListingQuery(limit=99))}


def test_context_types_lists_each_type_once(store: Store) -> None:
    """The types name every type that has a context, sorted, and follows deletes."""
    assert _types(store) == []
    _fill(store)
    assert _types(store) == ["cli", "game", "irc", "web"]
    assert states.delete_context(store, ContextId.parse("game:chess"))
    assert states.delete_context(store, ContextId.parse("game:pokemon_run1"))
    assert _types(store) == ["cli", "irc", "web"]


@pytest.mark.parametrize(
    ("query", "word"),
    [
        (ListingQuery(sort="size"), "sort"),
        (ListingQuery(limit=0), "limit"),
        (ListingQuery(sort="messages", after=("2026-11-01", "cli:main")), "cursor"),
        (ListingQuery(sort="last_active", after=(3, "cli:main")), "cursor"),
        (ListingQuery(since="yesterday"), "YYYY-MM-DD"),
    ],
)
def test_a_query_that_cannot_run_is_refused_in_one_line(
    store: Store, query: ListingQuery, word: str
) -> None:
    """A bad sort, limit, cursor or day is an InvalidQuery naming it, in one line."""
    with pytest.raises(InvalidQuery, match=word) as caught:
        _page(store, query)
    assert "\n" not in str(caught.value)
