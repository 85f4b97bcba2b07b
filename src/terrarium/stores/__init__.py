"""Store backends behind one protocol (see :mod:`terrarium.stores.base`).

Names are imported on first use (:mod:`terrarium._lazy`): a caller of one backend does not
import the others.
"""

from __future__ import annotations

from terrarium._lazy import attach

TYPE_CHECKING = False  # typing's costs more to import than this whole module

if TYPE_CHECKING:
    from terrarium.stores.base import (
        ContextLocking,
        Lifecycle,
        NewEntry,
        PodActiveSegmentRef,
        PodMetadata,
        PodMetadataStore,
        Reindexable,
        Searchable,
        SearchHit,
        SearchQuery,
        SegmentRead,
        Store,
    )
    from terrarium.stores.fs import FsStore
    from terrarium.stores.memory import MemoryStore
    from terrarium.stores.sqlite import SqliteStore
    from terrarium.stores.url import open_store

_BASE = "terrarium.stores.base"

#: Each public name and the module that defines it.
_NAMES = {
    "ContextLocking": _BASE,
    "Lifecycle": _BASE,
    "NewEntry": _BASE,
    "PodActiveSegmentRef": _BASE,
    "PodMetadata": _BASE,
    "PodMetadataStore": _BASE,
    "Reindexable": _BASE,
    "SearchHit": _BASE,
    "SearchQuery": _BASE,
    "Searchable": _BASE,
    "SegmentRead": _BASE,
    "Store": _BASE,
    "FsStore": "terrarium.stores.fs",
    "MemoryStore": "terrarium.stores.memory",
    "SqliteStore": "terrarium.stores.sqlite",
    "open_store": "terrarium.stores.url",
}

__all__ = [
    "ContextLocking",
    "FsStore",
    "Lifecycle",
    "MemoryStore",
    "NewEntry",
    "PodActiveSegmentRef",
    "PodMetadata",
    "PodMetadataStore",
    "Reindexable",
    "SearchHit",
    "SearchQuery",
    "Searchable",
    "SegmentRead",
    "SqliteStore",
    "Store",
    "open_store",
]

__getattr__, __dir__ = attach(__name__, _NAMES, __all__)
del annotations, TYPE_CHECKING, attach  # not part of the namespace
