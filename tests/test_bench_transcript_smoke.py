"""The transcript benchmark runs end to end at tiny sizes. No timing is asserted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_transcript_quick_run(tmp_path: Path) -> None:
    """benchmarks/bench_transcript.py --quick reads the view on each store it reaches and
    leaves no temporary directory behind."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_transcript.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "sqlite    one context (27 items): view " in result.stdout
    assert "view / restore" in result.stdout
    assert "postgres" in result.stdout  # measured, or skipped with the reason
    assert not list(tmp_path.glob("bench-transcript-*"))
