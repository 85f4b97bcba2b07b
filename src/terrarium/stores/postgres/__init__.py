"""``PostgresStore``: the shared store for agents on many machines.

Needs the ``postgres`` extra (``pip install 'terrarium-sessions[postgres]'``): psycopg 3 and its
connection pool. It owns one schema (``terrarium`` by default) of a PostgreSQL database, created
and migrated on open like every other backend (:mod:`.migrations` holds the tables, :mod:`._sql`
the statements). Listing and search are the derived index's (:mod:`terrarium.index`): a file on
each machine, built on its first listing or search from the store's change cursor.

The trade-off: every append is one autocommitted statement, durable once PostgreSQL has
committed it (a server crash too, with ``synchronous_commit = on``), and costs about one bare
``INSERT``. Every table but the directory of heads is keyed by ``session_id`` first, so it can
be distributed by session (Citus) unchanged.

Usage::

    from terrarium.model import ContextId
    from terrarium.stores.postgres import PostgresStore

    with PostgresStore("postgresql://app@db/agents", schema="terrarium") as store:
        head = store.get_head(ContextId("cli", "main"))
"""

from __future__ import annotations

import contextlib
import re
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, cast

from terrarium.blobrefs import DEFAULT_THRESHOLD, line_digests
from terrarium.errors import (
    ConflictError,
    SegmentNotFound,
    StoreError,
    StoreUnavailable,
    install_hint,
)
from terrarium.model import ContextId, SegmentId, SessionId, TraceEntry
from terrarium.stores._archive import envelopes
from terrarium.stores._changes import index_folder
from terrarium.stores._redact import redact_url
from terrarium.stores._sqlbase import SeqGuesses, SqlStore, line_text, pyformat
from terrarium.stores.base import (
    ATTEMPTS,
    INDEX_DB,
    NewEntry,
    PodMetadata,
    head_then_tail,
    iter_lines,
    wake_session,
)

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg import pq
    from psycopg_pool import PoolTimeout
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"PostgresStore needs psycopg 3 and psycopg_pool: {install_hint('postgres')}"
    ) from exc

from terrarium.stores.postgres import _sql
from terrarium.stores.postgres._pool import CONNECTION_ERRORS, Pool, alive, retried
from terrarium.stores.postgres.migrations import MIGRATIONS, migrate
from terrarium.stores.postgres.notify import ChangeFeed

__all__ = ["DEFAULT_SCHEMA", "MIGRATIONS", "PostgresStore", "migrate"]

DEFAULT_SCHEMA = "terrarium"

_SEEN_CACHE = 4096
_IDLE_LOCK_CONNECTIONS = 4
#: A change cursor position: a ``pg_snapshot`` as text (``xmin:xmax:in-progress ids``).
_SNAPSHOT = re.compile(r"\d+:(\d+):(?:\d+(?:,\d+)*)?")
#: What a server that keeps ``pg_control_system()`` from a role answers (:meth:`store_id`).
_HIDDEN = (pg_errors.ProgrammingError, pg_errors.NotSupportedError)  # no right, no function


