"""A context's states (hot, archived, trashed, pinned) and the moves between them, written once
over the :class:`~terrarium.stores.base.SessionStates` primitives every backend has.

A context's state lives in its session's *state record* (``archived``, ``pinned``,
``trashed``, ``purging``; docs/architecture.md, "Lifecycle"), changed only by compare-and-set
in the same atomic step as its move. Restore (attach, then drop ``trashed``) and purge (mark,
then delete) are two steps each: :func:`finish_lifecycle` completes both. Usage::

    states.archive_context(store, ContextId.parse("cli:old"))
    states.restore_trashed(store, states.trashed_contexts(store)[0].trash_id)
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from terrarium import codec, legacy
from terrarium.errors import (
    ConflictError,
    ContextExists,
    ContextNotFound,
    CorruptLog,
    NotInTrash,
    SegmentNotFound,
    SessionAttached,
)
from terrarium.model import ContextId, SessionId, new_segment_id, utc_now
from terrarium.sessions import restore_by_segment
from terrarium.stores.base import (
    ATTEMPTS,
    Lifecycle,
    PodMetadata,
    SessionRecord,
    Store,
    wake_session,
)

#: The store's records (``SessionRecord``), as :meth:`SessionStates.session_records` gives them.
Records = Sequence[SessionRecord]

__all__ = [
    "ArchivedContext",
    "TrashedContext",
    "archive_context",
    "archived_contexts",
    "context_record",
    "delete_context",
    "finish_lifecycle",
    "frozen_bytes",
    "is_archived",
    "log_bytes",
    "pin_context",
    "pinned_contexts",
    "purge_context",
    "purge_trashed",
    "restore_trashed",
    "trashed_contexts",
    "unarchive_context",
    "unfinished_lifecycle",
]


class ArchivedContext(msgspec.Struct, frozen=True):
    """One archived context, as the archive lists it (nothing is decompressed to list it)."""

    context: str
    """The context id, ``type:name``."""
    date: str
    """The creation date, ``YYYY-MM-DD``."""
    archived_at: str
    """When it was archived (UTC, RFC 3339)."""
    last_active: str
    """Timestamp of the head segment's last entry when it was archived."""
    message_count: int
    """History items in the head segment's restored state when it was archived."""
    hot_bytes: int
    """Bytes its log took in the hot store."""
    archived_bytes: int
    """Bytes it takes in the archive (compressed)."""
    created_at: str = ""
    """When the context was created (UTC, RFC 3339); empty in a record written before it was
    kept (its head has it)."""
    pinned: bool = False


class TrashedContext(msgspec.Struct, frozen=True):
    """One deleted context waiting in the trash, newest first in listings."""

    trash_id: str
    """Names this trash entry (a context id can be deleted, recreated and deleted again)."""
    context: str
    """The context id it had."""
    date: str
    """Its creation date, ``YYYY-MM-DD``."""
    deleted_at: str
    """When it was deleted (UTC, RFC 3339)."""
    archived: bool
    """It was archived when deleted; a restore puts it back into the archive."""
    message_count: int | None
    """None: its log is damaged (``fsck`` names where)."""
    bytes: int | None
    """Bytes it takes in the trash; None: its log is damaged."""
    pinned: bool = False


def archive_context(
    store: Lifecycle, context: ContextId, *, spare_pinned: bool = False
) -> ArchivedContext | None:
    """Freeze a hot context's session; None if there is no hot context of that id, or, with
    ``spare_pinned`` (an age or a policy chose it), if it is pinned: checked in the freeze's
    compare-and-set, so a pin that lands meanwhile keeps it hot."""
    for _ in range(ATTEMPTS):
        found = _head_state(store, context)
        if found is None or "archived" in found[1] or (spare_pinned and "pinned" in found[1]):
            return None
        head, state = found
        try:
            summary = {**_summary(store, head), "archived_at": utc_now()}
            stored = store.freeze_session(
                head.session_id,
                expected=state,
                state={**state, "archived": summary},
                along=legacy.files(store, context),  # the context's legacy files go with it
            )
        except (ConflictError, ContextNotFound, SegmentNotFound):  # changed meanwhile
            continue
        return _archived(str(context), stored)
    raise ConflictError(f"{context} kept changing while it was being archived")


