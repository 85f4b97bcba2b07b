"""Child process of the copy and import kill tests (``tests/test_copy_kill.py``).

Run as ``python tests/helpers/copy_child.py``. For each JSON line on stdin (``{"argv", "kill",
"count", "full"}``) it forks a process that runs the ``terrarium`` command ``argv`` and stops
at the ``kill``-th write (0: never): SIGKILLed just before it, or, with ``full``, every write
from it on fails with ENOSPC (a disk that has filled up). ``count`` says what a write is:
``files``, a file change of this process (``fs_child._count_mutations``: a filesystem
destination, whose source must then write no file), or a store class
(``terrarium.stores.sqlite:SqliteStore``), one call of a writing method of it (a transaction: a
kill inside one is a kill before it). It answers ``{"killed", "writes", "exit"}`` on stdout.
"""

from __future__ import annotations

import errno
import importlib
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from forked import run_forked
from fs_child import _count_mutations

#: The store methods that write: everything a copy or an import may call to change a store.
WRITES = (
    "create_context",
    "create_session",
    "attach_context",
    "create_segment",
    "append",
    "set_head",
    "append_trace",
    "set_session_state",  # a pin (terrarium.states writes through these primitives)
    "freeze_session",  # an archive
    "thaw_session",
    "detach_context",
    "delete_session",
    "put_blob",
)


def _count_calls(class_name: str, kill_at: int, full: bool) -> list[int]:
    """Count calls of the store class's writing methods; stop at call number ``kill_at``."""
    module, _, name = class_name.partition(":")
    cls = getattr(importlib.import_module(module), name)
    count = [0]
    for name in WRITES:
        real = getattr(cls, name)

        def counted(*args: Any, _real: Callable[..., Any] = real, **kwargs: Any) -> Any:
            count[0] += 1
            if kill_at and count[0] >= kill_at:
                if not full:
                    os.kill(os.getpid(), signal.SIGKILL)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return _real(*args, **kwargs)

        setattr(cls, name, counted)
    return count


def _fill_up(kill_at: int) -> list[int]:
    """Count file changes; from number ``kill_at`` on, writes and new folders fail, full."""
    count = [0]
    for name in ("write", "mkdir", "ftruncate", "link", "rename", "replace", "unlink", "rmdir"):
        real = getattr(os, name)
        grows = name in ("write", "mkdir", "ftruncate", "link")

        def counted(*args: Any, _real: Callable[..., Any] = real, _grows: bool = grows) -> Any:
            count[0] += 1
            if kill_at and count[0] >= kill_at and _grows:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return _real(*args)

        setattr(os, name, counted)
    return count


def run(request: dict[str, Any]) -> tuple[int, int]:
    """Run the command as the request says (in the forked process); its writes and exit code."""
    from terrarium.cli import cli

    kill, full = request["kill"], request.get("full", False)
    if request["count"] == "files":
        count = _fill_up(kill) if full else _count_mutations(kill)
    else:
        count = _count_calls(request["count"], kill, full)
    try:
        code = cli.main(request["argv"], prog_name="terrarium", standalone_mode=False)
    except SystemExit as exc:
        return count[0], exc.code if isinstance(exc.code, int) else 1
    except Exception:
        return count[0], 1
    return count[0], code if isinstance(code, int) else 0


def main() -> None:
    # Imported once, before the forks, so that each run starts at once.
    import terrarium.cli
    import terrarium.copy
    import terrarium.formats.jsonl
    import terrarium.stores.fs
    import terrarium.stores.sqlite  # noqa: F401

    for line in sys.stdin:
        request = json.loads(line)
        killed, done = run_forked(lambda request=request: list(run(request)), quiet=True)
        writes, code = done if done else (None, None)
        sys.stdout.write(json.dumps({"killed": killed, "writes": writes, "exit": code}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
