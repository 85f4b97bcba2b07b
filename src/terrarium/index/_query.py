"""The check of a :class:`~terrarium.stores.base.SearchQuery`, shared by every search:
``PostgresStore``'s, the derived index's (:mod:`terrarium.index`) and the scan's."""

from __future__ import annotations

import contextlib
import datetime as dt

import msgspec

from terrarium.errors import InvalidQuery
from terrarium.model import DATE_RE, ROLES, ContextId
from terrarium.stores.base import SearchQuery
from terrarium.text import query_terms

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
