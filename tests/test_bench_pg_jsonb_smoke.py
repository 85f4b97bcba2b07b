"""The jsonb benchmark runs end to end at tiny sizes. No timing is asserted: that is its job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pg import pg_database  # noqa: F401  (a fixture: the server answers, or the test skips)

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.postgres


def test_bench_pg_jsonb_quick_run(tmp_path: Path, pg_database: str) -> None:  # noqa: F811
    """benchmarks/bench_pg_jsonb.py --quick measures the three variants."""
    out = tmp_path / "jsonb.json"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_pg_jsonb.py"),
            "--quick",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads(out.read_text())
    for variant in ("cast", "stored", "jsonb"):
        assert set(results[variant]) == {
            "append_p50_us",
            "append_p99_us",
            "batch_us_per_row",
            "bytes",
            "read_ms",
        }
        assert results[variant]["bytes"] > 0
    assert "stored / cast" in result.stdout
