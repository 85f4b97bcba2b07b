"""The old ``chat.py`` interface (``seeds/004``), on top of the ``terrarium`` commands::

    python chat.py                          # interactive session picker
    python chat.py --session-id main        # chat in cli:main
    python chat.py --list-sessions          # list all sessions
    python chat.py --delete-session main    # delete cli:main (asks first on a terminal)

Each also takes ``--storage-dir DIR`` and the model options of ``terrarium chat``.
"""

from __future__ import annotations

import click

from terrarium.cli import commands, lifecycle_cmds
from terrarium.cli.app import GuardedCommand, flag, model_options, state_of, storage_option
from terrarium.cli.chat import run_chat
from terrarium.llm import ModelAccess
from terrarium.model import ContextId


@click.command(
    "chat.py", cls=GuardedCommand, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.option("--session-id", default=None, metavar="ID", help="Chat in this session.")
@click.option(
    "--type",
    "type_",
    default=None,
    metavar="TYPE",
    help="Session type for --session-id and --delete-session (default: cli); "
    "with --list-sessions, list only this type.",
)
@flag("--list-sessions", help="List all sessions and exit.")
@click.option("--delete-session", default=None, metavar="ID", help="Delete a session and exit.")
@flag("--yes", "-y", help="Delete without asking.")
@click.option("--system-prompt", default=None, help="System prompt (logged when it changes).")
@model_options
@storage_option
@click.pass_context
def seed_chat(
    ctx: click.Context,
    session_id: str | None,
    type_: str | None,
    list_sessions: bool,
    delete_session: str | None,
    yes: bool,
    system_prompt: str | None,
    server: ModelAccess,
) -> None:
    """Chat with the model in a persistent session (the seed's chat.py)."""
    state = state_of(ctx)
    state.reads_only = list_sessions or delete_session is not None
    if list_sessions:
        commands.print_sessions(state, type_, as_json=False)
        return
    kind = type_ or "cli"
    if delete_session is not None:
        lifecycle_cmds.delete_session(state, ContextId(kind, delete_session), yes, confirm=True)
        return
    context = ContextId(kind, session_id) if session_id is not None else None
    run_chat(state, context, kind, server, system_prompt)


def main() -> None:
    """Run ``chat.py``."""
    seed_chat(prog_name="chat.py")
