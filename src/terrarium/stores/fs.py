"""``FsStore``: sessions as plain JSONL files that ``tar`` backs up and ``grep`` reads.

Layout under the root (``./sessions`` by default)::

    cli/2026-11-22/main/              one folder per context; the date is its creation (UTC)
        019a5f...e1.jsonl             root segment: header line, then one entry per line
        019a60...7c.jsonl             a fork, compaction or clear of it
        019a60...7c.trace.jsonl       optional debug trace of raw stream events
        019a60...7c.jsonl.torn-4096   bytes of a torn tail, set aside (offset in the name;
                                      ``.2``, ``.3``... added if that offset tore before)
        head.json                     which segment the context is on; replaced atomically
    .index/contexts/cli/main          context -> folder: resolving a context walks no dates
    .index/sessions/{session uuid}    session -> folder
    .locks/turn/cli/main              per-context lock for callers (a manager's turn)
    .locks/head/cli/main              per-context lock for create, delete, head moves
    .trash/                           folders being deleted; the next delete clears leftovers
    .trash/legacy/                    deleted legacy JSON files (terrarium.legacy); kept
    .index/search.db                  full-text search and listing index (derived)
    .index/dirty/{session uuid}       "this session changed" markers for that index

Names are encoded with :func:`terrarium.model.encode_name`, so no context name can escape the
root, and safe names (``#python``) stay readable. Every file is created ``0600`` and every
folder ``0700`` (:mod:`terrarium.stores._files`).

**The segments are the truth; everything else is derived.** ``.index/`` is rebuilt from the
folders (``reindex()``), and a context whose index entry is missing is found by looking in its
type's date folders before it is ever taken to be new. ``head.json`` is derived too: a folder
without one (a power cut in ``flush`` mode, a partial restore from a backup) has its head
rebuilt from its segments by :func:`head_from_segments` (the newest segment, by UUIDv7, whose
chain of headers is intact). A read rebuilds it in memory only; a write to the context, a
``reindex()`` and ``terrarium fsck --repair`` write it. Nothing ever removes a folder that holds
segments except ``delete_context``.

**Reads never write.** Reading a segment changes no byte of any file: a torn tail is reported
(:class:`~terrarium.model.TornTail` with ``set_aside_to=None``) and skipped; the next append to
that segment, or :meth:`FsStore.set_aside_torn_tail` (``fsck --repair``), sets it aside.

**Nothing outside the root.** Every folder is checked to resolve inside the root before it is
used, index entries must name the ``{type}/{date}/{name}`` folder of their own context, and
files are opened with ``O_NOFOLLOW``: a symbolic link inside the store is refused, never
followed.

**Appends.** Each append is one ``write(2)`` of whole lines to a file opened ``O_APPEND``, made
under an exclusive ``flock`` on that file: writers in many processes never interleave inside a
line, and the lock makes the ``expected_seq`` check and the write one step. The lines of a
multi-entry append are framed by :func:`terrarium.codec.encode_lines` (all but the last end in
``" \\n"``), so a crash after some of its lines leaves a torn tail like any other. The writer
keeps the file's size and next seq from its last append; when another process has appended
since (the size differs), it re-reads only the file's last line. File descriptors are cached
(LRU), so an append costs a lock, an ``fstat`` and a ``write``. A new segment appears whole
(written beside it, then hard-linked into place), never empty or with half a header.

**Durability.** ``durability="flush"`` (the default) hands each append to the kernel before
acknowledging it: it survives the death of the process (``kill -9``), not a power cut, at the
cost of a write (~3 µs). ``"fsync"`` adds an ``fdatasync`` per append (~135 µs here) and
survives power loss. ``"batch"`` acknowledges at once and ``fdatasync``s dirty segments every
``batch_interval`` seconds from a background thread: a power cut loses at most that window.
New files, heads and index entries are fsynced (with their folders) in ``fsync`` and ``batch``
modes, which promise to survive a power cut; ``flush`` does not promise that, and a head it
loses to one is rebuilt from the segments.

**Search.** :meth:`FsStore.search` and :meth:`FsStore.list_contexts_fast` read a derived SQLite
FTS5 index that is brought up to date on use; writers only leave a marker file per changed
session (see :mod:`terrarium.stores.fs_search`).

**Torn tails.** A writer killed mid-``write`` (or a full disk) can leave bytes after the last
complete append (:func:`terrarium.codec.split_complete`). A writer that finds them copies them
to ``{segment}.jsonl.torn-{offset}`` and truncates them away under the file's lock (and logs
it) before it appends. A short write is rolled back by the writer itself before it raises. A
segment whose header line is incomplete is damaged, not torn: it is reported, never moved.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import math
import mmap
import os
import re
import shutil
import stat
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from terrarium import codec
from terrarium.errors import (
    ConflictError,
    ContextExists,
    ContextNotFound,
    CorruptLog,
    SegmentNotFound,
    StoreError,
)
from terrarium.model import (
    ContextId,
    SegmentId,
    SessionId,
    TornTail,
    TraceEntry,
    decode_name,
    new_segment_id,
    new_session_id,
    utc_now,
)
from terrarium.stores import _db, fs_search
from terrarium.stores._files import (
    link_free,
    listdir,
    make_dirs,
    open_private,
    write_all,
    write_atomic,
    write_beside,
    write_new,
)
from terrarium.stores.base import (
    ContextSummary,
    NewEntry,
    PodMetadata,
    SearchHit,
    SearchQuery,
    SegmentRead,
    header_line,
    iter_lines,
)
from terrarium.stores.locks import file_lock

log = logging.getLogger(__name__)

Durability = Literal["flush", "fsync", "batch"]
DURABILITIES: tuple[str, ...] = ("flush", "fsync", "batch")

_INDEX = ".index"
_LOCKS = ".locks"
_TRASH = ".trash"
LEGACY_TRASH = Path(_TRASH, "legacy")
"""Where deleted legacy JSON files wait (:func:`terrarium.legacy.trash`); never emptied."""
_HEAD = "head.json"
_SEGMENT_SUFFIX = ".jsonl"
_TRACE_SUFFIX = ".trace.jsonl"
_MAX_OPEN = 256
_MAX_CHECKED = 65_536  # folders whose place inside the root is remembered (see _inside)
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class _Open:
    """A cached writable descriptor and what this process last knew of the file."""

    fd: int
    session_id: SessionId
    size: int = -1
    next_seq: int = -1
    dirty: bool = False
    marked: float = -math.inf
    """When an append last left the search index's dirty marker (monotonic seconds)."""


@dataclass(frozen=True, slots=True)
class Salvage:
    """What :meth:`FsStore.salvage_segment` did."""

    segment_id: SegmentId
    """The damaged segment (left as it was)."""
    new_segment_id: SegmentId
    """The segment holding every entry of it that could be read."""
    kept: int
    """Entries copied into the new segment."""
    set_aside: list[int]
    """Line numbers of the damaged segment whose bytes went to ``side_file``."""
    side_file: str | None
    """Where the bytes that could not be read were copied."""
    copies: dict[SegmentId, SegmentId]
    """Forks of the damaged segment (and theirs), each copied onto the new one: old -> new."""
    head: SegmentId | None
    """Where the head moved, if it was on the damaged segment or one of its forks."""


