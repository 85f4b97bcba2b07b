"""A whole store (or some of its contexts) as one bundle that ``terrarium import`` reads back.

``export --all -f jsonl -o backup.tar.gz`` (or ``.zip``, ``.tgz``, a folder) writes a bundle;
``import backup.tar.gz`` (:func:`import_bundle`) recreates every segment of every context's
session tree with its ids, times and seqs, each head, archived contexts (archived), pins,
traces and, for a whole store, detached sessions. Members, the manifest first::

    terrarium-bundle.json          {"format": "terrarium-bundle", "version": 1,
                                    "contexts": [{"context", "file", "head", "archived",
                                                  "pinned", "traces"}, ...],
                                    "detached": [{"session_id", "file", "traces"}, ...]}
    {type}/{encoded name}.jsonl    a context's session tree, parents first, the head's
                                   segment last when none grows from it (so the file alone
                                   is a jsonl export), large outputs inline
    _detached/{session id}.jsonl   a detached session's tree, the same way
    _traces/{session id}.jsonl     debug traces: {"segment_id", "ts", "event", "data"}

An import is a copy: each entry is read and checked into a :class:`MemoryStore` of its own,
then :func:`terrarium.copy.copy_store` writes it with copy's rules (a context the store has is
skipped). A bad entry is reported and the others are still imported.
"""

from __future__ import annotations

import json
import os
import tarfile
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path, PurePosixPath
from typing import IO, Any, Self

from terrarium import codec, states
from terrarium.copy import CopyReport, SessionSource, complete_session, copy_store, session_segments
from terrarium.errors import FormatVersionError, InvalidEntry, TerrariumError
from terrarium.formats import ARCHIVE_SUFFIXES
from terrarium.formats.jsonl import read_segments
from terrarium.model import ContextId, SegmentId, SessionId, TraceEntry, context_file
from terrarium.sessions import detached_sessions, readable, require_head
from terrarium.stores.base import Lifecycle, Store
from terrarium.stores.memory import MemoryStore

MANIFEST = "terrarium-bundle.json"
"""The manifest's name: the bundle's first member (a folder holding it is a bundle)."""
FORMAT = "terrarium-bundle"
VERSION = 1

Files = dict[str, bytes]

MAX_MEMBER = 256 * 2**20
"""The most bytes an import reads of one member unless ``$TERRARIUM_IMPORT_MAX_MEMBER`` says
otherwise. A member is read whole and staged: importing a 202 MB member peaked at 577 MB of
memory. A larger one (or a zip bomb's) is refused before it is read, never read in part."""
LIMIT_VARIABLE = "TERRARIUM_IMPORT_MAX_MEMBER"


def member_limit() -> int:
    """The most bytes an import reads of one member (:data:`MAX_MEMBER`, or the variable's)."""
    text = os.environ.get(LIMIT_VARIABLE)
    if text is None:
        return MAX_MEMBER
    if not text.strip().isdigit() or int(text) <= 0:
        raise InvalidEntry(f"${LIMIT_VARIABLE} must be a positive number of bytes, not {text!r}")
    return int(text)


def bundle_files(
    store: Store,
    chosen: Mapping[ContextId, Store],
    *,
    detached: bool,
    damaged: list[tuple[str, str]],
) -> Files:
    """The members of a bundle of ``chosen`` (and ``store``'s detached sessions), manifest
    first; a context or session whose log is damaged is left out, noted in ``damaged``."""
    pinned = states.pinned_contexts(store) if isinstance(store, Lifecycle) else frozenset()
    files: Files = {}

    def entry(context: ContextId, source: Store) -> dict[str, Any]:
        head = require_head(source, context)
        found: dict[str, Any] = {"context": str(context), "head": str(head.segment_id)}
        member = context_file(context, ".jsonl")
        found.update(_tree(files, source, head.session_id, head.segment_id, member))
        if source is store and isinstance(store, Lifecycle) and states.is_archived(store, context):
            found["archived"] = True
        if str(context) in pinned:
            found["pinned"] = True
        return found

    def loose(_: str, session: SessionId) -> dict[str, str]:
        member = f"_detached/{session}.jsonl"
        return {"session_id": str(session), **_tree(files, store, session, None, member)}

    contexts = list(readable(chosen, damaged, entry).values())
    sessions = {f"session {s}": s for s in (detached_sessions(store) if detached else [])}
    loose_ones = list(readable(sessions, damaged, loose).values())
    manifest = {"format": FORMAT, "version": VERSION, "contexts": contexts, "detached": loose_ones}
    return {MANIFEST: json.dumps(manifest, indent=1, ensure_ascii=False).encode(), **files}