def unarchive_context(store: Lifecycle, context: ContextId) -> bool:
    """Thaw an archived context's session; False if it is not archived."""
    found = _head_state(store, context)
    if found is None or "archived" not in found[1]:
        return False
    return wake_session(store, found[0].session_id)


def is_archived(store: Lifecycle, context: ContextId) -> bool:
    """Whether the context exists and is archived."""
    return "archived" in context_record(store, context)


def context_record(store: Lifecycle, context: ContextId) -> dict[str, Any]:
    """The record of the context's session (``archived``, ``pinned``...; ``{}`` if there is
    no such context): one record read, where :func:`pinned_contexts` reads them all."""
    found = _head_state(store, context)
    return {} if found is None else found[1]


def archived_contexts(
    store: Lifecycle, type: str | None = None, *, records: Records | None = None
) -> list[ArchivedContext]:
    """Every archived context, optionally of one type, sorted by context id (``records``:
    the store's, read already)."""
    found = [
        _archived(r.owner, r.state)
        for r in _records(store, records)
        if r.owner is not None and "archived" in r.state
        if type is None or r.owner.split(":", 1)[0] == type
    ]
    return sorted(found, key=lambda a: ContextId.parse(a.context))


def delete_context(store: Lifecycle, context: ContextId) -> bool:
    """Move the context to the trash (its session detached, with its record); False if none."""
    for _ in range(ATTEMPTS):
        found = _head_state(store, context)
        if found is None:
            return False
        head, state = found
        try:
            size = state["cold"]["cold_bytes"] if "cold" in state else log_bytes(store, head)
            counted: tuple[int | None, int | None] = _message_count(store, head), int(size)
        except SegmentNotFound:  # purged meanwhile
            continue
        except CorruptLog:  # deleted all the same (restorable, for fsck to mend), uncounted
            counted = None, None
        entry = {
            "trash_id": str(new_segment_id()),  # a UUIDv7: time-ordered
            "context": str(context),
            "date": head.date,
            "deleted_at": utc_now(),
            "segment_id": str(head.segment_id),
            "message_count": counted[0],
            "bytes": counted[1],
        }
        # A restore that overtook a purge leaves its mark until its clean-up: not this entry's.
        trashed = {**_without(state, "purging"), "trashed": entry}
        try:
            store.detach_context(
                context, head.session_id, expected=state, state=trashed, segment_id=head.segment_id
            )
        except (ConflictError, ContextNotFound, SegmentNotFound):  # purged meanwhile, too
            continue
        _seal(store, head.session_id, trashed)
        return True
    raise ConflictError(f"{context} kept changing while it was being deleted")


def trashed_contexts(store: Lifecycle, *, records: Records | None = None) -> list[TrashedContext]:
    """Everything in the trash, most recently deleted first (``records``: read already)."""
    entries = [_trashed(r.state) for r in _records(store, records) if _in_trash(r)]
    return sorted(entries, key=lambda e: (e.deleted_at, e.trash_id), reverse=True)


def restore_trashed(
    store: Lifecycle, trash_id: str, *, as_context: ContextId | None = None
) -> PodMetadata:
    """Attach a trashed session again (as ``as_context`` if given), in its state.

    NotInTrash if no trash entry has that id; ContextExists if the id it would take is in use.
    """
    record = _find_trashed(store, trash_id)
    session_id, state, entry = record.session_id, record.state, record.state["trashed"]
    target = ContextId.parse(as_context if as_context is not None else entry["context"])
    if "cold" in state and "archived" not in state:
        # Hot before its delete: thawed first, so that no kill leaves it attached but
        # frozen (out of every listing); a thawed entry still in the trash is resealed.
        try:
            store.thaw_session(session_id, expected=state, state=_without(state, "cold"))
        except ConflictError:  # restored or purged meanwhile: look again
            return restore_trashed(store, trash_id, as_context=as_context)
    try:
        head = store.attach_context(target, session_id, uuid.UUID(entry["segment_id"]))
    except SessionAttached:
        raise NotInTrash(f"nothing in the trash has the id {trash_id!r}") from None
    except ContextExists:
        if store.session_owner(session_id) is not None:  # another restore took it first
            raise NotInTrash(f"nothing in the trash has the id {trash_id!r}") from None
        _seal(store, session_id, store.session_state(session_id))
        raise
    _reopen(store, session_id, entry["trash_id"])
    return head


