"""``SqliteStore``: every context in one SQLite database file.

For one machine where a single file is handier than a folder tree (backups, copies, ad hoc SQL
with the ``sqlite3`` shell), and where a few processes share the store.

**Schema** (see the migrations at the bottom; ids are UUID strings, times RFC 3339 strings)::

    contexts(context PK, type, session_id, segment_id, created_at, updated_at,
             message_count, last_active)              the heads, with their listing counts
    sessions(session_id PK, context, created_at)
    segments(session_id, segment_id, created_at)      PK (session_id, segment_id)
    entries(id PK, session_id, segment_id, seq, kind, ts, line)
                                                      UNIQUE (session_id, segment_id, seq)
    traces(id, session_id, segment_id, line)          debug traces, oldest first by id
    search_docs(id PK, session_id, segment_id, seq, role, ts, body, tags)   history items
    search_fts, search_recent                         FTS5 over search_docs (see Search)
    search_meta(hw, floor, wm)                        how far the derived tables have read
    migrations(name PK, applied_at)

A segment's header is its entry with seq 0, so reading a segment is one indexed range scan.
``line`` is the entry's JSON exactly as :func:`terrarium.codec.encode` wrote it (unknown keys
and key order survive), so a read returns the same dicts as :class:`MemoryStore`; ``kind`` and
``ts`` are copies kept for queries (``json_extract`` works on ``line`` too). ``id`` is the
arrival order (an ``INTEGER PRIMARY KEY``, so a ``VACUUM`` keeps it).

**Appends.** Appending one entry is one ``INSERT`` in autocommit mode: SQLite takes its one
write lock for the statement, so writers in any number of threads and processes are
serialised (others wait up to ``busy_timeout`` seconds, default 30, instead of failing at
once). The statement is the whole compare-and-append: the unique key refuses a seq that is
taken, and the line is NULL, which ``NOT NULL`` refuses, unless the entry before exists, so
there is never a gap and never an entry for a deleted segment. The seq it proposes is
``expected_seq`` or the next seq this store last saw the segment reach; when refused, the
store reads the segment's tail and raises :class:`~terrarium.errors.ConflictError` (with
``expected_seq``) or retries there. Several entries go in one ``BEGIN IMMEDIATE``
transaction, which reads the tail under the lock.

**Durability.** The journal is WAL (set on open; readers never block the writer nor the
writer the readers). ``synchronous="NORMAL"``, the default, does not sync on commit: an
acknowledged append survives the death of the process, but a power cut or an OS crash may lose
the last transactions (never corrupt the database). ``"FULL"`` syncs the WAL on every commit
and survives power loss, for ~250-300 us more per append here.

**Derived state.** The search tables and the listing counts on the heads are derived from the
entries and brought up to them in batches, never in the append of one entry: ``wm`` is the
newest entry id they have read. They read everything above it (in the reader's own write
transaction, so a rolled back entry is never read) when ``SEARCH_BATCH`` entries wait, in the
append that makes them wait, and before every search, listing and head move, so that what
those see is always complete: an acknowledged entry is found by the next search. A delete
that frees the newest ids lowers ``wm`` with it. :meth:`SqliteStore.reindex` rebuilds all of
it from the entries. Measured (``benchmarks/bench_stores.py``, ``NORMAL``, see
``benchmarks/README.md``): an append of one history item costs about 1.2x a bare ``INSERT``
of the same row (median), the batch catch-up adding ~15 us per entry on average.

**Search** (:class:`~terrarium.stores.base.Searchable`) has the semantics of FsStore's index
(:mod:`terrarium.stores.fs_search`), whose helpers it shares: the same history items (every
``user_input``, ``item`` and ``system_item`` entry with text, and the history a header carries,
with seq 0), the same text preparation, FTS5 tokenizer, quoting of the user's words as data,
filter tokens (``tags``: session, role, type; three tokens, so bm25 scores equal FsStore's),
bm25 ranking, snippets and highlight spans.

Ranking is :class:`terrarium.stores.fts.Ranker`'s, shared with FsStore's index: a query
found in more than ``RANK_WINDOW`` items is ranked among its most recent matches only, in a
second FTS5 table over the newest items, where even a common word is cheap to weigh.
``search_fts`` holds every item up to ``hw``, the newest; ``search_recent`` those from
``floor`` on, ``SEARCH_RECENT`` to twice as many of them: past that it is rebuilt over the
newest ``SEARCH_RECENT`` (~0.5 s at a time, once per ``SEARCH_RECENT`` items), because
letting items out one at a time leaves FTS5 delete markers that made a common word twice as
slow to rank. A search reads ``search_recent`` alone while it holds everything (scores then
equal FsStore's exactly), else ``search_fts``. Each FTS5 table's content is a view of the rows
it holds, so ``'rebuild'`` and ``'integrity-check'`` mean what they say.
Deleting a context finds its items through their session tag (no index on
``search_docs.session_id`` for every item to update).

**Listing.** :meth:`SqliteStore.list_contexts_fast` gives every context's message count and
last activity, as a restore would find them, from one scan of the heads, restoring nothing:
the catch-up adds each read entry to the counts of the head it extends, and a head move counts
its new segment (its header's history, or a fork's prefix of its parent, and its entries).

**Read-only databases.** A database file that this process cannot write (the file, its
folder, a read-only mount), or that a full disk keeps from opening for writing, is opened
read-only (``mode=ro``, or ``immutable`` when its ``-shm`` file cannot be created and no
``-wal`` file holds data), and no migration is applied: a schema that needs one is refused in
one line. Writes raise :class:`~terrarium.errors.StoreError` naming the cause. Where the
derived state cannot be caught up (read-only, a full disk, a lock held past ``busy_timeout``),
a listing adds the entries past ``wm`` to the counts of the heads they extend, and a search
scans their history items, scoring them with bm25 over FTS5's own totals (its "averages"
record) plus theirs, so nothing acknowledged is missed. The database file is created
``0600`` before SQLite opens it, so its ``-wal`` and ``-shm`` are too; missing folders
``0700``.

**Threads.** Connections come from a small pool: a thread takes an idle connection for one
call and gives it back, so reads in many threads run in parallel under WAL, and the number of
connections is bounded by the number of calls in flight, not by how many threads ever touched
the store (a connection per thread would leak with thread pools that churn). Inside
:meth:`SqliteStore.atomic`, the thread keeps its connection so that every call in the block is
one transaction; nested blocks are savepoints.

**Context locks.** :meth:`SqliteStore.lock_context` takes an ``flock`` on a file named after
the context in ``{database}-locks/`` beside the database (like its ``-wal`` and ``-shm``
files). Each call opens its own descriptor, so the lock excludes other threads as well as other
processes, and the kernel releases it when a holder dies. A lock table would need polling to
wait, and an open write transaction would block every other writer for the whole turn.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import msgspec

from terrarium import codec
from terrarium.errors import (
    ConflictError,
    ContextExists,
    ContextNotFound,
    SegmentNotFound,
    StoreError,
)
from terrarium.model import HISTORY_KINDS, ContextId, SegmentId, SessionId, TraceEntry, utc_now
from terrarium.stores import _db
from terrarium.stores._seqs import SeqGuesses
from terrarium.stores.base import (
    HISTORY_KINDS_SQL,
    ContextSummary,
    NewEntry,
    PodMetadata,
    SearchHit,
    SearchQuery,
    SegmentRead,
    header_line,
    iter_lines,
)
from terrarium.stores.fts import (
    TAG_TOKENS,
    Fts5Tables,
    Ranker,
    assemble_hits,
    bm25,
    body_match,
    check_query,
    fts5_phrases,
    fts5_totals,
)
from terrarium.stores.locks import file_lock
from terrarium.stores.migrations import Migrations
from terrarium.text import (
    ELLIPSIS,
    HIGHLIGHT_CLOSE,
    HIGHLIGHT_OPEN,
    SNIPPET_TOKENS,
    indexed_item,
    phrase_count,
    query_terms,
    scan_snippet,
    shown_text,
    tokenize,
)

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

MIGRATIONS: Migrations[sqlite3.Connection] = Migrations("sqlite")

_MAX_SEQ = 2**31 - 1
_SEEN_CACHE = 4096

#: ``search_recent`` holds this many to twice as many of the newest items (see the docstring).
SEARCH_RECENT = 50_000
#: The derived tables lag the entries by at most this many before an append catches them up.
SEARCH_BATCH = 256
#: The page cache of each connection, in KiB (SQLite's default is 2 MB).
CACHE_KIB = 64 * 1024

_SQL_INSERT_DOC = (
    "INSERT INTO search_docs (id, session_id, segment_id, seq, role, ts, body, tags) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)

_SQL_MAX_SEQ = "SELECT max(seq) FROM entries WHERE session_id = ? AND segment_id = ?"
# One entry at a proposed seq: the whole compare-and-append in one statement. The unique key
# on (session, segment, seq) refuses a seq that is taken, and the line is NULL, which NOT NULL
# refuses, unless the entry before exists (so no gap, and no entry for a deleted segment).
# (VALUES with a subquery, not INSERT ... SELECT: that would copy the SELECT into a temporary
# table first, because it reads the table it inserts into.)
_SQL_APPEND_ONE = (
    "INSERT INTO entries (session_id, segment_id, seq, kind, ts, line) VALUES (?1, ?2, ?3, ?4, "
    "?5, CASE WHEN EXISTS (SELECT 1 FROM entries WHERE session_id = ?1 AND segment_id = ?2 "
    "AND seq = ?3 - 1) THEN ?6 END)"
)
_SQL_PENDING = "SELECT wm, (SELECT max(id) FROM entries) FROM search_meta"
_SQL_INSERT = (
    "INSERT INTO entries (session_id, segment_id, seq, kind, ts, line) VALUES (?, ?, ?, ?, ?, ?)"
)
_SQL_READ = (
    "SELECT line, (SELECT max(seq) FROM entries WHERE session_id = ?1 AND segment_id = ?2) "
    "FROM entries WHERE session_id = ?1 AND segment_id = ?2 AND seq <= ?3 ORDER BY seq"
)
_SQL_SEGMENT_EXISTS = "SELECT 1 FROM segments WHERE session_id = ? AND segment_id = ?"
_SQL_HEAD = (
    "SELECT context, session_id, segment_id, created_at, updated_at FROM contexts WHERE context = ?"
)
# In (type, name) order, as ContextId orders, from the covering index contexts_listing.
_LISTING_ORDER = "type, substr(context, length(type) + 2)"
_SQL_LISTING = (
    "SELECT context, substr(created_at, 1, 10), message_count, last_active, created_at, "
    "updated_at, session_id, segment_id FROM contexts {where} "
    f"ORDER BY {_LISTING_ORDER}"
)


class SqliteStore:
    """A store in one SQLite database file (see the module docstring)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "NORMAL",
        busy_timeout: float = 30.0,
    ) -> None:
        """Open (creating and migrating if needed) the database at ``path``.

        Args:
            path: the database file; its folder is created if missing.
            synchronous: SQLite's ``synchronous`` setting: ``NORMAL`` (default: survives a
                process crash, a power cut may lose the last transactions), ``FULL`` (survives
                power loss), ``EXTRA`` or ``OFF``.
            busy_timeout: seconds to wait for another process's write lock.

        A database that this process cannot write (its file or folder, a read-only mount) or
        that a full disk keeps from opening for writing is opened read-only: reads work, writes
        raise StoreError (see "Read-only databases").

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
        self.synchronous = mode
        self.busy_timeout = busy_timeout
        self._lock = threading.Lock()
        self._idle: list[sqlite3.Connection] = []
        self._local = threading.local()
        self._ranker = Ranker(Fts5Tables(recent="search_recent", docs="search_docs"))
        # A next seq this store saw each recent segment reach (its guess for the next append),
        # and how far it last saw the derived tables read (see "Derived state").
        self._seen: SeqGuesses[tuple[str, str]] = SeqGuesses(_SEEN_CACHE)
        self._wm = 0
        self._closed = False
        self.readonly_reason: str | None = None
        """Why the database is opened read-only (see "Read-only databases"), or None."""
        if self.path.exists() and not _db.writable(self.path):
            self.readonly_reason = "read-only"
        else:
            try:
                _db.create_private(self.path)
            except OSError as exc:
                raise StoreError(f"{self.path}: cannot create it: {_db.describe(exc)}") from exc
        try:
            conn = self._open_first()
        except sqlite3.DatabaseError as exc:
            found = _db.kind(exc, self.path)
            if self.readonly_reason is not None or found not in ("full", "readonly"):
                raise self._error(exc) from exc
            self.readonly_reason = _db.describe(exc, self.path)
            try:
                conn = self._open_first()
            except sqlite3.DatabaseError as again:
                raise self._error(again) from again
        self._idle.append(conn)

    @property
    def readonly(self) -> bool:
        """Whether the database is opened read-only (see "Read-only databases")."""
        return self.readonly_reason is not None

    def _open_first(self) -> sqlite3.Connection:
        """The first connection: migrated (or, read-only, checked readable), in WAL mode."""
        conn = self._connect()
        try:
            if self.readonly:
                _check_readable(conn, where=str(self.path))
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

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- connections

    def _connect(self) -> sqlite3.Connection:
        conn = _db.connect(self.path, timeout=self.busy_timeout, readonly=self.readonly)
        try:
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            # SQLite's default page cache is 2 MB; ranking reads each match's row sizes, and
            # with the pages of a big index at hand a search is ~3x faster.
            conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
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
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
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

    # ---------------------------------------------------------------- heads

    def get_head(self, context: ContextId) -> PodMetadata | None:
        """Return the context's head record, or None."""
        with self._read() as conn:
            row = conn.execute(_SQL_HEAD, (str(context),)).fetchone()
        return None if row is None else _head(row)

    def set_head(
        self, context: ContextId, segment_id: SegmentId, *, expected: SegmentId
    ) -> PodMetadata:
        """Move the head if it is ``expected`` now (compare-and-set in one transaction)."""
        with self._write() as conn:
            row = conn.execute(_SQL_HEAD, (str(context),)).fetchone()
            if row is None:
                raise ContextNotFound(f"context {context} does not exist")
            head = _head(row)
            if head.segment_id != expected:
                raise ConflictError(
                    f"head of {context} is {head.segment_id}, not {expected}: it moved"
                )
            if not _segment_exists(conn, head.session_id, segment_id):
                raise SegmentNotFound(
                    f"segment {segment_id} of session {head.session_id} does not exist"
                )
            now = utc_now()
            # The listing counts of the new head are computed over the entries the derived
            # tables have read, so those must be every entry (see "Derived state").
            self._wm = _catch_up(conn)
            count, last = _segment_summary(conn, str(head.session_id), str(segment_id))
            conn.execute(
                "UPDATE contexts SET segment_id = ?, updated_at = ?, message_count = ?, "
                "last_active = ? WHERE context = ?",
                (str(segment_id), now, count, last, str(context)),
            )
        return PodMetadata(head.context, head.session_id, segment_id, head.created_at, now)

    def list_contexts(self, type: str | None = None) -> list[PodMetadata]:
        """Every head record, optionally of one type, sorted by context id."""
        query = "SELECT context, session_id, segment_id, created_at, updated_at FROM contexts"
        with self._read() as conn:
            if type is None:
                rows = conn.execute(query).fetchall()
            else:
                rows = conn.execute(f"{query} WHERE type = ?", (type,)).fetchall()
        # (type, name), as ContextId orders, without parsing and validating every id again.
        return sorted(map(_head, rows), key=lambda h: h.context.partition(":")[::2])

    def list_contexts_fast(self, type: str | None = None) -> list[ContextSummary]:
        """Every context's summary (message count, last activity), without restoring any.

        The counts are kept on the heads by the derived-state catch-up (see the module
        docstring), which runs first if entries arrived since it last did; then this is one
        scan of the heads. Where the catch-up cannot write (a read-only database, a full
        disk), the entries it would have read complete the counts.
        """
        self._try_catch_up()
        where, args = ("WHERE type = ?", (type,)) if type is not None else ("", ())
        with self._snapshot() as conn:
            rows = conn.execute(_SQL_LISTING.format(where=where), args).fetchall()
            late = _late_counts(conn)
        summaries = [ContextSummary(*row) for row in rows]
        if not late:
            return summaries
        return [
            _with_late(summary, late.get((summary.session, summary.head))) for summary in summaries
        ]

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
                hits = _search(conn, self._ranker, q, phrases)
                late = _late_hits(conn, q, phrases)
            except sqlite3.OperationalError as exc:
                raise self._error(exc, "search failed: ") from exc
        if not late:
            return hits
        return sorted(hits + late, key=lambda hit: hit.score, reverse=True)[: q.limit]

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

    def _try_catch_up(self) -> None:
        """Catch the derived state up before a read, where it can be written; else the read
        completes it from the entries past ``wm`` (see "Read-only databases")."""
        if self.readonly:
            return
        try:
            self._catch_up()
        except StoreError as exc:
            log.warning("%s; reading the entries that it has not indexed instead", exc)

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
            if conn.execute("SELECT 1 FROM contexts WHERE context = ?", (str(ctx),)).fetchone():
                raise ContextExists(f"context {ctx} already exists")
            if conn.execute("SELECT 1 FROM sessions WHERE session_id = ?", (s,)).fetchone():
                raise ConflictError(f"session {session_id} already exists")
            conn.execute(
                "INSERT INTO contexts (context, type, session_id, segment_id, created_at, "
                "updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                (str(ctx), ctx.type, s, g, ts, ts),
            )
            conn.execute("INSERT INTO sessions VALUES (?, ?, ?)", (s, str(ctx), ts))
            conn.execute("INSERT INTO segments VALUES (?, ?, ?)", (s, g, ts))
            conn.execute(_SQL_INSERT, (s, g, 0, line["kind"], ts, codec.encode(line).decode()))
            count, last = _segment_summary(conn, s, g)
            conn.execute(
                "UPDATE contexts SET message_count = ?, last_active = ? WHERE context = ?",
                (count, last, str(ctx)),
            )
        return PodMetadata(str(ctx), session_id, segment_id, ts, ts)

    def delete_context(self, context: ContextId) -> bool:
        """Delete the context and its whole session in one transaction."""
        with self._write() as conn:
            row = conn.execute(
                "SELECT session_id FROM contexts WHERE context = ?", (str(context),)
            ).fetchone()
            if row is None:
                return False
            _unindex_session(conn, row[0])
            for table in ("entries", "traces", "segments", "sessions"):
                conn.execute(f"DELETE FROM {table} WHERE session_id = ?", row)
            conn.execute("DELETE FROM contexts WHERE context = ?", (str(context),))
            # Ids of the newest entries may now be handed out again: the derived tables must
            # not count them as read (they read what is above ``wm``).
            conn.execute(
                "UPDATE search_meta SET wm = min(wm, (SELECT coalesce(max(id), 0) FROM entries))"
            )
        return True

    def lock_context(self, context: ContextId) -> AbstractContextManager[None]:
        """Hold the context's lock exclusively, across threads and processes (``flock``)."""
        ctx = ContextId.parse(context)
        return file_lock(
            self.path.with_name(f"{self.path.name}-locks") / ctx.type / ctx.encoded_name
        )

    # ---------------------------------------------------------------- segments

    def create_segment(self, session_id: SessionId, header: Mapping[str, Any]) -> None:
        """Add a segment, with its header as entry 0, to an existing session."""
        line = header_line(header)
        segment_id = uuid.UUID(str(line["segment_id"]))
        ts = str(line["ts"])
        s, g = str(session_id), str(segment_id)
        with self._write() as conn:
            if not conn.execute("SELECT 1 FROM sessions WHERE session_id = ?", (s,)).fetchone():
                raise SegmentNotFound(f"session {session_id} does not exist")
            if conn.execute(_SQL_SEGMENT_EXISTS, (s, g)).fetchone():
                raise ConflictError(f"segment {segment_id} already exists")
            conn.execute("INSERT INTO segments VALUES (?, ?, ?)", (s, g, ts))
            conn.execute(_SQL_INSERT, (s, g, 0, line["kind"], ts, codec.encode(line).decode()))

    def append(
        self,
        session_id: SessionId,
        segment_id: SegmentId,
        entries: Sequence[NewEntry],
        *,
        expected_seq: int | None = None,
    ) -> int:
        """Append entries atomically; return the first one's seq (see "Appends")."""
        if len(entries) != 1:
            return self._append_many(session_id, segment_id, entries, expected_seq)
        key = (session_id, segment_id)
        seen = self._seen.get(key)
        proposal: int | None
        if seen is None:
            s, g, proposal = str(session_id), str(segment_id), None
        else:
            proposal, (s, g) = seen
        if expected_seq is not None:
            proposal = expected_seq
        held: sqlite3.Connection | None = getattr(self._local, "conn", None)
        conn = held if held is not None else self._borrow()
        try:
            while True:
                if proposal is None:
                    proposal = _next_seq(conn, s, g)
                line = next(iter_lines(entries, proposal))
                row = (s, g, proposal, line["kind"], line["ts"], codec.encode(line).decode())
                try:
                    cursor = conn.execute(_SQL_APPEND_ONE, row)
                    break
                except sqlite3.IntegrityError:  # the seq is taken, or the one before missing
                    at = _next_seq(conn, s, g)
                if expected_seq is not None:
                    raise ConflictError.stale_seq(segment_id, at, expected_seq)
                proposal = at
        except sqlite3.OperationalError as exc:
            raise self._error(exc) from exc
        finally:
            if held is None:
                self._give_back(conn)
        self._seen.remember(key, proposal + 1, (s, g))
        if (cursor.lastrowid or 0) - self._wm >= SEARCH_BATCH:
            try:
                self._catch_up(SEARCH_BATCH)
            except (StoreError, sqlite3.Error) as exc:  # the entry is in; a read catches up
                log.warning("%s: search and listing catch-up deferred: %s", self.path, exc)
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
        with self._write() as conn:
            first = _next_seq(conn, s, g)
            if expected_seq is not None and expected_seq != first:
                raise ConflictError.stale_seq(segment_id, first, expected_seq)
            rows = [
                (s, g, line["seq"], line["kind"], line["ts"], codec.encode(line).decode())
                for line in iter_lines(entries, first)
            ]
            conn.executemany(_SQL_INSERT, rows)
            (top,) = conn.execute("SELECT max(id) FROM entries").fetchone()
            if rows and top - self._wm >= SEARCH_BATCH:
                self._wm = _catch_up(conn)
        self._seen.remember((session_id, segment_id), first + len(rows), (s, g))
        return first

    def read_segment(
        self, session_id: SessionId, segment_id: SegmentId, *, stop_seq: int | None = None
    ) -> SegmentRead:
        """Read a segment's header and entries up to and including ``stop_seq``."""
        stop = _MAX_SEQ if stop_seq is None else max(stop_seq, 0)
        with self._read() as conn:
            rows = conn.execute(_SQL_READ, (str(session_id), str(segment_id), stop)).fetchall()
        if not rows:
            raise SegmentNotFound(f"segment {segment_id} of session {session_id} does not exist")
        lines = codec.decode_lines(
            ("\n".join([row[0] for row in rows]) + "\n").encode(),
            where=f"{self.path} segment {segment_id}",
            first_line=0,
        )
        entries = lines[1:] if stop_seq is None or stop_seq >= 0 else []
        return SegmentRead(header=lines[0], entries=entries, next_seq=rows[0][1] + 1)

    def next_seq(self, session_id: SessionId, segment_id: SegmentId) -> int:
        """The seq the next append gets."""
        s, g = str(session_id), str(segment_id)
        with self._read() as conn:
            next_seq = _next_seq(conn, s, g)
        self._seen.remember((session_id, segment_id), next_seq, (s, g))
        return next_seq

    def list_segments(self, session_id: SessionId) -> list[SegmentId]:
        """The session's segment ids, oldest first (UUIDv7 order)."""
        s = str(session_id)
        with self._read() as conn:
            rows = conn.execute("SELECT segment_id FROM segments WHERE session_id = ?", (s,))
            ids = sorted(uuid.UUID(row[0]) for row in rows)
        if not ids:
            raise SegmentNotFound(f"session {session_id} does not exist")
        return ids

    def append_trace(
        self, session_id: SessionId, segment_id: SegmentId, entries: Sequence[TraceEntry]
    ) -> None:
        """Append raw stream events to the segment's debug trace."""
        s, g = str(session_id), str(segment_id)
        with self._write() as conn:
            if not _segment_exists(conn, session_id, segment_id):
                raise SegmentNotFound(
                    f"segment {segment_id} of session {session_id} does not exist"
                )
            conn.executemany(
                "INSERT INTO traces (session_id, segment_id, line) VALUES (?, ?, ?)",
                [(s, g, codec.encode(e.to_dict()).decode()) for e in entries],
            )

    def read_trace(self, session_id: SessionId, segment_id: SegmentId) -> list[dict[str, Any]]:
        """The segment's debug trace, oldest first."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT line FROM traces WHERE session_id = ? AND segment_id = ? ORDER BY id",
                (str(session_id), str(segment_id)),
            ).fetchall()
            if not rows and not _segment_exists(conn, session_id, segment_id):
                raise SegmentNotFound(
                    f"segment {segment_id} of session {session_id} does not exist"
                )
        return [codec.decode(row[0]) for row in rows]

    def _catch_up(self, at_least: int = 1) -> None:
        """Bring the derived tables up to every entry if ``at_least`` entries wait for them."""
        with self._read() as conn:
            wm, top = conn.execute(_SQL_PENDING).fetchone()
        self._wm = wm
        if (top or 0) - wm >= at_least:
            with self._write() as conn:
                self._wm = _catch_up(conn)

    def reindex(self) -> int:
        """Rebuild the derived tables (search index, listing counts) from the entries.

        Returns:
            The number of contexts.
        """
        with self._write() as conn:
            conn.execute("DELETE FROM search_docs")
            for table in ("search_fts", "search_recent"):
                conn.execute(f"INSERT INTO {table} ({table}) VALUES ('delete-all')")
            conn.execute("UPDATE search_meta SET wm = 0, hw = 0, floor = 1")
            _catch_up(conn, counts=False)
            heads = conn.execute("SELECT session_id, segment_id FROM contexts").fetchall()
            for s, g in heads:
                count, last = _segment_summary(conn, s, g)
                conn.execute(
                    "UPDATE contexts SET message_count = ?, last_active = ? WHERE session_id = ?",
                    (count, last, s),
                )
        return len(heads)

    def close(self) -> None:
        """Close every idle connection; connections in use close when their call returns."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


# --------------------------------------------------------------------------- helpers


def _next_seq(conn: sqlite3.Connection, session: str, segment: str) -> int:
    """The seq the segment's next entry gets; SegmentNotFound if there is no such segment."""
    last = conn.execute(_SQL_MAX_SEQ, (session, segment)).fetchone()[0]
    if last is None:
        raise SegmentNotFound(f"segment {segment} of session {session} does not exist")
    return int(last) + 1


def _segment_exists(conn: sqlite3.Connection, session_id: SessionId, segment_id: SegmentId) -> bool:
    return (
        conn.execute(_SQL_SEGMENT_EXISTS, (str(session_id), str(segment_id))).fetchone() is not None
    )


def _head(row: Sequence[Any]) -> PodMetadata:
    return PodMetadata(row[0], uuid.UUID(row[1]), uuid.UUID(row[2]), row[3], row[4])


# --------------------------------------------------------------------------- listing

# A header's history length if it has a history list, else its origin (kind, parent, at_seq)
# as a JSON array: the usual header (a root with an empty history) is parsed once.
_HEADER_FIELDS = (
    "json_array_length(h.line, '$.history'), "
    "CASE WHEN json_type(h.line, '$.history') IS NOT 'array' THEN json_extract(h.line, "
    "'$.history', '$.origin.kind', '$.origin.parent', '$.origin.at_seq') END"
)
# Of one segment up to seq ?3: its history items among the entries, its last entry's time and
# its header's history (see _HEADER_FIELDS).
_SQL_PREFIX = (
    "SELECT (SELECT count(*) FROM entries e WHERE e.session_id = ?1 AND e.segment_id = ?2 "
    f"AND e.seq BETWEEN 1 AND ?3 AND e.kind IN {HISTORY_KINDS_SQL}), "
    "(SELECT e.ts FROM entries e WHERE e.session_id = ?1 AND e.segment_id = ?2 "
    f"AND e.seq <= ?3 ORDER BY e.seq DESC LIMIT 1), {_HEADER_FIELDS} "
    "FROM entries h WHERE h.session_id = ?1 AND h.segment_id = ?2 AND h.seq = 0"
)


