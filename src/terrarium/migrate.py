"""Migrate a legacy sessions folder: flat files into date folders, and optionally into the log.

The seed's ``scripts/migrate_sessions.py``, made safe to interrupt. A flat session
(``{type}/{name}.json``, or ``{name}.json`` naming its ``context_type``) moves to
``{type}/{date}/{name}.json``, its derived metadata filled in. With ``to_log`` each session is
also imported into the log beside it; a context already there is skipped, and of several files
of one context the newest date is imported. A move writes the destination before it removes
the source, so a killed run leaves at worst a file in both places, which a rerun finishes. Each
file moves, and is imported, under its context's lock (the one a delete, an archive and a turn
take): a file another migration moved is skipped, one deleted or archived meanwhile too (never
written back, nor imported from the plan's copy). A broken file is reported in one line and
the run goes on. Usage::

    report = migrate("./sessions", to_log=True)  # prints progress and a summary
    sys.exit(report.exit_code)  # 1 when any file failed; dry_run=True only plans
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, TextIO

from terrarium.errors import ContextExists, InvalidContextId, TerrariumError
from terrarium.formats.terrarium_json import (
    LegacySession,
    dumps,
    failure,
    import_session,
    iter_legacy_files,
    load,
)
from terrarium.model import ContextId, printable
from terrarium.stores._files import fsync_dir, inside, leftovers, write_atomic
from terrarium.stores.base import context_lock

if TYPE_CHECKING:
    from terrarium.stores.base import Store


@dataclass(frozen=True, slots=True)
class Step:
    """What the migration does with one legacy file."""

    source: Path
    """The legacy file as it lies now."""
    destination: Path
    """Where it belongs: its date folder, or the source itself when it is there already."""
    context: ContextId | None = None
    """The context the file holds; None when it cannot be read or named."""
    problem: str | None = None
    """Why the file cannot be migrated, in one line; such a step counts as failed."""
    session: LegacySession | None = field(default=None, repr=False, compare=False)
    """The session read from ``source``."""

    @property
    def moves(self) -> bool:
        """Whether the file moves to a date folder."""
        return self.problem is None and self.destination != self.source


@dataclass(slots=True)
class MigrationReport:
    """What a migration did (or, in a dry run, would do)."""

    root: Path
    dry_run: bool
    steps: list[Step] = field(default_factory=list)
    moved: int = 0
    """Files moved into date folders."""
    imported: int = 0
    """Contexts imported into the native log."""
    skipped: int = 0
    """Files that needed nothing (in place already, or their context already in the log)."""
    failed: int = 0
    """Files that could not be migrated (broken, not a session, or a conflict)."""
    failures: list[str] = field(default_factory=list)
    """One line per failed file."""

    @property
    def exit_code(self) -> int:
        """0 when nothing failed, else 1."""
        return 1 if self.failed else 0

    @property
    def verbs(self) -> tuple[str, str]:
        """The verbs for moving and importing: as done, or as a dry run's plan."""
        return ("would move", "would import") if self.dry_run else ("moved", "imported")

    def summary(self) -> str:
        """One line with the counts."""
        move, load = self.verbs
        text = f"{move} {self.moved}, {load} {self.imported}, "
        text += f"skipped {self.skipped}, failed {self.failed}"
        return f"dry run, nothing changed: {text}" if self.dry_run else text


def _rel(root: Path, path: Path) -> str:
    try:
        return printable(path.relative_to(root).as_posix())
    except ValueError:
        return printable(str(path))


#: Why a file is not read or written: nothing outside the sessions folder ever is.
_OUTSIDE = "leads outside the sessions folder (a symbolic link)"


