"""What the dashboard shows, computed from the store, sessions and contexts layers.

Plain functions returning JSON-ready dicts: the pages render them, the JSON API returns them as
they are, so a page never shows something the API cannot give.

* **Listing** (:func:`list_page`) reads :func:`terrarium.contexts.list_contexts`, which reads
  the store's listing index (``Listing.list_contexts_fast``) and restores no session.
* **Activity** (messages per day by type, tokens per model, turns) needs entry timestamps and
  usage records, which no index holds: :class:`Activity` reads each context's head lineage
  once and keeps the result keyed by the context's head and message count from the listing,
  so a later overview re-reads only the contexts that changed since.
* **A transcript** (:func:`transcript`) replays one segment's lineage, paged by message.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime
import heapq
import json
import logging
import operator
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from terrarium import contexts, legacy, sessions, states
from terrarium import index as derived
from terrarium.errors import (
    ContextNotFound,
    IndexUnavailable,
    InvalidContextId,
    SegmentNotFound,
    StoreError,
)
from terrarium.model import (
    ContextId,
    SegmentId,
    SessionId,
    chat_view,
    item_label,
    item_text,
)
from terrarium.states import ArchivedContext
from terrarium.stores.base import (
    IndexedListing,
    Lifecycle,
    Listing,
    ListingQuery,
    SegmentRead,
    Store,
)

log = logging.getLogger(__name__)

SORTS = ("last_active", "created", "messages", "tokens")
"""The orders the sessions list offers, each newest or largest first."""

STATES = ("hot", "archived", "all")
"""Which contexts the sessions list shows, on a store with lifecycle states (:class:`Lifecycle`):
the hot ones (the default), the archived ones, or both."""

PAGE_SIZE = 50
"""Contexts per page of the sessions list."""

MESSAGES_PER_PAGE = 200
"""Messages per page of a transcript."""

PAGE_READ = 0.1
"""Seconds a page of the sessions list spends reading the tallies of its own contexts that
the overview has not read yet (so their tokens show without a visit to the overview)."""


BYTES_EVERY = 60.0
"""Seconds between two measures of the store's size on disk."""


class BadRequest(ValueError):
    """A query parameter that cannot be used (a bad cursor, sort or date)."""


# --------------------------------------------------------------------------- listing


CATCH_UP_WAIT = 0.2
"""Seconds a page waits for the background catch-up of an ``IndexedListing`` store's index
(see :class:`CatchUp`) before it reads the index as it stands."""

SMALL_BACKLOG = 200
"""A backlog a page catches up with itself before listing (a few hundred milliseconds at
most); a larger one is caught up in the background."""


class CatchUp:
    """Keeps an :class:`IndexedListing` store's index caught up from a background thread, so a
    page never waits for a long catch-up (the first listing after a bulk load reads every
    new session). A listing whose backlog is small (:data:`SMALL_BACKLOG`) catches up first,
    as the store's own listing does; otherwise it starts one catch-up in the background
    unless one is running, waits for it at most :data:`CATCH_UP_WAIT`, then reads what the
    index holds and reports the backlog."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _kick(self, store: IndexedListing) -> threading.Thread:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, args=(store,), name="terrarium-catch-up", daemon=True
                )
                self._thread.start()
            return self._thread

    @staticmethod
    def _run(store: IndexedListing) -> None:
        try:
            store.catch_up_index()
        except Exception as exc:  # the listing reads what is there, or falls back
            log.warning("the store's index could not catch up: %s", exc)

    def as_indexed(self, store: Store) -> bool:
        """Whether listings should read the store's index as it stands: a catch-up too long to
        wait for runs in the background (started here if it is not running yet), and has not
        ended within :data:`CATCH_UP_WAIT`. False for a store without such an index, or one
        whose backlog is small (the listing catches up with it first)."""
        source = derived.listing(store)
        if not isinstance(source, IndexedListing):
            return False
        if not self.running() and source.index_backlog() <= SMALL_BACKLOG:
            return False
        self._kick(source).join(CATCH_UP_WAIT)
        return self.running()

    def running(self) -> bool:
        """Whether the background catch-up is running."""
        with self._lock:
            return self._thread is not None and self._thread.is_alive()

    def rows(self, store: Store) -> tuple[list[contexts.ContextRow], int]:
        """Every context (as :func:`terrarium.contexts.list_contexts`), and how many sessions
        the index has still to read (0 when it is current or the store has no such index)."""
        if not self.as_indexed(store):
            return contexts.list_contexts(store, ordered=False).rows, 0
        source = derived.listing(store)
        assert isinstance(source, IndexedListing)
        try:
            rows = contexts.list_contexts(store, as_indexed=True, ordered=False).rows
        except IndexUnavailable:
            if self.running():  # being built: nothing to read yet, and no waiting for it
                return [], source.index_backlog()
            return contexts.list_contexts(store, ordered=False).rows, 0
        return rows, source.index_backlog() if self.running() else 0

    def listing(self, store: Store) -> Listed:
        """What the overview follows (see :class:`Listed`): from a :class:`Listing`
        store's signatures and its most active page, else from the whole listing."""
        source = derived.listing(store)
        if not isinstance(source, Listing):
            return self._from_rows(store)
        as_indexed = self.as_indexed(store)
        try:
            native = source.context_signatures(as_indexed=as_indexed)
            top = source.list_contexts_page(
                ListingQuery(sort="messages", limit=MOST_ACTIVE, as_indexed=as_indexed)
            )
        except IndexUnavailable as exc:
            if as_indexed and self.running():  # being built: nothing to read yet
                assert isinstance(source, IndexedListing)
                return Listed([], [], [], source.index_backlog())
            log.warning("%s; listing every context instead", exc)
            return self._from_rows(store)
        found = legacy.listing(store)
        old = []
        if found.sessions:
            old = contexts.legacy_rows(found, None, {s[0] for s in native}.__contains__)
        rows = [contexts.summary_row(s) for s in top]
        backlog = 0
        if as_indexed and isinstance(source, IndexedListing) and self.running():
            backlog = source.index_backlog()
        return Listed(native, old, _most_active(rows + old), backlog, as_indexed)

    def _from_rows(self, store: Store) -> Listed:
        rows, backlog = self.rows(store)
        native = [signature_of(r) for r in rows if r.legacy_path is None]
        old = [r for r in rows if r.legacy_path is not None]
        return Listed(native, old, _most_active(rows), backlog)


Signature = tuple[str, str, int]
"""A context as the overview follows it: its id, when it was last active, its message count
(what a write changes)."""

