"""What the derived index reads of a store with a change cursor.

:class:`LogChanges` is the index's ``Source`` over any :class:`~terrarium.stores.base.ChangeLog`
store (memory, SQLite, PostgreSQL): a session's "folder" is its id, a segment's size its next
seq, and the lines it gained are ``entries_from`` a seq. The store's cursor names the sessions
to read. A walk (a first build) reads a page of sessions' heads and segments in one read and
their lines in one per ``LINES`` lines: a few round trips a page, not several a session. What
is read serves one refresh only, until the cursor is read again (whatever changed after is
named by that read). The filesystem store's source is ``stores/fs/_changes.py``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from terrarium.errors import CorruptLog, IndexUnavailable, SegmentNotFound
from terrarium.model import SegmentId, SessionId
from terrarium.stores.base import ChangeLog, LiveSession, PodMetadata, SegmentStat

#: Sessions a walk reads at a time: their heads and segments in one read.
PAGE = 500
#: Lines a walk reads at a time, in one read (a session that has more in a read of its own).
LINES = 20_000


class LogChanges:
    """The derived index's view of a :class:`~terrarium.stores.base.ChangeLog` store."""

    def __init__(self, store: ChangeLog, index_file: Path) -> None:
        self.store = store
        self.path = index_file
        """The index's database."""
        self._live: dict[str, LiveSession | None] = {}
        """Sessions read since the cursor was (None: not hot and attached), see above."""
        self._lines: dict[tuple[str, str], list[dict[str, Any]]] = {}
        """The lines of the sessions the walk is at, each segment's from seq 0."""

    def __repr__(self) -> str:
        return f"LogChanges({self.store!r})"

    def index_file(self, name: str) -> Path:
        """The index's database (one file: ``name`` is the default's), refused
        (IndexUnavailable) if it is a link: one planted there could lead anywhere."""
        if os.path.islink(self.path):
            raise IndexUnavailable(f"{self.path}: a link, which terrarium does not follow")
        return self.path

    def changes(self, after: str | None) -> tuple[list[str] | None, str]:
        """The sessions written since ``after`` (None: all) and the position now."""
        self._live, self._lines = {}, {}  # read before the position this read gives
        touched, position = self.store.changes(after)
        return (None if touched is None else [str(s) for s in touched]), position

    def pointer(self, session_id: str) -> str | None:
        return session_id

    def _session(self, folder: str) -> LiveSession | None:
        if folder not in self._live:
            sid = uuid.UUID(folder)
            self._live[folder] = self.store.live_sessions([sid]).get(sid)
        return self._live[folder]

    def segments(self, folder: str) -> dict[str, SegmentStat]:
        found = self._session(folder)
        return {} if found is None else {str(g): SegmentStat(0, n) for g, n in found[1].items()}

    def stat_segment(self, folder: str, segment_id: str) -> SegmentStat | None:
        try:
            return SegmentStat(0, self.store.next_seq(uuid.UUID(folder), uuid.UUID(segment_id)))
        except SegmentNotFound:
            return None

    def head(self, folder: str) -> tuple[PodMetadata | None, str | None]:
        found = self._session(folder)
        return (None if found is None else found[0]), None

    def frozen(self, session_id: object) -> bool:
        return False  # live_sessions gives no head for a frozen session

    def salvaged(self, folder: str) -> set[str]:
        return set()

    def segment_path(self, folder: str, segment_id: str) -> str:
        return f"segment {segment_id} of session {folder}"

    def head_path(self, folder: str) -> str:
        return f"the head of session {folder}"

    def read_lines(
        self, folder: str, segment_id: str, offset: int, seq: int
    ) -> tuple[list[dict[str, Any]], int, int]:
        lines = self._lines.get((folder, segment_id))
        if lines is None:
            read = (uuid.UUID(folder), uuid.UUID(segment_id), offset)
            (lines,) = self.store.entries_from([read])
        else:
            lines = lines[offset:]
        end = offset + len(lines)
        return lines, end, end

    def count_sessions(self) -> int:
        return len(self.store.list_contexts())

    def walk(self) -> Iterator[tuple[str, dict[str, SegmentStat]]]:
        heads = self.store.list_contexts()
        for start in range(0, len(heads), PAGE):
            ids = [head.session_id for head in heads[start : start + PAGE]]
            live = self.store.live_sessions(ids)
            self._live = {str(sid): found for sid, found in live.items()}
            for chunk in _chunks([(sid, live[sid][1]) for sid in ids if sid in live]):
                reads = [(sid, g, 0) for sid in chunk for g in live[sid][1]]
                try:
                    read = zip(reads, self.store.entries_from(reads), strict=True)
                    self._lines = {(str(s), str(g)): lines for (s, g, _), lines in read}
                except CorruptLog:  # each segment read alone: the damaged one's is its problem
                    self._lines = {}
                for sid in chunk:
                    yield str(sid), self.segments(str(sid))
        self._lines = {}


def _chunks(sessions: list[tuple[SessionId, dict[SegmentId, int]]]) -> Iterator[list[SessionId]]:
    """The sessions in runs of at most ``LINES`` lines (a longer session alone)."""
    chunk: list[SessionId] = []
    size = 0
    for sid, tails in sessions:
        lines = sum(tails.values())
        if chunk and size + lines > LINES:
            yield chunk
            chunk, size = [], 0
        chunk.append(sid)
        size += lines
    if chunk:
        yield chunk
