"""Child process of the lifecycle kill tests (``tests/test_lifecycle_fs_kill.py``).

Run as ``python tests/helpers/lifecycle_child.py``. For each JSON line on stdin
(``{"root", "kill", "op", "context", "trash_id", "as"}``) it forks a process that runs one
lifecycle call on an ``FsStore`` and is SIGKILLed just before its ``kill``-th file change
(0: never), and answers ``{"killed", "mutations", "error"}`` on stdout.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from fs_child import _count_mutations

from terrarium import FsStore
from terrarium.model import ContextId


def run(store: FsStore, request: dict[str, Any]) -> None:
    """The lifecycle call ``request["op"]`` names."""
    context = ContextId.parse(request["context"])
    op = request["op"]
    if op == "archive":
        store.archive_context(context)
    elif op == "unarchive":
        store.unarchive_context(context)
    elif op == "delete":
        store.delete_context(context)
    elif op == "restore":
        target = ContextId.parse(request["as"]) if request.get("as") else None
        store.restore_trashed(request["trash_id"], as_context=target)
    elif op == "purge_trashed":
        store.purge_trashed(request["trash_id"])
    elif op == "purge_context":
        store.purge_context(context)
    else:
        raise ValueError(f"unknown op {op!r}")


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the process that may be killed
            os.close(read)
            count = _count_mutations(request["kill"])
            error = ""
            try:
                with FsStore(request["root"]) as store:
                    run(store, request)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
            os.write(write, json.dumps([count[0], error]).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            done = pipe.read()
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        mutations, error = json.loads(done) if done else (None, None)
        sys.stdout.write(json.dumps({"killed": killed, "mutations": mutations, "error": error}))
        sys.stdout.write("\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
