"""The lifecycle benchmark runs end to end at tiny sizes. No timing is asserted: that is its job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_lifecycle_quick_run(tmp_path: Path) -> None:
    """benchmarks/bench_lifecycle.py --quick runs to the end, prints every measure and leaves
    no temporary directory behind."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_lifecycle.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    table = result.stdout.split("Results", 1)[-1]
    for measure in (
        "archived / hot bytes",
        "fs archive/ folder / hot folders",
        "list_contexts_fast after / before",
        "list_contexts after / before",
        "resume archived / hot",
    ):
        assert measure in table, measure
    assert not list(tmp_path.glob("bench-lifecycle-*")), "the temporary directory is left behind"
