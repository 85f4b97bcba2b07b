"""The blobs benchmark runs end to end at tiny sizes. No timing is asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_blobs_quick_run() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_blobs.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "10 tool outputs of 262,144 bytes each" in result.stdout
    for kind in ("fs", "sqlite"):
        assert f"{kind:6} restore: lazy" in result.stdout
        assert f"{kind:6} log: with blobs" in result.stdout
