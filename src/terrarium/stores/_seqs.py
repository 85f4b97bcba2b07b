"""The next seq a store expects for the segments it appended to lately (SQLite, PostgreSQL).

Stores whose append is its own compare-and-set (an ``INSERT`` that only succeeds at the right
seq) propose a seq instead of reading it first: a right guess saves a query, a wrong one costs
a retry, never a lost or doubled entry. A bounded LRU of guesses, one per segment, shared by
the threads of one store.
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
        """Note that segment ``key`` reached ``next_seq`` (a guess only: a lower one is kept
        out, since another thread may have appended further meanwhile, unless it comes with
        another value, which replaces the one kept: SQLite's segment key, looked up again)."""
        with self._lock:
            known = self._seen.get(key)
            if known is None or next_seq > known[0] or value != known[1]:
                self._seen[key] = (next_seq, value)
            self._seen.move_to_end(key)
            if len(self._seen) > self._size:
                self._seen.popitem(last=False)
