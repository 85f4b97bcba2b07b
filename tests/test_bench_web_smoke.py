"""The dashboard benchmark runs end to end at tiny sizes. No timing is asserted: that is its job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_web_quick_run(tmp_path: Path) -> None:
    """benchmarks/bench_web.py --quick fills each store, serves it and prints its table."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_web.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    table = result.stdout.split("Results", 1)[-1]
    for label in ("fs", "sqlite"):
        for measure in (
            "overview, cold cache",
            "overview complete after",
            "overview, warm",
            "first sessions page",
        ):
            assert f"{label} {measure}" in table, (label, measure)
        assert f"{label} long session, first page" in table
    if "PostgreSQL skipped" not in result.stdout:
        assert "postgres overview, warm" in table
    assert not list(tmp_path.glob("bench-web-*")), "the temporary directory is left behind"
