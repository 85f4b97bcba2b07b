"""Store backends behind one protocol (see :mod:`terrarium.stores.base`)."""

from __future__ import annotations

from terrarium.stores.base import (
    ContextLocking,
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

__all__ = [
    "ContextLocking",
    "FsStore",
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
