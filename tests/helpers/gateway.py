"""Run ``terrarium gateway`` as a real process for tests, on a free port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import TracebackType

SRC = Path(__file__).resolve().parents[2] / "src"


class GatewayProcess:
    """``terrarium gateway`` in a child process; ``url`` is its ``/v1`` base URL."""

    def __init__(self, storage: str | Path, upstream: str, *extra: str) -> None:
        self.command = [
            sys.executable,
            "-m",
            "terrarium",
            "gateway",
            "--storage-dir",
            str(storage),
            "--upstream",
            upstream,
            "--port",
            "0",
            *extra,
        ]
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.banner: list[str] = []

    def start(self) -> GatewayProcess:
        """Start it and wait for its banner (printed once it listens)."""
        env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.proc = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"gateway did not start: {self.proc.stderr.read()}")  # type: ignore[union-attr]
        self.banner.append(line)
        self.url = line.split()[3]
        return self

    def token_line(self) -> str:
        """The next line of its output (the token, when it printed one)."""
        assert self.proc is not None and self.proc.stdout is not None
        return self.proc.stdout.readline()

    def kill(self) -> None:
        """SIGKILL it, as a crash would."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        """Stop it (SIGTERM; SIGKILL if it lingers)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        if self.proc is not None:
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()
