"""The ``Store`` protocol: where segment logs and context heads live.

Invariants every backend keeps (``tests/contract/`` checks each one on every backend):

* **Append-only.** A segment is a header (seq 0), then entries with seq 1, 2, ... without
  gaps. Entries are never rewritten or removed, except by a purge of a whole session.
* **Atomic appends.** One :meth:`Store.append` writes all of its entries or none. A crash
  leaves at most a torn tail, which reads detect and report (:class:`~terrarium.model.TornTail`).
* **Optimistic concurrency.** ``append(..., expected_seq=N)`` and ``set_head(..., expected=S)``
  raise :class:`~terrarium.errors.ConflictError` when the log moved on: no clobbering.
* **Heads are the only mutable records.** Clear, compaction and fork start new segments; a head
  names the segment a context is on now.
* **Forks copy nothing.** A fork's header names its parent segment and entry; restore replays
  the parent's prefix. Only a fork into another context copies history into its header.
* **Isolation.** Contexts never see each other's entries. Every hot-path call names one session.
* **Detached sessions.** :meth:`Store.create_session` starts a session of no context;
  :meth:`Store.attach_context` gives it one, once. Listing and search never show it.
* **States.** A context is hot, archived or trashed (:mod:`terrarium.states`, over the
  :class:`SessionStates` primitives). A session's state record changes only by compare-and-set
  (ConflictError, changing nothing, if it is not the one expected), atomically with its move.
  A frozen session (``cold``) reads; a write thaws it first (:func:`wake_session`). Only
  :meth:`~SessionStates.delete_session` removes data, from the trash.

Optional abilities are sub-protocols detected with ``isinstance``, never ``NotImplementedError``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

import msgspec

from terrarium.errors import ConflictError, InvalidEntry, SegmentNotFound, StoreError
from terrarium.model import (
    ENVELOPE_KEYS,
    FORMAT_VERSION,
    ContextId,
    SegmentId,
    SessionId,
    TornTail,
    TraceEntry,
)

if TYPE_CHECKING:
    from pathlib import Path


class PodActiveSegmentRef(msgspec.Struct, frozen=True):
    """A pointer to one segment: the session and the segment within it."""

    session_id: SessionId
    segment_id: SegmentId


class PodMetadata(msgspec.Struct, frozen=True):
    """A context's head record: which session it is and which segment it is on now."""

    context: str
    """The context id, ``type:name``."""
    session_id: SessionId
    segment_id: SegmentId
    """The head segment."""
    created_at: str
    """When the context was created (UTC, RFC 3339); its date names the folder on disk."""
    updated_at: str
    """When the head last moved."""

    @property
    def ref(self) -> PodActiveSegmentRef:
        """The head as a segment reference."""
        return PodActiveSegmentRef(self.session_id, self.segment_id)

    @property
    def date(self) -> str:
        """The creation date, ``YYYY-MM-DD``."""
        return self.created_at[:10]


class NewEntry(msgspec.Struct, frozen=True):
    """An entry to append; the store assigns its seq."""

    kind: str
    ts: str
    data: Mapping[str, Any]


class SegmentRead(msgspec.Struct, frozen=True):
    """The result of reading one segment."""

    header: dict[str, Any]
    """The header line (seq 0) as stored."""
    entries: list[dict[str, Any]]
    """Entry lines (seq >= 1, up to the requested stop), as stored."""
    next_seq: int
    """The seq the next append to the whole segment gets."""
    torn: TornTail | None = None
    """A torn tail found and set aside during this read."""


class SegmentStat(msgspec.Struct, frozen=True):
    """What tells the derived index a segment changed: its identity and size."""

    ino: int
    """A file's inode (a replaced file is read again); 0 in a database."""
    size: int
    """A file's bytes; a database segment's next seq."""


class ClosingStore(ABC):
    """Mixin of what holds resources (stores, feeds): ``with store:`` closes it after the block."""

    @abstractmethod
    def close(self) -> None:
        """Release what the store holds (descriptors, connections, threads)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@runtime_checkable
class PodMetadataStore(Protocol):
    """The head half of a store: which segment each context is on."""

    def get_head(self, context: ContextId) -> PodMetadata | None:
        """Return the context's head record, or None when it does not exist."""

    def set_head(
        self, context: ContextId, segment_id: SegmentId, *, expected: SegmentId
    ) -> PodMetadata:
        """Move the head to ``segment_id`` if it is ``expected`` now; else ConflictError."""

    def list_contexts(self, type: str | None = None) -> list[PodMetadata]:
        """Every context's head record, optionally of one type, sorted by context id."""


