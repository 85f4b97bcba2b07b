"""``MemoryStore``: the reference implementation of the ``Store`` protocol.

Everything lives in dicts guarded by one re-entrant lock, so it is trivially correct; the
property tests use it as the oracle that every other backend must agree with, and other tests
use it as a fast double. Entries are kept as the dicts a decoder would produce from the line,
so what it returns is exactly what a persistent backend returns. It holds nothing across
processes and never has torn tails.

Lifecycle states are kept as plain sets and dicts beside the data: an archived context stays
where it is (there is nothing to compress in memory) but leaves the hot listing; a trashed one
moves, data and all, into ``_trash``.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from terrarium import codec
from terrarium.blobs import DEFAULT_THRESHOLD, check_digest, digest_of, line_digests
from terrarium.errors import (
    BlobNotFound,
    ConflictError,
    ContextExists,
    CorruptBlob,
    NotInTrash,
    SegmentNotFound,
    SessionAttached,
)
from terrarium.model import ContextId, SegmentId, SessionId, TraceEntry, utc_now
from terrarium.stores.base import (
    ArchivedContext,
    NewEntry,
    PodMetadata,
    SegmentRead,
    TrashedContext,
    header_line,
    iter_lines,
)


@dataclass
class _Segment:
    lines: list[dict[str, Any]]
    trace: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Trashed:
    entry: TrashedContext
    head: PodMetadata
    segments: dict[SegmentId, _Segment]
    archived: ArchivedContext | None


class _MemoryBlobs:
    """:class:`~terrarium.stores.base.BlobStore` for :class:`MemoryStore`: a dict of bytes."""

    _lock: threading.RLock
    _blobs: dict[str, tuple[bytes, float]]
    _sessions: dict[SessionId, dict[SegmentId, _Segment]]
    _trash: dict[str, _Trashed]

    def put_blob(self, data: bytes) -> str:
        """Store ``data`` once; return its digest."""
        digest = digest_of(bytes(data))
        with self._lock:
            self._blobs[digest] = (bytes(data), time.time())
        return digest

    def get_blob(self, digest: str) -> bytes:
        """The blob's bytes, checked against ``digest``."""
        with self._lock:
            found = self._blobs.get(check_digest(digest))
        if found is None:
            raise BlobNotFound(f"blob {digest} is not in the store")
        if digest_of(found[0]) != digest:
            raise CorruptBlob(f"blob {digest} does not match its digest")
        return found[0]

    def has_blob(self, digest: str) -> bool:
        """Whether the blob is stored."""
        with self._lock:
            return check_digest(digest) in self._blobs

    def blob_digests(self) -> list[str]:
        """Every stored blob's digest, sorted."""
        with self._lock:
            return sorted(self._blobs)

    def blob_references(self) -> dict[str, str]:
        """Every digest a hot, archived or trashed log refers to, with its session."""
        found: dict[str, str] = {}
        with self._lock:
            groups = [*self._sessions.items()]
            groups += [(t.head.session_id, t.segments) for t in self._trash.values()]
            for session_id, segments in groups:
                for segment in segments.values():
                    for line in segment.lines:
                        for digest in line_digests(line):
                            found.setdefault(digest, f"session {session_id}")
        return found

    def delete_unreferenced_blobs(self, *, stored_before: float) -> int:
        """Delete the blobs no log refers to, last put before ``stored_before``."""
        with self._lock:
            referenced = self.blob_references()
            gone = [
                d
                for d, (_, at) in self._blobs.items()
                if d not in referenced and at < stored_before
            ]
            for digest in gone:
                del self._blobs[digest]
        return len(gone)


class MemoryStore(_MemoryBlobs):
    """A store in process memory: the oracle for tests and a fast double."""

    def __init__(self, *, blob_threshold: int | None = DEFAULT_THRESHOLD) -> None:
        """An empty store; ``blob_threshold`` (bytes; None or 0: none) as in :class:`BlobStore`."""
        self.blob_threshold = blob_threshold
        self._blobs: dict[str, tuple[bytes, float]] = {}
        """Each blob's bytes and when it was last put."""
        self._lock = threading.RLock()
        self._heads: dict[str, PodMetadata] = {}
        self._sessions: dict[SessionId, dict[SegmentId, _Segment]] = {}
        self._owners: dict[SessionId, str | None] = {}
        """Each session's context, None while it is detached."""
        self._context_locks: dict[str, threading.Lock] = {}
        self._archived: dict[str, ArchivedContext] = {}
        self._trash: dict[str, _Trashed] = {}
        self._pins: set[str] = set()

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
            self._wake(str(context))
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
            heads = [
                h
                for h in self._heads.values()
                if (type is None or _type_of(h) == type) and h.context not in self._archived
            ]
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
        """Move the context, its whole session and its pin, into the trash."""
        with self._lock:
            head = self._heads.get(str(context))
            if head is None:
                return False
            segments = self._sessions[head.session_id]
            archived = self._archived.get(str(context))
            entry = TrashedContext(
                trash_id=str(uuid.uuid4()),
                context=str(context),
                date=head.date,
                deleted_at=utc_now(),
                archived=archived is not None,
                message_count=_message_count(self, str(context)),
                bytes=_size(segments),
                pinned=str(context) in self._pins,
            )
            self._trash[entry.trash_id] = _Trashed(entry, head, segments, archived)
            self._drop(str(context))
            return True

    def _drop(self, context: str) -> None:
        head = self._heads.pop(context)
        self._sessions.pop(head.session_id, None)
        self._owners.pop(head.session_id, None)
        self._archived.pop(context, None)
        self._pins.discard(context)

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

    # ---------------------------------------------------------------- lifecycle

    def archive_context(self, context: ContextId) -> ArchivedContext | None:
        """Mark a hot context archived (nothing to compress in memory)."""
        with self._lock:
            key = str(context)
            head = self._heads.get(key)
            if head is None or key in self._archived:
                return None
            segments = self._sessions[head.session_id]
            head_lines = segments[head.segment_id].lines
            size = _size(segments)
            archived = ArchivedContext(
                context=key,
                date=head.date,
                archived_at=utc_now(),
                last_active=str(head_lines[-1]["ts"]),
                message_count=_message_count(self, key),
                hot_bytes=size,
                archived_bytes=size,
                pinned=key in self._pins,
            )
            self._archived[key] = archived
            return archived

    def unarchive_context(self, context: ContextId) -> bool:
        """Put an archived context back in the hot listing."""
        with self._lock:
            return self._archived.pop(str(context), None) is not None

    def is_archived(self, context: ContextId) -> bool:
        """Whether the context is archived."""
        with self._lock:
            return str(context) in self._archived

    def archived_contexts(self, type: str | None = None) -> list[ArchivedContext]:
        """Every archived context, sorted by context id."""
        with self._lock:
            found = [
                replace(a, pinned=a.context in self._pins)
                for a in self._archived.values()
                if type is None or a.context.split(":", 1)[0] == type
            ]
        return sorted(found, key=lambda a: ContextId.parse(a.context))

    def trashed_contexts(self) -> list[TrashedContext]:
        """The trash, most recently deleted first."""
        with self._lock:
            entries = [t.entry for t in self._trash.values()]
        return sorted(entries, key=lambda e: (e.deleted_at, e.trash_id), reverse=True)

    def restore_trashed(self, trash_id: str, *, as_context: ContextId | None = None) -> PodMetadata:
        """Bring a trashed context back in the state it was in."""
        with self._lock:
            trashed = self._trash.get(trash_id)
            if trashed is None:
                raise NotInTrash(f"nothing in the trash has the id {trash_id!r}")
            key = str(as_context) if as_context is not None else trashed.entry.context
            if key in self._heads:
                raise ContextExists(f"context {key} already exists")
            del self._trash[trash_id]
            head = replace(trashed.head, context=key)
            self._heads[key] = head
            self._sessions[head.session_id] = trashed.segments
            self._owners[head.session_id] = key
            if trashed.archived is not None:
                self._archived[key] = replace(trashed.archived, context=key)
            if trashed.entry.pinned:
                self._pins.add(key)
            return head

    def purge_trashed(self, trash_id: str) -> bool:
        """Forget a trash entry for ever."""
        with self._lock:
            return self._trash.pop(trash_id, None) is not None

    def purge_context(self, context: ContextId) -> bool:
        """Delete a hot or archived context for ever."""
        with self._lock:
            if str(context) not in self._heads:
                return False
            self._drop(str(context))
            return True

    def pin_context(self, context: ContextId, pinned: bool = True) -> bool:
        """Pin or unpin a hot or archived context."""
        with self._lock:
            if str(context) not in self._heads:
                return False
            if pinned:
                self._pins.add(str(context))
            else:
                self._pins.discard(str(context))
            return True

    def pinned_contexts(self) -> frozenset[str]:
        """The pinned contexts."""
        with self._lock:
            return frozenset(self._pins)

    def _wake(self, context: str | None) -> None:
        """Unarchive ``context`` before a write to it (the caller holds ``_lock``)."""
        if context is not None:
            self._archived.pop(context, None)

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
            self._wake(self._owners.get(session_id))
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
            self._wake(self._owners.get(session_id))
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
            segment = self._segment(session_id, segment_id)
            self._wake(self._owners.get(session_id))
            segment.trace.extend(e.to_dict() for e in entries)

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


def _size(segments: Mapping[SegmentId, _Segment]) -> int:
    """Bytes the session's segments would take as JSONL files."""
    return sum(len(codec.encode(line)) + 1 for seg in segments.values() for line in seg.lines)


def _message_count(store: MemoryStore, context: str) -> int:
    """History items in the context's restored state (the store's lock is held)."""
    from terrarium.sessions import restore  # the sessions layer sits above the stores

    return len(restore(store, ContextId.parse(context)).history)
