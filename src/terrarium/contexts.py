"""Whole contexts, in the log or only in a legacy file: list, stats, fork, clear, delete.

What ``MultiContextManager`` and the command line both do to a context lives here, once, so the
command line needs no manager (nor the ``openai`` client). The manager passes in its cached,
possibly unsaved state of a context (``state``/``current``), which is newer than the log. Rows
keep the context id as the string the store holds, so a listing of 10k contexts parses none.
Writes take the context's lock and import its legacy file first.

Usage::

    listing = contexts.list_contexts(store, type="cli")
    contexts.fork_context(store, ContextId.parse("cli:a"), ContextId.parse("cli:b"))
"""

from __future__ import annotations

import functools
import logging
import operator
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from terrarium import index, legacy, sessions, states
from terrarium.errors import ContextExists, ContextNotFound, IndexUnavailable, StoreError
from terrarium.index._listing import ContextSummary, Listing
from terrarium.model import (
    ContextId,
    LoggedItem,
    RestoredState,
    UsageTotals,
    misleading_chars,
)
from terrarium.stores.base import Lifecycle, Store, context_lock

if TYPE_CHECKING:
    from terrarium.index import Reader, SearchIndex, Sums

log = logging.getLogger(__name__)
_T = TypeVar("_T")


class ContextListing(msgspec.Struct, frozen=True):
    """Every context of a store, and the legacy files that could not be used."""

    rows: list[ContextSummary]
    """Grouped by type (alphabetical), most recently active first within a type."""
    problems: tuple[legacy.LegacyProblem, ...] = ()
    """Legacy files left out, each with the reason."""


def check_new_name(store: Store, context: ContextId) -> None:
    """Refuse a name no new context may take, unless ``store`` holds the context already."""
    if misleading_chars(context.name) and store.get_head(context) is None:
        if legacy.find(store, context) is None:
            context.check_new()


def not_found(context: ContextId | str, where: str | None = None) -> ContextNotFound:
    """The error for a context that neither the log nor a legacy file holds."""
    shown = context.display if isinstance(context, ContextId) else context
    return ContextNotFound(f"no session '{shown}'" + (f" in {where}" if where else ""))


def list_contexts(
    store: Store,
    *,
    type: str | None = None,
    restore: Callable[[ContextId], RestoredState] | None = None,
) -> ContextListing:
    """Every context of ``store`` (of one ``type``), legacy files beside it included.

    ``restore`` reads a context when the store has no usable listing index.
    """
    rows = _native_rows(store, type, restore)
    found = legacy.listing(store)
    rows += legacy_rows(store, found, (row.context for row in rows), type)
    rows.sort(key=operator.attrgetter("last_active"), reverse=True)
    rows.sort(key=operator.attrgetter("type"))
    return ContextListing(rows, found.problems)


def legacy_rows(
    store: Store, found: legacy.LegacyListing, hot: Iterable[str], type: str | None = None
) -> list[ContextSummary]:
    """The rows of ``found`` (of one ``type``) that the log does not hide: a context in the log,
    ``hot`` (its hot contexts) or archived, hides its legacy file."""
    if not found.sessions:
        return []
    native = set(hot)
    if isinstance(store, Lifecycle):
        native |= {a.context for a in states.archived_contexts(store)}
    return [r for r in found.sessions if r.context not in native and type in (None, r.type)]


def listing_index(store: Store, *, walked: bool = False) -> SearchIndex:
    """The store's derived index (or ``walked`` one), told of its legacy and archived rows."""
    found = index.walked(store) if walked else index.of_any(store)
    if found.others is None:  # a weak reference: a walked index is kept as long as the store
        found.others = functools.partial(_others_of, weakref.ref(store))
    return found