def purge_trashed(store: Lifecycle, trash_id: str) -> bool:
    """Delete a trash entry for ever; False if there is none of that id."""
    try:
        record = _find_trashed(store, trash_id)
    except NotInTrash:
        return False
    try:
        store.set_session_state(
            record.session_id, {**record.state, "purging": True}, expected=record.state
        )
    except ConflictError:
        return purge_trashed(store, trash_id)  # changed meanwhile: look again
    try:
        store.delete_session(record.session_id)  # False: a repair finished it meanwhile
    except SessionAttached:  # restored meanwhile: the restore has the last word
        return False
    return True


def purge_context(store: Lifecycle, context: ContextId) -> bool:
    """Delete a hot or archived context for ever, bypassing the trash; False if absent."""
    for _ in range(ATTEMPTS):
        found = _head_state(store, context)
        if found is None:
            return False
        head, state = found
        try:
            store.detach_context(
                context, head.session_id, expected=state, state={**state, "purging": True}
            )
        except (ConflictError, ContextNotFound, SegmentNotFound):  # purged meanwhile, too
            continue
        store.delete_session(head.session_id)
        return True
    raise ConflictError(f"{context} kept changing while it was being purged")


def pin_context(store: Lifecycle, context: ContextId, pinned: bool = True) -> bool:
    """Pin (or unpin) a hot or archived context; False if there is no such context."""
    found = _head_state(store, context)
    if found is None:
        return False
    try:
        _set_key(store, found[0].session_id, "pinned", True if pinned else _DROP)
    except SegmentNotFound:  # purged meanwhile
        return False
    return True


def pinned_contexts(store: Lifecycle, *, records: Records | None = None) -> frozenset[str]:
    """The ids of the pinned contexts, hot or archived, not trashed (``records``: read
    already)."""
    return frozenset(r.owner for r in _records(store, records) if r.owner and r.state.get("pinned"))


def unfinished_lifecycle(store: Lifecycle) -> list[SessionRecord]:
    """The records of deletes, restores and purges that were killed half way."""
    return [r for r in store.session_records() if _unfinished(r)]


def finish_lifecycle(store: Lifecycle) -> int:
    """Complete every delete, restore and purge that was killed half way; how many."""
    done = 0
    for record in unfinished_lifecycle(store):
        trashed = record.state.get("trashed") or {}
        try:
            if record.owner is not None and trashed:  # a restore: attached, still trashed
                _reopen(store, record.session_id, trashed["trash_id"])
            elif record.owner is not None:  # a purge that a restore overtook
                _set_key(store, record.session_id, "purging", _DROP)
            elif record.state.get("purging"):  # a purge: detached and marked
                store.delete_session(record.session_id)
            else:  # a delete: detached, not yet frozen
                _seal(store, record.session_id, record.state)
        except (SegmentNotFound, SessionAttached, ConflictError):
            continue  # purged, restored or moved meanwhile: that move has the last word
        done += 1
    return done


def _head_state(store: Lifecycle, context: ContextId) -> tuple[PodMetadata, dict[str, Any]] | None:
    """The context's head and its session's record, read together; None if no such context."""
    for _ in range(ATTEMPTS):
        head = store.get_head(context)
        if head is None:
            return None
        try:
            return head, store.session_state(head.session_id)
        except SegmentNotFound:
            continue
    raise ConflictError(f"{context} kept changing while it was being read")


def _in_trash(record: SessionRecord) -> bool:
    return record.owner is None and "trashed" in record.state and "purging" not in record.state


def _unfinished(record: SessionRecord) -> bool:
    if record.owner is not None:
        return "trashed" in record.state or "purging" in record.state
    return bool(record.state.get("purging")) or (
        "trashed" in record.state and "cold" not in record.state
    )


def _without(state: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k not in keys}


def _seal(store: Lifecycle, session_id: SessionId, state: dict[str, Any]) -> None:
    """Freeze a session just moved to the trash (so that no stale writer adds to it)."""
    if "cold" not in state:
        try:
            store.freeze_session(session_id, expected=state, state=state)
        except (ConflictError, SegmentNotFound):
            pass  # restored or purged meanwhile: that move has the last word


def _reopen(store: Lifecycle, session_id: SessionId, trash_id: str) -> None:
    """Finish restoring ``trash_id``: drop ``trashed`` (and a stale ``purging``), thaw it.

    An archived session stays frozen. Nothing is done once the session is detached again.
    """
    for _ in range(ATTEMPTS):
        state = store.session_state(session_id)
        if (state.get("trashed") or {}).get("trash_id") != trash_id:
            return
        if store.session_owner(session_id) is None:
            return
        rest = _without(state, "trashed", "purging")
        try:
            if "cold" in state and "archived" not in state:
                store.thaw_session(session_id, expected=state, state=_without(rest, "cold"))
            else:
                store.set_session_state(session_id, rest, expected=state)
        except ConflictError:
            continue
        return
    raise ConflictError(f"session {session_id} kept changing while it was being restored")


def _find_trashed(store: Lifecycle, trash_id: str) -> SessionRecord:
    for record in store.session_records():
        if _in_trash(record) and record.state["trashed"].get("trash_id") == trash_id:
            return record
    raise NotInTrash(f"nothing in the trash has the id {trash_id!r}")


_DROP: Any = object()


def _set_key(store: Lifecycle, session_id: SessionId, key: str, value: Any) -> None:
    """Set ``key`` of the session's record to ``value`` (``_DROP``: remove it)."""
    for _ in range(ATTEMPTS):
        state = store.session_state(session_id)
        new = _without(state, key) if value is _DROP else {**state, key: value}
        if new == state:
            return
        try:
            store.set_session_state(session_id, new, expected=state)
        except ConflictError:
            continue
        return
    raise ConflictError(f"session {session_id} kept changing while {key!r} was being changed")


def _summary(store: Lifecycle, head: PodMetadata) -> dict[str, Any]:
    """What the archive lists of a context, taken before it is frozen."""
    read = store.read_segment(head.session_id, head.segment_id)
    last = read.entries[-1] if read.entries else read.header
    return {
        "date": head.date,
        "created_at": head.created_at,
        "last_active": str(last.get("ts", head.updated_at)),
        "message_count": _message_count(store, head),
    }


def _archived(context: str, state: Mapping[str, Any]) -> ArchivedContext:
    cold = state.get("cold", {})
    sizes = {"hot_bytes": cold.get("hot_bytes", 0), "archived_bytes": cold.get("cold_bytes", 0)}
    listed = {**state["archived"], **sizes, "context": context, "pinned": bool(state.get("pinned"))}
    return msgspec.convert(listed, ArchivedContext)


def _trashed(state: Mapping[str, Any]) -> TrashedContext:
    marks = {"archived": "archived" in state, "pinned": bool(state.get("pinned"))}
    return msgspec.convert({**state["trashed"], **marks}, TrashedContext)


def _message_count(store: Store, head: PodMetadata) -> int:
    """History items in the head segment's restored state."""
    state = restore_by_segment(store, head.session_id, head.segment_id, blobs="stored")
    return len(state.history)


def frozen_bytes(store: Lifecycle, *, records: Records | None = None) -> int:
    """Bytes the frozen sessions (archived, or in the trash) take in the store, as each one's
    record says (``cold``, written by the freeze); nothing is read but the records (``records``:
    read already)."""
    found = _records(store, records)
    return sum(int(r.state["cold"].get("cold_bytes", 0)) for r in found if "cold" in r.state)


def _records(store: Lifecycle, records: Records | None) -> Records:
    """``records`` where the caller read them (a dashboard page reads them once for all it
    shows of them), else the store's."""
    return store.session_records() if records is None else records


def log_bytes(store: Store, ref: PodMetadata) -> int:
    """Bytes the session of ``ref`` takes as JSON lines (a hot store's size, estimated)."""
    return sum(
        len(codec.encode(line)) + 1
        for segment_id in store.list_segments(ref.session_id)
        for read in [store.read_segment(ref.session_id, segment_id)]
        for line in [read.header, *read.entries]
    )
