"""``SqliteStore``: every context in one SQLite database file.

For one machine where a single file is handier than a folder tree (backups, copies, ad hoc SQL
with the ``sqlite3`` shell). It owns the heads, sessions, segments, entries and traces (schema:
:mod:`._sql`, :mod:`.migrations`) and a change cursor that the derived index
(:mod:`terrarium.index`, in ``{database}.search.db``) follows for listing and search.

The trade-off: an append is one ``INSERT`` under SQLite's single write lock, so writers are
serialised (waiting up to ``busy_timeout``) while readers, in WAL mode, never wait.
``synchronous="NORMAL"`` survives a process crash, not a power cut; ``"FULL"`` does, for
~250-300 us more per append.

Usage::

    import terrarium as t
    from terrarium.search import SearchQuery
    from terrarium.stores import SqliteStore

    with SqliteStore("sessions.db") as store:  # listing and search: terrarium.index
        t.create_segment(store, t.SegmentStartState(), context="cli:main")
        t.save_user_input(store, store.get_head(t.ContextId.parse("cli:main")), "Hello!")
        hits = t.search(store, SearchQuery("hello"))
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import Any

from terrarium.blobrefs import DEFAULT_THRESHOLD, line_digests
from terrarium.errors import ConflictError, SegmentNotFound, StoreError, TerrariumError
from terrarium.model import ContextId, SegmentId, SessionId, TraceEntry
from terrarium.stores import _db
from terrarium.stores._archive import envelopes
from terrarium.stores._files import inside
from terrarium.stores._sqlbase import STATE, SeqGuesses, SqlStore, line_text, state_record
from terrarium.stores.base import INDEX_DB, NewEntry, iter_lines, wake_session
from terrarium.stores.locks import file_lock, remove_lock
from terrarium.stores.sqlite import _sql as sql
from terrarium.stores.sqlite.migrations import MIGRATIONS, check_readable, migrate, refuse_foreign

__all__ = ["MIGRATIONS", "SYNCHRONOUS_MODES", "SqliteStore", "migrate"]

SYNCHRONOUS_MODES: tuple[str, ...] = ("OFF", "NORMAL", "FULL", "EXTRA")

log = logging.getLogger(__name__)

#: Segments whose next seq and key (``segments.id``) a store remembers. A key is kept only
#: once committed (None: look it up): keys are ``AUTOINCREMENT``, so a committed one never
#: names another segment, and an append with the key of a deleted segment fails its check and
#: looks again. A key read inside a caller's transaction may be rolled back, so it is not kept.
_SEEN_CACHE = 4096


class SqliteStore(SqlStore):
    """A store in one SQLite database file (see the module docstring)."""

    _sql = sql

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "NORMAL",
        busy_timeout: float = 30.0,
        blob_threshold: int | None = DEFAULT_THRESHOLD,
    ) -> None:
        """Open (creating and migrating if needed) the database at ``path``.

        Args:
            path: the database file; its folder is created if missing.
            synchronous: SQLite's ``synchronous`` setting: ``NORMAL`` (default: survives a
                process crash, a power cut may lose the last transactions), ``FULL`` (survives
                power loss), ``EXTRA`` or ``OFF``.
            busy_timeout: seconds to wait for another process's write lock.
            blob_threshold: history strings over this many bytes go to the ``blobs`` table
                (:mod:`terrarium.blobs`); None or 0 keeps them inline.

        A database this process cannot write (or a full disk) is opened read-only.

        Raises:
            FormatVersionError: the database was written by a newer terrarium.
            StoreError: the file is not a SQLite database or is another program's, WAL cannot
                be enabled on it, or it is read-only and needs a migration.
        """
        if str(path) == ":memory:" or str(path).startswith("file:"):
            raise ValueError(
                f"SqliteStore needs a database file path, not {str(path)!r} "
                "(use MemoryStore for a store in memory)"
            )
        mode = synchronous.upper()
        if mode not in SYNCHRONOUS_MODES:
            raise ValueError(
                f"unknown synchronous mode {synchronous!r}: use one of {SYNCHRONOUS_MODES}"
            )
        self.path = Path(path).absolute()
        self._where = str(self.path)
        self.synchronous = mode
        self.busy_timeout = busy_timeout
        self.blob_threshold = blob_threshold
        self._lock = threading.Lock()
        self._local = threading.local()
        # A next seq this store saw each recent segment reach (its guess for the next append)
        # with its ids as text and its key (see _SEEN_CACHE).
        self._seen: SeqGuesses[tuple[str, str, int | None]] = SeqGuesses(_SEEN_CACHE)
        self._closed = False
        self.readonly_reason: str | None = None
        """Why the database is opened read-only (see :meth:`_open`), or None."""
        self._idle: list[sqlite3.Connection] = [self._open()]

    def _open(self) -> sqlite3.Connection:
        """The first connection, read-only (unmigrated) where the database cannot be written;
        the file created ``0600`` first, so its ``-wal`` and ``-shm`` are too."""
        if self.path.exists() and not _db.writable(self.path):
            self.readonly_reason = "read-only"
        else:
            try:
                _db.create_private(self.path)
            except OSError as exc:
                raise StoreError(f"{self.path}: cannot create it: {_db.describe(exc)}") from exc
        try:
            return self._open_first()
        except sqlite3.DatabaseError as exc:
            found = _db.kind(exc, self.path)
            if self.readonly_reason is not None or found not in ("full", "readonly"):
                raise self._error(exc) from exc
            self.readonly_reason = _db.describe(exc, self.path)
        try:
            return self._open_first()
        except sqlite3.DatabaseError as again:
            raise self._error(again) from again

    @property
    def readonly(self) -> bool:
        """Whether the database is opened read-only (see :meth:`_open`)."""
        return self.readonly_reason is not None

    def _open_first(self) -> sqlite3.Connection:
        """The first connection: migrated (or, read-only, checked readable), in WAL mode."""
        conn = self._connect()
        try:
            refuse_foreign(conn, where=str(self.path))
            if self.readonly:
                check_readable(conn, where=str(self.path))
            else:
                mode_now = _db.enable_wal(conn, self.busy_timeout)
                if str(mode_now).lower() != "wal":
                    raise StoreError(f"{self.path}: cannot use WAL journaling (got {mode_now!r})")
                migrate(conn, where=str(self.path))
        except BaseException:
            conn.close()
            raise
        return conn

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r}, synchronous={self.synchronous!r})"

    # ---------------------------------------------------------------- connections
    # A thread borrows an idle connection for one call (one per thread would leak with thread
    # pools that churn). Inside atomic() the thread keeps it; nested blocks are savepoints.

    def _connect(self) -> sqlite3.Connection:
        conn = _db.connect(self.path, timeout=self.busy_timeout, readonly=self.readonly)
        try:
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            conn.execute(f"PRAGMA wal_autocheckpoint = {sql.AUTOCHECKPOINT}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _error(self, exc: sqlite3.Error) -> StoreError:
        """``exc`` as a one-line StoreError naming the database (and a full disk as one)."""
        return StoreError(_db.failure(exc, self.path, self.readonly_reason))

    def _borrow(self) -> sqlite3.Connection:
        with self._lock:
            if self._closed:
                raise StoreError(f"{self!r} is closed")
            if self._idle:
                return self._idle.pop()
        try:
            return self._connect()
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    def _give_back(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            if not self._closed and not conn.in_transaction:
                self._idle.append(conn)
                return
        conn.close()

    @contextmanager
    def _pooled(self) -> Iterator[sqlite3.Connection]:
        """An idle connection for the block, given back after; its errors as StoreErrors."""
        conn = self._borrow()
        try:
            yield conn
        except sqlite3.OperationalError as exc:
            raise self._error(exc) from exc
        finally:
            self._give_back(conn)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``), or a savepoint when already in one."""
        local = self._local
        held: sqlite3.Connection | None = getattr(local, "conn", None)
        if held is not None:
            depth = local.depth = local.depth + 1
            name = f"terrarium_{depth}"
            held.execute(f"SAVEPOINT {name}")
            try:
                yield held
            except BaseException:
                held.execute(f"ROLLBACK TO {name}")
                held.execute(f"RELEASE {name}")
                raise
            else:
                held.execute(f"RELEASE {name}")
            finally:
                local.depth = depth - 1
            return
        with self._pooled() as conn:
            local.conn, local.depth = conn, 0
            try:
                with _db.immediate(conn):
                    yield conn
            finally:
                local.conn = None

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """Run the calls in the ``with`` block in one transaction: all of them or none.

        Blocks nest (inner ones are savepoints). The write lock is held for the whole
        outermost block, so keep it short; it applies to the calling thread only.
        """
        with self._write():
            yield

    @contextmanager
    def _snapshot(self, *, pooled: bool = False) -> Iterator[sqlite3.Connection]:
        """A connection in a read transaction: one snapshot for every statement (``pooled``: a
        pooled one, never the thread's write one)."""
        with self._pooled() if pooled else self._read() as conn:
            own = not conn.in_transaction
            if own:
                conn.execute("BEGIN")
            try:
                yield conn
            finally:
                if own:
                    conn.execute("COMMIT")

    # ---------------------------------------------------------------- change cursor

    def changes(self, after: str | None) -> tuple[list[SessionId] | None, str]:
        """The sessions written since ``after`` (``ChangeLog``; ``entry id.change id``)."""
        with self._committed() as conn:
            top = conn.execute(sql.CHANGES_TOP).fetchone()
            now = f"{top[0]}.{top[1]}"
            seen = _position(after)
            if seen is None or seen[0] > top[0] or seen[1] > top[1]:
                return None, now
            if seen == tuple(top):  # the usual read: nothing written since
                return [], now
            rows = conn.execute(sql.CHANGES_AFTER, seen).fetchall()
        return [uuid.UUID(row[0]) for row in rows], now

    def _committed(self) -> AbstractContextManager[sqlite3.Connection]:
        return self._snapshot(pooled=True)

    def index_source(self) -> Path:
        """The derived index's file (``Indexed``), beside this database; StoreError for a
        database of a development build that kept no change cursor."""
        with self._read() as conn:
            if conn.execute(sql.HAS_CHANGES).fetchone() is None:
                raise StoreError(
                    f"{self.path}: made by an earlier development build of terrarium, with no "
                    f"change cursor to list or search by; copy it into a new store: terrarium "
                    f"copy sqlite:///{self.path.resolve()} sqlite:///NEW.db"
                )
        return self.path.with_name(f"{self.path.name}.{INDEX_DB}")

    # ---------------------------------------------------------------- contexts

    @contextmanager
    def lock_context(self, context: ContextId) -> Iterator[None]:
        """Hold the context's lock exclusively, across threads and processes: a ``flock`` in
        ``{database}-locks/`` (a lock table would need polling, a transaction block writers).
        Released on a context with no head (deleted meanwhile, or never made), its file goes."""
        ctx = ContextId.parse(context)
        path = self.path.with_name(f"{self.path.name}-locks") / ctx.type / ctx.encoded_name
        if not inside(path, self.path.parent):  # a link there: never a lock outside
            raise StoreError(
                f"{path} leads outside the store's folder: terrarium never follows a link out of it"
            )
        with file_lock(path):
            yield
        with suppress(TerrariumError, OSError):  # a file left is harmless
            if self.get_head(ctx) is None:
                remove_lock(path)

    # ---------------------------------------------------------------- frozen sessions
    # A write finds a frozen session on its miss path only, wakes it and tries again.

    def _refill(
        self,
        conn: sqlite3.Connection,
        session: str,
        segment: Sequence[Any],
        lines: list[str],
        trace: list[str],
    ) -> None:
        """Put a frozen segment back hot, under a new key (a cached one fails its check)."""
        g, created, _ = segment
        seg = conn.execute(sql.INSERT_SEGMENT, (session, g, created)).lastrowid
        found = zip(envelopes(lines), lines, strict=True)
        conn.executemany(sql.INSERT_ENTRY, [(seg, e.seq, e.kind, str(e.ts), t) for e, t in found])
        conn.executemany(sql.INSERT_TRACE, [(session, g, t) for t in trace])

    def _woke(self, conn: sqlite3.Connection, session: str) -> bool:
        """Wake the session if it is frozen (SegmentNotFound in the trash); whether it was."""
        row = conn.execute(STATE, (session,)).fetchone()
        frozen = row is not None and "cold" in state_record(row[0])
        return frozen and wake_session(self, uuid.UUID(session))

    def _tail_waking(self, conn: sqlite3.Connection, session: str, segment: str) -> tuple[int, int]:
        """:func:`_tail`, waking a frozen session first: an append's miss path, in one
        transaction so no freeze or thaw slips between."""
        try:
            return _tail(conn, session, segment)
        except SegmentNotFound:
            with self._write() as writing:  # a savepoint in the caller's transaction, if any
                while True:
                    try:
                        return _tail(writing, session, segment)
                    except SegmentNotFound:
                        if not self._woke(writing, session):
                            raise

    # ---------------------------------------------------------------- segments

    def _insert_segment(
        self,
        conn: sqlite3.Connection,
        session_id: SessionId,
        segment_id: SegmentId,
        line: Mapping[str, Any],
    ) -> None:
        s, g, ts = str(session_id), str(segment_id), str(line["ts"])
        try:
            seg = conn.execute(sql.INSERT_SEGMENT, (s, g, ts)).lastrowid
        except sqlite3.IntegrityError:  # UNIQUE (session_id, segment_id)
            raise ConflictError(f"segment {segment_id} already exists") from None
        conn.execute(sql.INSERT_ENTRY, (seg, 0, line["kind"], ts, line_text(line)))
        self._record_refs(conn, s, [line])

    def append(
        self,
        session_id: SessionId,
        segment_id: SegmentId,
        entries: Sequence[NewEntry],
        *,
        expected_seq: int | None = None,
    ) -> int:
        """Append entries atomically; return the first one's seq.

        One entry is one compare-and-append ``INSERT`` (:data:`._sql.APPEND_ONE`) at
        ``expected_seq`` or the seq last seen; refused, it reads the tail and raises
        ConflictError or retries. Several go in one ``BEGIN IMMEDIATE`` transaction.
        """
        if len(entries) != 1 or line_digests(entries[0].data):  # blob_refs: one transaction
            return self._append_many(session_id, segment_id, entries, expected_seq)
        key = (session_id, segment_id)
        seen = self._seen.get(key)
        proposal, (s, g, seg) = seen or (None, (str(session_id), str(segment_id), None))
        if expected_seq is not None:
            proposal = expected_seq
        held: sqlite3.Connection | None = getattr(self._local, "conn", None)
        conn = held if held is not None else self._borrow()
        looked = False  # whether this call read the segment's key (see _SEEN_CACHE)
        try:
            while True:
                if seg is None or proposal is None:
                    seg, at = self._tail_waking(conn, s, g)
                    looked, proposal = True, at if expected_seq is None else expected_seq
                line = next(iter_lines(entries, proposal))
                row = (seg, proposal, line["kind"], line["ts"], line_text(line))
                try:
                    conn.execute(sql.APPEND_ONE, row)
                    break
                except sqlite3.IntegrityError:  # seq taken, the one before missing, key gone
                    looked, (seg, at) = True, self._tail_waking(conn, s, g)
                if expected_seq is not None and at != expected_seq:  # equal: woken, new key
                    raise ConflictError.stale_seq(segment_id, at, expected_seq)
                proposal = at
        except sqlite3.OperationalError as exc:
            raise self._error(exc) from exc
        finally:
            if held is None:
                self._give_back(conn)
        self._seen.remember(key, proposal + 1, (s, g, None if looked and held is not None else seg))
        return proposal

    def _append_many(
        self,
        session_id: SessionId,
        segment_id: SegmentId,
        entries: Sequence[NewEntry],
        expected_seq: int | None,
    ) -> int:
        """Append several entries (or none) in one ``BEGIN IMMEDIATE`` transaction."""
        s, g = str(session_id), str(segment_id)
        outermost = getattr(self._local, "conn", None) is None  # else seg may be rolled back
        with self._write() as conn:
            seg, first = self._tail_waking(conn, s, g)
            if expected_seq is not None and expected_seq != first:
                raise ConflictError.stale_seq(segment_id, first, expected_seq)
            rows = [
                (seg, line["seq"], line["kind"], line["ts"], line_text(line))
                for line in iter_lines(entries, first)
            ]
            conn.executemany(sql.INSERT_ENTRY, rows)
            self._record_refs(conn, s, [entry.data for entry in entries])
        self._seen.remember(
            (session_id, segment_id), first + len(rows), (s, g, seg if outermost else None)
        )
        return first

    def _next_seq(
        self, conn: sqlite3.Connection, session_id: SessionId, segment_id: SegmentId
    ) -> int:
        s, g = str(session_id), str(segment_id)
        seg, next_seq = _tail(conn, s, g)
        held = getattr(self._local, "conn", None) is not None  # a key read there may roll back
        self._seen.remember((session_id, segment_id), next_seq, (s, g, None if held else seg))
        return next_seq

    def append_trace(
        self, session_id: SessionId, segment_id: SegmentId, entries: Sequence[TraceEntry]
    ) -> None:
        """Append raw stream events to the segment's debug trace."""
        s, g = str(session_id), str(segment_id)
        with self._write() as conn:
            self._tail_waking(conn, s, g)  # SegmentNotFound unless it exists, woken if frozen
            conn.executemany(sql.INSERT_TRACE, [(s, g, line_text(e.to_dict())) for e in entries])


def _position(text: str | None) -> tuple[int, int] | None:
    """A change cursor position (``entry id.change id``), or None if ``text`` is not one."""
    entry, _, change = (text or "").partition(".")
    return (int(entry), int(change)) if entry.isdigit() and change.isdigit() else None


def _tail(conn: sqlite3.Connection, session: str, segment: str) -> tuple[int, int]:
    """The segment's key and next seq; SegmentNotFound if there is no such segment."""
    row = conn.execute(sql.SEGMENT_TAIL, (session, segment)).fetchone()
    if row is None or row[1] is None:
        raise SegmentNotFound.of(session, segment)
    return int(row[0]), int(row[1]) + 1
