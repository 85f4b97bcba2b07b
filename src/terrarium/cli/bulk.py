"""Commands that work across stores: ``copy`` (and ``search``, over every session)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from terrarium.cli.app import CONTEXT, cli, open_store, reads_store, state_of, storage_option

if TYPE_CHECKING:
    from terrarium.model import ContextId


@cli.command()
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
@storage_option
@click.pass_context
def copy(
    ctx: click.Context, source: str, destination: str, contexts: tuple[ContextId, ...]
) -> None:
    """Copy sessions between two stores losslessly (folders or store URLs).

    Sessions the destination already has are skipped, so an interrupted copy can be rerun.
    """
    from terrarium.copy import copy_store
    from terrarium.model import ContextId

    state = state_of(ctx)
    src = open_store(source, create=False)
    try:
        dst = open_store(destination)
        try:
            wanted = list(contexts) or [ContextId.parse(h.context) for h in src.list_contexts()]
            if state.out.err_rich:
                from rich.progress import Progress

                with Progress(console=state.out.err, transient=True) as bar:
                    task = bar.add_task("copying", total=len(wanted))
                    report = copy_store(src, dst, wanted, progress=lambda _c: bar.advance(task))
            else:
                report = copy_store(src, dst, wanted, progress=state.out.note)
        finally:
            dst.close()
    finally:
        src.close()
    for context, reason in report.skipped:
        state.out.note(f"skipped {context}: {reason}", style="yellow")
    state.out.note(
        f"copied {len(report.copied)} sessions ({report.entries} lines), "
        f"skipped {len(report.skipped)}",
        style="green",
    )


@reads_store
@cli.command()
@click.argument("query")
@click.option("--type", "type_", metavar="TYPE", help="Only sessions of this type (cli, irc...).")
@click.option("--context", "-c", type=CONTEXT, help="Only this session.")
@click.option("--since", metavar="DATE", help="Only messages on or after DATE (UTC).")
@click.option(
    "--role",
    type=click.Choice(["user", "assistant", "system", "tool"]),
    help="Only messages of this role.",
)
@click.option(
    "--limit", "-n", type=click.IntRange(1, 1000), default=20, show_default=True, help="Most hits."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schema in docs/cli.md).")
@storage_option
@click.pass_context
def search(
    ctx: click.Context,
    query: str,
    type_: str | None,
    context: ContextId | None,
    since: str | None,
    role: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Search every session's messages; best matches first, with highlighted snippets."""
    from terrarium.search import SearchQuery
    from terrarium.search import search as run_search

    state = state_of(ctx)
    found = run_search(
        state.store(),
        SearchQuery(query, type_, str(context) if context else None, since, role, limit),
    )
    if as_json:
        state.out.json(
            {
                "query": query,
                "hits": [
                    {
                        "context_id": hit.context,
                        "date": hit.date,
                        "segment_id": str(hit.segment_id),
                        "seq": hit.seq,
                        "role": hit.role,
                        "ts": hit.ts,
                        "snippet": hit.snippet,
                        "highlights": [list(span) for span in hit.highlights],
                        "score": hit.score,
                    }
                    for hit in found
                ],
            }
        )
        return
    if not found:
        state.out.note(f"no messages match {query!r}")
        return
    for hit in found:
        heading = f"{hit.context}  {hit.ts[:16].replace('T', ' ')}  {hit.role}  #{hit.seq}"
        if state.out.rich:
            from rich.text import Text

            snippet = Text(hit.snippet)
            for start, end in hit.highlights:
                snippet.stylize("bold yellow", start, end)
            state.out.console.print(Text(heading, style="cyan"))
            state.out.console.print(Text("  ").append(snippet))
        else:
            state.out.line(heading)
            state.out.line(f"  {_marked(hit.snippet, hit.highlights)}")


def _marked(snippet: str, spans: tuple[tuple[int, int], ...]) -> str:
    """The snippet with ``[`` ``]`` around each highlighted span (plain output)."""
    out, last = [], 0
    for start, end in spans:
        out += [snippet[last:start], "[", snippet[start:end], "]"]
        last = end
    out.append(snippet[last:])
    return "".join(out).replace("\n", " ")
