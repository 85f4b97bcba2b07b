"""The PostgreSQL bytes benchmark runs end to end at a tiny size. No size is asserted: that is
its job."""

from __future__ import annotations

import pytest

from helpers.bench import run_bench
from pg import pg_database  # noqa: F401  (a fixture: the server answers, or the test skips)

pytestmark = pytest.mark.postgres


def test_bench_pg_bytes_quick_run(pg_database: str) -> None:  # noqa: F811
    """benchmarks/bench_pg_bytes.py --quick measures the log's and the change cursor's
    relations, and the derived index's file."""
    result = run_bench("bench_pg_bytes.py", "--quick")
    for measure in (
        "FsStore: every file",
        "postgres log: table entries",
        "postgres log relations / FsStore",
        "postgres cursor relations / FsStore",
        "derived index file (each machine) / FsStore",
    ):
        assert measure in result.stdout, measure
