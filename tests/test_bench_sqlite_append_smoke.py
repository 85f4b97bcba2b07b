"""The SQLite append benchmark runs end to end at a tiny size. No timing is asserted."""

from __future__ import annotations

from helpers.bench import run_bench


def test_bench_sqlite_append_quick_run() -> None:
    result = run_bench("bench_sqlite_append.py", "--quick")
    assert "depth 100, 200 appends each" in result.stdout
    for name in ("store", "direct", "floor"):
        assert f"  {name} " in result.stdout and "p99.9" in result.stdout
    assert result.stdout.count("store / floor, median") == 2  # wall and thread CPU