class PostgresStore(SqlStore):
    """A store in a PostgreSQL database, shared by many processes on many machines."""

    _sql = _sql

    def __init__(
        self,
        dsn: str,
        *,
        pool_size: int = 10,
        schema: str = DEFAULT_SCHEMA,
        connect_timeout: float = 30.0,
        blob_threshold: int | None = DEFAULT_THRESHOLD,
    ) -> None:
        """Connect, create or migrate the schema, and open a connection pool.

        Args:
            dsn: a libpq connection string or ``postgresql://`` URL.
            pool_size: the most connections the pool opens (context locks use their own).
            schema: the schema that holds terrarium's tables (created if missing).
            connect_timeout: seconds to wait for a pooled connection before failing (and for
                which the pool retries a server that went away before it starts afresh).
            blob_threshold: history strings over this many bytes go to the ``blobs`` table
                (:mod:`terrarium.blobs`); None or 0 keeps them inline.

        Raises:
            StoreError: the server cannot be reached (the message never shows a password).
            FormatVersionError: the schema was written by a newer terrarium.
        """
        _sql.schema_identifier(schema)  # ValueError unless a plain lowercase name
        if pool_size < 1:
            raise ValueError(f"pool_size must be at least 1, not {pool_size}")
        self._dsn = dsn
        self.schema = schema
        self.pool_size = pool_size
        self.blob_threshold = blob_threshold
        self._where = f"{redact_url(dsn)} (schema {schema})"
        self._lock = threading.Lock()
        self._local = threading.local()  # .conn: a connection lent to lifecycle calls
        self._seen: SeqGuesses[None] = SeqGuesses(_SEEN_CACHE)
        self._idle: list[psycopg.Connection[Any]] = []  # context locks' connections
        self._closed = False
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                migrate(conn, schema, where=self._where)
        except psycopg.OperationalError as exc:
            raise self._unavailable("open", exc) from None
        self._pool = self._open_pool(connect_timeout)

    def _open_pool(self, timeout: float) -> Pool:
        """The connection pool (``_pool.py``), its first connection ready."""
        pool = Pool(
            self._dsn,
            where=self._where,
            scrub=self._scrub,
            min_size=1,
            max_size=self.pool_size,
            kwargs={"autocommit": True},
            configure=_sql.set_search_path(self.schema),
            timeout=timeout,
            # A server gone away is tried with growing pauses for this long, and then afresh
            # at the next call: a call after a restart never waits out a long pause.
            reconnect_timeout=timeout,
            open=True,
            name=f"terrarium-{self.schema}",
        )
        # Wait for the first connection: a call made before would grow the pool, and a
        # single-threaded caller would alternate between two server processes, slower.
        try:
            pool.wait(timeout=timeout)
        except PoolTimeout:
            pool.close()
            raise StoreUnavailable(
                f"cannot open PostgreSQL store {self._where}: no pooled connection "
                f"within {timeout:g} s"
            ) from None
        except BaseException:
            pool.close()
            raise
        return pool

    def __repr__(self) -> str:
        return f"PostgresStore({redact_url(self._dsn)!r}, schema={self.schema!r})"

    def _scrub(self, exc: BaseException) -> str:
        """An error message with the DSN's password masked, should libpq ever echo it."""
        text = str(exc).strip().replace("\n", " ")
        try:
            password = psycopg.conninfo.conninfo_to_dict(self._dsn).get("password")
        except psycopg.Error:
            password = None
        return text.replace(str(password), "***") if password else text

    def _unavailable(self, verb: str, exc: BaseException) -> StoreUnavailable:
        """``exc`` as the one line that says the store cannot be reached to ``verb`` it."""
        return StoreUnavailable(f"cannot {verb} PostgreSQL store {self._where}: {self._scrub(exc)}")

    def change_feed(self) -> ChangeFeed:
        """Notifications of this store's committed writes (:mod:`.notify`); StoreUnavailable
        if the server cannot be reached."""
        try:
            return ChangeFeed(self._dsn, self.schema)
        except psycopg.OperationalError as exc:
            raise self._unavailable("listen to", exc) from None

    # ---------------------------------------------------------------- change cursor

    @retried
    def changes(self, after: str | None) -> tuple[list[SessionId] | None, str]:
        """The sessions written since position ``after`` and the position now (``ChangeLog``):
        a position is a snapshot; see :data:`._sql.CHANGES` for why no commit is missed."""
        seen = _SNAPSHOT.fullmatch(after or "")
        with self._pool.connection() as conn:
            row = None
            if seen is not None:
                with contextlib.suppress(pg_errors.DataError):  # no snapshot the server would give
                    row = conn.execute(_sql.CHANGES, {"after": after}).fetchone()
            if seen is None or row is None or int(seen[1]) > int(row[1]):  # not a position
                (now,) = conn.execute(_sql.POSITION).fetchone() or ("",)
                return None, str(now)
        return list(row[2]), str(row[0])

    @retried
    def store_id(self) -> str:
        """This store's identity where it is, which names its index file (see
        :data:`._sql.STORE_ID`); the system identifier is ``x`` where the server hides it."""
        with self._pool.connection() as conn:
            try:
                row = conn.execute(_sql.STORE_ID).fetchone()
            except _HIDDEN:
                row = conn.execute(_sql.STORE_ID_NO_SYSTEM).fetchone()
        return "-".join("x" if part is None else str(part) for part in row or ("",))

    def index_source(self) -> Path:
        """The derived index's file (``Indexed``) in this machine's cache, named by
        :meth:`store_id`."""
        return index_folder() / f"{self.store_id()}.{INDEX_DB}"

    # ---------------------------------------------------------------- contexts

    @contextmanager
    def lock_context(self, context: ContextId) -> Iterator[None]:
        """Hold the context's advisory lock, across threads, processes and machines, on a
        connection of its own (a long turn must not starve the pool; the lock dies with it)."""
        with self._locked(context, read=False):
            yield

    @contextmanager
    def lock_and_read(self, context: ContextId) -> Iterator[tuple[PodMetadata, int] | None]:
        """:meth:`lock_context`, giving the context's head and tail (``LockedHeadTail``),
        read in one round trip pipelined after the lock (so after the previous holder)."""
        with self._locked(context, read=True) as row:
            yield self._head_tail_of(context, row)

    @contextmanager
    def _locked(self, context: ContextId, *, read: bool) -> Iterator[Any]:
        """Hold the context's lock; give the row of :data:`_sql.HEAD_TAIL` when ``read``."""
        key = _sql.lock_key(self.schema, str(context))
        conn = self._lock_connection()
        row = None
        with self._closed_on_error(conn):
            if read:
                with conn.pipeline():
                    conn.execute(_sql.LOCK, (key,))
                    cursor = conn.execute(_sql.HEAD_TAIL, (str(context),), prepare=True)
                row = cursor.fetchone()
            else:
                conn.execute(_sql.LOCK, (key,))
        try:
            yield row
        finally:
            with self._closed_on_error(conn):
                conn.execute(_sql.UNLOCK, (key,))
            self._release_lock_connection(conn)

    @contextmanager
    def _closed_on_error(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        """Close the lock connection if the block fails (the lock goes with it); a lost
        connection is raised as :meth:`_pool.Pool.failure`'s error."""
        try:
            yield
        except CONNECTION_ERRORS as exc:
            failure = self._pool.failure(exc, conn)
            conn.close()
            raise failure from exc
        except BaseException:
            conn.close()
            raise

    def _lock_connection(self) -> psycopg.Connection[Any]:
        """An idle lock connection that is alive (see ``_pool.py``), else a new one."""
        while True:
            with self._lock:
                if self._closed:
                    raise StoreError(f"{self!r} is closed")
                idle = self._idle.pop() if self._idle else None
            if idle is None:
                break
            if alive(idle):
                return idle
            idle.close()  # the server dropped it
        try:
            conn = psycopg.connect(self._dsn, autocommit=True)
        except psycopg.OperationalError as exc:
            raise self._unavailable("connect to", exc) from None
        try:
            conn.execute(_sql.lock_session(self.schema))
        except BaseException as exc:
            conn.close()
            if isinstance(exc, CONNECTION_ERRORS):
                raise self._pool.failure(exc, None) from exc
            raise
        return conn

    def _release_lock_connection(self, conn: psycopg.Connection[Any]) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < _IDLE_LOCK_CONNECTIONS:
                self._idle.append(conn)
                return
        conn.close()

    # ---------------------------------------------------------------- frozen sessions
    # A write finds a frozen session on its miss path only, wakes it and tries again.

    _FOR_UPDATE = " FOR UPDATE"
    # The key-share lock (the segment's foreign key takes it anyway) waits for an attach of
    # the session, so a new segment never gets the type it had before.
    _KEY_SHARE = " FOR KEY SHARE"

    def _q(self, statement: str) -> str:
        return pyformat(statement)

    def _sid(self, id: uuid.UUID) -> Any:
        return id

    @staticmethod
    def _uuid(value: Any) -> uuid.UUID:
        return cast(uuid.UUID, value)  # psycopg reads uuid columns as UUIDs

    def _pooled(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        return self._pool.connection()

    @contextmanager
    def _write(self) -> Iterator[psycopg.Connection[Any]]:
        """A transaction (a savepoint inside one) on the connection :meth:`_read` gives."""
        with self._read() as conn, conn.transaction():
            yield conn

    _committed = _pooled

    @contextmanager
    def _snapshot(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection in a ``REPEATABLE READ`` transaction (autocommitted statements could
        miss a segment a thaw moves between them); inside a lifecycle call's, that one."""
        with self._read() as conn:
            if conn.info.transaction_status != pq.TransactionStatus.IDLE:
                yield conn
                return
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                yield conn

    def _hold_name(self, conn: psycopg.Connection[Any], context: str) -> None:
        """Hold the id ``context`` until the transaction ends; not ``lock_context``'s key,
        which a caller that creates the context may hold."""
        conn.execute(_sql.XACT_LOCK, (_sql.lock_key(self.schema, "name", context),))

    def _refill(
        self,
        conn: psycopg.Connection[Any],
        session: SessionId,
        segment: Sequence[Any],
        lines: list[str],
        trace: list[str],
    ) -> None:
        """Put a frozen segment back in the hot tables, its row as it was."""
        conn.execute(_sql.REFILL_SEGMENT, (session, *segment))
        found = envelopes(lines)
        columns = ([e.seq for e in found], [e.kind for e in found], [str(e.ts) for e in found])
        conn.execute(_sql.REFILL_ENTRIES, (session, segment[0], *columns, lines))
        if trace:
            conn.execute(_sql.APPEND_TRACE, (session, segment[0], trace))

    def _wake_on(self, conn: psycopg.Connection[Any], session_id: SessionId) -> bool:
        """``wake_session`` on the caller's idle connection (a pool of one must not wait for
        a second); whether the session was frozen."""
        self._local.conn = conn
        try:
            return wake_session(self, session_id)
        finally:
            self._local.conn = None

    def _next_seq_waking(
        self, conn: psycopg.Connection[Any], session_id: SessionId, segment_id: SegmentId
    ) -> int:
        """:meth:`_next_seq`, waking a frozen session: an append's miss path. (Not woken: it
        may have been thawed since the miss, so it is read once more.)"""
        missed = False
        for _ in range(ATTEMPTS):  # archived again after each wake by others: read again
            try:
                return self._next_seq(conn, session_id, segment_id)
            except SegmentNotFound:
                if self._wake_on(conn, session_id):
                    continue
                if missed:
                    raise
                missed = True
        raise ConflictError(f"session {session_id} kept being frozen before a write to it")

    # ---------------------------------------------------------------- segments

    def _insert_segment(
        self,
        conn: psycopg.Connection[Any],
        session_id: SessionId,
        segment_id: SegmentId,
        line: Mapping[str, Any],
    ) -> None:
        """A segment's row and header (in the caller's transaction)."""
        ts = str(line["ts"])
        try:
            cur = conn.execute(_sql.INSERT_SEGMENT, (session_id, segment_id, ts))
        except pg_errors.ForeignKeyViolation:  # the session went while we looked
            raise SegmentNotFound.of(session_id) from None
        if cur.rowcount != 1:
            raise ConflictError(f"segment {segment_id} already exists")
        text = line_text(line)
        conn.execute(_sql.INSERT_HEADER, (session_id, segment_id, line["kind"], ts, text))
        self._record_refs(conn, session_id, [line])
        self._seen.remember((session_id, segment_id), 1, None)  # a guess: appends check it

    def append(
        self,
        session_id: SessionId,
        segment_id: SegmentId,
        entries: Sequence[NewEntry],
        *,
        expected_seq: int | None = None,
    ) -> int:
        """Append entries with one autocommitted statement; return the first one's seq.

        The statement (:data:`_sql.APPEND_ONE`) moves the segment's tail from the proposal
        (``expected_seq``, else the tail last seen) under the row's lock. Refused, it is a
        ConflictError with ``expected_seq``; without, it retries at the new tail. The row lock
        keeps an entry from outliving a racing delete, which drops the segments' rows first.
        """
        if not entries:
            first = self.next_seq(session_id, segment_id)
            if expected_seq is not None and expected_seq != first:
                raise ConflictError.stale_seq(segment_id, first, expected_seq)
            return first
        key = (session_id, segment_id)
        seen = self._seen.get(key)
        proposal = expected_seq if expected_seq is not None else seen[0] if seen else None
        refs = any(line_digests(entry.data) for entry in entries)
        conn = self._pool.getconn()
        try:
            while True:
                if proposal is None:
                    proposal = self._next_seq_waking(conn, session_id, segment_id)
                sql, params = self._append_params(session_id, segment_id, entries, proposal)
                if refs:  # the entries and their blob_refs rows commit together
                    with conn.transaction():
                        if conn.execute(sql, params, prepare=True).fetchone() is not None:
                            self._record_refs(conn, session_id, [e.data for e in entries])
                            break
                elif conn.execute(sql, params, prepare=True).fetchone() is not None:
                    break
                # The segment is not at the proposed seq (or gone): read where it is.
                at = self._next_seq_waking(conn, session_id, segment_id)
                if expected_seq is not None and at != expected_seq:  # equal: it was woken
                    raise ConflictError.stale_seq(segment_id, at, expected_seq)
                proposal = at
        except CONNECTION_ERRORS as exc:  # not retried: the entries may be in
            raise self._pool.failure(exc, conn) from exc
        finally:
            self._pool.putconn(conn)
        self._seen.remember(key, proposal + len(entries), None)
        return proposal

    def _append_params(
        self, session_id: SessionId, segment_id: SegmentId, entries: Sequence[NewEntry], first: int
    ) -> tuple[str, dict[str, Any]]:
        """The append statement for ``entries`` from seq ``first``, and its parameters."""
        count = len(entries)
        params: dict[str, Any] = {
            "session": session_id,
            "segment": segment_id,
            "first": first,
            "next": first + count,
        }
        if count == 1:
            line = next(iter_lines(entries, first))
            params.update(kind=line["kind"], ts=line["ts"], line=line_text(line))
            return _sql.APPEND_ONE, params
        lines = list(iter_lines(entries, first))
        params["seqs"] = list(range(first, first + count))
        params["kinds"] = [line["kind"] for line in lines]
        params["tss"] = [line["ts"] for line in lines]
        params["lines"] = [line_text(line) for line in lines]
        return _sql.APPEND_MANY, params

    @retried
    def head_and_tail(self, context: ContextId) -> tuple[PodMetadata, int] | None:
        """The context's head and its segment's next seq: one statement for a hot context."""
        with self._read() as conn:
            row = conn.execute(_sql.HEAD_TAIL, (str(context),), prepare=True).fetchone()
        return self._head_tail_of(context, row)

    def _head_tail_of(self, context: ContextId, row: Any) -> tuple[PodMetadata, int] | None:
        """The head and tail of a row of :data:`_sql.HEAD_TAIL`, or read apart without one."""
        if row is None:  # frozen (or gone): the reads that find it there
            return head_then_tail(self, context)
        head, tail = self._head(row), int(row[5])
        self._seen.remember((head.session_id, head.segment_id), tail, None)
        return head, tail

    def _next_seq(
        self, conn: psycopg.Connection[Any], session_id: SessionId, segment_id: SegmentId
    ) -> int:
        row = conn.execute(_sql.NEXT_SEQ, (session_id, segment_id)).fetchone()
        if row is None:
            raise SegmentNotFound.of(session_id, segment_id)
        self._seen.remember((session_id, segment_id), int(row[0]), None)
        return int(row[0])

    def append_trace(
        self, session_id: SessionId, segment_id: SegmentId, entries: Sequence[TraceEntry]
    ) -> None:
        """Append raw stream events to the segment's debug trace."""
        lines = [line_text(e.to_dict()) for e in entries]
        with self._pool.connection() as conn:
            if not lines:
                if self._segment_exists(conn, session_id, segment_id):
                    return
                if self._cold(conn, "next_seq", session_id, segment_id) is not None:
                    return  # frozen: writing nothing wakes nothing
            else:
                for woken in (False, True):
                    try:
                        conn.execute(_sql.APPEND_TRACE, (session_id, segment_id, lines))
                        return
                    except pg_errors.ForeignKeyViolation:
                        if woken or not self._wake_on(conn, session_id):
                            break
        raise SegmentNotFound.of(session_id, segment_id)

    def close(self) -> None:
        """Close the derived index, the idle lock connections and the pool."""
        super().close()
        self._pool.close()


# What SqlStore reads, and its blob writes (safe to repeat), run once more on a connection lost
# under them (see _pool.retried).
_RETRIED = """get_head list_contexts read_segment next_seq list_segments read_trace put_blob
    get_blob has_blob blob_digests blob_references delete_unreferenced_blobs live_sessions
    entries_from"""
for _name in _RETRIED.split():
    setattr(PostgresStore, _name, retried(getattr(SqlStore, _name)))
