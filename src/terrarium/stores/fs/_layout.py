"""The names of an ``FsStore`` tree: its folders, its files, and how a segment file is told.

Under the root (``./sessions`` by default)::

    cli/2026-11-22/main/              one folder per context; the date is its creation (UTC)
        019a5f...e1.jsonl             root segment: header line, then one entry per line
        019a60...7c.jsonl             a fork, compaction or clear of it
        019a60...7c.trace.jsonl       optional debug trace of raw stream events
        019a60...7c.jsonl.torn-4096   a torn tail, set aside (offset in the name)
        head.json                     which segment the context is on; replaced atomically
    .detached/{session uuid}/         a session that belongs to no context yet (its segments,
                                      as in a context's folder; see below)
    .index/contexts/cli/main          context -> folder: resolving a context walks no dates
    .index/sessions/{session uuid}    session -> folder
    .index/search.db                  full-text search and listing index (derived)
    .index/dirty/{session uuid}       "this session changed" markers for that index
    .locks/turn/cli/main              per-context lock for callers (a manager's turn)
    .locks/head/cli/main              per-context lock for create, delete, head moves
    archive/cli/2026-11-22/main/      an archived context: each file zstd-compressed
        019a5f...e1.jsonl.zst         (``{name}.zst``), and ``archive.json``, its manifest
    .index/archive/{session uuid}     archived session -> folder
    .index/pins/cli/main              "cli:main is pinned" (the ``pinned`` marker is the truth)
    .trash/{trash id}/                a deleted context: ``trash.json`` and ``context/``
    .trash/legacy/                    deleted legacy JSON files (terrarium.legacy); kept
    .staging/                         half-built moves of the lifecycle; leftovers are removed

A detached session (``create_segment`` without a context) lives in ``.detached/{session}/``,
a dot-folder, so nothing that walks the ``{type}`` folders takes it for a context. Attaching
it to a context (``FsStore.attach_context``) writes ``head.json`` into that folder, then
renames the folder to ``{type}/{date}/{name}/`` (the date is the session's root segment's),
then writes the index entries: a kill at any step leaves it detached or attached, never both
nor lost. A ``head.json`` in a folder still under ``.detached/`` is an attach that was killed
before its rename: it means nothing, and the next attach replaces it.

The type name ``archive`` is reserved: its folder holds the archive, never contexts
(:mod:`terrarium.stores.fs._archive`; the trash and pins are :mod:`terrarium.stores.fs._trash`).

Names are encoded with :func:`terrarium.model.encode_name`, so no context name can escape the
root, and safe names (``#python``) stay readable.
"""

from __future__ import annotations

import os
import re
import stat
import uuid
from pathlib import Path

from terrarium.errors import StoreError
from terrarium.model import SegmentId
from terrarium.stores._files import listdir

INDEX = ".index"
DETACHED = ".detached"
LOCKS = ".locks"
TRASH = ".trash"
LEGACY_TRASH = Path(TRASH, "legacy")
"""Where deleted legacy JSON files wait (:func:`terrarium.legacy.trash`); never emptied."""
ARCHIVE = "archive"
"""The archive's top folder; no context may have this type on a filesystem store."""
STAGING = ".staging"
PINS = "pins"
PIN = "pinned"
"""The marker file of a pinned context, in its folder (hot, archived or trashed)."""
HEAD = "head.json"
SEGMENT_SUFFIX = ".jsonl"
TRACE_SUFFIX = ".trace.jsonl"
DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def holds_context(folder: Path) -> bool:
    """Whether ``folder`` holds a context: a head record or any segment file."""
    return (folder / HEAD).exists() or bool(segment_ids(folder))


def segment_ids(folder: Path) -> list[SegmentId]:
    """The ids of the segment files in ``folder``, oldest first (UUIDv7 order)."""
    return sorted(
        uuid.UUID(segment_id)
        for name in listdir(folder)
        if (segment_id := segment_name(name)) is not None
    )


def check_inside(real_root: str, path: Path, error: type[StoreError] = StoreError) -> Path:
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


def real_dir(path: Path) -> bool:
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
    if _CANONICAL_UUID.fullmatch(stem):  # what FsStore writes: skip the parse
        return stem
    return str(uuid.UUID(stem)) if is_uuid(stem) else None


def is_uuid(text: str) -> bool:
    """Whether ``text`` is a UUID in any form ``uuid.UUID`` reads."""
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True
