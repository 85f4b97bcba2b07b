"""A real llama.cpp server (``llama-cpp-python[server]``) on a tiny random model, for these tests.

Opt-in: the tests here are marked ``real_model`` (``pytestmark``), which the default run
deselects (see ``pyproject.toml``); ``make test-real-model`` builds the server into the venv
(its wheel cached under ``.cache/wheels``) and runs them. Without ``llama_cpp`` installed
they skip, unless ``TERRARIUM_REQUIRE_REAL_MODEL=1`` (set by the make target) turns that into
a failure, so the target never passes on tests that did not run.

The server is started once per test session on a free port of 127.0.0.1, from a model that
``scripts/make_tiny_model.py`` writes (no download), and stopped at the end. Readiness is read
from its log ("Uvicorn running on"), not polled; its whole log is kept in
``<tmp>/llama-server.log`` and its tail is shown if it fails to start.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

ROOT = Path(__file__).resolve().parents[2]
N_CTX = 1024
"""The server's context window: small, so a too-long prompt is cheap to make."""
START_TIMEOUT = 180.0
"""Seconds the server may take to load the model and listen (it takes about 2 here)."""
READY = "Uvicorn running on"


@dataclass(frozen=True)
class LlamaServer:
    """The running server."""

    root_url: str
    """``http://127.0.0.1:PORT``, without ``/v1``."""
    model_path: Path
    """The GGUF file it serves (its model id, as llama-cpp-python names models by path)."""
    log: Path
    """Its stdout and stderr."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pump(stream: IO[str], log: Path, ready: threading.Event) -> None:
    """Copy the server's output to ``log``; set ``ready`` once it listens (or at its end)."""
    with log.open("a", encoding="utf-8") as out:
        for line in stream:
            out.write(line)
            out.flush()
            if READY in line:
                ready.set()
    ready.set()  # the output ended: the server exited, the caller sees it through poll()


def _tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """A llama-cpp-python server on a freshly written tiny model (see the module docstring)."""
    if importlib.util.find_spec("llama_cpp") is None:
        message = "llama-cpp-python is not installed: run `make test-real-model`"
        if os.environ.get("TERRARIUM_REQUIRE_REAL_MODEL") == "1":
            pytest.fail(message)
        pytest.skip(message)
    folder = tmp_path_factory.mktemp("llama")
    model = folder / "tiny.gguf"
    made = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_tiny_model.py"), str(model)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    port = _free_port()
    log = folder / "llama-server.log"
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(N_CTX),
        "--n_threads",
        "1",
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        encoding="utf-8",
        errors="replace",
    )
    assert process.stdout is not None
    ready = threading.Event()
    pump = threading.Thread(target=_pump, args=(process.stdout, log, ready), daemon=True)
    pump.start()
    try:
        if not ready.wait(START_TIMEOUT) or process.poll() is not None:
            pytest.fail(f"the llama.cpp server did not start; its log ends:\n{_tail(log)}")
        yield LlamaServer(f"http://127.0.0.1:{port}", model, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        pump.join(timeout=5)
        process.stdout.close()
