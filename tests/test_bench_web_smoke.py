"""The dashboard benchmark runs end to end at tiny sizes. No timing is asserted: that is its job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.bench import run_bench

ROOT = Path(__file__).resolve().parents[1]


def test_bench_web_quick_run(tmp_path: Path) -> None:
    """benchmarks/bench_web.py --quick fills each store (some contexts pinned), serves it and
    prints its table."""
    result = run_bench("bench_web.py", "--quick", "--pinned", "3", tmp=tmp_path)
    assert "3 of them pinned" in result.stdout
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


def test_bench_web_keeps_its_stores_for_the_next_run(tmp_path: Path) -> None:
    """With --keep the fs and SQLite stores are filled once; a second run measures them
    without filling, and a run of other sizes is refused."""

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "bench_web.py"), *extra],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    sizes = ("--messages", "2", "--session", "10", "--repeat", "1")
    args = ("--keep", str(tmp_path / "kept"), "--stores", "fs,sqlite", *sizes)
    first = run(*args, "--contexts", "5", "--fill-only")
    assert first.returncode == 0, first.stderr[-2000:]
    assert "messages written" in first.stdout and "Results" not in first.stdout
    second = run(*args, "--contexts", "5")
    assert second.returncode == 0, second.stderr[-2000:]
    assert "fs: kept store" in second.stdout and "sqlite: kept store" in second.stdout
    assert "messages written" not in second.stdout and "sqlite overview, warm" in second.stdout
    other = run(*args, "--contexts", "7")
    assert other.returncode != 0 and "other sizes" in other.stderr
