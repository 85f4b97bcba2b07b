"""The targets benchmark runs end to end at small sizes. No timing is asserted: the table is
its job."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.bench import run_bench


def test_bench_targets_quick_run(tmp_path: Path) -> None:
    """benchmarks/bench_targets.py --quick prints a row for each target and backend."""
    out = tmp_path / "rows.json"
    result = run_bench(
        "bench_targets.py",
        "--quick",
        "--sizes",
        "50",
        "--no-postgres",
        "--json",
        str(out),
        tmp=tmp_path,
    )
    rows = json.loads(out.read_text())
    assert [r["target"] for r in rows] == [
        "turn store overhead (fs)",
        "turn store overhead (sqlite)",
        "SQLite append p99.9 (runtime)",
        "SQLite append p99.9 (Store.append)",
        "restore",
        "list contexts (SQLite)",
        "search p50 (SQLite, slowest word class)",
        "dashboard overview, cold (SQLite)",
        "dashboard overview (SQLite)",
        "dashboard first sessions page (SQLite)",
        "terrarium list (fs)",
        "terrarium list (sqlite)",
    ]
    assert all(r["figure"] > 0 and r["floor_value"] > 0 for r in rows)
    assert {r["verdict"] for r in rows} <= {"PASS", "FAIL", "-"}
    assert "ratio / limit" in result.stdout
    assert not list(tmp_path.glob("bench-targets-*")), "the temporary directory is left behind"
