"""Search's query and hits (:class:`SearchQuery`, :class:`SearchHit`), and the query's check,
shared by the derived index's search (:mod:`terrarium.index`) and the scan's."""

from __future__ import annotations

import contextlib
import datetime as dt
from typing import Protocol, runtime_checkable

import msgspec

from terrarium.errors import InvalidQuery
from terrarium.model import DATE_RE, ROLES, ContextId, SegmentId, SessionId
from terrarium.text import query_terms


class SearchQuery(msgspec.Struct, frozen=True):
    """What to search for, and where."""

    text: str
    """Words to find. Treated as data: quotes, ``*``, ``NEAR(`` and SQL are matched literally."""
    type: str | None = None
    """Only contexts of this type (``irc``)."""
    context: str | None = None
    """Only this context (``irc:#python``)."""
    since: str | None = None
    """Only entries written on or after this date or time (``2026-11-01``, UTC)."""
    role: str | None = None
    """Only items of this role (``user``, ``assistant``)."""
    limit: int = 20
    archived: bool = False
    """Search archived contexts too (only :func:`terrarium.search.search` reads this)."""
    all_branches: bool = False
    """Also find what a clear, compaction or rewind left behind (hits ``branch="off"``)."""


class SearchHit(msgspec.Struct, frozen=True):
    """One matching history item, best first."""

    context: str
    date: str
    """The context's creation date, ``YYYY-MM-DD``."""
    session_id: SessionId
    segment_id: SegmentId
    seq: int
    role: str
    ts: str
    snippet: str
    """Text around the match."""
    highlights: tuple[tuple[int, int], ...]
    """``(start, end)`` character spans of the matched words within ``snippet``."""
    score: float
    """Relevance; higher is better. Comparable within one result list only."""
    message: int | None = None
    """The hit's index in ``restore(...).history`` (:func:`terrarium.search.search`), or None."""
    branch: str = "head"
    """``head``: in the conversation a user opens; ``off``: on a branch left behind."""


@runtime_checkable
class Searchable(Protocol):
    """A store that can search the text of every history item."""

    def search(self, query: SearchQuery) -> list[SearchHit]:
        """Ranked hits for ``query``."""


#: The longest accepted ``limit``.
MAX_LIMIT = 1000


def check_query(query: SearchQuery) -> SearchQuery:
    """Validate ``query`` and return it with its filters normalised.

    ``context`` is parsed (``InvalidContextId`` if malformed); ``since`` becomes a UTC date
    ``YYYY-MM-DD`` or an RFC 3339 time with ``Z``, comparable with entry timestamps.

    Raises:
        InvalidQuery: the text has no words, or ``limit``, ``role`` or ``since`` is invalid.
    """
    query_terms(query.text)
    if not isinstance(query.limit, int) or not 1 <= query.limit <= MAX_LIMIT:
        raise InvalidQuery(f"invalid limit {query.limit!r}: use 1 to {MAX_LIMIT}")
    if query.role is not None and query.role not in ROLES:
        raise InvalidQuery(f"invalid role {query.role!r}: use one of {', '.join(sorted(ROLES))}")
    context = str(ContextId.parse(query.context)) if query.context is not None else None
    since = _normalise_since(query.since) if query.since is not None else None
    return msgspec.structs.replace(query, context=context, since=since)


def _normalise_since(since: str) -> str:
    if isinstance(since, str) and DATE_RE.fullmatch(since):
        with contextlib.suppress(ValueError):
            dt.date.fromisoformat(since)
            return since
    try:
        moment = dt.datetime.fromisoformat(str(since).replace("Z", "+00:00"))
    except ValueError:
        raise InvalidQuery(
            f"invalid since {since!r}: use a date or time such as 2026-11-01 or "
            "2026-11-01T12:00:00Z"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
