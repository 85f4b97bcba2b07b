"""Heads: ``head.json`` records, and the head a folder's segments imply when that is lost.

``head.json`` is derived: a lost one (a power cut in ``flush`` mode, a partial restore) is
rebuilt from the segments (:func:`head_from_segments`), in memory by a read, on disk by a write,
``reindex()`` or ``fsck --repair``. An unreadable one is set aside, never deleted. The search
index reads heads the same way (:func:`head_of`), so listing and ``fsck`` name the same problem.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from terrarium import codec
from terrarium.errors import CorruptLog, StoreError
from terrarium.model import ContextId, SegmentId, decode_name
from terrarium.stores.base import PodMetadata
from terrarium.stores.fs._layout import DATE_RE, HEAD, SEGMENT_SUFFIX, ZST, real_dir, segment_ids
from terrarium.stores.fs._segments import one_line, read_file, read_header


def head_of(folder: str | Path, *, read_errors: bool = False) -> tuple[PodMetadata, str | None]:
    """The head of ``folder``, and why it was rebuilt if ``head.json`` is unreadable (with
    ``read_errors``, an I/O error too). FileNotFoundError if ``folder`` holds neither a
    ``head.json`` nor a segment; CorruptLog if the head can be neither read nor rebuilt."""
    path = os.path.join(folder, HEAD)  # str paths: get_head runs this on every turn
    try:
        head = read_head(path)
        segment = os.path.join(folder, f"{head.segment_id}{SEGMENT_SUFFIX}")
        if os.path.exists(segment) or os.path.exists(segment + ZST):  # hot, or frozen
            return head, None
        problem = f"{path}: names segment {head.segment_id}, which is not there"
    except (FileNotFoundError, NotADirectoryError):
        if not real_dir(folder) or not segment_ids(Path(folder)):
            raise FileNotFoundError(f"{folder} holds no context") from None
        return head_from_segments(Path(folder)), None
    except StoreError as exc:  # CorruptLog, or a link
        problem = str(exc)
    except OSError as exc:
        if not read_errors:
            raise
        problem = f"{path}: unreadable ({exc.strerror or exc})"
    try:
        return head_from_segments(Path(folder)), f"{problem}; rebuilt from the segments"
    except CorruptLog as exc:
        raise CorruptLog(f"{problem}; and it cannot be rebuilt: {exc}") from None


def head_from_segments(folder: Path) -> PodMetadata:
    """Rebuild a context's head record from the segment files in ``folder``.

    The head is the newest segment (by UUIDv7) whose headers, its own and those of the
    segments it continues, read and name this session. The context is the one the headers
    name, or (a session that began detached) the one its folder names.

    Raises:
        CorruptLog: no segment of ``folder`` has an intact chain.
    """
    headers = {s: h for s, h in read_headers(folder).items() if h.get("segment_id") == str(s)}
    if not headers:
        raise CorruptLog(f"{folder}: no segment with a readable header to rebuild the head from")
    root = headers[min(headers)]
    session = root.get("session_id")
    place = folder_context(folder)
    for segment_id in sorted(headers, reverse=True):
        header = headers[segment_id]
        context = header.get("context") or root.get("context") or place
        chain, whole = _replay(segment_id, headers)  # an intact chain, all of this session
        intact = whole and all(headers[s].get("session_id") == session for s in chain)
        if not intact or not isinstance(context, str):
            continue
        try:
            return PodMetadata(
                context, uuid.UUID(str(session)), segment_id, str(root["ts"]), str(header["ts"])
            )
        except (KeyError, ValueError):
            continue
    raise CorruptLog(f"{folder}: no segment with an intact chain to rebuild the head from")


def read_headers(folder: Path) -> dict[SegmentId, dict[str, Any]]:
    """The header of each segment file of ``folder`` that has a readable one, by id."""
    headers: dict[SegmentId, dict[str, Any]] = {}
    for segment_id in segment_ids(folder):
        with contextlib.suppress(StoreError, OSError):
            headers[segment_id] = read_header(folder / f"{segment_id}{SEGMENT_SUFFIX}")
    return headers


def folder_context(folder: Path) -> str | None:
    """The context a ``{type}/{date}/{name}`` folder is the folder of, or None."""
    date, kind, encoded = folder.parent.name, folder.parent.parent.name, folder.name
    if not DATE_RE.fullmatch(date) or kind.startswith("."):
        return None
    with contextlib.suppress(ValueError):
        context = ContextId(kind, decode_name(encoded))
        return str(context) if context.encoded_name == encoded else None
    return None


def _replay(
    segment_id: SegmentId, headers: Mapping[SegmentId, Mapping[str, Any]]
) -> tuple[list[SegmentId], bool]:
    """``segment_id`` and every segment its replay reads, newest first, up to a missing or
    unreadable header; and whether the chain is whole (it ends at a root, compaction or clear,
    which stands alone)."""
    chain: list[SegmentId] = []
    current: SegmentId | None = segment_id
    while current is not None and current not in chain:
        chain.append(current)
        header = headers.get(current)
        if header is None:
            break
        if header.get("history") is not None:
            return chain, True
        origin = header.get("origin")
        parent = origin.get("parent") if isinstance(origin, dict) else None
        try:
            current = uuid.UUID(parent) if isinstance(parent, str) else None
        except ValueError:
            break
    return chain, False


def segment_chain(folder: Path, segment_id: SegmentId) -> list[SegmentId]:
    """``segment_id`` and every segment its replay reads, newest first (:func:`_replay`)."""
    return _replay(segment_id, read_headers(folder))[0]


def read_head(path: str | Path) -> PodMetadata:
    """Read a ``head.json``; CorruptLog (naming it) if it is not a head record."""
    raw = read_file(path)
    try:
        return msgspec.convert(codec.decode(raw), PodMetadata)
    except ValueError as exc:  # not JSON, or not a head record (msgspec.ValidationError)
        raise CorruptLog(f"{path}: not a valid head record ({one_line(exc)})") from None
