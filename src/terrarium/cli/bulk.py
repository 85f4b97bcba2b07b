"""Commands that work across stores: ``copy`` (and ``search``, over every session)."""

from __future__ import annotations

from contextlib import closing
from typing import TYPE_CHECKING

import click

from terrarium.cli.app import CONTEXT, DATE, CliState, command, json_option, open_store, type_option
from terrarium.cli.output import fail_if_damaged, plural
from terrarium.display import short_time

if TYPE_CHECKING:
    from terrarium.cli.output import Output
    from terrarium.copy import CopyReport
    from terrarium.errors import ContextNotFound
    from terrarium.index._query import SearchHit, SearchQuery
    from terrarium.model import ContextId
    from terrarium.stores.base import Store


@command(creates=True)
@click.argument("source", metavar="SRC_URL")
@click.argument("destination", metavar="DST_URL")
@click.option(
    "--context",
    "-c",
    "contexts",
    multiple=True,
    type=CONTEXT,
    help="Copy only this session (repeatable). Default: all.",
)
@click.option("--verbose", "-v", is_flag=True, help="Also print one line per session.")
def copy(
    state: CliState, source: str, destination: str, contexts: tuple[ContextId, ...], verbose: bool
) -> None:
    """Copy sessions between two stores losslessly (folders or store URLs).

    Sessions the destination holds in part (an interrupted copy) are completed; those it holds
    equal to the source are skipped, so an interrupted copy can be rerun. One that it holds
    otherwise is a conflict: named, not touched, and the exit status is 1. Without --context,
    archived and detached sessions (of no context yet) are copied too.
    Prints one summary line (a progress bar on a terminal); -v adds a line per session.
    """
    from terrarium.copy import copy_store, source_contexts
    from terrarium.stores.url import redact_url

    with closing(open_store(source, create=False)) as src:
        for context in contexts:
            if src.get_head(context) is None:  # refused before anything is copied
                raise _missing(src, context, redact_url(source))
        with closing(open_store(destination)) as dst:
            wanted = list(contexts) or source_contexts(src)
            with state.out.progress(0 if verbose else len(wanted), "copying") as progress:
                report = copy_store(src, dst, wanted, progress=progress, detached=not contexts)
    _report_copy(state.out, report, redact_url(destination), verbose, named=bool(contexts))


def _missing(src: Store, context: ContextId, where: str) -> ContextNotFound:
    """The error for a context to copy that the source lacks, naming close ones it has."""
    from terrarium.cli.catalog import suggesting
    from terrarium.contexts import not_found
    from terrarium.copy import source_contexts

    names = [str(c) for c in source_contexts(src)]
    return suggesting(not_found(context, where), context, names)


def _report_copy(
    out: Output, report: CopyReport, where: str, verbose: bool, *, named: bool = False
) -> None:
    """``copy``'s lines: per session with -v, each problem, the summary; exit 1 on conflicts,
    and on any problem with a session the command named (``named``: one gone meanwhile)."""
    present = report.present
    already = set(present)
    conflicts = {c for c, _ in report.conflicts}
    left_out = already | conflicts | {c for c, _ in report.damaged}
    problems = [(c, reason) for c, reason in report.skipped if c not in left_out]
    if verbose:
        completed = set(report.completed)
        for context in report.copied:
            out.note(f"{'completed' if context in completed else 'copied'} {context}")
        for context in present:
            out.note(f"skipped {context}: already in {where}")
    for context, reason in problems:
        out.note(f"skipped {context}: {reason}", style="yellow")
    for _, reason in report.conflicts:
        out.error(f"conflict: {reason}; not copied")
    out.note(copy_summary(report, where))
    fail_if_damaged(out, report.damaged, "copied")
    if report.conflicts or (named and problems):
        raise click.exceptions.Exit(1)


def copy_summary(report: CopyReport, where: str) -> str:
    """``copy``'s one summary line; a rerun that finds everything copied says just that."""
    copied, present, completed = report.copied, report.present, report.completed
    conflicts = len(report.conflicts)
    problems = len(report.skipped) - len(present) - conflicts
    if present and not copied and not problems and not conflicts:
        return f"nothing to copy: {plural(len(present), 'session')} already in {where}"
    text = f"copied {plural(len(copied), 'session')} ({plural(report.entries, 'line')}) to {where}"
    if completed:
        text += f" ({len(completed)} of them completed)"
    if present:
        text += f"; {len(present)} already there"
    if problems:
        text += f"; {problems} not copied"
    if conflicts:
        text += f"; {conflicts} in conflict"
    return text


