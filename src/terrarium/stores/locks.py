"""A ``flock`` on a lock file: across threads and processes, freed if the holder dies.

``flock`` locks belong to an open file description, so two opens of the same path exclude each
other even within one process, and the kernel drops the lock when its holder exits.

A lock file whose context or session is gone is removed (:func:`remove_lock`), so a store
that purges keeps no file per name it ever held. Removal is safe because a taker checks, once
it holds the ``flock``, that the path still names the file it locked, and starts again if not:
whoever waited on a removed file goes on to the one made after it, never beside its holder.
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
    while True:
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
            if _names(path, fd):
                yield
                return
        finally:
            os.close(fd)  # closing releases the flock
        # Removed (and perhaps made again) while this waited: take the file there now.


def remove_lock(path: Path) -> bool:
    """Remove the lock file at ``path`` unless somebody holds it: it is taken without waiting
    and unlinked while held (whoever waits for it moves on to a new one). False if it is
    held, or not there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not _names(path, fd):
            return False
        path.unlink()
    except OSError:  # held (BlockingIOError), or a read-only store: the file stays, harmless
        return False
    finally:
        os.close(fd)
    return True


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (no link followed)."""
    try:
        there = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino)
