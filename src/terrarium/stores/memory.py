"""``MemoryStore``: the reference implementation of the ``Store`` protocol.

Everything lives in dicts guarded by one re-entrant lock, so it is trivially correct; the
property tests use it as the oracle that every other backend must agree with, and other tests
use it as a fast double. Entries are kept as the dicts a decoder would produce from the line,
so what it returns is exactly what a persistent backend returns. It holds nothing across
processes and never has torn tails.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from terrarium import codec
from terrarium.errors import ConflictError, ContextExists, SegmentNotFound, SessionAttached
from terrarium.model import ContextId, SegmentId, SessionId, TraceEntry, utc_now
from terrarium.stores.base import NewEntry, PodMetadata, SegmentRead, header_line, iter_lines


@dataclass
class _Segment:
    lines: list[dict[str, Any]]
    trace: list[dict[str, Any]] = field(default_factory=list)


class MemoryStore:
    """A store in process memory: the oracle for tests and a fast double."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._heads: dict[str, PodMetadata] = {}
        self._sessions: dict[SessionId, dict[SegmentId, _Segment]] = {}
        self._owners: dict[SessionId, str | None] = {}
        """Each session's context, None while it is detached."""
        self._context_locks: dict[str, threading.Lock] = {}

    def __repr__(self) -> str:
        return "MemoryStore()"

    # ---------------------------------------------------------------- heads

    def get_head(self, context: ContextId) -> PodMetadata | None:
        """Return the context's head record, or None."""
        with self._lock:
            return self._heads.get(str(context))

    def set_head(
        self, context: ContextId, segment_id: SegmentId, *, expected: SegmentId
    ) -> PodMetadata:
        """Move the head if it is ``expected`` now."""
        with self._lock:
            head = self._require_head(context)
            if head.segment_id != expected:
                raise ConflictError(
                    f"head of {context} is {head.segment_id}, not {expected}: it moved"
                )
            self._segment(head.session_id, segment_id)
            head = replace(head, segment_id=segment_id, updated_at=utc_now())
            self._heads[str(context)] = head
            return head

    def list_contexts(self, type: str | None = None) -> list[PodMetadata]:
        """Every head record, sorted by context id."""
        with self._lock:
            heads = [h for h in self._heads.values() if type is None or _type_of(h) == type]
        return sorted(heads, key=lambda h: ContextId.parse(h.context))

    # ---------------------------------------------------------------- contexts

    def create_context(self, context: ContextId, header: Mapping[str, Any]) -> PodMetadata:
        """Create a session with ``header`` as its root segment, and the head."""
        with self._lock:
            if str(context) in self._heads:
                raise ContextExists(f"context {context} already exists")
            line = _header_line(header)
            session_id = SessionId(str(line["session_id"]))
            segment_id = SegmentId(str(line["segment_id"]))
            self._sessions[session_id] = {segment_id: _Segment([line])}
            self._owners[session_id] = str(context)
            head = PodMetadata(str(context), session_id, segment_id, line["ts"], line["ts"])
            self._heads[str(context)] = head
            return head

    def delete_context(self, context: ContextId) -> bool:
        """Delete the context and its whole session."""
        with self._lock:
            head = self._heads.pop(str(context), None)
            if head is None:
                return False
            self._sessions.pop(head.session_id, None)
            self._owners.pop(head.session_id, None)
            return True

    def create_session(self, header: Mapping[str, Any]) -> None:
        """Create a session that belongs to no context, with ``header`` as its root."""
        with self._lock:
            line = _header_line(header)
            session_id = SessionId(str(line["session_id"]))
            if session_id in self._sessions:
                raise ConflictError(f"session {session_id} already exists")
            segment_id = SegmentId(str(line["segment_id"]))
            self._sessions[session_id] = {segment_id: _Segment([line])}
            self._owners[session_id] = None

    def attach_context(
        self, context: ContextId, session_id: SessionId, segment_id: SegmentId
    ) -> PodMetadata:
        """Make ``context`` a new context on a detached session's segment."""
        with self._lock:
            if str(context) in self._heads:
                raise ContextExists(f"context {context} already exists")
            segments = self._sessions.get(session_id)
            if segments is None:
                raise SegmentNotFound(f"session {session_id} does not exist")
            owner = self._owners.get(session_id)
            if owner is not None:
                raise SessionAttached(f"session {session_id} already belongs to context {owner}")
            self._segment(session_id, segment_id)
            created = next(iter(segments.values())).lines[0]["ts"]  # the root, made first
            head = PodMetadata(str(context), session_id, segment_id, created, utc_now())
            self._heads[str(context)] = head
            self._owners[session_id] = str(context)
            return head

    def detached_sessions(self) -> list[SessionId]:
        """The sessions that belong to no context, oldest first."""
        with self._lock:
            return sorted(s for s, owner in self._owners.items() if owner is None)

    @contextmanager
    def lock_context(self, context: ContextId) -> Iterator[None]:
        """Serialise work on one context across threads."""
        with self._lock:
            lock = self._context_locks.setdefault(str(context), threading.Lock())
        with lock:
            yield

    # ---------------------------------------------------------------- segments

    def create_segment(self, session_id: SessionId, header: Mapping[str, Any]) -> None:
        """Add a segment to a session."""
        with self._lock:
            segments = self._sessions.get(session_id)
            if segments is None:
                raise SegmentNotFound(f"session {session_id} does not exist")
            line = _header_line(header)
            segment_id = SegmentId(str(line["segment_id"]))
            if segment_id in segments:
                raise ConflictError(f"segment {segment_id} already exists")
            segments[segment_id] = _Segment([line])

    def append(
        self,
        session_id: SessionId,
        segment_id: SegmentId,
        entries: Sequence[NewEntry],
        *,
        expected_seq: int | None = None,
    ) -> int:
        """Append entries atomically; return the first one's seq."""
        with self._lock:
            segment = self._segment(session_id, segment_id)
            first = len(segment.lines)
            if expected_seq is not None and expected_seq != first:
                raise ConflictError.stale_seq(segment_id, first, expected_seq)
            # Round-trip through the codec so stored values are exactly what a file would hold.
            segment.lines.extend(
                [codec.decode(codec.encode(line)) for line in iter_lines(entries, first)]
            )
            return first

    def read_segment(
        self, session_id: SessionId, segment_id: SegmentId, *, stop_seq: int | None = None
    ) -> SegmentRead:
        """Read a segment up to and including ``stop_seq``."""
        with self._lock:
            lines = self._segment(session_id, segment_id).lines
            stop = len(lines) if stop_seq is None else min(stop_seq + 1, len(lines))
            return SegmentRead(
                header=copy.deepcopy(lines[0]),
                entries=copy.deepcopy(lines[1:stop]),
                next_seq=len(lines),
            )

    def next_seq(self, session_id: SessionId, segment_id: SegmentId) -> int:
        """The seq the next append gets."""
        with self._lock:
            return len(self._segment(session_id, segment_id).lines)

    def list_segments(self, session_id: SessionId) -> list[SegmentId]:
        """The session's segments, oldest first."""
        with self._lock:
            segments = self._sessions.get(session_id)
            if segments is None:
                raise SegmentNotFound(f"session {session_id} does not exist")
            return sorted(segments)

    def append_trace(
        self, session_id: SessionId, segment_id: SegmentId, entries: Sequence[TraceEntry]
    ) -> None:
        """Append to the segment's debug trace."""
        with self._lock:
            self._segment(session_id, segment_id).trace.extend(e.to_dict() for e in entries)

    def read_trace(self, session_id: SessionId, segment_id: SegmentId) -> list[dict[str, Any]]:
        """The segment's debug trace."""
        with self._lock:
            return copy.deepcopy(self._segment(session_id, segment_id).trace)

    def close(self) -> None:
        """Nothing to release."""

    # ---------------------------------------------------------------- helpers

    def _segment(self, session_id: SessionId, segment_id: SegmentId) -> _Segment:
        segment = self._sessions.get(session_id, {}).get(segment_id)
        if segment is None:
            raise SegmentNotFound(f"segment {segment_id} of session {session_id} does not exist")
        return segment

    def _require_head(self, context: ContextId) -> PodMetadata:
        head = self._heads.get(str(context))
        if head is None:
            from terrarium.errors import ContextNotFound

            raise ContextNotFound(f"context {context} does not exist")
        return head


def _header_line(header: Mapping[str, Any]) -> dict[str, Any]:
    # Round-trip through the codec so stored values are exactly what a file would hold.
    return header_line(codec.decode(codec.encode(dict(header))))


def _type_of(head: PodMetadata) -> str:
    return head.context.split(":", 1)[0]
