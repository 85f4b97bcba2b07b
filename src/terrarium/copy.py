"""Copy sessions between any two stores, losslessly.

A context's whole session tree is copied (every segment, not only the head's lineage), each
line as stored: session and segment ids, timestamps, seqs, unknown kinds and keys. Segments
are written parents first, the head is set last, and debug traces come along, so restoring
any segment on either side gives the same state. A context that already exists in the
destination is skipped and reported, which makes an interrupted copy safe to run again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from terrarium.errors import ContextExists, ContextNotFound
from terrarium.formats.jsonl import recreate_session
from terrarium.model import ContextId, SegmentId, TraceEntry
from terrarium.stores.base import PodMetadata, Store


@dataclass
class CopyReport:
    """What a copy did."""

    copied: list[str] = field(default_factory=list)
    """Contexts copied."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """Contexts not copied, each with the reason."""
    present: list[str] = field(default_factory=list)
    """The skipped contexts that the destination already had (a rerun's, typically)."""
    entries: int = 0
    """Lines copied (headers included)."""


def session_segments(store: Store, head: PodMetadata) -> list[list[dict[str, Any]]]:
    """Every segment of the head's session as stored lines, each parent before its children."""
    reads = {
        seg: store.read_segment(head.session_id, seg)
        for seg in store.list_segments(head.session_id)
    }
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
    return [[reads[s].header, *reads[s].entries] for s in ordered]


def copy_context(src: Store, dst: Store, context: ContextId | str) -> int:
    """Copy one context's session from ``src`` to ``dst``; return the lines copied.

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
    for segment in segments:
        segment_id = SegmentId(segment[0]["segment_id"])
        trace = src.read_trace(head.session_id, segment_id)
        if trace:
            entries = [TraceEntry(t["ts"], t["event"], t.get("data") or {}) for t in trace]
            dst.append_trace(head.session_id, segment_id, entries)
    return sum(len(segment) for segment in segments)


def copy_store(
    src: Store,
    dst: Store,
    contexts: Iterable[ContextId | str] | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> CopyReport:
    """Copy the given contexts (all by default) from ``src`` to ``dst``.

    ``progress`` is called with each context id once it is done (copied or skipped).
    """
    wanted = (
        [ContextId.parse(c) for c in contexts]
        if contexts is not None
        else [ContextId.parse(h.context) for h in src.list_contexts()]
    )
    report = CopyReport()
    for ctx in wanted:
        try:
            report.entries += copy_context(src, dst, ctx)
            report.copied.append(str(ctx))
        except (ContextExists, ContextNotFound) as exc:
            report.skipped.append((str(ctx), str(exc)))
            if isinstance(exc, ContextExists) and dst.get_head(ctx) is not None:
                report.present.append(str(ctx))
        if progress is not None:
            progress(str(ctx))
    return report


__all__ = ["CopyReport", "copy_context", "copy_store", "session_segments"]