MOST_ACTIVE = 10
"""Contexts the overview lists as the most active: the most messages (ties by id)."""


def signature_of(row: contexts.ContextRow) -> Signature:
    """A listing row's :data:`Signature`."""
    return (row.context_id, row.last_active, row.message_count)


def _most_active(rows: list[contexts.ContextRow]) -> list[contexts.ContextRow]:
    return heapq.nlargest(MOST_ACTIVE, rows, key=_ATTRS["messages"])


@dataclass(frozen=True, slots=True)
class Listed:
    """What one overview reads of the listing."""

    native: list[Signature]
    """The contexts in the log, in the store's order (the same while nothing changes)."""
    legacy: list[contexts.ContextRow]
    """The legacy files beside the store that the log does not hide."""
    most_active: list[contexts.ContextRow]
    """The :data:`MOST_ACTIVE` contexts with the most messages, legacy files included."""
    backlog: int
    """Sessions the store's index has still to read (see :class:`CatchUp`)."""
    as_indexed: bool = False
    """Whether it was read from the index as it stands (a catch-up runs meanwhile)."""


def _rows(store: Store, activity: Activity | None = None) -> list[contexts.ContextRow]:
    if activity is None:
        return contexts.list_contexts(store, ordered=False).rows
    return activity.rows(store)[0]


def _key(row: contexts.ContextRow, sort: str, tokens: Mapping[str, int]) -> tuple[Any, str]:
    if sort == "messages":
        return (row.message_count, row.context_id)
    if sort == "created":
        return (row.created_at, row.context_id)
    if sort == "tokens":
        return (tokens.get(row.context_id, 0), row.context_id)
    return (row.last_active, row.context_id)


_ATTRS: dict[str, Callable[[contexts.ContextRow], tuple[Any, str]]] = {
    "messages": operator.attrgetter("message_count", "context_id"),
    "created": operator.attrgetter("created_at", "context_id"),
    "last_active": operator.attrgetter("last_active", "context_id"),
}


def _archived_row(archived: ArchivedContext) -> contexts.ContextRow:
    """An archived context as a listing row (the archive keeps its date, not its time)."""
    kind = archived.context.partition(":")[0]
    return contexts.ContextRow(
        archived.context,
        kind,
        archived.date,
        archived.date,
        archived.last_active,
        archived.message_count,
    )


def encode_cursor(key: tuple[Any, str]) -> str:
    """An opaque cursor for the row with sort key ``key``."""
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[Any, str]:
    """The sort key a cursor names; BadRequest when it is not one of ours."""
    try:
        raw = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        value, context = raw
        if not isinstance(context, str) or not isinstance(value, (str, int)):
            raise TypeError
        return (value, context)
    except (ValueError, TypeError, binascii.Error):
        raise BadRequest(f"invalid cursor {cursor[:40]!r}") from None


def _check_date(value: str | None, what: str) -> str | None:
    if not value:
        return None
    if (
        len(value) != 10
        or value[4] != "-"
        or value[7] != "-"
        or not value.replace("-", "").isdigit()
    ):
        raise BadRequest(f"{what} must be a date YYYY-MM-DD, not {value[:40]!r}")
    return value


def list_page(
    store: Store,
    *,
    type: str | None = None,
    text: str | None = None,
    since: str | None = None,
    until: str | None = None,
    sort: str = "last_active",
    cursor: str | None = None,
    limit: int = PAGE_SIZE,
    state: str = "hot",
    activity: Activity | None = None,
    budget: float | None = None,
) -> dict[str, Any]:
    """One page of contexts, filtered and sorted, and the cursor of the next page.

    ``since``/``until`` bound the day the context was last active (inclusive); ``text`` is a
    case-insensitive substring of the context id; ``state`` picks hot, archived or all
    contexts on a :class:`Lifecycle` store (others have only hot ones). Rows carry ``pinned``
    and ``state``, and with ``activity`` their ``tokens`` (prompt + completion, from the
    activity tallies, the page's own read for up to :data:`PAGE_READ`: None until the context
    has been read, see :meth:`Activity.tallies` and its ``budget``; archived contexts have
    none). Sorting by tokens puts contexts not
    read yet last; ``tokens_pending`` says how many there are.

    On a :class:`Listing` store the page comes from the store's index (a walk of about
    ``limit`` rows, legacy files and archived contexts merged in; by tokens, picked from the
    contexts' signatures and tallies, its rows read by id); other stores pick it from the
    whole listing.
    """
    if state not in STATES:
        raise BadRequest(f"state must be one of {', '.join(STATES)}, not {state[:40]!r}")
    query = _query(sort, cursor, limit, type, text, since, until)
    life = store if isinstance(store, Lifecycle) else None
    archived = (
        [_archived_row(a) for a in states.archived_contexts(life)]
        if life and state != "hot"
        else []
    )
    (rows, types), tokens, pending = _page_rows(
        store, query, sort, state, archived, activity, budget
    )
    page, more = rows[:limit], len(rows) > limit
    if activity is not None and not tokens:  # from the index: the tallies of this page only
        tokens = activity.tokens_of(store, page)
    pinned = states.pinned_contexts(life) if life else frozenset()
    return {
        "contexts": _shown(page, archived, pinned, tokens if activity is not None else None),
        "next_cursor": encode_cursor(_key(page[-1], sort, tokens)) if more and page else None,
        "sort": sort,
        "state": state,
        "types": sorted(types | {row.type for row in archived}),
        "tokens_pending": pending,
        "lifecycle": life is not None,
    }


def _page_rows(
    store: Store,
    query: ListingQuery,
    sort: str,
    state: str,
    archived: list[contexts.ContextRow],
    activity: Activity | None,
    budget: float | None,
) -> tuple[Paged, dict[str, int], int]:
    """The page's rows (from the store's index where it has one, else picked from the whole
    listing), the tokens known of them, and how many contexts are still to be read."""
    tokens: dict[str, int] = {}
    pending = 0
    found: Paged | None = None
    paged = isinstance(derived.listing(store), Listing)
    if sort != "tokens" and paged:
        as_indexed = activity is not None and activity.catch_up.as_indexed(store)
        found = _paged(store, query, state, archived, as_indexed)
    elif activity is not None and paged:
        found, tokens, pending = _by_tokens(store, query, state, archived, activity, budget)
    if found is None:
        hot = _rows(store, activity) if state != "archived" else []
        if activity is not None:
            native = [signature_of(r) for r in hot if r.legacy_path is None]
            tallies, pending = activity.tallies(store, native, budget)
            tokens = {context_id: t.total_tokens for context_id, t in tallies.items()}
        found = _picked(hot + archived, query, sort, tokens), _types(hot)
    return found, tokens, pending


