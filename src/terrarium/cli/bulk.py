"""Commands that work across stores: ``copy`` (and ``search``, over every session)."""

from __future__ import annotations

import click
from rich.progress import Progress

from terrarium.cli.app import CONTEXT, cli, open_store, state_of, storage_option
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

    state = state_of(ctx)
    src = open_store(source)
    try:
        dst = open_store(destination)
        try:
            wanted = list(contexts) or [ContextId.parse(h.context) for h in src.list_contexts()]
            if state.out.err.is_terminal:
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