@runtime_checkable
class Store(PodMetadataStore, Protocol):
    """Storage of segment logs and heads. See the module docstring for the invariants."""

    def create_context(self, context: ContextId, header: Mapping[str, Any]) -> PodMetadata:
        """Create the context with ``header`` as its root segment; ContextExists if it exists."""

    def create_session(self, header: Mapping[str, Any]) -> None:
        """Create a session of no context from ``header``; ConflictError if it exists."""

    def attach_context(
        self, context: ContextId, session_id: SessionId, segment_id: SegmentId
    ) -> PodMetadata:
        """Make ``context`` a new context on the detached session's segment, dated as it."""

    def create_segment(self, session_id: SessionId, header: Mapping[str, Any]) -> None:
        """Add a segment to an existing session; ``header["segment_id"]`` names it."""

    def append(
        self,
        session_id: SessionId,
        segment_id: SegmentId,
        entries: Sequence[NewEntry],
        *,
        expected_seq: int | None = None,
    ) -> int:
        """Append atomically; the first entry's seq. ConflictError if not at ``expected_seq``."""

    def read_segment(
        self, session_id: SessionId, segment_id: SegmentId, *, stop_seq: int | None = None
    ) -> SegmentRead:
        """Read a segment's header and its entries up to and including ``stop_seq``."""

    def next_seq(self, session_id: SessionId, segment_id: SegmentId) -> int:
        """The seq the next append to the segment gets."""

    def list_segments(self, session_id: SessionId) -> list[SegmentId]:
        """The session's segment ids, oldest first."""

    def append_trace(
        self, session_id: SessionId, segment_id: SegmentId, entries: Sequence[TraceEntry]
    ) -> None:
        """Append raw stream events to the segment's debug trace."""

    def read_trace(self, session_id: SessionId, segment_id: SegmentId) -> list[dict[str, Any]]:
        """The segment's debug trace, oldest first (empty when tracing was off)."""

    def close(self) -> None:
        """Release files, connections and threads. The store is unusable afterwards."""


class Derived(Protocol):
    """State derived from a store and closed with it (the index of :mod:`terrarium.index`)."""

    def close(self) -> None:
        """Release what it holds (database connections)."""


#: The derived index's database, in a store's ``.index`` folder or beside its database file.
INDEX_DB = "search.db"


@runtime_checkable
class Indexed(Protocol):
    """A store whose listing and search are the derived index's, kept in :attr:`derived`."""

    derived: Derived | None

    def index_source(self) -> Any:
        """What the derived index reads of the store (a ``terrarium.index._refresh.Source``);
        of a :class:`ChangeLog` store, which it reads through that protocol, its file."""


#: A session as :meth:`ChangeLog.live_sessions` reads it: its context's head, and each of its
#: segments with its next seq.
LiveSession = tuple[PodMetadata, dict[SegmentId, int]]


@runtime_checkable
class ChangeLog(Store, Protocol):
    """A store whose writes move a change cursor in the transaction that writes them."""

    def changes(self, after: str | None) -> tuple[list[SessionId] | None, str]:
        """The sessions written since position ``after`` (None: read all) and the position now."""

    def live_sessions(self, session_ids: Sequence[SessionId]) -> dict[SessionId, LiveSession]:
        """Of ``session_ids``, each one its context's head is on (not detached, frozen or
        gone): that head, and each of its segments with its next seq, in one read."""

    def entries_from(
        self, reads: Sequence[tuple[SessionId, SegmentId, int]]
    ) -> list[list[dict[str, Any]]]:
        """For each (session, segment, seq) of ``reads``, the segment's lines from ``seq`` on
        (its header is seq 0; none if it is gone), in one read."""


@runtime_checkable
class ContextLocking(Protocol):
    """A store that can serialise work on one context across threads and processes."""

    def lock_context(self, context: ContextId) -> AbstractContextManager[None]:
        """Hold an exclusive lock on the context for the duration of the ``with`` block."""