@dataclass(frozen=True, slots=True)
class ContextFolder:
    """A folder of the tree that holds a context's files, as a walk of the tree finds it."""

    context: ContextId
    folder: Path
    head: PodMetadata | None
    """Its head record (read, or rebuilt from the segments), or None if neither works."""
    problem: str | None = None
    """Why the head is not as stored: one line naming the file, or None when it is."""


class FsStore:
    """A store of plain files under one root directory (see the module docstring)."""

    def __init__(
        self,
        root: str | os.PathLike[str] = "./sessions",
        *,
        durability: Durability = "flush",
        batch_interval: float = 0.05,
    ) -> None:
        """Open (creating if needed) the store at ``root``.

        Args:
            root: the sessions directory.
            durability: ``flush`` (default), ``fsync`` or ``batch``; see the module docstring.
            batch_interval: seconds between background syncs when ``durability="batch"``.
        """
        if durability not in DURABILITIES:
            raise ValueError(f"unknown durability {durability!r}: use one of {DURABILITIES}")
        self.root = Path(root).absolute()
        self.durability = durability
        self.batch_interval = batch_interval
        make_dirs(self.root)
        self._real_root = os.path.realpath(self.root)
        self._inside_cache: set[Path] = set()
        self._lock = threading.RLock()
        self._open: OrderedDict[SegmentId, _Open] = OrderedDict()
        self._folders: dict[SessionId, Path] = {}
        self._closed = threading.Event()
        self._search: fs_search.SearchIndex | None = None
        self._flusher: threading.Thread | None = None
        if durability == "batch":
            self._flusher = threading.Thread(target=self._flush_loop, daemon=True)
            self._flusher.start()

    def __repr__(self) -> str:
        return f"FsStore({str(self.root)!r}, durability={self.durability!r})"

    # ---------------------------------------------------------------- paths

    def _index_path(self, context: ContextId) -> Path:
        return self.root / _INDEX / "contexts" / context.type / context.encoded_name

    def _session_index_path(self, session_id: SessionId) -> Path:
        return self.root / _INDEX / "sessions" / str(session_id)

    def _inside(self, folder: Path) -> Path:
        """Return ``folder`` if it resolves inside the root (links and all); else refuse.

        Checks that succeed are remembered: a folder of the tree is checked once a process.
        """
        if folder in self._inside_cache:
            return folder
        real = os.path.realpath(folder)
        if real != self._real_root and not real.startswith(self._real_root + os.sep):
            raise StoreError(
                f"{folder} leads outside the store (to {real}): terrarium never follows a "
                "link out of its root"
            )
        if len(self._inside_cache) >= _MAX_CHECKED:
            self._inside_cache.clear()
        self._inside_cache.add(folder)
        return folder

    def _sync(self) -> bool:
        """Whether this durability mode fsyncs new files, heads and index entries."""
        return self.durability != "flush"

    def folder_of(self, context: ContextId) -> Path | None:
        """The folder holding the context's files, or None if the context does not exist."""
        found = self._locate(context)
        return found.folder if found is not None else None

    def _locate(self, context: ContextId) -> ContextFolder | None:
        """Find the context's folder and head.

        Reads the index; where it has no entry (or a stale or invalid one), looks for the
        folder in the type's date folders, and re-indexes what it finds, so a lost index
        never makes a context look new.
        """
        try:
            folder = self._pointer_folder(self._index_path(context), context)
        except FileNotFoundError:
            pass
        except StoreError as exc:
            log.warning("%s", exc)
        else:
            found = self._context_folder(context, folder.parent)
            if found is not None:
                return found
        found = self._find_folder(context)
        if found is not None:
            self._index_best_effort(context, found.folder, found.head)
        return found

    def indexed_folder(self, context: ContextId) -> Path | None:
        """The folder the index names for ``context`` (None if it names none); reads only.

        Raises:
            CorruptLog: the index entry is unreadable or names a folder not the context's.
            StoreError: that folder leads outside the root.
        """
        try:
            return self._pointer_folder(self._index_path(context), context)
        except FileNotFoundError:
            return None

    def _pointer_folder(self, pointer: Path, context: ContextId | None) -> Path:
        """The folder an index entry names, checked to be that context's folder in the root."""
        rel, named = _read_pointer(pointer)
        try:
            owner = ContextId.parse(named) if context is None else context
        except ValueError:
            raise CorruptLog(f"{pointer}: names no valid context; run reindex") from None
        parts = rel.split("/")
        if (
            len(parts) != 3
            or parts[0] != owner.type
            or parts[2] != owner.encoded_name
            or not _DATE_RE.fullmatch(parts[1])
        ):
            raise CorruptLog(
                f"{pointer}: names folder {rel!r}, which is not a folder of {owner}; "
                "run reindex to rebuild the index"
            )
        return self._inside(self.root.joinpath(*parts))

    def _find_folder(self, context: ContextId) -> ContextFolder | None:
        """Look for ``context`` in its type's date folders (when the index has no entry).

        Two folders can hold one context only if an older terrarium split it after losing its
        index; the most recently active one is taken and ``fsck`` reports the other.
        """
        type_dir = self.root / context.type
        if not _real_dir(type_dir):
            return None
        found = [
            entry
            for date in sorted(listdir(type_dir))
            if _DATE_RE.fullmatch(date) and _real_dir(type_dir / date)
            for entry in [self._context_folder(context, type_dir / date)]
            if entry is not None
        ]
        if not found:
            return None
        return max(found, key=lambda e: e.head.updated_at if e.head is not None else "")

    def _context_folder(self, context: ContextId, parent: Path) -> ContextFolder | None:
        """``parent/{name}`` as the context's folder, if it is one (a folder, not a link).

        A folder whose head names another context (``cli:Main`` on a case-insensitive disk
        where ``cli:main`` lives) is not this context's. A folder whose head can be neither
        read nor rebuilt is returned with its problem: it is damaged, not missing.
        """
        folder = self._inside(parent / context.encoded_name)  # before reading anything in it
        try:
            head, problem = self._head_in(folder, context)
        except FileNotFoundError:
            return None  # no head.json and no segment: not a context folder
        except CorruptLog as exc:
            return ContextFolder(context, folder, None, str(exc))
        if head.context != str(context):
            return None
        return ContextFolder(context, folder, head, problem)

    def _index_best_effort(
        self, context: ContextId, folder: Path, head: PodMetadata | None
    ) -> None:
        """Index a context found in the folders: derived state, so failing to is no error.

        If the whole index is gone, all of it is rebuilt (heads are not written: a read never
        writes a head); else this context's entries are.
        """
        try:
            if not (self.root / _INDEX / "contexts").is_dir():
                self._rebuild_index(write_heads=False)
            elif head is not None:
                self._write_index(context, head.session_id, folder.relative_to(self.root))
        except OSError as exc:  # a read-only store: the walk works, the index stays stale
            log.debug("could not index %s: %s", context, exc)

    def _session_folder(self, session_id: SessionId) -> Path:
        folder = self._folders.get(session_id)
        if folder is not None:
            return folder
        try:
            folder = self._pointer_folder(self._session_index_path(session_id), None)
        except FileNotFoundError:
            folder = None
        if folder is None or not _holds_context(folder):
            folder = self._find_session(session_id)
        self._folders[session_id] = folder
        return folder

    def _find_session(self, session_id: SessionId) -> Path:
        """Walk the tree for the folder of ``session_id`` (its index entry is lost)."""
        for entry in self.walk():
            if entry.head is not None and entry.head.session_id == session_id:
                self._index_best_effort(entry.context, entry.folder, entry.head)
                return entry.folder
        raise SegmentNotFound(f"session {session_id} does not exist")

    def _segment_path(self, session_id: SessionId, segment_id: SegmentId) -> Path:
        return self._session_folder(session_id) / f"{segment_id}{_SEGMENT_SUFFIX}"

    def walk(self) -> Iterator[ContextFolder]:
        """Every context folder of the tree, read from the files (not the index).

        Folders are visited in ``{type}/{date}/{name}`` order; links are never followed.
        What is not a context folder (legacy ``.json`` files, stray files) is skipped.
        """
        for kind in sorted(listdir(self.root)):
            if kind.startswith(".") or not _real_dir(self.root / kind):
                continue
            for date in sorted(listdir(self.root / kind)):
                if not _DATE_RE.fullmatch(date) or not _real_dir(self.root / kind / date):
                    continue
                for encoded in sorted(listdir(self.root / kind / date)):
                    try:
                        context = ContextId(kind, decode_name(encoded))
                    except ValueError:
                        continue
                    if context.encoded_name != encoded:
                        continue  # not a name this store writes
                    try:
                        entry = self._context_folder(context, self.root / kind / date)
                    except StoreError as exc:  # a link out of the root, say: reported
                        folder = self.root / kind / date / encoded
                        entry = ContextFolder(context, folder, None, str(exc))
                    if entry is not None:
                        yield entry

    # ---------------------------------------------------------------- heads

    def get_head(self, context: ContextId) -> PodMetadata | None:
        """Return the context's head record, or None.

        A missing or unreadable ``head.json`` is rebuilt from the segments, in memory only.

        Raises:
            CorruptLog: the head cannot be read and no segment chain is intact to rebuild it.
        """
        found = self._locate(context)
        if found is None:
            return None
        if found.head is None:
            raise CorruptLog(found.problem or f"{found.folder}: damaged")
        if found.problem is not None:
            log.warning("%s", found.problem)
        self._folders.setdefault(found.head.session_id, found.folder)
        return found.head

    def _head_in(self, folder: Path, context: ContextId) -> tuple[PodMetadata, str | None]:
        """The head of ``folder``, and why it was rebuilt if ``head.json`` is unreadable.

        Raises:
            FileNotFoundError: ``folder`` holds neither a ``head.json`` nor a segment.
            CorruptLog: the head can be neither read nor rebuilt.
        """
        path = folder / _HEAD
        try:
            head = _read_head(path)
            if (folder / f"{head.segment_id}{_SEGMENT_SUFFIX}").exists():
                return head, None
            problem = f"{path}: names segment {head.segment_id}, which is not there"
        except (FileNotFoundError, NotADirectoryError):
            if not _real_dir(folder) or not _segment_ids(folder):
                raise FileNotFoundError(f"{folder} holds no context") from None
            return head_from_segments(folder), None
        except (CorruptLog, StoreError) as exc:
            problem = str(exc)
        try:
            return head_from_segments(folder), f"{problem}; rebuilt from the segments"
        except CorruptLog as exc:
            raise CorruptLog(f"{problem}; and it cannot be rebuilt: {exc}") from None

    def _persist_head(self, folder: Path, context: ContextId) -> PodMetadata:
        """Read the head, writing it back if it had to be rebuilt. Hold the head lock."""
        head, problem = self._head_in(folder, context)
        path = folder / _HEAD
        if problem is not None or not path.exists():
            self._write_head(path, head, unreadable=problem is not None)
            log.warning("%s: rebuilt from the segments (head is %s)", path, head.segment_id)
        return head

    def _write_head(self, path: Path, head: PodMetadata, *, unreadable: bool) -> None:
        """Replace ``head.json``; an unreadable one is first set aside, never lost."""
        if unreadable and path.exists():
            _set_aside(path, "unreadable")
        write_atomic(path, codec.encode(_head_dict(head)), sync=self._sync())

    def set_head(
        self, context: ContextId, segment_id: SegmentId, *, expected: SegmentId
    ) -> PodMetadata:
        """Move the head if it is ``expected`` now (compare-and-set under the context lock)."""
        with self._head_lock(context):
            folder = self.folder_of(context)
            if folder is None:
                raise ContextNotFound(f"context {context} does not exist")
            head, problem = self._head_in(folder, context)
            if head.segment_id != expected:
                raise ConflictError(
                    f"head of {context} is {head.segment_id}, not {expected}: it moved"
                )
            if not (folder / f"{segment_id}{_SEGMENT_SUFFIX}").exists():
                raise SegmentNotFound(f"segment {segment_id} is not in {context}'s session")
            new = PodMetadata(head.context, head.session_id, segment_id, head.created_at, utc_now())
            self._write_head(folder / _HEAD, new, unreadable=problem is not None)
            self._mark(head.session_id)
            return new

    def rebuild_head(self, context: ContextId) -> PodMetadata:
        """Write the context's ``head.json`` from its segments if it is missing or unreadable.

        An unreadable one is first set aside (``head.json.unreadable-{n}``), never deleted.

        Raises:
            ContextNotFound: no folder holds the context.
            CorruptLog: no segment chain is intact to rebuild it from.
        """
        with self._head_lock(context):
            folder = self.folder_of(context)
            if folder is None:
                raise ContextNotFound(f"context {context} does not exist")
            return self._persist_head(folder, context)

    def list_contexts(self, type: str | None = None) -> list[PodMetadata]:
        """Every head record, sorted by context id (reads the index, walks no date folders).

        When the index is gone, the tree is walked instead (and the index rebuilt if the store
        is writable); a head that cannot be read or rebuilt is logged and left out.
        """
        base = self.root / _INDEX / "contexts"
        if not base.is_dir():
            try:
                self._rebuild_index(write_heads=False)
            except OSError:  # a read-only store: read the folders themselves
                return self._walked_heads(type)
        types = [type] if type is not None else sorted(listdir(base))
        heads: list[PodMetadata] = []
        for kind in types:
            for encoded in sorted(listdir(base / kind)):
                try:
                    context = ContextId(kind, decode_name(encoded))
                    head = self.get_head(context)
                except ValueError:
                    continue
                except (CorruptLog, StoreError) as exc:
                    log.warning("%s", exc)
                    continue
                if head is not None:
                    heads.append(head)
        return sorted(heads, key=lambda h: ContextId.parse(h.context))

    def _walked_heads(self, type: str | None) -> list[PodMetadata]:
        heads: dict[ContextId, PodMetadata] = {}
        for entry in self.walk():
            if type is not None and entry.context.type != type:
                continue
            if entry.head is None:
                log.warning("%s", entry.problem)
            elif entry.context not in heads or heads[entry.context].updated_at < (
                entry.head.updated_at
            ):
                heads[entry.context] = entry.head
        return [heads[context] for context in sorted(heads)]

    # ---------------------------------------------------------------- contexts

    def lock_context(self, context: ContextId) -> AbstractContextManager[None]:
        """Hold the context's lock exclusively (threads and processes alike).

        This is the callers' lock (the manager holds it for a whole turn). The store's own
        create, delete and head moves take a separate, brief lock, so they work inside it.
        """
        return self._file_lock("turn", context)

    def _head_lock(self, context: ContextId) -> AbstractContextManager[None]:
        return self._file_lock("head", context)

    def _file_lock(self, kind: str, context: ContextId) -> AbstractContextManager[None]:
        folder = self._inside(self.root / _LOCKS / kind / context.type)
        make_dirs(folder)
        return file_lock(folder / context.encoded_name)

    def create_context(self, context: ContextId, header: Mapping[str, Any]) -> PodMetadata:
        """Create the context's folder, root segment, head and index entries.

        A folder that already holds the context (whether or not the index knows it, whether
        or not it has a ``head.json``) is never replaced: its head is rebuilt if needed, it is
        indexed, and ``ContextExists`` is raised.
        """
        line = header_line(header)
        session_id = uuid.UUID(str(line["session_id"]))
        segment_id = uuid.UUID(str(line["segment_id"]))
        created = str(line["ts"])
        data = codec.encode_line(line)  # refuses a bad header before anything is made
        with self._head_lock(context):
            existing = self.folder_of(context)
            if existing is not None:
                self._adopt(context, existing)
            rel = Path(context.type) / created[:10] / context.encoded_name
            folder = self._inside(self.root / rel)
            if _holds_context(folder):  # another context's: a case-insensitive disk
                raise ContextExists(f"context {context} would share {folder} with another")
            make_dirs(folder)
            self._write_new(folder / f"{segment_id}{_SEGMENT_SUFFIX}", data)
            head = PodMetadata(str(context), session_id, segment_id, created, created)
            write_atomic(folder / _HEAD, codec.encode(_head_dict(head)), sync=self._sync())
            self._write_index(context, session_id, rel)
            self._folders[session_id] = folder
            self._mark(session_id)
            return head

    def _adopt(self, context: ContextId, folder: Path) -> None:
        """A create found the context's folder: write its head if lost, index it, refuse."""
        try:
            head = self._persist_head(folder, context)
        except CorruptLog as exc:
            raise ContextExists(
                f"context {context} already exists but is damaged ({exc}); "
                "run 'terrarium fsck' to see what is wrong"
            ) from None
        self._write_index(context, head.session_id, folder.relative_to(self.root))
        raise ContextExists(f"context {context} already exists (in {folder})")

    def _write_index(self, context: ContextId, session_id: SessionId, rel: Path) -> None:
        pointer = codec.encode({"path": rel.as_posix(), "context": str(context)})
        for path in (self._session_index_path(session_id), self._index_path(context)):
            make_dirs(self._inside(path.parent))
            write_atomic(path, pointer, sync=self._sync())

    def delete_context(self, context: ContextId) -> bool:
        """Delete the context: its index entries first, then its folder via ``.trash``.

        A context whose head cannot be read or rebuilt (a damaged folder) is deleted too.
        """
        with self._head_lock(context):
            folder = self.folder_of(context)
            if folder is None:
                return False
            try:
                session_id: SessionId | None = self._head_in(folder, context)[0].session_id
            except CorruptLog:
                session_id = None
            with self._lock:
                for segment_id, handle in list(self._open.items()):
                    if handle.session_id == session_id:
                        self._forget(segment_id)
                if session_id is not None:
                    self._folders.pop(session_id, None)
            self._index_path(context).unlink(missing_ok=True)
            if session_id is not None:
                self._session_index_path(session_id).unlink(missing_ok=True)
            self._trash(folder)
            if session_id is not None:
                self._mark(session_id)
            return True

    def _trash(self, folder: Path) -> None:
        trash_dir = self._inside(self.root / _TRASH)
        make_dirs(trash_dir)
        self._inside(folder)
        trash = trash_dir / uuid.uuid4().hex
        os.rename(folder, trash)
        # Also what a process killed mid-delete left (another deleter may share the work).
        for leftover in listdir(trash_dir):
            if leftover != LEGACY_TRASH.name:
                shutil.rmtree(trash_dir / leftover, ignore_errors=True)

    # ---------------------------------------------------------------- segments

    def create_segment(self, session_id: SessionId, header: Mapping[str, Any]) -> None:
        """Write a new segment file holding only its header.

        If the session's ``head.json`` is missing, it is rebuilt first: the new segment is
        the newest, and a head rebuilt after it would wrongly move onto it.
        """
        line = header_line(header)
        folder = self._session_folder(session_id)
        if not (folder / _HEAD).exists():
            with contextlib.suppress(CorruptLog, ValueError):
                context = ContextId.parse(head_from_segments(folder).context)
                with self._head_lock(context):
                    self._persist_head(folder, context)
        path = folder / f"{uuid.UUID(str(line['segment_id']))}{_SEGMENT_SUFFIX}"
        try:
            self._write_new(path, codec.encode_line(line))
        except FileExistsError:
            raise ConflictError(f"segment {line['segment_id']} already exists") from None
        self._mark(session_id)

    def append(
        self,
        session_id: SessionId,
        segment_id: SegmentId,
        entries: Sequence[NewEntry],
        *,
        expected_seq: int | None = None,
    ) -> int:
        """Append whole lines with one ``write`` under the segment's lock."""
        with self._lock:
            handle = self._handle(session_id, segment_id)
            fd = handle.fd
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                st = os.fstat(fd)
                if st.st_nlink == 0:
                    raise SegmentNotFound(f"segment {segment_id} was deleted")
                if st.st_size != handle.size:
                    handle.size, handle.next_seq, _ = self._scan_tail(session_id, segment_id, fd)
                first = handle.next_seq
                if expected_seq is not None and expected_seq != first:
                    raise ConflictError.stale_seq(segment_id, first, expected_seq)
                data = codec.encode_lines(list(iter_lines(entries, first)))
                self._write_all(fd, data, handle.size, segment_id)
                if self.durability == "fsync":
                    os.fdatasync(fd)
                elif self.durability == "batch":
                    handle.dirty = True
                handle.size += len(data)
                handle.next_seq = first + len(entries)
                if time.monotonic() - handle.marked >= fs_search.MARK_EVERY:
                    self._mark(session_id)
                    handle.marked = time.monotonic()
                return first
            except SegmentNotFound:
                self._forget(segment_id)  # closing the descriptor releases its lock
                raise
            finally:
                if segment_id in self._open:
                    fcntl.flock(fd, fcntl.LOCK_UN)

    def _write_all(self, fd: int, data: bytes, size: int, segment_id: SegmentId) -> None:
        """Write ``data`` fully or roll the file back to ``size`` and raise."""
        try:
            write_all(fd, data)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise StoreError(f"append to segment {segment_id} failed: {_os_reason(exc)}") from exc

    def read_segment(
        self, session_id: SessionId, segment_id: SegmentId, *, stop_seq: int | None = None
    ) -> SegmentRead:
        """Read and decode a segment. Changes nothing: a torn tail is reported, not moved."""
        path = self._segment_path(session_id, segment_id)
        fd = _open_segment(path, os.O_RDONLY, segment_id)
        try:
            buf, torn = _read_complete(fd, path, segment_id)
            try:
                lines = codec.decode_lines(buf, where=str(path), first_seq=0)
            finally:
                if isinstance(buf, mmap.mmap):
                    buf.close()
        finally:
            os.close(fd)
        if not lines or lines[0].get("kind") != "header":
            raise CorruptLog(f"{path}:1: the first line is not a segment header")
        stop = len(lines) if stop_seq is None else min(stop_seq + 1, len(lines))
        return SegmentRead(lines[0], lines[1:stop], next_seq=len(lines), torn=torn)

    def set_aside_torn_tail(self, session_id: SessionId, segment_id: SegmentId) -> TornTail | None:
        """Move a torn tail of the segment to a side file (``fsck --repair``); None if none.

        Raises:
            CorruptLog: the segment is damaged (its header line is incomplete): nothing moved.
        """
        with self._lock:
            handle = self._handle(session_id, segment_id)
            fcntl.flock(handle.fd, fcntl.LOCK_EX)
            try:
                handle.size, handle.next_seq, torn = self._scan_tail(
                    session_id, segment_id, handle.fd
                )
            finally:
                fcntl.flock(handle.fd, fcntl.LOCK_UN)
        return torn

    def salvage_segment(self, context: ContextId, segment_id: SegmentId) -> Salvage:
        """Copy every readable entry of a damaged segment into a new segment of its session.

        Lines that cannot be read (not JSON, no seq or kind, a seq that does not move forward,
        a torn tail) are copied to ``{segment}.jsonl.corrupt-{n}``; every other entry keeps its
        order, renumbered. The new segment's header is the old one's (or, if that is what is
        damaged, a root header), marked ``salvaged_from``. Forks of the damaged segment are
        copied onto the new one at the same entries, and the head moves along. Nothing is
        rewritten or removed: the damaged file stays as it was. Running it again finishes an
        interrupted salvage instead of starting another.

        Raises:
            ContextNotFound: no folder holds ``context``.
            StoreError: the segment has nothing to salvage, or a fork of it is damaged too.
            FormatVersionError: a line is of a newer format (upgrade, do not salvage).
        """
        with self.lock_context(context), self._head_lock(context):
            folder = self.folder_of(context)
            if folder is None:
                raise ContextNotFound(f"context {context} does not exist")
            session_id = _session_of(folder)
            path = folder / f"{segment_id}{_SEGMENT_SUFFIX}"
            header, entries, bad = _readable_lines(_read_file(path), str(path))
            if not bad and header is not None:
                raise StoreError(f"{path}: no damaged line to salvage")
            done = salvaged_into(folder)
            side = None  # an interrupted salvage wrote it before its new segment
            if bad and segment_id not in done:
                lost = b"".join(line + b"\n" for _, line in bad)
                side = _write_side(path, lost, lambda n: f"corrupt-{n}")
            fallback = {"session_id": str(session_id), "context": str(context)}
            new_id, seqs = self._salvage_copy(folder, segment_id, header, entries, done, fallback)
            copies = self._copy_forks(folder, segment_id, new_id, seqs, done)
            copies[segment_id] = new_id
            head, problem = self._head_in(folder, context)
            moved = copies.get(head.segment_id)
            if moved is not None:
                new = PodMetadata(head.context, head.session_id, moved, head.created_at, utc_now())
                self._write_head(folder / _HEAD, new, unreadable=problem is not None)
            elif problem is not None or not (folder / _HEAD).exists():
                self._write_head(folder / _HEAD, head, unreadable=problem is not None)
            self._folders[session_id] = folder
            self._mark(session_id)
            del copies[segment_id]
            return Salvage(
                segment_id, new_id, len(entries), [n for n, _ in bad], side, copies, moved
            )

    def _salvage_copy(
        self,
        folder: Path,
        old: SegmentId,
        header: dict[str, Any] | None,
        entries: list[dict[str, Any]],
        done: Mapping[SegmentId, SegmentId],
        fallback: Mapping[str, str],
    ) -> tuple[SegmentId, dict[int, int]]:
        """Write the salvage of ``old`` (or find the one an interrupted run wrote)."""
        seqs = {int(entry["seq"]): number for number, entry in enumerate(entries, start=1)}
        if old in done:
            return done[old], seqs
        new_id = new_segment_id()
        base = header if header is not None else _root_header(fallback)
        lines = [{**base, "segment_id": str(new_id), "salvaged_from": str(old)}]
        lines += [{**entry, "seq": number} for number, entry in enumerate(entries, start=1)]
        self._write_whole(folder / f"{new_id}{_SEGMENT_SUFFIX}", lines)
        return new_id, seqs

    def _copy_forks(
        self,
        folder: Path,
        old: SegmentId,
        new: SegmentId,
        seqs: Mapping[int, int],
        done: Mapping[SegmentId, SegmentId],
    ) -> dict[SegmentId, SegmentId]:
        """Copy each fork of ``old`` onto ``new`` at the same entry, and theirs onto those."""
        copies: dict[SegmentId, SegmentId] = {}
        for child in _segment_ids(folder):
            path = folder / f"{child}{_SEGMENT_SUFFIX}"
            try:
                header = _read_header(path)
            except StoreError:
                continue
            origin = header.get("origin") or {}
            if header.get("history") is not None or origin.get("parent") != str(old):
                continue
            if "salvaged_from" in header:
                continue
            read = codec.decode_lines(_read_complete_bytes(path), where=str(path), first_seq=0)
            at = int(origin.get("at_seq") or 0)
            at_new = max((n for o, n in seqs.items() if o <= at), default=0)
            if child in done:
                copy = done[child]
            else:
                copy = new_segment_id()
                head = {
                    **read[0],
                    "segment_id": str(copy),
                    "salvaged_from": str(child),
                    "origin": {**origin, "parent": str(new), "at_seq": at_new},
                }
                self._write_whole(folder / f"{copy}{_SEGMENT_SUFFIX}", [head, *read[1:]])
            copies[child] = copy
            own = {int(e["seq"]): int(e["seq"]) for e in read[1:]}
            copies.update(self._copy_forks(folder, child, copy, own, done))
        return copies

    def _write_whole(self, path: Path, lines: Sequence[Mapping[str, Any]]) -> None:
        """Create a segment file from whole lines, durably (a repair is rare; make it last)."""
        data = b"".join(codec.encode_line(dict(line)) for line in lines)
        self._write_new(path, data, sync=True)

    def next_seq(self, session_id: SessionId, segment_id: SegmentId) -> int:
        """The seq the next append gets (reads the file's last line only)."""
        with self._lock:
            handle = self._handle(session_id, segment_id)
            fcntl.flock(handle.fd, fcntl.LOCK_EX)
            try:
                if os.fstat(handle.fd).st_size != handle.size:
                    handle.size, handle.next_seq, _ = self._scan_tail(
                        session_id, segment_id, handle.fd
                    )
                return handle.next_seq
            finally:
                fcntl.flock(handle.fd, fcntl.LOCK_UN)

    def list_segments(self, session_id: SessionId) -> list[SegmentId]:
        """The session's segment ids, oldest first (UUIDv7 order)."""
        return _segment_ids(self._session_folder(session_id))

    def append_trace(
        self, session_id: SessionId, segment_id: SegmentId, entries: Sequence[TraceEntry]
    ) -> None:
        """Append to ``{segment}.trace.jsonl`` (one write, ``O_APPEND``)."""
        folder = self._session_folder(session_id)
        if not (folder / f"{segment_id}{_SEGMENT_SUFFIX}").exists():
            raise SegmentNotFound(f"segment {segment_id} of session {session_id} does not exist")
        path = folder / f"{segment_id}{_TRACE_SUFFIX}"
        data = b"".join(codec.encode_line(e.to_dict()) for e in entries)
        fd = open_private(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)

    def read_trace(self, session_id: SessionId, segment_id: SegmentId) -> list[dict[str, Any]]:
        """The segment's debug trace (a torn last line is skipped: traces are best effort)."""
        path = self._session_folder(session_id) / f"{segment_id}{_TRACE_SUFFIX}"
        try:
            complete, _ = codec.split_complete(_read_file(path))
        except FileNotFoundError:
            return []
        return [codec.decode(line) for line in complete.splitlines() if line.strip()]

    def close(self) -> None:
        """Sync what ``batch`` mode has pending and close every cached descriptor."""
        self._closed.set()
        if self._flusher is not None:
            self._flusher.join()
        with self._lock:
            for handle in self._open.values():
                if handle.dirty:
                    with contextlib.suppress(OSError):
                        os.fdatasync(handle.fd)
                os.close(handle.fd)
            self._open.clear()
            if self._search is not None:
                self._search.close()

    def __enter__(self) -> FsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- index

    def reindex(self) -> int:
        """Rebuild ``.index`` from the folders, and write every missing or unreadable head.

        Returns the contexts indexed. A context two folders hold (split by an older terrarium
        that lost its index) is indexed at its most recently active folder; ``fsck`` reports
        the other, whose session stays reachable by its id.
        """
        return self._rebuild_index(write_heads=True)

    def _rebuild_index(self, *, write_heads: bool) -> int:
        """Rebuild ``.index`` from the folders (and, with ``write_heads``, lost heads)."""
        chosen: dict[ContextId, ContextFolder] = {}
        fresh = self._inside(self.root / _INDEX) / f"new-{uuid.uuid4().hex}"
        make_dirs(fresh / "contexts")
        make_dirs(fresh / "sessions")
        for entry in self.walk():
            head = self._repaired_head(entry) if write_heads else entry.head
            best = chosen.get(entry.context)
            if head is None:  # damaged: indexed, so that it is reported rather than hidden
                log.warning("%s", entry.problem)
                chosen.setdefault(entry.context, entry)
                continue
            rel = entry.folder.relative_to(self.root).as_posix()
            pointer = codec.encode({"path": rel, "context": str(entry.context)})
            _write_pointer(fresh / "sessions" / str(head.session_id), pointer)
            if best is None or best.head is None or best.head.updated_at < head.updated_at:
                chosen[entry.context] = ContextFolder(entry.context, entry.folder, head)
        for context, entry in chosen.items():
            rel = entry.folder.relative_to(self.root).as_posix()
            pointer = codec.encode({"path": rel, "context": str(context)})
            make_dirs(fresh / "contexts" / context.type)
            _write_pointer(fresh / "contexts" / context.type / context.encoded_name, pointer)
        index = self.root / _INDEX
        with file_lock(self._inside(self.root / _LOCKS) / "index"):
            for part in ("contexts", "sessions"):
                old = index / part
                if old.exists():
                    self._trash(old)
                os.rename(fresh / part, old)
        fresh.rmdir()
        self._folders.clear()
        if self._search is not None or (index / fs_search.DB_NAME).exists():
            self.search_index.rebuild()  # else the first search builds it
        return len(chosen)

    def _repaired_head(self, entry: ContextFolder) -> PodMetadata | None:
        """The head of a walked folder, written back if it was rebuilt; None if it cannot be."""
        if entry.head is None:
            return None
        try:
            with self._head_lock(entry.context):
                return self._persist_head(entry.folder, entry.context)
        except CorruptLog:  # damaged since the walk read it
            return None

    # ---------------------------------------------------------------- search

    @property
    def search_index(self) -> fs_search.SearchIndex:
        """The derived full-text search and listing index (opened on first use)."""
        with self._lock:
            if self._search is None:
                index = self.root / _INDEX
                if not (index / "contexts").exists() and not (index / fs_search.DB_NAME).exists():
                    # The whole index was lost: rebuild the context pointers too, so that what
                    # listing and search show can also be resolved and opened.
                    try:
                        self.reindex()
                    except OSError as exc:  # a read-only store or a full disk: readers scan
                        if _db.kind(exc) not in ("readonly", "full"):
                            raise
                        log.warning("cannot rebuild the index of %s: %s", self.root, exc)
                self._search = fs_search.SearchIndex(self.root)
            return self._search

    def search(self, query: SearchQuery) -> list[SearchHit]:
        """Ranked hits for ``query`` over every segment of every context (via the index).

        Raises:
            IndexUnavailable: the index cannot be brought up to date (read-only and behind,
                disk full, locked for ``fs_search.BUSY_TIMEOUT``): search the files instead,
                as :func:`terrarium.search.search` does.
        """
        return self.search_index.search(query)

    def list_contexts_fast(self, type: str | None = None) -> list[ContextSummary]:
        """Every context's summary (message count, last activity), read from the index.

        Raises:
            IndexUnavailable: as :meth:`search`; list the heads and restore them instead.
        """
        return self.search_index.list_contexts(type)

    def _mark(self, session_id: SessionId) -> None:
        """Leave the search index's dirty marker; never fails the write that calls it."""
        try:
            fs_search.mark_dirty(self.root, session_id)
        except OSError as exc:
            log.warning("could not mark session %s for the search index: %s", session_id, exc)

    # ---------------------------------------------------------------- internals

    def _handle(self, session_id: SessionId, segment_id: SegmentId) -> _Open:
        handle = self._open.get(segment_id)
        if handle is not None:
            self._open.move_to_end(segment_id)
            return handle
        path = self._segment_path(session_id, segment_id)
        fd = _open_segment(path, os.O_RDWR | os.O_APPEND, segment_id)
        handle = _Open(fd, session_id)
        self._open[segment_id] = handle
        while len(self._open) > _MAX_OPEN:
            _, old = self._open.popitem(last=False)
            if old.dirty:
                os.fdatasync(old.fd)
            os.close(old.fd)
        return handle

    def _forget(self, segment_id: SegmentId) -> None:
        handle = self._open.pop(segment_id, None)
        if handle is not None:
            os.close(handle.fd)

    def _scan_tail(
        self, session_id: SessionId, segment_id: SegmentId, fd: int
    ) -> tuple[int, int, TornTail | None]:
        """With the file locked: set aside a torn tail; return (size, next seq, torn tail).

        Raises:
            CorruptLog: the header line is incomplete (a damaged segment: nothing is moved),
                or the last line is not an entry.
        """
        size = os.fstat(fd).st_size
        chunk = 4096
        while True:
            start = max(0, size - chunk)
            buf = os.pread(fd, size - start, start)
            complete_end = codec.complete_end(buf)
            if start > 0 and buf.rfind(b"\n", 0, max(complete_end - 1, 0)) < 0:
                # The last complete line (or the torn append before it) began before what
                # we read.
                chunk *= 4
                continue
            break
        path = self._segment_path(session_id, segment_id)
        if start == 0 and complete_end == 0:
            raise CorruptLog(f"{path}: damaged segment: {_no_header(size)}")
        torn = None
        if complete_end < len(buf):
            offset, data = start + complete_end, buf[complete_end:]
            torn = TornTail(segment_id, offset, len(data), _move_torn(path, fd, offset, data))
            size = offset
        body = buf[:complete_end]
        last = body[body.rfind(b"\n", 0, len(body) - 1) + 1 :]
        try:
            seq = codec.decode(last)["seq"]
        except Exception as exc:
            raise CorruptLog(f"{path}: the last line is not a valid entry ({exc})") from None
        return size, int(seq) + 1, torn

    def _write_new(self, path: Path, data: bytes, *, sync: bool | None = None) -> None:
        """Create ``path`` holding ``data``, whole; ``FileExistsError`` if it exists."""
        write_new(path, data, sync=self._sync() if sync is None else sync)

    def _flush_loop(self) -> None:
        while not self._closed.wait(self.batch_interval):
            with self._lock:
                for handle in self._open.values():
                    if handle.dirty:
                        try:
                            os.fdatasync(handle.fd)
                        except OSError:  # keep syncing the others; this one retries next time
                            log.exception("background sync of %s failed", self.root)
                            continue
                        handle.dirty = False