def _tree(
    files: Files, store: Store, session_id: SessionId, head: SegmentId | None, member: str
) -> dict[str, str]:
    """Add the session's tree (and its traces, if any) to ``files``, all of it or (an error
    reading it) nothing; their manifest keys."""
    segments = session_segments(store, session_id)
    grown = {(s[0].get("origin") or {}).get("parent") for s in segments}
    if head is not None and str(head) not in grown:  # the head last: the file alone imports
        segments.sort(key=lambda s: s[0]["segment_id"] == str(head))
    keys = {"file": member}
    traces = [
        {"segment_id": s[0]["segment_id"], **trace}
        for s in segments
        for trace in store.read_trace(session_id, SegmentId(s[0]["segment_id"]))
    ]
    files[member] = b"".join(codec.encode_line(line) for s in segments for line in s)
    if traces:
        keys["traces"] = f"_traces/{session_id}.jsonl"
        files[keys["traces"]] = "".join(
            json.dumps(t, ensure_ascii=False, separators=(",", ":")) + "\n" for t in traces
        ).encode()
    return keys


def is_bundle(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is read as a bundle: a folder with a manifest, or an archive's name."""
    where = Path(path)
    if where.is_dir():
        return (where / MANIFEST).is_file()
    return where.is_file() and where.name.lower().endswith(ARCHIVE_SUFFIXES)


class _Members:
    """A bundle's files by name, from a folder, a zip or a gzipped tar archive."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._zip: zipfile.ZipFile | None = None
        self._tar: tarfile.TarFile | None = None
        if path.is_dir():
            return
        try:
            if path.name.lower().endswith(".zip"):
                self._zip = zipfile.ZipFile(path)
            else:
                self._tar = tarfile.open(path, "r:gz")
        except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error) as exc:
            raise InvalidEntry(f"{path} is not a readable archive: {exc}") from None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        for archive in (self._zip, self._tar):
            if archive is not None:
                archive.close()

    def read(self, member: str) -> bytes:
        """The member's bytes; InvalidEntry if missing, unreadable, or named outside the bundle."""
        data = self.find(member)
        if data is None:
            raise InvalidEntry(f"{self.path} has no {member}, which its manifest names")
        return data

    def find(self, member: str) -> bytes | None:
        """The member's bytes, None if there is none; InvalidEntry if it cannot be read."""
        parts = PurePosixPath(member).parts
        if not parts or member.startswith("/") or "\\" in member or ".." in parts:
            raise InvalidEntry(f"{self.path}: the manifest names a file outside it: {member!r}")
        try:
            return self._read(member)
        except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error) as exc:
            raise InvalidEntry(f"{self.path}: {member}: {exc}") from None

    def _read(self, member: str) -> bytes | None:
        if self._zip is not None:
            try:
                info = self._zip.getinfo(member)
            except KeyError:
                return None
            with self._zip.open(info) as handle:
                return bounded(handle, info.file_size, f"{self.path}: {member}")
        if self._tar is not None:
            try:
                found = self._tar.getmember(member)
            except KeyError:
                return None
            extracted = self._tar.extractfile(found) if found.isfile() else None
            if extracted is None:  # a link or a device: never followed
                raise InvalidEntry(f"{self.path}: {member} is not a regular file: not read")
            return bounded(extracted, found.size, f"{self.path}: {member}")
        file = self.path.joinpath(*member.split("/"))
        if not file.resolve().is_relative_to(self.path.resolve()):
            raise InvalidEntry(f"{self.path}: {member} is a link out of the bundle: not read")
        if not file.is_file():
            return None
        return read_file(file, f"{self.path}: {member}")


def read_file(path: Path, where: str | None = None) -> bytes:
    """The bytes of the file ``path`` an import reads, within :func:`member_limit`
    (:func:`bounded`; ``where`` names it in the error, by default ``path``)."""
    with path.open("rb") as handle:
        return bounded(handle, os.fstat(handle.fileno()).st_size, where or str(path))


