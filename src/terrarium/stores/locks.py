"""An exclusive ``flock`` on a lock file: across threads and processes, freed if the holder dies.

``flock`` locks belong to an open file description, so two opens of the same path exclude each
other even within one process, and the kernel drops the lock when its holder exits.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from terrarium.stores._files import make_dirs, open_private


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created, with its folders, if missing)."""
    make_dirs(path.parent)
    fd = open_private(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock
