"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fakeserver import FakeServer
from terrarium import FsStore


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A sessions folder that does not exist yet."""
    return tmp_path / "sessions"


@pytest.fixture
def store(root: Path) -> Iterator[FsStore]:
    """A filesystem store in ``root``, closed after the test (tests/contract overrides it)."""
    with FsStore(root) as instance:
        yield instance


@pytest.fixture
def fake_server() -> Iterator[FakeServer]:
    """A fake OpenAI-compatible model server on 127.0.0.1 (see tests/fakeserver.py)."""
    with FakeServer() as server:
        yield server


@pytest.fixture(autouse=True)
def _private_xdg(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point ``XDG_CONFIG_HOME``, ``XDG_STATE_HOME``, ``XDG_CACHE_HOME`` and
    ``TERRARIUM_INDEX_DIR`` into a temporary folder: no test reads the user's retention policy
    or writes a maintenance log or a PostgreSQL store's derived index into their home."""
    base = tmp_path_factory.mktemp("xdg")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(base / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(base / "state"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(base / "cache"))
    monkeypatch.setenv("TERRARIUM_INDEX_DIR", str(base / "index"))
