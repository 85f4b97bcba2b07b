"""Export contexts in any of the formats in :data:`FORMATS`, one at a time or many at once.

Each format's module is imported only when used, so listing the formats costs nothing.
:func:`export_many` writes one file per context, ``{type}/{encoded name}{extension}``, into
a folder or a ``.zip`` or ``.tar.gz`` archive; ``terrarium-json`` uses the seed's layout
``{type}/{date}/{encoded name}.json``, a sessions folder the old tool reads. ``finetune`` is
one JSONL file for all; ``jsonl`` writes a bundle (:mod:`terrarium.bundle`) that
``terrarium import`` reads back. Legacy files beside the store are exported like native
contexts. Everything is written to a temporary name and renamed into place.
"""

from __future__ import annotations

import errno
import importlib
import io
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from terrarium._lazy import lazy_module
from terrarium.formats import ARCHIVE_SUFFIXES
from terrarium.stores._files import make_dirs, open_private, write_all, write_atomic

if TYPE_CHECKING:
    from terrarium import model
    from terrarium.formats.jsonl import DateBound
    from terrarium.model import ContextId
    from terrarium.stores.base import Store
else:  # the command line reads FORMATS at every start; the model is for exporting
    model = lazy_module("terrarium.model")


@dataclass(frozen=True, slots=True)
class Format:
    """An export format."""

    name: str
    """The name users pass (``markdown``, ``html``, ...)."""
    extension: str
    """The file name extension, with its dot."""
    media_type: str
    module: str
    function: str = "export_context"
    """The module's ``(store, context) -> str | bytes`` function."""
    dated: bool = False
    """Whether many files are laid out by date, ``{type}/{date}/{name}{extension}``."""

    def export(self, store: Store, context: ContextId | str) -> str | bytes:
        """Export one context in this format."""
        module = importlib.import_module(self.module)
        exporter: Callable[[Store, ContextId], str | bytes] = getattr(module, self.function)
        return exporter(store, model.ContextId.parse(context))


_JSON, _NDJSON = "application/json", "application/x-ndjson"
FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("markdown", ".md", "text/markdown; charset=utf-8", "terrarium.formats.markdown"),
        Format("html", ".html", "text/html; charset=utf-8", "terrarium.formats.html"),
        Format("jsonl", ".jsonl", _NDJSON, "terrarium.formats.jsonl"),
        Format("openai", ".json", _JSON, "terrarium.formats.openai"),
        Format(
            "finetune", ".jsonl", _NDJSON, "terrarium.formats.openai", "export_finetune_context"
        ),
        Format("terrarium-json", ".json", _JSON, "terrarium.formats.terrarium_json", dated=True),
    )
}
"""Every export format by name."""

FINETUNE_FILE = "finetune.jsonl"
"""The file name the ``finetune`` format uses inside a folder or an archive."""


ALIASES: dict[str, str] = {
    "md": "markdown",
    "txt": "markdown",
    "text": "markdown",
    "htm": "html",
    "ndjson": "jsonl",
    "native": "jsonl",
    "fine-tune": "finetune",
    "legacy": "terrarium-json",
}
"""Other names users type for a format (file extensions, mostly), each to its format's name."""

AMBIGUOUS: dict[str, tuple[str, ...]] = {"json": ("openai", "terrarium-json")}
"""Names that could mean more than one format: refused with the candidates named."""


def format_name(fmt: str) -> str:
    """The format a user means by ``fmt``, a name or an alias in any case; else ValueError."""
    key = fmt.strip().lower()
    if key in FORMATS:
        return key
    if key in ALIASES:
        return ALIASES[key]
    if key in AMBIGUOUS:
        choices = " or ".join(AMBIGUOUS[key])
        raise ValueError(f"export format {fmt!r} is ambiguous: use {choices}")
    known = ", ".join(sorted(FORMATS))
    aliases = ", ".join(f"{a} ({n})" for a, n in ALIASES.items())
    raise ValueError(f"unknown export format {fmt!r}: use one of {known}; aliases: {aliases}")


def get_format(fmt: str | Format) -> Format:
    """Look a format up by name or alias; ValueError listing the known ones if there is none."""
    return fmt if isinstance(fmt, Format) else FORMATS[format_name(fmt)]


