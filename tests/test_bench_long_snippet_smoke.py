"""The long-snippet benchmark runs end to end at tiny sizes. No timing is asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_long_snippet_quick_run() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_long_snippet.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "one message of 2,000 matches" in result.stdout
    for kind in ("fs", "sqlite"):
        assert f"{kind}" in result.stdout and "snippet cut in Python" in result.stdout
