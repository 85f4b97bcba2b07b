"""The derived index: the one listing and search index above every store.

It derives from a store's logs what listing, search and the dashboard need, and is rebuilt
from them when lost (docs/architecture.md). Importing this package imports no backend.

Usage::

    from terrarium import index

    found = index.of(store)  # a SearchIndex, or None
    if found is not None:
        hits = found.search(SearchQuery("deploy"))
    rows = index.listing(store).list_contexts_fast()  # the index, else the store
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from terrarium._lazy import attach
from terrarium.errors import StoreError
from terrarium.stores.base import ChangeLog, Indexed, Reindexable, Store

if TYPE_CHECKING:
    from terrarium.index._index import DB_NAME, IndexStats, SearchIndex
    from terrarium.index._overview import Reader, Sums, sort_key
    from terrarium.index._walked import walked

__all__ = [
    "DB_NAME",
    "IndexStats",
    "Reader",
    "SearchIndex",
    "Sums",
    "listing",
    "of",
    "of_any",
    "reindex",
    "sort_key",
    "walked",
]

_lock = threading.Lock()


def of(store: Store) -> SearchIndex | None:
    """The derived index of ``store`` (opened on first use), or None if it is not ``Indexed``."""
    if not isinstance(store, Indexed):
        return None
    from terrarium.index._cursor import LogChanges
    from terrarium.index._index import SearchIndex

    with _lock:
        found = store.derived
        if isinstance(found, SearchIndex):
            return found
        source = store.index_source()
        index = SearchIndex(LogChanges(store, source) if isinstance(store, ChangeLog) else source)
        store.derived = index
        return index


def of_any(store: Store) -> SearchIndex:
    """The derived index of any store: its own (:func:`of`), else :func:`walked`."""
    from terrarium.index._walked import walked

    found = of(store)
    return found if found is not None else walked(store)


def listing(store: Store) -> SearchIndex | Store:
    """What answers listing and search for ``store``: its derived index, else the store."""
    found = of(store)
    return store if found is None else found


def reindex(store: Store) -> int:
    """Rebuild the store's own indexes, then the derived index; return the contexts indexed.

    Raises:
        StoreError: the store keeps no index to rebuild.
    """
    count = store.reindex() if isinstance(store, Reindexable) else None
    found = of(store)
    indexed = found.rebuild() if found is not None else None
    count = indexed if count is None else count
    if count is None:
        raise StoreError("this store keeps no index to rebuild")
    return count


__getattr__, __dir__ = attach(
    __name__,
    {
        **dict.fromkeys(("DB_NAME", "IndexStats", "SearchIndex"), "terrarium.index._index"),
        **dict.fromkeys(("Reader", "Sums", "sort_key"), "terrarium.index._overview"),
        "walked": "terrarium.index._walked",
    },
    __all__,
)
