"""The listing's records (:class:`ContextSummary`, :class:`ListingQuery`, the :class:`Listing`
protocol) and the statement of a page that the derived index runs.

A page is keyset pagination over the sort column and the context id, largest first:
``WHERE (col, context) < (:value, :context) ORDER BY col DESC, context DESC LIMIT :n``. An
index on ``(col, context)`` per sort (``sessions_by_*``) makes a page read about ``n`` index
entries wherever it starts; the other filters are checked on the rows that walk visits.
``tests/contract/test_paged_listing.py`` holds every backend to the same pages.
"""

from __future__ import annotations

import uuid
from collections.abc import Container, Sequence
from typing import Any, Protocol, runtime_checkable

import msgspec

from terrarium.errors import InvalidQuery
from terrarium.model import ContextId, SegmentId, SessionId, display_name


class ContextSummary(msgspec.Struct, frozen=True, gc=False):
    """One row of the sessions listing (``list``, the picker, the dashboard, ``/api/contexts``):
    a context in the log, an archived one, or a legacy file beside the store (``state``). It is
    read from the index, the archive's records or the file's metadata: no session is restored.

    ``gc=False``: it holds only strings and numbers, and tracking 100k of them would set off
    the cyclic collector's passes over the whole heap.
    """

    context: str
    """The context id, ``type:name``, as the store holds it (parsed: :attr:`id`)."""
    date: str
    """The creation date, ``YYYY-MM-DD``."""
    message_count: int
    """History items in the head segment's restored state."""
    last_active: str
    """Timestamp of the head segment's last entry."""
    created_at: str
    updated_at: str
    """When the head last moved (an archived or legacy row: :attr:`last_active`)."""
    session: str = ""
    """The session id, as text (see :attr:`session_id`); empty for an archived or legacy row."""
    head: str = ""
    """The head segment id, as text (see :attr:`segment_id`); empty where ``session`` is."""
    problem: str | None = None
    """Why some of its data cannot be read (one line naming the file); counts cover the rest."""
    tokens: int | None = None
    """Prompt plus completion tokens of its conversation, or None where the listing has none."""
    state: str = "hot"
    """``hot``, ``archived`` or ``legacy`` (a seed-format file beside the store)."""
    legacy_path: str | None = None
    """The legacy file, for a context that is not in the log yet."""

    @property
    def type(self) -> str:
        """Its type (``cli``)."""
        return self.context.partition(":")[0]

    @property
    def name(self) -> str:
        """The context's name within its type."""
        return self.context.partition(":")[2]

    @property
    def id(self) -> ContextId:
        """The context id, parsed."""
        return ContextId(self.type, self.name)

    @property
    def display(self) -> str:
        """The id for a terminal, misleading characters escaped."""
        return f"{self.type}:{display_name(self.name)}"

    @property
    def session_id(self) -> SessionId:
        """The session id."""
        return uuid.UUID(self.session)

    @property
    def segment_id(self) -> SegmentId:
        """The head segment id."""
        return uuid.UUID(self.head)

    def to_json(self, pins: Container[str] | None = None) -> dict[str, Any]:
        """The stable JSON form (``list --json``, ``/api/contexts``; docs/cli.md); given the
        pinned ids ``pins``, with its ``state`` (``hot`` for a legacy file) and ``pinned``."""
        data: dict[str, Any] = {
            "context_id": self.context,
            "type": self.type,
            "name": self.name,
            "date": self.date,
            "created_at": self.created_at,
            "last_active": self.last_active,
            "message_count": self.message_count,
            "legacy": self.legacy_path is not None,
            "legacy_path": self.legacy_path,
            "problem": self.problem,
        }
        if pins is not None:
            data["state"] = "archived" if self.state == "archived" else "hot"
            data["pinned"] = self.context in pins
        return data


@runtime_checkable
class Listing(Protocol):
    """Lists contexts with their counts without restoring them, whole or a page at a time."""

    def list_contexts_fast(self, type: str | None = None) -> Sequence[ContextSummary]:
        """Every context's summary by id; IndexUnavailable if the index cannot be updated."""


LISTING_SORTS = ("last_active", "created", "messages")
"""The orders a :class:`Listing` pages in, each largest first, ties broken by context id
(also largest first): by the last entry's timestamp, the creation time, the message count."""


class ListingQuery(msgspec.Struct, frozen=True):
    """One page of a listing: which contexts, in which order, and after which row."""

    sort: str = "last_active"
    """One of :data:`LISTING_SORTS`."""
    after: tuple[str | int, str] | None = None
    """The sort key (value, context id) of the previous page's last row; None: the first."""
    limit: int = 50
    """Rows at most."""
    type: str | None = None
    """Only contexts of this type."""
    text: str | None = None
    """Only contexts whose id contains this, ignoring case."""
    since: str | None = None
    """Only contexts last active on or after this day (``YYYY-MM-DD``)."""
    until: str | None = None
    """Only contexts last active on or before this day (``YYYY-MM-DD``)."""
    contexts: tuple[str, ...] | None = None
    """Only these contexts (ids): the rows of contexts picked by another order."""


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
    for condition, value in (
        ("type = ?", query.type),
        ("instr(casefold(context), ?) > 0", query.text.casefold() if query.text else None),
        ("substr(last_active, 1, 10) >= ?", query.since),
        ("substr(last_active, 1, 10) <= ?", query.until),
    ):
        if value is not None:
            conditions.append(condition)
            params.append(value)
    if query.after is not None:
        conditions.append(f"({column}, context) < (?, ?)")
        params.extend(query.after)
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    statement = f"{select}{where} ORDER BY {column} DESC, context DESC LIMIT ?"
    return statement, [*params, query.limit]