def export_context(store: Store, context: ContextId | str, fmt: str | Format) -> str | bytes:
    """One context in ``fmt``, a name in :data:`FORMATS` (else ValueError) or a :class:`Format`."""
    return get_format(fmt).export(store, context)


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """An OSError while writing ``path`` names ``path``, not a temporary file (or nothing: a
    full disk's error names no file)."""
    try:
        yield
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc


def write_export(path: Path, content: str | bytes) -> None:
    """Write one export to ``path`` (a file the user names). A new file is created ``0600``,
    as it holds a conversation; a file that exists keeps its mode. A plain file is replaced
    whole or not at all (a full disk leaves the old one as it was, not truncated); anything
    else (a link, ``/dev/stdout``, a pipe) is written in place."""
    data = content if isinstance(content, bytes) else content.encode()
    try:
        old = os.lstat(path)
    except FileNotFoundError:
        old = None
    with writing(path):
        if old is not None and not stat.S_ISREG(old.st_mode):
            fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                write_all(fd, data)
            finally:
                os.close(fd)
        elif path.parent.is_dir():  # as open() would, never making a folder
            write_atomic(path, data, sync=False)
            if old is not None:
                os.chmod(path, stat.S_IMODE(old.st_mode))
        else:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))


def member_name(context: ContextId | str, fmt: str | Format, date: str | None = None) -> str:
    """``{type}/[{date}/]{encoded name}{extension}``: a context's export file (dated formats)."""
    spec = get_format(fmt)
    return model.context_file(context, spec.extension, date if spec.dated else None)


@dataclass(frozen=True, slots=True)
class ExportResult:
    """What :func:`export_many` wrote."""

    path: Path
    """The folder, archive or JSONL file written."""
    members: list[str] = field(default_factory=list)
    """The files written, relative to the folder or inside the archive (``/``-separated)."""
    contexts: list[ContextId] = field(default_factory=list)
    """The contexts written."""
    damaged: list[tuple[str, str]] = field(default_factory=list)
    """The contexts (or ``session {id}``) left out because their log is damaged, each with
    its problem (file and line)."""


def _is_archive(dest: Path) -> bool:
    return dest.name.lower().endswith(ARCHIVE_SUFFIXES)


def check_destination(dest: str | os.PathLike[str]) -> None:
    """Refuse (ValueError) a many-file destination that names one file (``single.md``).

    A folder is one that exists, a name without an extension, or one ending in ``/``.
    """
    text = os.fspath(dest)
    target = Path(text)
    if _is_archive(target) or target.is_dir():
        return
    if target.exists() or (target.suffix and not text.endswith(("/", os.sep))):
        raise ValueError(
            f"{text} is not a folder or an archive: many sessions go into a folder "
            f"(write {text}/ to make one), a .zip, a .tar.gz or a .tgz"
        )


def _select(
    store: Store,
    contexts: Iterable[ContextId | str] | None,
    type: str | None,
    since: DateBound | None,
    until: DateBound | None,
    *,
    archived: bool = False,
    damaged: list[tuple[str, str]],
) -> dict[ContextId, Store]:
    """The chosen contexts, sorted, each with its store (a legacy file's throw-away one); a
    damaged one that a date filter must read is noted in ``damaged`` and left out."""
    from terrarium import legacy, states
    from terrarium.contexts import legacy_rows
    from terrarium.formats.jsonl import load_transcript
    from terrarium.stores.base import Lifecycle

    if contexts is None:  # as ``list`` shows them: an archived context hides its legacy file
        hot = [h.context for h in store.list_contexts(type)]
        found = legacy_rows(store, legacy.listing(store), hot, type)
        contexts = [*hot, *(row.context for row in found)]
        if archived and isinstance(store, Lifecycle):
            contexts += [a.context for a in states.archived_contexts(store, type)]
    wanted = {model.ContextId.parse(c) for c in contexts}
    chosen: dict[ContextId, Store] = {}
    for context in sorted(c for c in wanted if type is None or c.type == type):
        copy = legacy.read(store, context) if store.get_head(context) is None else None
        chosen[context] = store if copy is None else copy.store
    if since is None and until is None:
        return chosen
    from terrarium.sessions import readable

    active = readable(chosen, damaged, lambda c, s: load_transcript(s, c))
    return {c: chosen[c] for c, found in active.items() if found.active_between(since, until)}


