"""The PostgreSQL bytes benchmark runs end to end at a tiny size. No size is asserted: that is
its job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pg import pg_database  # noqa: F401  (a fixture: the server answers, or the test skips)

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.postgres


def test_bench_pg_bytes_quick_run(pg_database: str) -> None:  # noqa: F811
    """benchmarks/bench_pg_bytes.py --quick measures the log's and the search's relations."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_pg_bytes.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    for measure in (
        "FsStore: every file",
        "postgres log: table entries",
        "postgres search: index search_docs_tsv",
        "postgres log relations / FsStore",
        "postgres search relations / FsStore",
    ):
        assert measure in result.stdout, measure
