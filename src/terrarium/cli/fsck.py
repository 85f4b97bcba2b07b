"""``terrarium fsck``: check every log of every session, and optionally repair what can be.

The check reads the filesystem store's own files (folders, not the index): every
``head.json``, index entry, segment line and symbolic link, each problem reported with its
file and line. ``--repair`` fixes what is derived or a crash's leftover and never loses a byte:
torn tails move to ``{segment}.jsonl.torn-{offset}``, lost heads are rebuilt from the segments,
the index is rebuilt. ``--salvage`` also copies a damaged segment's readable entries into a new
segment, sets unreadable lines aside to ``{segment}.jsonl.corrupt-{n}`` and moves the head; the
damaged file stays. SQLite and PostgreSQL have no files to tear: every segment is replayed.
Every blob a log names must exist and match its digest; a repair cannot recreate one.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from dataclasses import dataclass, field, fields
from pathlib import Path

import click

from terrarium import codec, index, states
from terrarium.cli.app import CliState
from terrarium.cli.output import plural
from terrarium.errors import BlobNotFound, CorruptLog, FormatVersionError, TerrariumError
from terrarium.legacy import legacy_root
from terrarium.model import ContextId, SegmentId
from terrarium.sessions import detached_sessions
from terrarium.stores._files import listdir, read_chunks
from terrarium.stores.base import BlobStore, Reindexable, SessionStates, Store
from terrarium.stores.fs import ContextFolder, FsStore, salvaged_into, segment_chain
from terrarium.stores.fs._layout import HEAD, SEGMENT_SUFFIX, segment_name
from terrarium.stores.fs._states import frozen
from terrarium.stores.fs._tree import activity

#: Problems ``--repair`` fixes, and those only ``--salvage`` does.
_REPAIRABLE = frozenset({"torn", "head", "missing", "unindexed", "leftover", "unfinished"})
_SALVAGEABLE = frozenset({"corrupt", "damaged"})


@dataclass
class Problem:
    """One thing fsck found."""

    kind: str
    """One of the problem kinds docs/cli.md lists under ``terrarium fsck``."""
    message: str
    context: str | None = None
    path: str | None = None
    line: int | None = None
    """The line of the file; on a database, the entry's seq in the segment."""
    offset: int | None = None
    """For ``torn``: the byte offset where the torn tail starts."""
    repaired: bool = False
    session_id: str | None = None
    segment_id: str | None = None
    packed: str | None = field(default=None, repr=False)
    """For a legacy file a killed archive left out: the archive's copy of it."""

    def show(self) -> str:
        """``cli:a session S: FILE:LINE: KIND: MESSAGE``, the place the segment on a database."""
        place = self.path or (self.segment_id and f"segment {self.segment_id}")
        if place and self.line is not None:
            place = f"{place}:{self.line}"
        session = self.session_id and f"session {self.session_id}"
        who = " ".join(filter(None, [self.context, session]))
        status = " (repaired)" if self.repaired else ""
        return ": ".join(filter(None, [who, place, self.kind, self.message])) + status

    def to_json(self) -> dict[str, object]:
        """The stable ``--json`` form (see docs/cli.md): the fields shown in its repr."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.repr}


@dataclass
class Report:
    """What fsck checked and found."""

    contexts: int = 0
    segments: int = 0
    entries: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def unresolved(self) -> list[Problem]:
        return [p for p in self.problems if not p.repaired]

    def add(
        self,
        kind: str,
        message: str,
        *,
        context: str | None = None,
        path: str | None = None,
        line: int | None = None,
        session_id: str | None = None,
        segment_id: str | None = None,
    ) -> None:
        """Record a problem, where it is as :class:`Problem` names it."""
        self.problems.append(
            Problem(
                kind, message, context, path, line, session_id=session_id, segment_id=segment_id
            )
        )


def run_fsck(state: CliState, *, repair: bool, salvage: bool, as_json: bool) -> None:
    """Check (and with ``repair``, fix) the store; exit 1 when problems remain."""
    if salvage and not repair:
        raise click.UsageError("--salvage is a kind of repair: use it with --repair")
    store = state.store()
    report = Report()
    # On the filesystem no move runs while fsck looks: one half done would look like damage.
    with store.quiesced(writing=repair) if isinstance(store, FsStore) else contextlib.nullcontext():
        if isinstance(store, FsStore):
            _check_fs(store, report)
        else:
            _check_generic(store, report)
        _check_kept(store, report, counted=isinstance(store, FsStore))
        _check_lifecycle(store, report)
        _check_blobs(store, report)
        _check_legacy(state, report)
        if repair:
            _repair(store, report)
    if salvage and isinstance(store, FsStore):  # after the quiesce, which a turn may wait for
        _repair(store, report, salvage=True)
    if as_json:
        state.out.json(
            {
                "ok": not report.unresolved,
                "store": state.shown_location,
                "repair": repair,
                "contexts": report.contexts,
                "segments": report.segments,
                "entries": report.entries,
                "problems": [p.to_json() for p in report.problems],
            }
        )
    else:
        for problem in report.problems:
            state.out.line(problem.show(), style="green" if problem.repaired else "red")
        state.out.line(  # the report: on stdout, as the problems are
            f"checked {plural(report.contexts, 'session')}, "
            f"{plural(report.segments, 'segment')}, "
            f"{plural(report.entries, 'entry', 'entries')} in {state.shown_location}: "
            f"{plural(len(report.problems), 'problem')}, {len(report.unresolved)} unresolved",
            style="green" if not report.unresolved else "yellow",
        )
    if report.unresolved:
        if as_json:
            raise click.exceptions.Exit(1)
        raise click.ClickException(
            f"{plural(len(report.unresolved), 'problem')} found{_hint(report.unresolved, repair)}"
        )


def _hint(unresolved: list[Problem], repair: bool) -> str:
    """What would fix the problems left, in the words of the command that does it."""
    kinds = {p.kind for p in unresolved}
    hints = []
    if kinds & _REPAIRABLE and not repair:
        hints.append(
            "'terrarium fsck --repair' sets torn tails aside and rebuilds heads and the index"
        )
    if kinds & _SALVAGEABLE:
        hints.append(
            "'terrarium fsck --repair --salvage' copies every readable entry of a damaged "
            "segment into a new one and sets the bad lines aside"
        )
    if "blob" in kinds:
        hints.append(
            "a missing or damaged blob cannot be recreated: put the file back from a backup "
            "(or copy the context from a store that has it)"
        )
    if kinds & {"duplicate", "link", "legacy", "unreadable"}:
        hints.append("the others need a person: see each message")
    return "; " + "; ".join(hints) if hints else ""


def _check_fs(store: FsStore, report: Report) -> None:
    """Check every context folder of the tree, the index, and the links in the tree."""
    folders: dict[ContextId, list[ContextFolder]] = {}
    for entry in store.walk():
        report.contexts += 1
        folders.setdefault(entry.context, []).append(entry)
        _check_context(store, entry, report)
    for context, entries in folders.items():
        _check_index(store, context, entries, report)
    for session_id, folder in store.detached():
        report.contexts += 1
        if not frozen(store.root, session_id):  # a frozen one's plain files are leftovers
            _check_segments(folder, None, str(session_id), report)
    _check_links(store.root, report)
    for path in store.unfinished_moves():
        what = "left by a killed freeze, thaw, detach or delete"
        report.add("leftover", f"{path}: {what}", path=str(path))
    _check_left_legacy(store, report)


def _check_left_legacy(store: FsStore, report: Report) -> None:
    """A legacy file an archive packed (its record's ``cold.legacy``) that lies where it lay
    too: a kill between the archive's commit and its unlink. A leftover when its bytes are the
    packed copy's (``--repair`` deletes it); else a person's to compare (nothing is lost)."""
    root = os.path.realpath(store.root)
    for record in store.session_records():
        folder = store.folder_of(ContextId.parse(record.owner)) if record.owner else None
        places = (record.state.get("cold") or {}).get("legacy") or [] if folder else []
        for n, rel in enumerate(places, 1):
            place = store.root / str(rel)  # never through a link, nor out of the root
            if os.path.realpath(place) != os.path.join(root, str(rel)) or not place.is_file():
                continue
            packed = str(folder / f"legacy-{n}.json.zst") if folder else None
            if packed is not None and _same_bytes(place, Path(packed)):
                what = f"a legacy file its archive holds byte for byte ({packed})"
                problem = Problem("leftover", f"{what}: left by a killed archive", packed=packed)
            else:
                what = f"a legacy file of archived {record.owner} that is not what its archive"
                problem = Problem("legacy", f"{what} holds ({packed}): compare them, keep one")
            problem.context, problem.path = record.owner, str(place)
            report.problems.append(problem)


def _same_bytes(path: Path, other: Path) -> bool:
    """Whether two files (a ``.zst`` one decompressed) hold the same bytes; False if either
    cannot be read."""
    import zstandard

    try:
        return b"".join(read_chunks(path)) == b"".join(read_chunks(other))
    except (OSError, zstandard.ZstdError):
        return False


def _drop_left_legacy(place: Path, packed: Path) -> str:
    """Delete a legacy file its archive holds. It is set aside first, so that the bytes
    compared are the bytes deleted; one that changed since the check goes back in place."""
    aside = place.with_name(f".{place.name}.fsck-{uuid.uuid4().hex}")
    os.rename(place, aside)
    if _same_bytes(aside, packed):
        aside.unlink()
        return "deleted: its archive holds the same bytes"
    try:
        os.link(aside, place)  # never over a file written there meanwhile
    except FileExistsError:
        raise OSError(f"it changed since the check: kept as {aside}") from None
    aside.unlink()
    raise OSError("it changed since the check: left in place")


def _check_context(store: FsStore, entry: ContextFolder, report: Report) -> None:
    context, folder = str(entry.context), entry.folder
    head_path = folder / HEAD
    session = str(entry.head.session_id) if entry.head is not None else None

    def add(kind: str, message: str, path: Path) -> None:
        report.add(kind, message, context=context, path=str(path), session_id=session)

    if entry.head is None:
        add("damaged", f"the head cannot be rebuilt: {entry.problem}", folder)
    elif not head_path.exists():
        add("head", f"head.json is missing (rebuilt: segment {entry.head.segment_id})", head_path)
    elif entry.problem is not None:
        kind = "missing" if "which is not there" in entry.problem else "head"
        add(kind, _after_location(entry.problem), head_path)
    salvaged = salvaged_into(folder)
    # A salvage is done once the head no longer replays the damaged segment.
    chain = segment_chain(folder, entry.head.segment_id) if entry.head else []
    in_use = set(chain)
    if entry.head is not None and frozen(store.root, entry.head.session_id):
        return  # archived: its plain files, if any, are leftovers (reported as such)
    lost = folder / f"{chain[-1]}{SEGMENT_SUFFIX}" if len(chain) > 1 else None
    if lost is not None and not lost.exists():  # a file gone: no repair brings it back
        what = f"segment {chain[-2]} continues segment {chain[-1]}, which is lost"
        add("unreadable", f"{what} (put its file back from a backup)", lost)
    for segment_id, problem in _check_segments(folder, context, session, report):
        if problem.kind in _SALVAGEABLE and segment_id in salvaged and segment_id not in in_use:
            problem.repaired = True
            problem.message += f"; salvaged into {salvaged[segment_id]}"


def _check_segments(
    folder: Path, context: str | None, session: str | None, report: Report
) -> list[tuple[SegmentId, Problem]]:
    """Check every segment file of ``folder`` into ``report``; the problems, by segment."""
    found: list[tuple[SegmentId, Problem]] = []
    for segment_id, path in _segment_files(folder):
        report.segments += 1
        problems: list[Problem] = []
        report.entries += _check_segment_file(path, problems)
        for problem in problems:
            problem.context, problem.session_id = context, session
            problem.segment_id = str(segment_id)
            found.append((segment_id, problem))
    report.problems.extend(problem for _, problem in found)
    return found


def _check_index(
    store: FsStore, context: ContextId, entries: list[ContextFolder], report: Report
) -> None:
    """The index names one folder of the context; a second folder is a duplicate."""
    try:
        indexed = store.indexed_folder(context)
        reason = "the index does not know it"
    except TerrariumError as exc:
        indexed, reason = None, _after_location(str(exc))
    chosen = next((e for e in entries if e.folder == indexed), None)
    if chosen is None:
        report.add(
            "unindexed",
            f"{reason} ('terrarium reindex' adds it)",
            context=str(context),
            path=str(entries[0].folder),
        )
        chosen = max(entries, key=activity)
    for other in entries:
        if other is not chosen:
            report.add(
                "duplicate",
                f"a second folder of {context}, which lives in {chosen.folder}: an older "
                "terrarium split it; export or import it to keep it apart",
                context=str(context),
                path=str(other.folder),
            )


def _check_links(root: Path, report: Report) -> None:
    """Report every symbolic link inside the store: terrarium refuses to follow them."""
    for parent, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            path = Path(parent) / name
            if path.is_symlink():
                report.add(
                    "link",
                    f"a symbolic link (to {os.readlink(path)}): terrarium never follows one "
                    "out of its root; replace it with the folder or file itself",
                    path=str(path),
                )


def _segment_files(folder: Path) -> list[tuple[SegmentId, Path]]:
    """The segment files of ``folder`` as named on disk (any form of UUID), with their ids."""
    named = [(segment_name(name), folder / name) for name in sorted(listdir(folder))]
    return [(uuid.UUID(segment_id), path) for segment_id, path in named if segment_id]


def _check_segment_file(path: Path, problems: list[Problem]) -> int:
    """Decode every line of one segment file; return how many entries it holds."""
    try:
        buf = b"".join(read_chunks(path))
    except OSError as exc:
        problems.append(Problem("unreadable", str(exc), path=str(path)))
        return 0
    complete, tail = codec.split_complete(buf)
    if not complete:
        what = "the file is empty" if not buf else "its header line is incomplete (no newline)"
        problems.append(Problem("corrupt", f"damaged segment: {what}", None, str(path), 1))
        return 0
    count = 0
    for number, line in enumerate(complete.split(b"\n")[:-1], start=1):
        error = _line_error(path, number, line)
        if error is not None:
            problems.append(Problem("corrupt", error, None, str(path), number))
        elif number > 1:
            count += 1
    if tail:
        what = f"{len(tail)} bytes after the last complete line (offset {len(complete)})"
        number = complete.count(b"\n") + 1
        problems.append(Problem("torn", what, None, str(path), number, offset=len(complete)))
    return count


def _line_error(path: Path, number: int, line: bytes) -> str | None:
    """What is wrong with line ``number`` of a segment, or None."""
    try:
        entry = codec.decode_lines(line + b"\n", where=str(path), first_line=number, strict=True)[0]
    except (CorruptLog, FormatVersionError) as exc:
        return _after_location(str(exc))
    if number == 1 and entry.get("kind") != "header":
        return "the first line is not a segment header"
    if number == 1 and entry.get("segment_id") != path.name.removesuffix(".jsonl"):
        return "the header names another segment"
    if entry["seq"] != number - 1:
        error = CorruptLog.seq_out_of_order(f"{path}:{number}", entry["seq"], number - 1)
        return _after_location(str(error))
    return None


def _after_location(message: str) -> str:
    """``/x/y.jsonl:3: not valid JSON`` -> ``not valid JSON`` (the location is shown apart)."""
    head, sep, rest = message.partition(": ")
    return rest if sep and ("/" in head or ":" in head) else message


def _check_generic(store: Store, report: Report) -> None:
    for head in store.list_contexts():
        report.contexts += 1
        errors = _read_all(store, head.session_id, report, head.segment_id)
        if errors:  # damaged, or moved by another process while it was read?
            now = store.get_head(ContextId.parse(head.context))
            if now is None or now.session_id != head.session_id:
                continue  # deleted (or replaced) meanwhile: nothing of it to check
            errors = _read_all(store, now.session_id, Report(), now.segment_id)
        _add_unreadable(report, errors, head.context, head.session_id)
    for session_id in detached_sessions(store):  # no head: every segment is read
        report.contexts += 1
        _add_unreadable(report, _read_all(store, session_id, report), None, session_id)


def _check_kept(store: Store, report: Report, *, counted: bool) -> None:
    """Read every segment of the sessions the checks above passed over (archived, in the trash).
    ``counted``: they are among ``report.contexts`` already (the filesystem's walk found them)."""
    if not isinstance(store, SessionStates):
        return
    hot = {h.session_id for h in store.list_contexts()} | set(detached_sessions(store))
    for record in store.session_records():
        session_id = record.session_id
        passed = (
            frozen(store.root, session_id) if isinstance(store, FsStore) else session_id not in hot
        )
        if not passed or "purging" in record.state:
            continue  # a purge under way may have deleted its files: _check_lifecycle's
        report.contexts += 0 if counted else 1
        errors = _read_all(store, session_id, report)
        # Not in the records any more: purged (or moved) by another process meanwhile.
        if errors and any(r.session_id == session_id for r in store.session_records()):
            owner = record.owner or record.state.get("trashed", {}).get("context")
            _add_unreadable(report, errors[:1], owner, session_id)


def _check_lifecycle(store: Store, report: Report) -> None:
    """The moves that a kill left between their steps (their state records say which)."""
    if not isinstance(store, SessionStates):
        return
    for record in states.unfinished_lifecycle(store):
        what = "purge" if record.state.get("purging") else "delete or restore"
        name = record.state.get("trashed", {}).get("context") or record.owner or "a context"
        report.add(
            "unfinished",
            f"a {what} of {name} was killed half way",
            context=record.owner,
            session_id=str(record.session_id),
        )


def _check_blobs(store: Store, report: Report) -> None:
    """Every blob a log refers to is there, and every stored blob matches its digest."""
    if not isinstance(store, BlobStore):
        return
    try:
        referenced = store.blob_references()
        stored = set(store.blob_digests())
    except TerrariumError as exc:
        report.add("unreadable", str(exc))
        return
    for digest, where in sorted(referenced.items()):
        if digest not in stored:
            report.add("blob", f"blob {digest} is missing (referred to by {where})", path=where)
    for digest in sorted(stored):
        try:
            store.get_blob(digest)
        except BlobNotFound as exc:  # collected since it was listed, unless a log names it
            if digest in store.blob_references():
                report.add("blob", str(exc))
        except TerrariumError as exc:
            report.add("blob", str(exc))


def _add_unreadable(
    report: Report,
    errors: list[tuple[SegmentId | None, str]],
    context: str | None,
    session: uuid.UUID,
) -> None:
    """Report what :func:`_read_all` found, the place apart from the message (see ``show``)."""
    for segment_id, error in errors:
        # A database names a line "{store} segment {id}:{seq}: ..." (stores/_sqlbase.py).
        _, named, rest = error.partition(f"segment {segment_id}:")
        seq, sep, message = rest.partition(": ")
        line = int(seq) if named and sep and seq.isdigit() else None
        report.add(
            "unreadable",
            message if line is not None else error,
            context=context,
            line=line,
            session_id=str(session),
            segment_id=str(segment_id) if segment_id is not None else None,
        )


def _read_all(
    store: Store, session_id: uuid.UUID, report: Report, head: SegmentId | None = None
) -> list[tuple[SegmentId | None, str]]:
    """Read every segment of a session, counted into ``report``; the errors, by segment (a
    failed listing's by ``head``, the segment the head names)."""
    try:
        segment_ids = store.list_segments(session_id)
    except TerrariumError as exc:
        return [(head, str(exc))]
    errors: list[tuple[SegmentId | None, str]] = []
    if head is not None and head not in segment_ids:
        errors.append((head, "the head names a segment that is not there"))
    for segment_id in segment_ids:
        report.segments += 1
        try:
            report.entries += len(store.read_segment(session_id, segment_id).entries)
        except TerrariumError as exc:
            errors.append((segment_id, str(exc)))
    return errors


def _check_legacy(state: CliState, report: Report) -> None:
    from terrarium.formats import terrarium_json as tj

    root = legacy_root(state.store())
    if root is None:
        return
    for path in tj.iter_legacy_files(root):
        try:
            tj.load(path, root=root)
        except (ValueError, OSError) as exc:
            report.add("legacy", str(exc), path=str(path))


def _repair(store: Store, report: Report, *, salvage: bool = False) -> None:
    """Fix what can be fixed, one problem at a time; a failure is noted and the rest go on.
    With ``salvage``, the salvages only: each takes its context's lock, for which it must hold
    no other (a turn takes that one first)."""
    unfinished = [p for p in report.problems if p.kind == "unfinished" and not salvage]
    if unfinished and isinstance(store, SessionStates):
        done = states.finish_lifecycle(store)
        for problem in unfinished:
            problem.repaired = True
            problem.message += f"; completed ({done} in all)"
    if not isinstance(store, FsStore):
        if any(p.kind == "unindexed" for p in report.problems) and isinstance(store, Reindexable):
            index.reindex(store)
        return
    for problem in report.problems:
        if problem.repaired or salvage != (problem.kind == "corrupt"):
            continue
        try:
            note = _fix(store, problem, salvage)
        except (TerrariumError, OSError) as exc:
            problem.message += f"; repair failed: {exc}"
            continue
        if note is None:
            continue
        problem.repaired = True
        if note:
            problem.message += f"; {note}"
    if not salvage and any(p.kind in ("unindexed", "head", "missing") for p in report.problems):
        index.reindex(store)  # after the head rebuilds, so it indexes what they made


def _fix(store: FsStore, problem: Problem, salvage: bool) -> str | None:
    """Repair one problem; a note on what was done, or None if it needs a person (or
    ``--salvage``)."""
    session = uuid.UUID(problem.session_id) if problem.session_id else None
    segment = uuid.UUID(problem.segment_id) if problem.segment_id else None
    context = ContextId.parse(problem.context) if problem.context else None
    if problem.kind == "torn" and session and segment:
        torn = store.set_aside_torn_tail(session, segment)
        return f"set aside to {Path(torn.set_aside_to or '').name}" if torn else "already set aside"
    if problem.kind in ("head", "missing") and context:
        return f"head is segment {store.rebuild_head(context).segment_id}"
    if problem.kind == "unindexed":
        return "indexed"  # the reindex that follows every repair does it
    if problem.kind == "leftover" and problem.packed and problem.path:
        return _drop_left_legacy(Path(problem.path), Path(problem.packed))
    if problem.kind == "leftover":
        return f"deleted ({store.finish_moves()} left over)"
    if problem.kind == "corrupt" and salvage and segment and context:
        return _salvage(store, context, segment)
    return None


def _salvage(store: FsStore, context: ContextId, segment: uuid.UUID) -> str:
    done = store.salvage_segment(context, segment)
    parts = [f"kept {plural(done.kept, 'entry', 'entries')} in new segment {done.new_segment_id}"]
    if done.side_file is not None:
        lines = ", ".join(map(str, done.set_aside))
        parts.append(f"set line(s) {lines} aside to {Path(done.side_file).name}")
    if done.copies:
        parts.append(f"copied {len(done.copies)} fork(s) onto it")
    if done.head is not None:
        parts.append(f"the head moved to {done.head}")
    return "; ".join(parts)
