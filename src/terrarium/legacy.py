"""Legacy Terrarium JSON files beside a filesystem store: found, listed, read and resumed in place.

The old Terrarium Agent kept each context in ``{type}/{date}/{name}.json``. Only the root of an
:class:`~terrarium.stores.fs.FsStore` holds them. A file holds the context its content names,
found where the old tool looked (:func:`_rank`); one found otherwise is a problem. A context in
the log hides its legacy file; files are read in place, never changed, and a write imports the
file into the log first (:func:`import_legacy`). The scan skips ``archive/``, where the seed
moved old files by hand.

Usage::

    legacy.resume(store, context)  # imports its legacy file, if only that file holds it
"""

from __future__ import annotations

import errno
import os
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

import msgspec

from terrarium._lazy import lazy_module
from terrarium.errors import ContextExists, StoreError
from terrarium.formats import Folder, iter_legacy_files
from terrarium.formats import list_legacy_folder as _list_folder
from terrarium.index._listing import ContextSummary
from terrarium.model import DATE_RE, ContextId, legacy_file_names, printable
from terrarium.stores._files import inside, listdir, make_dirs
from terrarium.stores.base import PodMetadata, Store, context_lock

if TYPE_CHECKING:
    from terrarium.formats import terrarium_json as tj
    from terrarium.stores.fs import FsStore
    from terrarium.stores.memory import MemoryStore
else:  # the legacy format's module is imported when a legacy file is read, not by a listing
    tj = lazy_module("terrarium.formats.terrarium_json")

_RACY_NS = 2_000_000_000
"""A stamp this close to the time it was read may still change unseen (mtime granularity)."""

T = TypeVar("T")


class LegacyProblem(msgspec.Struct, frozen=True):
    """A legacy file that could not be used, and why."""

    path: Path
    reason: str
    """One line: what is wrong with it."""

    def __str__(self) -> str:
        return f"{printable(str(self.path))}: {self.reason}"


Parsed = ContextSummary | LegacyProblem
"""A file's listing row (``state`` ``legacy``), or why it cannot be used."""


class LegacyListing(msgspec.Struct, frozen=True):
    """Every legacy session beside a store, and the files that could not be used."""

    sessions: tuple[ContextSummary, ...] = ()
    """One listing row per context (``state`` ``legacy``; times and counts as the file wrote
    them), in path order."""
    problems: tuple[LegacyProblem, ...] = ()
    """Unreadable, misnamed or shadowed files, in path order."""
    by_context: Mapping[str, ContextSummary] = msgspec.field(default_factory=dict)
    """The rows by context id."""


class LegacyCopy(msgspec.Struct, frozen=True):
    """A legacy context read into memory."""

    store: MemoryStore
    """A store holding only that context, imported from the file."""
    path: Path
    """The file it was read from."""


def legacy_root(store: Store) -> Path | None:
    """The folder legacy files lie in: a filesystem store's root (no other store has one)."""
    fs = _as_fs(store)
    return fs.root if fs is not None else None


def _as_fs(store: Store) -> FsStore | None:
    """``store`` if it is an FsStore, else None."""
    # A store is an FsStore only if its module was imported: a listing of an SQLite store
    # need not import the filesystem backend to learn that it has no legacy files.
    fs = sys.modules.get("terrarium.stores.fs")
    return store if fs is not None and isinstance(store, fs.FsStore) else None


def listing(store: Store) -> LegacyListing:
    """Every legacy session beside ``store`` that the log may or may not hide, and problems."""
    scanner = _scanner(store)
    if scanner is None:
        return LegacyListing()
    with scanner.lock:
        return scanner.scan()


def files(store: Store, context: ContextId) -> list[Path]:
    """The legacy files in ``context``'s places that hold it or are unreadable (archive's load)."""
    return [path for path, _ in _candidates(store, context)]


def read(store: Store, context: ContextId) -> LegacyCopy | None:
    """The context's legacy file read into a :class:`MemoryStore`; None if it has none.

    LegacyFormatError if the file is not a legacy session; OSError if it cannot be read.
    """
    path = find(store, context)
    if path is None:
        return None
    from terrarium.stores.memory import MemoryStore

    memory = MemoryStore()
    tj.import_session(memory, _load(store, path), context=context)
    return LegacyCopy(memory, path)


def import_legacy(store: Store, context: ContextId) -> bool:
    """Import the context's legacy file unless the log has it (under its lock); whether it did.

    LegacyFormatError or OSError if the context's legacy file cannot be read.
    """
    if store.get_head(context) is not None or (path := find(store, context)) is None:
        return False
    try:
        tj.import_session(store, _load(store, path), context=context)
    except ContextExists:  # a writer that does not take the lock created it meanwhile
        return False
    return True


