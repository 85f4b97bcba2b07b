"""Store backends behind one protocol (see :mod:`terrarium.stores.base`)."""

from __future__ import annotations

from terrarium.stores.base import (
    ContextLocking,
    NewEntry,
    PodActiveSegmentRef,
    PodMetadata,
    PodMetadataStore,
    Reindexable,
    SegmentRead,
    Store,
)
from terrarium.stores.fs import FsStore
from terrarium.stores.memory import MemoryStore

__all__ = [
    "ContextLocking",
    "FsStore",
    "MemoryStore",
    "NewEntry",
    "PodActiveSegmentRef",
    "PodMetadata",
    "PodMetadataStore",
    "Reindexable",
    "SegmentRead",
    "Store",
]