# --------------------------------------------------------------------------- heads


def head_from_segments(folder: Path) -> PodMetadata:
    """Rebuild a context's head record from the segment files in ``folder``.

    The head is the newest segment (by UUIDv7) whose chain is intact: its header, and the
    header of every segment it continues (a fork replays its parent's prefix), read and name
    this session. ``created_at`` is the root segment's time; ``updated_at`` the head segment's.

    Raises:
        CorruptLog: no segment of ``folder`` has an intact chain.
    """
    headers: dict[SegmentId, dict[str, Any]] = {}
    for segment_id in _segment_ids(folder):
        with contextlib.suppress(StoreError, OSError):
            header = _read_header(folder / f"{segment_id}{_SEGMENT_SUFFIX}")
            if header.get("segment_id") == str(segment_id):
                headers[segment_id] = header
    if not headers:
        raise CorruptLog(f"{folder}: no segment with a readable header to rebuild the head from")
    root = headers[min(headers)]
    session = root.get("session_id")
    for segment_id in sorted(headers, reverse=True):
        header = headers[segment_id]
        context = header.get("context") or root.get("context")
        if not isinstance(context, str) or not _chain_intact(segment_id, headers, session):
            continue
        try:
            return PodMetadata(
                context, uuid.UUID(str(session)), segment_id, str(root["ts"]), str(header["ts"])
            )
        except (KeyError, ValueError):
            continue
    raise CorruptLog(f"{folder}: no segment with an intact chain to rebuild the head from")


