"""The SQLite append benchmark runs end to end at a tiny size. No timing is asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_sqlite_append_quick_run() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_sqlite_append.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "depth 100, 200 appends each" in result.stdout
    for name in ("store", "direct", "floor"):
        assert f"  {name} " in result.stdout and "p99.9" in result.stdout
    assert result.stdout.count("store / floor, median") == 2  # wall and thread CPU