def resume(store: Store, context: ContextId) -> bool:
    """:func:`import_legacy` under the context's lock, taken only when a legacy file holds it."""
    if store.get_head(context) is not None or find(store, context) is None:
        return False
    with context_lock(store, context):
        return import_legacy(store, context)


def import_file(
    store: Store,
    path: Path,
    *,
    root: Path | None,
    context: ContextId | None = None,
    raw: bytes | None = None,
) -> PodMetadata:
    """Import the legacy file ``path`` (of the sessions folder ``root``; its bytes ``raw`` if
    read already) as a new context.

    A file of the store's own folder is imported under its context's lock, and only if it still
    lies there: one deleted or migrated since it was read is FileNotFoundError, never a context
    brought back. ContextExists if the context exists.
    """
    session = tj.load(path, root=root, raw=raw)
    own = legacy_root(store)
    if own is None or not inside(path, own):
        return tj.import_session(store, session, context=context)
    with context_lock(store, context or session.context):
        if not os.path.lexists(path):
            raise FileNotFoundError(errno.ENOENT, "deleted or moved meanwhile", str(path))
        return tj.import_session(store, session, context=context)


def trash(store: Store, context: ContextId) -> list[Path]:
    """Move every legacy file of ``context`` to ``.trash/legacy/{random id}/``; where they went.

    StoreError if a file, or the trash, lies outside the store's folder (through a symbolic
    link).
    """
    from terrarium.stores.fs import LEGACY_TRASH

    root = legacy_root(store)
    moved: list[Path] = []
    while root is not None and (found := find(store, context)) is not None:
        if not inside(found.parent, root):
            raise StoreError(f"{printable(str(found))}: {_outside(root)}, nor moved")
        target = root / LEGACY_TRASH / uuid.uuid4().hex / found.relative_to(root)
        if not inside(target.parent, root):  # the trash folder is a link out of the store
            raise StoreError(f"{printable(str(target.parent))}: {_outside(root)}, nor moved")
        make_dirs(target.parent)
        os.rename(found, target)
        moved.append(target)
    return moved


def find(store: Store, context: ContextId) -> Path | None:
    """The legacy file of ``context``, whether or not the log has it: the first of its places
    that holds it, else an unreadable one, else None."""
    found = _candidates(store, context)
    held = (path for path, f in found if not isinstance(f, LegacyProblem))
    return next(held, found[0][0] if found else None)


def _candidates(store: Store, context: ContextId) -> list[tuple[Path, Parsed]]:
    """The files in ``context``'s places, in lookup order, that hold it or are unreadable."""
    scanner = _scanner(store)
    if scanner is None:
        return []
    with scanner.lock:
        now = time.time_ns()
        found = [(path, scanner.parsed(path, now)) for path in _places(scanner.root, context)]
    wanted = str(context)
    return [(p, f) for p, f in found if isinstance(f, LegacyProblem) or f.context == wanted]


def _load(store: Store, path: Path) -> tj.LegacySession:
    """Read a legacy file of ``store`` (never through a link that leaves its root)."""
    root = legacy_root(store)
    assert root is not None
    if not inside(path, root):
        raise tj.LegacyFormatError(str(LegacyProblem(path, _outside(root))))
    return tj.load(path, root=root)


def _outside(root: Path) -> str:
    return f"lies outside {root} (a symbolic link); not read"


def _places(root: Path, context: ContextId) -> Iterator[Path]:
    """The existing files where ``context`` is looked up, in :func:`_rank` order."""
    names = legacy_file_names(context.name)
    type_dir = root / context.type
    dates = sorted((d for d in listdir(type_dir) if DATE_RE.fullmatch(d)), reverse=True)
    for folder in [*(type_dir / d for d in dates), type_dir, root]:
        for name in names:
            if (folder / name).is_file():
                yield folder / name


def _rank(root: Path, path: Path, row: ContextSummary) -> tuple[int, ...] | None:
    """Where ``path`` comes in the old tool's lookup order for the context of ``row``; None:
    not one of its places."""
    names = legacy_file_names(row.name)
    parts = path.relative_to(root).parts
    if not parts or parts[-1] not in names:
        return None
    which = names.index(parts[-1])
    if len(parts) == 3 and parts[0] == row.type and DATE_RE.fullmatch(parts[1]):
        return (0, -int(parts[1].replace("-", "")), which)
    if len(parts) == 2 and parts[0] == row.type:
        return (1, which)
    if len(parts) == 1:
        return (2, which)
    return None


class _Seen(msgspec.Struct, Generic[T], frozen=True):
    """What a folder or file held when it had ``stamp``."""

    stamp: tuple[int, ...]
    trusted: bool
    """False if the stamp was too young to tell a later change from this state."""
    value: T


