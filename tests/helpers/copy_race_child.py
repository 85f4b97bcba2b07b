"""Child of the copy race test (``tests/test_race_gaps.py``): a ``terrarium copy`` whose first
trace write waits for another copy's.

Run as ``python tests/helpers/copy_race_child.py MEET ARGV...``. Before its first trace write to
any store it marks ``MEET/{pid}`` and waits, at most :data:`WAIT` seconds, until another child
has marked it too: two copies that can both write a session's trace at once then do (before
the fix, every time). Copies that take turns never meet and go on after :data:`WAIT`.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

WAIT = 3.0
"""Seconds a first trace write waits for the other copy's."""

STORES = (
    "terrarium.stores.fs:FsStore",
    "terrarium.stores.sqlite:SqliteStore",
    "terrarium.stores.postgres:PostgresStore",
)


def _meet(folder: Path) -> None:
    """Mark ``folder`` and wait until another process has, or :data:`WAIT` has passed."""
    (folder / str(os.getpid())).touch()
    deadline = time.monotonic() + WAIT
    while len(os.listdir(folder)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)


def main(folder: Path, argv: list[str]) -> None:
    met = [False]
    for spec in STORES:
        module, _, name = spec.partition(":")
        cls = getattr(importlib.import_module(module), name)

        def waiting(self: Any, *args: Any, _real: Callable[..., Any] = cls.append_trace) -> Any:
            if not met[0]:
                met[0] = True
                _meet(folder)
            return _real(self, *args)

        cls.append_trace = waiting
    from terrarium.cli import cli

    cli.main(args=argv, prog_name="terrarium")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
