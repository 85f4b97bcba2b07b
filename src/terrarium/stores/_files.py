"""File primitives every file-backed part of terrarium shares: private modes, atomic writes.

Every file terrarium creates is ``0600`` and every folder ``0700``, whatever the umask, given
to ``os.open`` and ``os.mkdir`` so no file is ever visible to others. A folder that exists
keeps its mode.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable
from pathlib import Path

#: The mode of every file terrarium creates.
FILE_MODE = 0o600
#: The mode of every folder terrarium creates.
DIR_MODE = 0o700


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


def open_private(path: Path, flags: int) -> int:
    """``os.open`` with ``O_CLOEXEC``, creating (if ``flags`` says so) with ``FILE_MODE``."""
    return os.open(path, flags | os.O_CLOEXEC, FILE_MODE)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` (``os.write`` may write fewer than it was given)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_atomic(path: Path, data: bytes, *, sync: bool) -> None:
    """Replace ``path`` with ``data`` (a temporary file renamed over it): a reader sees the old
    bytes or the new. With ``sync``, they survive a power cut once this returns."""
    make_dirs(path.parent)
    tmp = _temporary(path, data, sync=sync)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync:
        fsync_dir(path.parent)


def write_new(path: Path, data: bytes, *, sync: bool) -> None:
    """Create ``path`` holding ``data``, whole or not at all (a temporary file hard-linked to
    it: ``FileExistsError`` if it exists). With ``sync``, the data and folder are fsynced."""
    tmp = _temporary(path, data, sync=sync)
    try:
        os.link(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    if sync:
        fsync_dir(path.parent)


def write_beside(path: Path, data: bytes, suffix: Callable[[int], str]) -> Path:
    """Create ``{name}.{suffix(n)}`` beside ``path``, whole and durably, at the first free n."""
    tmp = _temporary(path, data, sync=True)
    try:
        return link_free(tmp, path, suffix)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


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


def _temporary(path: Path, data: bytes, *, sync: bool) -> Path:
    """A new temporary file beside ``path`` holding ``data`` (removed if writing it fails)."""
    # Not derived from the name, so a name of the maximum length still fits.
    tmp = path.with_name(f".tmp-{uuid.uuid4().hex}")
    fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        write_all(fd, data)
        if sync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def fsync_dir(path: Path) -> None:
    """Make the names in folder ``path`` durable (a new or renamed file survives a power cut)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def listdir(path: Path) -> list[str]:
    """The names in folder ``path``; empty if it does not exist."""
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []


def scandir(path: str | Path) -> list[os.DirEntry[str]]:
    """The entries of ``path``; none if it is missing or not a folder."""
    try:
        with os.scandir(path) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []
