"""What the dashboard shows, computed from the store, sessions and contexts layers.

Plain functions returning JSON-ready dicts: the pages render them and the JSON API returns
them, so a page never shows what the API cannot give. Every listing figure is one read of the
store's derived index (:func:`terrarium.contexts.read_index`), restoring no session.
"""

from __future__ import annotations

import base64
import binascii
import builtins
import datetime
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from terrarium import RestoredState, contexts, lifecycle, sessions, states
from terrarium.errors import ContextNotFound, InvalidContextId, SegmentNotFound
from terrarium.index import Reader, Sums, sort_key
from terrarium.index._listing import ContextSummary, ListingQuery
from terrarium.model import DATE_RE, ContextId, SegmentId, chat_view, item_label, item_text
from terrarium.states import Records
from terrarium.stores.base import Lifecycle, SegmentRead, Store

SORTS = ("last_active", "created", "messages", "tokens")
"""The orders the sessions list offers, each newest or largest first."""

STATES = ("hot", "archived", "all")
"""Which contexts the sessions list shows, on a :class:`Lifecycle` store."""

PAGE_SIZE = 50
"""Contexts per page of the sessions list."""

MESSAGES_PER_PAGE = 200
"""Messages per page of a transcript."""

MOST_ACTIVE = 10
"""Contexts the overview lists as the most active: the most messages (ties by id)."""

TOKEN_KEYS = ("prompt_tokens", "completion_tokens", "cached_tokens")


class BadRequest(ValueError):
    """A query parameter that cannot be used (a bad cursor, sort or date)."""


# --------------------------------------------------------------------------- listing


BUILD_STEP = 0.2
"""Seconds a page spends on a first build of the store's index before it shows what it holds."""


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
    if value and not DATE_RE.fullmatch(value):
        raise BadRequest(f"{what} must be a date YYYY-MM-DD, not {value[:40]!r}")
    return value or None


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
) -> dict[str, Any]:
    """One page of contexts, filtered and sorted, and the cursor of the next page.

    ``since``/``until`` bound the day last active (inclusive); ``text`` is a case-insensitive
    substring of the context id. Archived and legacy rows have no ``tokens`` (0 in its order).
    """
    if state not in STATES:
        raise BadRequest(f"state must be one of {', '.join(STATES)}, not {state[:40]!r}")
    if sort not in SORTS:
        raise BadRequest(f"sort must be one of {', '.join(SORTS)}, not {sort[:40]!r}")
    if not 1 <= limit <= 1000:
        raise BadRequest("limit must be between 1 and 1000")
    after = decode_cursor(cursor) if cursor else None  # of the sort's order: page_statement
    since, until = _check_date(since, "since"), _check_date(until, "until")
    # One row more than the page, to know if another follows.
    query = ListingQuery(sort, after, limit + 1, type, text or None, since, until)
    life = store if isinstance(store, Lifecycle) else None
    records = life.session_records() if life else None  # one read for the rows and pins
    rows, types = contexts.read_index(
        store, lambda r: (r.page(query, state), r.types(state)), records, budget=BUILD_STEP
    )
    page, more = rows[:limit], len(rows) > limit
    pinned = states.pinned_contexts(life, records=records) if life else frozenset()
    last = sort_key(sort)(page[-1]) if page else None
    return {
        # Each row with its state, pin and tokens (none for an archived or legacy row).
        "contexts": [
            {**r.to_json(pinned), "tokens": r.tokens if r.state == "hot" else None} for r in page
        ],
        "next_cursor": encode_cursor(last) if more and last else None,
        "sort": sort,
        "state": state,
        "types": types,
        "lifecycle": life is not None,
    }


# --------------------------------------------------------------------------- overview


def _folder(store: Store) -> bool:
    """Whether the store is a folder of segment files (its bytes are the index's to sum)."""
    return isinstance(getattr(store, "root", None), Path)


def disk_bytes(store: Store, segments: int, records: Records | None) -> int | None:
    """Bytes the store takes on disk; None for a database server or memory. A folder's: its
    hot segment files as the index read them (``segments``), and its frozen sessions'
    compressed files, as their ``records`` say."""
    path = getattr(store, "path", None)
    if isinstance(path, Path) and path.is_file():
        extra = [path.with_name(path.name + s) for s in ("-wal", "-shm")]
        return sum(os.stat(p).st_size for p in (path, *extra) if p.exists())
    if not _folder(store):
        return None
    frozen = states.frozen_bytes(store, records=records) if isinstance(store, Lifecycle) else 0
    return segments + frozen


RANGES = {"7d": 7, "30d": 30, "90d": 90, "all": None}
"""The chart's ranges: the last N calendar days up to today (UTC), or every active day."""

FILL_DAYS = 400
"""Longest span whose days without activity are drawn as empty bars."""


