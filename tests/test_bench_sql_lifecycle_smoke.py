"""The SQL lifecycle benchmark runs end to end at tiny sizes. No timing is asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_sql_lifecycle_quick_run() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_sql_lifecycle.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "sqlite: 500 messages" in result.stdout
    assert "unarchive-on-resume" in result.stdout and "archived" in result.stdout
