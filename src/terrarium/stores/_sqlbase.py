"""``SqlStore``: what ``SqliteStore`` and ``PostgresStore`` share, written once.

Both databases hold the same tables (each backend's ``m001_initial``): ``contexts`` (the
heads), ``sessions`` (with the lifecycle's ``state`` record, JSON text, NULL for ``{}``),
``segments``, ``entries``, ``traces``, ``blobs`` and ``blob_refs``, ``archived_contexts`` and
``archived_segments`` (frozen sessions, :mod:`._archive`'s frames). :class:`SqlStore` reads
and moves them the same way on both. A store supplies its connections (``_pooled``,
``_write``, ``_committed``...), its dialect (``_q``, ``_sid``, ``_uuid``), a module of the
statements whose text differs (``_sql``), its tail read and its hot rows' refill.

Statements here use SQLite's placeholders (``?``); PostgreSQL's store turns them into its own
(:func:`pyformat`). Each blob an entry refers to has a ``blob_refs(digest, session_id)`` row,
written in the entry's transaction; GC drops the rows of purged sessions, then the blobs no
row names.

Usage::

    class SqliteStore(SqlStore):
        _sql = terrarium.stores.sqlite._sql
        def _pooled(self) -> AbstractContextManager[sqlite3.Connection]: ...
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import uuid
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from types import ModuleType
from typing import Any, Generic, TypeVar

from terrarium.blobrefs import check_digest, digest_of, line_digests
from terrarium.codec import decode, decode_lines, encode
from terrarium.errors import (
    BlobNotFound,
    ConflictError,
    ContextExists,
    ContextNotFound,
    CorruptBlob,
    SegmentNotFound,
    SessionAttached,
)
from terrarium.model import ContextId, SegmentId, SessionId, utc_now
from terrarium.stores._archive import pack_session, unpack, unpack_lines
from terrarium.stores.base import (
    ClosingStore,
    Derived,
    LiveSession,
    PodMetadata,
    SegmentRead,
    SessionRecord,
    header_line,
    refuse_files,
    wake_session,
)

#: The highest seq there can be, for ranges that run to a segment's end.
MAX_SEQ = 2**31 - 1
T = TypeVar("T")


@functools.cache  # a statement is a constant: each is rewritten once
def pyformat(statement: str) -> str:
    """``statement`` with psycopg's placeholders (``%s``) for SQLite's (``?``)."""
    return statement.replace("?", "%s")


def run_each(conn: Any, statements: Iterable[str], session: Any) -> None:
    """Run each statement with ``session`` its one parameter (a session's deletes and moves)."""
    for statement in statements:
        conn.execute(statement, (session,))


_HEAD_COLUMNS = "context, session_id, segment_id, created_at, updated_at"
#: A hot head and whether its session has segment ``?``, in one statement: one snapshot, so
#: a freeze meanwhile moved both or neither (a segment found frozen is not missing).
HEAD_WITH_SEGMENT = (
    f"SELECT {_HEAD_COLUMNS}, EXISTS (SELECT 1 FROM segments s WHERE s.session_id = "
    "contexts.session_id AND s.segment_id = ?) FROM contexts WHERE context = ?"
)
#: The head of an archived context (its session frozen), by id.
ARCHIVED_HEAD = f"SELECT {_HEAD_COLUMNS} FROM archived_contexts WHERE context = ?"
#: A context's head, hot or archived, in one statement: one snapshot, so a context that a
#: freeze or a thaw moves between the two tables meanwhile is found in one of them (two
#: statements could miss it in both).
HEAD_ANY = (
    f"SELECT {_HEAD_COLUMNS} FROM contexts WHERE context = ? "
    f"UNION ALL SELECT {_HEAD_COLUMNS} FROM archived_contexts WHERE context = ?"
)
HEADS = f"SELECT {_HEAD_COLUMNS} FROM contexts"
INSERT_HEAD = (
    "INSERT INTO contexts (context, type, session_id, segment_id, created_at, updated_at) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
HEADS_OF_TYPE = f"{HEADS} WHERE type = ?"
#: Moves a head if it is on segment ``expected`` (parameters: time, segment, context, expected).
MOVE_HEAD = (
    "UPDATE contexts SET updated_at = ?, segment_id = ? WHERE context = ? AND segment_id = ?"
)
SEGMENT_EXISTS = "SELECT 1 FROM segments WHERE session_id = ? AND segment_id = ?"
SEGMENT_IDS = "SELECT segment_id FROM segments WHERE session_id = ?"
#: A frozen segment's columns, read by reference.
COLD_SEGMENT = "SELECT {columns} FROM archived_segments WHERE session_id = ? AND segment_id = ?"
COLD_SEGMENT_IDS = "SELECT segment_id FROM archived_segments WHERE session_id = ?"
STATE = "SELECT state, context FROM sessions WHERE session_id = ?"
INSERT_SESSION = (
    "INSERT INTO sessions (session_id, context, created_at) VALUES (?, ?, ?) "
    "ON CONFLICT (session_id) DO NOTHING"
)
SESSION_OWNER = "SELECT context, created_at, state FROM sessions WHERE session_id = ?"
SET_STATE = "UPDATE sessions SET state = ? WHERE session_id = ?"
ATTACH_SESSION = "UPDATE sessions SET context = ? WHERE session_id = ?"
DETACH_SESSION = "UPDATE sessions SET context = NULL, state = ? WHERE session_id = ?"
#: From the partial index ``sessions_stated``.
RECORDS = "SELECT session_id, context, state FROM sessions WHERE state IS NOT NULL"
#: From the partial index ``sessions_detached``.
UNOWNED = "SELECT session_id FROM sessions WHERE context IS NULL"
#: A session's head: hot (then ``FOR UPDATE`` on PostgreSQL) or frozen; a frozen one's insert.
_SESSION_HEAD = "SELECT context, type, segment_id, created_at, updated_at FROM {table} "
HOT_HEAD = _SESSION_HEAD.format(table="contexts") + "WHERE session_id = ?"
COLD_HEAD = _SESSION_HEAD.format(table="archived_contexts") + "WHERE session_id = ?"
INSERT_COLD_HEAD = "INSERT INTO archived_contexts VALUES (?, ?, ?, ?, ?, ?)"
DROP_COLD = (
    "DELETE FROM archived_contexts WHERE session_id = ?",
    "DELETE FROM archived_segments WHERE session_id = ?",
)
#: A context's head, hot or frozen, if it is on the session.
DETACH = (
    "DELETE FROM contexts WHERE context = ? AND session_id = ?",
    "DELETE FROM archived_contexts WHERE context = ? AND session_id = ?",
)
DROP_SESSION = (
    "DELETE FROM archived_segments WHERE session_id = ?",
    "DELETE FROM sessions WHERE session_id = ?",
)
INSERT_ARCHIVED_SEGMENT = (
    "INSERT INTO archived_segments (session_id, segment_id, created_at, next_seq, lines, "
    "trace) VALUES (?, ?, ?, ?, ?, ?)"
)
ARCHIVED_SEGMENTS = (
    "SELECT segment_id, created_at, next_seq, lines, trace FROM archived_segments "
    "WHERE session_id = ? ORDER BY segment_id"
)

TOUCH_BLOB = "UPDATE blobs SET stored_at = ? WHERE digest = ?"
# Two writers of one new blob: the second touches the first one's row.
PUT_BLOB = (
    "INSERT INTO blobs (digest, size, data, stored_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (digest) DO UPDATE SET stored_at = excluded.stored_at"
)
GET_BLOB = "SELECT data FROM blobs WHERE digest = ?"
HAS_BLOB = "SELECT 1 FROM blobs WHERE digest = ?"
ALL_BLOBS = "SELECT digest FROM blobs ORDER BY digest"
INSERT_BLOB_REF = "INSERT INTO blob_refs (digest, session_id) VALUES (?, ?) ON CONFLICT DO NOTHING"
LIVE_REFS = (
    "SELECT digest, min(CAST(session_id AS text)) FROM blob_refs r "
    "WHERE EXISTS (SELECT 1 FROM sessions s WHERE s.session_id = r.session_id) GROUP BY digest"
)
DROP_DEAD_REFS = (
    "DELETE FROM blob_refs WHERE NOT EXISTS "
    "(SELECT 1 FROM sessions s WHERE s.session_id = blob_refs.session_id)"
)
DELETE_UNREFERENCED = (
    "DELETE FROM blobs WHERE stored_at < ? AND NOT EXISTS "
    "(SELECT 1 FROM blob_refs r WHERE r.digest = blobs.digest)"
)


class SeqGuesses(Generic[T]):
    """The next seq a store expects for the segments it appended to lately, with a value it
    keeps beside each. Appends propose a seq instead of reading it: a right guess saves a
    query, a wrong one costs a retry. A bounded LRU shared by a store's threads."""

    def __init__(self, size: int = 4096) -> None:
        """Keep guesses for the ``size`` segments appended to most recently."""
        self._size = size
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[SessionId, SegmentId], tuple[int, T]] = OrderedDict()

    def get(self, key: tuple[SessionId, SegmentId]) -> tuple[int, T] | None:
        """The guessed next seq of segment ``key`` and the value kept with it, or None."""
        return self._seen.get(key)

    def remember(self, key: tuple[SessionId, SegmentId], next_seq: int, value: T) -> None:
        """Note that segment ``key`` reached ``next_seq``; a lower one is kept out (another
        thread may be further) unless it comes with a new value (a key looked up again)."""
        with self._lock:
            known = self._seen.get(key)
            if known is None or next_seq > known[0] or value != known[1]:
                self._seen[key] = (next_seq, value)
            self._seen.move_to_end(key)
            if len(self._seen) > self._size:
                self._seen.popitem(last=False)


class SqlStore(ClosingStore):
    """A store over the tables both databases hold (see the module docstring).

    Each lifecycle primitive is one write transaction: the record is read (its row locked),
    compared with the one expected, and written together with the physical move.
    """

    blob_threshold: int | None
    #: Appended to the read of a record that is to change: locks its row (PostgreSQL). A
    #: SQLite write transaction holds the database's one write lock already.
    _FOR_UPDATE = ""
    #: Appended to a new segment's read of its session (PostgreSQL: waits for an attach).
    _KEY_SHARE = ""
    #: The dialect's statements whose text differs (``READ_SEGMENT``, ``DROP_HOT``...).
    _sql: ModuleType
    derived: Derived | None = None
    """The derived index (:func:`terrarium.index.of`), closed with the store."""
    _where: str
    """The database, as error messages name it (never with a password)."""

    _lock: threading.Lock
    _closed: bool
    _idle: list[Any]
    """Idle connections, closed with the store."""

    def _q(self, statement: str) -> str:
        """``statement`` in this database's placeholders."""
        return statement

    def _sid(self, id: uuid.UUID) -> Any:
        """A session or segment id as this database's id columns hold it."""
        return str(id)

    @staticmethod
    def _uuid(value: Any) -> uuid.UUID:
        """An id column's value as a UUID."""
        return uuid.UUID(value)

    _local: threading.local
    """``conn``: the connection this thread holds, its transaction's (SQLite) or the one lent
    to its lifecycle call (PostgreSQL); the thread's reads take it."""

    @abstractmethod
    def _pooled(self) -> AbstractContextManager[Any]:
        """A connection of the store's pool for the block, its errors as StoreErrors."""

    @contextlib.contextmanager
    def _read(self) -> Iterator[Any]:
        """A connection for reads: the one this thread holds, else a pooled one."""
        held = getattr(self._local, "conn", None)
        if held is not None:
            yield held
            return
        with self._pooled() as conn:
            yield conn

    @abstractmethod
    def _write(self) -> AbstractContextManager[Any]:
        """A connection in one write transaction."""

    def _snapshot(self) -> AbstractContextManager[Any]:
        """A connection whose statements read one snapshot, where the database gives one."""
        return self._read()

    @abstractmethod
    def _committed(self) -> AbstractContextManager[Any]:
        """A pooled connection, never the thread's write one: the index reads what is committed."""

    @abstractmethod
    def _next_seq(self, conn: Any, session_id: SessionId, segment_id: SegmentId) -> int:
        """The hot segment's next seq, remembered for appends; SegmentNotFound if none."""

    @abstractmethod
    def _insert_segment(
        self, conn: Any, session_id: SessionId, segment_id: SegmentId, line: Mapping[str, Any]
    ) -> None:
        """A segment's row and header (entry 0) with their blob refs, in the caller's
        transaction. ConflictError if the segment exists."""

    def _wake_on(self, conn: Any, session_id: SessionId) -> bool:
        """Wake the session for a write on ``conn`` if it is frozen; whether it was."""
        return wake_session(self, session_id)

    def _hold_name(self, conn: Any, context: str) -> None:
        """Hold the id ``context`` until the transaction ends, where a create could take it
        meanwhile (PostgreSQL); SQLite's write transaction holds its one write lock."""

    @abstractmethod
    def _refill(
        self, conn: Any, session: Any, segment: Sequence[Any], lines: list[str], trace: list[str]
    ) -> None:
        """Put a frozen segment (``segment``: id, creation time, next seq) back hot."""

    def _freeze_rows(self, conn: Any, session: Any) -> tuple[int, int]:
        """Move a hot session (and its head) to the frozen tables; its bytes hot and frozen.

        Locks are taken in the order of every move (PostgreSQL): the session's row (locked by
        the caller), its context's id (so no create slips between the head's delete and the
        frozen one's insert), its segments, its head. An append waits, finds no row and wakes.
        """
        owner = conn.execute(self._q(SESSION_OWNER + self._FOR_UPDATE), (session,)).fetchone()
        if owner is not None and owner[0] is not None:
            self._hold_name(conn, owner[0])
        segments = conn.execute(self._sql.SESSION_SEGMENTS, (session,)).fetchall()
        head = conn.execute(self._q(HOT_HEAD + self._FOR_UPDATE), (session,)).fetchone()
        # Cursors, not lists: SQLite's streams the lines, a segment at a time.
        lines = conn.execute(self._sql.SESSION_LINES, (session,))
        frozen = pack_session(lines, conn.execute(self._sql.SESSION_TRACES, (session,)))
        rows = [(session, g, at, tail, *frozen.segments[g][1:]) for g, at, tail in segments]
        conn.cursor().executemany(self._q(INSERT_ARCHIVED_SEGMENT), rows)
        if head is not None:
            conn.execute(self._q(INSERT_COLD_HEAD), (session, *head))
        run_each(conn, self._sql.DROP_HOT, session)
        return frozen.hot_bytes, frozen.cold_bytes

    def _thaw_rows(self, conn: Any, session: Any) -> None:
        """Move a frozen session back to the hot tables, its head too if it has one."""
        head = conn.execute(self._q(COLD_HEAD), (session,)).fetchone()
        for *segment, lines, trace in conn.execute(
            self._q(ARCHIVED_SEGMENTS), (session,)
        ).fetchall():
            self._refill(conn, session, segment, unpack_lines(lines), unpack_lines(trace))
        if head is not None:
            context, type_, g, created, updated = head
            conn.execute(self._q(INSERT_HEAD), (context, type_, session, g, created, updated))
        run_each(conn, map(self._q, DROP_COLD), session)

    def _detach_rows(self, conn: Any, context: str, session: Any, segment: Any = None) -> bool:
        """Drop the head of ``context`` (hot or frozen) on ``session`` (``segment``); if any."""
        on = "" if segment is None else " AND segment_id = ?"
        args = (context, session) if segment is None else (context, session, segment)
        return any(conn.execute(self._q(drop + on), args).rowcount for drop in DETACH)

    def close(self) -> None:
        """Close the derived index and the idle connections (busy ones as their call returns)."""
        if self.derived is not None:
            self.derived.close()
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # ---------------------------------------------------------------- heads

    def get_head(self, context: ContextId) -> PodMetadata | None:
        """Return the context's head record, or None."""
        with self._read() as conn:
            row = conn.execute(self._q(HEAD_ANY), (str(context), str(context))).fetchone()
        return None if row is None else self._head(row)

    def list_contexts(self, type: str | None = None) -> list[PodMetadata]:
        """Every head record, optionally of one type, sorted by context id."""
        statement, args = (HEADS, ()) if type is None else (HEADS_OF_TYPE, (type,))
        with self._read() as conn:
            rows = conn.execute(self._q(statement), args).fetchall()
        # (type, name), as ContextId orders, without parsing and validating every id again.
        return sorted(map(self._head, rows), key=lambda h: h.context.partition(":")[::2])

    def set_head(
        self, context: ContextId, segment_id: SegmentId, *, expected: SegmentId
    ) -> PodMetadata:
        """Move the head if it is ``expected`` now (a conditional ``UPDATE``)."""
        with self._read() as conn:
            while True:
                head = self._head_to_move(conn, context, segment_id, expected)
                now = utc_now()
                move = (now, self._sid(segment_id), str(context), self._sid(expected))
                if conn.execute(self._q(MOVE_HEAD), move).rowcount == 1:
                    return PodMetadata(
                        head.context, head.session_id, segment_id, head.created_at, now
                    )
                # The head moved or the context went between the read and the update: the
                # next pass reports which.

    def create_context(self, context: ContextId, header: Mapping[str, Any]) -> PodMetadata:
        """Create the context's session, root segment (its header is entry 0) and head."""
        ctx = ContextId.parse(context)
        line = header_line(header)
        session_id = uuid.UUID(str(line["session_id"]))
        segment_id = uuid.UUID(str(line["segment_id"]))
        ts = str(line["ts"])
        sid, gid = self._sid(session_id), self._sid(segment_id)
        with self._write() as conn:
            self._hold_name(conn, str(ctx))
            if conn.execute(self._q(HEAD_ANY), (str(ctx), str(ctx))).fetchone() is not None:
                raise ContextExists(f"context {ctx} already exists")
            if conn.execute(self._q(INSERT_SESSION), (sid, str(ctx), ts)).rowcount != 1:
                raise ConflictError(f"session {session_id} already exists")
            conn.execute(self._q(INSERT_HEAD), (str(ctx), ctx.type, sid, gid, ts, ts))
            self._insert_segment(conn, session_id, segment_id, line)
        return PodMetadata(str(ctx), session_id, segment_id, ts, ts)

    def attach_context(
        self, context: ContextId, session_id: SessionId, segment_id: SegmentId
    ) -> PodMetadata:
        """Make ``context`` a new context on a detached session's segment, in one transaction
        (a frozen session's head goes to ``archived_contexts``)."""
        ctx = ContextId.parse(context)
        sid, gid = self._sid(session_id), self._sid(segment_id)
        with self._write() as conn:
            created, frozen = self._attachable(conn, ctx, session_id, segment_id)
            now = utc_now()
            if frozen:
                cold = (sid, str(ctx), ctx.type, gid, created, now)
                conn.execute(self._q(INSERT_COLD_HEAD), cold)
            else:
                conn.execute(self._q(INSERT_HEAD), (str(ctx), ctx.type, sid, gid, created, now))
            conn.execute(self._q(ATTACH_SESSION), (str(ctx), sid))
        return PodMetadata(str(ctx), session_id, segment_id, created, now)

    def _head_to_move(
        self, conn: Any, context: ContextId, segment_id: SegmentId, expected: SegmentId
    ) -> PodMetadata:
        """The context's head before a move to ``segment_id``, woken if frozen: ConflictError
        unless it is on ``expected``, SegmentNotFound unless the segment exists."""
        look = (self._sid(segment_id), str(context))
        while (row := conn.execute(self._q(HEAD_WITH_SEGMENT), look).fetchone()) is None:
            cold = conn.execute(self._q(ARCHIVED_HEAD), (str(context),)).fetchone()
            if cold is None:
                raise ContextNotFound.of(context)
            self._wake_on(conn, self._uuid(cold[1]))
        head = self._head(row)
        if head.segment_id != expected:
            raise ConflictError(f"head of {context} is {head.segment_id}, not {expected}: it moved")
        if not row[5]:
            raise SegmentNotFound.of(head.session_id, segment_id)
        return head

    def _attachable(
        self, conn: Any, ctx: ContextId, session_id: SessionId, segment_id: SegmentId
    ) -> tuple[str, bool]:
        """Lock the session's row, then the id (of two attaches, the second finds it
        attached); the session's creation time and whether it is frozen."""
        owner = self._q(SESSION_OWNER + self._FOR_UPDATE)
        row = conn.execute(owner, (self._sid(session_id),)).fetchone()
        if row is None:
            raise SegmentNotFound.of(session_id)
        if row[0] is not None:  # first: a restore that lost a race to another is NotInTrash
            raise SessionAttached(f"session {session_id} already belongs to context {row[0]}")
        self._hold_name(conn, str(ctx))
        if conn.execute(self._q(HEAD_ANY), (str(ctx), str(ctx))).fetchone() is not None:
            raise ContextExists(f"context {ctx} already exists")
        frozen = "cold" in state_record(row[2])
        if not (
            self._cold(conn, "next_seq", session_id, segment_id)
            if frozen
            else self._segment_exists(conn, session_id, segment_id)
        ):
            raise SegmentNotFound.of(session_id, segment_id)
        return str(row[1]), frozen

    def _head(self, row: Sequence[Any]) -> PodMetadata:
        return PodMetadata(row[0], self._uuid(row[1]), self._uuid(row[2]), row[3], row[4])

    # ---------------------------------------------------------------- sessions, segments

    def create_session(self, header: Mapping[str, Any]) -> None:
        """Create a session that belongs to no context (``sessions.context`` NULL)."""
        line = header_line(header)
        session_id = uuid.UUID(str(line["session_id"]))
        with self._write() as conn:
            created = (self._sid(session_id), None, str(line["ts"]))
            if conn.execute(self._q(INSERT_SESSION), created).rowcount != 1:
                raise ConflictError(f"session {session_id} already exists")
            self._insert_segment(conn, session_id, uuid.UUID(str(line["segment_id"])), line)

    def create_segment(self, session_id: SessionId, header: Mapping[str, Any]) -> None:
        """Add a segment, with its header as entry 0, to an existing session."""
        line = header_line(header)
        segment_id = uuid.UUID(str(line["segment_id"]))
        while True:
            with self._write() as conn:
                row = self._state_row(conn, session_id, self._KEY_SHARE)
                if "cold" not in state_record(row[0]):
                    self._insert_segment(conn, session_id, segment_id, line)
                    return
            wake_session(self, session_id)  # frozen: back to the hot tables first

    def read_segment(
        self, session_id: SessionId, segment_id: SegmentId, *, stop_seq: int | None = None
    ) -> SegmentRead:
        """Read a segment's header and entries up to and including ``stop_seq``, each as
        written (key order and unknown keys intact)."""
        stop = MAX_SEQ if stop_seq is None else max(stop_seq, 0)
        args = {"session": self._sid(session_id), "segment": self._sid(segment_id), "stop": stop}
        with self._read() as conn:
            rows = conn.execute(self._sql.READ_SEGMENT, args).fetchall()
        if not rows:  # frozen, or moving: the hot and the frozen rows from one snapshot
            with self._snapshot() as conn:
                rows = conn.execute(self._sql.READ_SEGMENT, args).fetchall()
                cold = None if rows else self._cold_read(conn, session_id, segment_id, stop_seq)
            if cold is not None:
                return cold
        if not rows:
            raise SegmentNotFound.of(session_id, segment_id)
        lines = self._lines(rows, segment_id, 0)
        entries = lines[1:] if stop_seq is None or stop_seq >= 0 else []
        return SegmentRead(header=lines[0], entries=entries, next_seq=int(rows[0][1]) + 1)

    def next_seq(self, session_id: SessionId, segment_id: SegmentId) -> int:
        """The seq the next append gets."""
        with self._read() as conn:
            with contextlib.suppress(SegmentNotFound):
                return self._next_seq(conn, session_id, segment_id)
        with self._snapshot() as conn:  # frozen, or moving: see read_segment
            try:
                return self._next_seq(conn, session_id, segment_id)
            except SegmentNotFound:
                cold = self._cold(conn, "next_seq", session_id, segment_id)
                if cold is None:
                    raise
                return int(cold)

    def list_segments(self, session_id: SessionId) -> list[SegmentId]:
        """The session's segment ids, oldest first (UUIDv7 order)."""
        with self._read() as conn:
            ids = self._hot_ids(conn, session_id)
        if not ids:
            with self._snapshot() as conn:  # frozen, or moving: see read_segment
                ids = self._hot_ids(conn, session_id) or self._cold_ids(conn, session_id)
        if not ids:
            raise SegmentNotFound.of(session_id)
        return sorted(ids)

    def read_trace(self, session_id: SessionId, segment_id: SegmentId) -> list[dict[str, Any]]:
        """The segment's debug trace, oldest first."""
        ids = (self._sid(session_id), self._sid(segment_id))
        with self._read() as conn:
            rows = conn.execute(self._sql.READ_TRACE, ids).fetchall()
        if not rows:  # none, frozen, or moving: the hot and the frozen rows from one snapshot
            with self._snapshot() as conn:
                rows = conn.execute(self._sql.READ_TRACE, ids).fetchall()
                if not rows and not self._segment_exists(conn, session_id, segment_id):
                    cold = self._cold_trace(conn, session_id, segment_id)
                    if cold is None:
                        raise SegmentNotFound.of(session_id, segment_id)
                    return cold
        return [decode(row[0]) for row in rows]

    def _lines(self, rows: Sequence[Any], segment_id: SegmentId, first: int) -> list[Any]:
        """The entries of ``rows`` (each a ``line`` first), numbered from seq ``first``."""
        data = ("\n".join([row[0] for row in rows]) + "\n").encode()
        return decode_lines(data, where=f"{self._where} segment {segment_id}", first_line=first)

    def _hot_ids(self, conn: Any, session_id: SessionId) -> list[SegmentId]:
        rows = conn.execute(self._q(SEGMENT_IDS), (self._sid(session_id),))
        return [self._uuid(row[0]) for row in rows]

    def _segment_exists(self, conn: Any, session_id: SessionId, segment_id: SegmentId) -> bool:
        ids = (self._sid(session_id), self._sid(segment_id))
        return conn.execute(self._q(SEGMENT_EXISTS), ids).fetchone() is not None

    # ---------------------------------------------------------------- change cursor

    # Many sessions a statement: 10k sessions of a first index build on a local PostgreSQL
    # took 30,002 statements and 17.6 s at three a session, 42 and 5.8 s at one a page.
    def live_sessions(self, session_ids: Sequence[SessionId]) -> dict[SessionId, LiveSession]:
        """Each hot, attached session's head and segment tails (``ChangeLog``): one statement."""
        ids = encode([str(s) for s in session_ids]).decode()
        with self._committed() as conn:
            rows = conn.execute(self._sql.LIVE_SESSIONS, (ids,)).fetchall()
        found: dict[SessionId, LiveSession] = {}
        for row in rows:
            head = self._head(row)
            tails = found.setdefault(head.session_id, (head, {}))[1]
            if row[6] is not None:
                tails[self._uuid(row[5])] = int(row[6])
        return found

    def entries_from(
        self, reads: Sequence[tuple[SessionId, SegmentId, int]]
    ) -> list[list[dict[str, Any]]]:
        """Each read's hot segment lines from its seq on (``ChangeLog``): one statement."""
        wanted = encode([[str(s), str(g), seq] for s, g, seq in reads]).decode()
        with self._committed() as conn:
            rows = conn.execute(self._sql.ENTRIES_FROM, (wanted,)).fetchall()
        found: list[list[tuple[str]]] = [[] for _ in reads]
        for n, line in rows:
            found[n].append((line,))
        return [
            self._lines(lines, g, seq) if lines else []
            for lines, (_, g, seq) in zip(found, reads, strict=True)
        ]

    # ---------------------------------------------------------------- blobs

    def put_blob(self, data: bytes) -> str:
        """Store ``data`` once; return its digest."""
        data = bytes(data)
        digest = digest_of(data)
        now = time.time()
        with self._write() as conn:
            if conn.execute(self._q(TOUCH_BLOB), (now, digest)).rowcount == 0:
                conn.execute(self._q(PUT_BLOB), (digest, len(data), data, now))
        return digest

    def get_blob(self, digest: str) -> bytes:
        """The blob's bytes, checked against ``digest``."""
        with self._read() as conn:
            row = conn.execute(self._q(GET_BLOB), (check_digest(digest),)).fetchone()
        if row is None:
            raise BlobNotFound(f"blob {digest} is not in the database")
        data = bytes(row[0])
        if digest_of(data) != digest:
            raise CorruptBlob(f"blob {digest} in the database does not match its digest")
        return data

    def has_blob(self, digest: str) -> bool:
        """Whether the blob is stored."""
        with self._read() as conn:
            return conn.execute(self._q(HAS_BLOB), (check_digest(digest),)).fetchone() is not None

    def blob_digests(self) -> list[str]:
        """Every stored blob's digest, sorted."""
        with self._read() as conn:
            return [row[0] for row in conn.execute(self._q(ALL_BLOBS))]

    def blob_references(self) -> dict[str, str]:
        """Every digest an existing session refers to, with one such session."""
        with self._read() as conn:
            return {row[0]: f"session {row[1]}" for row in conn.execute(self._q(LIVE_REFS))}

    def delete_unreferenced_blobs(self, *, stored_before: float) -> int:
        """Drop the references of purged sessions, then the blobs nothing refers to."""
        with self._write() as conn:
            conn.execute(self._q(DROP_DEAD_REFS))
            return int(conn.execute(self._q(DELETE_UNREFERENCED), (stored_before,)).rowcount)

    def _record_refs(self, conn: Any, session: Any, lines: Iterable[Mapping[str, Any]]) -> None:
        """Add the ``blob_refs`` rows of ``lines``' blobs, in the caller's transaction."""
        rows = sorted({(digest, session) for line in lines for digest in line_digests(line)})
        if rows:
            conn.cursor().executemany(self._q(INSERT_BLOB_REF), rows)

    # ---------------------------------------------------------------- session states

    def session_state(self, session_id: SessionId) -> dict[str, Any]:
        """The session's state record (``{}`` if none)."""
        with self._read() as conn:
            return state_record(self._state_row(conn, session_id)[0])

    def set_session_state(
        self, session_id: SessionId, state: Mapping[str, Any], *, expected: Mapping[str, Any]
    ) -> None:
        """Replace the record if it is ``expected`` now."""
        with self._write() as conn:
            self._check(conn, session_id, expected)
            self._put(conn, session_id, state)

    def session_records(self) -> list[SessionRecord]:
        """Every session whose record is not empty, with its owner."""
        with self._read() as conn:
            rows = conn.execute(self._q(RECORDS)).fetchall()
        found = [SessionRecord(self._uuid(s), owner, state_record(text)) for s, owner, text in rows]
        return [record for record in found if record.state]

    def session_owner(self, session_id: SessionId) -> str | None:
        """The context the session belongs to, None if detached."""
        with self._read() as conn:
            owner = self._state_row(conn, session_id)[1]
        return None if owner is None else str(owner)

    def unowned_sessions(self) -> list[SessionId]:
        """Every session that belongs to no context, oldest first (UUIDv7 order)."""
        with self._read() as conn:
            return sorted(self._uuid(row[0]) for row in conn.execute(self._q(UNOWNED)))

    def freeze_session(
        self,
        session_id: SessionId,
        *,
        expected: Mapping[str, Any],
        state: Mapping[str, Any],
        along: Sequence[Path] = (),
    ) -> dict[str, Any]:
        """Move the session to its frozen form and set its record, in one transaction."""
        refuse_files(along)
        with self._write() as conn:
            now = self._check(conn, session_id, expected)
            if "cold" in now:  # frozen already: the record changes, the rows stay
                cold = now["cold"]
            else:
                hot, packed = self._freeze_rows(conn, self._sid(session_id))
                cold = {"hot_bytes": hot, "cold_bytes": packed}
            stored = state_record(line_text({**state, "cold": cold}))
            self._put(conn, session_id, stored)
        return stored

    def thaw_session(
        self, session_id: SessionId, *, expected: Mapping[str, Any], state: Mapping[str, Any]
    ) -> None:
        """Move a frozen session back to the hot tables and set its record."""
        with self._write() as conn:
            if "cold" in self._check(conn, session_id, expected):
                self._thaw_rows(conn, self._sid(session_id))
            self._put(conn, session_id, {k: v for k, v in state.items() if k != "cold"})

    def detach_context(
        self,
        context: ContextId,
        session_id: SessionId,
        *,
        expected: Mapping[str, Any],
        state: Mapping[str, Any],
        segment_id: SegmentId | None = None,
    ) -> None:
        """Drop the context's head, leave its session detached and set its record."""
        with self._write() as conn:
            self._check(conn, session_id, expected)
            on = None if segment_id is None else self._sid(segment_id)
            if not self._detach_rows(conn, str(context), self._sid(session_id), on):
                raise ContextNotFound(f"context {context} is not on session {session_id}")
            conn.execute(self._q(DETACH_SESSION), (_text(state), self._sid(session_id)))

    def delete_session(self, session_id: SessionId) -> bool:
        """Delete a detached session, its record and its rows, for ever."""
        sid = self._sid(session_id)
        with self._write() as conn:
            row = conn.execute(self._q(STATE + self._FOR_UPDATE), (sid,)).fetchone()
            if row is None:
                return False
            if row[1] is not None:
                raise SessionAttached(f"session {session_id} belongs to context {row[1]}")
            run_each(conn, self._sql.DROP_HOT, sid)
            run_each(conn, map(self._q, DROP_SESSION), sid)
        return True

    def _check(
        self, conn: Any, session_id: SessionId, expected: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The session's record, locked; ConflictError unless it is ``expected``."""
        now = state_record(self._state_row(conn, session_id, self._FOR_UPDATE)[0])
        if now != dict(expected):
            raise ConflictError(f"the state of session {session_id} changed meanwhile")
        return now

    def _state_row(self, conn: Any, session_id: SessionId, lock: str = "") -> Any:
        """The session's ``STATE`` row, read with ``lock``; SegmentNotFound if there is none."""
        row = conn.execute(self._q(STATE + lock), (self._sid(session_id),)).fetchone()
        if row is None:
            raise SegmentNotFound.of(session_id)
        return row

    def _put(self, conn: Any, session_id: SessionId, state: Mapping[str, Any]) -> None:
        conn.execute(self._q(SET_STATE), (_text(state), self._sid(session_id)))

    def _cold(self, conn: Any, column: str, session_id: SessionId, segment_id: SegmentId) -> Any:
        """One column of a frozen segment's row, or None if there is none (``trace`` may be
        NULL: look at ``next_seq`` first)."""
        ids = (self._sid(session_id), self._sid(segment_id))
        row = conn.execute(self._q(COLD_SEGMENT.format(columns=column)), ids).fetchone()
        return None if row is None else row[0]

    def _cold_read(
        self, conn: Any, session_id: SessionId, segment_id: SegmentId, stop_seq: int | None
    ) -> SegmentRead | None:
        """Read a frozen segment (decompressing it), or None if there is none."""
        blob = self._cold(conn, "lines", session_id, segment_id)
        if blob is None:
            return None
        where = f"{self!r} frozen segment {segment_id}"
        lines = decode_lines(unpack(blob, where=where), where=where, first_line=0)
        stop = len(lines) if stop_seq is None else max(stop_seq, 0) + 1
        return SegmentRead(header=lines[0], entries=lines[1:stop], next_seq=len(lines))

    def _cold_ids(self, conn: Any, session_id: SessionId) -> list[SegmentId]:
        """A frozen session's segments, oldest first."""
        rows = conn.execute(self._q(COLD_SEGMENT_IDS), (self._sid(session_id),))
        return sorted(self._uuid(row[0]) for row in rows)

    def _cold_trace(
        self, conn: Any, session_id: SessionId, segment_id: SegmentId
    ) -> list[dict[str, Any]] | None:
        """A frozen segment's trace, or None."""
        if self._cold(conn, "next_seq", session_id, segment_id) is None:
            return None
        trace = self._cold(conn, "trace", session_id, segment_id)
        return [decode(line) for line in unpack_lines(trace)]


def state_record(text: str | None) -> dict[str, Any]:
    """A ``state`` column's record (NULL: ``{}``)."""
    if text is None:
        return {}
    found: dict[str, Any] = decode(text)
    return found


def line_text(line: Any) -> str:
    """An entry, trace event or record as a text column holds it: its JSON, as encoded."""
    return encode(line).decode()


def _text(state: Mapping[str, Any]) -> str | None:
    """A record as the ``state`` column holds it (``{}``: NULL)."""
    return line_text(dict(state)) if state else None