def chart_range(
    range: str | None, start: str | None, end: str | None, active: Iterable[str], today: str
) -> dict[str, Any]:
    """The days the chart shows: ``{"range", "from", "to", "days"}``.

    ``start``/``end`` (either may be missing) win over ``range`` (default 30d). ``days`` lists
    every date of a span up to :data:`FILL_DAYS` long, else only the active ones.
    """
    start, end = _check_date(start, "from"), _check_date(end, "to")
    dates = sorted(d for d in active if DATE_RE.fullmatch(d))
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
    day = datetime.date.fromisoformat(first)
    length = (datetime.date.fromisoformat(last) - day).days + 1
    if length <= FILL_DAYS:  # builtins.range: the parameter hides it
        days = [(day + datetime.timedelta(n)).isoformat() for n in builtins.range(length)]
    else:
        days = [d for d in dates if first <= d <= last]
    return {"range": name, "from": first, "to": last, "days": days}


def lifecycle_counts(store: Store, records: Records | None) -> dict[str, int] | None:
    """How many contexts are archived, trashed and pinned, per ``records``; None without."""
    if not isinstance(store, Lifecycle):
        return None
    return {
        "archived": len(states.archived_contexts(store, records=records)),
        "trashed": len(states.trashed_contexts(store, records=records)),
        "pinned": len(states.pinned_contexts(store, records=records)),
    }


def overview(
    store: Store,
    *,
    range: str | None = None,
    start: str | None = None,
    end: str | None = None,
) -> dict[str, Any]:
    """The overview's figures: the index's sums over the hot contexts, and lifecycle counts.

    During a first build they cover what the index holds so far: ``indexing`` says how many
    sessions are left.
    """
    top = ListingQuery(sort="messages", limit=MOST_ACTIVE)
    folder = _folder(store)
    # The lifecycle records, read once for the archived rows, counts and frozen bytes.
    records = store.session_records() if isinstance(store, Lifecycle) else None

    def read(r: Reader) -> tuple[Sums, list[ContextSummary], int, int]:
        return r.sums(), r.page(top), r.left, r.segment_bytes() if folder else 0

    sums, most_active, left, segments = contexts.read_index(store, read, records, budget=BUILD_STEP)
    found = contexts.totals(sums)
    names = (*TOKEN_KEYS, "calls", "estimated_calls")
    models = {model: {n: getattr(u, n) for n in names} for model, u in sums.models.items()}
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    chosen = chart_range(range, start, end, sums.per_day, today)
    return {
        "totals": {
            **{name: found[name] for name in ("contexts", "messages", "turns", "damaged")},
            **{name: found["usage"][name] for name in (*TOKEN_KEYS, "estimated_calls")},
            "bytes_on_disk": disk_bytes(store, segments, records),
        },
        "indexing": left,
        "lifecycle": lifecycle_counts(store, records),
        "per_type": found["by_type"],
        "range": {k: chosen[k] for k in ("range", "from", "to")},
        "messages_per_day": [
            {"date": d, "by_type": dict(sorted(sums.per_day.get(d, {}).items()))}
            for d in chosen["days"]
        ],
        "tokens_per_model": dict(sorted(models.items())),
        "most_active": [row.to_json() for row in most_active],
    }


# --------------------------------------------------------------------------- one context


def parse_context(text: str | None) -> ContextId:
    """The context a request names (BadRequest: none given)."""
    if not text:
        raise BadRequest("c, the session id (type:name), is required")
    try:
        return ContextId.parse(text)
    except InvalidContextId as exc:
        reason = str(exc).removeprefix("invalid context id ")
        raise InvalidContextId(f"invalid session id {reason}") from None


def fork_tree(store: Store, context: ContextId) -> dict[str, Any]:
    """The context's segments, depth-first (each with its ``depth`` below its root, siblings
    oldest first) with their origins, and its head."""
    head = store.get_head(context)
    if head is None:
        raise contexts.not_found(context)
    reads = sessions.tree_reads(store, head.session_id)
    known = {str(segment_id) for segment_id, _, _ in reads}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for segment_id, read, salvaged_into in reads:
        header = read.header if read is not None else {}
        origin = header.get("origin") or {"kind": "root" if read is not None else "salvaged"}
        parent = origin.get("parent")
        children.setdefault(parent if parent in known else None, []).append(
            {
                "segment_id": str(segment_id),
                "created_at": header.get("ts"),
                "origin": origin.get("kind", "root"),
                "parent": parent,
                "at_seq": origin.get("at_seq"),
                "source": origin.get("source"),
                "head": segment_id == head.segment_id,
                "salvaged_into": str(salvaged_into) if salvaged_into is not None else None,
            }
        )
    ordered: list[dict[str, Any]] = []
    stack = [(s, 0) for s in reversed(children.get(None, []))]
    while stack:
        s, depth = stack.pop()
        ordered.append({**s, "depth": depth})
        stack.extend((c, depth + 1) for c in reversed(children.get(s["segment_id"], [])))
    return {"session_id": str(head.session_id), "head": str(head.segment_id), "segments": ordered}


