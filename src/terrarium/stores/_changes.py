"""Where a store on a server keeps its derived index: a file on each machine that reads it.

A store with a change cursor (:class:`~.base.ChangeLog`: memory, SQLite, PostgreSQL) gives
the derived index (:mod:`terrarium.index`) only the path of its index file
(``index_source()``); the index reads the store through the cursor's protocol
(``index/_cursor.py``). PostgreSQL's file is in :func:`index_folder`, this machine's cache.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["INDEX_DIR_ENV", "index_folder"]

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