def read_index(
    store: Store,
    read: Callable[[Reader], _T],
    records: states.Records | None = None,
    *,
    budget: float | None = None,
    sync: bool = True,
) -> _T:
    """``read`` on the store's derived index, or a walked one when it cannot be brought up to
    date (a read-only store whose index is behind or missing); ``records``: the store's lifecycle
    records, read already. ``budget`` and ``sync``: as ``SearchIndex.read`` takes them."""
    others = other_rows(store, records=records) if sync else None
    try:
        return listing_index(store).read(read, budget=budget, others=others, sync=sync)
    except IndexUnavailable as exc:
        log.warning("%s; reading an index of the store in a temporary folder instead", exc)
        walked = listing_index(store, walked=True)
        return walked.read(read, budget=budget, others=others, sync=sync)


def totals(sums: Sums) -> dict[str, Any]:
    """The totals over the hot contexts, as ``stats --json`` and the dashboard give them.

    A damaged session counts what of it can be read. A legacy file counts in contexts and
    messages only: the seed's format has no usage and no turns.
    """
    fields = UsageTotals.__struct_fields__
    usage = {key: sum(getattr(u, key) for u in sums.models.values()) for key in fields}
    return {
        "contexts": sum(n for n, _ in sums.per_type.values()),
        "messages": sum(m for _, m in sums.per_type.values()),
        "turns": sums.turns,
        "legacy": sums.legacy,
        "damaged": len(sums.damaged),
        "by_type": {k: {"contexts": n, "messages": m} for k, (n, m) in sums.per_type.items()},
        "usage": usage,
    }


def _others_of(store: weakref.ref[Store]) -> list[ContextSummary]:
    found = store()
    return other_rows(found) if found is not None else []


def other_rows(store: Store, *, records: states.Records | None = None) -> list[ContextSummary]:
    """The legacy files beside ``store`` and its archived contexts, the rows the index has no
    session for (``records``: the store's lifecycle records, read already)."""
    rows = list(legacy.listing(store).sessions)
    if isinstance(store, Lifecycle):
        rows += archived_rows(store, records=records)
    return rows


def archived_rows(
    store: Lifecycle, type: str | None = None, *, records: states.Records | None = None
) -> list[ContextSummary]:
    """The listing rows of the archived contexts (of one ``type``), for ``list`` and the
    dashboard alike (``records``: the store's lifecycle records, read already)."""
    rows = []
    for archived in states.archived_contexts(store, type, records=records):
        head = None
        if not archived.created_at:  # a record written before it kept the time: the head has it
            head = store.get_head(ContextId.parse(archived.context))
        rows.append(archived_row(archived, head.created_at if head is not None else None))
    return rows


def archived_row(archived: states.ArchivedContext, created_at: str | None = None) -> ContextSummary:
    """The listing row of an archived context (``created_at``: its head's, where its record
    has none; else its date)."""
    created = created_at or archived.created_at or archived.date
    found = (archived.message_count, archived.last_active, created)
    return ContextSummary(
        archived.context, archived.date, *found, archived.last_active, state="archived"
    )


def _native_rows(
    store: Store,
    type: str | None,
    restore: Callable[[ContextId], RestoredState] | None,
) -> list[ContextSummary]:
    """The log's contexts: from the store's listing index, else by restoring each."""
    source = index.listing(store)
    if isinstance(source, Listing):
        try:
            return list(source.list_contexts_fast(type))
        except IndexUnavailable as exc:
            log.warning("%s; listing from the session files instead", exc)
    read = restore or (lambda context: sessions.restore(store, context))
    rows: list[ContextSummary] = []
    for head in store.list_contexts():
        context = ContextId.parse(head.context)
        if type is not None and context.type != type:
            continue
        ids = (head.updated_at, str(head.session_id), str(head.segment_id))
        try:
            state = read(context)
        except ContextNotFound:
            continue  # deleted meanwhile
        except StoreError as exc:  # damaged: listed, with what is wrong
            problem = " ".join(str(exc).split())
            found = (head.date, 0, head.updated_at, head.created_at)
            rows.append(ContextSummary(head.context, *found, *ids, problem=problem))
            continue
        found = (head.date, len(state.history), state.last_active, head.created_at)
        rows.append(ContextSummary(head.context, *found, *ids))
    return rows


