"""Run a benchmark script the way its smoke test does: a child interpreter, output captured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run_bench(
    script: str, *args: str, tmp: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``benchmarks/{script} {args}`` run to its end (temporary files under ``tmp`` if given);
    fails the test, with the tail of its stderr, unless it exits 0."""
    env = {**os.environ, "TMPDIR": str(tmp)} if tmp is not None else None
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result
