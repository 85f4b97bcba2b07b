"""The lifecycle commands: archive, unarchive, trash, pin, unpin and maintain; delete's trash.

A store without :class:`~terrarium.stores.base.Lifecycle` is the one-line error ``... this
backend cannot archive, trash or pin sessions``. Results go to stdout, summaries to stderr; a
progress bar is drawn only on a terminal.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click
import msgspec

from terrarium._lazy import lazy_module
from terrarium.cli.app import (
    CONTEXT,
    CliState,
    cli,
    command,
    flag,
    json_option,
    program,
    storage_option,
    type_option,
)
from terrarium.cli.output import fail_if_damaged, plural
from terrarium.display import human_bytes, short_time
from terrarium.errors import ContextExists

if TYPE_CHECKING:
    from terrarium import lifecycle, states
    from terrarium.cli import catalog
    from terrarium.index._listing import ContextSummary
    from terrarium.lifecycle import ArchivePlan, Candidate, MaintenanceReport
    from terrarium.model import ContextId
    from terrarium.states import ArchivedContext, TrashedContext
    from terrarium.stores.base import Lifecycle
else:
    catalog = lazy_module("terrarium.cli.catalog")
    lifecycle = lazy_module("terrarium.lifecycle")
    states = lazy_module("terrarium.states")


def _lifecycle(state: CliState) -> Lifecycle:
    return lifecycle.require_lifecycle(state.store(), state.shown_location)


def _age(value: str | None) -> Any:
    return None if value is None else lifecycle.parse_age(value)


def _confirm(question: str, yes: bool, refusal: str) -> None:
    """Ask on a terminal; without one, refuse (one line, exit 1) unless ``--yes``."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise click.ClickException(f"{refusal} without confirmation: pass --yes")
    click.confirm(question, abort=True)


AGE_HELP = "Only sessions inactive for longer than AGE (30d, 12h, 2w); pinned ones are skipped."


