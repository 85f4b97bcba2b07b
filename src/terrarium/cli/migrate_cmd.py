"""``terrarium migrate``: delegates to :mod:`terrarium.migrate` and prints its plan."""

from __future__ import annotations

import importlib

import click

from terrarium.cli.app import CliState


def run_migrate(state: CliState, *, dry_run: bool, to_log: bool) -> None:
    """Plan (and unless ``dry_run``, apply) the migration of legacy files."""
    try:
        importlib.import_module("terrarium.migrate")
    except ImportError:
        raise click.ClickException("migration support is not installed yet") from None
    raise click.ClickException("migration support is not wired up yet")