def _chain_intact(
    segment_id: SegmentId, headers: Mapping[SegmentId, Mapping[str, Any]], session: Any
) -> bool:
    """Whether ``segment_id`` and every segment its replay reads have readable headers."""
    seen: set[SegmentId] = set()
    current: SegmentId | None = segment_id
    while current is not None:
        header = headers.get(current)
        if header is None or current in seen or header.get("session_id") != session:
            return False
        seen.add(current)
        if header.get("history") is not None:  # a root, compaction or clear: stands alone
            return True
        origin = header.get("origin")
        parent = origin.get("parent") if isinstance(origin, dict) else None
        try:
            current = uuid.UUID(parent) if isinstance(parent, str) else None
        except ValueError:
            return False
    return False


def _read_header(path: Path) -> dict[str, Any]:
    """Decode a segment file's first line (reading no further than needed)."""
    fd = _open_segment(path, os.O_RDONLY, None)
    try:
        buf = b""
        chunk = 65536
        while b"\n" not in buf:
            more = os.pread(fd, chunk, len(buf))
            if not more:
                raise CorruptLog(f"{path}: damaged segment: {_no_header(len(buf))}")
            buf += more
            chunk *= 2
    finally:
        os.close(fd)
    line = buf[: buf.index(b"\n") + 1]
    header = codec.decode_lines(line, where=str(path), first_seq=0)[0]
    if header.get("kind") != "header":
        raise CorruptLog(f"{path}:1: the first line is not a segment header")
    return header