@command()
@click.argument("contexts", nargs=-1, type=CONTEXT, metavar="[CONTEXT]...")
@click.option("--older-than", metavar="AGE", help=AGE_HELP)
@type_option
@flag("--dry-run", help="Only print what would move and the bytes saved.")
@json_option
def archive(
    state: CliState,
    contexts: tuple[ContextId, ...],
    older_than: str | None,
    type_: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Move inactive sessions into the archive (compressed, out of the hot listing).

    Archived sessions still show, export and search (--archived); chatting in one, or
    any write, brings it back first. Sessions named as CONTEXT are archived even when
    pinned; a selection by --older-than skips pinned ones.
    """
    _lifecycle(state)
    with catalog.naming_store(state, *contexts):
        plan = lifecycle.plan_archive(
            state.store(), older_than=_age(older_than), type=type_, names=list(contexts)
        )
    records: Sequence[Candidate | ArchivedContext] = plan.candidates
    saved = plan.hot_bytes
    if not dry_run:
        with state.out.progress(len(plan.candidates), "archiving") as progress:
            done = lifecycle.run_archive(
                state.store(), plan, why="command: terrarium archive", progress=progress
            )
        records, saved = done, sum(a.hot_bytes - a.archived_bytes for a in done)
    if as_json:
        state.out.json(
            {
                "dry_run": dry_run,
                "contexts": [record_json(r) for r in records],
                **left_out_json(plan),
                "bytes_saved": saved,
            }
        )
    elif dry_run:
        _print_plan(state, plan)
    else:
        if records:
            hot = sum(r.hot_bytes for r in records)
            state.out.note(
                f"archived {plural(len(records), 'session')}: {human_bytes(hot)} -> "
                f"{human_bytes(hot - saved)} (saved {human_bytes(saved)})",
                style="green",
            )
        _note_pinned(state, plan, done_nothing=not records and not plan.damaged)
    fail_if_damaged(state.out, plan.damaged, "archived")


def left_out_json(plan: ArchivePlan) -> dict[str, Any]:
    """The sessions an archive skipped as pinned, and left hot as damaged, for ``--json``."""
    damaged = [{"context_id": context, "problem": problem} for context, problem in plan.damaged]
    return {"skipped_pinned": plan.skipped_pinned, "damaged": damaged}


def _print_plan(state: CliState, plan: ArchivePlan) -> None:
    """``archive --dry-run``: every session that would move, and the bytes it would free."""
    if plan.candidates:
        state.out.table(
            ["context", "messages", "last active", "size", "pinned"],
            [
                [
                    c.context,
                    str(c.message_count),
                    short_time(c.last_active),
                    human_bytes(c.hot_bytes),
                    "pinned" if c.pinned else "",
                ]
                for c in plan.candidates
            ],
            justify={"messages": "right", "size": "right"},
        )
        state.out.note(
            f"would archive {plural(len(plan.candidates), 'session')}, "
            f"{human_bytes(plan.hot_bytes)} out of the hot store (before compression)"
        )
    _note_pinned(state, plan, done_nothing=not plan.candidates)


def _note_pinned(state: CliState, plan: ArchivePlan, *, done_nothing: bool) -> None:
    if plan.skipped_pinned:
        state.out.note(
            f"skipped {plural(len(plan.skipped_pinned), 'pinned session')} "
            "(name one to archive it anyway)"
        )
    elif done_nothing:
        state.out.note("nothing to archive")


def record_json(record: ArchivedContext | TrashedContext | Candidate) -> dict[str, Any]:
    """A lifecycle record for ``--json``: its fields, its context named as ``list --json`` does."""
    data = msgspec.structs.asdict(record)
    context = data.pop("context")
    type_, _, name = context.partition(":")
    return {"context_id": context, "type": type_, "name": name, **data}


@command()
@click.argument("contexts", nargs=-1, type=CONTEXT, required=True, metavar="CONTEXT...")
def unarchive(state: CliState, contexts: tuple[ContextId, ...]) -> None:
    """Move archived sessions back to the hot store (a chat in one does it by itself)."""
    store = _lifecycle(state)
    for context in contexts:
        if states.unarchive_context(store, context):
            state.out.note(f"unarchived {context.display}", style="green")
        elif state.store().get_head(context) is not None:
            state.out.note(f"{context.display} is not archived")
        else:
            raise catalog.missing(state, context)


def delete_session(
    state: CliState,
    context: ContextId,
    yes: bool,
    *,
    purge: bool = False,
    confirm: bool | None = None,
) -> None:
    """``delete``: into the trash (no question: it can be undone), or for ever with ``purge``
    (asked first on a terminal, refused without one unless ``yes``); ``confirm`` forces the
    question either way."""
    store = state.store()
    if not catalog.exists(state, context):
        raise catalog.missing(state, context)
    if confirm if confirm is not None else purge:
        what = " for ever" if purge else ""
        _confirm(
            f"Delete {context.display} and all its history{what}?",
            yes,
            f"refusing to delete '{context.display}'",
        )
    if purge:
        lifecycle.purge(store, context, why="command: terrarium delete --purge")
        state.out.note(f"deleted {context.display} for ever", style="green")
        return
    entry = lifecycle.delete_to_trash(store, context, why="command: terrarium delete")
    if entry is None:  # only a legacy file held it: the file is in .trash/legacy/
        state.out.note(f"deleted {context.display}", style="green")
        return
    state.out.note(
        f"deleted {context.display} (moved to the trash; undo with: "
        f"{program()} trash restore {entry.trash_id})",
        style="green",
    )


@cli.group()
@storage_option
def trash() -> None:
    """Deleted sessions: list them, restore one, or purge them for ever."""


def _print_trash(state: CliState, entries: Sequence[TrashedContext]) -> None:
    state.out.table(
        ["trash id", "context", "deleted", "messages", "size", "state"],
        [
            [
                e.trash_id,
                e.context,
                short_time(e.deleted_at),
                "damaged" if e.message_count is None else str(e.message_count),
                "-" if e.bytes is None else human_bytes(e.bytes),
                ", ".join(s for s, on in (("archived", e.archived), ("pinned", e.pinned)) if on)
                or "-",
            ]
            for e in entries
        ],
        justify={"messages": "right", "size": "right"},
    )


@command("list", group=trash)
@json_option
def trash_list(state: CliState, as_json: bool) -> None:
    """List the trash, most recently deleted first."""
    entries = states.trashed_contexts(_lifecycle(state))
    if as_json:
        state.out.json({"trash": [record_json(e) for e in entries]})
    elif not entries:
        state.out.note(f"the trash of {state.shown_location} is empty")
    else:
        _print_trash(state, entries)


@command("restore", group=trash)
@click.argument("target", metavar="CONTEXT|TRASH_ID")
@click.option(
    "--as", "as_context", type=CONTEXT, default=None, help="Restore it under this context id."
)
def trash_restore(state: CliState, target: str, as_context: ContextId | None) -> None:
    """Bring a deleted session back, archived if it was; a context id picks its latest deletion."""
    store = _lifecycle(state)
    entry = lifecycle.find_trashed(store, target)
    try:
        head = states.restore_trashed(store, entry.trash_id, as_context=as_context)
    except ContextExists as exc:
        raise ContextExists(f"{exc}: restore it under another id with --as") from None
    where = " (archived)" if entry.archived else ""
    state.out.note(f"restored {head.context}{where}", style="green")


@command("purge", group=trash)
@click.argument("targets", nargs=-1, metavar="[CONTEXT|TRASH_ID]...")
@click.option(
    "--older-than", metavar="AGE", help="Only entries deleted longer ago than AGE (30d, 12h, 2w)."
)
@flag("--dry-run", help="Only print what would be purged.")
@flag("--yes", "-y", help="Do not ask for confirmation.")
def trash_purge(
    state: CliState, targets: tuple[str, ...], older_than: str | None, dry_run: bool, yes: bool
) -> None:
    """Delete trash entries for ever: those named, else those older than AGE, else all.

    A context id names every trash entry of it. Without names, pinned entries are kept.
    Asks first on a terminal; without one it refuses unless --yes.
    """
    _lifecycle(state)
    entries = lifecycle.plan_trash_purge(
        state.store(), older_than=_age(older_than), targets=targets
    )
    total = human_bytes(sum(e.bytes or 0 for e in entries))
    if not entries:
        state.out.note("nothing to purge")
        return
    if dry_run:
        _print_trash(state, entries)
        state.out.note(f"would purge {plural(len(entries), 'session')} ({total})")
        return
    _confirm(
        f"Delete {plural(len(entries), 'session')} ({total}) for ever?",
        yes,
        "refusing to purge the trash",
    )
    with state.out.progress(len(entries), "purging") as progress:
        done = lifecycle.run_trash_purge(
            state.store(), entries, why="command: terrarium trash purge", progress=progress
        )
    freed = human_bytes(sum(e.bytes or 0 for e in done))
    state.out.note(f"purged {plural(len(done), 'session')} ({freed})", style="green")


def _pin(state: CliState, context: ContextId, pinned: bool) -> None:
    if not states.pin_context(_lifecycle(state), context, pinned):
        raise catalog.missing(state, context)
    done = "pinned" if pinned else "unpinned"
    why = ": no policy archives or purges it" if pinned else ""
    state.out.note(f"{done} {context.display}{why}", style="green")


@command()
@click.argument("context", type=CONTEXT)
def pin(state: CliState, context: ContextId) -> None:
    """Pin a session: no policy or age selection archives or purges it."""
    _pin(state, context, True)


@command()
@click.argument("context", type=CONTEXT)
def unpin(state: CliState, context: ContextId) -> None:
    """Unpin a session (policies may archive it again)."""
    _pin(state, context, False)


@command()
@flag("--dry-run", help="Only print what the policy would do.")
@json_option
def maintain(state: CliState, dry_run: bool, as_json: bool) -> None:
    """Apply the retention policy: archive inactive sessions, purge old trash.

    For cron: silent unless something moved; exit code 0 on success, 1 on failure.
    The policy is [retention] in terrarium.toml in the store's folder, else in
    ~/.config/terrarium/config.toml; without one nothing happens.
    """
    _lifecycle(state)
    report = lifecycle.Maintenance(state.store()).run(dry_run=dry_run)
    _report_maintenance(state, report, dry_run, as_json)
    fail_if_damaged(state.out, report.to_archive.damaged, "archived")


def _report_maintenance(
    state: CliState, report: MaintenanceReport, dry_run: bool, as_json: bool
) -> None:
    """``maintain``'s output: JSON, or what moved (what would, dry) and a summary."""
    if as_json:
        state.out.json(report_json(report))
        return
    if report.policy is None:
        if state.out.err_rich or dry_run:
            state.out.note("no retention policy: nothing to do (see docs/cli.md, maintain)")
        return
    if dry_run:
        _print_plan(state, report.to_archive)
        if report.to_purge:
            _print_trash(state, report.to_purge)
            state.out.note(f"would purge {plural(len(report.to_purge), 'session')} from the trash")
        return
    for archived in report.archived:
        state.out.line(f"archived {archived.context}")
    for entry in report.purged:
        state.out.line(f"purged {entry.context} ({entry.trash_id}) from the trash")
    if report.changed:
        state.out.note(
            f"maintain: archived {len(report.archived)}, purged {len(report.purged)}, "
            f"saved {human_bytes(report.bytes_saved)} (policy {report.policy})"
        )


def report_json(report: MaintenanceReport) -> dict[str, Any]:
    """``maintain --json``."""
    archive: Sequence[Candidate | ArchivedContext] = report.archived
    purge = report.purged
    if report.dry_run:  # what it would do
        archive, purge = report.to_archive.candidates, report.to_purge
    return {
        "dry_run": report.dry_run,
        "policy": report.policy,
        "archived": [record_json(r) for r in archive],
        "purged": [record_json(e) for e in purge],
        **left_out_json(report.to_archive),
        "bytes_saved": report.bytes_saved,
    }


def lifecycle_rows(
    state: CliState, rows: list[ContextSummary], type_: str | None, scope: str
) -> tuple[list[ContextSummary], frozenset[str]]:
    """``list``'s rows for ``scope`` (``rows``: the hot ones it shows), and the pinned ids."""
    from terrarium.contexts import archived_rows
    from terrarium.stores.base import Lifecycle

    store = state.store()
    if not isinstance(store, Lifecycle):
        return rows, frozenset()
    records = store.session_records()
    pins = states.pinned_contexts(store, records=records)
    if scope == "hot":
        return rows, pins
    out = list(rows) if scope == "all" else []
    out += archived_rows(store, type_, records=records)
    out.sort(key=lambda r: r.last_active, reverse=True)
    out.sort(key=lambda r: r.type)
    return out, pins
