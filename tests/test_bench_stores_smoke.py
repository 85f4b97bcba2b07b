"""The store benchmark runs end to end at tiny sizes. No timing is asserted: that is its job."""

from __future__ import annotations

from pathlib import Path

from helpers.bench import run_bench


def test_bench_stores_quick_run(tmp_path: Path) -> None:
    """benchmarks/bench_stores.py --quick runs to the end and prints its table."""
    result = run_bench("bench_stores.py", "--quick", tmp=tmp_path)
    table = result.stdout.split("Results", 1)[-1]
    for measure in (
        "fs append",
        "fs restore 1,000 entries",
        "sqlite append, one history item",
        "sqlite append / bare INSERT",
        "sqlite batched append",
        "sqlite restore 1,000 entries",
        "search p50, mid-frequency word",
        "search p95, very common word",
    ):
        assert measure in table, measure
    if "PostgreSQL skipped" not in result.stdout:
        assert "postgres append / bare INSERT" in table
        assert "postgres batched append" in table
    assert not list(tmp_path.glob("bench-stores-*")), "the temporary directory is left behind"