def context_lock(store: Store, context: ContextId) -> AbstractContextManager[None]:
    """The store's cross-process lock on one context (a no-op if it has none)."""
    if isinstance(store, ContextLocking):
        return store.lock_context(context)
    return nullcontext()


@runtime_checkable
class HeadTail(Protocol):
    """A store that reads a context's head and its segment's next seq in one round trip."""

    def head_and_tail(self, context: ContextId) -> tuple[PodMetadata, int] | None:
        """The context's head and the next seq of its segment; None when it does not exist."""


def head_and_tail(store: Store, context: ContextId) -> tuple[PodMetadata, int] | None:
    """The context's head and its segment's next seq (two reads on a store without HeadTail)."""
    if isinstance(store, HeadTail):
        return store.head_and_tail(context)
    return head_then_tail(store, context)


def head_then_tail(store: Store, context: ContextId) -> tuple[PodMetadata, int] | None:
    """:func:`head_and_tail` in two reads: the head, then its segment's next seq."""
    head = store.get_head(context)
    if head is None:
        return None
    return head, store.next_seq(head.session_id, head.segment_id)


@runtime_checkable
class LockedHeadTail(Protocol):
    """A store that takes a context's lock and reads its head and tail in one round trip."""

    def lock_and_read(
        self, context: ContextId
    ) -> AbstractContextManager[tuple[PodMetadata, int] | None]:
        """Hold the context's lock; give :func:`head_and_tail`'s answer, read under it."""


@contextmanager
def locked_head_and_tail(
    store: Store, context: ContextId
) -> Iterator[tuple[PodMetadata, int] | None]:
    """Hold the context's lock (if the store has one) and give its head and tail read under it."""
    if isinstance(store, LockedHeadTail):
        with store.lock_and_read(context) as found:
            yield found
        return
    with context_lock(store, context):
        yield head_and_tail(store, context)


@runtime_checkable
class Reindexable(Protocol):
    """A store with a derived index that can be rebuilt from the primary data."""

    def reindex(self) -> int:
        """Rebuild the derived index; return the number of contexts indexed."""


class ChangeFeed(Protocol):
    """Notifications of a store's committed writes, received on a connection of their own."""

    def wait(self, timeout: float) -> str | None:
        """A note naming what changed (``session:<id>``, ``context:<id>``); None on timeout."""

    def close(self) -> None:
        """Stop listening and release the connection."""


@runtime_checkable
class Notifying(Protocol):
    """A store that pushes a note on every committed write (PostgreSQL's LISTEN/NOTIFY)."""

    def change_feed(self) -> ChangeFeed:
        """A new feed of this store's writes; close it when done."""


class SessionRecord(msgspec.Struct, frozen=True):
    """One session with a non-empty state record."""

    session_id: SessionId
    owner: str | None
    """The context it belongs to, None while detached."""
    state: dict[str, Any]


@runtime_checkable
class SessionStates(Protocol):
    """The primitives :mod:`terrarium.states` is written on (see the module docstring)."""

    def session_state(self, session_id: SessionId) -> dict[str, Any]:
        """The session's state record (``{}`` if none). Raises SegmentNotFound if no session."""

    def set_session_state(
        self, session_id: SessionId, state: Mapping[str, Any], *, expected: Mapping[str, Any]
    ) -> None:
        """Replace the record if it is ``expected`` now (ConflictError if not)."""

    def session_records(self) -> list[SessionRecord]:
        """Every session whose state record is not empty, with its owner."""

    def session_owner(self, session_id: SessionId) -> str | None:
        """The context the session belongs to, None if detached; SegmentNotFound if none."""

    def unowned_sessions(self) -> list[SessionId]:
        """Every session that belongs to no context, whatever its record says, oldest first."""

    def freeze_session(
        self,
        session_id: SessionId,
        *,
        expected: Mapping[str, Any],
        state: Mapping[str, Any],
        along: Sequence[Path] = (),
    ) -> dict[str, Any]:
        """Freeze the session (``along``'s files too), set its record plus ``cold``; return it."""

    def thaw_session(
        self, session_id: SessionId, *, expected: Mapping[str, Any], state: Mapping[str, Any]
    ) -> None:
        """Move a frozen session back to its hot form and set its record, atomically."""

    def detach_context(
        self,
        context: ContextId,
        session_id: SessionId,
        *,
        expected: Mapping[str, Any],
        state: Mapping[str, Any],
        segment_id: SegmentId | None = None,
    ) -> None:
        """Unbind ``context`` from its session (left detached) and set its record, atomically;
        ContextNotFound unless its head is on the session (and on ``segment_id`` if given)."""

    def delete_session(self, session_id: SessionId) -> bool:
        """Delete a detached session for ever (SessionAttached if attached); False if absent."""


