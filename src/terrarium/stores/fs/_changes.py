"""All that ``FsStore``'s derived index (:mod:`terrarium.index`) reads of the files.

Writers leave a *dirty marker* per changed session (:func:`mark_dirty`), an empty file in
``.index/dirty``. The index claims the markers, reads each changed session's head and the bytes
its segments gained from an offset (a refresh after one append reads one line), and walks the
date folders when it rebuilds or one was moved by hand (:mod:`._shape`).

Appends mark at most once per ``MARK_EVERY`` seconds per open segment, so the append path stays
a lock, an ``fstat`` and a ``write``; the index watches a claimed session for longer than that.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from terrarium import codec
from terrarium.errors import IndexUnavailable, StoreError
from terrarium.model import SessionId
from terrarium.stores._files import listdir, make_dirs, scandir, write_to
from terrarium.stores.base import PodMetadata, SegmentStat
from terrarium.stores.fs import _shape
from terrarium.stores.fs._heads import head_of
from terrarium.stores.fs._layout import (
    HEAD,
    INDEX,
    SEGMENT_SUFFIX,
    check_inside,
    is_uuid,
    segment_name,
)
from terrarium.stores.fs._segments import one_line
from terrarium.stores.fs._states import frozen
from terrarium.stores.fs._tree import read_pointer
from terrarium.stores.fs.salvage import salvaged_into

#: An append marks its session at most this often per open segment (seconds).
MARK_EVERY = 5.0
_DIRTY = "dirty"
_CLAIMED = ".claimed-"


def dirty_dir(root: Path) -> Path:
    """Where writers leave dirty markers (IndexUnavailable if it leads out of the root)."""
    return check_inside(os.path.realpath(root), root / INDEX / _DIRTY, IndexUnavailable)


def mark_dirty(root: Path, session_id: SessionId) -> None:
    """Tell the search index that ``session_id`` changed: an empty file named after it. The
    mark follows the write it announces; a kill between the two leaves a write that
    ``refresh(full=True)`` or ``reindex()`` finds."""
    path = dirty_dir(root) / str(session_id)
    if os.path.exists(path):
        return
    try:
        write_to(path, b"", 0)
    except FileNotFoundError:
        make_dirs(path.parent)
        write_to(path, b"", 0)


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


class FsChanges:
    """The derived index's view of one root's files (:meth:`FsStore.index_source`). Every
    path it takes or gives is a folder relative to the root (``type/date/name``)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __repr__(self) -> str:
        return f"FsChanges({str(self.root)!r})"

    @property
    def index_dir(self) -> Path:
        """The store's ``.index`` folder, where the derived index keeps its database."""
        return self.root / INDEX

    def index_file(self, name: str) -> Path:
        """The path of ``name`` in ``.index``, refused (IndexUnavailable) out of the root."""
        return check_inside(os.path.realpath(self.root), self.root / INDEX / name, IndexUnavailable)

    def markers(self) -> list[str]:
        """The markers waiting, claimed ones too (IndexUnavailable: a link out of the root)."""
        return listdir(dirty_dir(self.root))

    def claim(self) -> list[tuple[str, Path]]:
        """Rename every marker to a claimed name (a writer marking meanwhile makes a fresh
        one); return (session id, claimed path) pairs, old claims included."""
        folder = dirty_dir(self.root)
        out = []
        for name in listdir(folder):
            sid, _, claim = name.partition(_CLAIMED)
            path = folder / name
            if not is_uuid(sid):
                path.unlink(missing_ok=True)
                continue
            if not claim:
                claimed = folder / f"{sid}{_CLAIMED}{uuid.uuid4().hex}"
                try:
                    os.rename(path, claimed)
                except FileNotFoundError:
                    continue
                path = claimed
            out.append((str(uuid.UUID(sid)), path))
        return out

    @staticmethod
    def release(claimed: Iterable[Path]) -> None:
        """Delete claimed markers once what they announced is committed to the index."""
        for path in claimed:
            path.unlink(missing_ok=True)

    def shape(self, known: str | None) -> _shape.ShapeChange:
        """The date folders moved in or out since shape ``known`` (None: all are new)."""
        return _shape.compare(self.root, _shape.load(known))

    def date_folders(self) -> Iterator[str]:
        """Every date folder, as ``type/date``."""
        for kind in _shape.type_folders(self.root):  # archived contexts are not searched here
            for date in scandir(kind.path):
                if date.is_dir(follow_symlinks=False):
                    yield f"{kind.name}/{date.name}"

    def count_sessions(self) -> int:
        """How many session folders the date folders hold (one ``scandir`` each)."""
        return sum(len(scandir(self.root / folder)) for folder in self.date_folders())

    def walk(
        self, date_folders: Iterable[str] | None = None
    ) -> Iterator[tuple[str, dict[str, SegmentStat]]]:
        """Every session folder (of ``date_folders`` if given), its segments; oldest write first."""
        found: list[tuple[float, str, dict[str, SegmentStat]]] = []
        for date_folder in self.date_folders() if date_folders is None else date_folders:
            path = self.root / date_folder
            if os.path.islink(path):
                continue  # never followed out of the root
            for session in scandir(path):
                if not session.is_dir(follow_symlinks=False):
                    continue
                entries = scandir(session.path)
                segments = _segments(entries)  # stats each segment once: DirEntry keeps it
                if segments or any(entry.name == HEAD for entry in entries):
                    times = [e.stat().st_mtime for e in entries if segment_name(e.name) in segments]
                    rel = f"{date_folder}/{session.name}"
                    found.append((max(times, default=0.0), rel, segments))
        for _, rel, segments in sorted(found, key=lambda item: (item[0], item[1])):
            yield rel, segments

    def pointer(self, session_id: str) -> str | None:
        """The session's folder per its ``.index/sessions`` pointer; None if lost or damaged."""
        with contextlib.suppress(OSError, StoreError):
            return read_pointer(self.root / INDEX / "sessions" / session_id)[0]
        return None

    def segments(self, folder: str) -> dict[str, SegmentStat]:
        """The segment files of a session folder (none if it is gone)."""
        return _segments(scandir(self.root / folder))

    def head(self, folder: str) -> tuple[PodMetadata | None, str | None]:
        """The folder's head as ``FsStore`` reads it, and what is wrong with it (a lost
        ``head.json`` is no problem); (None, problem) if there is none, (None, None) when the
        folder holds no segment either (a context being deleted)."""
        try:
            return head_of(self.root / folder, read_errors=True)
        except FileNotFoundError:
            return None, None
        except (StoreError, OSError) as exc:
            return None, one_line(exc)

    def frozen(self, session_id: str | SessionId) -> bool:
        """Whether the session is archived (frozen): out of the index."""
        return frozen(self.root, session_id)

    def salvaged(self, folder: str) -> set[str]:
        """The damaged segments of ``folder`` that a salvage replaced already."""
        return {str(s) for s in salvaged_into(self.root / folder)}

    def segment_path(self, folder: str, segment_id: str) -> str:
        """A segment file's path (for the problems that name it)."""
        return str(self.root / folder / f"{segment_id}{SEGMENT_SUFFIX}")

    def head_path(self, folder: str) -> str:
        """A session's ``head.json`` (for the problems that name it)."""
        return str(self.root / folder / HEAD)

    def stat_segment(self, folder: str, segment_id: str) -> SegmentStat | None:
        """The segment file's inode and size, or None if it is gone."""
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(self.segment_path(folder, segment_id))
            return SegmentStat(st.st_ino, st.st_size)
        return None

    def read_lines(
        self, folder: str, segment_id: str, offset: int, seq: int
    ) -> tuple[list[dict[str, Any]], int, int]:
        """The segment's complete lines from byte ``offset`` (line ``seq``) on, the offset
        after them and the file's size."""
        path = self.segment_path(folder, segment_id)
        data, size = read_from(Path(path), offset)
        complete, _ = codec.split_complete(data)
        if not complete:
            return [], offset, size
        lines = codec.decode_lines(complete, where=path, first_line=seq + 1)
        return lines, offset + len(complete), size


def _segments(entries: Iterable[os.DirEntry[str]]) -> dict[str, SegmentStat]:
    """The segment files among a session folder's entries, each with its inode and size."""
    found: dict[str, SegmentStat] = {}
    for entry in entries:
        segment_id = segment_name(entry.name)
        with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
            if segment_id is not None:
                st = entry.stat()
                found[segment_id] = SegmentStat(st.st_ino, st.st_size)
    return found
