"""The SQL lifecycle benchmark runs end to end at tiny sizes. No timing is asserted."""

from __future__ import annotations

from helpers.bench import run_bench


def test_bench_sql_lifecycle_quick_run() -> None:
    result = run_bench("bench_sql_lifecycle.py", "--quick")
    assert "sqlite: 500 messages" in result.stdout
    assert "unarchive-on-resume" in result.stdout and "archived" in result.stdout