def _segment_summary(conn: sqlite3.Connection, session: str, segment: str) -> tuple[int, str]:
    """A segment's history items, as a restore would count them, and its last entry's time.

    O(entries of the segment): for heads that are set, never on the append path.
    """
    row = conn.execute(_SQL_PREFIX, (session, segment, _MAX_SEQ)).fetchone()
    if row is None:  # no header: the segment is damaged; count nothing rather than fail
        return 0, ""
    items, last, *header = row
    return items + _header_items(conn, session, header), last or ""


def _header_items(conn: sqlite3.Connection, session: str, header: Sequence[Any]) -> int:
    """The history items a segment starts with: its header's history, or, for a fork that
    continues its parent, the parent's items up to the fork point (as restore replays)."""
    count = 0
    for _ in range(10_000):  # a chain of forks; bounded in case damaged headers loop
        history_len, other = header
        if other is None:  # a history list: a fresh start
            return count + int(history_len or 0)
        _, origin, parent, at_seq = codec.decode(other)
        if origin != "fork" or parent is None:
            return count
        try:
            parent = str(uuid.UUID(str(parent)))
        except ValueError:
            return count
        stop = _MAX_SEQ if at_seq is None else int(at_seq)  # None: the whole parent
        row = conn.execute(_SQL_PREFIX, (session, parent, stop)).fetchone()
        if row is None:
            return count
        count += row[0]
        header = row[2:]
    return count


# --------------------------------------------------------------------------- derived state

# A history item as indexed: (seq, role, ts, body as indexed by ``prepare_text``).
_Doc = tuple[int, str, str, str]


def _doc(seq: int, item: Any, ts: str) -> _Doc | None:
    """The indexed form of one history item, or None when it has no text to find."""
    found = indexed_item(item)
    return None if found is None else (seq, found[0], ts, found[1])


def _line_docs(seq: int, line: Any) -> list[_Doc]:
    """The history items an entry line holds with text: a header's history (all with seq 0,
    a compaction's summary or an import), or one item."""
    if not isinstance(line, dict):
        return []
    ts = str(line.get("ts", ""))
    if seq == 0:
        history = line.get("history")
        docs = (_doc(0, item, ts) for item in (history if isinstance(history, list) else ()))
        return [doc for doc in docs if doc is not None]
    doc = _doc(seq, line.get("item"), ts)
    return [] if doc is None else [doc]


def _tags(session: str, role: str, type: str | None) -> str:
    """The filter tokens of an item: session, role and context type, one token each."""
    # A canonical UUID string without its dashes is its hex: one FTS5 token.
    return f"s{session.replace('-', '')} r{role} t{(type or '').encode().hex()}"


def _catch_up(conn: sqlite3.Connection, *, counts: bool = True) -> int:
    """Bring the derived tables up to every entry (in the caller's write transaction); return
    the newest entry id, which they have now read.

    Reads the entries above ``wm``: adds their history items to ``search_docs`` and both
    FTS5 tables, and (with ``counts``) their history items and last time to the listing
    counts of the heads they extend. See "Derived state" in the module docstring.
    """
    wm, hw, floor = conn.execute("SELECT wm, hw, floor FROM search_meta").fetchone()
    (top,) = conn.execute("SELECT max(id) FROM entries").fetchone()
    if top is None or top <= wm:
        return int(wm)
    # One pass over the new entries, in arrival order (by id: a GROUP BY would have SQLite walk
    # the whole (session, segment, seq) index instead).
    segments: dict[tuple[str, str], list[Any]] = {}  # -> [history items, last time]
    types: dict[str, str | None] = {}
    docs: list[tuple[Any, ...]] = []
    pending = conn.execute(
        "SELECT session_id, segment_id, seq, kind, ts, line FROM entries WHERE id > ? ORDER BY id",
        (wm,),
    )
    for s, g, seq, kind, ts, text in pending:
        _tally(segments, s, g, seq, kind, ts)
        if kind not in HISTORY_KINDS and seq != 0:
            continue
        try:
            line = codec.decode(text)
        except msgspec.DecodeError:
            continue  # a damaged line holds nothing to find; reading the segment reports it
        for doc_seq, role, doc_ts, body in _line_docs(seq, line):
            if s not in types:
                row = conn.execute("SELECT type FROM contexts WHERE session_id = ?", (s,))
                found = row.fetchone()
                types[s] = None if found is None else found[0]
            docs.append((s, g, doc_seq, role, doc_ts, body, _tags(s, role, types[s])))
    if counts:
        conn.executemany(
            "UPDATE contexts SET message_count = message_count + ?, last_active = ? "
            "WHERE session_id = ? AND segment_id = ?",
            [(items, last, s, g) for (s, g), (items, last) in segments.items()],
        )
    hw, floor = _add_docs(conn, docs, hw, floor)
    conn.execute("UPDATE search_meta SET wm = ?, hw = ?, floor = ?", (top, hw, floor))
    return int(top)


