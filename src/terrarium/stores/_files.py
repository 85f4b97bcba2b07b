"""File primitives every file-backed part of terrarium shares: private modes, atomic writes.

Every file terrarium creates is ``0600`` and every folder ``0700``, whatever the umask, given
to ``os.open`` and ``os.mkdir`` so no file is ever visible to others. A folder that exists
keeps its mode.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

#: The mode of every file terrarium creates.
FILE_MODE = 0o600
#: The mode of every folder terrarium creates.
DIR_MODE = 0o700
_CHUNK = 1 << 20


def make_dirs(path: Path) -> None:
    """Create ``path`` and any missing parents, each ``0700`` (``os.makedirs`` gives parents
    the umask's mode)."""
    missing: list[Path] = []
    current = path
    while not current.is_dir():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, DIR_MODE)
        except FileExistsError:  # another process made it meanwhile, or it is not a folder
            if not folder.is_dir():
                raise NotADirectoryError(f"{folder} exists and is not a folder") from None


def inside(path: Path, root: Path) -> bool:
    """Whether ``path`` resolves (links and all, a link not yet made through included) to
    ``root`` or below it."""
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def open_private(path: Path, flags: int) -> int:
    """``os.open`` with ``O_CLOEXEC``, creating (if ``flags`` says so) with ``FILE_MODE``."""
    return os.open(path, flags | os.O_CLOEXEC, FILE_MODE)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` (``os.write`` may write fewer than it was given)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_to(path: Path, data: bytes, flags: int) -> None:
    """Open ``path`` for writing with ``flags`` (never through a link; created ``FILE_MODE``)
    and write all of ``data``."""
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | flags)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def read_chunks(path: Path) -> Iterator[bytes]:
    """The bytes of ``path`` (never through a link: a raw ``ELOOP`` error), a chunk at a time,
    decompressed if it is a zstandard (``.zst``) file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        file = os.fdopen(fd, "rb")
    except BaseException:  # a folder: fdopen refuses it and leaves the descriptor open
        os.close(fd)
        raise
    with file as f:
        if path.name.endswith(".zst"):
            import zstandard

            reader = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
            while chunk := reader.read(_CHUNK):
                yield chunk
            return
        while chunk := f.read(_CHUNK):
            yield chunk


def write_atomic(path: Path, data: bytes, *, sync: bool, mtime_ns: int | None = None) -> None:
    """Replace ``path`` with ``data`` (a temporary file renamed over it): a reader sees the old
    bytes or the new. With ``sync``, they survive a power cut once this returns. ``mtime_ns``:
    the new file's modification time (a moved file keeps its own)."""
    make_dirs(path.parent)
    with _temporary(path, data, sync=sync) as tmp:
        if mtime_ns is not None:
            os.utime(tmp, ns=(mtime_ns, mtime_ns))
        os.replace(tmp, path)
    if sync:
        fsync_dir(path.parent)


def write_new(path: Path, data: bytes, *, sync: bool) -> None:
    """Create ``path`` holding ``data``, whole or not at all (a temporary file hard-linked to
    it: ``FileExistsError`` if it exists). With ``sync``, the data and folder are fsynced."""
    with _temporary(path, data, sync=sync) as tmp:
        os.link(tmp, path)
    if sync:
        fsync_dir(path.parent)


def write_beside(path: Path, data: bytes, suffix: Callable[[int], str]) -> Path:
    """Create ``{name}.{suffix(n)}`` beside ``path``, whole and durably, at the first free n."""
    with _temporary(path, data, sync=True) as tmp:
        return link_free(tmp, path, suffix)


def link_free(source: Path, path: Path, suffix: Callable[[int], str]) -> Path:
    """Hard-link ``source`` to the first free ``{path.name}.{suffix(n)}``, n = 1, 2, ..."""
    number = 1
    while True:
        target = path.with_name(f"{path.name}.{suffix(number)}")
        try:
            os.link(source, target)
        except FileExistsError:
            number += 1
            continue
        return target


def leftovers(path: Path) -> list[Path]:
    """The temporary files that interrupted writes of ``path`` left beside it."""
    prefix = _temporary_prefix(path)
    return [path.with_name(n) for n in sorted(listdir(path.parent)) if n.startswith(prefix)]


def _temporary_prefix(path: Path) -> str:
    # A digest of the name: a name of the maximum length still fits, and one path's leftovers
    # are told from another's. hashlib is imported here, not at the command line's start.
    import hashlib

    return f".tmp-{hashlib.sha256(os.fsencode(path.name)).hexdigest()[:16]}"


@contextlib.contextmanager
def _temporary(path: Path, data: bytes, *, sync: bool) -> Iterator[Path]:
    """A temporary file beside ``path`` holding ``data``, for the block to link or rename."""
    tmp = path.with_name(f"{_temporary_prefix(path)}{uuid.uuid4().hex[:16]}")
    fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        try:
            write_all(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        yield tmp
    finally:
        if os.path.lexists(tmp):
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def fsync_dir(path: Path) -> None:
    """Make the names in folder ``path`` durable (a new or renamed file survives a power cut)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def listdir(path: Path) -> list[str]:
    """The names in folder ``path``; empty if it does not exist."""
    return [entry.name for entry in scandir(path)]


def scandir(path: str | Path) -> list[os.DirEntry[str]]:
    """The entries of ``path``; none if it is missing or not a folder."""
    try:
        with os.scandir(path) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []
