"""What the derived index (:mod:`terrarium.index`) reads of a store with a change cursor.

:class:`LogChanges` gives the index's ``Source`` over any :class:`~.base.ChangeLog` store
(memory, SQLite, PostgreSQL): a session's "folder" is its id, a segment's size its next seq
(all of a session's in one :meth:`~.base.ChangeLog.segment_tails` read), and the lines it
gained since are :meth:`~.base.ChangeLog.entries_from` a seq. Which sessions
to read comes from the store's cursor (:meth:`changes`). The filesystem store has its own
source (``stores/fs/_changes.py``): appends there leave markers, not a cursor. A store on a
server keeps no index file of its own: each machine keeps one in :func:`index_folder`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from terrarium.errors import IndexUnavailable, SegmentNotFound
from terrarium.stores.base import ChangeLog, PodMetadata, SegmentStat

__all__ = ["INDEX_DIR_ENV", "LogChanges", "index_folder"]

#: The environment variable that names the folder of a server store's derived index files.
INDEX_DIR_ENV = "TERRARIUM_INDEX_DIR"


def index_folder() -> Path:
    """Where this machine keeps the derived index of a store on a server (PostgreSQL), one
    file per store: ``$TERRARIUM_INDEX_DIR``, else ``$XDG_CACHE_HOME/terrarium/index``, else
    ``~/.cache/terrarium/index``. A cache: each machine builds its own from the store."""
    named = os.environ.get(INDEX_DIR_ENV)
    if named:
        return Path(named).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "terrarium" / "index"


class LogChanges:
    """The derived index's view of a :class:`~.base.ChangeLog` store."""

    def __init__(self, store: ChangeLog, index_file: Path) -> None:
        self.store = store
        self.path = index_file
        """The index's database."""

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
        touched, position = self.store.changes(after)
        return (None if touched is None else [str(s) for s in touched]), position

    def pointer(self, session_id: str) -> str | None:
        return session_id

    def segments(self, folder: str) -> dict[str, SegmentStat]:
        tails = self.store.segment_tails(uuid.UUID(folder))
        return {str(g): SegmentStat(0, tail) for g, tail in tails.items()}

    def stat_segment(self, folder: str, segment_id: str) -> SegmentStat | None:
        try:
            return SegmentStat(0, self.store.next_seq(uuid.UUID(folder), uuid.UUID(segment_id)))
        except SegmentNotFound:
            return None

    def head(self, folder: str) -> tuple[PodMetadata | None, str | None]:
        return self.store.live_head(uuid.UUID(folder)), None

    def frozen(self, session_id: object) -> bool:
        return False  # live_head gives no head for a frozen session

    def salvaged(self, folder: str) -> set[str]:
        return set()

    def segment_path(self, folder: str, segment_id: str) -> str:
        return f"segment {segment_id} of session {folder}"

    def head_path(self, folder: str) -> str:
        return f"the head of session {folder}"

    def read_lines(
        self, folder: str, segment_id: str, offset: int, seq: int
    ) -> tuple[list[dict[str, Any]], int, int]:
        lines = self.store.entries_from(uuid.UUID(folder), uuid.UUID(segment_id), offset)
        end = offset + len(lines)
        return lines, end, end

    def count_sessions(self) -> int:
        return len(self.store.list_contexts())

    def walk(self) -> Iterator[tuple[str, dict[str, SegmentStat]]]:
        for head in self.store.list_contexts():
            folder = str(head.session_id)
            yield folder, self.segments(folder)