class _Scanner:
    """One store's cached view of its legacy files.

    A folder is listed again, a file parsed again, only when its inode, size, ``mtime`` or
    ``ctime`` changed; a stamp younger than ``_RACY_NS`` is not trusted. With 20,000 native
    contexts in one date folder: the first listing 14 ms (the native listing: 250 ms), later
    ones 0.1 ms.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lock = threading.Lock()
        self.folders: dict[Path, _Seen[Folder]] = {}
        self.files: dict[Path, _Seen[Parsed]] = {}

    def scan(self) -> LegacyListing:
        """Walk the root (through the cache) and sort each file into sessions or problems."""
        now = time.time_ns()
        seen: set[Path] = set()

        def folder(path: Path, level: int) -> Folder:
            seen.add(path)
            try:
                st = os.stat(path)
            except (FileNotFoundError, NotADirectoryError):
                return (), ()
            return _cached(self.folders, path, st, now, lambda: _list_folder(path, level))

        # archive/: where the seed moved old files by hand (archived already)
        paths = sorted(iter_legacy_files(self.root, lister=folder, skip=("archive",)))
        seen_files = set(paths)
        self.folders = {p: s for p, s in self.folders.items() if p in seen}
        self.files = {p: s for p, s in self.files.items() if p in seen_files}
        return _sort_out(self.root, [(path, self.parsed(path, now)) for path in paths])

    def parsed(self, path: Path, now: int) -> Parsed:
        """The file's summary or problem, parsed again only if the file changed."""
        try:
            st = os.stat(path)
        except OSError as exc:
            return LegacyProblem(path, exc.strerror or str(exc))
        return _cached(self.files, path, st, now, lambda: _summarise(path, self.root))


def _cached(
    cache: dict[Path, _Seen[T]],
    path: Path,
    st: os.stat_result,
    now: int,
    make: Callable[[], T],
) -> T:
    """``path``'s value in ``cache``, made again unless its trusted stamp still holds."""
    stamp = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
    cached = cache.get(path)
    if cached is not None and cached.trusted and cached.stamp == stamp:
        return cached.value
    value = make()
    trusted = now - max(st.st_mtime_ns, st.st_ctime_ns) > _RACY_NS
    cache[path] = _Seen(stamp, trusted, value)
    return value


def _summarise(path: Path, root: Path) -> Parsed:
    """Parse one file into its listing row, or the one-line reason it cannot be used."""
    if not inside(path, root):
        return LegacyProblem(path, _outside(root))
    try:
        session = tj.load(path, root=root)
        context = session.context
    except (OSError, ValueError, RecursionError) as exc:
        return LegacyProblem(path, tj.failure(path, exc))
    meta, last = session.metadata, session.metadata.last_active
    return ContextSummary(
        *(str(context), meta.session_date, len(session.messages), last, meta.created_at, last),
        state="legacy",
        legacy_path=str(path),
    )


def _sort_out(root: Path, parsed: list[tuple[Path, Parsed]]) -> LegacyListing:
    """Keep each context's file (:func:`_rank`); every other file becomes a problem."""
    problems = [p for _, p in parsed if isinstance(p, LegacyProblem)]
    ranked: list[tuple[tuple[int, ...], Path, ContextSummary]] = []
    for path, row in parsed:
        if isinstance(row, LegacyProblem):
            continue
        rank = _rank(root, path, row)
        if rank is not None:
            ranked.append((rank, path, row))
            continue
        reason = f"holds {row.context}, which is looked up as {legacy_file_names(row.name)[-1]}"
        problems.append(LegacyProblem(path, reason))
    kept: dict[str, tuple[Path, ContextSummary]] = {}
    for _, path, row in sorted(ranked, key=lambda found: found[0]):  # the old tool's first wins
        winner = kept.setdefault(row.context, (path, row))[0]
        if winner != path:
            reason = f"another file of {row.context}, which is read from {winner}"
            problems.append(LegacyProblem(path, reason))
    sessions = [row for _, row in sorted(kept.values(), key=lambda found: found[0])]
    problems.sort(key=lambda p: p.path)
    return LegacyListing(tuple(sessions), tuple(problems), {r.context: r for r in sessions})


_SCANNERS: weakref.WeakKeyDictionary[FsStore, _Scanner] = weakref.WeakKeyDictionary()
_SCANNERS_LOCK = threading.Lock()


def _scanner(store: Store) -> _Scanner | None:
    fs = _as_fs(store)
    if fs is None:
        return None
    with _SCANNERS_LOCK:
        scanner = _SCANNERS.get(fs)
        if scanner is None:
            scanner = _SCANNERS[fs] = _Scanner(fs.root)
        return scanner


__all__ = [
    "LegacyCopy",
    "LegacyListing",
    "LegacyProblem",
    "files",
    "find",
    "import_legacy",
    "legacy_root",
    "listing",
    "read",
    "resume",
    "trash",
]