def _query(
    sort: str,
    cursor: str | None,
    limit: int,
    type: str | None,
    text: str | None,
    since: str | None,
    until: str | None,
) -> ListingQuery:
    """The store query of a sessions-list request (one row more than the page, to know
    whether another follows; the tokens order reads the last-active one).

    Raises:
        BadRequest: an unknown sort, a limit out of range, a bad cursor or day.
    """
    if sort not in SORTS:
        raise BadRequest(f"sort must be one of {', '.join(SORTS)}, not {sort[:40]!r}")
    if not 1 <= limit <= 1000:
        raise BadRequest("limit must be between 1 and 1000")
    after = decode_cursor(cursor) if cursor else None
    counted = int if sort in ("messages", "tokens") else str
    if after is not None and not isinstance(after[0], counted):
        raise BadRequest(f"the cursor does not belong to the {sort} order")
    return ListingQuery(
        sort="last_active" if sort == "tokens" else sort,
        after=after,
        limit=limit + 1,
        type=type,
        text=text or None,
        since=_check_date(since, "since"),
        until=_check_date(until, "until"),
    )


def _shown(
    page: list[contexts.ContextRow],
    archived: list[contexts.ContextRow],
    pinned: frozenset[str],
    tokens: Mapping[str, int] | None,
) -> list[dict[str, Any]]:
    """The page's rows as the API gives them: with their state, pin and tokens (None: not
    known, or no activity kept)."""
    archived_ids = {row.context_id for row in archived}
    shown = []
    for row in page:
        item = row.to_json()
        item["state"] = "archived" if row.context_id in archived_ids else "hot"
        item["pinned"] = row.context_id in pinned
        item["tokens"] = tokens.get(row.context_id) if tokens is not None else None
        shown.append(item)
    return shown


def _legacy_candidates(
    store: Store, found: legacy.LegacyListing, query: ListingQuery
) -> list[contexts.ContextRow]:
    """The legacy files that may be on the page ``query`` names, largest key first, each
    checked against the log (a context in the log hides its legacy file) until ``query.limit``
    are not hidden: one head lookup each, not a listing of the log."""
    every = contexts.legacy_rows(found, query.type, lambda _: False)
    ordered = _picked(every, msgspec.structs.replace(query, limit=len(every) or 1), query.sort, {})
    shown: list[contexts.ContextRow] = []
    for row in ordered:
        if store.get_head(row.context) is None:
            shown.append(row)
            if len(shown) == query.limit:
                break
    return shown


Paged = tuple[list[contexts.ContextRow], set[str]]
"""A page's rows (one more than it shows, if there are more) and the types it may offer."""


def _types(rows: list[contexts.ContextRow]) -> set[str]:
    return {row.type for row in rows}


def _picked(
    rows: list[contexts.ContextRow], query: ListingQuery, sort: str, tokens: Mapping[str, int]
) -> list[contexts.ContextRow]:
    """The rows of the page ``query`` names (``query.limit`` at most), from ``rows``: those
    that pass its filters, largest key first, after its cursor."""
    after = query.after
    # The sort key in C (attrgetter) where it is two attributes; tokens come from the tallies.
    key: Callable[[contexts.ContextRow], tuple[Any, str]] = (
        (lambda r: _key(r, sort, tokens)) if sort == "tokens" else _ATTRS[sort]
    )
    matches = query.matcher()
    if matches is not None:
        rows = [row for row in rows if matches(row.context_id, row.last_active)]
    if after is not None:
        rows = [row for row in rows if key(row) < after]
    # One page of the largest keys: O(n), where sorting all 100k rows costs several times that.
    return heapq.nlargest(query.limit, rows, key=key)


def _by_tokens(
    store: Store,
    query: ListingQuery,
    state: str,
    archived: list[contexts.ContextRow],
    activity: Activity,
    budget: float | None,
) -> tuple[Paged, dict[str, int], int]:
    """The page in tokens order (prompt + completion, from the activity tallies; contexts
    not read yet count 0), picked from the contexts' signatures, its rows read by id from
    the index; the tokens known of the page's contexts; how many contexts are still to be
    read."""
    source = derived.listing(store)
    assert isinstance(source, Listing)
    listed = activity.listing(store)
    tallies, pending = activity.tallies(store, listed.native, budget)
    matches = query.matcher() or (lambda _c, _l: True)
    keys: list[tuple[int, str]] = []
    others = list(archived)
    if state != "archived":
        for context_id, last_active, _ in listed.native:
            if matches(context_id, last_active):
                tally = tallies.get(context_id)
                keys.append((tally.total_tokens if tally else 0, context_id))
        others += listed.legacy
    keys += [(0, r.context_id) for r in others if matches(r.context_id, r.last_active)]
    if query.after is not None:
        after = query.after
        keys = [k for k in keys if k < after]
    top = heapq.nlargest(query.limit, keys)
    by_id = {row.context_id: row for row in others}
    named = tuple(context_id for _, context_id in top if context_id not in by_id)
    wanted = ListingQuery(contexts=named, limit=max(len(named), 1), as_indexed=listed.as_indexed)
    by_id.update((s.context, contexts.summary_row(s)) for s in source.list_contexts_page(wanted))
    rows = [by_id[context_id] for _, context_id in top if context_id in by_id]
    types = set(source.context_types(as_indexed=listed.as_indexed)) | _types(listed.legacy)
    tokens = {c: tallies[c].total_tokens for _, c in top if c in tallies}
    return (rows, types), tokens, pending


def _paged(
    store: Store,
    query: ListingQuery,
    state: str,
    archived: list[contexts.ContextRow],
    as_indexed: bool,
) -> Paged | None:
    """The page from the store's index, with the legacy files beside it (hot) and ``archived``
    merged in; None when the store has no such index or it cannot answer (the caller lists
    everything instead)."""
    source = derived.listing(store)
    if not isinstance(source, Listing):
        return None
    query = msgspec.structs.replace(query, as_indexed=as_indexed)
    extra = list(archived)
    try:
        rows: list[contexts.ContextRow] = []
        types: set[str] = set()
        if state != "archived":
            rows = [contexts.summary_row(s) for s in source.list_contexts_page(query)]
            types = set(source.context_types(as_indexed=as_indexed))
            found = legacy.listing(store)
            if found.sessions:
                types |= {info.context.type for info in found.sessions}
                extra += _legacy_candidates(store, found, query)
    except IndexUnavailable as exc:
        log.warning("%s; listing every context instead", exc)
        return None
    return _picked(rows + extra, query, query.sort, {}), types