# --------------------------------------------------------------------------- salvage


def _readable_lines(
    data: bytes, where: str
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[tuple[int, bytes]]]:
    """Split a segment's bytes into its header (None if unreadable), entries and bad lines.

    A bad line is one that is not an entry, or whose seq does not move past the last kept
    one (a doubled or misplaced line); the torn tail, if any, is bad too. Blank lines are
    skipped, as restore skips them.

    Raises:
        FormatVersionError: a line is of a newer format: that is no damage, and no salvage.
    """
    complete, tail = codec.split_complete(data)
    header: dict[str, Any] | None = None
    entries: list[dict[str, Any]] = []
    bad: list[tuple[int, bytes]] = []
    last = 0
    lines = complete.split(b"\n")[:-1]
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = codec.decode_lines(line + b"\n", where=where, first_line=number)[0]
        except CorruptLog:
            bad.append((number, line))
            continue
        if number == 1 and entry.get("kind") == "header" and entry["seq"] == 0:
            header = entry
        elif entry.get("kind") != "header" and entry["seq"] > last:
            entries.append(entry)
            last = entry["seq"]
        else:
            bad.append((number, line))
    if tail:
        bad.append((len(lines) + 1, tail))
    return header, entries, bad


def _session_of(folder: Path) -> SessionId:
    """The session a context folder holds: from its head, else any readable segment header.

    A folder where neither can be read gets a new session id (its salvage starts one).
    """
    with contextlib.suppress(OSError, StoreError):
        return _read_head(folder / _HEAD).session_id
    for segment_id in _segment_ids(folder):
        with contextlib.suppress(OSError, StoreError, ValueError):
            return uuid.UUID(
                str(_read_header(folder / f"{segment_id}{_SEGMENT_SUFFIX}")["session_id"])
            )
    return new_session_id()


