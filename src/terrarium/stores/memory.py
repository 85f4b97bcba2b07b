"""``MemoryStore``: the reference implementation of the ``Store`` protocol.

Dicts under one re-entrant lock: the property tests' oracle and a fast double. Entries are kept
as the dicts a decoder makes of the line, so it returns what a persistent backend returns. A
frozen session stays where it is but leaves the hot listing. The derived index
(:mod:`terrarium.index`) follows its change cursor (a counter per written session) and keeps its
database in a temporary folder, deleted when the store is closed or collected.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from terrarium import codec
from terrarium.blobrefs import DEFAULT_THRESHOLD, check_digest, digest_of, line_digests
from terrarium.errors import (
    BlobNotFound,
    ConflictError,
    ContextExists,
    ContextNotFound,
    CorruptBlob,
    SegmentNotFound,
    SessionAttached,
)
from terrarium.model import ContextId, SegmentId, SessionId, TraceEntry, utc_now
from terrarium.stores.base import (
    INDEX_DB,
    Derived,
    LiveSession,
    NewEntry,
    PodMetadata,
    SegmentRead,
    SessionRecord,
    header_line,
    iter_lines,
    refuse_files,
    wake_session,
)


@dataclass
class _Segment:
    lines: list[dict[str, Any]]
    trace: list[dict[str, Any]] = field(default_factory=list)


class MemoryStore:
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
        self._states: dict[SessionId, dict[str, Any]] = {}
        self._frozen: set[SessionId] = set()
        self._written: dict[SessionId, int] = {}
        """The change cursor: each session's last write, numbered from 1, oldest first."""
        self._tick = 0
        self.derived: Derived | None = None
        """The derived index (:func:`terrarium.index.of`), closed with the store."""
        self._index_dir: str | None = None

    def __repr__(self) -> str:
        return "MemoryStore()"

    # ---------------------------------------------------------------- change cursor

    def _touch(self, session_id: SessionId) -> None:
        self._tick += 1
        self._written.pop(session_id, None)  # to the end: the dict stays in write order
        self._written[session_id] = self._tick

    def changes(self, after: str | None) -> tuple[list[SessionId] | None, str]:
        """The sessions written since position ``after`` (``ChangeLog``)."""
        with self._lock:
            now = self._tick
            seen = int(after) if after is not None and after.isdigit() else -1
            if not 0 <= seen <= now:
                return None, str(now)
            touched = []
            for session_id in reversed(self._written):  # newest first, up to the position
                if self._written[session_id] <= seen:
                    break
                touched.append(session_id)
            return touched, str(now)

    def live_sessions(self, session_ids: Sequence[SessionId]) -> dict[SessionId, LiveSession]:
        """Of ``session_ids``, each hot and attached one's head and tails (``ChangeLog``)."""
        found: dict[SessionId, LiveSession] = {}
        with self._lock:
            for sid in session_ids:
                head = self._heads.get(self._owners.get(sid) or "")
                if head is not None and head.session_id == sid and sid not in self._frozen:
                    found[sid] = head, {g: len(s.lines) for g, s in self._sessions[sid].items()}
        return found

    def entries_from(
        self, reads: Sequence[tuple[SessionId, SegmentId, int]]
    ) -> list[list[dict[str, Any]]]:
        """Each read's segment lines from its seq on (``ChangeLog``)."""
        gone = _Segment([])
        with self._lock:
            found = [self._sessions.get(s, {}).get(g, gone).lines[seq:] for s, g, seq in reads]
            return copy.deepcopy(found)

    def index_source(self) -> Path:
        """The derived index's file (``Indexed``), in a private temporary folder removed with
        the store; the index reads the cursor."""
        with self._lock:
            if self._index_dir is None:
                self._index_dir = tempfile.mkdtemp(prefix="terrarium-index-")
                weakref.finalize(self, shutil.rmtree, self._index_dir, True)
            return Path(self._index_dir) / INDEX_DB

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
            head = self._heads.get(str(context))
            if head is None:
                raise ContextNotFound.of(context)
            self._wake(head.session_id)
            if head.segment_id != expected:
                raise ConflictError(
                    f"head of {context} is {head.segment_id}, not {expected}: it moved"
                )
            self._segment(head.session_id, segment_id)
            head = msgspec.structs.replace(head, segment_id=segment_id, updated_at=utc_now())
            self._touch(head.session_id)
            self._heads[str(context)] = head
            return head

    def list_contexts(self, type: str | None = None) -> list[PodMetadata]:
        """Every head record, sorted by context id."""
        with self._lock:
            heads = [
                h
                for h in self._heads.values()
                if (type is None or h.context.split(":", 1)[0] == type)
                and h.session_id not in self._frozen
            ]
        return sorted(heads, key=lambda h: ContextId.parse(h.context))

    # ---------------------------------------------------------------- contexts

    def create_context(self, context: ContextId, header: Mapping[str, Any]) -> PodMetadata:
        """Create a session with ``header`` as its root segment, and the head."""
        with self._lock:
            if str(context) in self._heads:
                raise ContextExists(f"context {context} already exists")
            line = self._new_session(header, str(context))
            session_id, segment_id = SessionId(line["session_id"]), SegmentId(line["segment_id"])
            head = PodMetadata(str(context), session_id, segment_id, line["ts"], line["ts"])
            self._touch(session_id)
            self._heads[str(context)] = head
            return head

    def create_session(self, header: Mapping[str, Any]) -> None:
        """Create a session that belongs to no context, with ``header`` as its root."""
        with self._lock:
            self._new_session(header, None)

    def _new_session(self, header: Mapping[str, Any], owner: str | None) -> dict[str, Any]:
        """Add a session of ``owner`` with ``header`` as its root; its header line."""
        line = header_line(_stored(header))
        session_id = SessionId(str(line["session_id"]))
        if session_id in self._sessions:
            raise ConflictError(f"session {session_id} already exists")
        self._sessions[session_id] = {SegmentId(str(line["segment_id"])): _Segment([line])}
        self._owners[session_id] = owner
        return line

    def attach_context(
        self, context: ContextId, session_id: SessionId, segment_id: SegmentId
    ) -> PodMetadata:
        """Make ``context`` a new context on a detached session's segment."""
        with self._lock:
            if str(context) in self._heads:
                raise ContextExists(f"context {context} already exists")
            segments = self._session(session_id)
            owner = self._owners.get(session_id)
            if owner is not None:
                raise SessionAttached(f"session {session_id} already belongs to context {owner}")
            self._segment(session_id, segment_id)
            created = next(iter(segments.values())).lines[0]["ts"]  # the root, made first
            head = PodMetadata(str(context), session_id, segment_id, created, utc_now())
            self._heads[str(context)] = head
            self._owners[session_id] = str(context)
            self._touch(session_id)
            return head

    # ---------------------------------------------------------------- state primitives

    def session_state(self, session_id: SessionId) -> dict[str, Any]:
        """The session's state record."""
        with self._lock:
            self._session(session_id)
            return copy.deepcopy(self._states.get(session_id, {}))

    def set_session_state(
        self, session_id: SessionId, state: Mapping[str, Any], *, expected: Mapping[str, Any]
    ) -> None:
        """Replace the record if it is ``expected``."""
        with self._lock:
            self._check_state(session_id, expected)
            self._states[session_id] = _stored(state)

    def session_records(self) -> list[SessionRecord]:
        """Every session with a non-empty record."""
        with self._lock:
            return [
                SessionRecord(s, self._owners.get(s), copy.deepcopy(state))
                for s, state in self._states.items()
                if state
            ]

    def session_owner(self, session_id: SessionId) -> str | None:
        """The session's context, None if detached."""
        with self._lock:
            self._session(session_id)
            return self._owners.get(session_id)

    def unowned_sessions(self) -> list[SessionId]:
        """The sessions that belong to no context, oldest first."""
        with self._lock:
            return sorted(s for s, owner in self._owners.items() if owner is None)

    def freeze_session(
        self,
        session_id: SessionId,
        *,
        expected: Mapping[str, Any],
        state: Mapping[str, Any],
        along: Sequence[Path] = (),
    ) -> dict[str, Any]:
        """Mark the session frozen (nothing to compress in memory) and set its record."""
        refuse_files(along)
        with self._lock:
            self._check_state(session_id, expected)
            size = _size(self._sessions[session_id])
            stored = _stored(state)
            stored["cold"] = {"hot_bytes": size, "cold_bytes": size}
            self._states[session_id] = stored
            self._frozen.add(session_id)
            self._touch(session_id)
            return copy.deepcopy(stored)

    def thaw_session(
        self, session_id: SessionId, *, expected: Mapping[str, Any], state: Mapping[str, Any]
    ) -> None:
        """Mark the session hot and set its record."""
        with self._lock:
            hot = {k: v for k, v in state.items() if k != "cold"}
            self.set_session_state(session_id, hot, expected=expected)
            self._frozen.discard(session_id)
            self._touch(session_id)

    def detach_context(
        self,
        context: ContextId,
        session_id: SessionId,
        *,
        expected: Mapping[str, Any],
        state: Mapping[str, Any],
        segment_id: SegmentId | None = None,
    ) -> None:
        """Unbind the context from its session and set the session's record."""
        with self._lock:
            head = self._heads.get(str(context))
            moved = head is not None and segment_id not in (None, head.segment_id)
            if head is None or head.session_id != session_id or moved:
                raise ContextNotFound(f"context {context} is not on session {session_id}")
            self.set_session_state(session_id, state, expected=expected)
            del self._heads[str(context)]
            self._owners[session_id] = None
            self._touch(session_id)

    def delete_session(self, session_id: SessionId) -> bool:
        """Forget a detached session for ever."""
        with self._lock:
            if session_id not in self._sessions:
                return False
            owner = self._owners.get(session_id)
            if owner is not None:
                raise SessionAttached(f"session {session_id} belongs to context {owner}")
            for table in (self._sessions, self._owners, self._states):
                table.pop(session_id, None)
            self._frozen.discard(session_id)
            self._touch(session_id)
            return True

    def _check_state(self, session_id: SessionId, expected: Mapping[str, Any]) -> None:
        self._session(session_id)
        now = self._states.get(session_id, {})
        if now != dict(expected):
            raise ConflictError(f"the state of session {session_id} changed meanwhile")

    def _wake(self, session_id: SessionId) -> None:
        """Thaw the session before a write to it (the caller holds ``_lock``)."""
        if session_id in self._frozen:
            wake_session(self, session_id)

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
            segments = self._session(session_id)
            self._wake(session_id)
            line = header_line(_stored(header))
            segment_id = SegmentId(str(line["segment_id"]))
            if segment_id in segments:
                raise ConflictError(f"segment {segment_id} already exists")
            segments[segment_id] = _Segment([line])
            self._touch(session_id)

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
            self._wake(session_id)
            first = len(segment.lines)
            if expected_seq is not None and expected_seq != first:
                raise ConflictError.stale_seq(segment_id, first, expected_seq)
            segment.lines.extend([_stored(line) for line in iter_lines(entries, first)])
            self._touch(session_id)
            return first

    def read_segment(
        self, session_id: SessionId, segment_id: SegmentId, *, stop_seq: int | None = None
    ) -> SegmentRead:
        """Read a segment up to and including ``stop_seq``."""
        with self._lock:
            lines = self._segment(session_id, segment_id).lines
            stop = len(lines) if stop_seq is None else min(stop_seq + 1, len(lines))
            return SegmentRead(copy.deepcopy(lines[0]), copy.deepcopy(lines[1:stop]), len(lines))

    def next_seq(self, session_id: SessionId, segment_id: SegmentId) -> int:
        """The seq the next append gets."""
        with self._lock:
            return len(self._segment(session_id, segment_id).lines)

    def list_segments(self, session_id: SessionId) -> list[SegmentId]:
        """The session's segments, oldest first."""
        with self._lock:
            return sorted(self._session(session_id))

    def append_trace(
        self, session_id: SessionId, segment_id: SegmentId, entries: Sequence[TraceEntry]
    ) -> None:
        """Append to the segment's debug trace."""
        with self._lock:
            segment = self._segment(session_id, segment_id)
            self._wake(session_id)
            segment.trace.extend(e.to_dict() for e in entries)

    def read_trace(self, session_id: SessionId, segment_id: SegmentId) -> list[dict[str, Any]]:
        """The segment's debug trace."""
        with self._lock:
            return copy.deepcopy(self._segment(session_id, segment_id).trace)

    def close(self) -> None:
        """Close the derived index (outside the store's lock, which a refresh takes while it
        holds the index's) and remove its folder."""
        with self._lock:
            derived, folder = self.derived, self._index_dir
            self.derived = self._index_dir = None
        if derived is not None:
            derived.close()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    # ---------------------------------------------------------------- blobs

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
            for session_id, segments in self._sessions.items():
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

    def _session(self, session_id: SessionId) -> dict[SegmentId, _Segment]:
        segments = self._sessions.get(session_id)
        if segments is None:
            raise SegmentNotFound.of(session_id)
        return segments

    def _segment(self, session_id: SessionId, segment_id: SegmentId) -> _Segment:
        segment = self._sessions.get(session_id, {}).get(segment_id)
        if segment is None:
            raise SegmentNotFound.of(session_id, segment_id)
        return segment


def _stored(value: Mapping[str, Any]) -> dict[str, Any]:
    """``value`` round-tripped through the codec: exactly what a file would hold."""
    decoded: dict[str, Any] = codec.decode(codec.encode(dict(value)))
    return decoded


def _size(segments: Mapping[SegmentId, _Segment]) -> int:
    """Bytes the session's segments would take as JSONL files."""
    return sum(len(codec.encode(line)) + 1 for seg in segments.values() for line in seg.lines)
