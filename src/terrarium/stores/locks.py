"""A ``flock`` on a lock file: across threads and processes, freed if the holder dies.

``flock`` locks belong to an open file description, so two opens of the same path exclude each
other even within one process, and the kernel drops the lock when its holder exits.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from terrarium.errors import StoreError
from terrarium.stores._files import make_dirs, open_private


@contextmanager
def file_lock(path: Path, kind: int = fcntl.LOCK_EX, *, create: bool = True) -> Iterator[None]:
    """Hold ``flock`` ``kind`` on ``path`` (created, with its folders, if missing; StoreError if
    it is a link). Without ``create``, no lock if the file cannot be opened (a read-only
    store, where nothing moves)."""
    try:
        if create:
            make_dirs(path.parent)
            fd = open_private(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW)
        else:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if create and exc.errno == errno.ELOOP:  # never a lock on the file a link names
            raise StoreError(f"{path}: a link, which terrarium does not follow") from None
        if create:
            raise
        yield
        return
    try:
        fcntl.flock(fd, kind)
        yield
    finally:
        os.close(fd)  # closing releases the flock
