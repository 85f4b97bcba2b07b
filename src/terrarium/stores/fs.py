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
    .index/search.db                  full-text search and listing index (derived)
    .index/dirty/{session uuid}       "this session changed" markers for that index

Names are encoded with :func:`terrarium.model.encode_name`, so no context name can escape the
root, and safe names (``#python``) stay readable. The index is derived: ``reindex()`` rebuilds
it from the ``head.json`` files, which are the truth.

**Appends.** Each append is one ``write(2)`` of whole lines to a file opened ``O_APPEND``, made
under an exclusive ``flock`` on that file: writers in many processes never interleave inside a
line, and the lock makes the ``expected_seq`` check and the write one step. The lines of a
multi-entry append are framed by :func:`terrarium.codec.encode_lines` (all but the last end in
``" \\n"``), so a crash after some of its lines leaves a torn tail like any other. The writer
keeps the file's size and next seq from its last append; when another process has appended
since (the size differs), it re-reads only the file's last line. File descriptors are cached
(LRU), so an append costs a lock, an ``fstat`` and a ``write``.

**Durability.** ``durability="flush"`` (the default) hands each append to the kernel before
acknowledging it: it survives the death of the process (``kill -9``), not a power cut, at the
cost of a write (~3 µs). ``"fsync"`` adds an ``fdatasync`` per append (~135 µs here) and
survives power loss. ``"batch"`` acknowledges at once and ``fdatasync``s dirty segments every
``batch_interval`` seconds from a background thread: a power cut loses at most that window.

**Search.** :meth:`FsStore.search` and :meth:`FsStore.list_contexts_fast` read a derived SQLite
FTS5 index that is brought up to date on use; writers only leave a marker file per changed
session (see :mod:`terrarium.stores.fs_search`).

**Torn tails.** A writer killed mid-``write`` (or a full disk) can leave bytes after the last
complete append (:func:`terrarium.codec.split_complete`). A reader that sees them takes the
file's lock (so it never mistakes a write in progress for a torn one), copies the bytes to
``{segment}.jsonl.torn-{offset}``, truncates them away and reports a
:class:`~terrarium.model.TornTail`; a writer that finds them does the same (and logs it) before
it appends. A short write is rolled back by the writer itself before it raises.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import math
import mmap
import os
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
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
    utc_now,
)
from terrarium.stores import fs_search
from terrarium.stores.base import (
    NewEntry,
    PodMetadata,
    SearchHit,
    SearchQuery,
    SegmentRead,
    header_line,
    iter_lines,
)
from terrarium.stores.fts import ContextSummary
from terrarium.stores.locks import file_lock

log = logging.getLogger(__name__)

Durability = Literal["flush", "fsync", "batch"]
DURABILITIES: tuple[str, ...] = ("flush", "fsync", "batch")

