"""The ``terrarium`` command line: ``cli`` is the Click group (``app``), :func:`main` the script.

docs/architecture.md says which module holds which command.
"""

from __future__ import annotations

import gc
import logging  # imported by the commands' module already

# The objects these imports make live as long as the process: the cyclic collector is off while
# they are made, and main() moves them out of its sight (gc.freeze), so no collection walks them
# again. `terrarium list` starts about 15% faster (benchmarks/README.md, "Start-up").
_collecting = gc.isenabled()
gc.disable()
try:
    from terrarium.cli import bulk, commands, lifecycle_cmds
    from terrarium.cli.app import cli
finally:
    if _collecting:
        gc.enable()

_ = (bulk, commands, lifecycle_cmds)  # imported for the commands they define
# Imported when it runs: it needs asyncio, which no other command does (see GuardedGroup).
cli.add_lazy(
    "chat", "terrarium.cli.chat", "Chat in a session (CONTEXT is type:name, or a name of --type)."
)
# Imported when it runs: it needs Starlette, uvicorn and Jinja2 (the 'web' extra).
cli.add_lazy("serve", "terrarium.cli.serve", "Serve the statistics dashboard (a local web app).")
# Imported when it runs: it needs Starlette and uvicorn (the 'web' extra).
cli.add_lazy(
    "gateway",
    "terrarium.cli.gateway",
    "Serve OpenAI's APIs in front of a model server, keeping every conversation.",
)


def main() -> None:
    """Run the ``terrarium`` command line; what the library logs (a warning and up) goes to
    stderr as the commands' own warnings do, ``warning: ...`` (Python's fallback prints the
    bare message)."""
    gc.freeze()
    handler = logging.StreamHandler()
    handler.setFormatter(_Levelled())
    logging.getLogger("terrarium").addHandler(handler)
    cli(prog_name="terrarium")


class _Levelled(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {record.getMessage()}"


__all__ = ["cli", "main"]
