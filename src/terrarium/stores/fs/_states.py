"""``FsStore``'s state records and lifecycle moves (the ``SessionStates`` primitives).

* **Records**: ``.states/{session}.json``, replaced atomically under the session's lock
  ``.locks/session/{id}``; it stays put when the session's folder moves. All of them, read
  once, are kept (in memory, and derived in ``.index/records.json``) while ``.states/`` and
  ``.detached/`` keep their mtime: a listing page opens one file, not one per record.
* **Freeze in place**: each log file becomes ``{name}.zst``; the record (with ``cold``) is the
  commit. Before it the ``.zst`` files are a killed freeze's leftovers, after it the plain ones
  are; a thaw is the reverse. The freezer holds every segment's ``flock`` and seals each
  (``0400``), so an append that waited finds its file deleted or sealed and looks again.
* **Detach** renames the folder to ``.detached/{session}/``, the new record written first to
  ``{session}.detach.json``: the rename decides whether that file is the record or a leftover.
* **Delete** renames ``.detached/{session}/`` into ``.staging/``, removes the record, then the
  folder.

Moves hold the session's lock exclusively and ``.locks/lifecycle`` shared (``fsck`` and
``reindex`` hold it exclusively); writers hold the session's lock shared. A move first settles
the provable leftovers of a killed one (:meth:`FsStates._settle`). Lock order: lifecycle, head,
session.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import stat
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from terrarium import codec
from terrarium.errors import (
    ConflictError,
    ContextNotFound,
    CorruptLog,
    SegmentNotFound,
    SessionAttached,
    StoreError,
)
from terrarium.model import ContextId, SegmentId, SessionId
from terrarium.stores._archive import compress, unpack
from terrarium.stores._files import fsync_dir, listdir, make_dirs, write_atomic, write_new
from terrarium.stores.base import SessionRecord
from terrarium.stores.fs._heads import folder_context, head_of
from terrarium.stores.fs._layout import (
    DETACHED,
    INDEX,
    LOCKS,
    SEGMENT_SUFFIX,
    STAGING,
    STATES,
    TRACE_SUFFIX,
    ZST,
    has_segments,
    is_uuid,
    real_dir,
)
from terrarium.stores.fs._segments import read_file
from terrarium.stores.fs._tree import Tree
from terrarium.stores.locks import file_lock, remove_lock

PENDING = ".detach.json"
RECORDS = "records.json"
_KEPT = msgspec.json.Decoder(tuple[list[int], list[SessionRecord]])
STILL_NS = 2_000_000_000
"""A folder younger than this may change again in its mtime's tick (a jiffy; seconds on some
filesystems): what is read of it then is not kept."""
SEALED = 0o400
_LEGACY = re.compile(r"legacy-\d+\.json\.zst")
"""A legacy JSON file of a frozen context, taken along (its place is in ``cold.legacy``)."""

log = logging.getLogger("terrarium.stores.fs")


def read_record(path: Path) -> dict[str, Any] | None:
    """The record in ``path``; None if there is none. CorruptLog if it is not one."""
    try:
        return msgspec.convert(codec.decode(read_file(path)), dict[str, Any])
    except FileNotFoundError:
        return None
    except ValueError as exc:  # not JSON, or not an object (msgspec.ValidationError)
        raise CorruptLog(f"{path}: not a readable state record ({exc})") from None


def frozen(root: Path, session_id: SessionId | str) -> bool:
    """Whether the session is frozen (its record has ``cold``); one ``open`` if it has none."""
    try:
        return "cold" in (read_record(root / STATES / f"{session_id}.json") or {})
    except CorruptLog:
        return False


def log_file(name: str) -> bool:
    """Whether ``name`` is a plain log file: a segment, its trace or a side file of either."""
    return (
        len(name) > 36
        and name[36:].startswith((SEGMENT_SUFFIX, TRACE_SUFFIX))
        and not name.endswith(ZST)
        and is_uuid(name[:36])
    )


def cold_file(name: str) -> bool:
    """Whether ``name`` is a frozen file: a log file's ``.zst``, or a legacy file's."""
    return name.endswith(ZST) and (log_file(name[: -len(ZST)]) or bool(_LEGACY.fullmatch(name)))


def sealed(mode: int) -> bool:
    """Whether a segment file of this mode was sealed by a freeze (no write bit)."""
    return not mode & stat.S_IWUSR


def whole_lines(folder: Path, name: str, *, cold: bool) -> list[bytes]:
    """The complete lines of file ``name`` (``cold``: of ``{name}.zst``), if there is one."""
    path = folder / f"{name}{ZST}" if cold else folder / name
    data = read_file(path)
    complete, _ = codec.split_complete(unpack(data, where=str(path)) if cold else data)
    return codec.split_lines(complete)


def remove_tree(folder: Path) -> None:
    """Delete ``folder`` and all in it, best effort."""
    import shutil  # not at import: it loads bz2, lzma and zlib

    shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _segment_locks(folder: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on every segment file of ``folder`` and seal each one."""
    fds: list[int] = []
    try:
        for name in sorted(listdir(folder)):
            if log_file(name) and name.endswith(SEGMENT_SUFFIX):
                fd = os.open(folder / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                fds.append(fd)
                fcntl.flock(fd, fcntl.LOCK_EX)
                os.fchmod(fd, SEALED)
        yield
    finally:
        for fd in fds:
            os.close(fd)


def _keep_cold(state: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` with the ``cold`` key as it is now: only a freeze or a thaw changes it."""
    kept = {k: v for k, v in codec.decode(codec.encode(dict(state))).items() if k != "cold"}
    if "cold" in current:
        kept["cold"] = current["cold"]
    return kept


class FsStates(Tree):
    """The :class:`~terrarium.stores.base.SessionStates` primitives of ``FsStore``."""

    _quiet_depth: threading.local
    _lock: threading.RLock
    _folders: dict[SessionId, Path]
    _sync: bool
    _kept: tuple[list[int], list[SessionRecord]] | None = None
    """The records as :meth:`session_records` read them last, under their key."""
    if TYPE_CHECKING:  # FsStore's, which this class is a part of

        def _mark(self, session_id: SessionId) -> None: ...
        def _forget_session(self, session_id: SessionId) -> None: ...
        def _head_lock(self, context: ContextId) -> contextlib.AbstractContextManager[None]: ...
        def _session_folder(self, session_id: SessionId) -> Path: ...
        def folder_of(self, context: ContextId) -> Path | None: ...

    def _state_path(self, session_id: SessionId, suffix: str = ".json") -> Path:
        return self._inside(self.root / STATES) / f"{session_id}{suffix}"

    def _record(self, session_id: SessionId) -> dict[str, Any] | None:
        """The record as it stands (a pending detach's once its folder has moved)."""
        pending = read_record(self._state_path(session_id, PENDING))
        if pending is not None and has_segments(self.detached_folder(session_id)):
            return pending
        return read_record(self._state_path(session_id))

    def _write_record(self, session_id: SessionId, state: Mapping[str, Any]) -> None:
        path = self._state_path(session_id)
        if state:
            write_atomic(path, codec.encode(dict(state)), sync=self._sync)
        else:
            path.unlink(missing_ok=True)

    def _current(self, session_id: SessionId, expected: Mapping[str, Any]) -> dict[str, Any]:
        """The record (hold the session's lock); ConflictError unless it is ``expected``."""
        now = self.session_state(session_id)
        if now != dict(expected):
            raise ConflictError(f"the state of session {session_id} changed meanwhile")
        return now

    def session_state(self, session_id: SessionId) -> dict[str, Any]:
        """The session's state record (``{}`` if none); SegmentNotFound if no session."""
        record = self._record(session_id)
        if record is None:
            self._session_folder(session_id)
            return {}
        return record

    def set_session_state(
        self, session_id: SessionId, state: Mapping[str, Any], *, expected: Mapping[str, Any]
    ) -> None:
        """Replace the record if it is ``expected`` (its ``cold`` key stays as it is)."""
        with self._moving(session_id):
            current = self._current(session_id, expected)
            self._write_record(session_id, _keep_cold(state, current))

    def session_records(self) -> list[SessionRecord]:
        """Every session with a non-empty record (``.states/``), with its owner; read once
        for each :meth:`_records_key` (module docstring)."""
        key = self._records_key()
        if key is None:
            return self._read_records()
        kept = self._kept
        if kept is None or kept[0] != key:
            path = self._inside(self.root / INDEX) / RECORDS
            with contextlib.suppress(OSError, StoreError, ValueError):
                kept = _KEPT.decode(read_file(path))
            if kept is None or kept[0] != key:
                kept = (key, self._read_records())
                with contextlib.suppress(OSError):  # read-only: each process reads them
                    if kept[1]:  # none: as quick to read again, and a read writes nothing
                        write_atomic(path, msgspec.json.encode(kept), sync=False)
            self._kept = kept
        return list(kept[1])

    def _records_key(self) -> list[int] | None:
        """The inode and mtime of ``.states/`` and ``.detached/``, which every record write,
        detach, attach and delete changes; None while one is a link or younger than ``STILL_NS``."""
        now, key = time.time_ns(), []
        for name in (STATES, DETACHED):
            with contextlib.suppress(OSError):  # none yet
                found = os.lstat(self.root / name)
                if stat.S_ISLNK(found.st_mode) or found.st_mtime_ns > now - STILL_NS:
                    return None  # a link is never followed out, nor its target's times kept
                key += [found.st_ino, found.st_mtime_ns]
        return key

    def _read_records(self) -> list[SessionRecord]:
        found = []
        names = listdir(self.root / STATES)  # a pending detach's too: _record tells if it holds
        for stem in sorted({n.removesuffix(PENDING).removesuffix(".json") for n in names}):
            if not is_uuid(stem):
                continue
            session_id = uuid.UUID(stem)
            try:
                state = self._record(session_id)
            except CorruptLog:
                continue
            if state:
                found.append(SessionRecord(session_id, self._owner_or_none(session_id), state))
        return found

    def _owner_or_none(self, session_id: SessionId) -> str | None:
        try:
            return self.session_owner(session_id)
        except SegmentNotFound:
            return None  # a record whose session is gone: a delete that was killed

    def session_owner(self, session_id: SessionId) -> str | None:
        """The session's context; None if it is detached. SegmentNotFound if no session."""
        if has_segments(self.detached_folder(session_id)):
            return None
        with self._lock:
            self._folders.pop(session_id, None)
        folder = self._session_folder(session_id)
        # The folder names its context ({type}/{date}/{name}): no head or segment is read, so
        # a freeze or thaw swapping the files meanwhile cannot make it look damaged.
        return folder_context(folder) or head_of(folder)[0].context

    def unowned_sessions(self) -> list[SessionId]:
        """Every session in ``.detached/``, oldest first."""
        return [session_id for session_id, _ in self.detached()]

    def freeze_session(
        self,
        session_id: SessionId,
        *,
        expected: Mapping[str, Any],
        state: Mapping[str, Any],
        along: Sequence[Path] = (),
    ) -> dict[str, Any]:
        """Compress the session's log files in place; the record (with ``cold``) commits."""
        with self._moving(session_id):
            current = self._current(session_id, expected)
            stored = _keep_cold(state, current)
            if "cold" in current:
                self._write_record(session_id, stored)
                return stored
            folder = self._session_folder(session_id)
            legacy = [self._inside(path.parent) / path.name for path in along]
            self._forget_session(session_id)
            try:
                with _segment_locks(folder):
                    stored["cold"] = self._pack(folder, legacy)
                    self._mark(session_id)  # before and after: a kill between still marks
                    self._write_record(session_id, stored)  # the commit
                    for name in listdir(folder):
                        if log_file(name):
                            os.unlink(folder / name)
            except BaseException:
                if not frozen(self.root, session_id):
                    self._settle(session_id)  # roll back: unseal, drop the copies
                raise
            for path in legacy:
                path.unlink(missing_ok=True)
            self._mark(session_id)  # the search index drops it
            return stored

    def _pack(self, folder: Path, legacy: list[Path]) -> dict[str, Any]:
        """Write ``{name}.zst`` of every log file (and legacy file); the ``cold`` value."""
        hot = packed = 0
        for name in sorted(listdir(folder)):
            if log_file(name):
                data = read_file(folder / name)
                small = compress(data)
                write_atomic(folder / f"{name}{ZST}", small, sync=self._sync)
                hot, packed = hot + len(data), packed + len(small)
        places = []
        for n, path in enumerate(legacy, 1):
            small = compress(read_file(path))
            write_atomic(folder / f"legacy-{n}.json{ZST}", small, sync=self._sync)
            places.append(path.relative_to(self.root).as_posix())
        cold: dict[str, Any] = {"hot_bytes": hot, "cold_bytes": packed}
        if places:
            cold["legacy"] = places
        return cold

    def thaw_session(
        self, session_id: SessionId, *, expected: Mapping[str, Any], state: Mapping[str, Any]
    ) -> None:
        """Decompress the session's files in place; the record (without ``cold``) commits."""
        with self._moving(session_id):
            current = self._current(session_id, expected)
            hot = _keep_cold(state, {})
            folder = self._session_folder(session_id)
            for name in sorted(listdir(folder)):
                if cold_file(name) and not _LEGACY.fullmatch(name):
                    data = unpack(read_file(folder / name), where=str(folder / name))
                    write_atomic(folder / name[: -len(ZST)], data, sync=self._sync)
            places = current.get("cold", {}).get("legacy") or []
            for n, rel in enumerate(places, 1):
                self._put_back(folder / f"legacy-{n}.json{ZST}", str(rel))
            self._mark(session_id)
            self._write_record(session_id, hot)  # the commit
            for name in sorted(listdir(folder), key=lambda n: not _LEGACY.fullmatch(n)):
                if cold_file(name):  # the legacy files' first: see _leftovers_in
                    os.unlink(folder / name)
            self._mark(session_id)

    def _put_back(self, packed: Path, rel: str) -> None:
        """Write a legacy file back where it lay; where another file lies now, beside it as
        ``{name}.archived-{n}`` (unless that one holds the same bytes)."""
        parts = rel.split("/")
        if not 1 <= len(parts) <= 3 or any(p in ("", ".", "..") for p in parts):
            return  # not a place a legacy file lies
        place = self._inside(self.root.joinpath(*parts[:-1])) / parts[-1]
        make_dirs(place.parent)
        data = unpack(read_file(packed), where=str(packed))
        for n in range(100):
            at = place.with_name(f"{place.name}.archived-{n}") if n else place
            try:
                write_new(at, data, sync=self._sync)
            except FileNotFoundError:
                return  # the folder went meanwhile
            except FileExistsError:
                if read_file(at) == data:
                    return
                continue
            if n:
                log.warning("%s: another file lies there; the archived one is now %s", place, at)
            return
        raise StoreError(f"{place}: no free name to put the archived legacy file back as")

    def detach_context(
        self,
        context: ContextId,
        session_id: SessionId,
        *,
        expected: Mapping[str, Any],
        state: Mapping[str, Any],
        segment_id: SegmentId | None = None,
    ) -> None:
        """Rename the context's folder to ``.detached/{session}/`` (the commit of the pending
        record), then drop its index entries."""
        with self._quiet(), self._head_lock(context), self._session_lock(session_id):
            self._settle(session_id)
            current = self._current(session_id, expected)
            folder = self.folder_of(context)
            head = head_of(folder)[0] if folder is not None else None
            if folder is None or head is None or head.session_id != session_id:
                raise ContextNotFound(f"context {context} is not on session {session_id}")
            if segment_id not in (None, head.segment_id):  # moved since the caller read it
                raise ContextNotFound(f"the head of {context} moved off {segment_id}")
            pending = self._state_path(session_id, PENDING)
            write_atomic(pending, codec.encode(_keep_cold(state, current)), sync=self._sync)
            self._mark(session_id)  # the search index drops it
            self._forget_session(session_id)
            target = self.detached_folder(session_id)
            make_dirs(target.parent)
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(target)  # an empty folder: a create_session killed before its segment
            os.rename(folder, target)  # the commit
            if self._sync:
                fsync_dir(folder.parent)
                fsync_dir(target.parent)
            os.replace(pending, self._state_path(session_id))
            for path in (Path(self._index_file(context)), self._session_index_path(session_id)):
                path.unlink(missing_ok=True)
            self._folders[session_id] = target
        remove_lock(self._lock_path("head", context.type, context.encoded_name))  # name is free

    def delete_session(self, session_id: SessionId) -> bool:
        """Delete a detached session through ``.staging/``, then its lock files; False if
        there is none."""
        deleted = self._delete_session(session_id)
        for parts in (("session",), ("create",), ("turn", "detached")):  # the last: old copies'
            remove_lock(self._lock_path(*parts, str(session_id)))
        return deleted

    def _delete_session(self, session_id: SessionId) -> bool:
        with self._moving(session_id):
            folder = self.detached_folder(session_id)
            record = self._state_path(session_id)
            if not has_segments(folder):
                owner = self._owner_or_none(session_id)
                if owner is not None:
                    raise SessionAttached(f"session {session_id} belongs to context {owner}")
                if not record.exists():
                    return False
                record.unlink()  # a delete killed after its folder went: finished
                return True
            staged = self._inside(self.root / STAGING) / f"{session_id}-{uuid.uuid4().hex}"
            make_dirs(staged.parent)
            self._forget_session(session_id)
            os.rename(folder, staged)
            if self._sync:
                fsync_dir(folder.parent)
            record.unlink(missing_ok=True)
            remove_tree(staged)
            return True

    # ----------------------------------------------------------------------- locks

    @contextlib.contextmanager
    def _quiet(self, *, exclusive: bool = False, create: bool = True) -> Iterator[None]:
        """Hold ``.locks/lifecycle``: shared for a move, exclusive to keep every move out
        (once per thread: a move inside a call that holds it goes on)."""
        if getattr(self._quiet_depth, "depth", 0):
            yield
            return
        with self._lock_file("lifecycle", shared=not exclusive, create=create):
            self._quiet_depth.depth = 1
            try:
                yield
            finally:
                self._quiet_depth.depth = 0

    def _session_lock(
        self, session_id: SessionId, *, shared: bool = False, create: bool = True
    ) -> contextlib.AbstractContextManager[None]:
        """``.locks/session/{id}``: moves hold it exclusively, writers shared."""
        return self._lock_file("session", str(session_id), shared=shared, create=create)

    def _lock_file(
        self, *parts: str, shared: bool = False, create: bool = True
    ) -> contextlib.AbstractContextManager[None]:
        """The ``flock`` on ``.locks/{parts}``, exclusive or ``shared`` (see ``file_lock``)."""
        kind = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        return file_lock(self._lock_path(*parts), kind, create=create)

    def _lock_path(self, *parts: str) -> Path:
        """``.locks/{parts}``, its folder checked to be inside the store."""
        path = self.root.joinpath(LOCKS, *parts)
        return self._inside(path.parent) / path.name

    @contextlib.contextmanager
    def _moving(self, session_id: SessionId) -> Iterator[None]:
        """Hold what a move of the session holds, and settle what a killed one left."""
        with self._quiet(), self._session_lock(session_id):
            self._settle(session_id)
            yield

    # ----------------------------------------------------------------------- clean-up

    def _settle(self, session_id: SessionId) -> None:
        """Finish or undo what a killed move left (hold the session's lock)."""
        pending = self._state_path(session_id, PENDING)
        if pending.exists():
            if has_segments(self.detached_folder(session_id)):
                os.replace(pending, self._state_path(session_id))
            else:
                pending.unlink()
        try:
            with self._lock:
                self._folders.pop(session_id, None)
            folder = self._session_folder(session_id)
        except SegmentNotFound:
            return
        cold = frozen(self.root, session_id)
        for path in self._leftovers_in(folder, cold):
            if cold or not log_file(path.name):
                path.unlink(missing_ok=True)
            else:
                os.chmod(path, 0o600)  # sealed by a freeze that did not commit

    def _leftovers_in(self, folder: Path, cold: bool) -> list[Path]:
        """The files of a killed freeze or thaw: a plain log file beside its ``.zst`` (frozen)
        or a ``.zst`` beside its plain file (hot; then its legacy ``.zst`` files too), and
        temporary files. A file without its twin never is: a lost record must not cost a
        frozen session its files. Last, a hot session's log files that a freeze sealed: in a
        folder that keeps its write bit (a store made read-only has none left to tell by)."""
        names = set(listdir(folder))
        if cold:
            left = {n for n in names if log_file(n) and f"{n}{ZST}" in names}
        else:
            left = {n for n in names if cold_file(n) and n[: -len(ZST)] in names}
            left |= {n for n in names if left and _LEGACY.fullmatch(n)}
        left |= {n for n in names if n.startswith(".tmp-")}
        found = [folder / name for name in sorted(left)]
        if not cold and os.lstat(folder).st_mode & stat.S_IWUSR:
            logs = [folder / name for name in sorted(names) if log_file(name)]
            found += [path for path in logs if sealed(os.lstat(path).st_mode)]
        return found

    def unfinished_moves(self) -> list[Path]:
        """What killed moves left (``fsck`` reports it; :meth:`finish_moves` removes it)."""
        return [path for _, path in self._leftovers()]

    def _leftovers(self) -> list[tuple[SessionId | None, Path]]:
        """Each leftover with the session whose lock guards it (None: ``.staging/``)."""
        left: list[tuple[SessionId | None, Path]] = [
            (None, self.root / STAGING / n) for n in sorted(listdir(self.root / STAGING))
        ]
        for name in sorted(listdir(self.root / STATES)):
            if name.endswith(PENDING) and is_uuid(name.removesuffix(PENDING)):
                left.append((uuid.UUID(name.removesuffix(PENDING)), self.root / STATES / name))
            elif name.startswith(".tmp-"):
                left.append((None, self.root / STATES / name))
        folders = [(e.head.session_id, e.folder) for e in self.walk() if e.head is not None]
        for session_id, folder in [*folders, *self.detached()]:
            found = self._leftovers_in(folder, frozen(self.root, session_id))
            left += [(session_id, path) for path in found]
        return left

    def finish_moves(self) -> int:
        """Remove what killed moves left, each session's under its lock; how many there were."""
        left = self._leftovers()
        for session_id, path in left:
            if session_id is None and real_dir(path):
                remove_tree(path)
            elif session_id is None:
                path.unlink(missing_ok=True)
        for session_id in sorted({s for s, _ in left if s is not None}):
            with self._moving(session_id):
                pass  # a move settles what a killed one left first
        return len(left)
