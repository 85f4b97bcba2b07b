"""``SqliteStore``: every context in one SQLite database file.

For one machine where a single file is handier than a folder tree (backups, copies, ad hoc SQL
with the ``sqlite3`` shell), and where a few processes share the store. It owns the heads,
sessions, segments, entries and debug traces (the schema: :mod:`._sql`, built by
:mod:`.migrations`), and what is derived from the entries: the search index and the listing
counts (:mod:`.search`), brought up to the entries in slices, never in every append; WAL
checkpoints and FTS5 upkeep run in a thread of their own (:mod:`._upkeep`).

The trade-off: an append is one ``INSERT`` under SQLite's single write lock, so writers in
every thread and process are serialised (waiting up to ``busy_timeout``) while readers, in WAL
mode, never wait. ``synchronous="NORMAL"`` (the default) survives a process crash, not a power
cut; ``"FULL"`` does, for ~250-300 us more per append. A database this process cannot write
is opened read-only.

Usage::

    import terrarium as t
    from terrarium.stores import SearchQuery, SqliteStore

    with SqliteStore("sessions.db") as store:
        t.create_segment(store, t.SegmentStartState(), context="cli:main")
        t.save_user_input(store, store.get_head(t.ContextId.parse("cli:main")), "Hello!")
        hits = store.search(SearchQuery("hello"))
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from itertools import starmap
from pathlib import Path
from typing import Any

from terrarium import codec
from terrarium.blobs import DEFAULT_THRESHOLD, line_digests
from terrarium.errors import (
    ConflictError,
    ContextExists,
    SegmentNotFound,
    StoreError,
)
from terrarium.model import ContextId, SegmentId, SessionId, TraceEntry, utc_now
from terrarium.stores import _db, _listing
from terrarium.stores._seqs import SeqGuesses
from terrarium.stores._sqlbase import (
    HEAD_ANY,
    INSERT_COLD_HEAD,
    INSERT_SESSION,
    STATE,
    SqlStore,
    state_record,
)
from terrarium.stores.base import (
    ContextSummary,
    ListingQuery,
    NewEntry,
    PodMetadata,
    SearchHit,
    SearchQuery,
    header_line,
    iter_lines,
    wake_session,
)
from terrarium.stores.fts import Fts5Tables, Ranker, check_query, fts5_phrases, merge_hits
from terrarium.stores.locks import file_lock
from terrarium.stores.sqlite import _lifecycle as lifecycle
from terrarium.stores.sqlite import _sql as sql
from terrarium.stores.sqlite._upkeep import Upkeep
from terrarium.stores.sqlite.migrations import MIGRATIONS, check_readable, migrate
from terrarium.stores.sqlite.search import (
    SEARCH_RECENT,
    catch_up,
    index_session,
    indexed_hits,
    late_counts,
    late_hits,
    segment_summary,
    with_late,
)
from terrarium.text import query_terms

__all__ = [
    "MIGRATIONS",
    "SEARCH_BATCH",
    "SEARCH_RECENT",
    "SYNCHRONOUS_MODES",
    "SqliteStore",
    "migrate",
]

SYNCHRONOUS_MODES: tuple[str, ...] = ("OFF", "NORMAL", "FULL", "EXTRA")

log = logging.getLogger(__name__)

#: Segments whose next seq and key (``segments.id``) a store remembers. A key is kept only
#: once committed (None: look it up): keys are ``AUTOINCREMENT``, so a committed one never
#: names another segment, and an append with the key of a segment since deleted (purged, or
#: archived and woken under a new key, by any process) finds no entry before its seq, fails
#: its check and looks the key up again. A key read inside a caller's transaction may be
#: rolled back with it and handed out again to another segment, so it is not kept.
_SEEN_CACHE = 4096

#: The derived tables lag the entries by at most about this many: the append that makes this
#: many wait catches them up, reading at most twice as many (so a backlog drains), and leaves
#: their items staged for the upkeep thread to index (:func:`.search.index_staged`). Measured
#: (``benchmarks/bench_sqlite_append.py``, CPU time of the appending thread, 10k history,
#: p99.9 of 6,000 appends through the runtime ÷ their median): 16-20x with 16, 19-24x with 24,
#: 23-30x with 32 (one append in 16 pays ~120 µs of Python and a commit); before staging, a
#: slice of 64 with its FTS5 work cost ~1-2 ms: 62-677x the median at 1k-100k.
SEARCH_BATCH = 16
#: Entries between two kicks of the upkeep thread that index the staged items: each kick
#: costs it a slice of FTS5 work (a segment flushed per table), merge steps and a wake-up.
#: Measured (3,000 appends 1 ms apart at 10k history, two runs each): with a kick at every
#: ``SEARCH_BATCH`` and a checkpoint at each, 880-890 slices and 0.33 s of CPU besides the
#: appending thread's 0.26-0.31 s; with 64 and 256, 230 slices, 0.12-0.14 s and 0.21-0.23 s.
#: A search indexes what is still staged itself.
INDEX_EVERY = 64
#: Entries between two WAL checkpoints by the upkeep thread (:mod:`._upkeep`), well before
#: SQLite's own automatic checkpoint, which then finds the pages copied.
CHECKPOINT_EVERY = 256
#: The page cache of each connection, in KiB (SQLite's default is 2 MB).
CACHE_KIB = 64 * 1024


def _catch_up(conn: sqlite3.Connection, *, limit: int | None = None, index: bool = True) -> int:
    """:func:`.search.catch_up` with this module's ``SEARCH_RECENT``, read at each call; a
    refill of ``search_recent`` is left to the upkeep thread, and so, without ``index``, is
    the indexing of the items staged."""
    return catch_up(conn, recent=SEARCH_RECENT, limit=limit, refill=0, index=index)


def _recent() -> int:
    """This module's ``SEARCH_RECENT``, read at each call (tests patch it)."""
    return SEARCH_RECENT


