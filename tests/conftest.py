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
