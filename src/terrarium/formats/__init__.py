"""Formats that are not ours: conversions between the log model and other file formats.

Here too, where :mod:`terrarium.legacy` reads them without importing the format's module: the
one walk of a legacy sessions folder (:func:`iter_legacy_files`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz")
"""The endings of an archive's name: what ``export`` writes as one, and ``import`` reads as a
bundle (here, where both import it without an import circle)."""

Folder = tuple[tuple[str, ...], tuple[str, ...]]
"""A folder's legacy file names and the names of its folders that may hold more, each sorted."""


def list_legacy_folder(path: Path, level: int) -> Folder:
    """What ``path`` holds of a sessions folder (level 0: the root, 1: a type, 2: a date)."""
    from terrarium.model import DATE_RE  # not at the top: every command line start imports this

    files: list[str] = []
    folders: list[str] = []
    try:
        entries = list(os.scandir(path))
    except (FileNotFoundError, NotADirectoryError):
        return (), ()
    for entry in entries:
        name = entry.name
        if level == 0 and name.startswith("."):
            continue  # the store's own .index, .locks, .trash
        if level == 2 and not name.endswith(".json"):
            continue  # context folders: skipped without a stat
        if entry.is_dir():
            if level == 0 or (level == 1 and DATE_RE.fullmatch(name)):
                folders.append(name)
        elif name.endswith(".json") and entry.is_file():
            files.append(name)
    return tuple(sorted(files)), tuple(sorted(folders))


def iter_legacy_files(
    root: str | os.PathLike[str],
    *,
    lister: Callable[[Path, int], Folder] = list_legacy_folder,
    skip: Collection[str] = (),
) -> Iterator[Path]:
    """Every legacy session file under ``root``, sorted, dated and flat; never the store's own.

    ``lister`` lists a folder (a cache of :func:`list_legacy_folder`); the folders named in
    ``skip`` are passed over at the top.
    """

    def below(path: Path, level: int) -> Iterator[Path]:
        files, folders = lister(path, level)
        is_file = set(files)
        for name in sorted((*files, *folders)):
            if name in is_file:
                yield path / name
            elif not (level == 0 and name in skip):
                yield from below(path / name, level + 1)

    return below(Path(root), 0)
