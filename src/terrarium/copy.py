"""Copy sessions between any two stores, losslessly.

A context's whole session tree is copied (every segment, not only the head's lineage), each
line as stored: session and segment ids, timestamps, seqs, unknown kinds and keys. Large outputs
kept in blobs are read whole from the source and stored in the destination as its own
``blob_threshold`` says (a blob there, or inline), so nothing is lost between stores. Segments
are written parents first, the head is set last, and debug traces come along, so restoring
any segment on either side gives the same state. A context that already exists in the
destination is skipped and reported, which makes an interrupted copy safe to run again.

Detached sessions (of no context yet) are copied with all contexts (:func:`copy_detached`):
a copy of a whole store leaves nothing behind. One that the destination already holds in
part (an interrupted copy) is completed, segment by segment, from each one's next seq.

Archived contexts are copied too when copying all, and land archived; pins come along. Both
stores need the lifecycle (:class:`~terrarium.stores.base.Lifecycle`) for that; a context
archived in the source lands hot in a destination without one. The trash is not copied: its
contexts were deleted (restore one first to take it along).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from terrarium.blobs import inline_line, offload_data, offload_line
from terrarium.errors import ContextExists, ContextNotFound, SegmentNotFound, SessionAttached
from terrarium.formats.jsonl import _BATCH, _data, recreate_session
from terrarium.model import ContextId, SegmentId, SessionId, TraceEntry
from terrarium.stores.base import Lifecycle, NewEntry, PodMetadata, Store


@dataclass
class CopyReport:
    """What a copy did."""

    copied: list[str] = field(default_factory=list)
    """Contexts copied (and detached sessions, as ``session {id}``)."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """Contexts not copied, each with the reason."""
    present: list[str] = field(default_factory=list)
    """The skipped contexts that the destination already had (a rerun's, typically)."""
    entries: int = 0
    """Lines copied (headers included)."""


def session_segments(store: Store, head: PodMetadata | SessionId) -> list[list[dict[str, Any]]]:
    """Every segment of the head's session (or of the session ``head`` is the id of: a
    detached one) as stored lines, each parent before its children."""
    return _segments(store, head if isinstance(head, SessionId) else head.session_id)


def _segments(store: Store, session_id: SessionId) -> list[list[dict[str, Any]]]:
    reads = {seg: store.read_segment(session_id, seg) for seg in store.list_segments(session_id)}
    children: dict[SegmentId | None, list[SegmentId]] = {}
    for segment_id, read in reads.items():
        parent_text = (read.header.get("origin") or {}).get("parent")
        parent = SegmentId(parent_text) if parent_text else None
        # A parent in another session (a fork into this context) is no parent here.
        children.setdefault(parent if parent in reads else None, []).append(segment_id)
    ordered: list[SegmentId] = []
    pending = sorted(children.get(None, []))
    while pending:
        segment_id = pending.pop(0)
        ordered.append(segment_id)
        pending.extend(sorted(children.get(segment_id, [])))
    # Blobs travel inline: the destination keeps them as its own threshold says.
    return [
        [inline_line(line, store) for line in [reads[s].header, *reads[s].entries]] for s in ordered
    ]


def copy_context(
    src: Store, dst: Store, context: ContextId | str, *, pinned: frozenset[str] | None = None
) -> int:
    """Copy one context's session from ``src`` to ``dst``; return the lines copied.

    Where both stores have the lifecycle, the copy is archived if the source's is, and pinned
    if it is among ``pinned`` (the source's pins, read here when not given).

    Raises:
        ContextNotFound: no such context in ``src``.
        ContextExists: the context or its session is already in ``dst``.
    """
    ctx = ContextId.parse(context)
    head = src.get_head(ctx)
    if head is None:
        raise ContextNotFound(f"context {ctx} does not exist in the source store")
    segments = session_segments(src, head)
    recreate_session(dst, ctx, segments, head=head.segment_id)
    _copy_traces(src, dst, head.session_id, segments)
    if isinstance(src, Lifecycle) and isinstance(dst, Lifecycle):
        if str(ctx) in (src.pinned_contexts() if pinned is None else pinned):
            dst.pin_context(ctx)
        if src.is_archived(ctx):
            dst.archive_context(ctx)
    return sum(len(segment) for segment in segments)


def _copy_traces(
    src: Store, dst: Store, session_id: SessionId, segments: list[list[dict[str, Any]]]
) -> None:
    """The debug traces of ``segments`` that ``dst`` has none of yet."""
    for segment in segments:
        segment_id = SegmentId(segment[0]["segment_id"])
        trace = src.read_trace(session_id, segment_id)
        if trace and not dst.read_trace(session_id, segment_id):
            entries = [TraceEntry(t["ts"], t["event"], t.get("data") or {}) for t in trace]
            dst.append_trace(session_id, segment_id, entries)


def copy_detached(src: Store, dst: Store, session_id: SessionId) -> int:
    """Copy a detached session of ``src`` into ``dst`` (detached there too); return the
    lines copied. What ``dst`` already holds of it (an interrupted copy) is completed.

    Raises:
        SessionAttached: ``dst`` holds the session in a context.
        SegmentNotFound: ``src`` has no such session.
    """
    segments = _segments(src, session_id)
    try:
        have = set(dst.list_segments(session_id))
    except SegmentNotFound:
        dst.create_session(offload_line(dst, segments[0][0]))
        have = {SegmentId(segments[0][0]["segment_id"])}
    else:
        if session_id not in dst.detached_sessions():
            raise SessionAttached(f"session {session_id} belongs to a context in the destination")
    copied = 0
    for segment in segments:
        segment_id = SegmentId(segment[0]["segment_id"])
        if segment_id not in have:
            dst.create_segment(session_id, offload_line(dst, segment[0]))
            copied += 1
        start = dst.next_seq(session_id, segment_id)
        entries = [
            NewEntry(line["kind"], line["ts"], offload_data(dst, line["kind"], _data(line)))
            for line in segment[start:]
        ]
        for at in range(0, len(entries), _BATCH):
            batch = entries[at : at + _BATCH]
            dst.append(session_id, segment_id, batch, expected_seq=start + at)
        copied += len(entries)
    _copy_traces(src, dst, session_id, segments)
    return copied


def copy_store(
    src: Store,
    dst: Store,
    contexts: Iterable[ContextId | str] | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    detached: bool | None = None,
) -> CopyReport:
    """Copy the given contexts (all by default) from ``src`` to ``dst``.

    ``progress`` is called with each context id (or ``session {id}``) once it is done (copied
    or skipped). ``detached``: also copy every detached session (:func:`copy_detached`), reported as
    ``session {id}``; by default when copying all contexts.
    """
    if contexts is not None:
        wanted = [ContextId.parse(c) for c in contexts]
    else:
        wanted = [ContextId.parse(h.context) for h in src.list_contexts()]
        if isinstance(src, Lifecycle):
            wanted += [ContextId.parse(a.context) for a in src.archived_contexts()]
    pinned = src.pinned_contexts() if isinstance(src, Lifecycle) else frozenset()
    report = CopyReport()
    for ctx in wanted:
        try:
            report.entries += copy_context(src, dst, ctx, pinned=pinned)
            report.copied.append(str(ctx))
        except (ContextExists, ContextNotFound) as exc:
            report.skipped.append((str(ctx), str(exc)))
            if isinstance(exc, ContextExists) and dst.get_head(ctx) is not None:
                report.present.append(str(ctx))
        if progress is not None:
            progress(str(ctx))
    if detached if detached is not None else contexts is None:
        for session_id in src.detached_sessions():
            name = f"session {session_id}"
            try:
                report.entries += copy_detached(src, dst, session_id)
                report.copied.append(name)
            except SessionAttached as exc:
                report.skipped.append((name, str(exc)))
            if progress is not None:
                progress(name)
    return report


__all__ = ["CopyReport", "copy_context", "copy_detached", "copy_store", "session_segments"]