_INDEX = ".index"
_LOCKS = ".locks"
_TRASH = ".trash"
_HEAD = "head.json"
_SEGMENT_SUFFIX = ".jsonl"
_TRACE_SUFFIX = ".trace.jsonl"
_MAX_OPEN = 256


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
        self.root.mkdir(parents=True, exist_ok=True)
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

    def folder_of(self, context: ContextId) -> Path | None:
        """The folder holding the context's files, or None if the context does not exist."""
        try:
            folder = self.root / _read_pointer(self._index_path(context))
        except FileNotFoundError:
            return None
        return folder if (folder / _HEAD).exists() else None

    def _session_folder(self, session_id: SessionId) -> Path:
        folder = self._folders.get(session_id)
        if folder is not None:
            return folder
        try:
            folder = self.root / _read_pointer(self._session_index_path(session_id))
        except FileNotFoundError:
            raise SegmentNotFound(f"session {session_id} does not exist") from None
        self._folders[session_id] = folder
        return folder

    def _segment_path(self, session_id: SessionId, segment_id: SegmentId) -> Path:
        return self._session_folder(session_id) / f"{segment_id}{_SEGMENT_SUFFIX}"

    # ---------------------------------------------------------------- heads

    def get_head(self, context: ContextId) -> PodMetadata | None:
        """Return the context's head record, or None."""
        folder = self.folder_of(context)
        if folder is None:
            return None
        try:
            return _read_head(folder / _HEAD)
        except FileNotFoundError:
            return None

    def set_head(
        self, context: ContextId, segment_id: SegmentId, *, expected: SegmentId
    ) -> PodMetadata:
        """Move the head if it is ``expected`` now (compare-and-set under the context lock)."""
        with self._head_lock(context):
            head = self.get_head(context)
            if head is None:
                raise ContextNotFound(f"context {context} does not exist")
            if head.segment_id != expected:
                raise ConflictError(
                    f"head of {context} is {head.segment_id}, not {expected}: it moved"
                )
            folder = self._session_folder(head.session_id)
            if not (folder / f"{segment_id}{_SEGMENT_SUFFIX}").exists():
                raise SegmentNotFound(f"segment {segment_id} is not in {context}'s session")
            new = PodMetadata(head.context, head.session_id, segment_id, head.created_at, utc_now())
            self._write_atomic(folder / _HEAD, codec.encode(_head_dict(new)))
            self._mark(head.session_id)
            return new

    def list_contexts(self, type: str | None = None) -> list[PodMetadata]:
        """Every head record, sorted by context id (reads the index, walks no date folders)."""
        base = self.root / _INDEX / "contexts"
        types = [type] if type is not None else sorted(_listdir(base))
        heads: list[PodMetadata] = []
        for kind in types:
            for encoded in sorted(_listdir(base / kind)):
                try:
                    context = ContextId(kind, decode_name(encoded))
                except ValueError:
                    continue
                head = self.get_head(context)
                if head is not None:
                    heads.append(head)
        return sorted(heads, key=lambda h: ContextId.parse(h.context))

    # ---------------------------------------------------------------- contexts

    def lock_context(self, context: ContextId) -> AbstractContextManager[None]:
        """Hold the context's lock exclusively (threads and processes alike).

        This is the callers' lock (the manager holds it for a whole turn). The store's own
        create, delete and head moves take a separate, brief lock, so they work inside it.
        """
        return file_lock(self.root / _LOCKS / "turn" / context.type / context.encoded_name)

    def _head_lock(self, context: ContextId) -> AbstractContextManager[None]:
        return file_lock(self.root / _LOCKS / "head" / context.type / context.encoded_name)

    def create_context(self, context: ContextId, header: Mapping[str, Any]) -> PodMetadata:
        """Create the context's folder, root segment, head and index entries."""
        line = header_line(header)
        session_id = uuid.UUID(str(line["session_id"]))
        segment_id = uuid.UUID(str(line["segment_id"]))
        created = str(line["ts"])
        with self._head_lock(context):
            if self.get_head(context) is not None:
                raise ContextExists(f"context {context} already exists")
            rel = Path(context.type) / created[:10] / context.encoded_name
            folder = self.root / rel
            if (folder / _HEAD).exists():
                # The context is there but the index lost it (a crash before the index write,
                # or a deleted .index): head.json is the truth, so index it, never trash it.
                existing = _read_head(folder / _HEAD)
                self._write_index(context, existing.session_id, rel)
                raise ContextExists(f"context {context} already exists (in {folder})")
            if folder.exists():  # left by a crash between mkdir and the head write
                self._trash(folder)
            folder.mkdir(parents=True)
            self._write_new(folder / f"{segment_id}{_SEGMENT_SUFFIX}", codec.encode_line(line))
            head = PodMetadata(str(context), session_id, segment_id, created, created)
            self._write_atomic(folder / _HEAD, codec.encode(_head_dict(head)))
            self._write_index(context, session_id, rel)
            self._folders[session_id] = folder
            self._mark(session_id)
            return head

    def _write_index(self, context: ContextId, session_id: SessionId, rel: Path) -> None:
        pointer = codec.encode({"path": rel.as_posix(), "context": str(context)})
        self._write_atomic(self._session_index_path(session_id), pointer)
        self._write_atomic(self._index_path(context), pointer)

    def delete_context(self, context: ContextId) -> bool:
        """Delete the context: its index entries first, then its folder via ``.trash``."""
        with self._head_lock(context):
            head = self.get_head(context)
            folder = self.folder_of(context)
            if head is None or folder is None:
                return False
            with self._lock:
                for segment_id, handle in list(self._open.items()):
                    if handle.session_id == head.session_id:
                        self._forget(segment_id)
                self._folders.pop(head.session_id, None)
            self._index_path(context).unlink(missing_ok=True)
            self._session_index_path(head.session_id).unlink(missing_ok=True)
            self._trash(folder)
            self._mark(head.session_id)
            return True

    def _trash(self, folder: Path) -> None:
        trash = self.root / _TRASH / uuid.uuid4().hex
        trash.parent.mkdir(parents=True, exist_ok=True)
        os.rename(folder, trash)
        # Also what a process killed mid-delete left (another deleter may share the work).
        for leftover in _listdir(trash.parent):
            shutil.rmtree(trash.parent / leftover, ignore_errors=True)

    # ---------------------------------------------------------------- segments

    def create_segment(self, session_id: SessionId, header: Mapping[str, Any]) -> None:
        """Write a new segment file holding only its header."""
        line = header_line(header)
        path = self._segment_path(session_id, uuid.UUID(str(line["segment_id"])))
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
                    handle.size, handle.next_seq = self._scan_tail(session_id, segment_id, fd)
                first = handle.next_seq
                if expected_seq is not None and expected_seq != first:
                    raise ConflictError(
                        f"segment {segment_id} is at seq {first}, "
                        f"the writer expected {expected_seq}"
                    )
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
        view = memoryview(data)
        try:
            while view:
                written = os.write(fd, view)
                view = view[written:]
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            reason = "the disk is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else exc
            raise StoreError(f"append to segment {segment_id} failed: {reason}") from exc

    def read_segment(
        self, session_id: SessionId, segment_id: SegmentId, *, stop_seq: int | None = None
    ) -> SegmentRead:
        """Read and decode a segment; set aside a torn tail if there is one."""
        path = self._segment_path(session_id, segment_id)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SegmentNotFound(f"segment {segment_id} does not exist ({path})") from None
        lines: list[dict[str, Any]] | None = None
        try:
            size = os.fstat(fd).st_size
            if size:
                # Decoding straight from a memory map saves copying the file. Only bytes up to
                # the end of the last complete append are read, and a torn-tail repair never
                # truncates below that, so the map never points past the end of the file.
                with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
                    if codec.complete_end(mm) == size:
                        lines = codec.decode_lines(mm, where=str(path), first_seq=0)
        finally:
            os.close(fd)
        torn = None
        if lines is None:
            # Maybe a write in progress: only the file lock tells a torn tail from a live one.
            torn, buf = self._set_aside_torn(path, segment_id)
            complete, _ = codec.split_complete(buf)
            lines = codec.decode_lines(complete, where=str(path), first_seq=0)
        if not lines or lines[0].get("kind") != "header":
            raise CorruptLog(f"{path}:1: the first line is not a segment header")
        stop = len(lines) if stop_seq is None else min(stop_seq + 1, len(lines))
        return SegmentRead(lines[0], lines[1:stop], next_seq=len(lines), torn=torn)

    def next_seq(self, session_id: SessionId, segment_id: SegmentId) -> int:
        """The seq the next append gets (reads the file's last line only)."""
        with self._lock:
            handle = self._handle(session_id, segment_id)
            fcntl.flock(handle.fd, fcntl.LOCK_EX)
            try:
                if os.fstat(handle.fd).st_size != handle.size:
                    handle.size, handle.next_seq = self._scan_tail(
                        session_id, segment_id, handle.fd
                    )
                return handle.next_seq
            finally:
                fcntl.flock(handle.fd, fcntl.LOCK_UN)

    def list_segments(self, session_id: SessionId) -> list[SegmentId]:
        """The session's segment ids, oldest first (UUIDv7 order)."""
        folder = self._session_folder(session_id)
        ids = []
        for name in _listdir(folder):
            if name.endswith(_SEGMENT_SUFFIX) and not name.endswith(_TRACE_SUFFIX):
                with contextlib.suppress(ValueError):
                    ids.append(uuid.UUID(name[: -len(_SEGMENT_SUFFIX)]))
        return sorted(ids)

    def append_trace(
        self, session_id: SessionId, segment_id: SegmentId, entries: Sequence[TraceEntry]
    ) -> None:
        """Append to ``{segment}.trace.jsonl`` (one write, ``O_APPEND``)."""
        folder = self._session_folder(session_id)
        if not (folder / f"{segment_id}{_SEGMENT_SUFFIX}").exists():
            raise SegmentNotFound(f"segment {segment_id} of session {session_id} does not exist")
        path = folder / f"{segment_id}{_TRACE_SUFFIX}"
        data = b"".join(codec.encode_line(e.to_dict()) for e in entries)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def read_trace(self, session_id: SessionId, segment_id: SegmentId) -> list[dict[str, Any]]:
        """The segment's debug trace (a torn last line is skipped: traces are best effort)."""
        path = self._session_folder(session_id) / f"{segment_id}{_TRACE_SUFFIX}"
        try:
            complete, _ = codec.split_complete(path.read_bytes())
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
        """Rebuild ``.index`` from the ``head.json`` files; return the contexts indexed."""
        count = 0
        fresh = self.root / _INDEX / f"new-{uuid.uuid4().hex}"
        for head_path in sorted(self.root.glob(f"*/*/*/{_HEAD}")):
            try:
                head = _read_head(head_path)
                context = ContextId.parse(head.context)
            except (CorruptLog, ValueError):
                log.warning("skipping unreadable head %s", head_path)
                continue
            rel = head_path.parent.relative_to(self.root).as_posix()
            pointer = codec.encode({"path": rel, "context": str(context)})
            for path in (
                fresh / "contexts" / context.type / context.encoded_name,
                fresh / "sessions" / str(head.session_id),
            ):
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(pointer)
            count += 1
        (fresh / "contexts").mkdir(parents=True, exist_ok=True)
        (fresh / "sessions").mkdir(parents=True, exist_ok=True)
        index = self.root / _INDEX
        for part in ("contexts", "sessions"):
            old = index / part
            if old.exists():
                self._trash(old)
            os.rename(fresh / part, old)
        fresh.rmdir()
        self._folders.clear()
        if self._search is not None or (index / fs_search.DB_NAME).exists():
            self.search_index.rebuild()  # else the first search builds it
        return count

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
                    except OSError as exc:  # a read-only store: readers answer from the files
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
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SegmentNotFound(f"segment {segment_id} does not exist ({path})") from None
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

    def _scan_tail(self, session_id: SessionId, segment_id: SegmentId, fd: int) -> tuple[int, int]:
        """With the file locked: set aside a torn tail, then return (size, next seq)."""
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
        if complete_end < len(buf):
            path = self._segment_path(session_id, segment_id)
            self._move_torn(path, segment_id, fd, start + complete_end, buf[complete_end:])
            size = start + complete_end
        body = buf[:complete_end]
        if not body:
            raise CorruptLog(f"segment {segment_id} has no complete header line")
        last = body[body.rfind(b"\n", 0, len(body) - 1) + 1 :]
        try:
            seq = codec.decode(last)["seq"]
        except Exception as exc:
            path = self._segment_path(session_id, segment_id)
            raise CorruptLog(f"{path}: the last line is not a valid entry ({exc})") from None
        return size, int(seq) + 1

    def _set_aside_torn(self, path: Path, segment_id: SegmentId) -> tuple[TornTail | None, bytes]:
        """Take the file's lock and set its torn tail aside; return it and the clean bytes."""
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            buf = os.pread(fd, os.fstat(fd).st_size, 0)
            complete, tail = codec.split_complete(buf)
            if not tail:
                return None, buf  # it was a write in progress, now complete
            torn = self._move_torn(path, segment_id, fd, len(complete), tail)
            return torn, complete
        finally:
            os.close(fd)

    def _move_torn(
        self, path: Path, segment_id: SegmentId, fd: int, offset: int, data: bytes
    ) -> TornTail:
        side = path.with_name(f"{path.name}.torn-{offset}")
        number = 1
        while True:  # a new file each time: two crashes at one offset keep their own bytes
            try:
                out = open(side, "xb")
            except FileExistsError:
                number += 1
                side = path.with_name(f"{path.name}.torn-{offset}.{number}")
                continue
            break
        with out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.ftruncate(fd, offset)
        log.warning("%s: set aside %d torn bytes at offset %d to %s", path, len(data), offset, side)
        return TornTail(segment_id, offset, len(data), str(side))

    def _write_new(self, path: Path, data: bytes) -> None:
        """Create ``path`` with ``data``; fail if it exists."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, data)
            if self.durability != "flush":
                os.fsync(fd)
        finally:
            os.close(fd)
        if self.durability != "flush":
            _fsync_dir(path.parent)  # else a power cut can lose the new file's name

    def _write_atomic(self, path: Path, data: bytes) -> None:
        """Replace ``path`` with ``data`` via a temporary file and ``rename``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        # Not derived from the name, so a name of the maximum length still fits.
        tmp = path.with_name(f".tmp-{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, data)
            if self.durability != "flush":
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if self.durability != "flush":
            _fsync_dir(path.parent)

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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


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
    raw = path.read_bytes()
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


def _read_pointer(path: Path) -> str:
    """Read an index entry; return the folder it names, relative to the root."""
    raw = path.read_bytes()
    try:
        folder = codec.decode(raw)["path"]
    except (ValueError, KeyError, TypeError) as exc:
        folder = exc
    if not isinstance(folder, str) or not folder:
        reason = _one_line(folder) if isinstance(folder, Exception) else "no folder named"
        raise CorruptLog(f"{path}: not a valid index entry ({reason}); run reindex to rebuild it")
    return folder


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