def plan_migration(root: str | os.PathLike[str]) -> list[Step]:
    """Read every legacy file under ``root`` and decide what happens to it; changes nothing.

    An unreadable file, a top-level file naming no type, a destination claimed twice, or one that
    exists with other content gives a step with a ``problem``.
    """
    base = Path(root)
    steps: list[Step] = []
    claimed: dict[Path, Path] = {}
    for path in iter_legacy_files(base):
        if not inside(path, base):
            steps.append(Step(path, path, problem=f"{_rel(base, path)}: {_OUTSIDE}; not read"))
            continue
        try:
            session = load(path, root=base)
        except (OSError, ValueError) as exc:
            if isinstance(exc, FileNotFoundError) and not os.path.lexists(path):
                continue  # gone since the walk (deleted, or moved by another run)
            steps.append(Step(path, path, problem=f"{_rel(base, path)}: {failure(path, exc)}"))
            continue
        try:
            context: ContextId | None = session.context
        except ValueError:
            context = None
        depth = len(path.relative_to(base).parts)
        if depth == 3:  # {type}/{date}/{name}.json: in place already
            steps.append(Step(path, path, context, session=session))
            continue
        type_name = session.context_type if depth == 1 else path.parent.name
        destination = base / type_name / session.metadata.session_date / path.name
        session = replace(session, path=destination)
        problem = None
        if not inside(destination, base):
            problem = f"{_rel(base, destination)} {_OUTSIDE}; not written"
        elif destination in claimed:
            problem = (
                f"{_rel(base, destination)} is also where {_rel(base, claimed[destination])} goes"
            )
        elif destination.exists():
            try:
                if destination.read_bytes() != dumps(session).encode():
                    problem = f"{_rel(base, destination)} exists with different content (conflict)"
            except OSError as exc:
                problem = f"cannot read {_rel(base, destination)} ({exc.strerror})"
        if problem is not None:
            steps.append(Step(path, destination, context, f"{_rel(base, path)}: {problem}"))
            continue
        claimed[destination] = path
        steps.append(Step(path, destination, context, session=session))
    # A destination written by an interrupted run is listed as a dated file too: it is the
    # moving step's own result, not a second copy.
    return [s for s in steps if s.moves or s.problem is not None or s.source not in claimed]


def _import_choices(steps: list[Step]) -> dict[ContextId, Step]:
    """For each context, the step whose file to import: the newest date folder wins."""
    chosen: dict[ContextId, Step] = {}
    for step in steps:
        if step.problem is not None or step.context is None or step.session is None:
            continue
        current = chosen.get(step.context)
        if current is None or _age(step) > _age(current):
            chosen[step.context] = step
    return chosen


def _age(step: Step) -> tuple[str, str]:
    assert step.session is not None
    return step.session.metadata.session_date, step.session.metadata.last_active


class _Failed(Exception):
    """A step that failed: its one line."""


class _Gone(Exception):
    """The step's file is gone (deleted, or archived with its context): nothing to do."""


def _move(step: Step, label: str) -> bool:
    """Write the destination (unless there) through a temporary file, then remove the source;
    False when another run moved it there, _Gone when it is gone otherwise (deleted, archived).

    A rerun that finds the destination holding what the move would write removes the source; one
    holding something else is a conflict (_Failed, after ``label``), never overwritten.
    """
    assert step.session is not None
    source, destination = step.source, step.destination
    data = dumps(step.session).encode()
    for leftover in leftovers(destination):  # an interrupted earlier run's temp file
        leftover.unlink(missing_ok=True)
    try:
        existing: bytes | None = destination.read_bytes()
    except FileNotFoundError:
        existing = None
    try:
        mtime_ns = source.stat().st_mtime_ns
    except FileNotFoundError:
        if existing == data:
            return False
        raise _Gone from None
    if existing is None:
        write_atomic(destination, data, sync=True, mtime_ns=mtime_ns)
    elif existing != data:
        raise _Failed(f"{label} exists with different content (conflict)")
    source.unlink(missing_ok=True)
    fsync_dir(source.parent)
    return True


@contextmanager
def _stores(base: Path, store: Store | None, to_log: bool, dry_run: bool) -> Iterator[_Stores]:
    """The stores whose context locks a file moves under (the folder's own, and ``store``; none
    in a dry run), and the store imports go to (``store``, else the folder's own; or None)."""
    from terrarium.legacy import legacy_root
    from terrarium.stores.fs import FsStore

    with ExitStack() as stack:
        own = legacy_root(store) if store is not None else None
        home = (
            store if own is not None and os.path.realpath(own) == os.path.realpath(base) else None
        )
        if home is None and (not dry_run or (to_log and store is None)):
            home = stack.enter_context(FsStore(base, durability="fsync"))
        target = (store or home) if to_log else None
        locking = {id(s): s for s in (home, target) if s is not None and not dry_run}
        yield _Stores(target, list(locking.values()))


class _Stores(NamedTuple):
    target: Store | None
    locking: list[Store]

    @contextmanager
    def locked(self, context: ContextId | None) -> Iterator[None]:
        """Hold the context's lock in each store: a delete, an archive or a turn of it, or
        another migration, waits for its file's move and import."""
        with ExitStack() as stack:
            for store in self.locking:
                if context is not None:
                    with suppress(InvalidContextId):  # a context the store cannot hold: no lock
                        stack.enter_context(context_lock(store, context))
            yield


