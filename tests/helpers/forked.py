"""Run one piece of work in a forked process that may be SIGKILLed, and hear how it ended.

The kill tests' child servers (``fs_child``, ``copy_child``, ``lifecycle_child``,
``steps_child``) read one request a line and fork a process for each, so that every run starts
warm: :func:`run_forked` is that fork, its answer and its reaping.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

#: ``os.write`` as it was before a test patched it to count file changes.
REAL_WRITE = os.write


def run_forked(work: Callable[[], Any], *, quiet: bool = False) -> tuple[bool, Any]:
    """Run ``work`` in a forked process; whether SIGKILL ended it, and what it returned (JSON,
    None if it was killed first). ``quiet``: its stdout and stderr go to /dev/null."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the process that may be killed
        os.close(read)
        if quiet:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
        REAL_WRITE(write, json.dumps(work()).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        done = pipe.read()
    _, status = os.waitpid(pid, 0)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    return killed, json.loads(done) if done else None


def answer_each(work: Callable[[dict[str, Any]], Any]) -> None:
    """For each JSON request line on stdin, ``work(request)`` in a fork (quiet): a line of
    ``killed``, ``writes`` and ``error``, ``work``'s answer being the last two."""
    for line in sys.stdin:
        request = json.loads(line)
        killed, done = run_forked(lambda request=request: work(request), quiet=True)
        writes, error = done if done else (None, None)
        sys.stdout.write(json.dumps({"killed": killed, "writes": writes, "error": error}) + "\n")
        sys.stdout.flush()