def bounded(handle: IO[bytes], size: int, where: str) -> bytes:
    """The bytes of ``handle``, if its ``size`` (as the archive or file system says) and the
    bytes read are within :func:`member_limit`; InvalidEntry before reading more than that."""
    limit = member_limit()
    data = handle.read(limit + 1) if size <= limit else b""
    if size > limit or len(data) > limit:
        raise InvalidEntry(
            f"{where} is larger than the {limit:,} bytes an import reads of one file: not read "
            f"(${LIMIT_VARIABLE} sets the limit; an import takes about 3 times it in memory)"
        )
    return data


def _manifest(members: _Members) -> dict[str, Any]:
    """The bundle's manifest, checked."""
    where = members.path
    raw = members.find(MANIFEST)  # an archive cut short says so
    if raw is None:
        raise InvalidEntry(
            f"{where} is not a terrarium bundle: it has no {MANIFEST} "
            "(write one with: terrarium export --all -f jsonl -o FILE.tar.gz)"
        )
    try:
        manifest = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidEntry(f"{where}: {MANIFEST} is not JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise InvalidEntry(f"{where}: {MANIFEST} is not a terrarium bundle manifest")
    version = manifest.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise FormatVersionError(
            f"{where}: bundle version {version!r} is newer than this terrarium"
        )
    for key, needed in (
        ("contexts", ("context", "file", "head")),
        ("detached", ("session_id", "file")),
    ):
        entries = manifest.get(key)
        if not isinstance(entries, list) or not all(
            isinstance(e, dict) and all(isinstance(e.get(k), str) for k in needed) for e in entries
        ):
            raise InvalidEntry(f"{where}: {MANIFEST}: {key!r} must list objects with {needed}")
    return manifest


def import_bundle(store: Store, path: str | os.PathLike[str]) -> CopyReport:
    """Recreate in ``store`` what the bundle at ``path`` holds (see the module docstring).

    The report names detached sessions as ``session {id}``, and an unreadable entry among the
    skipped. A ``path`` that is no bundle this terrarium reads: InvalidEntry, FormatVersionError.
    """
    report = CopyReport()
    with _Members(Path(path)) as members:
        manifest = _manifest(members)
        for entry in [*manifest["contexts"], *manifest["detached"]]:
            name = entry["context"] if "context" in entry else f"session {entry['session_id']}"
            staged = MemoryStore(blob_threshold=None)  # large outputs stay inline until ``store``
            try:
                _stage(staged, entry, members)
            except (TerrariumError, ValueError) as exc:
                report.skipped.append((name, str(exc)))
                continue
            part = copy_store(staged, store)  # one there whole is ``present``; a trace is a write
            for item in fields(part):  # every field of a report adds up
                setattr(report, item.name, getattr(report, item.name) + getattr(part, item.name))
    return report


def _stage(staged: MemoryStore, entry: Mapping[str, Any], members: _Members) -> None:
    """Write one manifest entry (a context, or a detached session) into ``staged``."""
    where = f"{members.path}:{entry['file']}"
    segments = read_segments(members.read(entry["file"]), where=where)
    traces = _read_traces(members, entry["traces"]) if isinstance(entry.get("traces"), str) else {}
    if "context" not in entry:
        complete_session(staged, SessionSource(segments, traces=traces))
        return
    context = ContextId.parse(entry["context"])
    try:
        head = SegmentId(entry["head"])
    except ValueError:
        raise InvalidEntry(f"{where}: invalid head segment id {entry['head']!r}") from None
    if not any(s[0]["segment_id"] == str(head) for s in segments):
        raise InvalidEntry(f"{where}: the head {head} is not among its segments")
    archived, pinned = entry.get("archived") is True, entry.get("pinned") is True
    source = SessionSource(segments, context, head, traces, archived=archived, pinned=pinned)
    complete_session(staged, source)  # the traces before the archive, the state last


def _read_traces(members: _Members, name: str) -> dict[SegmentId, list[dict[str, Any]]]:
    """A bundle's trace file, by segment, each line as a store reads it back."""
    by_segment: dict[SegmentId, list[dict[str, Any]]] = {}
    for number, text in enumerate(members.read(name).splitlines(), start=1):
        try:
            line = json.loads(text)
            trace = TraceEntry(str(line["ts"]), str(line["event"]), line.get("data") or {})
            by_segment.setdefault(SegmentId(line["segment_id"]), []).append(trace.to_dict())
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidEntry(f"{members.path}:{name}:{number}: not a trace line: {exc}") from None
    return by_segment