# --------------------------------------------------------------------------- activity


Identity = tuple[str, str, int, int]
"""A message's original: session id, segment id, seq, place in that header's history (-1
for an entry)."""


class _Tally(msgspec.Struct, frozen=True, gc=False):
    """What one context's head lineage adds to the overview.

    Immutable, of tuples, strings and numbers only, so the cyclic garbage collector does not
    track it: a dashboard over 100k contexts holds 100k of them, and as dicts and lists they
    made every full collection (set off by the reading itself) walk them all.
    """

    signature: tuple[str, int]
    per_day: tuple[tuple[str, int], ...] = ()
    """Messages per day."""
    tokens: tuple[tuple[str, tuple[int, int, int, int, int]], ...] = ()
    """Per model: prompt, completion, cached tokens, calls, calls whose usage was estimated."""
    turns: int = 0
    total_tokens: int = 0
    """Prompt plus completion tokens over every model."""
    source: str = ""
    """The context this one was forked from (``fork_context``), or empty."""
    session: str = ""
    """The session id of its head."""
    copies: tuple[tuple[Identity, str], ...] = ()
    """Its copies from another session (a fork into another context): each original's
    identity and day. Counted here only when no hot context holds the original."""
    ranges: tuple[tuple[str, int, int], ...] = ()
    """The entries its conversation holds: per segment, the first and last seq."""
    held: tuple[Identity, ...] = ()
    """The identities of the items its conversation holds from a header (a compaction's)."""

    def holds(self, identity: Identity) -> bool:
        """Whether this context's conversation holds the message ``identity`` names."""
        if identity in self.held:
            return True
        _, segment, seq, index = identity
        return index < 0 and any(s == segment and lo <= seq <= hi for s, lo, hi in self.ranges)


def _identity(message: sessions.Message, session_id: SessionId) -> Identity:
    found = message.provenance(session_id)
    index = found.get("index")
    return (
        str(found.get("session_id")),
        str(found.get("segment_id")),
        int(found.get("seq", 0)),
        index if type(index) is int else -1,
    )


def _tally(store: Store, row: Signature) -> _Tally:
    """One context's figures, by the one replay rule (:func:`sessions.fold`, the figures
    ``stats`` gives): tokens per model and turns, carried over compactions and clears; and
    its messages per day, each at the time it was first logged (:func:`sessions.messages`),
    a fork's copies apart (:meth:`Activity.messages_per_day` counts each once)."""
    context_id, last_active, count = row
    head = store.get_head(ContextId.parse(context_id))
    if head is None:
        return _Tally((last_active, count))
    reads = sessions.lineage(store, head.session_id, head.segment_id, blobs="stored")
    state = sessions.collect_state(line for read in reads for line in (read.header, *read.entries))
    per_day: Counter[str] = Counter()
    copies: list[tuple[Identity, str]] = []
    held: list[Identity] = []
    ranges: dict[str, tuple[int, int]] = {}
    for m in sessions.messages(reads):
        if m.copied_from_elsewhere(head.session_id):
            copies.append((_identity(m, head.session_id), m.ts[:10]))
            continue
        per_day[m.ts[:10]] += 1
        if m.index is not None or m.source is not None:
            held.append(_identity(m, head.session_id))
        else:
            lo, _ = ranges.get(m.segment_id, (m.seq, m.seq))
            ranges[m.segment_id] = (lo, m.seq)
    tokens = {
        model: (u.prompt_tokens, u.completion_tokens, u.cached_tokens, u.calls, u.estimated_calls)
        for model, u in state.usage_by_model.items()
    }
    return _Tally(
        (last_active, count),
        tuple(per_day.items()),
        tuple(tokens.items()),
        state.turns,
        state.usage.total_tokens,
        _fork_source(store, head.session_id, reads[0].header if reads else {}),
        str(head.session_id),
        tuple(copies),
        tuple((segment, lo, hi) for segment, (lo, hi) in ranges.items()),
        tuple(held),
    )


def _fork_source(store: Store, session_id: SessionId, first: Mapping[str, Any]) -> str:
    """The context a session was forked from: its root header's ``origin.source`` when that
    is a ``fork`` (``fork_context``). ``first`` is the head lineage's first header, the root
    unless a compaction or clear started the lineage afresh; then the root's header is read
    (the oldest segment: segment ids are time-ordered)."""
    origin = first.get("origin") or {}
    if origin.get("kind") not in ("root", "fork", "import"):
        try:
            root = min(store.list_segments(session_id))
            origin = store.read_segment(session_id, root, stop_seq=0).header.get("origin") or {}
        except (StoreError, ValueError):  # a damaged root: the head's tally still counts
            return ""
    source = origin.get("source")
    return source if origin.get("kind") == "fork" and isinstance(source, str) else ""


