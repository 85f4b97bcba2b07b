"""The derived index: full-text search and fast listing for the stores without native ones.

It owns nothing: delete it and the next search rebuilds it (docs/architecture.md). Trade-off:
writers never touch it, so a search or listing first brings it up to date from what changed.
An idle refresh costs one indexed query or a ``scandir`` of an empty folder (~10 µs), a session
with one new message ~0.5 ms, where a walk that ``stat``\\s every session folder costs 3.5 s at
100k sessions. When it cannot be brought up to date it raises
:class:`~terrarium.errors.IndexUnavailable` and the callers answer from the store.

Usage::

    index = terrarium.index.of(store)  # the store's SearchIndex, or None
    hits = index.search(SearchQuery("deploy", role="user"))
    contexts = index.list_contexts_fast("cli")
"""

from __future__ import annotations

import contextlib
import logging
import operator
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from terrarium.errors import IndexUnavailable
from terrarium.index import _sql as sql
from terrarium.index._build import Build
from terrarium.index._cursor import LogChanges
from terrarium.index._fts import (
    LONG_BODY,
    Ranker,
    assemble_hits,
    body_match,
    fts5_phrases,
    long_snippet,
)
from terrarium.index._listing import ContextSummary
from terrarium.index._overview import Reader
from terrarium.index._query import SearchHit, SearchQuery, check_query
from terrarium.index._refresh import IndexStats, IndexUpdate, Source
from terrarium.index._sql import SCHEMA_VERSION
from terrarium.model import ContextId, SegmentId, SessionId
from terrarium.stores import _db
from terrarium.stores.base import INDEX_DB
from terrarium.text import (
    ELLIPSIS,
    HIGHLIGHT_CLOSE,
    HIGHLIGHT_OPEN,
    SNIPPET_TOKENS,
    query_terms,
)

if TYPE_CHECKING:
    from terrarium.stores.fs._changes import FsChanges
    from terrarium.stores.fs._shape import ShapeChange

__all__ = ["DB_NAME", "IndexStats", "SearchIndex"]

log = logging.getLogger(__name__)

#: How long a claimed session stays watched (seconds). Must exceed 2 x ``MARK_EVERY``.
WATCH_SECONDS = 15.0
#: How many of the most recent items ``fts_recent`` holds (it is rebuilt at twice that).
RECENT_SIZE = 50_000
#: Seconds an update waits for another process's update before searching what is there.
BUSY_TIMEOUT = 30.0
#: Merge the FTS b-trees after a refresh that indexed at least this many items.
_OPTIMIZE_AFTER = 20_000

DB_NAME = INDEX_DB
_T = TypeVar("_T")
#: The rows of the contexts with no session here, or what gives them (``SearchIndex.others``).
Others = list[ContextSummary] | Callable[[], list[ContextSummary]]
#: A row's values for the ``others`` table, in its columns' order (``sql.SCHEMA``).
_OTHER_COLUMNS = operator.attrgetter(
    *("context", "type", "name", "state", "date", "created_at", "last_active"),
    *("message_count", "legacy_path"),
)


class SearchIndex:
    """The derived search and listing index of one store (module docstring)."""

    def __init__(
        self,
        source: FsChanges | LogChanges | str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
    ):
        """Open the index of ``source`` (``store.index_source()`` or an ``FsStore`` root)."""
        if isinstance(source, str | os.PathLike):
            from terrarium.stores.fs._changes import FsChanges  # not on a cursor store's path

            source = FsChanges(Path(source).absolute())
        self.source: Source = source
        self._files = None if isinstance(source, LogChanges) else source
        """The filesystem store's markers and shape; None: the store has a change cursor."""
        self._cursor = source if isinstance(source, LogChanges) else None
        # Checked at each open, not here: a link out of the root (a store's own file: any
        # link) is refused.
        self.path = source.path if isinstance(source, LogChanges) else source.index_dir / DB_NAME
        root = self._files.root if self._files is not None else self.path.absolute().parent
        self.root = os.path.join(root, "")
        """How problem texts name the store's folder now (the index keeps ``sql.ROOT``): a
        files store's root, or the folder of a SQLite database and its index beside it."""
        self.clock = clock
        self.stats = IndexStats()
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._ino: int | None = None
        self.readonly = False
        self.readonly_reason: str | None = None
        self._warned: set[str] = set()
        self._ranker = Ranker()
        self._build: Build | None = None
        self.others: Callable[[], list[ContextSummary]] | None = None
        """The contexts with no session here (archived, legacy), set by ``listing_index``."""

    def __repr__(self) -> str:
        return f"SearchIndex({str(self.path)!r})"

    # ------------------------------------------------------------------ connection

    def _connection(self) -> sqlite3.Connection:
        """The open connection, reopened if the file was replaced (read-only if not writable)."""
        if self._conn is not None:
            with contextlib.suppress(FileNotFoundError):
                if os.stat(self.path).st_ino == self._ino:
                    return self._conn
            log.info("%s was deleted or replaced: reopening it", self.path)
            self.close()
        self.readonly_reason = None if _db.writable(self.path) else "read-only"
        try:
            conn = self._open(readonly=self.readonly_reason is not None)
        except (sqlite3.Error, OSError) as exc:
            conn = self._reopen(exc)
        self._conn = conn
        self._ino = os.stat(self.path).st_ino
        return conn

    def _reopen(self, exc: BaseException) -> sqlite3.Connection:
        """Rebuild a corrupt index, open a full disk's read-only, else IndexUnavailable."""
        found = _db.kind(exc, self.path)
        if self.readonly_reason is not None or found not in ("corrupt", "full", "readonly"):
            raise self._unavailable(exc) from exc
        if found == "corrupt":
            self._discard(exc)
        else:
            self.readonly_reason = _db.describe(exc, self.path)
        try:
            return self._open(readonly=self.readonly_reason is not None)
        except (sqlite3.Error, OSError) as again:
            raise self._unavailable(again) from again

    def _open(self, *, readonly: bool) -> sqlite3.Connection:
        """Open the index, creating it (``0600``) and its schema if it is writable."""
        checked = self._files if self._files is not None else self._cursor
        assert checked is not None
        checked.index_file(DB_NAME)  # IndexUnavailable if it is a link out of the store
        if not readonly:
            _db.create_private(self.path)
        conn = _db.connect(self.path, timeout=BUSY_TIMEOUT, readonly=readonly)
        try:
            if not readonly:
                _db.enable_wal(conn, BUSY_TIMEOUT)
                conn.execute(sql.SYNCHRONOUS)
            for pragma in sql.PRAGMAS:
                conn.execute(pragma)
            version = conn.execute(sql.USER_VERSION).fetchone()[0]
            if version != SCHEMA_VERSION:
                if readonly:
                    why = f"{self.path}: {self.readonly_reason or 'read-only'}"
                    if version:  # 0: never built (a full disk leaves it so), not an old schema
                        why += f", and of schema version {version}, not {SCHEMA_VERSION}"
                    raise IndexUnavailable(why)
                self._create_schema(conn, version)
            conn.execute(sql.PROBE).fetchone()
        except BaseException:
            conn.close()
            raise
        self.readonly = readonly
        return conn

    def _unavailable(self, exc: BaseException) -> IndexUnavailable:
        """The error that says why the index cannot serve now (``exc`` in one line)."""
        reason = self.readonly_reason if self.readonly else None  # why a write was refused
        return IndexUnavailable(_db.failure(exc, self.path, reason))

    def _create_schema(self, conn: sqlite3.Connection, version: int) -> None:
        """Drop whatever the database holds and create the schema (the index is derived)."""
        with _db.immediate(conn):  # one process at a time updates; searches never wait
            if conn.execute(sql.USER_VERSION).fetchone()[0] == SCHEMA_VERSION:
                return  # another process created it meanwhile
            if version:
                log.info("search index schema %s is not %s: rebuilding", version, SCHEMA_VERSION)
            for kind, name in conn.execute(sql.DROPPED).fetchall():
                conn.execute(sql.DROP.format(type=kind, name=name))
            for statement in sql.SCHEMA:
                conn.execute(statement)
            conn.execute(sql.SET_USER_VERSION)

    def _discard(self, exc: BaseException) -> None:
        """Close and delete a corrupt index: the next open rebuilds it from the files."""
        log.warning("%s is corrupt (%s): rebuilding it from the files", self.path, exc)
        self.close()
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.path}{suffix}")

    def close(self) -> None:
        """Close the database connection (the index can be reopened by using it again)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn, self._ino = None, None

    # ------------------------------------------------------------------ refresh

    def refresh(self, *, full: bool = False) -> bool:
        """Bring the index up to date (``full``: walk every session); True if it looked."""
        return self._guarded(lambda: self._refresh(full=full))

    def rebuild(self) -> int:
        """Drop everything and index every session afresh; return the sessions indexed."""
        return self._guarded(self._rebuild)

    def _guarded(self, run: Callable[[], _T], *, retry: bool = False) -> _T:
        """``run()`` under the lock, a failing database turned into :class:`IndexUnavailable`.

        Only a corrupt index is deleted (with ``retry``, rebuilt by a second run).
        """
        with self._lock:
            for attempt in (1, 2):
                try:
                    return run()
                except (sqlite3.Error, OSError) as exc:
                    if _db.kind(exc) != "corrupt" or self.readonly:
                        raise self._unavailable(exc) from exc
                    self._discard(exc)
                    if not retry or attempt == 2:
                        raise self._unavailable(exc) from exc
        raise AssertionError("unreachable")

    def _refresh(self, *, full: bool, budget: float | None = None) -> bool:
        conn = self._connection()
        if self.readonly:
            behind = self._behind(conn)
            if behind is not None:
                raise IndexUnavailable(f"{self.path}: {self.readonly_reason}, and {behind}")
            return False
        built = _meta(conn, "built") is not None
        if budget is not None and not (full or built):
            if not self._build_step(conn, budget):
                return True
            built = True  # it ended: what was written meanwhile is read now
        self._build = None
        full = full or not built
        files = self._files
        if files is None:
            if not full and self._touched(conn) == []:
                return False
            shape, now = None, self.clock()
        else:
            markers = files.markers()
            now = self.clock()
            shape = None if full else files.shape(_meta(conn, "shape"))
            moved = shape is not None and shape.changed
            if not (full or markers or moved or self._watch_needs_work(conn, now)):
                return False
        items = self.stats.items
        with _db.immediate(conn):  # the others wait for it, then find little left to do
            claimed = self._update(conn, full=full, now=now, shape=shape)
        if self._files is not None:
            self._files.release(claimed)
        if self.stats.items - items >= _OPTIMIZE_AFTER:
            self._optimize(conn)
        return True

    def _build_step(self, conn: sqlite3.Connection, budget: float) -> bool:
        """One step of a first build, of about ``budget`` seconds (see ``_build``); True once
        the index is built."""
        deadline = time.monotonic() + budget
        claimed: list[Path] = []
        with _db.immediate(conn):
            if _meta(conn, "built") is not None:  # another process built it
                return True
            if self._build is None:
                position = _meta(conn, "build_cursor")
                if position is None:
                    position = self._cursor.changes(None)[1] if self._cursor else ""
                conn.execute(sql.SET_META, ("build_cursor", position))
                self._build = Build(self.source, conn, position)
            build = self._build
            work = IndexUpdate(self, conn, defer_recent=False, recent_size=RECENT_SIZE)
            if self._files is not None:
                claimed = self._claim_during(conn, work, build)
            done = build.step(work, deadline)
            if done:
                self._end_build(conn, work, build)
            work.finish()
        if self._files is not None:
            self._files.release(claimed + ((build.held or []) if done else []))
        return done

    def _claim_during(
        self, conn: sqlite3.Connection, work: IndexUpdate, build: Build
    ) -> list[Path]:
        """Hold the markers there when the build began (the walk reads their sessions); index
        and watch those left since, and return them to release after the commit."""
        assert self._files is not None
        claimed = self._files.claim()
        if build.held is None:
            build.held = [path for _, path in claimed]
            build.watch = sorted({sid for sid, _ in claimed})
            return []
        held = set(build.held)  # a claim takes the claimed markers not released yet too
        claimed = [(sid, path) for sid, path in claimed if path not in held]
        for sid in sorted({sid for sid, _ in claimed}):
            work.index_session(sid)
            build.seen.add(sid)
        until = self.clock() + WATCH_SECONDS
        conn.executemany(sql.WATCH, [(until, sid) for sid, _ in claimed])
        return [path for _, path in claimed]

    def _end_build(self, conn: sqlite3.Connection, work: IndexUpdate, build: Build) -> None:
        """The last step of a build: what a full refresh records once it has walked."""
        work.drop_unseen(build.seen)  # gone since an earlier step of the build
        if self._files is not None:
            conn.execute(sql.SET_META, ("shape", self._files.shape(None).text))
            conn.execute(sql.UNWATCH_ENDED, (self.clock(),))
            until = self.clock() + WATCH_SECONDS  # as a full refresh watches what it claimed
            conn.executemany(sql.WATCH, [(until, sid) for sid in build.watch])
        else:
            conn.execute(sql.SET_META, ("cursor", build.position))
        conn.execute(sql.SET_META, ("built", str(self.clock())))
        conn.execute(sql.DELETE_META, ("build_cursor",))

    def _touched(self, conn: sqlite3.Connection) -> list[str] | None:
        """The sessions written since the index last read the cursor (None: all)."""
        assert self._cursor is not None
        return self._cursor.changes(_meta(conn, "cursor"))[0]

    def _behind(self, conn: sqlite3.Connection) -> str | None:
        """Why the index may miss something the store holds, or None if it holds it all."""
        if _meta(conn, "built") is None:
            return "never built"
        files = self._files
        if files is None:
            if self._touched(conn) != []:
                return "behind the store (sessions changed since it was last updated)"
            return None
        if files.markers() or self._watch_needs_work(conn, None):
            return "behind the session files (sessions changed since it was last updated)"
        if files.shape(_meta(conn, "shape")).moved:
            return "behind the session files (date folders were moved in or out)"
        return None

    def _rebuild(self) -> int:
        conn = self._connection()
        with _db.immediate(conn):
            for statement in sql.CLEAR:
                conn.execute(statement)
            claimed = self._update(conn, full=True, now=self.clock())
        if self._files is not None:
            self._files.release(claimed)
        self._optimize(conn)
        return int(conn.execute(sql.COUNT_SESSIONS).fetchone()[0])

    def _optimize(self, conn: sqlite3.Connection) -> None:
        """Merge the FTS b-trees and truncate the WAL after a large update."""
        for table in sql.FTS_TABLES:
            conn.execute(sql.FTS_OPTIMIZE.format(table=table))
        conn.execute(sql.CHECKPOINT)

    def _watch_needs_work(self, conn: sqlite3.Connection, now: float | None) -> bool:
        """True if a watch ended (before ``now``) or a watched segment file changed."""
        rows = conn.execute(sql.WATCHED_SEGMENTS).fetchall()
        for folder, until, segment_id, ino, size in rows:
            if now is not None and until < now:
                return True
            if segment_id is None:
                continue
            st = self.source.stat_segment(folder, segment_id)
            if st is None or st.ino != ino or st.size != size:
                return True
        return False

    def _update(
        self,
        conn: sqlite3.Connection,
        *,
        full: bool,
        now: float,
        shape: ShapeChange | None = None,
    ) -> list[Path]:
        """Inside a write transaction: index what changed; return the markers claimed.

        A store with a change cursor names the sessions written since the position the index
        stored (all: a full walk). On files a refresh claims markers by renaming them (a writer
        marking meanwhile creates a fresh one) and *watches* each claimed session for
        ``WATCH_SECONDS`` (> 2 x ``MARK_EVERY``), ``stat``\\ing its segment files, so an append
        a writer did not mark is covered by the watch its last mark started. Trade-off: after a
        bulk import every imported session costs a ``stat`` per refresh for that long.
        """
        files, claimed, touched, position = self._files, [], None, ""
        if files is None:
            assert self._cursor is not None
            touched, position = self._cursor.changes(None if full else _meta(conn, "cursor"))
            full = touched is None
        else:
            claimed = files.claim()
        work = IndexUpdate(self, conn, defer_recent=full, recent_size=RECENT_SIZE)
        claimed_ids = {sid for sid, _ in claimed}
        if full:
            shape = files.shape(None) if files is not None else None
            seen: set[str | None] = set()
            for folder, segments in self.source.walk():
                seen.add(work.index_folder(folder, segments, hint=None))
            work.drop_unseen(seen)  # the rows of sessions the store no longer has
            conn.execute(sql.UNWATCH_ENDED, (now,))
        else:
            for sid in sorted(claimed_ids if touched is None else set(touched)):
                work.index_session(sid)
            for sid, until_before in conn.execute(sql.WATCHED).fetchall():  # files only
                if sid in claimed_ids:
                    continue
                work.index_session(sid, watched_only=True)
                if until_before < now:
                    conn.execute(sql.UNWATCH, (sid,))
            if shape is not None and shape.moved:
                self._moved(work, conn, shape)
        if shape is not None and shape.changed:
            conn.execute(sql.SET_META, ("shape", shape.text))
        if files is None:
            conn.execute(sql.SET_META, ("cursor", position))
        conn.executemany(sql.WATCH, [(now + WATCH_SECONDS, sid) for sid in claimed_ids])
        work.finish()
        if full:
            conn.execute(sql.SET_META, ("built", str(now)))
        return [path for _, path in claimed]

    def _moved(self, work: IndexUpdate, conn: sqlite3.Connection, shape: ShapeChange) -> None:
        """Index the sessions of date folders that appeared or vanished."""
        assert self._files is not None
        for folder, segments in self._files.walk(shape.added):
            work.index_folder(folder, segments, hint=None)
        gone = set(shape.removed)
        if gone:
            for sid, folder in conn.execute(sql.SESSION_FOLDERS).fetchall():
                if folder.rsplit("/", 1)[0] in gone:
                    work.index_session(sid)

    def warn_once(self, key: str, message: str, *args: object) -> None:
        """Log a warning once per key and process (a corrupt file is seen on every refresh)."""
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

    # ------------------------------------------------------------------ queries

    def search(self, query: SearchQuery) -> list[SearchHit]:
        """Ranked hits for ``query``, after bringing the index up to date."""
        q = check_query(query)
        terms = query_terms(q.text)
        return self._read(lambda conn: self._search(conn, q, terms))

    def _read(
        self,
        read: Callable[[sqlite3.Connection], _T],
        *,
        others: Others | None = None,
        budget: float | None = None,
    ) -> _T:
        """``read`` on one snapshot of the index, once it is up to date (and the rows of
        ``others`` in it)."""

        def run() -> _T:
            self._refresh(full=False, budget=budget)
            conn = self._connection()
            self._sync_others(conn, others)
            conn.execute(sql.BEGIN)
            try:
                return read(conn)
            finally:
                conn.execute(sql.COMMIT)

        return self._guarded(run, retry=True)

    def _search(
        self, conn: sqlite3.Connection, q: SearchQuery, terms: list[str]
    ) -> list[SearchHit]:
        """The words are bound as FTS5 strings (data, never syntax); filters match ``tags``."""
        tags = ""
        if q.context is not None:
            context = ContextId.parse(q.context)
            found = conn.execute(sql.SESSIONS_OF_CONTEXT, (context.type, context.name))
            ids = [row[0] for row in found]
            if not ids:
                return []
            tags += sql.tags_filter("s", ids)
        if q.type is not None:
            row = conn.execute(sql.TYPE_ID, (q.type,)).fetchone()
            if row is None:
                return []
            tags += sql.tags_filter("t", row)
        if q.role is not None:
            tags += sql.tags_filter("r", [q.role])
        phrases = [fts5_phrases([term]) for term in terms]
        match = body_match(phrases) + tags
        (rows,) = conn.execute(sql.LAST_DOC).fetchone()
        ranked = self._ranker.rank(conn, phrases, tags, q, rows)
        if not ranked:
            return []
        marks = ",".join("?" * len(ranked))
        ids = [rowid for rowid, _ in ranked]
        long = conn.execute(sql.LONG_BODIES.format(marks=marks), (*ids, LONG_BODY)).fetchall()
        snippets = {rowid: long_snippet(body, q.text) for rowid, body in long}
        short = [rowid for rowid in ids if rowid not in snippets]
        if short:
            statement = sql.SNIPPETS.format(marks=",".join("?" * len(short)))
            args = (HIGHLIGHT_OPEN, HIGHLIGHT_CLOSE, ELLIPSIS, SNIPPET_TOKENS, match, *short)
            snippets.update(conn.execute(statement, args).fetchall())
        meta = {row[0]: row[1:] for row in conn.execute(sql.HIT_ROWS.format(marks=marks), ids)}
        return assemble_hits(ranked, meta, snippets)

    def list_contexts_fast(self, type: str | None = None) -> list[ContextSummary]:
        """Every context's summary, optionally of one type, sorted by context id.

        Listing 100k contexts is one scan of a covering index (145 ms), not 100k file reads
        (14 s for the head records alone).
        """
        listing = (sql.LISTING, (self.root,))
        statement, params = listing if type is None else (sql.LISTING_OF_TYPE, (self.root, type))
        rows = self._read(lambda conn: conn.execute(statement, params).fetchall())
        return [ContextSummary(*row) for row in rows]

    # ------------------------------------------------------------------ the dashboard's reads

    def read(
        self,
        read: Callable[[Reader], _T],
        *,
        budget: float | None = None,
        others: list[ContextSummary] | None = None,
        sync: bool = True,
    ) -> _T:
        """The dashboard's ``read`` on one up-to-date snapshot, :attr:`others` included.

        ``budget``: seconds a first build may take first; past them ``Reader.left`` says how
        many sessions are still to be indexed (the next read goes on with the build).
        ``others``: the rows :attr:`others` gives, where the caller has them already.
        ``sync``: False for a ``read`` of the index's own sessions only (the forks of a
        context), for which the rows of others are not brought up to date.
        """

        def run(conn: sqlite3.Connection) -> _T:
            return read(Reader(conn, self._build.left if self._build is not None else 0, self.root))

        rows = None if not sync else self.others if others is None else others
        return self._read(run, others=rows, budget=budget)

    def _sync_others(self, conn: sqlite3.Connection, others: Others | None) -> None:
        """Replace the rows of the contexts ``others`` are (or gives) when they changed; a
        read-only index whose rows differ is IndexUnavailable (its caller walks the store)."""
        if others is None:
            return
        import hashlib  # here: ``terrarium list`` imports this module, and never needs it

        rows = sorted(map(_OTHER_COLUMNS, others() if callable(others) else others))
        digest = hashlib.sha256(repr(rows).encode()).hexdigest()
        stored = _meta(conn, "others")
        if stored == digest or (stored is None and not rows):  # None: never any row
            return
        if self.readonly:
            why = "and the archived contexts or legacy files beside it changed"
            raise IndexUnavailable(f"{self.path}: {self.readonly_reason}, {why}")
        with _db.immediate(conn):
            conn.execute(sql.DELETE_OTHERS)
            conn.executemany(sql.INSERT_OTHER, rows)
            conn.execute(sql.SET_META, ("others", digest))

    def offsets(self) -> dict[SegmentId, int]:
        """Per segment, the byte offset the index has read up to (for tests and ``check``)."""
        with self._lock:
            rows = self._connection().execute(sql.OFFSETS).fetchall()
        return {uuid.UUID(segment_id): offset for segment_id, offset in rows}

    def watched(self) -> list[SessionId]:
        """The sessions being watched for unmarked appends."""
        with self._lock:
            rows = self._connection().execute(sql.WATCHED).fetchall()
        return [uuid.UUID(row[0]) for row in rows]


def _meta(conn: sqlite3.Connection, key: str) -> str | None:
    """The value the index's ``meta`` table holds under ``key``, or None."""
    row = conn.execute(sql.META, (key,)).fetchone()
    return row[0] if row is not None else None