def get_stats(
    store: Store, context: ContextId, *, state: RestoredState | None = None
) -> dict[str, Any]:
    """Statistics of one context (of a legacy JSON file, read without importing it).

    ``state``: the context's state if the caller holds a newer one than the log.
    ContextNotFound if there is none; LegacyFormatError or OSError if only a legacy file holds
    it and it cannot be read.
    """
    head = store.get_head(context)
    if head is None and state is None:
        copy = legacy.read(store, context)
        if copy is None:
            raise not_found(context)
        state = sessions.restore(copy.store, context)
        data = stats_of(context, state, state.created_at, 1, is_legacy=True)
        row = legacy.listing(store).by_context.get(str(context))
        if row is not None and row.legacy_path == str(copy.path):  # times as the file wrote
            data["created_at"], data["last_active"] = row.created_at, row.last_active  # them
        return data
    if state is None:
        state = sessions.restore(store, context)
    created = head.created_at if head is not None else state.created_at
    segments = len(store.list_segments(state.session_id)) if head is not None else 1
    return stats_of(context, state, created, segments, is_legacy=False)


def stats_of(
    context: ContextId, state: RestoredState, created: str, segments: int, *, is_legacy: bool
) -> dict[str, Any]:
    """The dict :func:`get_stats` returns, for a restored state."""
    return {
        "context_id": str(context),
        "session_id": context.name,
        "context_type": context.type,
        "message_count": len(state.history),
        "turns": state.turns,
        "created_at": created,
        "last_active": state.last_active,
        "session_date": created[:10],
        "system_prompt": state.system_prompt,
        "usage": msgspec.structs.asdict(state.usage),  # every field, zeros included
        "last_run": state.last_run.status if state.last_run else None,
        "last_error": state.last_run.error if state.last_run else None,
        "tree_session_id": str(state.session_id),
        "segment_id": str(state.segment_id),
        "segments": segments,
        "legacy": is_legacy,
    }


Current = Callable[[ContextId], RestoredState | None]
"""The context's state under its lock, its legacy file imported; None if it has none."""


def current_state(store: Store, context: ContextId) -> RestoredState | None:
    """The default :data:`Current`: the log's state, after importing a legacy file."""
    legacy.import_legacy(store, context)
    if store.get_head(context) is None:
        return None
    return sessions.restore(store, context)


def clear_context(store: Store, context: ContextId, *, current: Current | None = None) -> None:
    """Empty the context's history (kept in its session tree); a legacy file is imported first.

    ContextNotFound if there is none.
    """
    with context_lock(store, context):
        state = (current or (lambda c: current_state(store, c)))(context)
        if state is None:
            raise not_found(context)
        sessions.clear_segment(store, state, context=context)


def rewind_context(
    store: Store, context: ContextId, n: int = 1, *, current: Current | None = None
) -> list[LoggedItem]:
    """Drop and return the last ``n`` history items, oldest first; a legacy file imported first.

    ContextNotFound if there is none; InvalidEntry if ``n`` is larger than the history.
    """
    with context_lock(store, context):
        if (current or (lambda c: current_state(store, c)))(context) is None:
            raise not_found(context)
    return sessions.rewind(store, context, n)


def fork_context(
    store: Store,
    source: ContextId,
    target: ContextId,
    at: int | None = None,
    *,
    current: Current | None = None,
) -> None:
    """Create context ``target`` from ``source``'s history (up to entry ``at``).

    ContextNotFound if there is no ``source``; ContextExists if ``target`` exists, in the log or
    as a legacy file.
    """
    if store.get_head(target) is not None or legacy.find(store, target) is not None:
        raise ContextExists(f"session '{target.display}' already exists")
    with context_lock(store, source):
        if (current or (lambda c: current_state(store, c)))(source) is None:
            raise not_found(source)
        sessions.fork_context(store, source, target, at_seq=at)
