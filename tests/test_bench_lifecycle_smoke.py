"""The lifecycle benchmark runs end to end at tiny sizes. No timing is asserted: that is its job."""

from __future__ import annotations

from pathlib import Path

from helpers.bench import run_bench


def test_bench_lifecycle_quick_run(tmp_path: Path) -> None:
    """benchmarks/bench_lifecycle.py --quick runs to the end, prints every measure and leaves
    no temporary directory behind."""
    result = run_bench("bench_lifecycle.py", "--quick", tmp=tmp_path)
    table = result.stdout.split("Results", 1)[-1]
    for measure in (
        "archived / hot bytes",
        "fs frozen folders / hot folders",
        "list_contexts_fast after / before",
        "list_contexts after / before",
        "resume archived / hot",
    ):
        assert measure in table, measure
    assert not list(tmp_path.glob("bench-lifecycle-*")), "the temporary directory is left behind"