class SqliteStore(SqlStore):
    """A store in one SQLite database file (see the module docstring)."""

    _READ_SEGMENT = sql.READ_SEGMENT
    _READ_TRACE = sql.READ_TRACE

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

        A database that this process cannot write (its file or folder, a read-only mount) or
        that a full disk keeps from opening for writing is opened read-only: reads work, writes
        raise StoreError (see :meth:`_open`).

        Raises:
            FormatVersionError: the database was written by a newer terrarium.
            StoreError: the file is not a SQLite database, WAL cannot be enabled on it, or it
                is read-only and needs a migration.
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
        self._idle: list[sqlite3.Connection] = []
        self._local = threading.local()
        self._ranker = Ranker(Fts5Tables(recent="search_recent", docs="search_docs"))
        # A next seq this store saw each recent segment reach (its guess for the next append)
        # with its ids as text and its key (see _SEEN_CACHE), and how far it last saw the
        # derived tables read (see the .search module).
        self._seen: SeqGuesses[tuple[str, str, int | None]] = SeqGuesses(_SEEN_CACHE)
        self._wm = 0
        self._closed = False
        self.readonly_reason: str | None = None
        """Why the database is opened read-only (see :meth:`_open`), or None."""
        self._upkeep = Upkeep(self.path, self._connect, _recent)
        # The newest entry id when this store last had the upkeep thread checkpoint, and
        # index what is staged (see _kick).
        self._checkpointed = self._indexed = 0
        self._idle.append(self._open())

    def _open(self) -> sqlite3.Connection:
        """The first connection, read-only where the database cannot be written.

        A database file this process cannot write (the file, its folder, a read-only mount),
        or that a full disk keeps from opening for writing, is opened read-only (``mode=ro``,
        or ``immutable`` when its ``-shm`` file cannot be created and no ``-wal`` file holds
        data: see :func:`terrarium.stores._db.connect`), and no migration is applied. Writes
        then raise StoreError naming the cause. The database file is created ``0600`` before
        SQLite opens it, so its ``-wal`` and ``-shm`` are too; missing folders ``0700``.
        """
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
        """The first connection: migrated (or, read-only, checked readable), in WAL mode.

        The journal is WAL: readers never block the writer nor the writer the readers.
        """
        conn = self._connect()
        try:
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
    # Connections come from a small pool: a thread takes an idle connection for one call and
    # gives it back, so reads in many threads run in parallel under WAL, and the number of
    # connections is bounded by the calls in flight, not by how many threads ever touched the
    # store (a connection per thread would leak with thread pools that churn). Inside
    # atomic(), the thread keeps its connection so that every call in the block is one
    # transaction; nested blocks are savepoints.

    def _connect(self) -> sqlite3.Connection:
        conn = _db.connect(self.path, timeout=self.busy_timeout, readonly=self.readonly)
        try:
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            # SQLite's default page cache is 2 MB; ranking reads each match's row sizes, and
            # with the pages of a big index at hand a search is ~3x faster.
            conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
            conn.execute(f"PRAGMA wal_autocheckpoint = {sql.AUTOCHECKPOINT}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _error(self, exc: sqlite3.Error, what: str = "") -> StoreError:
        """``exc`` as a one-line StoreError naming the database (and a full disk as one)."""
        reason = _db.describe(exc, self.path)
        if self.readonly_reason is not None and _db.kind(exc) == "readonly":
            reason = self.readonly_reason  # a write refused because the disk was full
        return StoreError(f"{self.path}: {what}{reason}")

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
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A connection for reads: the thread's transaction if it is in one, else a pooled one."""
        held: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if held is not None:
            yield held
            return
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
        conn = self._borrow()
        local.conn, local.depth = conn, 0
        try:
            # This process's writers wait for an upkeep slice on its gate, not in SQLite's
            # busy handler (a sleep of 1 ms or more).
            with self._upkeep.gate, _db.immediate(conn):
                yield conn
        except sqlite3.OperationalError as exc:
            raise self._error(exc) from exc
        finally:
            local.conn = None
            self._give_back(conn)

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """Run the calls in the ``with`` block in one transaction: all of them or none.

        Blocks nest (inner ones are savepoints: an exception rolls back only its block). The
        write lock is held for the whole outermost block, so keep it short; it applies to the
        calling thread only.
        """
        with self._write():
            yield

    @contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        """A connection in a read transaction: one snapshot for every statement."""
        with self._read() as conn:
            own = not conn.in_transaction
            if own:
                conn.execute("BEGIN")
            try:
                yield conn
            finally:
                if own:
                    conn.execute("COMMIT")

    # ---------------------------------------------------------------- heads

    def set_head(
        self, context: ContextId, segment_id: SegmentId, *, expected: SegmentId
    ) -> PodMetadata:
        """Move the head if it is ``expected`` now (compare-and-set in one transaction)."""
        with self._write() as conn:
            head = self._head_to_move(conn, context, segment_id, expected)
            now = utc_now()
            # The listing counts of the new head are computed over the entries the derived
            # tables have read, so those must be every entry.
            self._wm = _catch_up(conn)
            count, last = segment_summary(conn, str(head.session_id), str(segment_id))
            conn.execute(sql.MOVE_HEAD, (str(segment_id), now, count, last, str(context)))
        return PodMetadata(head.context, head.session_id, segment_id, head.created_at, now)

    def list_contexts_fast(self, type: str | None = None) -> list[ContextSummary]:
        """Every context's summary (message count, last activity), without restoring any.

        The counts, as a restore would find them, are kept on the heads by the derived-state
        catch-up (:func:`.search.catch_up`), which runs first if entries arrived since it last
        did; then this is one scan of the heads. Where the catch-up cannot write (a read-only
        database, a full disk), the entries it would have read complete the counts.
        """
        self._try_catch_up()
        where, args = ("WHERE type = ?", (type,)) if type is not None else ("", ())
        with self._snapshot() as conn:
            rows = conn.execute(sql.LISTING.format(where=where), args).fetchall()
            late = late_counts(conn)
            summaries = list(starmap(ContextSummary, rows))
        if not late:
            return summaries
        return [
            with_late(summary, late.get((summary.session, summary.head))) for summary in summaries
        ]

    def list_contexts_page(self, query: ListingQuery) -> list[ContextSummary]:
        """One page of the listing, filtered and sorted (``PagedListing``): an index walk of
        about ``query.limit`` rows (see :mod:`terrarium.stores._listing`). Where entries wait
        that the derived state could not read (see :meth:`list_contexts_fast`), the page is
        picked from the whole listing instead, their counts included.

        Raises:
            InvalidQuery: a query that cannot be run (see :func:`._listing.check`).
        """
        statement, params = _listing.page_statement(sql.LISTING_SELECT, query, _listing.SQLITE)
        self._try_catch_up()
        with self._snapshot() as conn:
            late = late_counts(conn)
            if not late:
                return [ContextSummary(*row) for row in conn.execute(statement, params)]
        return _listing.page_of(self.list_contexts_fast(), query)

    def context_types(self, *, as_indexed: bool = False) -> list[str]:
        """Every type that has a context, sorted (``PagedListing``)."""
        with self._read() as conn:
            return [row[0] for row in conn.execute(sql.CONTEXT_TYPES)]

    def context_signatures(self, *, as_indexed: bool = False) -> list[tuple[str, str, int]]:
        """Every context's (id, last active, message count), in last-active order, from the
        index ``contexts_by_last_active`` (``PagedListing``), counted as
        :meth:`list_contexts_fast` counts."""
        self._try_catch_up()
        with self._snapshot() as conn:
            if not late_counts(conn):
                return conn.execute(sql.SIGNATURES).fetchall()
        return [(s.context, s.last_active, s.message_count) for s in self.list_contexts_fast()]

    # ---------------------------------------------------------------- search

    def search(self, query: SearchQuery) -> list[SearchHit]:
        """Ranked hits for ``query`` over every history item of every context.

        Args:
            query: the words to find (data, never syntax) and the filters.

        Returns:
            Up to ``query.limit`` hits, best first, each with a snippet and highlight spans.

        Raises:
            InvalidQuery: nothing to search for, or an invalid ``limit``, ``role`` or ``since``.
            InvalidContextId: ``query.context`` is not ``type:name``.
        """
        q = check_query(query)
        phrases = [fts5_phrases([term]) for term in query_terms(q.text)]
        self._try_catch_up()
        with self._snapshot() as conn:
            try:
                hits = indexed_hits(conn, self._ranker, q, phrases)
                late = late_hits(conn, q, phrases)
            except sqlite3.OperationalError as exc:
                raise self._error(exc, "search failed: ") from exc
        return merge_hits(hits, late, q.limit)

    def _try_catch_up(self) -> None:
        """Catch the derived state up before a read, where it can be written; else the read
        completes it from the entries past ``wm`` (a read-only database, a full disk, a lock
        held past ``busy_timeout``)."""
        if self.readonly:
            return
        try:
            self._catch_up()
        except StoreError as exc:
            log.warning("%s; reading the entries that it has not indexed instead", exc)

    def _catch_up(self) -> None:
        """Bring the derived tables up to every entry, and index the items staged, if any
        wait; have the upkeep thread refill ``search_recent`` if it lacks some of the newest
        items (a store that stopped writing in the middle of a refill)."""
        with self._read() as conn:
            wm, top, short, staged = conn.execute(sql.PENDING_WORK, (SEARCH_RECENT,)).fetchone()
        self._wm = wm
        if (top or 0) > wm or staged:
            with self._write() as conn:
                self._wm = _catch_up(conn)
            self._upkeep.kick(checkpoint=False)  # a refill of search_recent, if emptied
        elif short:
            self._upkeep.kick(checkpoint=False)

    def reindex(self) -> int:
        """Rebuild the derived tables (search index, listing counts) from the entries.

        Returns:
            The number of contexts.
        """
        with self._write() as conn:
            conn.execute(sql.DELETE_DOCS)
            for table in sql.FTS_TABLES:
                conn.execute(sql.FTS_DELETE_ALL.format(table=table))
            conn.execute(sql.RESET_META)
            catch_up(conn, counts=False, recent=SEARCH_RECENT, refill=None)
            heads = conn.execute(sql.HEAD_SEGMENTS).fetchall()
            for s, g in heads:
                count, last = segment_summary(conn, s, g)
                conn.execute(sql.SET_COUNTS, (count, last, s))
        return len(heads)

    # ---------------------------------------------------------------- contexts

    def create_context(self, context: ContextId, header: Mapping[str, Any]) -> PodMetadata:
        """Create the context's session, root segment (its header is entry 0) and head."""
        ctx = ContextId.parse(context)
        line = header_line(header)
        session_id = uuid.UUID(str(line["session_id"]))
        segment_id = uuid.UUID(str(line["segment_id"]))
        ts = str(line["ts"])
        s, g = str(session_id), str(segment_id)
        with self._write() as conn:
            if conn.execute(HEAD_ANY, (str(ctx), str(ctx))).fetchone():
                raise ContextExists(f"context {ctx} already exists")
            if conn.execute(sql.SESSION_EXISTS, (s,)).fetchone():
                raise ConflictError(f"session {session_id} already exists")
            conn.execute(sql.INSERT_HEAD, (str(ctx), ctx.type, s, g, ts, ts))
            conn.execute(INSERT_SESSION, (s, str(ctx), ts))
            self._insert_segment(conn, session_id, segment_id, ctx.type, line)
            count, last = segment_summary(conn, s, g)
            conn.execute(sql.SET_COUNTS, (count, last, s))
        return PodMetadata(str(ctx), session_id, segment_id, ts, ts)

    def attach_context(
        self, context: ContextId, session_id: SessionId, segment_id: SegmentId
    ) -> PodMetadata:
        """Make ``context`` a new context on a detached session's segment, in one transaction.

        The derived state is caught up first (leaving the detached session's items out, as it
        always does), then the head gets its listing counts and the session's items are
        indexed under the context. A frozen session's head goes to ``archived_contexts``.
        """
        ctx = ContextId.parse(context)
        s, g = str(session_id), str(segment_id)
        with self._write() as conn:
            created, frozen = self._attachable(conn, ctx, session_id, segment_id)
            now = utc_now()
            conn.execute(sql.ATTACH_SESSION, (str(ctx), s))
            if frozen:
                cold = (s, str(ctx), ctx.type, g, created, now)
                conn.execute(INSERT_COLD_HEAD, cold)
            else:
                self._wm = _catch_up(conn)
                conn.execute(sql.INSERT_HEAD, (str(ctx), ctx.type, s, g, created, now))
                count, last = segment_summary(conn, s, g)
                conn.execute(sql.SET_COUNTS, (count, last, s))
                index_session(conn, s, ctx.type, recent=SEARCH_RECENT)
        return PodMetadata(str(ctx), session_id, segment_id, created, now)

    def lock_context(self, context: ContextId) -> AbstractContextManager[None]:
        """Hold the context's lock exclusively, across threads and processes (``flock``).

        The lock is a file named after the context in ``{database}-locks/`` beside the
        database (like its ``-wal`` and ``-shm`` files). Each call opens its own descriptor,
        so the lock excludes other threads as well as other processes, and the kernel releases
        it when a holder dies. A lock table would need polling to wait, and an open write
        transaction would block every other writer for the whole turn.
        """
        ctx = ContextId.parse(context)
        return file_lock(
            self.path.with_name(f"{self.path.name}-locks") / ctx.type / ctx.encoded_name
        )

    # ---------------------------------------------------------------- frozen sessions
    # SqlStore keeps the records; here are the rows each move takes (._lifecycle). A write
    # finds a frozen session on its miss path only, wakes it (wake_session) and tries again:
    # a hot write never looks at the archive.

    def _freeze_rows(self, conn: sqlite3.Connection, session: str) -> tuple[int, int]:
        return lifecycle.freeze(conn, session)

    def _thaw_rows(self, conn: sqlite3.Connection, session: str) -> None:
        # Its entries wait for the catch-up (see _lifecycle.thaw), as they would in a store
        # that had not appended them: they do not count toward this store's batch.
        self._wm = lifecycle.thaw(conn, session)

    def _detach_rows(self, conn: sqlite3.Connection, context: str, session: str) -> bool:
        return lifecycle.detach(conn, context, session)

    def _drop_rows(self, conn: sqlite3.Connection, session: str) -> None:
        lifecycle.drop_hot(conn, session)

    def _wake_on(self, conn: sqlite3.Connection, session_id: SessionId) -> bool:
        return wake_session(self, session_id)  # on conn: this thread's transaction

    def _woke(self, conn: sqlite3.Connection, session: str) -> bool:
        """Wake the session if it is frozen (SegmentNotFound in the trash); whether it was."""
        session_id = uuid.UUID(session)
        return self._frozen(conn, session_id) and wake_session(self, session_id)

    def _tail_waking(self, conn: sqlite3.Connection, session: str, segment: str) -> tuple[int, int]:
        """:func:`_tail`, after waking the segment's session if it is frozen: the miss path of
        an append, so a hot append never pays for it. The look at the record and the read of
        the tail are one transaction: a freeze or a thaw between them would mislead it."""
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

    def create_segment(self, session_id: SessionId, header: Mapping[str, Any]) -> None:
        """Add a segment, with its header as entry 0, to an existing session."""
        line = header_line(header)
        segment_id = uuid.UUID(str(line["segment_id"]))
        with self._write() as conn:
            row = conn.execute(STATE, (str(session_id),)).fetchone()
            if row is None:
                raise SegmentNotFound(f"session {session_id} does not exist")
            if "cold" in state_record(row[0]):  # frozen: back to the hot tables first
                wake_session(self, session_id)
            if self._segment_exists(conn, session_id, segment_id):
                raise ConflictError(f"segment {segment_id} already exists")
            self._insert_segment(conn, session_id, segment_id, "", line)

    def _insert_segment(
        self,
        conn: sqlite3.Connection,
        session_id: SessionId,
        segment_id: SegmentId,
        type: str,
        line: Mapping[str, Any],
    ) -> None:
        # SQLite indexes no item as it writes it: the type goes unused.
        s, g, ts = str(session_id), str(segment_id), str(line["ts"])
        seg = conn.execute(sql.INSERT_SEGMENT, (s, g, ts)).lastrowid
        conn.execute(sql.INSERT_ENTRY, (seg, 0, line["kind"], ts, _text(line)))
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

        One entry is one ``INSERT`` in autocommit mode (:data:`._sql.APPEND_ONE`, the whole
        compare-and-append): SQLite takes its one write lock for the statement, so writers in
        every thread and process are serialised. The seq it proposes is ``expected_seq`` or
        the next seq this store last saw the segment reach, with the key it saw; when refused,
        it reads the segment's key and tail and raises ConflictError (with ``expected_seq``)
        or retries there. Several entries go in one ``BEGIN IMMEDIATE`` transaction, which
        reads the tail under the lock. The append that makes ``SEARCH_BATCH`` entries wait
        then catches the derived tables up, leaving their items staged, and kicks the upkeep
        thread, which indexes them; so does one in ``CHECKPOINT_EVERY`` (a WAL checkpoint).
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
        gate = self._upkeep.gate if held is None else nullcontext()
        looked = False  # whether this call read the segment's key (see _SEEN_CACHE)
        try:
            while True:
                if seg is None or proposal is None:
                    seg, at = self._tail_waking(conn, s, g)
                    looked, proposal = True, at if expected_seq is None else expected_seq
                line = next(iter_lines(entries, proposal))
                row = (seg, proposal, line["kind"], line["ts"], _text(line))
                try:
                    with gate:  # inside a transaction, its outermost write holds the gate
                        cursor = conn.execute(sql.APPEND_ONE, row)
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
        self._after_append(cursor.lastrowid or 0)
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
                (seg, line["seq"], line["kind"], line["ts"], _text(line))
                for line in iter_lines(entries, first)
            ]
            conn.executemany(sql.INSERT_ENTRY, rows)
            self._record_refs(conn, s, [entry.data for entry in entries])
            (top,) = conn.execute(sql.NEWEST_ENTRY).fetchone()
            staged = rows and top - self._wm >= SEARCH_BATCH
            if staged:
                self._wm = _catch_up(conn, limit=len(rows) + 2 * SEARCH_BATCH, index=False)
        self._seen.remember(
            (session_id, segment_id), first + len(rows), (s, g, seg if outermost else None)
        )
        self._kick(top or 0, bool(staged))
        return first

    def _after_append(self, rowid: int) -> None:
        """After an entry ``rowid`` is in: a slice of catch-up, its items left staged, if
        ``SEARCH_BATCH`` entries wait (see :meth:`_kick`)."""
        staged = rowid - self._wm >= SEARCH_BATCH
        if staged:
            try:
                with self._write() as conn:
                    self._wm = _catch_up(conn, limit=2 * SEARCH_BATCH, index=False)
            except (StoreError, sqlite3.Error) as exc:  # the entry is in; a read catches up
                log.warning("%s: search and listing catch-up deferred: %s", self.path, exc)
                staged = False
        self._kick(rowid, staged)

    def _kick(self, rowid: int, staged: bool) -> None:
        """Kick the upkeep thread when items were staged and ``INDEX_EVERY`` entries have
        come since it was last kicked to index them, and once every ``CHECKPOINT_EVERY``
        entries for a WAL checkpoint."""
        index = staged and rowid - self._indexed >= INDEX_EVERY
        checkpoint = rowid - self._checkpointed >= CHECKPOINT_EVERY
        if index:
            self._indexed = rowid
        if checkpoint:
            self._checkpointed = rowid
        if index or checkpoint:
            self._upkeep.kick(checkpoint=checkpoint)

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
            while not self._segment_exists(conn, session_id, segment_id):
                if self._woke(conn, s):
                    continue
                raise SegmentNotFound(
                    f"segment {segment_id} of session {session_id} does not exist"
                )
            conn.executemany(sql.INSERT_TRACE, [(s, g, _text(e.to_dict())) for e in entries])

    def close(self) -> None:
        """Close every idle connection; connections in use close when their call returns."""
        self._upkeep.close()
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _text(line: Any) -> str:
    """An entry (or trace event) as the ``line`` column stores it: its JSON, as encoded."""
    return codec.encode(line).decode()


def _tail(conn: sqlite3.Connection, session: str, segment: str) -> tuple[int, int]:
    """The segment's key and the seq its next entry gets; SegmentNotFound if there is no such
    segment."""
    row = conn.execute(sql.SEGMENT_TAIL, (session, segment)).fetchone()
    if row is None or row[1] is None:
        raise SegmentNotFound(f"segment {segment} of session {session} does not exist")
    return int(row[0]), int(row[1]) + 1