@contextmanager
def _progress(out: TextIO, total: int) -> Iterator[Callable[[str, bool], None]]:
    """Print a line (and count a step): above a rich progress bar on a terminal, else plainly."""
    try:
        tty = out.isatty()
    except (AttributeError, ValueError):
        tty = False
    if not tty:
        yield lambda text, _step: print(text, file=out, flush=True)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=Console(file=out)) as bar:
        task = bar.add_task("migrating", total=total)

        def line(text: str, step: bool) -> None:
            bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
            if step:
                bar.advance(task)

        yield line


def migrate(
    root: str | os.PathLike[str],
    *,
    dry_run: bool = False,
    to_log: bool = False,
    store: Store | None = None,
    out: TextIO | None = None,
) -> MigrationReport:
    """Migrate the legacy sessions folder ``root`` (see the module docstring).

    ``dry_run`` prints the plan and changes nothing; ``to_log`` imports each session into
    ``store`` (default: an ``FsStore`` at ``root``); progress goes to ``out`` (default: stdout).
    FileNotFoundError if ``root`` is not a folder.
    """
    base = Path(root)
    if not base.is_dir():
        raise FileNotFoundError(f"no sessions folder at {base}")
    stream = out if out is not None else sys.stdout
    steps = plan_migration(base)
    report = MigrationReport(base, dry_run, steps)
    choices = _import_choices(steps) if to_log else {}
    with (
        _stores(base, store, to_log, dry_run) as stores,
        _progress(stream, len(steps)) as progress,
    ):
        for step in steps:
            with stores.locked(step.context):
                line = _run_step(step, report, stores.target, choices)
            progress(line, True)
        progress(report.summary(), False)
    return report


def _run_step(
    step: Step,
    report: MigrationReport,
    store: Store | None,
    choices: dict[ContextId, Step],
) -> str:
    """Do one step; count it; return its progress line."""
    if step.problem is not None:
        return _fail(report, step.problem)
    source = _rel(report.root, step.source)
    done: list[str] = []
    try:
        moved = step.moves and _move_step(step, report, done)
        imported = store is not None and _import_step(step, report, store, choices, done)
    except _Failed as exc:
        return _fail(report, str(exc))
    except _Gone:
        report.skipped += 1
        return f"skipped {source}: gone meanwhile (deleted or archived)"
    if moved or imported:
        return "; ".join(done)
    report.skipped += 1
    return f"skipped {source}: " + ("; ".join(done) or "in its date folder already")


def _move_step(step: Step, report: MigrationReport, done: list[str]) -> bool:
    """Move the step's file (in a dry run, only say so); whether this run moved it."""
    source, where = _rel(report.root, step.source), _rel(report.root, step.destination)
    if not report.dry_run:
        try:
            if not _move(step, f"{source}: {where}"):
                done.append(f"{source} moved to {where} by another run")
                return False
        except (OSError, ValueError) as exc:
            raise _Failed(f"{source}: {failure(step.source, exc)}") from None
    report.moved += 1
    done.append(f"{report.verbs[0]} {source} -> {where}")
    return True


def _import_step(
    step: Step,
    report: MigrationReport,
    store: Store,
    choices: dict[ContextId, Step],
    done: list[str],
) -> bool:
    """Import the step's session into ``store`` unless the log has it or a newer file holds it;
    whether it did (in a dry run, would)."""
    where = _rel(report.root, step.destination)
    if step.context is None or step.session is None:
        raise _Failed(f"{where}: cannot import it: its name is no context name")
    chosen = choices.get(step.context)
    if chosen is not step and chosen is not None:
        done.append(f"an older copy of {step.context} ({_rel(report.root, chosen.destination)})")
        return False
    already = f"{step.context} is already in the log"
    if store.get_head(step.context) is not None:
        done.append(already)
        return False
    if not report.dry_run:
        if not step.destination.is_file():
            raise _Gone
        try:
            import_session(store, step.session)
        except ContextExists:  # created by a writer that does not take the lock
            done.append(already)
            return False
        except (OSError, ValueError, TerrariumError) as exc:
            raise _Failed(f"{where}: cannot import it: {exc}") from None
    report.imported += 1
    done.append(f"{report.verbs[1]} {where} as {step.context}")
    return True


def _fail(report: MigrationReport, line: str) -> str:
    report.failed += 1
    report.failures.append(line)
    return f"failed {line}"