def _tally(
    counts: dict[tuple[str, str], list[Any]], s: str, g: str, seq: int, kind: str, ts: str
) -> None:
    """Add one entry to ``counts``: per (session, segment), the history items it adds to the
    listing count of a head on that segment, and the time of its last entry."""
    counted = counts.setdefault((s, g), [0, ts])
    counted[1] = ts
    if seq != 0 and kind in HISTORY_KINDS:
        counted[0] += 1


def _add_docs(
    conn: sqlite3.Connection, docs: Sequence[tuple[Any, ...]], hw: int, floor: int
) -> tuple[int, int]:
    """Index ``docs`` (session, segment, seq, role, ts, body, tags) as items ``hw + 1``...
    in both FTS5 tables; return the new ``hw`` and ``floor``."""
    if not docs:
        return hw, floor
    first = hw + 1
    conn.executemany(_SQL_INSERT_DOC, [(first + i, *doc) for i, doc in enumerate(docs)])
    last = first + len(docs) - 1
    conn.execute(
        "INSERT INTO search_fts (rowid, body, tags) SELECT id, body, tags FROM search_docs "
        "WHERE id >= ?",
        (first,),
    )
    # search_recent holds the newest SEARCH_RECENT to 2 x SEARCH_RECENT items. Past that it is
    # rebuilt over the newest SEARCH_RECENT: letting items out one by one would leave FTS5
    # delete markers in it, which made a common word twice as slow to rank.
    if last - floor + 1 > 2 * SEARCH_RECENT:
        new_floor = last - SEARCH_RECENT + 1
        conn.execute("UPDATE search_meta SET hw = ?, floor = ?", (last, new_floor))
        conn.execute("INSERT INTO search_recent (search_recent) VALUES ('rebuild')")
    else:
        new_floor = floor
        conn.execute(
            "INSERT INTO search_recent (rowid, body, tags) SELECT id, body, tags "
            "FROM search_docs WHERE id >= ?",
            (first,),
        )
    return last, new_floor


