"""The transcript benchmark runs end to end at tiny sizes. No timing is asserted."""

from __future__ import annotations

from pathlib import Path

from helpers.bench import run_bench


def test_bench_transcript_quick_run(tmp_path: Path) -> None:
    """benchmarks/bench_transcript.py --quick reads the view on each store it reaches and
    leaves no temporary directory behind."""
    result = run_bench("bench_transcript.py", "--quick", tmp=tmp_path)
    assert "sqlite    one context (27 items): view " in result.stdout
    assert "view / restore" in result.stdout
    assert "postgres" in result.stdout  # measured, or skipped with the reason
    assert not list(tmp_path.glob("bench-transcript-*"))