class Activity:
    """Per-context tallies of the overview, re-read only for contexts whose head changed, and
    their sums, kept up to date as tallies come and go (so a warm overview adds nothing up)."""

    def __init__(self) -> None:
        self._tallies: dict[str, _Tally] = {}
        self._lock = threading.Lock()
        self._bytes: tuple[float, int | None] | None = None
        self.by_day: dict[str, Counter[str]] = {}
        """Messages per day, per context type, over the tallies held, fork copies apart."""
        self.copies: dict[Identity, tuple[str, Counter[str]]] = {}
        """The fork copies of the tallies held: per original, its day and how many contexts
        of each type hold a copy."""
        self.sessions: dict[str, _Tally] = {}
        """The tallies held, by session id."""
        self.models: dict[str, list[int]] = {}
        """Per model: prompt, completion, cached tokens, calls, estimated calls, over the
        tallies held."""
        self.turns = 0
        self.forks: dict[str, set[str]] = {}
        """Per context, the contexts forked from it (``fork_context``), over the tallies held."""
        self.catch_up = CatchUp()
        self.backlog = 0
        """Sessions the store's index had still to read at the last listing (see
        :class:`CatchUp`)."""
        self._seen: list[Signature] | None = None
        self._todo: list[Signature] = []
        self._listed: tuple[Listed, dict[str, Any]] | None = None

    def rows(self, store: Store) -> tuple[list[contexts.ContextRow], int]:
        """Every context, and the index's backlog (see :class:`CatchUp`)."""
        rows, self.backlog = self.catch_up.rows(store)
        return rows, self.backlog

    def listing(self, store: Store) -> Listed:
        """What the overview follows of the listing (see :meth:`CatchUp.listing`)."""
        found = self.catch_up.listing(store)
        self.backlog = found.backlog
        return found

    def listed(self, listed: Listed) -> dict[str, Any]:
        """What the overview sums from the listing alone (per type, totals, most active),
        summed again only when the listing changed."""
        if self._listed is not None and self._listed[0] == listed:
            return self._listed[1]
        sums: dict[str, list[int]] = {}
        for context_id, _, count in listed.native:  # one plain loop: 100k rows in ~30 ms
            kind = context_id[: context_id.find(":")]
            pair = sums.get(kind)
            if pair is None:
                sums[kind] = [1, count]
            else:
                pair[0] += 1
                pair[1] += count
        for row in listed.legacy:
            sums.setdefault(row.type, [0, 0])[0] += 1
            sums[row.type][1] += row.message_count
        per_type = {k: {"contexts": n, "messages": m} for k, (n, m) in sorted(sums.items())}
        found = {
            "contexts": len(listed.native) + len(listed.legacy),
            "messages": sum(c["messages"] for c in per_type.values()),
            "per_type": per_type,
            "most_active": [row.to_json() for row in listed.most_active],
        }
        self._listed = (listed, found)
        return found

    def _count(self, context_id: str, tally: _Tally, sign: int) -> None:
        kind = context_id.partition(":")[0]
        for day, n in tally.per_day:
            counts = self.by_day.setdefault(day, Counter())
            counts[kind] += sign * n
            if not counts[kind]:
                del counts[kind]
                if not counts:
                    del self.by_day[day]
        for model, numbers in tally.tokens:
            sums = self.models.setdefault(model, [0, 0, 0, 0, 0])
            for i, n in enumerate(numbers):
                sums[i] += sign * n
            if not sums[3]:
                del self.models[model]
        self.turns += sign * tally.turns
        self._count_copies(kind, tally, sign)
        if tally.source and sign > 0:
            self.forks.setdefault(tally.source, set()).add(context_id)
        elif tally.source:
            self.forks.get(tally.source, set()).discard(context_id)

    def _count_copies(self, kind: str, tally: _Tally, sign: int) -> None:
        if tally.session and sign > 0:
            self.sessions[tally.session] = tally
        elif self.sessions.get(tally.session) is tally:
            del self.sessions[tally.session]
        for identity, day in tally.copies:
            _, kinds = self.copies.setdefault(identity, (day, Counter()))
            kinds[kind] += sign
            if kinds[kind] <= 0:
                del kinds[kind]
                if not kinds:
                    del self.copies[identity]

    def messages_per_day(self) -> dict[str, Counter[str]]:
        """Messages per day, per context type, over the tallies held: each message once, on
        the day it was first logged. A fork's copy counts in the context it was copied from
        while that context's conversation holds the original (its session's tally says); when
        it no longer does (compacted away, cleared, deleted, archived), in the fork, once
        however many forks hold it, under the first of their types."""
        if not self.copies:
            return self.by_day
        found = {day: Counter(counts) for day, counts in self.by_day.items()}
        for identity, (day, kinds) in self.copies.items():
            source = self.sessions.get(identity[0])
            if source is None or not source.holds(identity):
                found.setdefault(day, Counter())[min(kinds)] += 1
        return found

    def forks_of(
        self, store: Store, context: ContextId, budget: float = PAGE_READ
    ) -> dict[str, Any]:
        """The hot contexts forked from ``context`` into other contexts, from the tallies
        (each read once per change of its context), brought up to date for up to ``budget``
        seconds; ``pending`` counts the contexts not read yet (their forks are not shown)."""
        found = self.listing(store)
        _, pending = self.tallies(store, found.native, budget)
        return {"contexts": sorted(self.forks.get(str(context), ())), "pending": pending}

    def tokens_of(
        self, store: Store, rows: Iterable[contexts.ContextRow], budget: float = PAGE_READ
    ) -> dict[str, int]:
        """The tokens of ``rows`` (a page of the sessions list), reading for up to ``budget``
        seconds the tallies of those not read since they last changed (legacy files have
        none); those left are not known yet."""
        deadline = time.monotonic() + budget
        found = {}
        with self._lock:
            for row in rows:
                signature = (row.context_id, row.last_active, row.message_count)
                tally = self._tallies.get(row.context_id)
                if tally is None or tally.signature != signature[1:]:
                    if row.legacy_path is not None or time.monotonic() > deadline:
                        continue
                    try:
                        tally = self._replace(store, signature)
                    except StoreError:
                        continue  # damaged: the row shows its problem
                found[row.context_id] = tally.total_tokens
        return found

    def _replace(self, store: Store, row: Signature) -> _Tally:
        """Read ``row``'s context again and put its tally in place of the one held."""
        new = _tally(store, row)
        old = self._tallies.get(row[0])
        if old is not None:
            self._count(row[0], old, -1)
        self._tallies[row[0]] = new
        self._count(row[0], new, +1)
        return new

    def disk_bytes(self, store: Store) -> int | None:
        """:func:`disk_bytes` as last measured (None until the first measure ends), measured
        again at most once a minute in a background thread: walking a folder of 100k
        sessions takes seconds, which no page should wait for."""
        now = time.monotonic()
        if self._bytes is None or now - self._bytes[0] > BYTES_EVERY:
            known = self._bytes[1] if self._bytes is not None else None
            self._bytes = (now, known)
            threading.Thread(
                target=self._measure, args=(store,), name="terrarium-bytes", daemon=True
            ).start()
        return self._bytes[1]

    def _measure(self, store: Store) -> None:
        try:
            found = disk_bytes(store)
        except OSError as exc:
            log.warning("could not measure the store's size: %s", exc)
            return
        self._bytes = (time.monotonic(), found)

    def tallies(
        self, store: Store, rows: list[Signature], budget: float | None = None
    ) -> tuple[dict[str, _Tally], int]:
        """The tally of every context in ``rows`` (the log's: legacy files have none), and how
        many contexts are still to be read.

        Args:
            budget: seconds to spend reading contexts whose tally is missing or stale; past
                it the rest keep their stale tally (or none) and are counted as pending, to
                be read by the next call. None reads them all.
        """
        deadline = None if budget is None else time.monotonic() + budget
        with self._lock:
            # The same listing as last time: only what is left to read. (Comparing two lists
            # of tuples runs in C, some 50 times faster than the loop below.)
            if self._seen is not None and self._seen == rows:
                return self._tallies, self._fill(store, deadline)
            fresh: dict[str, _Tally] = {}
            todo: list[Signature] = []
            for row in rows:
                context_id, last_active, count = row
                known = self._tallies.get(context_id)
                if known is None or known.signature != (last_active, count):
                    if deadline is not None and time.monotonic() > deadline:
                        todo.append(row)
                        if known is not None:
                            fresh[context_id] = known
                        continue
                    try:
                        known = _tally(store, row)
                    except StoreError:
                        continue  # damaged: the listing shows its problem
                fresh[context_id] = known
            for context_id, old in self._tallies.items():
                if fresh.get(context_id) is not old:
                    self._count(context_id, old, -1)
            for context_id, new in fresh.items():
                if self._tallies.get(context_id) is not new:
                    self._count(context_id, new, +1)
            self._tallies = fresh
            self._seen = rows
            self._todo = todo
            return fresh, len(todo)

    def fill(self, store: Store, budget: float) -> int:
        """Read, for about ``budget`` seconds, the contexts the last :meth:`tallies` left
        pending (what :class:`FillIn` does between page loads); return how many are left."""
        with self._lock:
            return self._fill(store, time.monotonic() + budget)

    def _fill(self, store: Store, deadline: float | None) -> int:
        todo = self._todo
        while todo and (deadline is None or time.monotonic() <= deadline):
            row = todo.pop()
            with contextlib.suppress(StoreError):
                self._replace(store, row)
        return len(todo)


