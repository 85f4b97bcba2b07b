"""Segment files on disk: opened without following links, read up to their last whole append.

**Torn tails.** A writer killed mid-``write`` can leave bytes after the last complete append.
A read skips and reports them; a writer (:func:`scan_tail`, under the file's lock) copies them
to ``{segment}.jsonl.torn-{offset}``, truncates them away and logs it before it appends. A
segment whose header line is incomplete is damaged, not torn: reported, never moved. Side files
never overwrite another.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
from pathlib import Path
from typing import Any

from terrarium import codec
from terrarium.errors import CorruptLog, SegmentNotFound, StoreError
from terrarium.model import SegmentId, TornTail
from terrarium.stores import _db
from terrarium.stores._files import link_free, write_beside

log = logging.getLogger(__name__)


def open_segment(path: Path, flags: int, segment_id: SegmentId | None) -> int:
    """Open a segment file without following a link; name what is wrong if it cannot be."""
    try:
        return _open(path, flags)
    except FileNotFoundError:
        name = segment_id or path.stem
        raise SegmentNotFound(f"segment {name} does not exist ({path})") from None


def read_file(path: str | Path) -> bytes:
    """The bytes of ``path``, refusing a symbolic link (``FileNotFoundError`` if missing)."""
    fd = _open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _open(path: str | Path, flags: int) -> int:
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreError(f"{path} is a symbolic link: terrarium never follows one") from None
        raise


def read_header(path: Path) -> dict[str, Any]:
    """Decode a segment file's first line (reading no further than needed)."""
    fd = open_segment(path, os.O_RDONLY, None)
    try:
        line = open(fd, "rb", closefd=False).readline()
    finally:
        os.close(fd)
    if not line.endswith(b"\n"):
        raise damaged(path, len(line))
    return headed(codec.decode_lines(line, where=str(path), first_seq=0), path)[0]


def headed(lines: list[dict[str, Any]], where: object) -> list[dict[str, Any]]:
    """``lines``, refused (CorruptLog) if the first is not a segment header."""
    if not lines or lines[0].get("kind") != "header":
        raise CorruptLog(f"{where}:1: the first line is not a segment header")
    return lines


def read_complete(fd: int, path: Path, segment_id: SegmentId) -> tuple[Any, TornTail | None]:
    """The complete appends of an open segment file, and its torn tail if it has one. A file
    ending in a complete append is returned as a memory map (a copy saved; safe, as no writer
    truncates below a complete append). A tail that looks torn is read again under a shared
    lock, which waits for a write in progress."""
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
        raise damaged(path, len(data))
    if end == len(data):
        return data, None
    return data[:end], TornTail(segment_id, end, len(data) - end, None)


def scan_tail(
    fd: int, path: Path, segment_id: SegmentId, *, set_aside: bool = True
) -> tuple[int, int, TornTail | None]:
    """With the file locked: set aside a torn tail (unless not ``set_aside``: a read leaves it
    where it is); return (size of the whole lines, next seq, torn tail moved). CorruptLog if
    the header line is incomplete (nothing is moved) or the last line no entry."""
    size = os.fstat(fd).st_size
    chunk = 4096
    while True:
        start = max(0, size - chunk)
        buf = os.pread(fd, size - start, start)
        complete_end = codec.complete_end(buf)
        if start == 0 or buf.rfind(b"\n", 0, max(complete_end - 1, 0)) >= 0:
            break
        chunk *= 4  # the last whole line (or a torn append before it) began earlier: read more
    if start == 0 and complete_end == 0:
        raise damaged(path, size)
    torn = None
    if complete_end < len(buf):
        offset, data = start + complete_end, buf[complete_end:]
        if set_aside:
            torn = TornTail(segment_id, offset, len(data), move_torn(path, fd, offset, data))
        size = offset
    body = buf[:complete_end]
    last = body[body.rfind(b"\n", 0, len(body) - 1) + 1 :]
    try:
        seq = codec.decode(last)["seq"]
    except Exception as exc:
        raise CorruptLog(f"{path}: the last line is not a valid entry ({exc})") from None
    return size, int(seq) + 1, torn


def damaged(path: Path, size: int) -> CorruptLog:
    """A segment of ``size`` bytes whose header line is not whole."""
    why = f"its header line is incomplete ({size} bytes, no newline)"
    if size == 0:
        why = "the file is empty (no header line)"
    return CorruptLog(f"{path}: damaged segment: {why}")


def move_torn(path: Path, fd: int, offset: int, data: bytes) -> str:
    """Copy torn bytes at ``offset`` to a new side file, truncate them away; return its path."""
    base = f"torn-{offset}"
    side = str(write_beside(path, data, lambda n: base if n == 1 else f"{base}.{n}"))
    os.ftruncate(fd, offset)
    log.warning("%s: set aside %d torn bytes at offset %d to %s", path, len(data), offset, side)
    return side


def set_aside(path: Path, why: str) -> Path:
    """Rename ``path`` to a new ``{name}.{why}-{n}`` beside it (never over another)."""
    side = link_free(path, path, lambda n: f"{why}-{n}")
    os.unlink(path)
    return side


def os_reason(exc: OSError) -> str:
    """An OS error as the user should read it: a full disk is named as one."""
    return "the disk is full" if _db.kind(exc) == "full" else one_line(exc)


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
