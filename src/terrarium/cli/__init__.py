"""The ``terrarium`` command line: chat with a session picker, and manage sessions.

``cli`` is the Click group; :func:`main` is the console script. Modules: ``app`` (the group,
shared options, error boundary), ``commands`` (list, show, stats, delete, clear, fork, compact,
export, import, migrate, fsck, reindex), ``bulk`` (copy, search), ``chat`` (the chat loop),
``picker`` (the session picker), ``examples`` (the examples that end each command's help),
``seed`` (the old ``chat.py`` interface), ``output`` (terminal or plain output).
"""

from __future__ import annotations

from terrarium.cli import bulk as _bulk
from terrarium.cli import chat as _chat
from terrarium.cli import commands as _commands
from terrarium.cli.app import cli
from terrarium.cli.examples import add_examples

_ = (_bulk, _chat, _commands)  # imported for their commands
add_examples(cli)


def main() -> None:
    """Run the ``terrarium`` command line."""
    cli(prog_name="terrarium")


__all__ = ["cli", "main"]