class FillIn:
    """Reads the contexts an overview left pending (:meth:`Activity.tallies`) from a
    background thread, in slices of :data:`FILL_SLICE` seconds under the caller's lock, so the
    overview completes in seconds of reading rather than one budget per page load."""

    def __init__(self, store: Store, activity: Activity, lock: threading.Lock) -> None:
        self.store, self.activity, self.lock = store, activity, lock
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()

    def running(self) -> bool:
        """Whether a thread is reading."""
        with self._guard:
            return self._thread is not None and self._thread.is_alive()

    def kick(self) -> None:
        """Start reading unless a thread already is."""
        with self._guard:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="terrarium-fill-in", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        left = 1
        while left:
            try:
                with self.lock:
                    left = self.activity.fill(self.store, FILL_SLICE)
            except Exception as exc:  # a closed or failing store: the pages say what is left
                log.warning("reading the store's activity stopped: %s", exc)
                return
            time.sleep(FILL_PAUSE)  # let waiting pages take the lock


FILL_SLICE = 0.1
"""Seconds :class:`FillIn` holds the store's lock per slice (what a page may wait for it)."""

FILL_PAUSE = 0.01
"""Seconds :class:`FillIn` leaves the lock free between two slices."""


def disk_bytes(store: Store) -> int | None:
    """Bytes the store's files take, for a store of files (None for a database server)."""
    path = getattr(store, "path", None)
    if isinstance(path, Path) and path.is_file():
        extra = [path.with_name(path.name + s) for s in ("-wal", "-shm")]
        return sum(p.stat().st_size for p in (path, *extra) if p.exists())
    root = getattr(store, "root", None)
    if not (isinstance(root, Path) and root.is_dir()):
        return None
    # Walking 100k session folders takes ~10 s of Python: in this process it would hold the
    # GIL against every page for that long (a cold overview of such a store measured 0.95 s
    # with the walk beside it, 0.51 s without), so it runs in a child interpreter (-I: no
    # site, no environment) on another core, at a lower priority where the OS has one.
    done = subprocess.run(
        [sys.executable, "-I", "-c", _WALK, str(root)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise OSError(f"measuring {root} failed: {done.stderr.strip().splitlines()[-1:]}")
    return int(done.stdout)


_WALK = """
import os, sys
if hasattr(os, "nice"):
    os.nice(10)
total = 0
for folder, _dirs, files in os.walk(sys.argv[1]):  # symbolic links are not followed
    for name in files:
        try:
            total += os.lstat(os.path.join(folder, name)).st_size
        except OSError:  # removed meanwhile
            pass
print(total)
"""
"""The walk :func:`disk_bytes` runs in a child process: every file's size, links not followed."""


ACTIVITY_BUDGET = 0.3
"""Seconds one overview spends listing the store and then reading contexts it has no fresh
tally of (see :meth:`Activity.tallies`): the first overview of a big store fills in over
several loads."""


RANGES = {"7d": 7, "30d": 30, "90d": 90, "all": None}
"""The chart's ranges: the last N calendar days up to today (UTC), or every active day."""

FILL_DAYS = 400
"""Longest span whose days without activity are drawn as empty bars (longer ones show only
the active days)."""


def _days(first: str, last: str) -> list[str]:
    """Every date from ``first`` to ``last`` inclusive (both ``YYYY-MM-DD``)."""
    day, end = datetime.date.fromisoformat(first), datetime.date.fromisoformat(last)
    out = []
    while day <= end:
        out.append(day.isoformat())
        day += datetime.timedelta(days=1)
    return out


def chart_range(
    range: str | None, start: str | None, end: str | None, active: Iterable[str], today: str
) -> dict[str, Any]:
    """The days the chart shows: ``{"range", "from", "to", "days"}``.

    ``start``/``end`` (``YYYY-MM-DD``, either may be missing) pick a custom range and win over
    ``range`` (a key of :data:`RANGES`, default 30d); ``all`` spans the first to the last
    active day. ``days`` lists every date in the span when it is at most :data:`FILL_DAYS`
    long, else only the active ones.
    """
    start, end = _check_date(start, "from"), _check_date(end, "to")
    dates = sorted(d for d in active if _check_date_ok(d))
    if start or end:
        name = "custom"
        first = start or (dates[0] if dates else today)
        last = end or today
    else:
        name = range or "30d"
        if name not in RANGES:
            raise BadRequest(f"range must be one of {', '.join(RANGES)}, not {name[:40]!r}")
        span = RANGES[name]
        if span is None:
            first, last = (dates[0], dates[-1]) if dates else (today, today)
        else:
            first = (datetime.date.fromisoformat(today) - datetime.timedelta(span - 1)).isoformat()
            last = today
    if first > last:
        raise BadRequest(f"from ({first}) is after to ({last})")
    length = (datetime.date.fromisoformat(last) - datetime.date.fromisoformat(first)).days + 1
    if length <= FILL_DAYS:
        days = _days(first, last)
    else:
        days = [d for d in dates if first <= d <= last]
    return {"range": name, "from": first, "to": last, "days": days}


def _check_date_ok(value: str) -> bool:
    try:
        return _check_date(value, "date") is not None
    except BadRequest:
        return False


def lifecycle_counts(store: Store) -> dict[str, int] | None:
    """How many contexts are archived, in the trash and pinned; None for a store without
    lifecycle states."""
    if not isinstance(store, Lifecycle):
        return None
    return {
        "archived": len(states.archived_contexts(store)),
        "trashed": len(states.trashed_contexts(store)),
        "pinned": len(states.pinned_contexts(store)),
    }


def overview(
    store: Store,
    activity: Activity,
    *,
    range: str | None = None,
    start: str | None = None,
    end: str | None = None,
    budget: float | None = ACTIVITY_BUDGET,
    today: str | None = None,
) -> dict[str, Any]:
    """Totals, per-type counts, messages per day by type, tokens per model, most active, and
    the lifecycle counts.

    Turns, tokens and messages per day cover the hot contexts read so far:
    ``activity_pending`` says how many are still to be read (0 once every context has been).
    The chart's days are picked by ``range``/``start``/``end`` (see :func:`chart_range`).
    """
    started = time.monotonic()
    found = activity.listing(store)
    if budget is not None:  # what is left of it once the listing is read (FillIn reads on)
        budget = max(0.0, budget - (time.monotonic() - started))
    _, pending = activity.tallies(store, found.native, budget)
    listed = activity.listed(found)
    backlog = found.backlog
    by_day = activity.messages_per_day()
    names = ("prompt_tokens", "completion_tokens", "cached_tokens", "calls", "estimated_calls")
    models = {model: dict(zip(names, sums, strict=True)) for model, sums in activity.models.items()}
    turns = activity.turns
    today = today or datetime.datetime.now(datetime.UTC).date().isoformat()
    chosen = chart_range(range, start, end, by_day, today)
    empty: dict[str, int] = {}
    return {
        "totals": {
            "contexts": listed["contexts"],
            "messages": listed["messages"],
            "turns": turns,
            "prompt_tokens": sum(m["prompt_tokens"] for m in models.values()),
            "completion_tokens": sum(m["completion_tokens"] for m in models.values()),
            "cached_tokens": sum(m["cached_tokens"] for m in models.values()),
            "estimated_calls": sum(m["estimated_calls"] for m in models.values()),
            "bytes_on_disk": activity.disk_bytes(store),
        },
        "activity_pending": pending,
        "indexing": backlog,
        "lifecycle": lifecycle_counts(store),
        "per_type": listed["per_type"],
        "range": {k: chosen[k] for k in ("range", "from", "to")},
        "messages_per_day": [
            {"date": d, "by_type": dict(sorted(by_day.get(d, empty).items()))}
            for d in chosen["days"]
        ],
        "tokens_per_model": dict(sorted(models.items())),
        "most_active": listed["most_active"],
    }


# --------------------------------------------------------------------------- one context


def parse_context(text: str | None) -> ContextId:
    """The context a request names.

    Raises:
        BadRequest: none given. InvalidContextId: not a valid id (``invalid session id ...``,
            the reason as the CLI gives it).
    """
    if not text:
        raise BadRequest("c, the session id (type:name), is required")
    try:
        return ContextId.parse(text)
    except InvalidContextId as exc:
        reason = str(exc).removeprefix("invalid context id ")
        raise InvalidContextId(f"invalid session id {reason}") from None


def fork_tree(store: Store, context: ContextId) -> dict[str, Any]:
    """The context's segments (oldest first) with their origins, and its head."""
    head = store.get_head(context)
    if head is None:
        raise contexts.not_found(context)
    segments = []
    for segment_id, read, salvaged_into in sessions.tree_reads(store, head.session_id):
        header = read.header if read is not None else {}
        origin = header.get("origin") or {"kind": "root" if read is not None else "salvaged"}
        segments.append(
            {
                "segment_id": str(segment_id),
                "created_at": header.get("ts"),
                "origin": origin.get("kind", "root"),
                "parent": origin.get("parent"),
                "at_seq": origin.get("at_seq"),
                "source": origin.get("source"),
                "head": segment_id == head.segment_id,
                "salvaged_into": str(salvaged_into) if salvaged_into is not None else None,
            }
        )
    return {
        "session_id": str(head.session_id),
        "head": str(head.segment_id),
        "segments": _tree_order(segments),
    }


def _tree_order(segments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Segments in depth-first order, each with its ``depth`` below its root."""
    known = {s["segment_id"] for s in segments}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for s in segments:
        parent = s["parent"] if s["parent"] in known else None
        children.setdefault(parent, []).append(s)
    ordered: list[dict[str, Any]] = []
    stack = [(s, 0) for s in reversed(children.get(None, []))]
    while stack:
        s, depth = stack.pop()
        ordered.append({**s, "depth": depth})
        stack.extend((c, depth + 1) for c in reversed(children.get(s["segment_id"], [])))
    return ordered


def _message(
    logged: Mapping[str, Any], seq: int, ts: str, segment: str, summary: bool
) -> dict[str, Any]:
    # A Responses item is shown as the Chat message it stands for (model.chat_view); a kind
    # with no Chat form keeps its own fields, labelled by its type, with whatever text it has.
    view = chat_view(logged)
    item = view if view is not None else logged
    calls = [
        {
            "id": str(c.get("id", "")),
            "name": str((c.get("function") or {}).get("name", "")),
            "arguments": str((c.get("function") or {}).get("arguments", "")),
        }
        for c in item.get("tool_calls") or ()
        if isinstance(c, Mapping)
    ]
    try:
        text = item_text(item) if item.get("reasoning_content") is None else ""
    except (AttributeError, TypeError):
        text = ""
    return {
        "role": str(item.get("role") or item_label(logged)),
        "name": item.get("name") if isinstance(item.get("name"), str) else None,
        "text": text,
        "reasoning": item.get("reasoning_content")
        if isinstance(item.get("reasoning_content"), str)
        else None,
        "tool_calls": calls,
        "tool_call_id": item.get("tool_call_id")
        if isinstance(item.get("tool_call_id"), str)
        else None,
        "seq": seq,
        "ts": ts,
        "segment_id": segment,
        "summary": summary,
        "usage": None,
    }


def _messages(
    reads: list[SegmentRead], offset: int, limit: int, failed: Mapping[int, Mapping[str, Any]]
) -> tuple[int, list[dict[str, Any]]]:
    """How many messages the lineage holds (:func:`sessions.messages`, the one rule), and
    those of one page: each with the usage record logged after it, if any, and whether a
    failed run holds it (``failed``, the restored state's)."""
    found = sessions.messages(reads)
    page: list[dict[str, Any]] = []
    for index in range(offset, min(offset + limit, len(found))):
        message = found[index]
        if not isinstance(message.item, Mapping):
            continue
        row = _message(message.item, message.seq, message.ts, message.segment_id, message.summary)
        row["position"] = index  # the page's anchor #m{position}, search hits' ``message``
        row["failed"] = _failed(failed, index)
        if message.usage is not None:
            usage = message.usage
            row["usage"] = {
                "model": usage.get("model"),
                "prompt_tokens": usage.get("prompt_tokens", 0),
                "completion_tokens": usage.get("completion_tokens", 0),
                "cached_tokens": usage.get("cached_tokens", 0),
                "estimated": usage.get("estimated"),
            }
        page.append(row)
    return len(found), page


def _failed(failed: Mapping[int, Mapping[str, Any]], index: int) -> dict[str, Any] | None:
    """What a message of a failed run shows: the run's error, and its partial reply on the
    run's last message; None for a message of no failed run."""
    errored = failed.get(index)
    if errored is None:
        return None
    last = failed.get(index + 1) is not errored
    partial = errored.get("partial") if last else None
    return {
        "error": str(errored.get("error") or ""),
        "partial": partial if isinstance(partial, str) else None,
    }


def transcript(
    store: Store,
    context: ContextId,
    *,
    segment: str | None = None,
    offset: int = 0,
    limit: int = MESSAGES_PER_PAGE,
    activity: Activity | None = None,
) -> dict[str, Any]:
    """One page of a context's transcript (its head, or another of its segments), its stats
    and its fork tree (with ``activity``, its forks into other contexts too).

    Raises:
        ContextNotFound: no such context. SegmentNotFound: the segment is not in its session.
    """
    if offset < 0 or not 1 <= limit <= 5000:
        raise BadRequest("offset must be >= 0 and limit between 1 and 5000")
    tree = fork_tree(store, context)
    head = store.get_head(context)
    assert head is not None  # fork_tree raised otherwise
    if activity is not None:
        tree["forks"] = activity.forks_of(store, context)
    segment_id = head.segment_id
    if segment:
        if segment not in {s["segment_id"] for s in tree["segments"]}:
            raise SegmentNotFound(f"no segment '{segment[:80]}' in '{context.display}'")
        segment_id = SegmentId(segment)
    reads = sessions.lineage(store, head.session_id, segment_id)
    state = sessions.collect_state(line for read in reads for line in (read.header, *read.entries))
    total, messages = _messages(reads, offset, limit, state.failed)
    if segment_id == head.segment_id:  # the head's stats, from the reads already made
        segments = len(tree["segments"])
        stats = contexts.stats_of(context, state, head.created_at, segments, is_legacy=False)
    else:
        stats = contexts.get_stats(store, context)
    return {
        "context_id": str(context),
        "segment_id": str(segment_id),
        "is_head": segment_id == head.segment_id,
        "lifecycle": context_state(store, context),
        "stats": stats,
        "tree": tree,
        "total_messages": total,
        "offset": offset,
        "limit": limit,
        "messages": messages,
    }


def context_state(store: Store, context: ContextId) -> dict[str, Any] | None:
    """The context's lifecycle state (``hot`` or ``archived``) and whether it is pinned; None
    for a store without lifecycle states."""
    if not isinstance(store, Lifecycle):
        return None
    return {
        "state": "archived" if states.is_archived(store, context) else "hot",
        "pinned": str(context) in states.pinned_contexts(store),
    }


def trash(store: Store) -> dict[str, Any]:
    """The store's trash, most recently deleted first (empty for a store without one)."""
    if not isinstance(store, Lifecycle):
        return {"lifecycle": False, "trash": []}
    return {
        "lifecycle": True,
        "trash": [
            {
                "trash_id": t.trash_id,
                "context_id": t.context,
                "date": t.date,
                "deleted_at": t.deleted_at,
                "archived": t.archived,
                "message_count": t.message_count,
                "bytes": t.bytes,
                "pinned": t.pinned,
            }
            for t in states.trashed_contexts(store)
        ],
    }


LIFECYCLE_ACTIONS = ("archive", "unarchive", "pin", "unpin")
"""The writes that change a context's lifecycle state (on a :class:`Lifecycle` store)."""


def change_state(store: Store, context: ContextId, action: str) -> None:
    """Archive, unarchive, pin or unpin ``context`` through the store's :class:`Lifecycle`.

    Raises:
        BadRequest: an unknown action, or a store without lifecycle states.
        ContextNotFound: no such context (or, for unarchive, none archived of that id).
    """
    if not isinstance(store, Lifecycle):
        raise BadRequest("this store has no lifecycle states (archive, trash, pins)")
    if action == "archive":
        done = states.archive_context(store, context) is not None
    elif action == "unarchive":
        done = states.unarchive_context(store, context)
    elif action in ("pin", "unpin"):
        done = states.pin_context(store, context, action == "pin")
    else:
        raise BadRequest(f"action must be one of {', '.join(LIFECYCLE_ACTIONS)}")
    if not done:
        if action == "unarchive":
            raise ContextNotFound(f"{context.display} is not archived")
        raise ContextNotFound(f"no such context: {context.display}")


def restore_trashed(store: Store, trash_id: str) -> ContextId:
    """Bring a trash entry back in the state it was in; the context it is again.

    Raises:
        BadRequest: a store without a trash. NotInTrash: no such entry.
        ContextExists: its id is in use again.
    """
    if not isinstance(store, Lifecycle):
        raise BadRequest("this store has no trash")
    return ContextId.parse(states.restore_trashed(store, trash_id).context)


def signature(store: Store, context: ContextId | None, activity: Activity | None = None) -> str:
    """A cheap fingerprint that changes when the context (or, with None, any context) is
    written to: what the live view polls. With ``activity``, an indexed store's signatures
    are read (as the index stands while it catches up, see :class:`CatchUp`)."""
    if context is not None:
        head = store.get_head(context)
        if head is None:
            return "gone"
        return f"{head.segment_id}:{store.next_seq(head.session_id, head.segment_id)}"
    source = derived.listing(store)
    if activity is not None and isinstance(source, Listing):
        found = activity.listing(store)
        legacy = tuple(map(signature_of, found.legacy))
        return f"{hash(tuple(found.native))}:{hash(legacy)}:{found.backlog}"
    if isinstance(source, Listing):
        try:
            rows = source.list_contexts_fast()
            latest = max((r.last_active for r in rows), default="")
            return f"{len(rows)}:{sum(r.message_count for r in rows)}:{latest}"
        except StoreError:
            pass
    heads = store.list_contexts()
    return f"{len(heads)}:{max((h.updated_at for h in heads), default='')}:" + ":".join(
        str(store.next_seq(h.session_id, h.segment_id)) for h in heads
    )
