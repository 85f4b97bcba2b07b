"""Finding a context's folder: the index pointers, the date folders, and the root's bounds.

``.index/contexts/{type}/{name}`` and ``.index/sessions/{session}`` are derived pointers (a
small JSON record naming the folder and its context): resolving a context walks no date folders.
Every folder is checked to resolve inside the root before it is read, and a pointer must name
its own context's ``{type}/{date}/{name}`` folder: nothing leads terrarium out of its root.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec

from terrarium import codec
from terrarium.errors import CorruptLog, StoreError
from terrarium.model import ContextId, SessionId
from terrarium.stores._files import listdir
from terrarium.stores.base import PodMetadata
from terrarium.stores.fs._heads import folder_context, head_of
from terrarium.stores.fs._layout import (
    CANONICAL_UUID,
    DATE_RE,
    DETACHED,
    INDEX,
    check_inside,
    has_segments,
    real_dir,
)
from terrarium.stores.fs._segments import one_line, read_file
from terrarium.stores.fs._shape import type_folders

_MAX_CHECKED = 65_536  # folders whose place inside the root is remembered (see _inside)


class ContextFolder(msgspec.Struct, frozen=True):
    """A folder of the tree that holds a context's files, as a walk of the tree finds it."""

    context: ContextId
    folder: Path
    head: PodMetadata | None
    """Its head record (read, or rebuilt from the segments), or None if neither works."""
    problem: str | None = None
    """Why the head is not as stored: one line naming the file, or None when it is."""


class Tree:
    """The folders under one ``FsStore`` root, read from the files (this class writes none)."""

    def __init__(self, root: Path) -> None:
        """Read the tree at ``root`` (an absolute path to an existing folder)."""
        self.root = root
        self._real_root = os.path.realpath(root)
        self._prefix = str(root)
        self._inside_cache: set[str] = {self._prefix}

    def _index_file(self, context: ContextId) -> str:
        """``.index/contexts/{type}/{name}``, checked inside the root; a ``str``, since
        ``get_head`` takes it on every call and a ``Path`` costs microseconds."""
        types = self._checked(f"{self._prefix}/{INDEX}/contexts/{context.type}")
        return f"{types}/{context.encoded_name}"

    def _session_index_path(self, session_id: SessionId) -> Path:
        """``.index/sessions/{session}``, its folder checked to be inside the root."""
        return self._inside(self.root / INDEX / "sessions") / str(session_id)

    def detached_folder(self, session_id: SessionId) -> Path:
        """Where the detached session ``session_id`` lives (whether or not it is there)."""
        return self._inside(self.root / DETACHED / str(session_id))

    def detached(self) -> Iterator[tuple[SessionId, Path]]:
        """Every detached session (``.detached/{session}/`` with a segment), oldest first."""
        base = self.root / DETACHED
        if not real_dir(base):
            return
        self._inside(base)
        for name in sorted(listdir(base)):
            folder = base / name
            if CANONICAL_UUID.fullmatch(name) and real_dir(folder) and has_segments(folder):
                yield uuid.UUID(name), folder

    def _inside(self, folder: Path) -> Path:
        """``folder`` if it resolves inside the root (links and all), else refused; checked once."""
        self._checked(str(folder))
        return folder

    def _checked(self, folder: str) -> str:
        """:meth:`_inside` for a ``str`` path as ``str(Path)`` spells it."""
        if folder in self._inside_cache:
            return folder
        parent, name = os.path.split(folder)
        if name not in ("", ".", "..") and parent.startswith(self._prefix):
            # Under a folder found inside, only a link can lead out: one lstat for each part
            # not checked yet, where realpath takes one for every part of the path.
            self._checked(parent)
            if not os.path.islink(folder):  # missing: what is made there later is made inside
                return self._remember(folder)
        check_inside(self._real_root, folder)
        return self._remember(folder)

    def _remember(self, folder: str) -> str:
        if len(self._inside_cache) >= _MAX_CHECKED:
            self._inside_cache.clear()
        self._inside_cache.add(folder)
        return folder

    def indexed_folder(self, context: ContextId) -> Path | None:
        """The folder the index names for ``context``, or None; CorruptLog if the entry is
        unreadable or names another folder, StoreError if it leads out of the root."""
        with contextlib.suppress(FileNotFoundError):
            return Path(self._pointer_folder(self._index_file(context), context))
        return None

    def _pointer_folder(self, pointer: str | Path, context: ContextId | None) -> str:
        """The folder an index entry names, checked to be that context's folder in the root."""
        rel, named = read_pointer(pointer)
        try:
            owner = ContextId.parse(named) if context is None else context
        except ValueError:
            raise CorruptLog(f"{pointer}: names no valid context; run reindex") from None
        parts = rel.split("/")
        if (
            len(parts) != 3
            or parts[0] != owner.type
            or parts[2] != owner.encoded_name
            or not DATE_RE.fullmatch(parts[1])
        ):
            raise CorruptLog(
                f"{pointer}: names folder {rel!r}, which is not a folder of {owner}; "
                "run reindex to rebuild the index"
            )
        return self._checked(f"{self._prefix}/{parts[0]}/{parts[1]}/{parts[2]}")

    def _find_folder(self, context: ContextId) -> ContextFolder | None:
        """``context`` in its date folders; of two, the last active (``fsck`` reports the other)."""
        type_dir = self.root / context.type
        if not real_dir(type_dir):
            return None
        found = [
            entry
            for date in sorted(listdir(type_dir))
            if DATE_RE.fullmatch(date) and real_dir(type_dir / date)
            for entry in [self._context_folder(context, type_dir / date / context.encoded_name)]
            if entry is not None
        ]
        return max(found, key=activity) if found else None

    def _context_folder(self, context: ContextId, folder: str | Path) -> ContextFolder | None:
        """``folder`` as the context's, if it is one (not if its head names another context: a
        case-insensitive disk), with its problem if its head is damaged."""
        self._checked(str(folder))  # before reading anything in it
        try:
            head, problem = head_of(folder)
        except FileNotFoundError:
            return None  # no head.json and no segment: not a context folder
        except CorruptLog as exc:
            return ContextFolder(context, Path(folder), None, str(exc))
        if head.context != str(context):
            return None
        return ContextFolder(context, Path(folder), head, problem)

    def walk(self) -> Iterator[ContextFolder]:
        """Every context folder of the tree in ``{type}/{date}/{name}`` order, from the files."""
        for kind in sorted(entry.name for entry in type_folders(self.root)):
            for date in sorted(listdir(self.root / kind)):
                if not DATE_RE.fullmatch(date) or not real_dir(self.root / kind / date):
                    continue
                for encoded in sorted(listdir(self.root / kind / date)):
                    folder = self.root / kind / date / encoded
                    name = folder_context(folder)  # None: not a name this store writes
                    if name is None:
                        continue
                    context = ContextId.parse(name)
                    try:
                        entry = self._context_folder(context, folder)
                    except StoreError as exc:  # a link out of the root, say: reported
                        entry = ContextFolder(context, folder, None, str(exc))
                    if entry is not None:
                        yield entry


def activity(entry: ContextFolder) -> str:
    """When a walked folder's context was last active (a damaged one ranks last)."""
    return entry.head.updated_at if entry.head is not None else ""


def pointer(context: ContextId, rel: str) -> bytes:
    """An index entry: the folder (relative to the root) holding ``context``."""
    return codec.encode({"path": rel, "context": str(context)})


def read_pointer(path: str | Path) -> tuple[str, str]:
    """Read an index entry; return the folder it names (relative to the root) and context."""
    raw = read_file(path)
    try:
        record = codec.decode(raw)
        folder, context = record["path"], record.get("context", "")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        folder, context = exc, ""
    if not isinstance(folder, str) or not folder or not isinstance(context, str):
        reason = one_line(folder) if isinstance(folder, Exception) else "no folder named"
        raise CorruptLog(f"{path}: not a valid index entry ({reason}); run reindex to rebuild it")
    return folder, context
