"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fakeserver import FakeServer


@pytest.fixture
def fake_server() -> Iterator[FakeServer]:
    """A fake OpenAI-compatible model server on 127.0.0.1 (see tests/fakeserver.py)."""
    with FakeServer() as server:
        yield server
