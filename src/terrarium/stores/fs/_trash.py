"""The trash and the pins of an ``FsStore``, and the clean-up of interrupted moves.

**Trash.** ``delete_context`` moves a context's folder, hot or archived, to
``.trash/{trash id}/context/`` beside ``trash.json`` (the context, when it was deleted, whether
it was archived or pinned, its message count and bytes). Two steps, each safe to kill: the
entry folder with its ``trash.json`` is made (an entry without ``context/`` is a leftover,
listed nowhere), then the folder is renamed into it (the commit). A restore renames it back
(to an archived or hot place, as it was) and then deletes the entry; a purge renames the entry
into ``.staging/`` (the commit) and deletes it there. Entries are kept until purged.
``.trash/legacy/`` holds the legacy JSON files that ``terrarium.legacy.trash`` moved there; it
is not a trash entry (those files can be moved back by hand).

**Pins.** A pinned context has an empty ``pinned`` file in its folder, so the pin moves with
it (archive, trash, restore). ``.index/pins/{type}/{name}`` lists the pinned contexts so that
``pinned_contexts()`` reads one small folder; each entry is checked against the marker, and
``reindex`` rebuilds them from the markers.

**Clean-up.** Every move holds an exclusive ``flock`` on ``.locks/lifecycle``, so moves run one
at a time; holding it, a move first deletes what is in ``.staging/`` and entries of
``.trash/`` without ``context/``: what a killed move left (its lock died with it), never a
visible state and never a live move's. ``fsck --repair`` does the same under the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from terrarium import codec
from terrarium.errors import ContextExists, CorruptLog, NotInTrash, StoreError
from terrarium.model import ContextId, decode_name, utc_now
from terrarium.stores._files import fsync_dir, listdir, make_dirs, open_private, write_atomic
from terrarium.stores.base import PodMetadata, TrashedContext
from terrarium.stores.fs import _archive
from terrarium.stores.fs._heads import head_dict, head_of
from terrarium.stores.fs._layout import (
    ARCHIVE,
    HEAD,
    INDEX,
    LOCKS,
    PIN,
    PINS,
    STAGING,
    TRASH,
    real_dir,
)
from terrarium.stores.fs._segments import read_file

if TYPE_CHECKING:
    from terrarium.stores.fs import FsStore

TRASH_MANIFEST = "trash.json"
CONTENT = "context"
_TRASH_ID = re.compile(r"[0-9a-f]{32}")


# --------------------------------------------------------------------------- locking


@contextlib.contextmanager
def moving(store: FsStore) -> Iterator[None]:
    """Hold ``.locks/lifecycle`` for a move, after deleting what killed moves left.

    The lock is exclusive: moves of one store run one at a time, in every process, so no move
    sees another half done, and what ``.staging/`` holds while it is held is provably no live
    move's (a killed process's ``flock`` is released by the kernel).
    """
    held = store._moves
    if getattr(held, "depth", 0):  # this thread holds it already (fsck, a reindex in a move)
        held.depth += 1
        try:
            yield
        finally:
            held.depth -= 1
        return
    fd = _lock_fd(store)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        held.depth = 1
        try:
            _delete(store, leftovers(store))
            yield
        finally:
            held.depth = 0
    finally:
        os.close(fd)


@contextlib.contextmanager
def settled(store: FsStore) -> Iterator[None]:
    """Hold ``.locks/lifecycle`` shared: no move runs meanwhile (a read looks again under it).

    Reads write nothing: where the lock file is not there (no move ever ran) or cannot be
    opened (a read-only store, where nothing moves), it goes on without. A thread that holds
    it for a move already just goes on.
    """
    if getattr(store._moves, "depth", 0):
        yield
        return
    try:
        fd = os.open(store._inside(store.root / LOCKS) / "lifecycle", os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def leftovers(store: FsStore, *, archived: bool = False) -> list[Path]:
    """What killed moves left: ``.staging/`` entries, trash entries without ``context/`` and,
    with ``archived``, archived copies of contexts that are hot (walks the archive). Only
    what :func:`clean` lists under the lock is a leftover: outside it, a move may be under way.
    """
    staging = store.root / STAGING
    trash = store.root / TRASH
    left = [staging / n for n in listdir(staging) if not _spare(staging / n)]
    left += [
        trash / n
        for n in listdir(trash)
        if _TRASH_ID.fullmatch(n) and real_dir(trash / n) and not real_dir(trash / n / CONTENT)
    ]
    if archived:
        left += _archive.leftover_copies(store)
    return left


def _spare(path: Path) -> bool:
    return path.name.startswith(_archive.SPARE) and real_dir(path) and not listdir(path)


def clean(store: FsStore, *, archived: bool = False) -> int:
    """Delete what killed moves left (:func:`leftovers`), waiting for a move under way to
    end; return how many."""
    with moving(store):
        return _delete(store, leftovers(store, archived=archived))


def _delete(store: FsStore, left: list[Path]) -> int:
    """Delete the leftovers ``left`` (held under the lifecycle lock)."""
    for path in left:
        if real_dir(path):
            shutil.rmtree(store._inside(path), ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return len(left)


def _lock_fd(store: FsStore) -> int:
    folder = store._inside(store.root / LOCKS)
    make_dirs(folder)
    return open_private(folder / "lifecycle", os.O_RDWR | os.O_CREAT)


# --------------------------------------------------------------------------- trash


def trash(store: FsStore, context: ContextId, folder: Path) -> None:
    """Move ``folder`` (the context's, hot or archived) into a new trash entry.

    Hold the context's head lock and :func:`moving`.
    """
    archived = _archive.is_archive(store, folder)
    head: PodMetadata | None
    count = 0
    if archived:
        record = _archive.read_manifest(folder)
        head = _archive.manifest_head(record)
        count = int(record["message_count"])
    else:
        try:
            head = head_of(folder)[0]
        except CorruptLog:
            head = None  # a damaged folder is deleted too
        if head is not None:
            count = _message_count(store, context)
    if head is not None:
        store._forget_session(head.session_id)
    _pointers(store, context, head)  # a link out of the root stops the move before it starts
    trash_id = uuid.uuid4().hex
    entry = store._inside(store.root / TRASH / trash_id)
    make_dirs(entry)
    record = {
        "trash_id": trash_id,
        "context": str(context),
        "date": head.date if head is not None else folder.parent.name,
        "deleted_at": utc_now(),
        "archived": archived,
        "pinned": (folder / PIN).exists(),
        "message_count": count,
        "bytes": sum(_archive.file_sizes(folder).values()),
    }
    write_atomic(entry / TRASH_MANIFEST, codec.encode(record), sync=store._sync())
    if head is not None:
        store._mark(head.session_id)
    # The segment files stay sealed in the trash: a writer that had one open (and waited on
    # its lock) sees the seal, looks the session up again and finds it gone. Nothing is
    # written after the commit, so a full disk cannot fail a delete that has happened.
    with _archive.segment_locks(folder):
        os.rename(folder, entry / CONTENT)  # the commit
        if store._sync():
            fsync_dir(folder.parent)
            fsync_dir(entry)
    _forget_pointers(store, context, head)


def _pointers(store: FsStore, context: ContextId, head: PodMetadata | None) -> list[Path]:
    """The index entries of a context (each folder checked to be inside the root)."""
    found = [store._index_path(context), pin_path(store, context)]
    if head is not None:
        found += [
            store._session_index_path(head.session_id),
            _archive.session_pointer(store, head.session_id),
        ]
    return found


def _forget_pointers(store: FsStore, context: ContextId, head: PodMetadata | None) -> None:
    """Remove the index entries of a context that left (trash, purge)."""
    for path in _pointers(store, context, head):
        path.unlink(missing_ok=True)
    if head is not None:
        store._folders.pop(head.session_id, None)
        store._mark(head.session_id)


def _message_count(store: FsStore, context: ContextId) -> int:
    from terrarium.sessions import restore  # the sessions layer sits above the stores

    try:
        return len(restore(store, context).history)
    except (StoreError, ValueError):
        return 0


def entries(store: FsStore) -> list[TrashedContext]:
    """Every complete trash entry, most recently deleted first."""
    found = []
    base = store.root / TRASH
    for name in listdir(base):
        if not _TRASH_ID.fullmatch(name) or not real_dir(base / name / CONTENT):
            continue
        try:
            record = _read_entry(base / name)
        except CorruptLog:
            continue
        found.append(_summary(name, record))
    return sorted(found, key=lambda e: (e.deleted_at, e.trash_id), reverse=True)


def _read_entry(entry: Path) -> dict[str, Any]:
    path = entry / TRASH_MANIFEST
    try:
        record = codec.decode(read_file(path))
        ContextId.parse(record["context"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CorruptLog(f"{path}: not a readable trash record ({exc})") from None
    if not isinstance(record, dict):
        raise CorruptLog(f"{path}: not a readable trash record")
    return record


def _summary(trash_id: str, record: dict[str, Any]) -> TrashedContext:
    return TrashedContext(
        trash_id=trash_id,
        context=str(record["context"]),
        date=str(record["date"]),
        deleted_at=str(record["deleted_at"]),
        archived=bool(record["archived"]),
        message_count=int(record["message_count"]),
        bytes=int(record["bytes"]),
        pinned=bool(record.get("pinned", False)),
    )


def entry_of(store: FsStore, trash_id: str) -> tuple[Path, dict[str, Any]]:
    """The complete trash entry ``trash_id`` and its record; NotInTrash if there is none."""
    if _TRASH_ID.fullmatch(trash_id):
        entry = store._inside(store.root / TRASH / trash_id)
        if real_dir(entry / CONTENT):
            return entry, _read_entry(entry)
    raise NotInTrash(f"nothing in the trash has the id {trash_id!r}")


def restore(store: FsStore, entry: Path, record: dict[str, Any], target: ContextId) -> PodMetadata:
    """Move the trash entry's folder back as ``target`` (hold its head lock and :func:`moving`).

    Raises:
        ContextExists: the place it goes to holds a context.
    """
    content = entry / CONTENT
    archived = bool(record["archived"])
    date = str(record["date"])
    if archived:
        manifest = _archive.read_manifest(content)
        head = _archive.manifest_head(manifest)
        place = store.root / ARCHIVE / target.type / date / target.encoded_name
    else:
        head = head_of(content)[0]
        place = store.root / target.type / date / target.encoded_name
    place = store._inside(place)
    if real_dir(place) and listdir(place):
        raise ContextExists(f"context {target} would share {place} with another")
    if head.context != str(target):  # restored under another id: its head says so
        head = PodMetadata(
            str(target), head.session_id, head.segment_id, head.created_at, head.updated_at
        )
        if archived:
            manifest["head"] = head_dict(head)
            write_atomic(content / _archive.MANIFEST, codec.encode(manifest), sync=store._sync())
        else:
            write_atomic(content / HEAD, codec.encode(head_dict(head)), sync=store._sync())
    for name in listdir(content):
        if name.startswith(".") and name.endswith(".copy"):  # a killed delete's leftover
            os.unlink(content / name)
    if (content / PIN).exists():
        _mark_pin(store, target)  # before the commit: a pin entry without a marker is ignored
    rel = place.relative_to(store.root)
    if archived:  # before the commit, as an unarchive does (see _archive.unarchive)
        data = _pointer_bytes(target, rel.as_posix())
        _archive._write_pointer(store, _archive.session_pointer(store, head.session_id), data)
    else:
        store._write_index(target, head.session_id, rel)
    make_dirs(place.parent)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(place)
    os.rename(content, place)  # the commit
    if store._sync():
        fsync_dir(place.parent)
    shutil.rmtree(entry, ignore_errors=True)
    store._folders[head.session_id] = place
    store._mark(head.session_id)
    return head


def _pointer_bytes(context: ContextId, rel: str) -> bytes:
    from terrarium.stores.fs._tree import pointer

    return pointer(context, rel)


def purge_entry(store: FsStore, entry: Path) -> None:
    """Delete a trash entry for ever: renamed into ``.staging/`` (the commit), then deleted."""
    _archive.discard(store, entry)


def purge_folder(store: FsStore, context: ContextId, folder: Path) -> None:
    """Delete a context's folder (hot or archived) for ever (hold its head lock)."""
    head: PodMetadata | None
    try:
        if _archive.is_archive(store, folder):
            head = _archive.manifest_head(_archive.read_manifest(folder))
        else:
            head = head_of(folder)[0]
    except CorruptLog:
        head = None
    if head is not None:
        store._forget_session(head.session_id)
    _archive.discard(store, folder)
    _forget_pointers(store, context, head)


# --------------------------------------------------------------------------- pins


def pin_path(store: FsStore, context: ContextId) -> Path:
    """``.index/pins/{type}/{name}``, its folder checked to be inside the root."""
    return store._inside(store.root / INDEX / PINS / context.type) / context.encoded_name


def _mark_pin(store: FsStore, context: ContextId) -> None:
    path = pin_path(store, context)
    make_dirs(store._inside(path.parent))
    os.close(open_private(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW))


def pin(store: FsStore, context: ContextId, folder: Path, pinned: bool) -> None:
    """Pin or unpin the context whose folder is ``folder`` (hold its head lock)."""
    marker = folder / PIN
    if pinned:
        _mark_pin(store, context)  # first: an entry whose marker is missing is ignored
        os.close(open_private(marker, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW))
    else:
        marker.unlink(missing_ok=True)
        pin_path(store, context).unlink(missing_ok=True)


def pinned(store: FsStore) -> frozenset[str]:
    """The pinned contexts: the pin entries whose context has its marker."""
    base = store._inside(store.root / INDEX / PINS)
    found = set()
    for kind in listdir(base):
        for encoded in listdir(store._inside(base / kind)):
            try:
                context = ContextId(kind, decode_name(encoded))
            except ValueError:
                continue
            folder = store.folder_of(context)
            if folder is not None and (folder / PIN).exists():
                found.add(str(context))
    return frozenset(found)


def write_pins(fresh: Path, contexts: list[ContextId]) -> None:
    """Write the pin entries of ``contexts`` into ``fresh`` (a new ``.index/pins``)."""
    for context in contexts:
        make_dirs(fresh / context.type)
        path = fresh / context.type / context.encoded_name
        os.close(open_private(path, os.O_WRONLY | os.O_CREAT))


__all__ = [
    "CONTENT",
    "TRASH_MANIFEST",
    "clean",
    "entries",
    "entry_of",
    "moving",
    "pin",
    "pinned",
    "purge_entry",
    "purge_folder",
    "restore",
    "trash",
    "write_pins",
]