@runtime_checkable
class Lifecycle(Store, SessionStates, Protocol):
    """A store with the state primitives (every backend here is one)."""


#: Compare-and-set retries before a move gives up with the ConflictError: each retry follows
#: another process's change of the same record, so more than a few means a livelock.
ATTEMPTS = 50


def wake_session(store: SessionStates, session_id: SessionId) -> bool:
    """Thaw a frozen session before a write to it (dropping ``archived``); whether it was
    frozen. SegmentNotFound for a frozen detached session: the trash is not written."""
    for _ in range(ATTEMPTS):
        state = store.session_state(session_id)
        if "cold" not in state:
            return False
        if store.session_owner(session_id) is None:
            raise SegmentNotFound(f"session {session_id} is in the trash")
        rest = {k: v for k, v in state.items() if k not in ("archived", "cold")}
        try:
            store.thaw_session(session_id, expected=state, state=rest)
        except ConflictError:
            continue
        return True
    raise ConflictError(f"session {session_id} kept changing while it was being woken")


def refuse_files(along: Sequence[Path]) -> None:
    """What ``freeze_session`` does with ``along`` in a store that keeps no files."""
    if along:
        raise StoreError(f"this store keeps no files, so it cannot take {along[0]} along")


@runtime_checkable
class BlobStore(Protocol):
    """A store that keeps large outputs out of its logs, as content-addressed blobs.

    A blob is named by the sha256 hex digest of its bytes and stored once. Entries refer to
    blobs (:mod:`terrarium.blobs`), each written before the entry that names it; blobs no log
    refers to stay until :func:`terrarium.blobs.collect_garbage`. A backend's
    ``blob_threshold`` (a constructor argument): history strings longer than that many UTF-8
    bytes go to blobs; None or 0 keeps every string inline.
    """

    def put_blob(self, data: bytes) -> str:
        """Store ``data`` once (again: only its age changes); return its sha256 hex digest."""

    def get_blob(self, digest: str) -> bytes:
        """The blob's bytes; BlobNotFound, or CorruptBlob if they do not match ``digest``."""

    def has_blob(self, digest: str) -> bool:
        """Whether the blob is stored."""

    def blob_digests(self) -> list[str]:
        """Every stored blob's digest, sorted."""

    def blob_references(self) -> dict[str, str]:
        """Every digest some log refers to, with where one reference is (file or session)."""

    def delete_unreferenced_blobs(self, *, stored_before: float) -> int:
        """Delete the blobs no log refers to, put before ``stored_before``; return how many."""


def header_line(header: Mapping[str, Any]) -> dict[str, Any]:
    """The stored form of a segment header: seq 0, kind ``header``."""
    line = dict(header)
    line["seq"] = 0
    line.setdefault("kind", "header")
    return line


_ENVELOPE = frozenset(ENVELOPE_KEYS)


def iter_lines(entries: Sequence[NewEntry], first_seq: int) -> Iterator[dict[str, Any]]:
    """Yield the stored form of ``entries`` numbered from ``first_seq``."""
    for offset, entry in enumerate(entries):
        yield entry_line(entry, first_seq + offset)


def entry_line(entry: NewEntry, seq: int) -> dict[str, Any]:
    """The stored form of one entry, numbered ``seq``."""
    if not _ENVELOPE.isdisjoint(entry.data):
        raise InvalidEntry(
            f"entry data of kind {entry.kind!r} may not set the envelope keys "
            f"{sorted(_ENVELOPE.intersection(entry.data))}"
        )
    return {"v": FORMAT_VERSION, "seq": seq, "ts": entry.ts, "kind": entry.kind, **entry.data}