@command()
@click.argument("query")
@type_option
@click.option("--context", "-c", type=CONTEXT, help="Only this session.")
@click.option("--since", type=DATE, metavar="DATE", help="Only messages on or after DATE (UTC).")
@click.option(
    "--role",
    type=click.Choice(["user", "assistant", "system", "tool"]),
    help="Only messages of this role.",
)
@click.option(
    "--limit", "-n", type=click.IntRange(1, 1000), default=20, show_default=True, help="Most hits."
)
@json_option
@click.option("--archived", is_flag=True, help="Also search archived sessions.")
@click.option(
    "--all-branches",
    is_flag=True,
    help="Also find messages no longer in their session (cleared, compacted away, rewound).",
)
def search(
    state: CliState,
    query: str,
    type_: str | None,
    context: ContextId | None,
    since: str | None,
    role: str | None,
    limit: int,
    as_json: bool,
    archived: bool,
    all_branches: bool,
) -> None:
    """Search every session's messages; best matches first, with highlighted snippets.

    Each message is found once, in the conversation its session shows, and numbered by its
    place there (#0 is the first message). A message that a clear, a compaction or a rewind
    took out of it is found only with --all-branches, marked "not on the current branch".
    The exit code is 1 when nothing matches, as grep's is; the line that says so names what
    --all-branches would find, or the archived sessions not searched.
    """
    from terrarium.cli import catalog
    from terrarium.search import SearchQuery, hit_json
    from terrarium.search import search as run_search

    if context is not None:
        catalog.require(state, context)  # else a missing session would read as "no match"
    where = str(context) if context else None
    wanted = SearchQuery(query, type_, where, since, role, limit, archived, all_branches)
    found = run_search(state.store(), wanted)
    if as_json:
        state.out.json({"query": query, "hits": [hit_json(hit) for hit in found]})
    if not found:
        if context is not None and not archived and _is_archived(state.store(), context):
            hint = f": {context} is archived (pass --archived to search it)"
        else:
            hint = _wider(state.store(), wanted)
        if hint or not as_json:  # with --json an empty "hits" says no match; the hint is news
            state.out.note(f"no messages match {query!r}{hint}")
        raise click.exceptions.Exit(1)  # grep's convention: 1 when nothing matched, for scripts
    if as_json:
        return
    for hit in found:
        state.out.line(f"{hit.context}  {short_time(hit.ts)}  {hit.role}  {_where(hit)}", "cyan")
        if state.out.rich:
            from rich.text import Text

            snippet = Text(hit.snippet)
            for start, end in hit.highlights:
                snippet.stylize("bold yellow", start, end)
            state.out.console.print(Text("  ").append(snippet))
        else:
            state.out.line(f"  {_marked(hit.snippet, hit.highlights)}")


def _wider(store: Store, wanted: SearchQuery) -> str:
    """What a search that found nothing would find wider (:func:`terrarium.search.wider`),
    as the end of its line; "" if nothing."""
    from terrarium.search import WIDER_LIMIT, wider

    match wider(store, wanted):
        case ("all_branches", count):
            more = "+" if count == WIDER_LIMIT else ""
            return (
                f" on the current branches (--all-branches finds {plural(count, 'message')}{more})"
            )
        case ("archived", count):
            return f" in hot sessions ({plural(count, 'archived session')}: --archived)"
    return ""


def _is_archived(store: Store, context: ContextId) -> bool:
    """Whether ``context`` is archived (a store without :class:`Lifecycle` archives none)."""
    from terrarium.states import is_archived
    from terrarium.stores.base import Lifecycle

    return isinstance(store, Lifecycle) and is_archived(store, context)


def _where(hit: SearchHit) -> str:
    """A hit's number in its session's conversation, or where it is off it."""
    if hit.message is not None:
        return f"#{hit.message}"
    return f"(not on the current branch: segment {str(hit.segment_id)[:8]}, entry {hit.seq})"


def _marked(snippet: str, spans: tuple[tuple[int, int], ...]) -> str:
    """The snippet with ``[`` ``]`` around each highlighted span (plain output)."""
    out, last = [], 0
    for start, end in spans:
        out += [snippet[last:start], "[", snippet[start:end], "]"]
        last = end
    out.append(snippet[last:])
    return "".join(out).replace("\n", " ")