def _root_header(fallback: Mapping[str, str]) -> dict[str, Any]:
    """A root header for a salvage whose damaged segment lost its own."""
    return {
        "v": 1,
        "seq": 0,
        "ts": utc_now(),
        "kind": "header",
        "session_id": fallback["session_id"],
        "context": fallback["context"],
        "origin": {"kind": "root"},
        "system_prompt": None,
        "config": {},
        "history": [],
    }


def segment_chain(folder: Path, segment_id: SegmentId) -> list[SegmentId]:
    """``segment_id`` and every segment its replay reads (a fork's parent...), newest first.

    The chain stops where a header cannot be read.
    """
    chain: list[SegmentId] = []
    current: SegmentId | None = segment_id
    while current is not None and current not in chain:
        chain.append(current)
        try:
            header = _read_header(folder / f"{current}{_SEGMENT_SUFFIX}")
            parent = (header.get("origin") or {}).get("parent")
            forked = header.get("history") is None and isinstance(parent, str)
            current = uuid.UUID(parent) if forked else None
        except (StoreError, OSError, ValueError):
            current = None
    return chain


def salvaged_into(folder: Path) -> dict[SegmentId, SegmentId]:
    """The salvages ``folder`` holds already: damaged segment -> the segment salvaging it."""
    done: dict[SegmentId, SegmentId] = {}
    for segment_id in _segment_ids(folder):
        with contextlib.suppress(StoreError, OSError, ValueError):
            source = _read_header(folder / f"{segment_id}{_SEGMENT_SUFFIX}").get("salvaged_from")
            if isinstance(source, str):
                done[uuid.UUID(source)] = segment_id
    return done


def _read_complete_bytes(path: Path) -> bytes:
    """A segment file's complete appends (a torn tail left out), refusing a link."""
    return codec.split_complete(_read_file(path))[0]


def _write_side(path: Path, data: bytes, suffix: Callable[[int], str]) -> str:
    """Copy ``data`` to a new side file ``{name}.{suffix(n)}`` beside ``path``; its path."""
    return str(write_beside(path, data, suffix))


# --------------------------------------------------------------------------- files


def _holds_context(folder: Path) -> bool:
    """Whether ``folder`` holds a context: a head record or any segment file."""
    return (folder / _HEAD).exists() or bool(_segment_ids(folder))


def _segment_ids(folder: Path) -> list[SegmentId]:
    """The ids of the segment files in ``folder``, oldest first (UUIDv7 order)."""
    ids = []
    for name in listdir(folder):
        if name.endswith(_SEGMENT_SUFFIX) and not name.endswith(_TRACE_SUFFIX):
            with contextlib.suppress(ValueError):
                ids.append(uuid.UUID(name[: -len(_SEGMENT_SUFFIX)]))
    return sorted(ids)


def _real_dir(path: Path) -> bool:
    """Whether ``path`` is a folder itself, not a link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _open_segment(path: Path, flags: int, segment_id: SegmentId | None) -> int:
    """Open a segment file without following a link; name what is wrong if it cannot be."""
    try:
        return os.open(path, flags | _NOFOLLOW)
    except FileNotFoundError:
        raise SegmentNotFound(
            f"segment {segment_id or path.stem} does not exist ({path})"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreError(f"{path} is a symbolic link: terrarium never follows one") from None
        raise


def _read_file(path: Path) -> bytes:
    """The bytes of ``path``, refusing a symbolic link (``FileNotFoundError`` if missing)."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreError(f"{path} is a symbolic link: terrarium never follows one") from None
        raise
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read_complete(fd: int, path: Path, segment_id: SegmentId) -> tuple[Any, TornTail | None]:
    """The complete appends of an open segment file, and its torn tail if it has one.

    A file that ends in a complete append (the common case) is returned as a memory map:
    decoding from it saves a copy, and it is safe because no writer ever truncates a file
    below the end of a complete append. A tail that looks torn is read again under a shared
    lock, which waits for a write in progress: only a tail still torn then is one.
    """
    size = os.fstat(fd).st_size
    last = os.pread(fd, 2, max(0, size - 2))
    if last.endswith(b"\n") and not last.endswith(b" \n"):
        return mmap.mmap(fd, size, access=mmap.ACCESS_READ), None
    fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        data = os.pread(fd, os.fstat(fd).st_size, 0)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
    end = codec.complete_end(data)
    if end == 0:
        raise CorruptLog(f"{path}: damaged segment: {_no_header(len(data))}")
    if end == len(data):
        return data, None
    return data[:end], TornTail(segment_id, end, len(data) - end, None)


def _no_header(size: int) -> str:
    if size == 0:
        return "the file is empty (no header line)"
    return f"its header line is incomplete ({size} bytes, no newline)"


def _move_torn(path: Path, fd: int, offset: int, data: bytes) -> str:
    """Copy torn bytes at ``offset`` to a new side file, truncate them away; return its path."""
    base = f"torn-{offset}"
    side = _write_side(path, data, lambda n: base if n == 1 else f"{base}.{n}")
    os.ftruncate(fd, offset)
    log.warning("%s: set aside %d torn bytes at offset %d to %s", path, len(data), offset, side)
    return side


def _set_aside(path: Path, why: str) -> Path:
    """Rename ``path`` to a new ``{name}.{why}-{n}`` beside it (never over another)."""
    side = link_free(path, path, lambda n: f"{why}-{n}")
    os.unlink(path)
    return side


def _write_pointer(path: Path, data: bytes) -> None:
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def _os_reason(exc: OSError) -> str:
    """An OS error as the user should read it: a full disk is named as one."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "the disk is full"
    return _one_line(exc)


def _head_dict(head: PodMetadata) -> dict[str, Any]:
    return {
        "v": 1,
        "context": head.context,
        "session_id": str(head.session_id),
        "segment_id": str(head.segment_id),
        "created_at": head.created_at,
        "updated_at": head.updated_at,
    }


def _read_head(path: Path) -> PodMetadata:
    """Read a ``head.json``; CorruptLog (naming it) if it is not a head record."""
    raw = _read_file(path)
    try:
        record = codec.decode(raw)
        head = PodMetadata(
            context=record["context"],
            session_id=uuid.UUID(record["session_id"]),
            segment_id=uuid.UUID(record["segment_id"]),
            created_at=record["created_at"],
            updated_at=record["updated_at"],
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptLog(f"{path}: not a valid head record ({_one_line(exc)})") from None
    if not all(isinstance(v, str) for v in (head.context, head.created_at, head.updated_at)):
        raise CorruptLog(f"{path}: not a valid head record (a field is not a string)")
    return head


def _read_pointer(path: Path) -> tuple[str, str]:
    """Read an index entry; return the folder it names (relative to the root) and context."""
    raw = _read_file(path)
    try:
        record = codec.decode(raw)
        folder, context = record["path"], record.get("context", "")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        folder, context = exc, ""
    if not isinstance(folder, str) or not folder or not isinstance(context, str):
        reason = _one_line(folder) if isinstance(folder, Exception) else "no folder named"
        raise CorruptLog(f"{path}: not a valid index entry ({reason}); run reindex to rebuild it")
    return folder, context


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
