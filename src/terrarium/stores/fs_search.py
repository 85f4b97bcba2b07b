"""Full-text search and fast listing for ``FsStore``: a derived SQLite FTS5 index.

The index lives beside the sessions in ``.index/search.db`` (WAL, ``0600`` like its ``-wal``
and ``-shm``, whatever the umask). It is derived data, never needed for correctness: delete it
and the next search rebuilds it from the segment files; ``FsStore.reindex()`` (``terrarium
reindex``) rebuilds it in place.

**What is indexed.** Every history item of every segment of every session: ``user_input``,
``item`` and ``system_item`` entries, and the history a header carries (a compaction's
summary, an import; those items get the header's seq, 0). Each is one row of ``docs``
(session, segment, seq, role, ts, text) and, when its text is not empty, one row of the FTS5
table ``fts`` (``unicode61 remove_diacritics 2``: case and accents folded). Old segments stay
indexed after a clear or compaction, as they stay in the session tree. A full build indexes
about 32,000 messages a second here; 1M messages take 385 MB.

**Incremental updates.** Per segment file the index records its inode and the byte offset it
has read up to (always the end of a complete line). A refresh reads only the bytes appended
since, under a shared ``flock`` so it never sees a write in progress, and stops at the last
newline: a torn tail is indexed once it is complete. A shrunk or replaced file is re-read.

**Finding what changed without walking 100k folders.** A walk that ``scandir``\\s every session
folder and ``stat``\\s its files costs 3.5 s at 100k sessions with a warm cache (11 s cold;
``benchmarks/bench_search.py``): far too much per search. Instead writers leave *dirty
markers*: an empty file ``.index/dirty/{session id}``. Creating a context or segment, moving a
head and deleting a context always mark the session; an append marks it at most once per
``MARK_EVERY`` seconds per open segment (a ``stat``, and an ``open`` when the marker is
missing), so the append path stays a lock, an ``fstat`` and a ``write``. A refresh claims
markers by renaming them (atomic: a writer marking at the same time creates a fresh one) and
*watches* each claimed session for ``WATCH_SECONDS`` (> 2 x ``MARK_EVERY``): every refresh in
that window ``stat``\\s the session's segment files, and the first refresh after it reads the
session one last time. An append that a writer did not mark is therefore covered by the watch
that its last mark started, and the next append after the watch ends marks again. An idle
refresh costs a ``scandir`` of an empty folder and one indexed query (~10 µs); each watched
session adds a ``stat`` per segment; a marked session with one new message costs ~0.5 ms.
Writes that bypass ``FsStore`` (a restored backup, a hand edit) are found by
``refresh(full=True)`` or ``reindex()``, as is the write of a process killed between its
write and its mark (the mark follows the write, so a mark never precedes data it announces).
Trade-off: right after a bulk import every imported session is watched for ``WATCH_SECONDS``,
so refreshes cost a ``stat`` per session for that long.

**Queries, ranking and snippets** are :mod:`terrarium.stores.fts`'s, shared with
``SqliteStore``: the user's words are quoted as FTS5 strings and bound as a parameter (data,
never syntax); CJK characters are indexed one per token; bm25 over the text column, the
filters (type, context, role) as tokens of a second column, ``tags`` (``s<session> r<role>
t<type>``); a query with more than ``RANK_WINDOW`` matches is ranked among its most recent
matches in ``fts_recent``, a second FTS5 table over the last ``RECENT_SIZE`` to twice as many
items (rebuilt past that). Rows are numbered in indexing order, which is arrival order (a full
build indexes the least recently written sessions first).

**Listing.** ``sessions`` holds one row per session with its context, date, head, message
count and last activity, kept current by the same refreshes, so listing 100k contexts is one
scan of a covering index (145 ms) instead of 100k file reads (14 s for the head records
alone). A session folder whose ``head.json`` is missing or unreadable is indexed with the head
:func:`terrarium.stores.fs.head_from_segments` rebuilds, as FsStore reads it. What cannot be
read is recorded, not skipped: a segment with a line that is not an entry, a torn or
unparsable header or no bytes at all, a ``head.json`` that is unreadable or names a missing
segment. The session's first problem (one line naming the file) is its summary's
``problem``; its counts cover what could be read.

**Concurrency.** Searches read a WAL snapshot and never wait. Updates run in a ``BEGIN
IMMEDIATE`` transaction, so one process at a time indexes; the others wait for it (up to
``BUSY_TIMEOUT`` seconds) and then find little left to do. A database that is missing or
replaced is reopened (and built), one of another schema version rebuilt.

**Failures.** Only an index that SQLite reports corrupt (``SQLITE_CORRUPT``,
``SQLITE_NOTADB``) is deleted, with its ``-wal`` and ``-shm``, and rebuilt from the files. A
lock held by another process past ``BUSY_TIMEOUT``, a full disk (``SQLITE_FULL``, or an I/O
error on a file system with no space left) and a read-only file, folder or mount never are:
they raise :class:`~terrarium.errors.IndexUnavailable`, naming the cause, and the callers
answer from the log (:func:`terrarium.search.search` scans it,
``MultiContextManager.list_all_contexts`` restores each context). An index that cannot be
opened for writing (read-only, or a full disk) is opened read-only and still serves while it
is current: built, no dirty marker waiting, no watched segment file changed.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from terrarium import codec
from terrarium.errors import CorruptLog, IndexUnavailable, StoreError
from terrarium.model import HISTORY_KINDS, ROLES, ContextId, SegmentId, SessionId, item_text
from terrarium.stores import _db
from terrarium.stores._files import make_dirs, open_private
from terrarium.stores.base import ContextSummary, SearchHit, SearchQuery
from terrarium.stores.fts import (
    Fts5Tables,
    Ranker,
    assemble_hits,
    body_match,
    check_query,
    fts5_phrases,
)
from terrarium.text import (
    ELLIPSIS,
    HIGHLIGHT_CLOSE,
    HIGHLIGHT_OPEN,
    SNIPPET_TOKENS,
    prepare_text,
    query_terms,
)

log = logging.getLogger(__name__)

#: Bump when the schema changes: an index of another version is dropped and rebuilt.
SCHEMA_VERSION = 4
#: An append marks its session at most this often per open segment (seconds).
MARK_EVERY = 5.0
#: How long a claimed session stays watched (seconds). Must exceed 2 x ``MARK_EVERY``.
WATCH_SECONDS = 15.0
#: How many of the most recent items ``fts_recent`` holds (it is rebuilt at twice that).
RECENT_SIZE = 50_000
#: Seconds an update waits for another process's update before searching what is there.
BUSY_TIMEOUT = 30.0
#: Merge the FTS b-trees after a refresh that indexed at least this many items.
_OPTIMIZE_AFTER = 20_000

DB_NAME = "search.db"
_INDEX = ".index"
_DIRTY = "dirty"
_CLAIMED = ".claimed-"
_HEAD = "head.json"
_SEGMENT_SUFFIX = ".jsonl"
_TRACE_SUFFIX = ".trace.jsonl"
_T = TypeVar("_T")
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


# --------------------------------------------------------------------------- markers


def dirty_dir(root: Path) -> Path:
    """Where writers leave dirty markers."""
    return root / _INDEX / _DIRTY


def mark_dirty(root: Path, session_id: SessionId) -> None:
    """Tell the search index that ``session_id`` changed (see the module docstring)."""
    path = dirty_dir(root) / str(session_id)
    try:
        os.stat(path)
        return
    except FileNotFoundError:
        pass
    try:
        fd = open_private(path, os.O_WRONLY | os.O_CREAT)
    except FileNotFoundError:
        make_dirs(path.parent)
        fd = open_private(path, os.O_WRONLY | os.O_CREAT)
    os.close(fd)


# --------------------------------------------------------------------------- records


@dataclass
class IndexStats:
    """Counters of the work refreshes did, for tests and benchmarks."""

    refreshes: int = 0
    """Refreshes that found something to do."""
    sessions: int = 0
    """Sessions examined."""
    segments_read: int = 0
    """Segment files read (only their new bytes)."""
    bytes_read: int = 0
    items: int = 0
    """History items indexed."""


@dataclass
class _Segment:
    """A segment row, as the refresh works on it."""

    id: int
    session: int
    segment_id: str
    ino: int
    size_seen: int
    offset: int
    next_seq: int
    items: int
    continues: bool
    parent: str | None
    at_seq: int | None
    last_ts: str | None
    problem: str | None = None
    """Why the segment cannot be read (one line, naming its file), or None."""


@dataclass
class _Session:
    """A session row, as the refresh works on it."""

    id: int
    session_id: str
    folder: str
    tid: int
    values: tuple[Any, ...] = ()
    """The head-derived columns as stored (see ``_Work.index_folder``)."""
    segments: dict[str, _Segment] = field(default_factory=dict)

    @property
    def head_problem(self) -> str | None:
        """Why its ``head.json`` could not be read (the head was rebuilt), or None."""
        return self.values[-1] if self.values else None


_HEAD_COLUMNS = "context, type, name, tid, date, folder, head, created_at, updated_at, head_problem"
# A ContextSummary's fields, in order.
_SQL_LISTING = (
    "SELECT context, date, message_count, last_active, created_at, updated_at, session_id, "
    "head, problem FROM sessions"
)

_SCHEMA = [
    """CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)""",
    """CREATE TABLE types(id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE)""",
    """CREATE TABLE sessions(
        id INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL UNIQUE,
        context TEXT NOT NULL,
        type TEXT NOT NULL,
        name TEXT NOT NULL,
        tid INTEGER NOT NULL,
        date TEXT NOT NULL,
        folder TEXT NOT NULL,
        head TEXT NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        message_count INTEGER NOT NULL DEFAULT 0,
        last_active TEXT NOT NULL,
        watch_until REAL,
        head_problem TEXT,
        problem TEXT)""",
    # Covers the listing query: 100k rows are read in index order without a table lookup each.
    """CREATE INDEX sessions_by_context ON sessions(type, name, context, date, message_count,
        last_active, created_at, updated_at, session_id, head, problem)""",
    """CREATE INDEX sessions_watched ON sessions(watch_until) WHERE watch_until IS NOT NULL""",
    """CREATE TABLE segments(
        id INTEGER PRIMARY KEY,
        session INTEGER NOT NULL,
        segment_id TEXT NOT NULL UNIQUE,
        ino INTEGER NOT NULL,
        size_seen INTEGER NOT NULL,
        offset INTEGER NOT NULL,
        next_seq INTEGER NOT NULL,
        items INTEGER NOT NULL,
        continues INTEGER NOT NULL,
        parent TEXT,
        at_seq INTEGER,
        last_ts TEXT,
        problem TEXT)""",
    """CREATE INDEX segments_by_session ON segments(session)""",
    # Every history item, with its text as indexed (see prepare_text). ``tags`` is what the
    # filters match: s<session row> r<role> t<type row>, one token each.
    """CREATE TABLE docs(
        id INTEGER PRIMARY KEY,
        segment INTEGER NOT NULL,
        session INTEGER NOT NULL,
        tid INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        role TEXT NOT NULL,
        ts TEXT NOT NULL,
        body TEXT NOT NULL,
        tags TEXT GENERATED ALWAYS AS ('s' || session || ' r' || role || ' t' || tid) VIRTUAL)""",
    """CREATE INDEX docs_by_segment ON docs(segment, seq)""",
    # Each FTS5 table's content is a view of exactly the rows it indexes, so that FTS5's
    # 'rebuild' and 'integrity-check' mean what they say.
    """CREATE TABLE recent(floor INTEGER NOT NULL)""",
    """INSERT INTO recent VALUES (1)""",
    """CREATE VIEW texts AS SELECT id, body, tags FROM docs WHERE body != ''""",
    """CREATE VIEW recent_texts AS SELECT id, body, tags FROM docs
        WHERE body != '' AND id >= (SELECT floor FROM recent)""",
    """CREATE VIRTUAL TABLE fts USING fts5(body, tags, content='texts', content_rowid='id',
        tokenize='unicode61 remove_diacritics 2')""",
    """CREATE VIRTUAL TABLE fts_recent USING fts5(body, tags, content='recent_texts',
        content_rowid='id', tokenize='unicode61 remove_diacritics 2')""",
]


# --------------------------------------------------------------------------- the index


class SearchIndex:
    """The derived search and listing index of one ``FsStore`` root (module docstring)."""

    def __init__(self, root: str | os.PathLike[str], *, clock: Callable[[], float] = time.time):
        """Open the index of the sessions under ``root`` (it is created on first use).

        Args:
            root: the ``FsStore`` root.
            clock: wall-clock seconds, for the watch window (tests pass a fake).
        """
        self.root = Path(root).absolute()
        self.path = self.root / _INDEX / DB_NAME
        self.clock = clock
        self.stats = IndexStats()
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._ino: int | None = None
        self.readonly = False
        """Whether the index was opened read-only (it then serves only while current)."""
        self.readonly_reason: str | None = None
        """Why it was opened read-only (``read-only``, or a full disk), for messages."""
        self._warned: set[str] = set()
        self._ranker = Ranker(Fts5Tables(recent="fts_recent", docs="docs"))

    def __repr__(self) -> str:
        return f"SearchIndex({str(self.root)!r})"

    # ------------------------------------------------------------------ connection

    def _connection(self) -> sqlite3.Connection:
        """The open connection; reopened if the file was deleted or replaced.

        Raises:
            IndexUnavailable: the index cannot be opened (see "Failures" in the module
                docstring); a corrupt one is deleted and rebuilt first.
        """
        if self._conn is not None:
            try:
                ino = os.stat(self.path).st_ino
            except FileNotFoundError:
                ino = None
            if ino == self._ino:
                return self._conn
            log.info("%s was deleted or replaced: reopening it", self.path)
            self._close_connection()
        self.readonly_reason = None if _db.writable(self.path) else "read-only"
        try:
            conn = self._open(readonly=self.readonly_reason is not None)
        except (sqlite3.Error, OSError) as exc:
            conn = self._reopen(exc)
        self._conn = conn
        self._ino = os.stat(self.path).st_ino
        return conn

    def _reopen(self, exc: BaseException) -> sqlite3.Connection:
        """After the open failed with ``exc``: rebuild a corrupt index; open a full disk's
        read-only (it serves while it is current); else raise IndexUnavailable."""
        found = _db.kind(exc, self.path)
        if self.readonly_reason is not None or found not in ("corrupt", "full", "readonly"):
            raise self._unavailable(exc) from exc
        if found == "corrupt":
            log.warning("%s is corrupt (%s): rebuilding it from the files", self.path, exc)
            self._delete_files()
        else:
            self.readonly_reason = _db.describe(exc, self.path)
        try:
            return self._open(readonly=self.readonly_reason is not None)
        except (sqlite3.Error, OSError) as again:
            raise self._unavailable(again) from again

    def _open(self, *, readonly: bool) -> sqlite3.Connection:
        """Open the index, creating it (``0600``) and its schema if it is writable."""
        if not readonly:
            _db.create_private(self.path)
        conn = _db.connect(self.path, timeout=BUSY_TIMEOUT, readonly=readonly)
        try:
            if not readonly:
                _db.enable_wal(conn, BUSY_TIMEOUT)
                conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA temp_store=MEMORY")
            conn.execute("PRAGMA cache_size=-32000")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version != SCHEMA_VERSION:
                if readonly:
                    raise IndexUnavailable(
                        f"{self.path}: {self.readonly_reason or 'read-only'}, and of schema "
                        f"version {version}, not {SCHEMA_VERSION}"
                    )
                self._create_schema(conn, version)
            conn.execute("SELECT count(*) FROM meta").fetchone()
        except BaseException:
            conn.close()
            raise
        self.readonly = readonly
        return conn

    def _unavailable(self, exc: BaseException) -> IndexUnavailable:
        """The error that says why the index cannot serve now (``exc`` in one line)."""
        if isinstance(exc, IndexUnavailable):
            return exc
        return IndexUnavailable(f"{self.path}: {_db.describe(exc, self.path)}")

    def _create_schema(self, conn: sqlite3.Connection, version: int) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
                conn.execute("COMMIT")  # another process created it meanwhile
                return
            if version:
                log.info("search index schema %s is not %s: rebuilding", version, SCHEMA_VERSION)
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'view'"
            ).fetchall():
                conn.execute(f'DROP VIEW IF EXISTS "{name}"')
            # Virtual tables first: dropping one drops its shadow tables.
            for virtual in (True, False):
                for (name,) in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' "
                    "AND name NOT LIKE 'sqlite%' AND (sql LIKE 'CREATE VIRTUAL%') = ?",
                    (virtual,),
                ).fetchall():
                    conn.execute(f'DROP TABLE IF EXISTS "{name}"')
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _delete_files(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.path}{suffix}")

    def _close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
            self._ino = None

    def close(self) -> None:
        """Close the database connection (the index can be reopened by using it again)."""
        with self._lock:
            self._close_connection()

    def __enter__(self) -> SearchIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ refresh

    def refresh(self, *, full: bool = False) -> bool:
        """Bring the index up to date with the files; return True if it looked at any.

        Args:
            full: also walk every session folder (finds writes that bypassed ``FsStore``).

        Raises:
            IndexUnavailable: it cannot be brought up to date (see "Failures").
        """
        with self._lock:
            return self._guarded(lambda: self._refresh(full=full))

    def rebuild(self) -> int:
        """Drop everything and index every session afresh; return the sessions indexed.

        Raises:
            IndexUnavailable: the index cannot be written (see "Failures").
        """
        with self._lock:
            return self._guarded(self._rebuild)

    def _guarded(self, run: Callable[[], _T], *, retry: bool = False) -> _T:
        """``run()``, with a failing database turned into :class:`IndexUnavailable`.

        Only a corrupt index is deleted (never a busy, full or read-only one); with ``retry``
        ``run`` is called once more, which rebuilds it from the files.
        """
        for attempt in (1, 2):
            try:
                return run()
            except (sqlite3.Error, OSError) as exc:
                if _db.kind(exc) != "corrupt" or self.readonly:
                    raise self._unavailable(exc) from exc
                log.warning("%s is corrupt (%s): rebuilding it from the files", self.path, exc)
                self._close_connection()
                self._delete_files()
                if not retry or attempt == 2:
                    raise self._unavailable(exc) from exc
        raise AssertionError("unreachable")

    def _refresh(self, *, full: bool) -> bool:
        conn = self._connection()
        if self.readonly:
            behind = self._behind(conn)
            if behind is not None:
                raise IndexUnavailable(f"{self.path}: {self.readonly_reason}, and {behind}")
            return False
        built = conn.execute("SELECT 1 FROM meta WHERE key = 'built'").fetchone()
        full = full or built is None
        markers = _listdir(dirty_dir(self.root))
        now = self.clock()
        if not (full or markers or self._watch_needs_work(conn, now)):
            return False
        items = self.stats.items
        claimed = _transaction(conn, lambda: self._update(conn, full=full, now=now))
        for path in claimed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if self.stats.items - items >= _OPTIMIZE_AFTER:
            self._optimize(conn)
        return True

    def _behind(self, conn: sqlite3.Connection) -> str | None:
        """Why the index may miss something the files hold, or None if it holds it all."""
        if conn.execute("SELECT 1 FROM meta WHERE key = 'built'").fetchone() is None:
            return "never built"
        if _listdir(dirty_dir(self.root)) or self._watch_needs_work(conn, None):
            return "behind the session files (sessions changed since it was last updated)"
        return None

    def _rebuild(self) -> int:
        conn = self._connection()

        def rebuild() -> list[Path]:
            for table in ("fts", "fts_recent"):
                conn.execute(f"INSERT INTO {table}({table}) VALUES('delete-all')")
            for table in ("docs", "segments", "sessions", "types", "meta"):
                conn.execute(f"DELETE FROM {table}")
            conn.execute("UPDATE recent SET floor = 1")
            return self._update(conn, full=True, now=self.clock())

        for path in _transaction(conn, rebuild):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self._optimize(conn)
        return int(conn.execute("SELECT count(*) FROM sessions").fetchone()[0])

    def _optimize(self, conn: sqlite3.Connection) -> None:
        """Merge the FTS b-trees and truncate the WAL after a large update."""
        for table in ("fts", "fts_recent"):
            conn.execute(f"INSERT INTO {table}({table}) VALUES('optimize')")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _watch_needs_work(self, conn: sqlite3.Connection, now: float | None) -> bool:
        """True if a watched session's watch ended (unless ``now`` is None) or one of its
        segment files changed."""
        rows = conn.execute(
            "SELECT s.folder, s.watch_until, g.segment_id, g.ino, g.size_seen "
            "FROM sessions s LEFT JOIN segments g ON g.session = s.id "
            "WHERE s.watch_until IS NOT NULL"
        ).fetchall()
        for folder, until, segment_id, ino, size in rows:
            if now is not None and until < now:
                return True
            if segment_id is None:
                continue
            try:
                st = os.stat(self.root / folder / f"{segment_id}{_SEGMENT_SUFFIX}")
            except FileNotFoundError:
                return True
            if st.st_ino != ino or st.st_size != size:
                return True
        return False

    def _update(self, conn: sqlite3.Connection, *, full: bool, now: float) -> list[Path]:
        """Inside a write transaction: claim markers, index what changed; return the claims."""
        self.stats.refreshes += 1
        work = _Work(self, conn, defer_recent=full)
        claimed = self._claim_markers()
        claimed_ids = {sid for sid, _ in claimed}
        until = now + WATCH_SECONDS
        if full:
            seen: set[str] = set()
            for folder, entries in self._walk():
                sid = work.index_folder(folder, entries, hint=None)
                if sid is not None:
                    seen.add(sid)
            for (sid,) in conn.execute("SELECT session_id FROM sessions").fetchall():
                if sid not in seen:
                    work.drop_session(sid)
            conn.execute("UPDATE sessions SET watch_until = NULL WHERE watch_until < ?", (now,))
        else:
            for sid in sorted(claimed_ids):
                work.index_session(sid)
            for sid, until_before in conn.execute(
                "SELECT session_id, watch_until FROM sessions WHERE watch_until IS NOT NULL"
            ).fetchall():
                if sid in claimed_ids:
                    continue
                work.index_session(sid, watched_only=True)
                if until_before < now:
                    conn.execute(
                        "UPDATE sessions SET watch_until = NULL WHERE session_id = ?", (sid,)
                    )
        conn.executemany(
            "UPDATE sessions SET watch_until = ? WHERE session_id = ?",
            [(until, sid) for sid in claimed_ids],
        )
        work.finish()
        if full:
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('built', ?)", (str(now),))
        return [path for _, path in claimed]

    def _claim_markers(self) -> list[tuple[str, Path]]:
        """Rename every marker to a claimed name; return (session id, claimed path) pairs."""
        folder = dirty_dir(self.root)
        out = []
        for name in _listdir(folder):
            sid, _, claim = name.partition(_CLAIMED)
            path = folder / name
            if not _is_uuid(sid):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                continue
            if not claim:  # a crashed or just-finished refresh may have left claimed ones
                claimed = folder / f"{sid}{_CLAIMED}{uuid.uuid4().hex}"
                try:
                    os.rename(path, claimed)
                except FileNotFoundError:
                    continue
                path = claimed
            out.append((str(uuid.UUID(sid)), path))
        return out

    def _walk(self) -> Iterator[tuple[str, list[os.DirEntry[str]]]]:
        """Every session folder (relative path) with its entries, least recently written first."""
        found: list[tuple[float, str, list[os.DirEntry[str]]]] = []
        for kind in _scandir(self.root):
            if kind.name.startswith(".") or not kind.is_dir(follow_symlinks=False):
                continue
            for date in _scandir(kind.path):
                if not date.is_dir(follow_symlinks=False):
                    continue
                for session in _scandir(date.path):
                    if not session.is_dir(follow_symlinks=False):
                        continue
                    entries = _scandir(session.path)
                    newest = 0.0
                    found_any = False  # a head, or segments to rebuild it from
                    for entry in entries:
                        if entry.name == _HEAD:
                            found_any = True
                        elif _segment_name(entry.name) is not None:
                            found_any = True
                            with contextlib.suppress(FileNotFoundError):
                                newest = max(newest, entry.stat().st_mtime)
                    if found_any:
                        rel = f"{kind.name}/{date.name}/{session.name}"
                        found.append((newest, rel, entries))
        found.sort(key=lambda item: (item[0], item[1]))
        for _, rel, entries in found:
            yield rel, entries

    def warn_once(self, key: str, message: str, *args: object) -> None:
        """Log a warning once per key and process (a corrupt file is seen on every refresh)."""
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

    # ------------------------------------------------------------------ queries

    def search(self, query: SearchQuery) -> list[SearchHit]:
        """Ranked hits for ``query``, after bringing the index up to date.

        Raises:
            InvalidQuery: nothing to search for, or an invalid filter.
            InvalidContextId: ``query.context`` is not ``type:name``.
            IndexUnavailable: the index cannot be brought up to date (see "Failures").
        """
        q = check_query(query)
        terms = query_terms(q.text)
        with self._lock:
            return self._guarded(
                lambda: self._read(lambda conn: self._search(conn, q, terms)), retry=True
            )

    def _read(self, read: Callable[[sqlite3.Connection], _T]) -> _T:
        """``read`` on one snapshot of the index, once it is up to date."""
        self._refresh(full=False)
        conn = self._connection()
        conn.execute("BEGIN")
        try:
            return read(conn)
        finally:
            conn.execute("COMMIT")

    def _search(
        self, conn: sqlite3.Connection, q: SearchQuery, terms: list[str]
    ) -> list[SearchHit]:
        tags = ""
        if q.context is not None:
            context = ContextId.parse(q.context)
            ids = [
                row[0]
                for row in conn.execute(
                    "SELECT id FROM sessions WHERE type = ? AND name = ?",
                    (context.type, context.name),
                )
            ]
            if not ids:
                return []
            tags += " AND tags : (" + " OR ".join(f'"s{i}"' for i in ids) + ")"
        if q.type is not None:
            row = conn.execute("SELECT id FROM types WHERE name = ?", (q.type,)).fetchone()
            if row is None:
                return []
            tags += f' AND tags : "t{row[0]}"'
        if q.role is not None:
            tags += f' AND tags : "r{q.role}"'
        phrases = [fts5_phrases([term]) for term in terms]
        match = body_match(phrases) + tags
        (rows,) = conn.execute("SELECT coalesce(max(id), 0) FROM docs").fetchone()
        ranked = self._ranker.rank(conn, "fts", phrases, tags, q, rows)
        if not ranked:
            return []
        marks = ",".join("?" * len(ranked))
        ids = [rowid for rowid, _ in ranked]
        snippets = dict(
            conn.execute(
                f"SELECT rowid, snippet(fts, 0, ?, ?, ?, ?) FROM fts "
                f"WHERE fts MATCH ? AND rowid IN ({marks})",
                (HIGHLIGHT_OPEN, HIGHLIGHT_CLOSE, ELLIPSIS, SNIPPET_TOKENS, match, *ids),
            ).fetchall()
        )
        meta = {
            row[0]: row[1:]
            for row in conn.execute(
                "SELECT d.id, s.context, s.date, s.session_id, g.segment_id, d.seq, d.role, d.ts "
                "FROM docs d JOIN segments g ON g.id = d.segment "
                "JOIN sessions s ON s.id = d.session "
                f"WHERE d.id IN ({marks})",
                ids,
            )
        }
        return assemble_hits(ranked, meta, snippets)

    def list_contexts(self, type: str | None = None) -> list[ContextSummary]:
        """Every context's summary, optionally of one type, sorted by context id.

        Raises:
            IndexUnavailable: the index cannot be brought up to date (see "Failures").
        """

        def read(conn: sqlite3.Connection) -> list[ContextSummary]:
            if type is None:
                rows = conn.execute(f"{_SQL_LISTING} ORDER BY type, name")
            else:
                rows = conn.execute(f"{_SQL_LISTING} WHERE type = ? ORDER BY name", (type,))
            return [ContextSummary(*row) for row in rows]

        with self._lock:
            return self._guarded(lambda: self._read(read), retry=True)

    def offsets(self) -> dict[SegmentId, int]:
        """Per segment, the byte offset the index has read up to (for tests and ``check``)."""
        with self._lock:
            conn = self._connection()
            rows = conn.execute("SELECT segment_id, offset FROM segments").fetchall()
        return {uuid.UUID(segment_id): offset for segment_id, offset in rows}

    def watched(self) -> list[SessionId]:
        """The sessions being watched for unmarked appends."""
        with self._lock:
            conn = self._connection()
            rows = conn.execute(
                "SELECT session_id FROM sessions WHERE watch_until IS NOT NULL"
            ).fetchall()
        return [uuid.UUID(row[0]) for row in rows]


# --------------------------------------------------------------------------- one update


class _Work:
    """The changes of one refresh, applied in the caller's transaction."""

    def __init__(self, index: SearchIndex, conn: sqlite3.Connection, *, defer_recent: bool) -> None:
        self.index = index
        # A full pass rebuilds fts_recent at the end instead of feeding it item by item.
        self.defer_recent = defer_recent
        self.root = index.root
        self.conn = conn
        self.stats = index.stats
        self.types: dict[str, int] = {
            name: tid for tid, name in conn.execute("SELECT id, name FROM types")
        }
        self.recent_floor = int(conn.execute("SELECT floor FROM recent").fetchone()[0])
        # New items always land in fts_recent's range, even after the newest were deleted.
        (last,) = conn.execute("SELECT coalesce(max(id), 0) FROM docs").fetchone()
        self.next_doc = max(int(last) + 1, self.recent_floor)
        self.pending: list[tuple[int, int, int, int, int, str, str, str]] = []
        self.changed: dict[int, _Session] = {}
        self.recent_stale = False
        # A full pass looks at every session: load them all at once, not two queries each.
        self.cache: dict[str, _Session] | None = self._load_all() if defer_recent else None
        row = conn.execute("SELECT value FROM meta WHERE key = 'recent_count'").fetchone()
        self.recent_count = int(row[0]) if row else 0

    # ---------------------------------------------------------------- sessions

    def _load_all(self) -> dict[str, _Session]:
        sessions: dict[str, _Session] = {}
        by_id: dict[int, _Session] = {}
        for row in self.conn.execute(f"SELECT id, {_HEAD_COLUMNS}, session_id FROM sessions"):
            session = _Session(row[0], row[11], row[6], row[4], tuple(row[1:11]))
            sessions[session.session_id] = by_id[session.id] = session
        for seg in self.conn.execute(
            "SELECT id, session, segment_id, ino, size_seen, offset, next_seq, items, continues, "
            "parent, at_seq, last_ts, problem FROM segments"
        ):
            segment = _Segment(*seg)
            segment.continues = bool(segment.continues)
            if segment.session in by_id:
                by_id[segment.session].segments[segment.segment_id] = segment
        return sessions

    def _load(self, sid: str) -> _Session | None:
        if self.cache is not None:
            return self.cache.get(sid)
        row = self.conn.execute(
            f"SELECT id, {_HEAD_COLUMNS} FROM sessions WHERE session_id = ?", (sid,)
        ).fetchone()
        if row is None:
            return None
        session = _Session(row[0], sid, row[6], row[4], tuple(row[1:]))
        for seg in self.conn.execute(
            "SELECT id, session, segment_id, ino, size_seen, offset, next_seq, items, continues, "
            "parent, at_seq, last_ts, problem FROM segments WHERE session = ?",
            (row[0],),
        ):
            segment = _Segment(*seg)
            segment.continues = bool(segment.continues)
            session.segments[segment.segment_id] = segment
        return session

    def index_session(self, sid: str, *, watched_only: bool = False) -> None:
        """Bring one session up to date (after a marker, or while it is watched)."""
        session = self._load(sid)
        folder = session.folder if session is not None else self._pointer(sid)
        if folder is None:
            return  # deleted before it was ever indexed
        if watched_only and session is not None:
            self._index_known_segments(session, folder)
            return
        entries = _scandir(self.root / folder)
        self.index_folder(folder, entries, hint=sid)

    def _pointer(self, sid: str) -> str | None:
        """The session's folder per FsStore's ``.index/sessions`` pointer."""
        try:
            raw = codec.decode((self.root / _INDEX / "sessions" / sid).read_bytes())
            return str(raw["path"])
        except (FileNotFoundError, NotADirectoryError):
            return None
        except Exception:  # a damaged pointer: reindex rebuilds it
            return None

    def index_folder(
        self, folder: str, entries: list[os.DirEntry[str]], *, hint: str | None
    ) -> str | None:
        """Index the session whose folder is ``folder``; return its session id, or None."""
        self.stats.sessions += 1
        head, problem = _folder_head(self.root / folder)
        if hint is not None and (head is None or head["session_id"] != hint):
            self.drop_session(hint)  # deleted (its folder is gone or holds a newer session)
        if head is None:
            if problem is not None:
                self.index.warn_once(folder, "search index: skipping %s", problem)
            return None
        if problem is not None:
            log.info("search index: %s", problem)  # ``list`` reports it (ContextSummary)
        sid = head["session_id"]
        try:
            context = ContextId.parse(head["context"])
        except ValueError:
            self.index.warn_once(folder, "search index: skipping %s: bad context in head", folder)
            return None
        session = self._load(sid)
        tid = self._type_id(context.type)
        values = (
            str(context),
            context.type,
            context.name,
            tid,
            head["created_at"][:10],
            folder,
            head["segment_id"],
            head["created_at"],
            head["updated_at"],
            problem,
        )
        changed = session is None or session.values != values
        if session is None:
            cur = self.conn.execute(
                f"INSERT INTO sessions({_HEAD_COLUMNS}, last_active, session_id) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (*values, head["updated_at"], sid),
            )
            session = _Session(int(cur.lastrowid or 0), sid, folder, tid, values)
            if self.cache is not None:
                self.cache[sid] = session
            # Another session row claiming the same context is stale: check it.
            for (other,) in self.conn.execute(
                "SELECT session_id FROM sessions WHERE type = ? AND name = ? AND id != ?",
                (context.type, context.name, session.id),
            ).fetchall():
                self._check_stale(other)
        elif changed:
            self.conn.execute(
                "UPDATE sessions SET context=?, type=?, name=?, tid=?, date=?, folder=?, head=?, "
                "created_at=?, updated_at=?, head_problem=? WHERE id = ?",
                (*values, session.id),
            )
            session.values = values
        on_disk: dict[str, os.DirEntry[str]] = {}
        for entry in entries:
            segment_id = _segment_name(entry.name)
            if segment_id is not None:
                on_disk[segment_id] = entry
        for segment_id in list(session.segments):
            if segment_id not in on_disk:
                self._drop_segment(session.segments.pop(segment_id))
                changed = True
        for segment_id, entry in sorted(on_disk.items()):
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            changed = self._index_segment(session, folder, segment_id, st) or changed
        if changed:
            self.changed[session.id] = session
        return str(sid)

    def _index_known_segments(self, session: _Session, folder: str) -> None:
        for segment in list(session.segments.values()):
            try:
                st = os.stat(self.root / folder / f"{segment.segment_id}{_SEGMENT_SUFFIX}")
            except FileNotFoundError:
                self.index_folder(folder, _scandir(self.root / folder), hint=session.session_id)
                return
            if self._index_segment(session, folder, segment.segment_id, st):
                self.changed[session.id] = session

    def _check_stale(self, sid: str) -> None:
        row = self.conn.execute(
            "SELECT folder FROM sessions WHERE session_id = ?", (sid,)
        ).fetchone()
        head = _folder_head(self.root / row[0])[0] if row is not None else None
        if head is None or head["session_id"] != sid:
            self.drop_session(sid)

    def drop_session(self, sid: str) -> None:
        """Remove a session that no longer exists, with its segments and items."""
        session = self._load(sid)
        if session is None:
            return
        for segment in session.segments.values():
            self._drop_segment(segment)
        self.conn.execute("DELETE FROM sessions WHERE id = ?", (session.id,))
        self.changed.pop(session.id, None)
        if self.cache is not None:
            self.cache.pop(sid, None)

    def _type_id(self, name: str) -> int:
        tid = self.types.get(name)
        if tid is None:
            cur = self.conn.execute("INSERT INTO types(name) VALUES (?)", (name,))
            tid = self.types[name] = int(cur.lastrowid or 0)
        return tid

    # ---------------------------------------------------------------- segments

    def _drop_segment(self, segment: _Segment) -> None:
        self.flush()
        self._delete_docs("segment = ?", (segment.id,))
        self.conn.execute("DELETE FROM segments WHERE id = ?", (segment.id,))

    def _delete_docs(self, where: str, args: tuple[object, ...]) -> None:
        """Remove items from both FTS tables (external content needs the old values), then docs."""
        self.conn.execute(
            "INSERT INTO fts(fts, rowid, body, tags) SELECT 'delete', id, body, tags FROM docs "
            f"WHERE {where} AND body != ''",
            args,
        )
        self.recent_stale = True
        if not self.defer_recent:
            recent = f"{where} AND body != '' AND id >= ?"
            (count,) = self.conn.execute(
                f"SELECT count(*) FROM docs WHERE {recent}", (*args, self.recent_floor)
            ).fetchone()
            self.conn.execute(
                "INSERT INTO fts_recent(fts_recent, rowid, body, tags) "
                f"SELECT 'delete', id, body, tags FROM docs WHERE {recent}",
                (*args, self.recent_floor),
            )
            self.recent_count -= count
        self.conn.execute(f"DELETE FROM docs WHERE {where}", args)

    def _index_segment(
        self, session: _Session, folder: str, segment_id: str, st: os.stat_result
    ) -> bool:
        """Read the segment's new complete lines; return whether anything changed."""
        segment = session.segments.get(segment_id)
        if segment is not None and (st.st_ino != segment.ino or st.st_size < segment.offset):
            # Replaced or shrunk under us (a repair): read it again from the start.
            self._drop_segment(segment)
            del session.segments[segment_id]
            segment = None
        if segment is None:
            cur = self.conn.execute(
                "INSERT INTO segments(session, segment_id, ino, size_seen, offset, next_seq, "
                "items, continues) VALUES (?, ?, ?, 0, 0, 0, 0, 0)",
                (session.id, segment_id, st.st_ino),
            )
            segment = _Segment(
                int(cur.lastrowid or 0),
                session.id,
                segment_id,
                st.st_ino,
                0,
                0,
                0,
                0,
                False,
                None,
                None,
                None,
            )
            session.segments[segment_id] = segment
        if st.st_size == segment.size_seen and segment.size_seen:
            return False
        path = self.root / folder / f"{segment_id}{_SEGMENT_SUFFIX}"
        try:
            data, size = _read_from(path, segment.offset)
        except FileNotFoundError:
            return False
        except OSError as exc:
            data, size = b"", segment.size_seen
            problem: str | None = f"{path}: unreadable ({exc.strerror or exc})"
        else:
            problem = self._read_lines(session, segment, data, path)
            segment.size_seen = size
        if segment.offset == 0 and problem is None:  # not even a whole header line yet
            problem = f"{path}: {'torn header line' if size else 'empty file, no header'}"
        if problem is not None and problem != segment.problem:
            log.info("search index: %s", problem)  # ``list`` reports it (ContextSummary)
        changed = bool(data) or problem != segment.problem
        segment.problem = problem
        self.conn.execute(
            "UPDATE segments SET size_seen=?, offset=?, next_seq=?, items=?, continues=?, "
            "parent=?, at_seq=?, last_ts=?, problem=? WHERE id = ?",
            (
                segment.size_seen,
                segment.offset,
                segment.next_seq,
                segment.items,
                int(segment.continues),
                segment.parent,
                segment.at_seq,
                segment.last_ts,
                segment.problem,
                segment.id,
            ),
        )
        return changed

    def _read_lines(
        self, session: _Session, segment: _Segment, data: bytes, path: Path
    ) -> str | None:
        """Index the complete lines of ``data`` (the file from the segment's offset on); return
        why they cannot be read (one line, naming the file), or None."""
        self.stats.segments_read += 1
        self.stats.bytes_read += len(data)
        complete, _ = codec.split_complete(data)
        if not complete:
            return None
        try:
            self._index_lines(session, segment, complete, str(path))
        except StoreError as exc:
            reason = " ".join(str(exc).split())
            return reason if str(path) in reason else f"{path}: {reason}"
        segment.offset += len(complete)
        return None

    def _index_lines(
        self, session: _Session, segment: _Segment, complete: bytes, where: str
    ) -> None:
        lines = codec.decode_lines(complete, where=where, first_line=segment.next_seq + 1)
        docs: list[tuple[int, str, str, str]] = []  # seq, role, ts, text
        seq = segment.next_seq
        last_ts = segment.last_ts
        for line in lines:
            if line["seq"] != seq:
                raise _corrupt(where, seq, line["seq"])
            ts = str(line.get("ts", ""))
            kind = line["kind"]
            if seq == 0:
                if kind != "header":
                    raise CorruptLog(f"{where}:1: the first line is not a segment header")
                origin = line.get("origin")
                origin = origin if isinstance(origin, dict) else {}
                history = line.get("history")
                segment.continues = origin.get("kind") == "fork" and history is None
                if segment.continues:
                    parent, at_seq = origin.get("parent"), origin.get("at_seq")
                    segment.parent = str(parent) if parent is not None else None
                    segment.at_seq = at_seq if isinstance(at_seq, int) else None
                for item in history if isinstance(history, list) else ():
                    docs.append(_doc(0, item, ts))
            elif kind in HISTORY_KINDS:
                docs.append(_doc(seq, line.get("item"), ts))
            last_ts = ts
            seq += 1
        for doc_seq, role, ts, text in docs:
            self.pending.append(
                (self.next_doc, segment.id, session.id, session.tid, doc_seq, role, ts, text)
            )
            self.next_doc += 1
        self.stats.items += len(docs)
        segment.items += len(docs)
        segment.next_seq = seq
        segment.last_ts = last_ts
        if len(self.pending) >= 5000:
            self.flush()

    def flush(self) -> None:
        """Write pending items to ``docs`` and both FTS tables."""
        if not self.pending:
            return
        first, last = self.pending[0][0], self.pending[-1][0]
        texts = sum(1 for row in self.pending if row[-1])
        self.conn.executemany(
            "INSERT INTO docs(id, segment, session, tid, seq, role, ts, body) "
            "VALUES (?,?,?,?,?,?,?,?)",
            self.pending,
        )
        self.pending.clear()
        self.recent_stale = True
        for table in ("fts",) if self.defer_recent else ("fts", "fts_recent"):
            self.conn.execute(
                f"INSERT INTO {table}(rowid, body, tags) SELECT id, body, tags FROM docs "
                "WHERE id BETWEEN ? AND ? AND body != ''",
                (first, last),
            )
        if not self.defer_recent:
            self.recent_count += texts

    def finish(self) -> None:
        """Flush, recompute the changed sessions' summaries and trim ``fts_recent``."""
        self.flush()
        for session in self.changed.values():
            self._summarise(session)
        if (self.defer_recent and self.recent_stale) or self.recent_count > 2 * RECENT_SIZE:
            row = self.conn.execute(
                "SELECT id FROM texts ORDER BY id DESC LIMIT 1 OFFSET ?", (RECENT_SIZE - 1,)
            ).fetchone()
            self.recent_floor = int(row[0]) if row else 1
            self.conn.execute("UPDATE recent SET floor = ?", (self.recent_floor,))
            self.conn.execute("INSERT INTO fts_recent(fts_recent) VALUES('rebuild')")
            (self.recent_count,) = self.conn.execute("SELECT count(*) FROM recent_texts").fetchone()
        self.conn.execute(
            "INSERT OR REPLACE INTO meta VALUES ('recent_count', ?)", (str(self.recent_count),)
        )

    def _summarise(self, session: _Session) -> None:
        """Store the head's message count and last activity, as a restore would find them,
        and the session's first problem (see :attr:`ContextSummary.problem`)."""
        row = self.conn.execute(
            "SELECT head, folder FROM sessions WHERE id = ?", (session.id,)
        ).fetchone()
        if row is None:
            return
        problems = [session.head_problem or ""]
        head = session.segments.get(row[0])
        if head is None:
            problems.append(f"{self.root / row[1] / _HEAD}: its segment {row[0]} does not exist")
        problems += [session.segments[sid].problem or "" for sid in sorted(session.segments)]
        problem = next((p for p in problems if p), None)
        count = 0
        segment: _Segment | None = head
        stop: int | None = None
        for _ in range(10_000):  # a fork chain; bounded in case of a cycle in damaged headers
            if segment is None:
                break
            if stop is None:
                count += segment.items
            else:
                count += self.conn.execute(
                    "SELECT count(*) FROM docs WHERE segment = ? AND seq <= ?",
                    (segment.id, stop),
                ).fetchone()[0]
            if not segment.continues or segment.parent is None:
                break
            stop = segment.at_seq if segment.at_seq is not None else -1
            segment = session.segments.get(str(segment.parent))
        self.conn.execute(
            "UPDATE sessions SET message_count = ?, last_active = coalesce(?, last_active), "
            "problem = ? WHERE id = ?",
            (count, head.last_ts if head is not None else None, problem, session.id),
        )