def _unindex_session(conn: sqlite3.Connection, session_id: str) -> None:
    """Remove a session's items from the search tables (in the caller's transaction).

    The items are found through their session tag in ``search_fts``, which holds every
    item; this spares ``search_docs`` an index on ``session_id`` that every item would pay
    to update.
    """
    tag = f'tags : "s{session_id.replace("-", "")}"'
    ids = [
        row[0]
        for row in conn.execute("SELECT rowid FROM search_fts WHERE search_fts MATCH ?", (tag,))
    ]
    if not ids:
        return
    (floor,) = conn.execute("SELECT floor FROM search_meta").fetchone()
    found = json.dumps(ids)
    for table, low in (("search_fts", 0), ("search_recent", floor)):
        # External content: FTS5 needs the old values to remove an item's tokens.
        conn.execute(
            f"INSERT INTO {table} ({table}, rowid, body, tags) SELECT 'delete', id, body, "
            "tags FROM search_docs WHERE id IN (SELECT value FROM json_each(?)) AND id >= ?",
            (found, low),
        )
    conn.execute("DELETE FROM search_docs WHERE id IN (SELECT value FROM json_each(?))", (found,))


# --------------------------------------------------------------------------- late entries
# What a read sees of the entries past ``wm`` when the derived state could not be caught up.

_SQL_LATE = (
    "SELECT session_id, segment_id, seq, kind, ts, line FROM entries WHERE id > ? ORDER BY id"
)


def _late_counts(conn: sqlite3.Connection) -> dict[tuple[str, str], list[Any]]:
    """Per (session, segment), what the entries past ``wm`` add to a head's listing counts
    (see :func:`_tally`); empty when the derived state has read every entry."""
    wm, top = conn.execute(_SQL_PENDING).fetchone()
    counts: dict[tuple[str, str], list[Any]] = {}
    if top is not None and top > wm:
        for s, g, seq, kind, ts, _ in conn.execute(_SQL_LATE, (wm,)):
            _tally(counts, s, g, seq, kind, ts)
    return counts


def _with_late(summary: ContextSummary, late: list[Any] | None) -> ContextSummary:
    if late is None:
        return summary
    count, last = late
    return msgspec.structs.replace(
        summary, message_count=summary.message_count + count, last_active=last
    )


def _late_hits(conn: sqlite3.Connection, q: SearchQuery, phrases: list[str]) -> list[SearchHit]:
    """Hits among the history items of the entries past ``wm``, found by scanning them.

    Scored with bm25 as FTS5 would score them in ``search_fts`` with them added (its row and
    token totals and each phrase's rows, plus theirs); the indexed hits keep the scores FTS5
    gave them without these items, a difference of a few rows in the statistics.
    """
    wm, top = conn.execute(_SQL_PENDING).fetchone()
    if top is None or top <= wm:
        return []
    docs = _late_docs(conn, wm)
    if not docs:
        return []
    terms = [tokenize(term) for term in query_terms(q.text)]
    freqs = [[phrase_count(doc[-1], term) for term in terms] for doc in docs]
    rows, tokens = fts5_totals(conn, "search_fts")
    rows += len(docs)
    average = (tokens + sum(len(doc[-1]) + TAG_TOKENS for doc in docs)) / rows
    doc_freqs = [
        sum(1 for f in freqs if f[i])
        + conn.execute(
            "SELECT count(*) FROM search_fts WHERE search_fts MATCH ?", (body_match([phrase]),)
        ).fetchone()[0]
        for i, phrase in enumerate(phrases)
    ]
    hits = []
    for (context, created, s, g, seq, role, ts, text, found), freq in zip(docs, freqs, strict=True):
        kind = context.partition(":")[0]
        if not all(freq) or (q.context or context) != context or (q.type or kind) != kind:
            continue
        if (q.role or role) != role or (q.since is not None and ts < q.since):
            continue
        snippet, spans = scan_snippet(text, terms)
        score = bm25(freq, doc_freqs, rows, len(found) + TAG_TOKENS, average)
        hits.append(
            SearchHit(
                context,
                created[:10],
                uuid.UUID(s),
                uuid.UUID(g),
                seq,
                role,
                ts,
                snippet,
                spans,
                score,
            )
        )
    return hits


def _late_docs(conn: sqlite3.Connection, wm: int) -> list[tuple[Any, ...]]:
    """(context, created_at, session, segment, seq, role, ts, text, tokens) of every history
    item with text in the entries past ``wm`` whose context exists."""
    contexts: dict[str, tuple[str, str] | None] = {}
    docs: list[tuple[Any, ...]] = []
    for s, g, seq, kind, _, text in conn.execute(_SQL_LATE, (wm,)):
        if kind not in HISTORY_KINDS and seq != 0:
            continue
        if s not in contexts:
            row = conn.execute(
                "SELECT context, created_at FROM contexts WHERE session_id = ?", (s,)
            )
            contexts[s] = row.fetchone()
        where = contexts[s]
        try:
            line = codec.decode(text)
        except msgspec.DecodeError:
            continue  # as the catch-up skips it
        if where is None:
            continue
        for doc_seq, role, ts, body in _line_docs(seq, line):
            shown = shown_text(body)
            docs.append((*where, s, g, doc_seq, role, ts, shown, tokenize(shown)))
    return docs


# --------------------------------------------------------------------------- search


def _search(
    conn: sqlite3.Connection, ranker: Ranker, q: SearchQuery, phrases: list[str]
) -> list[SearchHit]:
    """The hits for a checked query; ``phrases`` are its terms as FTS5 strings."""
    filters = ""
    if q.context is not None:
        row = conn.execute("SELECT session_id FROM contexts WHERE context = ?", (q.context,))
        found = row.fetchone()
        if found is None:
            return []
        filters += f' AND tags : "s{found[0].replace("-", "")}"'
    if q.type is not None:
        filters += f' AND tags : "t{q.type.encode().hex()}"'
    if q.role is not None:
        filters += f' AND tags : "r{q.role}"'
    match = body_match(phrases) + filters
    hw, floor, lowest = conn.execute(
        "SELECT hw, floor, (SELECT min(id) FROM search_docs) FROM search_meta"
    ).fetchone()
    if lowest is None:
        return []
    # While search_recent holds every item it alone answers (bm25 over all items, as FsStore's
    # index computes it); else search_fts, which always holds every item.
    table = "search_recent" if floor <= lowest else "search_fts"
    ranked = ranker.rank(conn, table, phrases, filters, q, hw - lowest + 1)
    if not ranked:
        return []
    ids = [rowid for rowid, _ in ranked]
    snippets = dict(  # CROSS JOIN: FTS5 gets one rowid at a time, never the whole match
        conn.execute(
            f"SELECT f.rowid, snippet({table}, 0, ?, ?, ?, ?) FROM json_each(?) AS j "
            f"CROSS JOIN {table} AS f WHERE f.rowid = j.value AND {table} MATCH ?",
            (HIGHLIGHT_OPEN, HIGHLIGHT_CLOSE, ELLIPSIS, SNIPPET_TOKENS, json.dumps(ids), match),
        )
    )
    marks = ",".join("?" * len(ids))
    meta = {
        row[0]: (row[1], row[2][:10], *row[3:])  # the date is the creation date
        for row in conn.execute(
            "SELECT d.id, c.context, c.created_at, d.session_id, d.segment_id, d.seq, d.role, "
            "d.ts FROM search_docs d JOIN contexts c ON c.session_id = d.session_id "
            f"WHERE d.id IN ({marks})",
            ids,
        )
    }
    return assemble_hits(ranked, meta, snippets)


# --------------------------------------------------------------------------- migrations


def migrate(conn: sqlite3.Connection, *, where: str, stop_after: str | None = None) -> list[str]:
    """Apply pending migrations on an autocommit connection; return the names applied.

    Each migration runs in its own ``BEGIN IMMEDIATE`` transaction with its record, and the
    list of applied names is read again under that lock, so processes opening the database at
    the same time apply each step once. ``stop_after`` (for tests) stops after that migration.

    Raises:
        FormatVersionError: the database records a migration this version does not know.
    """
    conn.execute(
        "CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)"
    )
    done: list[str] = []
    if not MIGRATIONS.pending(_applied(conn), where=where):
        return done  # the usual case: no write lock taken
    for step in MIGRATIONS:
        conn.execute("BEGIN IMMEDIATE")
        try:
            if step in MIGRATIONS.pending(_applied(conn), where=where):
                step.apply(conn)
                conn.execute("INSERT INTO migrations VALUES (?, ?)", (step.name, utc_now()))
                done.append(step.name)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if step.name == stop_after:
            break
    return done


def _check_readable(conn: sqlite3.Connection, *, where: str) -> None:
    """Refuse, in one line, a read-only database whose schema this version cannot read.

    Raises:
        FormatVersionError: it records a migration this version does not know.
        StoreError: it lacks migrations (or is empty), which a read-only open cannot apply.
    """
    try:
        applied = _applied(conn)
    except sqlite3.OperationalError:  # no migrations table: empty, or not a terrarium database
        applied = []
    missing = [step.name for step in MIGRATIONS.pending(applied, where=where)]
    if missing:
        raise StoreError(
            f"{where}: read-only, and its schema is older than this terrarium's (it lacks "
            f"{', '.join(missing)}): open it once with write access to migrate it"
        )


def _applied(conn: sqlite3.Connection) -> list[str]:
    return [row[0] for row in conn.execute("SELECT name FROM migrations")]