def _message(
    message: sessions.Message, position: int, failed: dict[str, Any] | None
) -> dict[str, Any]:
    # A Responses item is shown as the Chat message it stands for (model.chat_view); a kind
    # with no Chat form keeps its own fields, labelled by its type, with whatever text it has.
    logged, usage = message.item, message.usage
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
        "name": _string(item, "name"),
        "text": text,
        "reasoning": _string(item, "reasoning_content"),
        "tool_calls": calls,
        "tool_call_id": _string(item, "tool_call_id"),
        "seq": message.seq,
        "ts": message.ts,
        "segment_id": message.segment_id,
        "summary": message.summary,
        "usage": None
        if usage is None
        else {
            "model": usage.get("model"),
            **{key: usage.get(key, 0) for key in TOKEN_KEYS},
            "estimated": usage.get("estimated"),
        },
        "position": position,  # the page's anchor #m{position}, search hits' ``message``
        # A failed run's error; on its last message, the partial reply.
        "failed": None
        if failed is None
        else {"error": str(failed["error"] or ""), "partial": failed.get("partial")},
    }


def _string(item: Mapping[str, Any], key: str) -> str | None:
    value = item.get(key)
    return value if isinstance(value, str) else None


def _messages(
    reads: list[SegmentRead], offset: int, limit: int, state: RestoredState
) -> tuple[int, list[dict[str, Any]]]:
    """How many messages the lineage holds, and those of one page with their usage and runs."""
    found = sessions.messages(reads)
    page = [
        _message(found[index], index, state.failure(index))
        for index in range(offset, min(offset + limit, len(found)))
        if isinstance(found[index].item, Mapping)
    ]
    return len(found), page


def transcript(
    store: Store,
    context: ContextId,
    *,
    segment: str | None = None,
    offset: int = 0,
    limit: int = MESSAGES_PER_PAGE,
) -> dict[str, Any]:
    """One page of a context's transcript, its stats, its fork tree and its forks."""
    if offset < 0 or not 1 <= limit <= 5000:
        raise BadRequest("offset must be >= 0 and limit between 1 and 5000")
    tree = fork_tree(store, context)
    head = store.get_head(context)
    assert head is not None  # fork_tree raised otherwise
    forks = contexts.read_index(  # hot contexts only
        store, lambda r: r.forks_of(str(context)), budget=BUILD_STEP, sync=False
    )
    tree["forks"] = {"contexts": forks}
    segment_id = head.segment_id
    if segment:
        if segment not in {s["segment_id"] for s in tree["segments"]}:
            raise SegmentNotFound(f"no segment '{segment[:80]}' in '{context.display}'")
        segment_id = SegmentId(segment)
    reads = sessions.lineage(store, head.session_id, segment_id)
    state = sessions.collect_state(line for read in reads for line in (read.header, *read.entries))
    total, messages = _messages(reads, offset, limit, state)
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
    """The context's state and pin, from its own record alone; None without lifecycle."""
    if not isinstance(store, Lifecycle):
        return None
    record = states.context_record(store, context)
    return {
        "state": "archived" if "archived" in record else "hot",
        "pinned": bool(record.get("pinned")),
    }


def trash(store: Store) -> dict[str, Any]:
    """The store's trash, most recently deleted first (empty for a store without one)."""
    if not isinstance(store, Lifecycle):
        return {"lifecycle": False, "trash": []}
    found = [msgspec.structs.asdict(t) for t in states.trashed_contexts(store)]
    for entry in found:  # the API names it as every other page does
        entry["context_id"] = entry.pop("context")
    return {"lifecycle": True, "trash": found}


LIFECYCLE_ACTIONS = ("archive", "unarchive", "pin", "unpin")
"""The writes that change a context's lifecycle state (on a :class:`Lifecycle` store)."""


def change_state(store: Store, context: ContextId, action: str) -> None:
    """Archive, unarchive, pin or unpin ``context`` through the store's :class:`Lifecycle`."""
    if not isinstance(store, Lifecycle):
        raise BadRequest("this store has no lifecycle states (archive, trash, pins)")
    if action == "archive":
        done = lifecycle.archive_context(store, context) is not None
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
    """Bring a trash entry back in the state it was in; the context it is again."""
    if not isinstance(store, Lifecycle):
        raise BadRequest("this store has no trash")
    return ContextId.parse(states.restore_trashed(store, trash_id).context)


def signature(store: Store, context: ContextId | None) -> str:
    """What the live view polls: changes when the context (None: any) is written to."""
    if context is not None:
        head = store.get_head(context)
        if head is None:
            return "gone"
        return f"{head.segment_id}:{store.next_seq(head.session_id, head.segment_id)}"
    return contexts.read_index(store, lambda r: r.fingerprint(), budget=BUILD_STEP)
