"""Parent side of the child-process tests: start ``fs_child.py`` commands and talk to them;
``serving`` and ``ask`` for a child that answers one JSON request a line (the kill tests')."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

CHILD = Path(__file__).with_name("fs_child.py")


class Child:
    """One ``fs_child.py`` command in its own process, speaking JSON lines on stdout.

    Use it as a context manager: leaving the block kills the child if it still runs and reaps
    it, so no process or pipe outlives the test.
    """

    def __init__(self, command: str, **args: Any) -> None:
        self.command = command
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), command, json.dumps(args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def __enter__(self) -> Child:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()

    def read(self) -> dict[str, Any]:
        """The child's next message; blocks until it writes one."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            _, err = self.proc.communicate()
            raise AssertionError(f"{self.command} exited with {self.proc.returncode}:\n{err}")
        message: dict[str, Any] = json.loads(line)
        return message

    def go(self) -> None:
        """Release a child waiting in ``wait_for_go``."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self) -> list[dict[str, Any]]:
        """Wait for the child to exit cleanly; return the messages it had not been read."""
        out, err = self.proc.communicate(timeout=120)
        assert self.proc.returncode == 0, (
            f"{self.command} exited with {self.proc.returncode}:\n{err}"
        )
        return [json.loads(line) for line in out.splitlines()]

    def wait(self) -> int:
        """Wait for the child to exit by itself; return its exit status."""
        self.proc.communicate(timeout=120)
        return self.proc.returncode

    def kill(self) -> list[dict[str, Any]]:
        """SIGKILL the child; return the complete messages it wrote before it died."""
        self.proc.kill()
        out, _ = self.proc.communicate(timeout=60)
        assert self.proc.returncode == -9, f"{self.command} exited with {self.proc.returncode}"
        # Each message is one write below PIPE_BUF, so a line is either whole or absent.
        return [json.loads(line) for line in out.splitlines() if line.endswith("}")]


def start_together(children: list[Child]) -> None:
    """Wait until every child is ready, then release them all at once."""
    for child in children:
        assert child.read() == {"ready": True}
    for child in children:
        child.go()


@contextmanager
def serving(child: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    """The script ``child`` running (given ``args``), reading requests on stdin; closed and
    reaped after."""
    proc = subprocess.Popen(
        [sys.executable, str(child), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    yield proc
    proc.communicate(timeout=60)  # closes stdin, reads to the end, closes stdout


def ask(proc: subprocess.Popen[str], request: dict[str, Any]) -> dict[str, Any]:
    """Send ``request`` as one JSON line; the one line of JSON that answers it."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(request) + "\n")
    proc.stdin.flush()
    answer: dict[str, Any] = json.loads(proc.stdout.readline())
    return answer


def records_of(procs: list[tuple[subprocess.Popen[bytes], Path]]) -> list[dict[str, Any]]:
    """Wait for race workers to end (each a process and the JSON lines file it writes); every
    record they wrote. A hang (240 s, before pytest's timeout) aborts each worker, which prints
    its stack (faulthandler) in the captured stderr, and fails; so does a worker that failed."""
    deadline = time.monotonic() + 240
    try:
        for proc, _ in procs:
            proc.wait(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        for proc, _ in procs:
            proc.send_signal(signal.SIGABRT)
            proc.wait()
        raise AssertionError("a worker hung (stacks above, in the captured stderr)") from None
    finally:
        for proc, _ in procs:
            proc.kill()
            proc.wait()
    assert [proc.returncode for proc, _ in procs] == [0] * len(procs)
    return [json.loads(line) for _, out in procs for line in out.read_text().splitlines()]
