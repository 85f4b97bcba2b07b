"""The long-snippet benchmark runs end to end at tiny sizes. No timing is asserted."""

from __future__ import annotations

from helpers.bench import run_bench


def test_bench_long_snippet_quick_run() -> None:
    result = run_bench("bench_long_snippet.py", "--quick")
    assert "one message of 2,000 matches" in result.stdout
    for kind in ("fs", "sqlite"):
        assert f"{kind}" in result.stdout and "snippet cut in Python" in result.stdout
