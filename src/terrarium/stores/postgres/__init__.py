"""``PostgresStore``: the shared store for agents on many machines.

Needs the ``postgres`` extra (``pip install 'terrarium-sessions[postgres]'``): psycopg 3 and its
connection pool. It owns one schema (``terrarium`` by default) of a PostgreSQL database, created
and migrated on open like every other backend (:mod:`.migrations`): heads (``contexts``),
``sessions``, ``segments`` (each one's tail and counts), ``entries`` (each line exactly as
:func:`terrarium.codec.encode` wrote it, as text, not ``jsonb``), ``traces``, and the derived
``search_docs`` (:mod:`.search`). The statements are constants in :mod:`._sql`.

The trade-off: every append is one autocommitted statement, durable once PostgreSQL has
committed it (a server crash too, with ``synchronous_commit = on``), and costs about one bare
``INSERT``; the search index and the listing counts of the heads are derived state, caught up
in batches (before each search and listing, and every ``SEARCH_BATCH`` appended entries).
Every table but the directory of heads is keyed by ``session_id`` first, so it can be
distributed by session (Citus) unchanged.

Usage::

    from terrarium.model import ContextId
    from terrarium.stores.postgres import PostgresStore

    with PostgresStore("postgresql://app@db/agents", schema="terrarium") as store:
        head = store.get_head(ContextId("cli", "main"))
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from itertools import starmap
from typing import Any, cast

from terrarium import codec
from terrarium.blobs import DEFAULT_THRESHOLD, line_digests
from terrarium.errors import (
    ConflictError,
    SegmentNotFound,
    StoreError,
    StoreUnavailable,
    install_hint,
)
from terrarium.model import HISTORY_KINDS, ContextId, SegmentId, SessionId, TraceEntry
from terrarium.stores import _listing
from terrarium.stores._query import check_query
from terrarium.stores._redact import redact_url
from terrarium.stores._seqs import SeqGuesses
from terrarium.stores._sqlbase import SqlStore, pyformat
from terrarium.stores.base import (
    ATTEMPTS,
    ContextSummary,
    ListingQuery,
    NewEntry,
    PodMetadata,
    SearchHit,
    SearchQuery,
    head_then_tail,
    iter_lines,
    wake_session,
)

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg import pq
    from psycopg.rows import args_row
    from psycopg_pool import PoolTimeout
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"PostgresStore needs psycopg 3 and psycopg_pool: {install_hint('postgres')}"
    ) from exc

from terrarium.stores.postgres import _lifecycle, _sql, search
from terrarium.stores.postgres._pool import CONNECTION_ERRORS, Pool, alive, retried
from terrarium.stores.postgres.migrations import MIGRATIONS, migrate
from terrarium.stores.postgres.notify import ChangeFeed
from terrarium.stores.postgres.search import search_words

__all__ = [
    "DEFAULT_SCHEMA",
    "MIGRATIONS",
    "RANK_WINDOW",
    "SEARCH_BATCH",
    "PostgresStore",
    "migrate",
    "search_words",
]

DEFAULT_SCHEMA = "terrarium"

log = logging.getLogger(__name__)

# The search side's knobs live here, on the store's module, where the store reads them.
#: Queries matching more items than this are ranked among their most recent matches.
RANK_WINDOW = 5000
#: Every this many entries it appends, a store brings the search index up to date: this bounds
#: the backlog a search finds to about that many per writing process.
SEARCH_BATCH = 256
_CATCH_UP_SEGMENTS = 500
_SEEN_CACHE = 4096
_IDLE_LOCK_CONNECTIONS = 4


class PostgresStore(SqlStore):
    """A store in a PostgreSQL database, shared by many processes on many machines."""

    _READ_SEGMENT = _sql.READ
    _READ_TRACE = _sql.READ_TRACE
    _MOVE_HEAD = _sql.MOVE_HEAD
    # What SqlStore reads, run once more on a connection lost under it (see _pool.retried).
    get_head = retried(SqlStore.get_head)
    list_contexts = retried(SqlStore.list_contexts)
    read_segment = retried(SqlStore.read_segment)
    next_seq = retried(SqlStore.next_seq)
    list_segments = retried(SqlStore.list_segments)
    read_trace = retried(SqlStore.read_trace)
    put_blob = retried(SqlStore.put_blob)  # safe to repeat, as is the delete
    get_blob = retried(SqlStore.get_blob)
    has_blob = retried(SqlStore.has_blob)
    blob_digests = retried(SqlStore.blob_digests)
    blob_references = retried(SqlStore.blob_references)
    delete_unreferenced_blobs = retried(SqlStore.delete_unreferenced_blobs)

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
        self._unindexed = 0  # entries this store appended since it last caught the index up
        self._idle_locks: list[psycopg.Connection[Any]] = []
        self._closed = False
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                migrate(conn, schema, where=self._where)
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(
                f"cannot open PostgreSQL store {self._where}: {self._scrub(exc)}"
            ) from None
        self._pool = self._open_pool(connect_timeout)

    def _open_pool(self, timeout: float) -> Pool:
        """The connection pool, its first connection ready, each with the schema on its path:
        every connection of the store but its lock and feed connections (``_pool.py``)."""
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
        # Wait for the first connection: a call made before it is ready would make the pool
        # grow, and the pool hands its connections out in turn, so a single-threaded caller
        # would then alternate between two server processes, tens of microseconds slower.
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

    def change_feed(self) -> ChangeFeed:
        """Notifications of this store's committed writes, from any process, on a connection
        of their own (LISTEN/NOTIFY, see :mod:`terrarium.stores.postgres.notify`).

        Raises:
            StoreError: the server cannot be reached.
        """
        try:
            return ChangeFeed(self._dsn, self.schema)
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(
                f"cannot listen to PostgreSQL store {self._where}: {self._scrub(exc)}"
            ) from None

    # ---------------------------------------------------------------- listing

    @retried
    def list_contexts_fast(self, type: str | None = None) -> list[ContextSummary]:
        """Every context's summary (message count, last activity), without restoring any.

        The counts live on the heads, copied there from the segments' rows by the catch-up,
        which runs first; then this is one scan of a covering index, already in (type, name)
        order. Keeping the copy on the heads at every append instead would put a write to the
        directory table (keyed by context) on the append path.
        """
        self.catch_up()
        query, params = (_sql.LISTING_OF_TYPE, (type,)) if type is not None else (_sql.LISTING, ())
        with self._pool.connection() as conn, conn.transaction():
            conn.execute(_sql.LISTING_BY_INDEX)
            rows = conn.execute(query, params).fetchall()
            # Tuples built in C, then the summaries: a tenth faster than a Python row factory.
            return list(starmap(ContextSummary, rows))

    @retried
    def list_contexts_page(self, query: ListingQuery) -> list[ContextSummary]:
        """One page of the listing, filtered and sorted (``Listing``): an index walk of
        about ``query.limit`` rows (see :mod:`terrarium.stores._listing`). The text filter
        folds case with the database's ``lower``.

        Raises:
            InvalidQuery: a query that cannot be run (see :func:`._listing.check`).
        """
        statement, params = _listing.page_statement(_sql.LISTING_SELECT, query, _listing.POSTGRES)
        self.catch_up()
        with self._pool.connection() as conn:
            cursor = conn.cursor(row_factory=args_row(ContextSummary))
            return cursor.execute(statement, params).fetchall()

    @retried
    def context_types(self, *, as_indexed: bool = False) -> list[str]:
        """Every type that has a context, sorted (``Listing``)."""
        with self._pool.connection() as conn:
            return [row[0] for row in conn.execute(_sql.CONTEXT_TYPES)]

    @retried
    def context_signatures(self, *, as_indexed: bool = False) -> list[tuple[str, str, int]]:
        """Every context's (id, last active, message count), in last-active order, from the
        index ``contexts_by_last_active`` (``Listing``)."""
        self.catch_up()
        with self._pool.connection() as conn, conn.transaction():
            conn.execute(_sql.LISTING_BY_INDEX)
            return conn.execute(_sql.SIGNATURES).fetchall()

    # ---------------------------------------------------------------- search

    @retried
    def search(self, query: SearchQuery) -> list[SearchHit]:
        """Ranked hits for ``query`` over every history item of every context.

        One statement for the matches (GIN index), the most recent ``RANK_WINDOW`` of them
        ranked by ``ts_rank``, and the lines of the best ``query.limit``, whose items' texts
        a second one cuts ``ts_headline`` snippets from.

        Args:
            query: the words to find (data, never syntax) and the filters.

        Returns:
            Up to ``query.limit`` hits, best first, each with a snippet and highlight spans.

        Raises:
            InvalidQuery: nothing to search for, or an invalid ``limit``, ``role`` or ``since``.
            InvalidContextId: ``query.context`` is not ``type:name``.
        """
        q = check_query(query)
        self.catch_up()
        with self._pool.connection() as conn:
            return search.find(conn, q, window=max(RANK_WINDOW, q.limit))

    # ---------------------------------------------------------------- contexts

    @contextmanager
    def lock_context(self, context: ContextId) -> Iterator[None]:
        """Hold the context's advisory lock, across threads, processes and machines.

        A session-level ``pg_advisory_lock`` on a connection of its own, kept aside from the
        pool while held (a turn can take long; it must not starve the pool); the server
        releases the lock if that connection dies.
        """
        with self._locked(context, read=False):
            yield

    @contextmanager
    def lock_and_read(self, context: ContextId) -> Iterator[tuple[PodMetadata, int] | None]:
        """:meth:`lock_context`, giving the context's head and tail (``LockedHeadTail``).

        The read is pipelined after the lock on the lock's connection: one round trip, and
        the read runs once the lock is granted, so it sees every write of the previous holder.
        """
        with self._locked(context, read=True) as row:
            yield self._head_tail_of(context, row)

    @contextmanager
    def _locked(self, context: ContextId, *, read: bool) -> Iterator[Any]:
        """Hold the context's lock; give the row of :data:`_sql.HEAD_TAIL` when ``read``."""
        key = _sql.lock_key(self.schema, str(context))
        conn = self._lock_connection()
        row = None
        try:
            if read:
                with conn.pipeline():
                    conn.execute(_sql.LOCK, (key,))
                    cursor = conn.execute(_sql.HEAD_TAIL, (str(context),), prepare=True)
                row = cursor.fetchone()
            else:
                conn.execute(_sql.LOCK, (key,))
        except CONNECTION_ERRORS as exc:
            failure = self._pool.failure(exc, conn)
            conn.close()
            raise failure from exc
        except BaseException:
            conn.close()  # the server drops the lock, if it granted it, with the connection
            raise
        try:
            yield row
        finally:
            try:
                conn.execute(_sql.UNLOCK, (key,))
            except CONNECTION_ERRORS as exc:  # the server dropped the lock with the connection
                failure = self._pool.failure(exc, conn)
                conn.close()
                raise failure from exc
            except BaseException:
                conn.close()  # the server drops the lock with the connection
                raise
            self._release_lock_connection(conn)

    def _lock_connection(self) -> psycopg.Connection[Any]:
        """An idle lock connection that is alive (see ``_pool.py``), else a new one."""
        while True:
            with self._lock:
                if self._closed:
                    raise StoreError(f"{self!r} is closed")
                idle = self._idle_locks.pop() if self._idle_locks else None
            if idle is None:
                break
            if alive(idle):
                return idle
            idle.close()  # the server dropped it
        try:
            conn = psycopg.connect(self._dsn, autocommit=True)
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(
                f"cannot connect to PostgreSQL store {self._where}: {self._scrub(exc)}"
            ) from None
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
            if not self._closed and len(self._idle_locks) < _IDLE_LOCK_CONNECTIONS:
                self._idle_locks.append(conn)
                return
        conn.close()

    # ---------------------------------------------------------------- frozen sessions
    # SqlStore keeps the records; here are the rows each move takes
    # (._lifecycle). A write finds a frozen session on its miss path only, wakes it
    # (wake_session, on the writer's own connection) and tries again.

    _FOR_UPDATE = " FOR UPDATE"
    # The key-share lock (which the segment's foreign key takes anyway) waits for an attach of
    # the session (its row locked FOR UPDATE), so a new segment never gets the type it had
    # before.
    _KEY_SHARE = " FOR KEY SHARE"

    def _q(self, statement: str) -> str:
        return pyformat(statement)

    def _sid(self, id: uuid.UUID) -> Any:
        return id

    @staticmethod
    def _uuid(value: Any) -> uuid.UUID:
        return cast(uuid.UUID, value)  # psycopg reads uuid columns as UUIDs

    @contextmanager
    def _read(self) -> Iterator[psycopg.Connection[Any]]:
        """The connection lent to this thread's lifecycle call (see :meth:`_wake_on`), or a
        pooled one."""
        held: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if held is not None:
            yield held
            return
        with self._pool.connection() as conn:
            yield conn

    @contextmanager
    def _write(self) -> Iterator[psycopg.Connection[Any]]:
        """A transaction (a savepoint inside one) on the connection :meth:`_read` gives."""
        with self._read() as conn, conn.transaction():
            yield conn

    @contextmanager
    def _snapshot(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection in a ``REPEATABLE READ`` transaction: one snapshot for every statement
        (autocommitted ones could miss a segment that a thaw moves between them); inside a
        lifecycle call's transaction, that one."""
        with self._read() as conn:
            if conn.info.transaction_status != pq.TransactionStatus.IDLE:
                yield conn
                return
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                yield conn

    def _hold_name(self, conn: psycopg.Connection[Any], context: str) -> None:
        _lifecycle.lock_name(conn, self.schema, context)

    def _adopt(self, conn: psycopg.Connection[Any], type: str, session: Any, frozen: bool) -> None:
        """Mark a hot session's segments unread under the context's type, so the next
        catch-up indexes the items left out while it was detached; before the head goes in,
        the order a catch-up locks them in."""
        conn.execute(_lifecycle.RETYPE_COLD if frozen else _sql.ATTACH_SEGMENTS, (type, session))

    def _count_head(self, conn: psycopg.Connection[Any], context: str) -> None:
        conn.execute(_sql.HEAD_COUNTS, (context,))

    def _freeze_rows(self, conn: psycopg.Connection[Any], session: Any) -> tuple[int, int]:
        return _lifecycle.freeze(conn, self.schema, session)

    def _thaw_rows(self, conn: psycopg.Connection[Any], session: Any) -> None:
        _lifecycle.thaw(conn, session)

    def _detach_rows(self, conn: psycopg.Connection[Any], context: str, session: Any) -> bool:
        return _lifecycle.detach(conn, context, session)

    def _drop_rows(self, conn: psycopg.Connection[Any], session: Any) -> None:
        _lifecycle.drop_hot(conn, session)

    def _wake_on(self, conn: psycopg.Connection[Any], session_id: SessionId) -> bool:
        """``wake_session`` on the caller's own connection, idle (a pool of one connection
        must not wait for a second); whether the session was frozen."""
        self._local.conn = conn
        try:
            return wake_session(self, session_id)
        finally:
            self._local.conn = None

    def _next_seq_waking(
        self, conn: psycopg.Connection[Any], session_id: SessionId, segment_id: SegmentId
    ) -> int:
        """:meth:`_next_seq`, after waking the segment's session if it is frozen: the miss
        path of an append, so a hot append never pays for it. (Not woken: it may have been
        thawed since the miss, so it is read once more.)"""
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
        type: str,
        line: Mapping[str, Any],
    ) -> None:
        """A segment's row and header, its header's history indexed (in the caller's
        transaction)."""
        ts = str(line["ts"])
        base = search.base_items(
            line, lambda parent, at: self._prefix_items(conn, session_id, parent, at)
        )
        try:
            cur = conn.execute(_sql.INSERT_SEGMENT, (session_id, segment_id, ts, type, base, ts))
        except pg_errors.ForeignKeyViolation:  # the session went while we looked
            raise SegmentNotFound(f"session {session_id} does not exist") from None
        if cur.rowcount != 1:
            raise ConflictError(f"segment {segment_id} already exists")
        text = codec.encode(line).decode()
        conn.execute(_sql.INSERT_HEADER, (session_id, segment_id, line["kind"], ts, text))
        self._record_refs(conn, session_id, [line])
        if type:  # a detached session's items are indexed when a context adopts it
            search.insert_docs(
                conn,
                [(session_id, segment_id, ts, type, doc) for doc in search.line_docs(0, line)],
            )
        self._seen.remember((session_id, segment_id), 1, None)  # a guess: appends check it

    def _prefix_items(
        self,
        conn: psycopg.Connection[Any],
        session_id: SessionId,
        parent: SegmentId,
        at: int | None,
    ) -> int | None:
        """The history items of the session's segment ``parent`` restored up to seq ``at``
        (None: all of it), or None when there is no such segment."""
        row = conn.execute(_sql.SEGMENT_COUNTS, (session_id, parent)).fetchone()
        if row is None:
            return None
        base, items, next_seq = row
        if at is None or at >= next_seq - 1:
            return int(base + items)
        found = conn.execute(_sql.COUNT_ITEMS, (session_id, parent, at)).fetchone()
        return int(base + (found[0] if found else 0))

    def append(
        self,
        session_id: SessionId,
        segment_id: SegmentId,
        entries: Sequence[NewEntry],
        *,
        expected_seq: int | None = None,
    ) -> int:
        """Append entries with one autocommitted statement; return the first one's seq.

        The segment's row is the arbiter: it holds the segment's tail (``next_seq``), and the
        statement (:data:`_sql.APPEND_ONE`) moves it from the proposed first seq to the one
        after the new entries, under the row's lock, inserting the entries only if it did.
        The proposal is ``expected_seq``, else the tail this store last saw; if the row is
        elsewhere, that is a ``ConflictError`` with ``expected_seq``, and without it the append
        retries at the new tail. Concurrent writers queue on the row, so no gap is possible.
        The same lock keeps an entry from outliving a racing ``delete_context``, which deletes
        the segments' rows before the entries: an append lands before (and goes with the rest)
        or finds no row (``SegmentNotFound``). ``fillfactor`` keeps the update HOT.
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
        self._note_unindexed(len(entries))
        return proposal

    def _note_unindexed(self, count: int) -> None:
        """Count entries the search index lacks; index them once a batch has gathered."""
        with self._lock:
            self._unindexed += count
            due = self._unindexed >= SEARCH_BATCH
        if due:
            try:
                self.catch_up()
            except (psycopg.Error, StoreError) as exc:  # the entries are in; a search catches up
                log.warning("%s: search index catch-up deferred: %s", self._where, self._scrub(exc))

    def _append_params(
        self,
        session_id: SessionId,
        segment_id: SegmentId,
        entries: Sequence[NewEntry],
        first: int,
    ) -> tuple[str, dict[str, Any]]:
        """The append statement for ``entries`` from seq ``first``, and its parameters."""
        count = len(entries)
        params: dict[str, Any] = {
            "session": session_id,
            "segment": segment_id,
            "first": first,
            "next": first + count,
            "last_ts": entries[-1].ts,
            "items": sum(1 for entry in entries if entry.kind in HISTORY_KINDS),
        }
        if count == 1:
            line = next(iter_lines(entries, first))
            params.update(kind=line["kind"], ts=line["ts"], line=codec.encode(line).decode())
            return _sql.APPEND_ONE, params
        lines = list(iter_lines(entries, first))
        params["seqs"] = list(range(first, first + count))
        params["kinds"] = [line["kind"] for line in lines]
        params["tss"] = [line["ts"] for line in lines]
        params["lines"] = [codec.encode(line).decode() for line in lines]
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
            raise SegmentNotFound(f"segment {segment_id} of session {session_id} does not exist")
        self._seen.remember((session_id, segment_id), int(row[0]), None)
        return int(row[0])

    # ---------------------------------------------------------------- the search index

    @retried
    def catch_up(self) -> int:
        """Index every entry the search index has not read yet; return how many segments
        had such entries. Searches call it first; it is public for tools and tests."""
        with self._lock:
            self._unindexed = 0
        with self._pool.connection() as conn:
            dirty = conn.execute(_sql.ALL_DIRTY).fetchall()
        for start in range(0, len(dirty), _CATCH_UP_SEGMENTS):
            self._index([(row[0], row[1]) for row in dirty[start : start + _CATCH_UP_SEGMENTS]])
        return len(dirty)

    def _index(self, segments: Sequence[tuple[SessionId, SegmentId]]) -> None:
        """Index the unread entries of ``segments`` (see :func:`search.index_segments`)."""
        with self._pool.connection() as conn:
            search.index_segments(conn, segments)

    @retried
    def reindex(self) -> int:
        """Rebuild the search index from the entries; return the number of contexts."""
        with self._pool.connection() as conn:
            with conn.transaction():
                for statement in _sql.CLEAR_INDEX:
                    conn.execute(statement)
            (count,) = conn.execute(_sql.COUNT_CONTEXTS).fetchone() or (0,)
        self.catch_up()
        return int(count)

    def append_trace(
        self, session_id: SessionId, segment_id: SegmentId, entries: Sequence[TraceEntry]
    ) -> None:
        """Append raw stream events to the segment's debug trace."""
        lines = [codec.encode(e.to_dict()).decode() for e in entries]
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
        raise SegmentNotFound(f"segment {segment_id} of session {session_id} does not exist")

    def close(self) -> None:
        """Close the pool and the idle lock connections (held locks close on release)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            idle, self._idle_locks = self._idle_locks, []
        for conn in idle:
            conn.close()
        self._pool.close()