@MIGRATIONS
def m001_initial(conn: sqlite3.Connection) -> None:
    """Heads, sessions, segments and entries."""
    for statement in (
        """CREATE TABLE contexts (
            context TEXT PRIMARY KEY,
            type TEXT NOT NULL,
            session_id TEXT NOT NULL UNIQUE,
            segment_id TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )""",
        "CREATE INDEX contexts_by_type ON contexts (type)",
        """CREATE TABLE sessions (
            session_id TEXT PRIMARY KEY,
            context TEXT NOT NULL,
            created_at TEXT NOT NULL
        )""",
        """CREATE TABLE segments (
            session_id TEXT NOT NULL,
            segment_id TEXT NOT NULL,
            created_at TEXT NOT NULL,
            PRIMARY KEY (session_id, segment_id)
        )""",
        """CREATE TABLE entries (
            session_id TEXT NOT NULL,
            segment_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            kind TEXT NOT NULL,
            ts TEXT NOT NULL,
            line TEXT NOT NULL,
            PRIMARY KEY (session_id, segment_id, seq)
        )""",
    ):
        conn.execute(statement)


@MIGRATIONS
def m002_traces(conn: sqlite3.Connection) -> None:
    """Debug traces of raw stream events, per segment."""
    conn.execute(
        """CREATE TABLE traces (
            id INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL,
            segment_id TEXT NOT NULL,
            line TEXT NOT NULL
        )"""
    )
    conn.execute("CREATE INDEX traces_by_segment ON traces (session_id, segment_id, id)")


@MIGRATIONS
def m003_search(conn: sqlite3.Connection) -> None:
    """Full-text search over history items (FTS5), backfilled from the entries there are."""
    for statement in (
        # hw: items up to this id are in search_fts; floor: items from this id on are in
        # search_recent (floor <= hw + 1, so every item is in one of them or both).
        "CREATE TABLE search_meta (hw INTEGER NOT NULL, floor INTEGER NOT NULL)",
        "INSERT INTO search_meta VALUES (0, 1)",
        """CREATE TABLE search_docs (
            id INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL,
            segment_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            role TEXT NOT NULL,
            ts TEXT NOT NULL,
            body TEXT NOT NULL,
            tags TEXT NOT NULL
        )""",
        # Each FTS5 table's content is a view of exactly the items it indexes, so that its
        # 'rebuild' and 'integrity-check' mean what they say.
        """CREATE VIEW search_fts_content AS SELECT id, body, tags FROM search_docs
            WHERE id <= (SELECT hw FROM search_meta)""",
        """CREATE VIEW search_recent_content AS SELECT id, body, tags FROM search_docs
            WHERE id >= (SELECT floor FROM search_meta)""",
        """CREATE VIRTUAL TABLE search_fts USING fts5(body, tags,
            content='search_fts_content', content_rowid='id',
            tokenize='unicode61 remove_diacritics 2')""",
        """CREATE VIRTUAL TABLE search_recent USING fts5(body, tags,
            content='search_recent_content', content_rowid='id',
            tokenize='unicode61 remove_diacritics 2')""",
    ):
        conn.execute(statement)
    # Backfill in arrival order (the order the entries were inserted).
    types = dict(conn.execute("SELECT session_id, type FROM contexts").fetchall())
    rows: list[tuple[Any, ...]] = []
    cursor = conn.execute(
        "SELECT session_id, segment_id, seq, line FROM entries "
        "WHERE seq = 0 OR kind IN ('user_input', 'item', 'system_item') ORDER BY rowid"
    )
    for session_id, segment_id, seq, text in cursor:
        for seq_, role, ts, body in _line_docs(seq, codec.decode(text)):
            tags = _tags(session_id, role, types.get(session_id))
            rows.append((len(rows) + 1, session_id, segment_id, seq_, role, ts, body, tags))
    conn.executemany(_SQL_INSERT_DOC, rows)
    conn.execute(
        "UPDATE search_meta SET hw = ?, floor = ?",
        (len(rows), max(1, len(rows) - SEARCH_RECENT + 1)),
    )
    for table in ("search_fts", "search_recent"):
        conn.execute(f"INSERT INTO {table} ({table}) VALUES ('rebuild')")


@MIGRATIONS
def m004_derived_state(conn: sqlite3.Connection) -> None:
    """Entries get a stable arrival id, up to which the derived tables (search, listing
    counts on the heads) are brought in batches instead of in every append."""
    conn.execute(
        """CREATE TABLE entries_by_id (
            id INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL,
            segment_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            kind TEXT NOT NULL,
            ts TEXT NOT NULL,
            line TEXT NOT NULL,
            UNIQUE (session_id, segment_id, seq)
        )"""
    )
    # The rowids are the arrival order; as an INTEGER PRIMARY KEY they survive a VACUUM.
    conn.execute(
        "INSERT INTO entries_by_id SELECT rowid, session_id, segment_id, seq, kind, ts, line "
        "FROM entries ORDER BY rowid"
    )
    conn.execute("DROP TABLE entries")
    conn.execute("ALTER TABLE entries_by_id RENAME TO entries")
    conn.execute("ALTER TABLE contexts ADD COLUMN message_count INTEGER NOT NULL DEFAULT 0")
    conn.execute("ALTER TABLE contexts ADD COLUMN last_active TEXT NOT NULL DEFAULT ''")
    # Listing reads this index alone, in order: 100k contexts without a sort or a table lookup.
    conn.execute(
        f"CREATE INDEX contexts_listing ON contexts ({_LISTING_ORDER}, context, created_at, "
        "message_count, last_active, updated_at, session_id, segment_id)"
    )
    for s, g in conn.execute("SELECT session_id, segment_id FROM contexts").fetchall():
        count, last = _segment_summary(conn, s, g)
        conn.execute(
            "UPDATE contexts SET message_count = ?, last_active = ? WHERE session_id = ?",
            (count, last, s),
        )
    # Until now only search_recent held the newest items; from here on search_fts holds every
    # item up to hw, and hw is the newest.
    conn.execute("ALTER TABLE search_meta ADD COLUMN wm INTEGER NOT NULL DEFAULT 0")
    (hw,) = conn.execute("SELECT hw FROM search_meta").fetchone()
    (top,) = conn.execute("SELECT max(id) FROM search_docs").fetchone()
    if top is not None and top > hw:
        conn.execute(
            "INSERT INTO search_fts (rowid, body, tags) SELECT id, body, tags FROM search_docs "
            "WHERE id > ?",
            (hw,),
        )
        conn.execute("UPDATE search_meta SET hw = ?", (top,))
    # Every entry there is was indexed when it was appended.
    conn.execute("UPDATE search_meta SET wm = (SELECT coalesce(max(id), 0) FROM entries)")
