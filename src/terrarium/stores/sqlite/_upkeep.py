"""``SqliteStore``'s upkeep thread: indexing of staged items, refills of ``search_recent``,
FTS5 merges, WAL checkpoints.

Chores that used to stall an append now and then: the FTS5 share of the derived-state
catch-up (tokenizing each item into both FTS5 tables and flushing a segment of each, ~0.5 ms
a slice of 64 items); a WAL checkpoint (SQLite's automatic one runs in the commit that
passes 1000 pages: a copy of them into the database and an ``fsync``, ~1.5-2 ms of the
committing thread's CPU); once per ``SEARCH_RECENT`` history items, the ``'rebuild'`` of
``search_recent`` (~0.9 s at 100k items, under the write lock); and the merges FTS5 does when
a level of an index holds too many segments. They are SQL that runs in SQLite's C code with
the GIL released, so one thread per store and process, with a connection of its own, does
them off the append path. The Python share of the catch-up (reading the lines, the listing
counts, the items' text) stays in the appends, in slices of
:data:`terrarium.stores.sqlite.SEARCH_BATCH`, which leave their items staged
(:func:`.search.index_staged`): in a thread it contended for the GIL with every append
(measured: the median append 1.2-1.4x slower).

Checkpoints are ``PASSIVE``: they copy what no reader still needs and never block a writer or
a reader. SQLite's automatic checkpoint stays on, at 1000 pages in this thread's connection
and 4000 in the store's (``_sql.AUTOCHECKPOINT``), so it runs in this thread's commits: run
alone, between appends, a checkpoint rarely finds a moment when no append has just added
frames, so the WAL would never start over and would grow without end (measured: the median
append 1.13x slower for it). The store's 4000 bounds the WAL should this thread not run.

Indexing and refills add :data:`SLICE` items, a merge step :data:`MERGE_PAGES` pages, per
write transaction; a writer of this process waits for one on the store's ``gate`` (no
busy-handler sleep of 1 ms or more), a writer of another process in SQLite's busy handler.

Nothing here is needed for correctness: a read indexes what is staged first (or scans it,
where it cannot write), ranking reads whatever ``search_recent`` holds, and a checkpoint
happens anyway when the last connection closes.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from functools import partial
from pathlib import Path

from terrarium.stores import _db
from terrarium.stores.sqlite import _sql as sql
from terrarium.stores.sqlite.search import index_staged, refill_recent

log = logging.getLogger(__name__)

# Every upkeep of this process, so that a forked child resets them (see Upkeep._forked).
_LIVE: weakref.WeakSet[Upkeep] = weakref.WeakSet()

#: Items added to the FTS5 tables per write transaction of indexing or of a refill.
SLICE = 64
#: Pages of FTS5 merge per write transaction.
MERGE_PAGES = 32
#: Rounds of slices per kick, at most (the next kick goes on).
MOST_SLICES = 10_000
#: Merge steps per FTS5 table after the rounds, at most: each indexing slice flushes a
#: segment, so a merge nearly always finds work.
MERGE_SLICES = 4
#: Seconds without a kick after which the thread stops (the next kick starts another).
IDLE_EXIT = 60.0
#: Seconds between rounds of slices: the appending threads get the write lock. Measured
#: with 3 ms between rounds that only refill ``search_recent`` (at 100k, where the timed
#: appends cross its emptying): a tight loop of appends gained (median 28-31 -> 21-22 µs),
#: appends interleaved with other work lost (peers.py: 1.97-2.05x -> 2.50-2.59x the bare
#: INSERT), as the refill then lasted ~3.5 s instead of ~1 s.
PAUSE = 0.0005


class Upkeep:
    """The upkeep thread of one store in this process, started when first kicked.

    Args:
        path: the database (for messages).
        connect: opens a connection to it, as the store's own.
        recent: reads ``SEARCH_RECENT`` (patched by tests) at each slice.
    """

    def __init__(
        self, path: Path, connect: Callable[[], sqlite3.Connection], recent: Callable[[], int]
    ) -> None:
        self.path = path
        self.gate = threading.Lock()
        """Taken by the store's write transactions (and its single-entry appends, around
        their ``INSERT``) and by each slice here: a writer of this process waits for a slice
        without a busy-handler sleep."""
        self._connect = connect
        self._recent = recent
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._closing = False
        self._checkpoint = False  # a kick asked for a checkpoint the thread has not run
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        # Held by the thread while it is in SQLite, and by a fork (see _before_fork): a child
        # forked while the thread held one of SQLite's own mutexes would hang on it.
        self._in_sqlite = threading.Lock()
        _LIVE.add(self)

    def _forked(self) -> None:
        """In a forked child: no thread runs, and the locks may have been held by one."""
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self.gate = threading.Lock()
        self._start_lock = threading.Lock()
        self._in_sqlite = threading.Lock()
        self._thread = None

    def kick(self, *, checkpoint: bool = True) -> None:
        """Have the thread index the staged items, refill ``search_recent`` if it needs it,
        merge, then (with ``checkpoint``) checkpoint the WAL (starting it first if it is not
        running: it stops after :data:`IDLE_EXIT` seconds without a kick, and a forked child
        inherits none)."""
        with self._start_lock:
            if self._closing:
                return
            self._checkpoint = self._checkpoint or checkpoint
            self._idle.clear()
            self._wake.set()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name=f"terrarium upkeep {self.path.name}", daemon=True
                )
                self._thread.start()

    def settle(self, timeout: float = 30.0) -> bool:
        """Wait until the thread has done what it was kicked for; False if it has not within
        ``timeout`` seconds (for tests and benchmarks)."""
        deadline = time.monotonic() + timeout
        while self._idle.wait(max(0.0, deadline - time.monotonic())):
            if not self._wake.is_set():  # not kicked again since it went idle
                return True
            time.sleep(0.001)
        return False

    def close(self) -> None:
        """Stop the thread after its current slice."""
        with self._start_lock:
            self._closing = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        wake, idle = self._wake, self._idle
        try:
            with self._in_sqlite:
                conn = self._connect()
                conn.execute("PRAGMA busy_timeout = 0")  # busy: it waits outside the gate
                conn.execute(f"PRAGMA wal_autocheckpoint = {sql.AUTOCHECKPOINT_UPKEEP}")
        except (sqlite3.Error, OSError) as exc:
            log.warning("%s: upkeep thread cannot connect: %s", self.path, exc)
            with self._start_lock:
                self._thread = None
                idle.set()
            return
        try:
            while not self._closing and self._wait(wake):
                wake.clear()
                try:
                    self._work(conn)
                except (sqlite3.Error, OSError) as exc:  # tried again at the next kick
                    log.warning("%s: search index upkeep deferred: %s", self.path, exc)
                if not wake.is_set():
                    idle.set()
        finally:
            with self._in_sqlite:
                conn.close()
            if self._closing:
                idle.set()

    def _wait(self, wake: threading.Event) -> bool:
        """Wait for a kick; False (the thread then stops) after ``IDLE_EXIT`` seconds of none,
        so a store left open without use holds no thread nor connection."""
        while not wake.wait(IDLE_EXIT):
            with self._start_lock:  # a kick then starts a new thread
                if not wake.is_set():
                    self._thread = None
                    return False
        return True

    def _work(self, conn: sqlite3.Connection) -> None:
        """Rounds of an indexing slice (while items are staged), a refill slice (while
        ``search_recent`` lacks some of the newest items) and a merge step of each FTS5 table,
        until the first two have nothing left; up to :data:`MERGE_SLICES` more merge steps;
        then a passive checkpoint, if a kick asked for one.

        Each round merges what its slices wrote, a few pages at a time, so that no level of
        an FTS5 index gathers ``crisismerge`` segments, which FTS5 would merge whole inside a
        commit (measured at 100k items: refill slices of 9-12 ms now and then, when merges
        waited for the end of the refill; 1.5 ms at most with a merge step every round).
        """
        recent = self._recent()
        work: list[Callable[[sqlite3.Connection], bool]] = [
            lambda c: index_staged(c, recent, SLICE),
            lambda c: refill_recent(c, recent, SLICE),
        ]
        merges = [partial(_merge, table=table) for table in sql.FTS_TABLES]
        for _ in range(MOST_SLICES):  # a bound, should a step always find work
            if self._closing:
                return
            work = [step for step in work if self._slice(conn, step)]
            merging = [step for step in merges if self._slice(conn, step)]
            if not work:
                break
            time.sleep(PAUSE)
        for _ in range(MERGE_SLICES):
            if self._closing or not merging:
                break
            merging = [step for step in merging if self._slice(conn, step)]
            time.sleep(PAUSE)
        with self._start_lock:
            checkpoint, self._checkpoint = self._checkpoint, False
        if checkpoint and not self._closing:
            with self._in_sqlite:
                conn.execute(sql.CHECKPOINT).fetchone()

    def _slice(self, conn: sqlite3.Connection, step: Callable[[sqlite3.Connection], bool]) -> bool:
        """``step`` in one short write transaction; return whether it has work left."""
        with self.gate, self._in_sqlite:  # in this order: a fork may hold the gate
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if _db.kind(exc) != "busy":
                    raise
                busy = True
            else:
                busy = False
                try:
                    more = step(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
        if busy:  # another process writes: let it, and try again
            time.sleep(0.005)
            return True
        return more


def _merge(conn: sqlite3.Connection, table: str) -> bool:
    """A few pages of FTS5's incremental merge in ``table``; return whether it did any.

    FTS5 merges as it writes (``automerge``), a little per commit, but many small commits
    (one per indexing slice) leave levels crowded until one reaches ``crisismerge`` and is
    merged whole inside a commit: measured, a 6-18 ms stall every ~1000 items at 100k items
    when the appends indexed their own slices. Merging a few pages at a time, every round
    of slices, keeps every level below that.
    """
    before = conn.total_changes
    conn.execute(sql.FTS_MERGE.format(table=table), (MERGE_PAGES,))
    return conn.total_changes - before > 1  # the command itself counts as one change


def _before_fork() -> None:
    """Wait until no upkeep thread is in SQLite, and keep them out until the fork is done."""
    for upkeep in list(_LIVE):
        upkeep._in_sqlite.acquire()
        _FORKING.append(upkeep)


def _after_fork_in_parent() -> None:
    while _FORKING:
        _FORKING.pop()._in_sqlite.release()


def _after_fork_in_child() -> None:
    _FORKING.clear()
    for upkeep in list(_LIVE):
        upkeep._forked()


_FORKING: list[Upkeep] = []
os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)
