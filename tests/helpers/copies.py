"""A source store for the copy and import tests, and what "equal" means between two stores."""

from __future__ import annotations

from typing import Any

from terrarium import (
    Item,
    PodActiveSegmentRef,
    SegmentStartState,
    TraceEntry,
    clear_segment,
    create_compacted_segment,
    create_segment,
    fork_at,
    fork_context,
    save_delta,
    save_trace,
    save_user_input,
    states,
)
from terrarium.blobs import inline_line
from terrarium.model import ContextId, SessionId
from terrarium.sessions import detached_sessions
from terrarium.stores.base import Lifecycle, Store

TS = "2026-05-01T12:00:00.000000Z"


def fill(
    store: Store,
    count: int,
    *,
    archived: int = 0,
    big: bool = False,
    shapes: tuple[int, ...] = (0, 1, 2, 3, 4, 5),
    prefix: str = "cli:s",
) -> list[str]:
    """``count`` contexts ``cli:s00``... (``{prefix}00``...) of a few messages each, in every
    shape a session tree takes (taken in turn from ``shapes``, see ``_shape``; and every
    seventh a fork into another context), the last ``archived`` of them archived, every fifth
    pinned; and one detached session with a fork and a trace. ``big``: one message over the blob
    threshold. Returns the context ids, archived ones included."""
    names = [f"{prefix}{number:02}" for number in range(count)]
    for number, name in enumerate(names):
        if number and number % 7 == 0:
            fork_context(store, names[number - 1], name)
            continue
        session_id, root = create_segment(
            store, SegmentStartState(system_prompt=f"you are {name}"), context=name
        )
        ref = PodActiveSegmentRef(session_id, root)
        for turn in range(1 + number % 3):
            save_user_input(store, ref, f"{name} asks {turn}")
            save_delta(store, ref, [Item.assistant(f"{name} answers {turn}")])
        if big and number == 1:
            save_delta(store, ref, [Item.assistant("x" * 70_000)])
        _shape(store, name, ref, shapes[number % len(shapes)])
    _detached(store)
    if isinstance(store, Lifecycle):
        for name in names[::5]:
            states.pin_context(store, ContextId.parse(name))
        for name in names[len(names) - archived :] if archived else ():
            states.archive_context(store, ContextId.parse(name))
    return names


def _shape(store: Store, name: str, ref: PodActiveSegmentRef, shape: int) -> None:
    """Give the session one of the shapes a tree takes: 0 and 5 a plain one, 1 a fork the head
    stays off, 2 a fork the head moves onto, 3 a compaction, 4 a clear and traces."""
    if shape == 1:
        branch = PodActiveSegmentRef(ref.session_id, fork_at(store, ref, 1))
        save_user_input(store, branch, f"{name} on a branch")
    elif shape == 2:
        branch = PodActiveSegmentRef(ref.session_id, fork_at(store, ref, 2))
        save_user_input(store, branch, f"{name} moved on")
        store.set_head(ContextId.parse(name), branch.segment_id, expected=ref.segment_id)
    elif shape == 3:
        compacted = create_compacted_segment(store, ref, [Item.user("summary")], context=name)
        save_user_input(store, PodActiveSegmentRef(ref.session_id, compacted), "after")
    elif shape == 4:
        cleared = clear_segment(store, ref, context=name)
        save_trace(store, ref, [TraceEntry(TS, "chunk", {"name": name})])
        save_trace(store, PodActiveSegmentRef(ref.session_id, cleared), [TraceEntry(TS, "end", {})])


def _detached(store: Store) -> None:
    session_id, root = create_segment(store, SegmentStartState(system_prompt="detached"))
    ref = PodActiveSegmentRef(session_id, root)
    save_user_input(store, ref, "nobody's yet")
    save_trace(store, ref, [TraceEntry(TS, "chunk", {"detached": True})])
    save_user_input(store, PodActiveSegmentRef(session_id, fork_at(store, ref, 0)), "a fork")


def _session(store: Store, session_id: SessionId) -> dict[str, Any]:
    """Every segment of the session: its lines (blobs read back inline) and its trace."""
    segments = {}
    for segment_id in store.list_segments(session_id):
        read = store.read_segment(session_id, segment_id)
        lines = [inline_line(line, store) for line in [read.header, *read.entries]]
        segments[str(segment_id)] = (lines, read.next_seq, store.read_trace(session_id, segment_id))
    return segments


def snapshot(store: Store) -> dict[str, Any]:
    """Everything a copy must carry, by context id (``session {id}`` for detached sessions):
    session, head, creation time, archived, pinned, and every segment's lines and trace."""
    contexts = [h.context for h in store.list_contexts()]
    pinned: frozenset[str] = frozenset()
    if isinstance(store, Lifecycle):
        contexts += [a.context for a in states.archived_contexts(store)]
        pinned = states.pinned_contexts(store)
    found: dict[str, Any] = {}
    for context in contexts:
        ctx = ContextId.parse(context)
        head = store.get_head(ctx)
        assert head is not None, context
        archived = isinstance(store, Lifecycle) and states.is_archived(store, ctx)
        found[context] = (
            str(head.session_id),
            str(head.segment_id),
            head.created_at,
            archived,
            context in pinned,
            _session(store, head.session_id),
        )
    for session_id in detached_sessions(store):
        found[f"session {session_id}"] = _session(store, session_id)
    return found
