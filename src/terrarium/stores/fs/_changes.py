"""What ``FsStore``'s derived index (:mod:`terrarium.index`) reads of the files, kept in the store.

Writers leave a *dirty marker* per changed session (:func:`mark_dirty`): an empty file named
after it in ``.index/dirty``. The index claims the markers, reads each changed session's head
(:func:`folder_head`) and the bytes its segments gained (:func:`read_from`, from a byte offset,
so a refresh after one append reads one line), and walks the date folders (:func:`scandir`)
when it rebuilds or when a date folder was moved by hand (:mod:`._shape`).

Appends mark at most once per ``MARK_EVERY`` seconds per open segment, so the append path stays
a lock, an ``fstat`` and a ``write``; the index watches a claimed session for longer than that.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from terrarium.errors import IndexUnavailable, StoreError
from terrarium.model import SessionId
from terrarium.stores._files import make_dirs, open_private
from terrarium.stores.base import PodMetadata
from terrarium.stores.fs._heads import head_of
from terrarium.stores.fs._layout import INDEX, check_inside

__all__ = ["MARK_EVERY", "dirty_dir", "folder_head", "mark_dirty", "read_from", "scandir"]

#: An append marks its session at most this often per open segment (seconds).
MARK_EVERY = 5.0
_DIRTY = "dirty"


def dirty_dir(root: Path) -> Path:
    """Where writers leave dirty markers.

    Raises:
        IndexUnavailable: it leads out of the root (a link): the callers answer from the files.
    """
    return check_inside(os.path.realpath(root), root / INDEX / _DIRTY, IndexUnavailable)


def mark_dirty(root: Path, session_id: SessionId) -> None:
    """Tell the search index that ``session_id`` changed: an empty file named after it.

    Creating a context or segment, moving a head and deleting a context always mark the
    session; an append marks it at most once per ``MARK_EVERY`` seconds per open segment (a
    ``stat``, and an ``open`` when the marker is missing), so the append path stays a lock, an
    ``fstat`` and a ``write``. The mark follows the write, so it never precedes data it
    announces; a process killed between the two leaves a write that ``refresh(full=True)`` or
    ``reindex()`` finds, as they find writes that bypass ``FsStore`` (a restored backup).
    """
    path = dirty_dir(root) / str(session_id)
    try:
        os.stat(path)
        return
    except FileNotFoundError:
        pass
    try:
        fd = open_private(path, os.O_WRONLY | os.O_CREAT)
    except FileNotFoundError:
        make_dirs(path.parent)
        fd = open_private(path, os.O_WRONLY | os.O_CREAT)
    os.close(fd)


def read_from(path: Path, offset: int) -> tuple[bytes, int]:
    """The bytes of ``path`` from ``offset`` on, and its size, read under a shared lock."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # never read a write in progress
        size = os.fstat(fd).st_size
        chunks = []
        position = offset
        while position < size:
            chunk = os.pread(fd, size - position, position)
            if not chunk:
                break
            chunks.append(chunk)
            position += len(chunk)
        return b"".join(chunks), size
    finally:
        os.close(fd)  # closing releases the lock


def folder_head(folder: Path) -> tuple[PodMetadata | None, str | None]:
    """The head record of a session folder, as FsStore reads it, and what is wrong with it.

    A missing ``head.json`` is rebuilt from the segments (no problem: the head is derived);
    an unreadable or invalid one, or one naming a segment that is not there, is rebuilt too,
    and the problem names it. Returns (None, problem) when no head can be found or rebuilt,
    the problem None when the folder holds no segment either (a context being deleted).
    """
    try:
        return head_of(folder, read_errors=True)
    except FileNotFoundError:
        return None, None
    except (StoreError, OSError) as exc:
        return None, " ".join(str(exc).split())


def scandir(path: str | Path) -> list[os.DirEntry[str]]:
    """The entries of ``path``; none if it is missing or not a folder."""
    try:
        with os.scandir(path) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []
