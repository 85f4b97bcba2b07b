"""The names of an ``FsStore`` tree: its folders, its files, and how a segment file is told.

Under the root (``./sessions`` by default)::

    cli/2026-11-22/main/              one folder per context; the date is its creation (UTC)
        019a5f...e1.jsonl             root segment: header line, then one entry per line
        019a60...7c.jsonl             a fork, compaction or clear of it
        019a60...7c.trace.jsonl       optional debug trace of raw stream events
        019a60...7c.jsonl.torn-4096   a torn tail, set aside (offset in the name)
        head.json                     which segment the context is on; replaced atomically
        019a5f...e1.jsonl.zst         archived: each file (legacy JSON too) compressed in place
    .states/{session uuid}.json       a session's state record (archived, pinned, trashed, cold)
    .detached/{session uuid}/         a session of no context, laid out as a context's folder
    .index/contexts/cli/main          context -> folder: resolving a context walks no dates
    .index/sessions/{session uuid}    session -> folder
    .index/search.db, records.json    search and listing index; the state records (derived)
    .index/dirty/{session uuid}       "this session changed" markers for that index
    .locks/{turn,head}/cli/main       per-context locks: a caller's turn; create, delete, heads
    .locks/{session,create}/{uuid}    per-session: moves exclusive, writers shared; creates
    .staging/                         sessions being deleted for ever
    .trash/legacy/                    deleted legacy JSON files (terrarium.legacy); kept

Names are encoded with :func:`terrarium.model.encode_name`: none escapes the root, and safe
names (``#python``) stay readable.
"""

from __future__ import annotations

import os
import re
import stat
import uuid
from pathlib import Path
from typing import TypeVar

from terrarium.errors import StoreError
from terrarium.model import SegmentId
from terrarium.stores._files import listdir

INDEX = ".index"
# A dot-folder, so nothing that walks the ``{type}`` folders takes a detached session for a
# context; a ``head.json`` in one means nothing (FsStore.attach_context writes it first).
DETACHED = ".detached"
LOCKS = ".locks"
LEGACY_TRASH = Path(".trash", "legacy")
"""Where deleted legacy JSON files wait (:func:`terrarium.legacy.trash`); never emptied."""
ARCHIVE = "archive"
"""A reserved type: no context may have it on a filesystem store."""
STAGING = ".staging"
STATES = ".states"
ZST = ".zst"
HEAD = "head.json"
SEGMENT_SUFFIX = ".jsonl"
TRACE_SUFFIX = ".trace.jsonl"
DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
_P = TypeVar("_P", str, Path)
CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""A UUID as ``str(uuid.UUID(...))`` spells it: the names FsStore gives files and folders."""


def holds_context(folder: Path) -> bool:
    """Whether ``folder`` holds a context: a head record or any segment file."""
    return (folder / HEAD).exists() or bool(segment_ids(folder))


def segment_ids(folder: Path, suffix: str = "") -> list[SegmentId]:
    """The ids of the segment files in ``folder`` (``.zst`` ones: frozen), oldest first."""
    return sorted(
        uuid.UUID(segment_id)
        for name in listdir(folder)
        if name.endswith(suffix) and (segment_id := segment_name(name.removesuffix(suffix)))
    )


def has_segments(folder: Path) -> bool:
    """Whether ``folder`` holds a segment file, plain or frozen (``.jsonl.zst``)."""
    return any(segment_name(name.removesuffix(ZST)) is not None for name in listdir(folder))


def check_inside(real_root: str, path: _P, error: type[StoreError] = StoreError) -> _P:
    """Return ``path`` if it resolves inside the root whose real path is ``real_root`` (links
    and all, a link not yet made through included); else raise ``error`` saying where it
    leads. The one rule by which nothing of a store is read or written out of its root."""
    real = os.path.realpath(path)
    if real != real_root and not real.startswith(real_root + os.sep):
        raise error(
            f"{path} leads outside the store (to {real}): terrarium never follows a link out "
            "of its root"
        )
    return path


def real_dir(path: str | Path) -> bool:
    """Whether ``path`` is a folder itself, not a link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def segment_name(name: str) -> str | None:
    """The segment id if ``name`` is a segment file's name (not a trace or a torn tail)."""
    if not name.endswith(SEGMENT_SUFFIX) or name.endswith(TRACE_SUFFIX):
        return None
    stem = name[: -len(SEGMENT_SUFFIX)]
    if CANONICAL_UUID.fullmatch(stem):  # what FsStore writes: skip the parse
        return stem
    return str(uuid.UUID(stem)) if is_uuid(stem) else None


def is_uuid(text: str) -> bool:
    """Whether ``text`` is a UUID in any form ``uuid.UUID`` reads."""
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True
