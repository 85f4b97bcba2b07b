"""``terrarium fsck``: check every log of every session, and optionally repair what can be.

Without ``--repair`` nothing is modified. The filesystem store sets torn tails aside as a side
effect of reading a segment, so the check reads segment files itself, decodes each line with
:mod:`terrarium.codec`, and reports corrupt lines as ``file:line`` and torn tails by offset.
``--repair`` then reads every segment through the store (which sets torn tails aside into
``{segment}.jsonl.torn-{offset}``) and rebuilds the index. Corrupt lines in the middle of a log
are never rewritten: they are reported for a person to look at.

Other stores (SQLite, PostgreSQL) have no torn tails; their check replays every segment.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from terrarium import codec
from terrarium.cli import catalog
from terrarium.cli.app import CliState
from terrarium.errors import CorruptLog, FormatVersionError, TerrariumError
from terrarium.model import ContextId
from terrarium.stores.base import PodMetadata, Reindexable, Store
from terrarium.stores.fs import FsStore


@dataclass
class Problem:
    """One thing fsck found."""

    kind: str
    """``corrupt`` (a bad line), ``torn`` (bytes after the last newline), ``missing`` (the
    head names a segment that is not there), ``unindexed`` (a session the index does not
    know), ``legacy`` (an unreadable legacy file), ``unreadable`` (any other read error)."""
    message: str
    context: str | None = None
    path: str | None = None
    line: int | None = None
    offset: int | None = None
    """For ``torn``: the byte offset where the torn tail starts."""
    repaired: bool = False

    def show(self) -> str:
        where = self.path or self.context or ""
        if self.line is not None:
            where = f"{where}:{self.line}"
        status = " (repaired)" if self.repaired else ""
        return f"{where}: {self.kind}: {self.message}{status}"


@dataclass
class Report:
    """What fsck checked and found."""

    contexts: int = 0
    segments: int = 0
    entries: int = 0
    problems: list[Problem] | None = None

    def __post_init__(self) -> None:
        self.problems = self.problems or []

    @property
    def unresolved(self) -> list[Problem]:
        return [p for p in self.problems or [] if not p.repaired]


def run_fsck(state: CliState, *, repair: bool, as_json: bool) -> None:
    """Check (and with ``repair``, fix) the store; exit 1 when problems remain."""
    store = state.store()
    report = Report()
    if isinstance(store, FsStore):
        _check_fs(store, report)
    else:
        _check_generic(store, report)
    _check_legacy(state, report)
    if repair:
        _repair(store, report)
    problems = report.problems or []
    if as_json:
        state.out.json(
            {
                "ok": not report.unresolved,
                "store": state.shown_location,
                "repair": repair,
                "contexts": report.contexts,
                "segments": report.segments,
                "entries": report.entries,
                "problems": [asdict(p) for p in problems],
            }
        )
    else:
        for problem in problems:
            state.out.line(problem.show(), style="green" if problem.repaired else "red")
        state.out.note(
            f"checked {report.contexts} sessions, {report.segments} segments, "
            f"{report.entries} entries in {state.shown_location}: "
            f"{len(problems)} problems, {len(report.unresolved)} unresolved",
            style="green" if not report.unresolved else "yellow",
        )
    if report.unresolved:
        if as_json:
            raise click.exceptions.Exit(1)
        hint = "" if repair else "; 'terrarium fsck --repair' fixes torn tails and the index"
        raise click.ClickException(f"{len(report.unresolved)} problems found{hint}")


# --------------------------------------------------------------------------- check


def _check_fs(store: FsStore, report: Report) -> None:
    problems = report.problems if report.problems is not None else []
    indexed: set[Path] = set()
    for head in store.list_contexts():
        report.contexts += 1
        context = ContextId.parse(head.context)
        folder = store.folder_of(context)
        if folder is None:
            continue
        indexed.add(folder.resolve())
        segment_files = sorted(
            p for p in folder.glob("*.jsonl") if not p.name.endswith(".trace.jsonl")
        )
        names = {p.name for p in segment_files}
        if f"{head.segment_id}.jsonl" not in names:
            problems.append(
                Problem(
                    "missing",
                    f"the head names segment {head.segment_id}, which is not there",
                    context=str(context),
                    path=str(folder / "head.json"),
                )
            )
        for path in segment_files:
            report.segments += 1
            report.entries += _check_segment_file(path, str(context), problems)
    for head_file in sorted(store.root.glob("*/*/*/head.json")):
        if head_file.parent.resolve() not in indexed:
            problems.append(
                Problem(
                    "unindexed",
                    "this session is not in the index ('terrarium reindex' adds it)",
                    path=str(head_file.parent),
                )
            )


def _check_segment_file(path: Path, context: str, problems: list[Problem]) -> int:
    """Decode every line of one segment file; return how many entries it holds."""
    try:
        buf = path.read_bytes()
    except OSError as exc:
        problems.append(Problem("unreadable", str(exc), context=context, path=str(path)))
        return 0
    complete, tail = codec.split_complete(buf)
    count = 0
    for number, line in enumerate(complete.split(b"\n")[:-1], start=1):
        try:
            entry = codec.decode_lines(
                line + b"\n", where=str(path), first_line=number, strict=True
            )[0]
        except (CorruptLog, FormatVersionError) as exc:
            problems.append(
                Problem("corrupt", _after_location(str(exc)), context, str(path), number)
            )
            continue
        if number == 1 and entry.get("kind") != "header":
            problems.append(
                Problem("corrupt", "the first line is not a segment header", context, str(path), 1)
            )
        elif entry["seq"] != number - 1:
            problems.append(
                Problem(
                    "corrupt",
                    f"seq {entry['seq']} out of order (expected {number - 1})",
                    context,
                    str(path),
                    number,
                )
            )
        if number > 1:
            count += 1
    if tail:
        problems.append(
            Problem(
                "torn",
                f"{len(tail)} bytes after the last complete line (offset {len(complete)})",
                context,
                str(path),
                complete.count(b"\n") + 1,
                offset=len(complete),
            )
        )
    return count


def _after_location(message: str) -> str:
    """``/x/y.jsonl:3: not valid JSON`` -> ``not valid JSON`` (the location is shown apart)."""
    head, sep, rest = message.partition(": ")
    return rest if sep and ":" in head else message


def _check_generic(store: Store, report: Report) -> None:
    problems = report.problems if report.problems is not None else []
    for head in store.list_contexts():
        report.contexts += 1
        for segment_id, error in _read_all(store, head, report):
            problems.append(
                Problem("unreadable", error, context=head.context, path=str(segment_id))
            )


def _read_all(store: Store, head: PodMetadata, report: Report) -> list[tuple[uuid.UUID, str]]:
    errors: list[tuple[uuid.UUID, str]] = []
    try:
        segment_ids = store.list_segments(head.session_id)
    except TerrariumError as exc:
        return [(head.segment_id, str(exc))]
    if head.segment_id not in segment_ids:
        errors.append((head.segment_id, "the head names a segment that is not there"))
    for segment_id in segment_ids:
        report.segments += 1
        try:
            report.entries += len(store.read_segment(head.session_id, segment_id).entries)
        except TerrariumError as exc:
            errors.append((segment_id, str(exc)))
    return errors


def _check_legacy(state: CliState, report: Report) -> None:
    module, root = catalog.legacy_module(), catalog.legacy_root(state)
    if module is None or root is None:
        return
    problems = report.problems if report.problems is not None else []
    for path in module.iter_legacy_files(root):
        try:
            module.load(path, root=root)
        except (ValueError, OSError) as exc:
            problems.append(Problem("legacy", str(exc), path=str(path)))


# --------------------------------------------------------------------------- repair


def _repair(store: Store, report: Report) -> None:
    problems = report.problems or []
    if any(p.kind == "unindexed" for p in problems) and isinstance(store, Reindexable):
        store.reindex()
        for problem in problems:
            if problem.kind == "unindexed":
                problem.repaired = True
    torn = [p for p in problems if p.kind == "torn"]
    if not torn:
        return
    for head in store.list_contexts():
        for segment_id in store.list_segments(head.session_id):
            try:
                store.read_segment(head.session_id, segment_id)  # sets a torn tail aside
            except TerrariumError:
                pass  # a corrupt line: already reported, left for a person
    for problem in torn:
        path = Path(problem.path or "")
        try:
            clean = path.read_bytes().endswith(b"\n")
        except OSError:
            continue
        if clean:
            problem.repaired = True
            problem.message += f"; set aside to {path.name}.torn-{problem.offset}"
