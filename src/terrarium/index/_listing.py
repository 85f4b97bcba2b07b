"""Pages of a listing (:class:`~terrarium.stores.base.Listing`): the statement the derived
index (:mod:`terrarium.index`, SQLite) runs.

A page is keyset pagination over the sort column and the context id, largest first:
``WHERE (col, context) < (:value, :context) ORDER BY col DESC, context DESC LIMIT :n``. The
index keeps an index on ``(col, context)`` for each sort (``sessions_by_*``), so a page reads
about ``n`` index entries wherever it starts. Filters that no index serves (text in the id,
the days) are checked on the rows the index walk visits.

The contract tests hold every backend to the same page picked from a whole listing
(``tests/contract/test_paged_listing.py``).
"""

from __future__ import annotations

from typing import Any

from terrarium.errors import InvalidQuery
from terrarium.stores.base import LISTING_SORTS, ListingQuery

COLUMNS = {
    "last_active": "last_active",
    "created": "created_at",
    "messages": "message_count",
    "tokens": "tokens",
}
"""The column (and :class:`ContextSummary` field) each sort reads: those of
:data:`LISTING_SORTS`, and ``tokens`` where the listing keeps them (the derived index)."""

COUNTED = ("message_count", "tokens")
"""The columns that hold counts (the others timestamps)."""

MAX_LIMIT = 10_000
"""Rows one page may ask for."""


def check(query: ListingQuery, sorts: tuple[str, ...] = LISTING_SORTS) -> ListingQuery:
    """``query`` if it can be run (its sort one of ``sorts``).

    Raises:
        InvalidQuery: an unknown sort, a limit out of range, a cursor whose value is not of
            the sort's kind (a count for ``messages``, a timestamp otherwise), or a bad day.
    """
    if query.sort not in sorts:
        raise InvalidQuery(f"sort must be one of {', '.join(sorts)}, not {query.sort!r}")
    if not 1 <= query.limit <= MAX_LIMIT:
        raise InvalidQuery(f"limit must be between 1 and {MAX_LIMIT}, not {query.limit}")
    if query.after is not None:
        value, context = query.after
        want: type = int if COLUMNS[query.sort] in COUNTED else str
        if type(value) is not want or not isinstance(context, str):
            raise InvalidQuery(f"the cursor does not belong to the {query.sort} order")
    if query.contexts is not None and len(query.contexts) > MAX_LIMIT:
        raise InvalidQuery(f"at most {MAX_LIMIT} contexts may be named, not {len(query.contexts)}")
    for day in (query.since, query.until):
        if day is not None and not (len(day) == 10 and day[4] == day[7] == "-"):
            raise InvalidQuery(f"a day must be YYYY-MM-DD, not {day[:40]!r}")
    return query


def page_statement(
    select: str, query: ListingQuery, sorts: tuple[str, ...] = LISTING_SORTS
) -> tuple[str, list[Any]]:
    """``select`` (``SELECT ... FROM table``, the listing's columns) completed into the page
    ``query`` names (its sort one of ``sorts``), and its parameters. The text filter folds
    case as Python does: ``casefold`` is registered on every connection
    (:func:`terrarium.stores._db.connect`)."""
    check(query, sorts)
    column = COLUMNS[query.sort]
    conditions: list[str] = []
    params: list[Any] = []
    if query.contexts is not None:
        conditions.append(f"context IN ({', '.join('?' * len(query.contexts))})")
        params.extend(query.contexts)
    if query.type is not None:
        conditions.append("type = ?")
        params.append(query.type)
    if query.text:
        conditions.append("instr(casefold(context), ?) > 0")
        params.append(query.text.casefold())
    if query.since is not None:
        conditions.append("substr(last_active, 1, 10) >= ?")
        params.append(query.since)
    if query.until is not None:
        conditions.append("substr(last_active, 1, 10) <= ?")
        params.append(query.until)
    if query.after is not None:
        conditions.append(f"({column}, context) < (?, ?)")
        params.extend(query.after)
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    statement = f"{select}{where} ORDER BY {column} DESC, context DESC LIMIT ?"
    return statement, [*params, query.limit]
