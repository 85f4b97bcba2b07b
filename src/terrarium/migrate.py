"""Migrate a legacy sessions folder: flat files into date folders, and optionally into the log.

The seed's ``scripts/migrate_sessions.py``, made safe to interrupt. A flat session
(``{type}/{name}.json``, or ``{name}.json`` naming its ``context_type``) moves to
``{type}/{date}/{name}.json``, its derived metadata filled in. With ``to_log`` each session is
also imported into the log beside it; a context already there is skipped, and of several files
of one context the newest date is imported. A move writes the destination before it removes
the source, so a killed run leaves at worst a file in both places, which a rerun finishes. A
broken file is reported in one line and the run goes on. Usage::

    report = migrate("./sessions", to_log=True)  # prints progress and a summary
    sys.exit(report.exit_code)  # 1 when any file failed; dry_run=True only plans
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from terrarium.errors import TerrariumError
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


def _new_bytes(session: LegacySession) -> bytes:
    return dumps(session).encode()


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
                same = destination.read_bytes() == _new_bytes(session)
            except OSError as exc:
                same, problem = False, f"cannot read {_rel(base, destination)} ({exc.strerror})"
            if not same and problem is None:
                problem = f"{_rel(base, destination)} exists with different content (conflict)"
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


class _Conflict(Exception):
    pass


def _move(step: Step) -> None:
    """Write the destination (unless there) through a temporary file, then remove the source.

    A rerun that finds the destination holding what the move would write removes the source; one
    holding something else is a conflict, never overwritten. Run one migration at a time.
    """
    assert step.session is not None
    source, destination = step.source, step.destination
    data = _new_bytes(step.session)
    for leftover in leftovers(destination):  # an interrupted earlier run's temp file
        leftover.unlink(missing_ok=True)
    try:
        existing: bytes | None = destination.read_bytes()
    except FileNotFoundError:
        existing = None
    if existing is None:
        write_atomic(destination, data, sync=True, mtime_ns=source.stat().st_mtime_ns)
    elif existing != data:
        raise _Conflict("exists with different content (conflict)")
    source.unlink()
    fsync_dir(source.parent)


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
    opened: AbstractContextManager[Store | None] = nullcontext(store)
    if store is None and to_log:  # a store of the folder's own, closed at the end
        from terrarium.stores.fs import FsStore

        opened = FsStore(base, durability="fsync")
    with (
        opened as target,
        _progress(stream, len(steps)) as progress,
    ):
        for step in steps:
            progress(_run_step(step, report, target, choices), True)
        progress(report.summary(), False)
    return report


def _run_step(
    step: Step,
    report: MigrationReport,
    store: Store | None,
    choices: dict[ContextId, Step],
) -> str:
    """Do one step; count it; return its progress line."""
    base, dry_run, would = report.root, report.dry_run, report.verbs
    source = _rel(base, step.source)
    if step.problem is not None:
        return _fail(report, step.problem)
    done: list[str] = []
    if step.moves:
        if not dry_run:
            try:
                _move(step)
            except _Conflict as exc:
                return _fail(report, f"{source}: {_rel(base, step.destination)} {exc}")
            except (OSError, ValueError) as exc:
                return _fail(report, f"{source}: {failure(step.source, exc)}")
        report.moved += 1
        done.append(f"{would[0]} {source} -> {_rel(base, step.destination)}")
    imported = False
    if store is not None:
        where = _rel(base, step.destination)
        chosen = choices.get(step.context) if step.context is not None else None
        if step.context is None or step.session is None:
            return _fail(report, f"{where}: cannot import it: its name is no context name")
        if chosen is not step and chosen is not None:
            done.append(f"an older copy of {step.context} ({_rel(base, chosen.destination)})")
        elif store.get_head(step.context) is not None:
            done.append(f"{step.context} is already in the log")
        else:
            if not dry_run:
                try:
                    import_session(store, step.session)
                except (OSError, ValueError, TerrariumError) as exc:
                    return _fail(report, f"{where}: cannot import it: {exc}")
            report.imported += 1
            imported = True
            done.append(f"{would[1]} {where} as {step.context}")
    if step.moves or imported:
        return "; ".join(done)
    report.skipped += 1
    return f"skipped {source}: " + ("; ".join(done) or "in its date folder already")


def _fail(report: MigrationReport, line: str) -> str:
    report.failed += 1
    report.failures.append(line)
    return f"failed {line}"
