"""The blobs benchmark runs end to end at tiny sizes. No timing is asserted."""

from __future__ import annotations

from helpers.bench import run_bench


def test_bench_blobs_quick_run() -> None:
    result = run_bench("bench_blobs.py", "--quick")
    assert "10 tool outputs of 262,144 bytes each" in result.stdout
    for kind in ("fs", "sqlite"):
        assert f"{kind:6} restore: lazy" in result.stdout
        assert f"{kind:6} log: with blobs" in result.stdout
