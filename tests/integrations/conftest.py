"""The ``store`` fixture of the integration tests: one run per backend of tests/contract."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.conftest import BACKEND_MARKS, BACKENDS
from pg import pg_database  # noqa: F401  (the "postgres" backend's database)
from terrarium import Store


@pytest.fixture(params=[pytest.param(name, marks=BACKEND_MARKS.get(name, [])) for name in BACKENDS])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each backend (memory, fs, sqlite, postgres), closed after the test."""
    instance = BACKENDS[request.param](tmp_path, request)
    try:
        yield instance
    finally:
        instance.close()
