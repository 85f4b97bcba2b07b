"""A derived index for a store that has none: walked whole at each refresh.

For a store that is not ``Indexed``, or whose own index cannot be brought up to date: kept in
a private temporary folder, removed with the store. Each refresh looks at every head and
segment and reads only the lines a segment gained, by its next seq.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from terrarium.errors import SegmentNotFound
from terrarium.index._cursor import LogChanges
from terrarium.index._index import SearchIndex
from terrarium.stores.base import INDEX_DB, PodMetadata, SegmentStat, Store


class WalkedChanges(LogChanges):
    """The derived index's view of a store with no change cursor (module docstring)."""

    def __init__(self, store: Store, index_file: Path) -> None:  # no super(): no cursor
        self.path = index_file
        self._store = weakref.ref(store)  # the index is kept by the store, not the reverse
        self._heads: dict[str, PodMetadata] = {}

    def __repr__(self) -> str:
        return f"WalkedChanges({self._store()!r})"

    @property
    def plain(self) -> Store:
        """The store (alive while its index is used)."""
        store = self._store()
        if store is None:
            raise SegmentNotFound("the store is gone")
        return store

    def changes(self, after: str | None) -> tuple[list[str] | None, str]:
        return None, ""

    def pointer(self, session_id: str) -> str | None:
        return session_id if session_id in self._heads else None

    def segments(self, folder: str) -> dict[str, SegmentStat]:
        try:
            segments = self.plain.list_segments(uuid.UUID(folder))
            found = {str(g): self.stat_segment(folder, str(g)) for g in segments}
        except SegmentNotFound:  # gone meanwhile
            return {}
        return {segment_id: st for segment_id, st in found.items() if st is not None}

    def stat_segment(self, folder: str, segment_id: str) -> SegmentStat | None:
        # A header's read counts the whole segment, and needs no write access (a read-only
        # store's ``next_seq`` may open the segment for appending).
        try:
            read = self.plain.read_segment(uuid.UUID(folder), uuid.UUID(segment_id), stop_seq=0)
        except SegmentNotFound:
            return None
        return SegmentStat(0, read.next_seq)

    def head(self, folder: str) -> tuple[PodMetadata | None, str | None]:
        return self._heads.get(folder), None

    def read_lines(
        self, folder: str, segment_id: str, offset: int, seq: int
    ) -> tuple[list[dict[str, Any]], int, int]:
        read = self.plain.read_segment(uuid.UUID(folder), uuid.UUID(segment_id))
        lines = [read.header, *read.entries][offset:]
        end = offset + len(lines)
        return lines, end, end

    def count_sessions(self) -> int:
        return len(self.plain.list_contexts())

    def walk(self) -> Iterator[tuple[str, dict[str, SegmentStat]]]:
        self._heads = {str(h.session_id): h for h in self.plain.list_contexts()}
        for folder in list(self._heads):
            yield folder, self.segments(folder)


_kept: weakref.WeakKeyDictionary[Any, SearchIndex] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def walked(store: Store) -> SearchIndex:
    """An index of ``store`` walked whole at each refresh, its database in a private
    temporary folder removed with the store."""
    with _lock:
        found = _kept.get(store)
        if found is None:
            folder = tempfile.mkdtemp(prefix="terrarium-index-")
            weakref.finalize(store, shutil.rmtree, folder, True)
            found = _kept[store] = SearchIndex(WalkedChanges(store, Path(folder) / INDEX_DB))
        return found
