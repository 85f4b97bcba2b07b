"""``terrarium migrate``: delegates to :func:`terrarium.migrate.migrate`, which prints progress."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from terrarium.cli import catalog
from terrarium.cli.app import CliState
from terrarium.cli.output import plural


def run_migrate(state: CliState, *, dry_run: bool, to_log: bool, source: Path | None) -> None:
    """Plan (and unless ``dry_run``, apply) the migration of the legacy files from ``source``.

    ``to_log`` also imports every session into the store.
    """
    from terrarium.migrate import migrate

    root = source if source is not None else catalog.legacy_root(state)
    if root is None:
        raise click.ClickException(
            f"{state.shown_location} is not a folder: name the legacy sessions folder with --from"
        )
    report = migrate(
        root,
        dry_run=dry_run,
        to_log=to_log,
        store=state.store() if to_log else None,
        out=sys.stdout,
    )
    if report.failed:
        raise click.ClickException(
            f"{report.failed} of {plural(len(report.steps), 'legacy file')} could not be migrated"
        )
