"""Store backends behind one protocol (see :mod:`terrarium.stores.base`).

Names are imported on first use (:mod:`terrarium._lazy`): a caller of one backend does not
import the others.
"""

from __future__ import annotations

from terrarium._lazy import attach

TYPE_CHECKING = False  # typing's costs more to import than this whole module

if TYPE_CHECKING:  # ``X as X``: a type checker sees each name re-exported
    from terrarium.stores.base import ContextLocking as ContextLocking
    from terrarium.stores.base import Lifecycle as Lifecycle
    from terrarium.stores.base import NewEntry as NewEntry
    from terrarium.stores.base import PodActiveSegmentRef as PodActiveSegmentRef
    from terrarium.stores.base import PodMetadata as PodMetadata
    from terrarium.stores.base import PodMetadataStore as PodMetadataStore
    from terrarium.stores.base import Reindexable as Reindexable
    from terrarium.stores.base import SegmentRead as SegmentRead
    from terrarium.stores.base import Store as Store
    from terrarium.stores.fs import FsStore as FsStore
    from terrarium.stores.memory import MemoryStore as MemoryStore
    from terrarium.stores.sqlite import SqliteStore as SqliteStore
    from terrarium.stores.url import open_store as open_store

#: Each module and the public names it defines.
_MODULES = {
    "terrarium.stores.base": """
        ContextLocking Lifecycle NewEntry PodActiveSegmentRef PodMetadata PodMetadataStore
        Reindexable SegmentRead Store
    """,
    "terrarium.stores.fs": "FsStore",
    "terrarium.stores.memory": "MemoryStore",
    "terrarium.stores.sqlite": "SqliteStore",
    "terrarium.stores.url": "open_store",
}
_NAMES = {name: module for module, names in _MODULES.items() for name in names.split()}

__all__ = sorted(_NAMES)

__getattr__, __dir__ = attach(__name__, _NAMES, __all__)
del annotations, TYPE_CHECKING, attach  # not part of the namespace
