"""The command line benchmark runs end to end at tiny sizes. No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.bench import run_bench


def test_bench_cli_quick_run(tmp_path: Path) -> None:
    """benchmarks/bench_cli.py with 2 and 3 sessions measures every command it reports."""
    out = tmp_path / "results.json"
    result = run_bench(
        "bench_cli.py",
        "--small",
        "2",
        "--large",
        "3",
        "--repeat",
        "1",
        "--json",
        str(out),
        tmp=tmp_path,
    )
    assert "bare interpreter (python -c pass)" in result.stdout
    data = json.loads(out.read_text())
    assert [m["name"] for m in data["measurements"]] == [
        "import terrarium",
        "terrarium --help",
        "terrarium list (fs, 2 sessions)",
        "terrarium list (fs, 3 sessions)",
        "terrarium stats (fs, 3 sessions)",
        "terrarium list (sqlite, 2 sessions)",
        "terrarium list (sqlite, 3 sessions)",
        "terrarium stats (sqlite, 3 sessions)",
    ]
    assert all(m["wall"] > 0 and m["ratio"] > 0 for m in data["measurements"])
    assert len(data["targets"]) == 5
    assert {t["verdict"] for t in data["targets"]} <= {"PASS", "FAIL"}
    assert not list(tmp_path.glob("bench-cli-*")), "the temporary directory is left behind"