def _member(spec: Format, store: Store, context: ContextId) -> tuple[str, bytes]:
    """A context's file in a many-file export: its relative name and its content."""
    date = None
    if spec.dated:
        from terrarium.formats import terrarium_json

        data = terrarium_json.export_dict(store, context)
        date = data["metadata"].get("session_date")
        if not isinstance(date, str) or not model.DATE_RE.fullmatch(date):  # a header edited
            head = store.get_head(context)
            date = head.date if head is not None else None
        content: str | bytes = terrarium_json.dumps(data)
    else:
        content = spec.export(store, context)
    raw = content.encode() if isinstance(content, str) else content
    return member_name(context, spec, date), raw


def export_many(
    store: Store,
    contexts: Iterable[ContextId | str] | None,
    fmt: str | Format,
    dest: str | os.PathLike[str],
    *,
    type: str | None = None,
    since: DateBound | None = None,
    until: DateBound | None = None,
) -> ExportResult:
    """Export ``contexts`` (all when None; legacy files count) into a folder, an archive, or
    (``finetune``) one JSONL file.

    ``dest`` is a folder (created if needed) or a ``.zip``, ``.tar.gz`` or ``.tgz`` archive.
    ``type``, ``since`` and ``until`` keep the contexts of that type with a message logged in
    the window (a date is its whole UTC day; both ends inclusive). A context whose log is
    damaged is left out, the others written: ``damaged`` in the result names it. Raises
    ValueError (an unknown format, or ``dest`` names one file), ContextNotFound,
    LegacyFormatError or OSError.
    """
    spec = get_format(fmt)
    target = Path(dest)
    if spec.name != "finetune":  # one JSONL file is what finetune writes
        check_destination(dest)
    bundle = spec.name == "jsonl"
    damaged: list[tuple[str, str]] = []
    chosen = _select(store, contexts, type, since, until, archived=bundle, damaged=damaged)
    if bundle:  # the whole trees, and what a store is besides: terrarium.bundle
        from terrarium.bundle import bundle_files

        whole = contexts is None and type is None and since is None and until is None
        files = bundle_files(store, chosen, detached=whole, damaged=damaged)
    else:
        from terrarium.sessions import readable

        files = dict(readable(chosen, damaged, lambda c, s: _member(spec, s, c)).values())
    left_out = {name for name, _ in damaged}
    written = [c for c in chosen if str(c) not in left_out]
    if spec.name == "finetune":  # one line per context (or none), in one file
        data = b"".join(files.values())
        if not _is_archive(target) and not target.is_dir():
            write_export(target, data)  # a pipe or a device (/dev/stdout) is never replaced
            return ExportResult(target, [], written, damaged)
        files = {FINETUNE_FILE: data}
    _write(target, files)
    return ExportResult(target, list(files), written, damaged)


def _write(target: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` into the archive or folder ``target``, each file atomically."""
    name = target.name.lower()
    if name.endswith((".zip", ".tar.gz", ".tgz")):
        with writing(target):
            write_atomic(target, (_zip if name.endswith(".zip") else _tar_gz)(files), sync=False)
        return
    from terrarium.bundle import MANIFEST

    # A bundle's manifest last: a folder an interrupted export left is no bundle.
    for member in sorted(files, key=lambda member: member == MANIFEST):
        path = target.joinpath(*member.split("/"))
        with writing(path):
            write_atomic(path, files[member], sync=False)
    with writing(target):
        make_dirs(target)


def _zip(files: dict[str, bytes]) -> bytes:
    import zipfile  # here, not at the top: every command line start imports this module

    buf = io.BytesIO()
    stamp = time.localtime()[:6]
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for member, data in files.items():
            info = zipfile.ZipInfo(member, date_time=stamp)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    return buf.getvalue()


def _tar_gz(files: dict[str, bytes]) -> bytes:
    import tarfile

    buf = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode="w:gz") as archive:
        for member, data in files.items():
            info = tarfile.TarInfo(member)
            info.size, info.mtime, info.mode = len(data), now, 0o644
            archive.addfile(info, io.BytesIO(data))
    return buf.getvalue()
