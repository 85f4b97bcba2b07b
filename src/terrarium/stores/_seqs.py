"""The next seq a store expects for the segments it appended to lately (SQLite, PostgreSQL).

Their append is a compare-and-set ``INSERT``, so they propose a seq instead of reading it: a
right guess saves a query, a wrong one costs a retry. A bounded LRU shared by a store's threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

from terrarium.model import SegmentId, SessionId

T = TypeVar("T")
Key = tuple[SessionId, SegmentId]


class SeqGuesses(Generic[T]):
    """Guesses of each segment's next seq, with a value the store keeps beside each."""

    def __init__(self, size: int = 4096) -> None:
        """Keep guesses for the ``size`` segments appended to most recently."""
        self._size = size
        self._lock = threading.Lock()
        self._seen: OrderedDict[Key, tuple[int, T]] = OrderedDict()

    def get(self, key: Key) -> tuple[int, T] | None:
        """The guessed next seq of segment ``key`` and the value kept with it, or None."""
        return self._seen.get(key)

    def remember(self, key: Key, next_seq: int, value: T) -> None:
        """Note that segment ``key`` reached ``next_seq``; a lower one is kept out (another
        thread may be further) unless it comes with a new value (a key looked up again)."""
        with self._lock:
            known = self._seen.get(key)
            if known is None or next_seq > known[0] or value != known[1]:
                self._seen[key] = (next_seq, value)
            self._seen.move_to_end(key)
            if len(self._seen) > self._size:
                self._seen.popitem(last=False)
