"""A first build of the derived index, a step at a time.

Building the index of 100k sessions takes about a minute. A read given a budget indexes for at
most that long, commits, and reads what the index holds; the walk is kept between calls (no
thread). Writes meanwhile are not lost: the change cursor is read where the build began, and a
filesystem store's markers are claimed at every step.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from terrarium.index import _sql as sql
from terrarium.index._refresh import IndexUpdate, Source
from terrarium.stores.base import SegmentStat

SMALL = 200
"""A build of at most this many sessions is done in one step, whatever the budget (a few
hundred milliseconds at most): the first page of a small store shows it whole."""


class Build:
    """One build under way: the walk of every session, what it has seen, where it began."""

    def __init__(self, source: Source, conn: sqlite3.Connection, position: str) -> None:
        self.walk: Iterator[tuple[str, dict[str, SegmentStat]]] = iter(source.walk())
        self.known = {folder: sid for sid, folder in conn.execute(sql.SESSION_FOLDERS)}
        """The sessions an earlier step (of this build, or of another process's) indexed."""
        self.seen: set[str] = set()
        self.walked = 0
        self.total = source.count_sessions()
        self.position = position
        """The store's change cursor where the build began (empty on files)."""
        self.held: list[Path] | None = None
        """On files, the markers claimed when the build began, released when it ends."""
        self.watch: list[str] = []
        """Their sessions, watched once it ends (as a full refresh watches what it claims)."""

    @property
    def left(self) -> int:
        """Sessions the walk has not reached yet (at least 1 until it ends; about, as the
        store may have gained or lost some meanwhile)."""
        return max(1, self.total - self.walked)

    def step(self, work: IndexUpdate, deadline: float) -> bool:
        """Index the walk's sessions until ``deadline`` (a small build: all of them); True
        once every one is."""
        while self.total <= SMALL or time.monotonic() <= deadline:
            found = next(self.walk, None)
            if found is None:
                return True
            folder, segments = found
            self.walked += 1
            sid = self.known.get(folder) or work.index_folder(folder, segments, hint=None)
            if sid is not None:
                self.seen.add(sid)
        return False