# --------------------------------------------------------------------------- helpers


def _doc(seq: int, item: Any, ts: str) -> tuple[int, str, str, str]:
    """(seq, role, ts, text as indexed) for one history item."""
    if not isinstance(item, Mapping):
        return seq, "other", ts, ""
    role = item.get("role")
    if role not in ROLES:
        role = "other"
    try:
        text = item_text(item)
    except (AttributeError, TypeError):
        text = ""
    return seq, str(role), ts, prepare_text(text) if isinstance(text, str) else ""


def _transaction(conn: sqlite3.Connection, run: Callable[[], _T]) -> _T:
    """``run()`` in one ``BEGIN IMMEDIATE`` transaction (waiting up to ``BUSY_TIMEOUT`` for
    another process's), committed if it returns and rolled back if it raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = run()
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # SQLite may have rolled back itself (a full disk)
            conn.execute("ROLLBACK")
        raise
    return result


def _corrupt(where: str, expected: int, got: object) -> StoreError:
    return CorruptLog(f"{where}: seq {got} out of order (expected {expected})")


def _read_from(path: Path, offset: int) -> tuple[bytes, int]:
    """The bytes of ``path`` from ``offset`` on, and its size, read under a shared lock."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # never read a write in progress
        size = os.fstat(fd).st_size
        chunks = []
        position = offset
        while position < size:
            chunk = os.pread(fd, size - position, position)
            if not chunk:
                break
            chunks.append(chunk)
            position += len(chunk)
        return b"".join(chunks), size
    finally:
        os.close(fd)  # closing releases the lock


def _folder_head(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The head record of a session folder, as FsStore reads it, and what is wrong with it.

    A missing ``head.json`` is rebuilt from the segments (no problem: the head is derived);
    an unreadable or invalid one, or one naming a segment that is not there, is rebuilt too,
    and the problem names it. Returns (None, problem) when no head can be found or rebuilt,
    the problem None when the folder holds no segment either (a context being deleted).
    """
    path = folder / _HEAD
    problem = None
    try:
        head = _head_record(codec.decode(path.read_bytes()))
        if head is None:
            problem = f"{path}: not a valid head record"
        elif (folder / f"{head['segment_id']}{_SEGMENT_SUFFIX}").exists():
            return head, None
        else:
            problem = f"{path}: names segment {head['segment_id']}, which is not there"
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as exc:
        problem = f"{path}: unreadable ({exc.strerror or exc})"
    except Exception as exc:  # msgspec's DecodeError: not JSON
        problem = f"{path}: not a valid head record ({' '.join(str(exc).split())})"
    from terrarium.stores.fs import head_from_segments  # fs imports this module

    try:
        rebuilt = head_from_segments(folder)
    except (StoreError, OSError) as exc:
        has_segments = any(_segment_name(name) for name in _listdir(folder))
        if problem is None and not has_segments:
            return None, None
        return None, f"{problem or path.parent}; no head can be rebuilt: {exc}"
    head = _head_record(
        {
            "context": rebuilt.context,
            "session_id": str(rebuilt.session_id),
            "segment_id": str(rebuilt.segment_id),
            "created_at": rebuilt.created_at,
            "updated_at": rebuilt.updated_at,
        }
    )
    return head, f"{problem}; rebuilt from the segments" if problem else None


def _head_record(raw: Any) -> dict[str, Any] | None:
    """``raw`` if it is a head record (ids made canonical), else None."""
    keys = ("context", "session_id", "segment_id", "created_at", "updated_at")
    if not isinstance(raw, dict) or not all(isinstance(raw.get(k), str) for k in keys):
        return None
    for key in ("session_id", "segment_id"):
        if not _CANONICAL_UUID.fullmatch(raw[key]):
            if not _is_uuid(raw[key]):
                return None
            raw[key] = str(uuid.UUID(raw[key]))
    return raw


def _segment_name(name: str) -> str | None:
    """The segment id if ``name`` is a segment file's name (not a trace or a torn tail)."""
    if not name.endswith(_SEGMENT_SUFFIX) or name.endswith(_TRACE_SUFFIX):
        return None
    stem = name[: -len(_SEGMENT_SUFFIX)]
    if _CANONICAL_UUID.fullmatch(stem):  # what FsStore writes: skip the parse
        return stem
    return str(uuid.UUID(stem)) if _is_uuid(stem) else None


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _scandir(path: str | Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []
