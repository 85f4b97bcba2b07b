"""``FsStore``: sessions as plain JSONL files that ``tar`` backs up and ``grep`` reads.

Each context is a folder (``{type}/{date}/{name}/``) of append-only segment files and a
``head.json`` naming the segment it is on (:mod:`._layout` draws the tree). The segments are
the truth: every other file is rebuilt from them when lost, reads never write, and nothing
leads outside the root.

Trade-off: an append is one ``write(2)`` under a ``flock`` and survives ``kill -9``; surviving
a power cut costs an ``fdatasync`` per append or a window (``durability``). Search and listing
read the derived index (:mod:`terrarium.index`), which writers only mark dirty (:mod:`._changes`).

Usage::

    from terrarium.stores.fs import FsStore

    with FsStore("./sessions", durability="fsync") as store:
        head = store.get_head(ContextId.parse("cli:main"))
        if head is not None:
            entries = store.read_segment(head.session_id, head.segment_id).entries
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import math
import mmap
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Literal, TypeVar

import msgspec

from terrarium import codec
from terrarium.blobrefs import DEFAULT_THRESHOLD
from terrarium.errors import (
    ConflictError,
    ContextExists,
    ContextNotFound,
    CorruptLog,
    InvalidContextId,
    SegmentNotFound,
    SessionAttached,
    StoreError,
    TerrariumError,
)
from terrarium.model import (
    ContextId,
    SegmentId,
    SessionId,
    TornTail,
    TraceEntry,
    decode_name,
    utc_now,
)
from terrarium.stores import _db
from terrarium.stores._files import (
    fsync_dir,
    listdir,
    make_dirs,
    write_all,
    write_atomic,
    write_new,
    write_to,
)
from terrarium.stores.base import (
    ATTEMPTS,
    INDEX_DB,
    ClosingStore,
    Derived,
    NewEntry,
    PodMetadata,
    SegmentRead,
    entry_line,
    header_line,
    iter_lines,
    wake_session,
)
from terrarium.stores.fs._blobs import FsBlobs
from terrarium.stores.fs._changes import MARK_EVERY, FsChanges, mark_dirty
from terrarium.stores.fs._heads import head_from_segments, head_of, segment_chain
from terrarium.stores.fs._layout import (
    ARCHIVE,
    DETACHED,
    HEAD,
    INDEX,
    LEGACY_TRASH,
    SEGMENT_SUFFIX,
    STAGING,
    TRACE_SUFFIX,
    ZST,
    has_segments,
    holds_context,
    real_dir,
    segment_ids,
)
from terrarium.stores.fs._segments import (
    headed,
    open_segment,
    os_reason,
    read_complete,
    read_file,
    read_header,
    scan_tail,
    set_aside,
)
from terrarium.stores.fs._states import frozen, remove_tree, sealed, whole_lines
from terrarium.stores.fs._tree import ContextFolder, activity, pointer
from terrarium.stores.fs.salvage import (
    Salvage,
    copy_forks,
    readable_lines,
    salvage_copy,
    salvaged_into,
    set_aside_once,
)
from terrarium.stores.locks import remove_lock

__all__ = [
    "DURABILITIES",
    "LEGACY_TRASH",
    "ContextFolder",
    "Durability",
    "FsStore",
    "Salvage",
    "head_from_segments",
    "salvaged_into",
    "segment_chain",
]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

Durability = Literal["flush", "fsync", "batch"]
DURABILITIES: tuple[str, ...] = ("flush", "fsync", "batch")

_MAX_OPEN = 256


class _Moved(Exception):
    """An append found its file deleted or sealed by a freeze: it looks the session up again."""


class _Open(msgspec.Struct):
    """A cached writable descriptor and what this process last knew of the file."""

    fd: int
    session_id: SessionId
    size: int = -1
    next_seq: int = -1
    dirty: bool = False
    marked: float = -math.inf
    """When an append last left the search index's dirty marker (monotonic seconds)."""


class FsStore(FsBlobs, ClosingStore):
    """A store of plain files under one root directory (see the module docstring)."""

    def __init__(
        self,
        root: str | os.PathLike[str] = "./sessions",
        *,
        durability: Durability = "flush",
        batch_interval: float = 0.05,
        blob_threshold: int | None = DEFAULT_THRESHOLD,
    ) -> None:
        """Open (creating if needed) the store at ``root``.

        Args:
            root: the sessions directory.
            durability: ``flush`` (default) hands each append to the kernel (~3 µs): it
                survives ``kill -9``, not a power cut. ``fsync`` adds an ``fdatasync`` per
                append (~135 µs here). ``batch`` syncs dirty segments every
                ``batch_interval`` seconds from a background thread: a power cut loses at
                most that window. Both fsync new files, heads and index entries with their
                folders; in ``flush`` mode a head lost to a power cut is rebuilt.
            batch_interval: seconds between background syncs when ``durability="batch"``.
            blob_threshold: history strings over this many bytes go to ``.blobs/``
                (:mod:`terrarium.blobs`); None or 0 keeps them inline.
        """
        if durability not in DURABILITIES:
            raise ValueError(f"unknown durability {durability!r}: use one of {DURABILITIES}")
        folder = Path(root).absolute()
        make_dirs(folder)
        super().__init__(folder)
        self.durability = durability  # fixed when opened: the append reads the flags below
        self._fsync_each = durability == "fsync"
        self._batched = durability == "batch"
        self._sync = durability != "flush"
        """Whether new files, heads and index entries are fsynced."""
        self.batch_interval = batch_interval
        self.blob_threshold = blob_threshold
        self._lock = threading.RLock()
        self._open: OrderedDict[SegmentId, _Open] = OrderedDict()
        self._recent: _Open | None = None
        """The handle last used, so the last in ``_open``'s order."""
        self._folders: dict[SessionId, Path] = {}
        self._quiet_depth = threading.local()
        """Per thread: ``depth`` 1 while it holds ``.locks/lifecycle``; ``heads`` its head locks."""
        self._closed = threading.Event()
        self.derived: Derived | None = None
        """The derived index kept beside the store (:func:`terrarium.index.of`); closed with it."""
        self._flusher: threading.Thread | None = None
        if durability == "batch":
            self._flusher = threading.Thread(target=self._flush_loop, daemon=True)
            self._flusher.start()

    def __repr__(self) -> str:
        return f"FsStore({str(self.root)!r}, durability={self.durability!r})"

    # ---------------------------------------------------------------- folders

    def folder_of(self, context: ContextId) -> Path | None:
        """The folder holding the context's files, or None if the context does not exist."""
        found = self._locate(context)
        return found.folder if found is not None else None

    def _locate(self, context: ContextId) -> ContextFolder | None:
        """Find the context's folder and head: by its index entry, else in the date folders
        (re-indexing what it finds), so a lost index never makes a context look new."""
        try:
            folder = self._pointer_folder(self._index_file(context), context)
        except FileNotFoundError:
            pass
        except StoreError as exc:
            log.warning("%s", exc)
        else:
            found = self._context_folder(context, folder)
            if found is not None:
                return found
        found = self._find_folder(context)
        if found is not None:
            self._index_best_effort(found)
        return found

    def _index_best_effort(self, found: ContextFolder) -> None:
        """Index a context found in the folders (all of it if the index is gone); best effort."""
        try:
            if self._index_lost():
                self._rebuild_index(write_heads=False)
            elif found.head is not None:
                rel = found.folder.relative_to(self.root)
                self._write_index(found.context, found.head.session_id, rel)
        except OSError as exc:  # a read-only store: the walk works, the index stays stale
            log.debug("could not index %s: %s", found.context, exc)

    def _session_folder(self, session_id: SessionId) -> Path:
        """The folder of ``session_id``, a context's or detached (a cached one is checked first)."""
        folder = self._folders.get(session_id)
        if folder is not None and real_dir(folder):
            return folder
        try:
            folder = Path(self._pointer_folder(self._session_index_path(session_id), None))
        except FileNotFoundError:
            folder = None
        if folder is None or not holds_context(folder):
            detached = self.detached_folder(session_id)
            folder = detached if has_segments(detached) else self._find_session(session_id)
        self._folders[session_id] = folder
        return folder

    def _index_lost(self) -> bool:
        """Whether ``.index`` lost its pointers, whole or in part (a folder deleted by hand)."""
        return not all((self.root / INDEX / part).is_dir() for part in ("contexts", "sessions"))

    def _session_in_use(self, session_id: SessionId) -> bool:
        """Whether a segment of ``session_id`` exists, detached or in the folder its index entry
        names (a killed create's names one with none). No link is followed (nor remembered)."""
        if self._index_lost():
            self._rebuild_index(write_heads=False)
        detached = self.root / DETACHED / str(session_id)
        folders = [detached] if real_dir(detached.parent) and real_dir(detached) else []
        with contextlib.suppress(FileNotFoundError, CorruptLog):
            named = Path(self._pointer_folder(self._session_index_path(session_id), None))
            if real_dir(named):
                folders.append(named)
        return any(has_segments(folder) for folder in folders)

    def _find_session(self, session_id: SessionId) -> Path:
        """Walk the tree for the folder of ``session_id`` (its index entry is lost)."""
        for entry in self.walk():
            if entry.head is not None and entry.head.session_id == session_id:
                self._index_best_effort(entry)
                return entry.folder
        raise SegmentNotFound.of(session_id)

    # ---------------------------------------------------------------- heads

    def get_head(self, context: ContextId) -> PodMetadata | None:
        """Return the context's head record, or None. A missing or unreadable ``head.json`` is
        rebuilt from the segments, in memory only.

        Raises:
            CorruptLog: the head cannot be read and no segment chain is intact to rebuild it.
        """
        for _ in range(2):  # a freeze or thaw meanwhile can hide the head segment
            with contextlib.suppress(CorruptLog):
                return self._found_head(self._locate(context))
        return self._found_head(self._locate(context))

    def _reading(self, session_id: SessionId, read: Callable[[], _T]) -> _T:
        """``read()``; if its file went (a freeze, thaw or detach meanwhile: reads take no
        lock), again, and a third time holding the session's lock shared: no move runs."""
        for _ in range(2):
            try:
                return read()
            except (SegmentNotFound, FileNotFoundError):
                with self._lock:
                    self._folders.pop(session_id, None)
        with self._session_lock(session_id, shared=True, create=False):
            return read()

    def _found_head(self, found: ContextFolder | None) -> PodMetadata | None:
        """The head of a located context (CorruptLog if it can be neither read nor rebuilt)."""
        if found is None:
            return None
        if found.head is None:
            raise CorruptLog(found.problem or f"{found.folder}: damaged")
        if found.problem is not None:
            log.warning("%s", found.problem)
        self._folders.setdefault(found.head.session_id, found.folder)
        return found.head

    def _persist_head(self, folder: Path) -> PodMetadata:
        """Read the head, writing it back if it had to be rebuilt. Hold the head lock."""
        head, problem = head_of(folder)
        path = folder / HEAD
        if problem is not None or not path.exists():
            self._write_head(path, head, unreadable=problem is not None)
            log.warning("%s: rebuilt from the segments (head is %s)", path, head.segment_id)
        return head

    def _write_head(self, path: Path, head: PodMetadata, *, unreadable: bool) -> None:
        """Replace ``head.json``; an unreadable one is first set aside, never lost."""
        if unreadable and path.exists():
            set_aside(path, "unreadable")
        write_atomic(path, codec.encode({"v": 1, **msgspec.structs.asdict(head)}), sync=self._sync)

    def set_head(
        self, context: ContextId, segment_id: SegmentId, *, expected: SegmentId
    ) -> PodMetadata:
        """Move the head if it is ``expected`` now; a frozen context is woken first."""
        with self._hot_context(context) as folder:
            head, problem = head_of(folder)
            if head.segment_id != expected:
                raise ConflictError(
                    f"head of {context} is {head.segment_id}, not {expected}: it moved"
                )
            if not (folder / f"{segment_id}{SEGMENT_SUFFIX}").exists():
                raise SegmentNotFound.of(head.session_id, segment_id)
            new = PodMetadata(head.context, head.session_id, segment_id, head.created_at, utc_now())
            self._write_head(folder / HEAD, new, unreadable=problem is not None)
            self._mark(head.session_id)
            return new

    def _require_head(self, context: ContextId) -> PodMetadata:
        head = self.get_head(context)
        if head is None:
            raise ContextNotFound.of(context)
        return head

    def _require_folder(self, context: ContextId) -> Path:
        folder = self.folder_of(context)
        if folder is None:
            raise ContextNotFound.of(context)
        return folder

    @contextlib.contextmanager
    def _hot(self, session_id: SessionId) -> Iterator[None]:
        """Hold the session's lock shared (no move runs), the session hot: a frozen one is
        woken first (outside every lock: a wake is a move)."""
        for _ in range(ATTEMPTS):
            if frozen(self.root, session_id):
                wake_session(self, session_id)
            with self._session_lock(session_id, shared=True):
                if not frozen(self.root, session_id):
                    yield
                    return
        raise ConflictError(f"session {session_id} kept being frozen before a write to it")

    @contextlib.contextmanager
    def _hot_context(self, context: ContextId) -> Iterator[Path]:
        """Hold the context's head lock, then (the lock order) its session's lock shared, the
        session hot (as :meth:`_hot`); the context's folder."""
        for _ in range(ATTEMPTS):
            session_id = self._require_head(context).session_id
            if frozen(self.root, session_id):
                wake_session(self, session_id)  # outside every lock: a wake is a move
            with self._head_lock(context), self._session_lock(session_id, shared=True):
                folder = self._require_folder(context)
                same = head_of(folder)[0].session_id == session_id
                if same and not frozen(self.root, session_id):
                    yield folder
                    return
        raise ConflictError(f"context {context} kept being frozen before a write to it")

    def rebuild_head(self, context: ContextId) -> PodMetadata:
        """Write the context's ``head.json`` from its segments if it is missing or unreadable
        (an unreadable one is first set aside as ``head.json.unreadable-{n}``, never deleted).

        Raises:
            ContextNotFound: no folder holds the context.
            CorruptLog: no segment chain is intact to rebuild it from.
        """
        with self._hot_context(context) as folder:
            return self._persist_head(folder)

    def list_contexts(self, type: str | None = None) -> list[PodMetadata]:
        """Every hot head, sorted by context id, from the index (a walk if it is gone); a
        head that cannot be read or rebuilt is logged and left out."""
        base = self.root / INDEX / "contexts"
        if self._index_lost():
            try:
                self._rebuild_index(write_heads=False)
            except OSError:  # a read-only store: read the folders themselves
                return self._walked_heads(type)
        types = [type] if type is not None else sorted(listdir(base))
        heads: list[PodMetadata] = []
        for kind in types:
            for encoded in sorted(listdir(base / kind)):
                try:
                    head = self._found_head(self._locate(ContextId(kind, decode_name(encoded))))
                    if head is not None and not frozen(self.root, head.session_id):
                        heads.append(head)  # an archived (frozen) one is not listed here
                except StoreError as exc:
                    log.warning("%s", exc)
                except ValueError:
                    pass
        return sorted(heads, key=lambda h: ContextId.parse(h.context))

    def _walked_heads(self, type: str | None) -> list[PodMetadata]:
        heads: dict[ContextId, PodMetadata] = {}
        for entry in sorted(self.walk(), key=activity, reverse=True):  # of two, the most recent
            if type is not None and entry.context.type != type:
                continue
            if entry.head is None:
                log.warning("%s", entry.problem)
            elif not frozen(self.root, entry.head.session_id):
                heads.setdefault(entry.context, entry.head)
        return [heads[context] for context in sorted(heads)]

    # ---------------------------------------------------------------- contexts

    @contextlib.contextmanager
    def lock_context(self, context: ContextId) -> Iterator[None]:
        """Hold the context's lock exclusively, across threads and processes: the callers'
        lock, held for a whole turn (the store's own moves take another one). Released on a
        context that is not here (deleted meanwhile, or never made), its file goes."""
        with self._file_lock("turn", context):
            yield
        with contextlib.suppress(TerrariumError, OSError):  # a file left is harmless
            # The index entry (a string path: no Path built on every turn) is there for a hot
            # context; without it, the folder is looked for.
            if not os.path.lexists(self._index_file(context)) and not self.folder_of(context):
                remove_lock(self._lock_path("turn", context.type, context.encoded_name))

    @contextlib.contextmanager
    def _head_lock(self, context: ContextId) -> Iterator[None]:
        """The context's head lock, re-entrant in a thread."""
        held: set[str] = self._quiet_depth.__dict__.setdefault("heads", set())
        if str(context) in held:
            yield
            return
        with self._file_lock("head", context):
            held.add(str(context))
            try:
                yield
            finally:
                held.discard(str(context))

    def _file_lock(self, kind: str, context: ContextId) -> AbstractContextManager[None]:
        _check_type(context)  # no such context can exist here: make no lock file for it
        return self._lock_file(kind, context.type, context.encoded_name)

    def create_context(self, context: ContextId, header: Mapping[str, Any]) -> PodMetadata:
        """Create the context's folder, root segment, head and index entries. A folder that
        holds the context already is never replaced: it is indexed (its head rebuilt if lost)
        and ``ContextExists`` raised."""
        line = header_line(header)
        session_id = uuid.UUID(str(line["session_id"]))
        segment_id = uuid.UUID(str(line["segment_id"]))
        created = str(line["ts"])
        data = codec.encode_line(line)  # refuses a bad header before anything is made
        # Lifecycle lock shared: no reindex swaps out the index this create writes to; creates
        # on one session id take turns (``.locks/create/{session}``, taken last).
        with self._quiet(), self._head_lock(context), self._lock_file("create", str(session_id)):
            existing = self.folder_of(context)
            if existing is not None:
                self._adopt(context, existing)
            rel = Path(context.type) / created[:10] / context.encoded_name
            folder = self._inside(self.root / rel)
            if holds_context(folder):  # another context's: a case-insensitive disk
                raise ContextExists(f"context {context} would share {folder} with another")
            if self._session_in_use(session_id):
                raise ConflictError(f"session {session_id} already exists")
            make_dirs(folder)
            for name in listdir(folder):  # a killed create's: no context is here to own them
                if name.startswith(".tmp-"):
                    (folder / name).unlink(missing_ok=True)
            # The index entries and the listing's dirty marker first: until the commit they
            # name a folder with no segment, which lookups pass over; killed after it, the
            # context is listed, not found only by a walk.
            self._write_index(context, session_id, rel)
            self._mark(session_id)
            self._write_new(folder / f"{segment_id}{SEGMENT_SUFFIX}", data)  # the commit
            head = PodMetadata(str(context), session_id, segment_id, created, created)
            self._folders[session_id] = folder
            try:  # derived from the segment now: a full disk here is no failure
                self._write_head(folder / HEAD, head, unreadable=False)
                self._mark(session_id)
            except OSError as exc:
                log.warning("%s: created; its head.json waits: %s", context, exc)
            return head

    def _adopt(self, context: ContextId, folder: Path) -> None:
        """A create found the context's folder: write its head if lost, index it, refuse."""
        try:
            head = self._persist_head(folder)
        except CorruptLog as exc:
            raise ContextExists(
                f"context {context} already exists but is damaged ({exc}); "
                "run 'terrarium fsck' to see what is wrong"
            ) from None
        self._write_index(context, head.session_id, folder.relative_to(self.root))
        raise ContextExists(f"context {context} already exists (in {folder})")

    def _write_index(self, context: ContextId, session_id: SessionId, rel: Path) -> None:
        """Write the context's and its session's entries. A lost index is rebuilt from the
        folders first: holding this entry alone, it would hide every other context."""
        if self._index_lost():
            self._rebuild_index(write_heads=False)
        data = pointer(context, rel.as_posix())
        for path in (self._session_index_path(session_id), Path(self._index_file(context))):
            make_dirs(self._inside(path.parent))
            write_atomic(path, data, sync=self._sync)

    def _forget_session(self, session_id: SessionId) -> None:
        """Close the cached descriptors of a session whose folder moves."""
        with self._lock:
            for segment_id, handle in list(self._open.items()):
                if handle.session_id == session_id:
                    self._forget(segment_id)
            self._folders.pop(session_id, None)

    def _discard(self, folder: Path) -> None:
        """Delete a folder of the store's own (an old index) through ``.staging``."""
        gone = self._inside(self.root / STAGING) / f"index-{uuid.uuid4().hex}"
        make_dirs(gone.parent)
        os.rename(self._inside(folder), gone)
        remove_tree(gone)

    # ---------------------------------------------------------------- detached sessions

    def create_session(self, header: Mapping[str, Any]) -> None:
        """Create a detached session in ``.detached/{session}/``; ConflictError if it exists."""
        line = header_line(header)
        session_id = uuid.UUID(str(line["session_id"]))
        segment_id = uuid.UUID(str(line["segment_id"]))
        data = codec.encode_line(line)
        folder = self.detached_folder(session_id)
        with self._lock_file("create", str(session_id)):
            in_use = self._session_in_use(session_id)  # a lost index rebuilt first
            if in_use or has_segments(folder) or self._session_index_path(session_id).exists():
                raise ConflictError(f"session {session_id} already exists")
            make_dirs(folder)
            try:
                self._write_new(folder / f"{segment_id}{SEGMENT_SUFFIX}", data)
            except FileExistsError:
                raise ConflictError(f"session {session_id} already exists") from None
            self._folders[session_id] = folder

    def attach_context(
        self, context: ContextId, session_id: SessionId, segment_id: SegmentId
    ) -> PodMetadata:
        """Move a detached session into ``context``'s new folder, with ``segment_id`` its head.
        Three steps, each safe to kill: ``head.json`` into ``.detached/{session}/`` (where it
        means nothing), the index entries and dirty marker (naming a folder not there yet), and
        the rename to ``{type}/{date}/{name}/``, the commit."""
        _check_type(context)
        with self._quiet(), self._head_lock(context), self._session_lock(session_id):
            self._settle(session_id)
            source = self.detached_folder(session_id)
            segments = self._ids(session_id, source) if real_dir(source) else []
            if not segments:
                self._folders.pop(session_id, None)
                owner = self.session_owner(session_id)  # SegmentNotFound if there is none
                raise SessionAttached(f"session {session_id} already belongs to context {owner}")
            if self.folder_of(context) is not None:
                raise ContextExists(f"context {context} already exists")
            if segment_id not in segments:
                raise SegmentNotFound.of(session_id, segment_id)
            if frozen(self.root, session_id):
                root = self._lines(session_id, source, segments[0], 1)[0]
            else:
                root = read_header(source / f"{segments[0]}{SEGMENT_SUFFIX}")
            created = str(root["ts"])
            rel = Path(context.type) / created[:10] / context.encoded_name
            target = self._inside(self.root / rel)
            if real_dir(target) and listdir(target):  # another context's: case-insensitive
                raise ContextExists(f"context {context} would share {target} with another")
            head = PodMetadata(str(context), session_id, segment_id, created, utc_now())
            self._write_head(source / HEAD, head, unreadable=False)
            self._mark(session_id)
            self._write_index(context, session_id, rel)
            make_dirs(target.parent)
            try:
                os.rename(source, target)  # the commit
            except OSError as exc:
                (source / HEAD).unlink(missing_ok=True)
                raise StoreError(f"cannot move {source} to {target}: {os_reason(exc)}") from exc
            if self._sync:
                fsync_dir(target.parent)
                fsync_dir(source.parent)
            self._folders[session_id] = target
            self._mark(session_id)
            return head

    def _ids(self, session_id: SessionId, folder: Path) -> list[SegmentId]:
        """The segment ids in ``folder``, oldest first, plain or (frozen session) ``.zst``; an
        empty listing made as a freeze or thaw committed is a vanished file (read again)."""
        cold = frozen(self.root, session_id)
        ids = segment_ids(folder, ZST if cold else "")
        if not ids and frozen(self.root, session_id) != cold:
            raise FileNotFoundError(folder)
        return ids

    def _lines(
        self, session_id: SessionId, folder: Path, segment_id: SegmentId, stop: int | None = None
    ) -> list[dict[str, Any]]:
        """The first ``stop`` (all) decoded lines of a segment of a frozen session."""
        try:
            raw = whole_lines(folder, f"{segment_id}{SEGMENT_SUFFIX}", cold=True)
        except FileNotFoundError:
            raise SegmentNotFound.of(session_id, segment_id) from None
        where = f"{folder / str(segment_id)}{SEGMENT_SUFFIX}{ZST}"
        return headed([codec.decode(line) for line in raw[:stop]], where)

    # ---------------------------------------------------------------- segments

    def create_segment(self, session_id: SessionId, header: Mapping[str, Any]) -> None:
        """Write a new segment file holding only its header. A lost ``head.json`` is rebuilt
        first: rebuilt after, it would move onto the new segment."""
        line = header_line(header)
        data = codec.encode_line(line)
        name = f"{uuid.UUID(str(line['segment_id']))}{SEGMENT_SUFFIX}"
        folder = self._session_folder(session_id)
        if folder.parent.name != DETACHED and not (folder / HEAD).exists():
            with contextlib.suppress(CorruptLog, ValueError, FileNotFoundError):
                context = ContextId.parse(head_from_segments(folder).context)
                with self._head_lock(context):
                    self._persist_head(folder)
        with self._hot(session_id):
            for attempt in (1, 2):
                try:
                    self._write_new(self._session_folder(session_id) / name, data)
                    break
                except FileExistsError:
                    raise ConflictError(f"segment {name[:36]} already exists") from None
                except FileNotFoundError:
                    if attempt == 2:
                        raise
                    with self._lock:  # the folder moved before this thread's lock: look again
                        self._folders.pop(session_id, None)
        self._mark(session_id)

    def append(
        self,
        session_id: SessionId,
        segment_id: SegmentId,
        entries: Sequence[NewEntry],
        *,
        expected_seq: int | None = None,
    ) -> int:
        """Append whole lines with one ``write`` under the segment's exclusive ``flock``.

        The ``expected_seq`` check and the write are one step; a multi-entry append is framed
        (:func:`terrarium.codec.encode_lines`), so a crash inside it leaves a torn tail. With a
        cached descriptor an append costs a lock, an ``fstat`` and a ``write``. A file found
        deleted, sealed or missing sends the append the long way, which wakes the session."""
        try:
            return self._append(session_id, segment_id, entries, expected_seq)  # the hot path
        except (_Moved, SegmentNotFound) as exc:
            moved = isinstance(exc, _Moved)  # _append closed the descriptor
        with self._lock:
            self._folders.pop(session_id, None)
        if moved and not frozen(self.root, session_id):
            with self._moving(session_id):
                pass  # a move settles what a killed one left first (a seal)
        # Woken (SegmentNotFound for a session in the trash), then written while hot, under
        # the session's lock shared (no freeze runs meanwhile): however often other processes
        # archive it meanwhile, an acknowledged write is never lost.
        with self._hot(session_id):
            try:
                return self._append(session_id, segment_id, entries, expected_seq)
            except _Moved:
                raise SegmentNotFound(f"segment {segment_id} was deleted") from None

    def _append(
        self,
        session_id: SessionId,
        segment_id: SegmentId,
        entries: Sequence[NewEntry],
        expected_seq: int | None,
    ) -> int:
        with self._lock:
            handle = self._handle(session_id, segment_id)
            fd = handle.fd
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = True  # until the descriptor is closed, which releases the lock
            try:
                if not self._caught_up(handle, segment_id):
                    raise _Moved(str(segment_id))
                first = handle.next_seq
                if expected_seq is not None and expected_seq != first:
                    raise ConflictError.stale_seq(segment_id, first, expected_seq)
                if len(entries) == 1:  # nearly every append: no generator
                    data = codec.encode_line(entry_line(entries[0], first))
                else:
                    data = codec.encode_lines(list(iter_lines(entries, first)))
                self._write_all(fd, data, handle.size, segment_id)
                if self._fsync_each:
                    os.fdatasync(fd)
                elif self._batched:
                    handle.dirty = True
                handle.size += len(data)
                handle.next_seq = first + len(entries)
                now = time.monotonic()
                if now - handle.marked >= MARK_EVERY:
                    self._mark(session_id)
                    handle.marked = now
                return first
            except (_Moved, SegmentNotFound):  # sealed, unlinked or missing: not this descriptor
                self._forget(segment_id)
                held = False
                raise
            finally:
                if held:
                    fcntl.flock(fd, fcntl.LOCK_UN)

    def _write_all(self, fd: int, data: bytes, size: int, segment_id: SegmentId) -> None:
        """Write ``data`` fully or roll the file back to ``size`` and raise."""
        try:
            written = os.write(fd, data)
            if written != len(data):  # short (a signal, a nearly full disk): the rest follows
                write_all(fd, data[written:])
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise StoreError(f"append to segment {segment_id} failed: {os_reason(exc)}") from exc

    def read_segment(
        self, session_id: SessionId, segment_id: SegmentId, *, stop_seq: int | None = None
    ) -> SegmentRead:
        """Read and decode a segment; a torn tail is skipped and reported, never moved."""
        lines, torn = self._reading(session_id, lambda: self._decoded(session_id, segment_id))
        stop = len(lines) if stop_seq is None else min(stop_seq + 1, len(lines))
        return SegmentRead(lines[0], lines[1:stop], next_seq=len(lines), torn=torn)

    def _decoded(
        self, session_id: SessionId, segment_id: SegmentId
    ) -> tuple[list[dict[str, Any]], TornTail | None]:
        """A segment's lines, hot or frozen, and the torn tail a hot one's read skipped."""
        folder = self._session_folder(session_id)
        if frozen(self.root, session_id):
            return self._lines(session_id, folder, segment_id), None
        path = folder / f"{segment_id}{SEGMENT_SUFFIX}"
        fd = open_segment(path, os.O_RDONLY, segment_id)
        try:
            buf, torn = read_complete(fd, path, segment_id)
            try:
                return headed(codec.decode_lines(buf, where=str(path), first_seq=0), path), torn
            finally:
                if isinstance(buf, mmap.mmap):
                    buf.close()
        finally:
            os.close(fd)

    def set_aside_torn_tail(self, session_id: SessionId, segment_id: SegmentId) -> TornTail | None:
        """Move a torn tail of the segment to a side file (``fsck --repair``); None if none.

        Raises:
            CorruptLog: the segment is damaged (its header line is incomplete): nothing moved.
        """
        with self._lock:
            try:
                handle = self._handle(session_id, segment_id)
            except SegmentNotFound:
                if frozen(self.root, session_id):
                    return None  # its torn tails are frozen with it
                raise
            fcntl.flock(handle.fd, fcntl.LOCK_EX)
            try:
                return self._rescan(handle, segment_id)
            finally:
                fcntl.flock(handle.fd, fcntl.LOCK_UN)

    def salvage_segment(self, context: ContextId, segment_id: SegmentId) -> Salvage:
        """Copy every readable entry of a damaged segment into a new one (:mod:`.salvage`).

        Raises:
            ContextNotFound: no folder holds ``context``.
            StoreError: the segment has nothing to salvage, or a fork of it is damaged too.
            FormatVersionError: a line is of a newer format (upgrade, do not salvage).
        """
        head = self._require_head(context)
        session_id = head.session_id
        if frozen(self.root, session_id):
            wake_session(self, session_id)
        with (
            self.lock_context(context),
            self._head_lock(context),
            self._session_lock(session_id, shared=True),
        ):
            folder = self._require_folder(context)
            path = folder / f"{segment_id}{SEGMENT_SUFFIX}"
            header, entries, bad = readable_lines(read_file(path), str(path))
            if not bad and header is not None:
                raise StoreError(f"{path}: no damaged line to salvage")
            done = salvaged_into(folder)
            side = None  # an interrupted salvage wrote it before its new segment
            if bad and segment_id not in done:
                lost = b"".join(line + b"\n" for _, line in bad)
                side = set_aside_once(path, lost)
            new_id, seqs = salvage_copy(folder, segment_id, header, entries, done, head)
            copies = copy_forks(folder, segment_id, new_id, seqs, done)
            head = self._persist_head(folder)
            moved = new_id if head.segment_id == segment_id else copies.get(head.segment_id)
            if moved is not None:
                new = PodMetadata(head.context, head.session_id, moved, head.created_at, utc_now())
                self._write_head(folder / HEAD, new, unreadable=False)
            self._folders[session_id] = folder
            self._mark(session_id)
            return Salvage(
                segment_id, new_id, len(entries), [n for n, _ in bad], side, copies, moved
            )

    def next_seq(self, session_id: SessionId, segment_id: SegmentId) -> int:
        """The seq the next append gets (from the descriptor an append left open, if any)."""
        with self._lock:
            handle = self._open.get(segment_id)
            if handle is not None and handle.session_id == session_id:
                with contextlib.suppress(SegmentNotFound):
                    return self._live_next_seq(handle, segment_id)
        return self._reading(session_id, lambda: self._next_seq(session_id, segment_id))

    def _next_seq(self, session_id: SessionId, segment_id: SegmentId) -> int:
        folder = self._session_folder(session_id)
        if frozen(self.root, session_id):
            return len(self._lines(session_id, folder, segment_id))
        with self._lock:
            try:  # opened before a freeze, thaw or delete: SegmentNotFound, look again (_reading)
                return self._live_next_seq(self._handle(session_id, segment_id), segment_id)
            except (_Moved, OSError) as exc:
                if isinstance(exc, OSError) and exc.errno != errno.EROFS:
                    raise
                # Not writable: sealed by a freeze, or a read-only store. Its lines are final,
                # so count them, as a read (FileNotFoundError if a freeze moved it: look again).
                return len(whole_lines(folder, f"{segment_id}{SEGMENT_SUFFIX}", cold=False))

    def _live_next_seq(self, handle: _Open, segment_id: SegmentId) -> int:
        """An open segment file's next seq (hold ``self._lock``); sealed or unlinked, its
        descriptor is closed and SegmentNotFound raised."""
        fcntl.flock(handle.fd, fcntl.LOCK_EX)
        try:
            if self._caught_up(handle, segment_id, set_aside=False):  # a read
                return handle.next_seq
        finally:
            fcntl.flock(handle.fd, fcntl.LOCK_UN)
        self._forget(segment_id)
        raise SegmentNotFound(f"segment {segment_id} moved")

    def _caught_up(self, handle: _Open, segment_id: SegmentId, *, set_aside: bool = True) -> bool:
        """With the file locked: False if it is sealed or unlinked; else :meth:`_rescan` it."""
        st = os.fstat(handle.fd)
        if st.st_nlink == 0 or sealed(st.st_mode):
            return False
        if st.st_size != handle.size:
            self._rescan(handle, segment_id, set_aside=set_aside)
        return True

    def list_segments(self, session_id: SessionId) -> list[SegmentId]:
        """The session's segment ids, oldest first (UUIDv7 order)."""
        return self._reading(
            session_id, lambda: self._ids(session_id, self._session_folder(session_id))
        )

    def append_trace(
        self, session_id: SessionId, segment_id: SegmentId, entries: Sequence[TraceEntry]
    ) -> None:
        """Append to ``{segment}.trace.jsonl`` (one ``O_APPEND`` write), waking a frozen session."""
        with self._hot(session_id):
            folder = self._session_folder(session_id)
            if not (folder / f"{segment_id}{SEGMENT_SUFFIX}").exists():
                raise SegmentNotFound.of(session_id, segment_id)
            if not entries:
                return
            path = folder / f"{segment_id}{TRACE_SUFFIX}"
            write_to(path, b"".join(codec.encode_line(e.to_dict()) for e in entries), os.O_APPEND)

    def read_trace(self, session_id: SessionId, segment_id: SegmentId) -> list[dict[str, Any]]:
        """The segment's debug trace (a torn last line is skipped: traces are best effort)."""
        return self._reading(session_id, lambda: self._read_trace(session_id, segment_id))

    def _read_trace(self, session_id: SessionId, segment_id: SegmentId) -> list[dict[str, Any]]:
        folder = self._session_folder(session_id)
        cold = frozen(self.root, session_id)
        if cold and not (folder / f"{segment_id}{SEGMENT_SUFFIX}{ZST}").exists():
            raise SegmentNotFound.of(session_id, segment_id)
        try:
            lines = whole_lines(folder, f"{segment_id}{TRACE_SUFFIX}", cold=cold)
        except FileNotFoundError:
            if frozen(self.root, session_id) != cold:
                raise  # a freeze or thaw meanwhile: read again
            return []
        return [codec.decode(line) for line in lines]

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
            if self.derived is not None:
                self.derived.close()

    # ---------------------------------------------------------------- index

    def reindex(self) -> int:
        """Rebuild ``.index`` from the folders and write every lost head; the contexts indexed.
        A context two folders hold is indexed at its most recently active one."""
        with self._quiet(exclusive=True):  # a move meanwhile would leave the new index behind
            return self._rebuild_index(write_heads=True)

    def quiesced(self, *, writing: bool = True) -> AbstractContextManager[None]:
        """Hold ``.locks/lifecycle`` exclusively: no move runs meanwhile, in any process. With
        ``writing=False`` no lock file is made (a read-only store)."""
        return self._quiet(exclusive=True, create=writing)

    def _rebuild_index(self, *, write_heads: bool) -> int:
        """Rebuild ``.index`` from the folders (and, with ``write_heads``, lost heads)."""
        fresh = self._inside(self.root / INDEX) / f"new-{uuid.uuid4().hex}"
        try:  # a full disk part way leaves no half-built index behind
            chosen = self._build_index(fresh, write_heads)
        except BaseException:
            remove_tree(fresh)
            raise
        with self._lock_file("index"):
            if not write_heads and not self._index_lost():
                # A lookup that found no index: another process rebuilt it meanwhile, and
                # a create since may have written to it, which this older walk lacks.
                self._discard(fresh)
                return len(chosen)
            for part in ("contexts", "sessions"):
                self._swap_in(fresh / part, self.root / INDEX / part)
        os.rmdir(fresh)
        self._folders.clear()
        return len(chosen)

    def _build_index(self, fresh: Path, write_heads: bool) -> dict[ContextId, ContextFolder]:
        """Write an index into the folder ``fresh``; the context folders it points at."""
        make_dirs(fresh / "contexts")
        make_dirs(fresh / "sessions")
        entries = [self._repaired(entry) if write_heads else entry for entry in self.walk()]
        chosen: dict[ContextId, ContextFolder] = {}
        # Pointers are written in place, not atomically: no one reads an index being built.
        for entry in sorted(entries, key=activity, reverse=True):  # of two, the most recent
            chosen.setdefault(entry.context, entry)  # a damaged one too: reported, not hidden
            if entry.head is None:
                log.warning("%s", entry.problem)
                continue
            data = pointer(entry.context, entry.folder.relative_to(self.root).as_posix())
            write_to(fresh / "sessions" / str(entry.head.session_id), data, os.O_TRUNC)
        for context, entry in chosen.items():
            make_dirs(fresh / "contexts" / context.type)
            data = pointer(context, entry.folder.relative_to(self.root).as_posix())
            write_to(fresh / "contexts" / context.type / context.encoded_name, data, os.O_TRUNC)
        return chosen

    def _swap_in(self, fresh: Path, old: Path) -> None:
        """Replace the index part ``old`` with ``fresh``. An entry a lock-free reader wrote
        between the removal and the rename is removed again (``fresh`` saw its folder too)."""
        while True:
            if old.exists():
                self._discard(old)
            try:
                os.rename(fresh, old)
                return
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise

    def _repaired(self, entry: ContextFolder) -> ContextFolder:
        """A walked folder, its head written back if it was rebuilt (None if it cannot be)."""
        head = None
        if entry.head is not None:
            with contextlib.suppress(CorruptLog):  # damaged since the walk read it
                with self._head_lock(entry.context):
                    head = self._persist_head(entry.folder)
        return ContextFolder(entry.context, entry.folder, head, entry.problem)

    def index_source(self) -> FsChanges:
        """What the derived index reads of this store's files (``Indexed``, :mod:`._changes`).
        A lost ``.index`` folder has its pointers rebuilt first, unless the store is read-only
        or the disk full."""
        index = self.root / INDEX
        if not (index / "contexts").exists() and not (index / INDEX_DB).exists():
            try:
                self.reindex()
            except OSError as exc:
                if _db.kind(exc) not in ("readonly", "full"):
                    raise
                log.warning("cannot rebuild the index of %s: %s", self.root, exc)
        return FsChanges(self.root)

    def _mark(self, session_id: SessionId) -> None:
        """Leave the search index's dirty marker; never fails the write that calls it."""
        try:
            mark_dirty(self.root, session_id)
        except (OSError, StoreError) as exc:  # a full disk; a link out of the root
            log.warning("could not mark session %s for the search index: %s", session_id, exc)

    # ---------------------------------------------------------------- internals

    def _handle(self, session_id: SessionId, segment_id: SegmentId) -> _Open:
        handle = self._open.get(segment_id)
        if handle is not None:
            if handle is not self._recent:  # a run of appends to one segment skips the move
                self._open.move_to_end(segment_id)
                self._recent = handle
            return handle
        path = self._session_folder(session_id) / f"{segment_id}{SEGMENT_SUFFIX}"
        try:
            fd = open_segment(path, os.O_RDWR | os.O_APPEND, segment_id)
        except PermissionError:  # sealed by a freeze (for a user other than root)
            raise _Moved(str(segment_id)) from None
        handle = _Open(fd, session_id)
        self._open[segment_id] = handle
        self._recent = handle
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

    def _rescan(
        self, handle: _Open, segment_id: SegmentId, *, set_aside: bool = True
    ) -> TornTail | None:
        """With the file locked: update the handle's size and next seq; the torn tail moved.

        A size changed with no entry added means a line was rewritten in place (the log is
        append-only): the whole file is decoded then, and only then, so that a writer holding
        its state in memory never appends after a damaged line (CorruptLog names it)."""
        path = self._session_folder(handle.session_id) / f"{segment_id}{SEGMENT_SUFFIX}"
        size, next_seq, torn = scan_tail(handle.fd, path, segment_id, set_aside=set_aside)
        if next_seq == handle.next_seq and size != handle.size:
            codec.decode_lines(os.pread(handle.fd, size, 0), where=str(path), first_seq=0)
        handle.size, handle.next_seq = size, next_seq
        return torn

    def _write_new(self, path: Path, data: bytes) -> None:
        """Create ``path`` holding ``data``, whole; ``FileExistsError`` if it exists."""
        write_new(path, data, sync=self._sync)

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


def _check_type(context: ContextId) -> None:
    """Refuse the type ``archive``: its folder is the archive's on a filesystem store."""
    if context.type == ARCHIVE:
        raise InvalidContextId(
            f"invalid context type {ARCHIVE!r} ({context}): a filesystem store keeps its "
            "archive in the folder of that name"
        )
