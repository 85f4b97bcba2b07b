"""Date folders moved in or out by hand (the seed's "archive old date folders"), noticed.

A folder moved by hand leaves no dirty marker, so the index keeps the *shape* of the tree it
last saw: per type folder, its ``stat`` stamp and its date folders. A refresh ``stat``\\s each
type folder; only one whose stamp changed is listed again, and only the date folders that
appeared or vanished are walked. A stamp younger than ``RACY_NS`` is not trusted (a change
within the clock's granularity could keep it).

The shape is stored as JSON in the index's ``meta`` table::

    {"cli": [[ino, mtime_ns, ctime_ns] or null, ["2025-11-05", "2025-11-06"]], ...}
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import msgspec

from terrarium.stores._files import scandir
from terrarium.stores.fs._layout import ARCHIVE

RACY_NS = 2_000_000_000
"""A type folder stamp younger than this is listed again at the next refresh."""

Shape = dict[str, list[Any]]
"""Type folder name -> [stamp or None, sorted date folder names]."""


class ShapeChange(msgspec.Struct):
    """What moved since the shape the index holds, and the shape to hold next."""

    shape: Shape
    changed: bool = False
    """Whether ``shape`` differs from the one held (it must then be stored)."""
    added: list[str] = msgspec.field(default_factory=list)
    """Date folders (``type/date``) that appeared, to walk."""
    removed: list[str] = msgspec.field(default_factory=list)
    """Date folders (``type/date``) that vanished: their sessions are looked at again."""

    @property
    def text(self) -> str:
        """``shape`` as stored."""
        return json.dumps(self.shape, sort_keys=True, separators=(",", ":"))

    @property
    def moved(self) -> bool:
        """Whether a date folder appeared or vanished."""
        return bool(self.added or self.removed)


def load(text: str | None) -> Shape | None:
    """The stored shape, or None if none was stored (or it cannot be read)."""
    try:
        value = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def type_folders(root: str | Path) -> list[os.DirEntry[str]]:
    """The type folders under ``root``: not the store's own (dot-folders, ``archive``), no link."""
    return [
        entry
        for entry in scandir(root)
        if not entry.name.startswith(".")
        and entry.name != ARCHIVE
        and entry.is_dir(follow_symlinks=False)
    ]


def compare(root: Path, known: Shape | None) -> ShapeChange:
    """Compare the tree under ``root`` with ``known`` (None: nothing known, all is added)."""
    now_ns = time.time_ns()
    held = known or {}
    change = ShapeChange({}, changed=known is None)
    for entry in type_folders(root):
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        stamp = [st.st_ino, st.st_mtime_ns, st.st_ctime_ns]
        old = held.get(entry.name)
        if old is not None and old[0] == stamp:
            change.shape[entry.name] = old
            continue
        dates = sorted(d.name for d in scandir(entry.path) if d.is_dir(follow_symlinks=False))
        trusted = now_ns - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_NS
        change.shape[entry.name] = [stamp if trusted else None, dates]
        before = set(old[1]) if old is not None else set()
        change.added += [f"{entry.name}/{d}" for d in dates if d not in before]
        change.removed += [f"{entry.name}/{d}" for d in sorted(before - set(dates))]
    for name in sorted(held.keys() - change.shape.keys()):
        change.removed += [f"{name}/{d}" for d in held[name][1]]
    change.changed = change.changed or change.shape != held
    return change
