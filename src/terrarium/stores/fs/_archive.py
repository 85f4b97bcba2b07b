"""The archive of an ``FsStore``: inactive contexts, compressed, out of the hot tree.

An archived context lives in ``archive/{type}/{date}/{name}/`` (its creation date, as in the
hot tree): every file of its hot folder (segments, traces, set-aside tails) as ``{file}.zst``,
one zstandard frame each, so anything that scans logs (blob references, ``grep`` through
``zstdcat``) reads them; its ``pinned`` marker if it is pinned; and ``archive.json``, the
manifest: the head record and what a listing shows (``archived_at``, ``last_active``,
``message_count``, hot and archived bytes, each file's hot size), so listing the archive
decompresses nothing. ``.index/archive/{session}`` points at the folder of an archived
session, as ``.index/sessions/{session}`` does for a hot one.

Every move is renames, each safe to kill; while both folders of a context exist, **the hot
one wins** and the archived one is a leftover (a copy that the next archive or
``fsck --repair`` deletes):

* **archive**: build the archived folder in ``.staging/``, rename it to ``archive/...``, then
  rename the hot folder into ``.staging/`` (the commit) and delete it;
* **unarchive**: build the hot folder in ``.staging/`` and rename it into place (the commit),
  then move the archived folder into ``.staging/`` and delete it.

The archiver holds the context's head lock and an exclusive ``flock`` on every segment file
from before it reads them until their hot copies are deleted, and *seals* each file once it
holds its lock (mode ``0400``): an append waits, then finds its file deleted or sealed and
goes through the store again, which unarchives the context first. The seal is what keeps an
append out of the copy an archiver killed between its commit and those deletes leaves in
``.staging/``; a file sealed in a folder that stayed hot (a kill before the commit, a roll
back) is unsealed by the next write, under the head lock (:func:`unseal`). A file that
changed anyway (a trace written without a lock, a segment created meanwhile) is detected
after the commit, and the archive is rolled back.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from terrarium import codec
from terrarium.errors import ContextExists, CorruptLog, StoreError
from terrarium.model import ContextId, SegmentId, SessionId, decode_name, utc_now
from terrarium.stores._archive import compress, unpack
from terrarium.stores._files import fsync_dir, listdir, make_dirs, open_private, write_all
from terrarium.stores.base import ArchivedContext, PodMetadata
from terrarium.stores.fs._heads import head_dict, head_of
from terrarium.stores.fs._layout import (
    ARCHIVE,
    DATE_RE,
    HEAD,
    INDEX,
    PIN,
    SEGMENT_SUFFIX,
    STAGING,
    TRACE_SUFFIX,
    real_dir,
    segment_name,
)
from terrarium.stores.fs._segments import os_reason, read_file
from terrarium.stores.fs._tree import pointer, read_pointer

if TYPE_CHECKING:
    from terrarium.stores.fs import FsStore

MANIFEST = "archive.json"
LEGACY = "legacy-"
"""``legacy-{n}.json.zst``: a legacy JSON file of the context, archived with it."""
SPARE = "spare-"
"""An empty folder of ``.staging/`` kept for the next move (the clean-up keeps it)."""
ZST = ".zst"
SEALED = 0o400
"""The mode of a segment file a move holds: read-only, so appends that waited look again."""


# --------------------------------------------------------------------------- files


def decompress(path: Path) -> bytes:
    """The decompressed bytes of the archived file ``path`` (``FileNotFoundError`` if none).

    Raises:
        CorruptLog: the file is not a zstd frame (damaged).
    """
    return unpack(read_file(path), where=str(path))


def put(path: Path, data: bytes, *, sync: bool) -> None:
    """Create ``path`` in a folder that no one reads yet (``.staging``), private, once."""
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW)
    try:
        write_all(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def staging_path(store: FsStore, what: str) -> Path:
    """A fresh name in ``.staging/`` (made if missing) for a move in progress."""
    base = store._inside(store.root / STAGING)
    make_dirs(base)
    return base / f"{what}-{uuid.uuid4().hex}"


def staging_folder(store: FsStore, what: str) -> Path:
    """A new empty private folder in ``.staging/``: a spare one (:func:`spare`) if any.

    Reusing the emptied folders of earlier moves saves an ``rmdir`` and a ``mkdir`` per
    move: an ``rmdir`` costs ~3 ms on a file system mounted with ``discard``.
    """
    path = staging_path(store, what)
    for name in listdir(path.parent):
        if name.startswith(SPARE):
            with contextlib.suppress(OSError):
                os.rename(path.parent / name, path)
                if not listdir(path):
                    return path
                shutil.rmtree(path, ignore_errors=True)
    make_dirs(path)
    return path


def spare(store: FsStore, folder: Path, files: list[str]) -> None:
    """Delete ``files`` from ``folder`` (in ``.staging/``) and keep it as a spare folder."""
    for name in files:
        os.unlink(folder / name)
    os.rename(folder, folder.with_name(f"{SPARE}{uuid.uuid4().hex}"))


def discard(store: FsStore, folder: Path) -> None:
    """Delete ``folder``: renamed into ``.staging/`` first, so a kill leaves a leftover there
    (deleted by the next move or ``fsck --repair``), never half a folder in its place."""
    gone = staging_path(store, "gone")
    os.rename(store._inside(folder), gone)
    shutil.rmtree(gone, ignore_errors=True)


def file_sizes(folder: Path) -> dict[str, int]:
    """Every file in ``folder`` with its size; refuses anything else (a link, a folder)."""
    sizes = {}
    for name in sorted(listdir(folder)):
        st = os.lstat(folder / name)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{folder / name} is not a plain file: the folder is not moved")
        sizes[name] = st.st_size
    return sizes


# --------------------------------------------------------------------------- finding


def is_archive(store: FsStore, folder: Path) -> bool:
    """Whether ``folder`` is in the archive (``archive/{type}/{date}/{name}``)."""
    try:
        rel = folder.relative_to(store.root)
    except ValueError:
        return False
    return len(rel.parts) == 4 and rel.parts[0] == ARCHIVE


def hot_twin(store: FsStore, folder: Path) -> Path:
    """The hot folder of the archived ``folder`` (same type, date and name)."""
    _, kind, date, name = folder.relative_to(store.root).parts
    return store.root / kind / date / name


def _live(store: FsStore, folder: Path) -> bool:
    """Whether the archived ``folder`` is complete and not a leftover of a hot context."""
    if not (folder / MANIFEST).is_file():
        return False
    twin = hot_twin(store, folder)
    return not ((twin / HEAD).exists() or any(segment_name(n) for n in listdir(twin)))


def find(store: FsStore, context: ContextId) -> Path | None:
    """The archived folder of ``context``, or None (looked up in ``archive/{type}/*/``)."""
    base = store.root / ARCHIVE / context.type
    if not real_dir(base):
        return None
    for date in sorted(listdir(base), reverse=True):
        if not DATE_RE.fullmatch(date):
            continue
        folder = store._inside(base / date / context.encoded_name)
        if real_dir(folder) and _live(store, folder):
            return folder
    return None


def folders(store: FsStore, type: str | None = None) -> Iterator[tuple[ContextId, Path]]:
    """Every live archived folder (of ``type``), in ``{type}/{date}/{name}`` order."""
    base = store.root / ARCHIVE
    if not real_dir(base):
        return
    store._inside(base)
    for kind in [type] if type is not None else sorted(listdir(base)):
        if not real_dir(base / kind):
            continue
        for date in sorted(listdir(base / kind)):
            if not DATE_RE.fullmatch(date) or not real_dir(base / kind / date):
                continue
            for encoded in sorted(listdir(base / kind / date)):
                try:
                    context = ContextId(kind, decode_name(encoded))
                except ValueError:
                    continue
                folder = base / kind / date / encoded
                if context.encoded_name == encoded and real_dir(folder) and _live(store, folder):
                    yield context, folder


def leftover_copies(store: FsStore) -> list[Path]:
    """Archived folders left beside the hot folder of the same session (a killed archive or
    unarchive): copies, safe to delete."""
    base = store.root / ARCHIVE
    found = []
    for kind in listdir(base) if real_dir(base) else []:
        for date in listdir(base / kind):
            for encoded in listdir(base / kind / date):
                folder = store._inside(base / kind / date / encoded)
                if not real_dir(folder) or _live(store, folder):
                    continue
                try:
                    hot = head_of(hot_twin(store, folder))[0]
                    copy = manifest_head(read_manifest(folder))
                except (OSError, StoreError, ValueError):
                    continue  # damaged, or not a copy: fsck reports it, nothing deletes it
                if hot.session_id == copy.session_id:
                    found.append(folder)
    return found


def session_pointer(store: FsStore, session_id: SessionId) -> Path:
    """``.index/archive/{session}``: where an archived session's folder is."""
    return store._inside(store.root / INDEX / ARCHIVE) / str(session_id)


def pointed_folder(store: FsStore, session_id: SessionId) -> Path | None:
    """The live archived folder ``.index/archive/{session}`` names, or None."""
    try:
        rel, _ = read_pointer(session_pointer(store, session_id))
    except (OSError, StoreError):
        return None
    parts = rel.split("/")
    if len(parts) != 4 or parts[0] != ARCHIVE or not DATE_RE.fullmatch(parts[2]):
        return None
    folder = store._inside(store.root.joinpath(*parts))
    return folder if real_dir(folder) and _live(store, folder) else None


def find_session(store: FsStore, session_id: SessionId) -> Path | None:
    """Walk the archive for the folder of ``session_id`` (its pointer is lost)."""
    for _, folder in folders(store):
        with contextlib.suppress(CorruptLog):
            if manifest_head(read_manifest(folder)).session_id == session_id:
                return folder
    return None


# --------------------------------------------------------------------------- manifest


def read_manifest(folder: Path) -> dict[str, Any]:
    """The archived folder's ``archive.json``.

    Raises:
        CorruptLog: it is missing or unreadable.
    """
    path = folder / MANIFEST
    try:
        record = codec.decode(read_file(path))
        manifest_head(record)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CorruptLog(f"{path}: not a readable archive manifest ({exc})") from None
    if not isinstance(record, dict):
        raise CorruptLog(f"{path}: not a readable archive manifest")
    return record


def manifest_head(record: dict[str, Any]) -> PodMetadata:
    """The head record a manifest holds."""
    head = record["head"]
    return PodMetadata(
        str(head["context"]),
        uuid.UUID(head["session_id"]),
        uuid.UUID(head["segment_id"]),
        str(head["created_at"]),
        str(head["updated_at"]),
    )


def summary(record: dict[str, Any], *, pinned: bool) -> ArchivedContext:
    """The listing record of a manifest."""
    head = manifest_head(record)
    return ArchivedContext(
        context=head.context,
        date=head.date,
        archived_at=str(record["archived_at"]),
        last_active=str(record["last_active"]),
        message_count=int(record["message_count"]),
        hot_bytes=int(record["hot_bytes"]),
        archived_bytes=int(record["archived_bytes"]),
        pinned=pinned,
    )


def segment_ids(folder: Path) -> list[SegmentId]:
    """The archived folder's segment ids, oldest first."""
    found = []
    for name in listdir(folder):
        if name.endswith(ZST) and (segment_id := segment_name(name[: -len(ZST)])) is not None:
            found.append(uuid.UUID(segment_id))
    return sorted(found)


def read_lines(folder: Path, segment_id: SegmentId) -> list[dict[str, Any]]:
    """The decoded lines of an archived segment (``FileNotFoundError`` if it has none)."""
    path = folder / f"{segment_id}{SEGMENT_SUFFIX}{ZST}"
    lines = codec.decode_lines(decompress(path), where=str(path), first_seq=0)
    if not lines or lines[0].get("kind") != "header":
        raise CorruptLog(f"{path}:1: the first line is not a segment header")
    return lines


def read_trace(folder: Path, segment_id: SegmentId) -> list[dict[str, Any]]:
    """The archived segment's debug trace (empty if it had none)."""
    try:
        data = decompress(folder / f"{segment_id}{TRACE_SUFFIX}{ZST}")
    except FileNotFoundError:
        return []
    complete, _ = codec.split_complete(data)
    return [codec.decode(line) for line in codec.split_lines(complete)]


# --------------------------------------------------------------------------- moves


@contextlib.contextmanager
def segment_locks(folder: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on every segment file of ``folder`` and seal each one
    (``0400``): appends wait, then see the seal and look the segment up again."""
    fds: list[int] = []
    try:
        for name in sorted(listdir(folder)):
            if segment_name(name) is not None:
                fd = os.open(folder / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                fds.append(fd)
                fcntl.flock(fd, fcntl.LOCK_EX)
                os.fchmod(fd, SEALED)
        yield
    finally:
        for fd in fds:
            os.close(fd)


def sealed(mode: int) -> bool:
    """Whether a segment file of this mode was sealed by a move (no write bit)."""
    return not mode & stat.S_IWUSR


def unseal(folder: Path) -> None:
    """Make the sealed segment files of ``folder`` writable again (``0600``). The caller
    holds the context's head lock, so no move is running: these seals were left by one that
    was killed before its commit, or rolled back."""
    for name in listdir(folder):
        if segment_name(name) is None:
            continue
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(folder / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                if sealed(os.fstat(fd).st_mode):
                    os.fchmod(fd, 0o600)
            finally:
                os.close(fd)


def archive(store: FsStore, context: ContextId, hot: Path, legacy: list[Path]) -> ArchivedContext:
    """Move the hot folder ``hot`` of ``context`` into the archive (hold its head lock), with
    its ``legacy`` JSON files (``legacy-{n}.json.zst``, removed from their places)."""
    head = store._persist_head(hot, context)
    for segment_id in [uuid.UUID(n[: -len(SEGMENT_SUFFIX)]) for n in _segments(hot)]:
        store.set_aside_torn_tail(head.session_id, segment_id)
    count, last_active = _counts(store, context, head)
    # Checked before the commit, so a link out of the root stops the move before it starts.
    hot_pointers = (store._index_path(context), store._session_index_path(head.session_id))
    target = store._inside(store.root / ARCHIVE / context.type / head.date / context.encoded_name)
    if real_dir(target):  # a leftover of an archive killed before its commit: a copy
        discard(store, target)
    store._forget_session(head.session_id)
    sync = store._sync()
    with segment_locks(hot):
        before = file_sizes(hot)
        staged = staging_folder(store, "archive")
        packed_bytes = _pack(hot, staged, before, sync=sync)
        kept = []
        for n, path in enumerate(legacy, 1):
            put(staged / f"{LEGACY}{n}.json{ZST}", compress(read_file(path)), sync=sync)
            kept.append(path.relative_to(store.root).as_posix())
        record = {
            "head": head_dict(head),
            "archived_at": utc_now(),
            "last_active": last_active,
            "message_count": count,
            "hot_bytes": sum(before.values()),
            "archived_bytes": packed_bytes,
            "legacy": kept,
        }
        put(staged / MANIFEST, codec.encode(record), sync=sync)
        make_dirs(target.parent)
        rel = target.relative_to(store.root).as_posix()
        _write_pointer(store, session_pointer(store, head.session_id), pointer(context, rel))
        os.rename(staged, target)
        gone = staging_path(store, "hot")
        os.rename(hot, gone)  # the commit: from here the archived folder is the context
        if sync:
            fsync_dir(hot.parent)
            fsync_dir(target.parent)
        if file_sizes(gone) != before:  # written without a lock meanwhile: roll back
            os.rename(gone, hot)
            unseal(hot)
            discard(store, target)
            raise StoreError(f"{context} changed while it was archived: left hot; try again")
        for name in _segments(gone):
            os.unlink(gone / name)  # a waiting append now finds its file deleted
    spare(store, gone, listdir(gone))
    for path in legacy:  # the log wins meanwhile: the context exists, archived
        path.unlink(missing_ok=True)
    store._folders[head.session_id] = target
    for path in hot_pointers:
        path.unlink(missing_ok=True)
    store._mark(head.session_id)  # the search index drops it
    return summary(record, pinned=PIN in before)


def _pack(hot: Path, staged: Path, files: dict[str, int], *, sync: bool) -> int:
    """Compress the hot folder's ``files`` into ``staged``; return the compressed bytes."""
    packed_bytes = 0
    for name in files:
        if name == PIN:
            put(staged / PIN, b"", sync=sync)
        elif name != HEAD:
            packed = compress(read_file(hot / name))
            put(staged / f"{name}{ZST}", packed, sync=sync)
            packed_bytes += len(packed)
    return packed_bytes


def unarchive(store: FsStore, context: ContextId, folder: Path) -> PodMetadata:
    """Move the archived ``folder`` of ``context`` back to the hot tree (hold its head lock)."""
    record = read_manifest(folder)
    head = manifest_head(record)
    if head.context != str(context):
        raise CorruptLog(f"{folder / MANIFEST}: holds {head.context}, not {context}")
    hot = store._inside(hot_twin(store, folder))
    if real_dir(hot) and listdir(hot):
        raise ContextExists(f"context {context} would share {hot} with another")
    sync = store._sync()
    staged = staging_folder(store, "unarchive")
    for name in listdir(folder):
        if name == PIN:
            put(staged / PIN, b"", sync=sync)
        elif name.startswith(LEGACY):
            continue  # put back in their places after the commit
        elif name.endswith(ZST):
            put(staged / name[: -len(ZST)], decompress(folder / name), sync=sync)
    put(staged / HEAD, codec.encode(head_dict(head)), sync=sync)
    archived_pointer = session_pointer(store, head.session_id)  # checked before the commit
    # The index entries first: until the commit they name a folder that is not there, which
    # a lookup passes over (to the archive); after it, the context is listed at once.
    store._write_index(context, head.session_id, hot.relative_to(store.root))
    make_dirs(hot.parent)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(hot)  # an empty folder left by a move
    try:
        os.rename(staged, hot)  # the commit: the hot folder wins
    except OSError as exc:
        raise StoreError(f"cannot move {staged} to {hot}: {os_reason(exc)}") from exc
    if sync:
        fsync_dir(hot.parent)
    store._folders[head.session_id] = hot
    _put_back_legacy(store, folder, record)
    gone = staging_path(store, "archived")
    os.rename(folder, gone)
    spare(store, gone, listdir(gone))
    archived_pointer.unlink(missing_ok=True)
    store._mark(head.session_id)
    return head


def _put_back_legacy(store: FsStore, folder: Path, record: dict[str, Any]) -> None:
    """Write the archived legacy files back where they were (unless a file is there now)."""
    from terrarium.stores._files import write_new

    for n, rel in enumerate(record.get("legacy") or [], 1):
        parts = str(rel).split("/")
        if not 1 <= len(parts) <= 3 or any(p in ("", ".", "..") for p in parts):
            continue  # not a place a legacy file lies
        place = store._inside(store.root.joinpath(*parts[:-1])) / parts[-1]
        make_dirs(place.parent)
        with contextlib.suppress(FileExistsError, FileNotFoundError):
            write_new(place, decompress(folder / f"{LEGACY}{n}.json{ZST}"), sync=store._sync())


def _segments(folder: Path) -> list[str]:
    return [n for n in sorted(listdir(folder)) if segment_name(n) is not None]


def _counts(store: FsStore, context: ContextId, head: PodMetadata) -> tuple[int, str]:
    """The head's message count and last entry's time (read before the archive moves it)."""
    from terrarium.sessions import restore_by_segment  # the sessions layer is above the stores

    try:
        state = restore_by_segment(store, head.session_id, head.segment_id)
    except (StoreError, ValueError):  # a damaged chain: archived as it is, without a count
        read = store.read_segment(head.session_id, head.segment_id)
        last = read.entries[-1]["ts"] if read.entries else read.header.get("ts", head.updated_at)
        return 0, str(last)
    return len(state.history), state.last_active


def _write_pointer(store: FsStore, path: Path, data: bytes) -> None:
    from terrarium.stores._files import write_atomic

    make_dirs(store._inside(path.parent))
    write_atomic(path, data, sync=store._sync())


def rebuild_pointers(store: FsStore, fresh: Path) -> None:
    """Write ``.index/archive`` pointers of every archived session into ``fresh``."""
    from terrarium.stores.fs._tree import write_pointer

    for context, folder in folders(store):
        try:
            head = manifest_head(read_manifest(folder))
        except CorruptLog:
            continue
        rel = folder.relative_to(store.root).as_posix()
        make_dirs(fresh)
        write_pointer(fresh / str(head.session_id), pointer(context, rel))


__all__ = [
    "MANIFEST",
    "ZST",
    "archive",
    "compress",
    "decompress",
    "discard",
    "find",
    "find_session",
    "folders",
    "is_archive",
    "pointed_folder",
    "read_lines",
    "read_manifest",
    "read_trace",
    "segment_ids",
    "summary",
    "unarchive",
]
