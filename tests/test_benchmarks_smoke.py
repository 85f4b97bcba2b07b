"""The log benchmark runs end to end at tiny sizes. No timing is asserted: that is its job."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from helpers.bench import run_bench

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_log.py"


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_log", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def test_bench_log_quick_run(tmp_path: Path) -> None:
    """In a child interpreter, as the other smoke tests run theirs: the benchmark collects
    garbage before each timing, which in this process's heap (the whole suite's objects)
    costs seconds a call."""
    out = tmp_path / "results.json"

    table = run_bench("bench_log.py", "--quick", "--sizes", "20,50", "--json", str(out)).stdout
    for heading in ("Append one message", "Restore", "Bytes on disk", "Decode", "Targets"):
        assert heading in table
    results = json.loads(out.read_text())
    names = {(m["name"], m["size"]) for m in results["measurements"]}
    for size in (20, 50):
        for name in (
            "append_flush",
            "store_append",
            "append_fsync",
            "raw_fdatasync",
            "restore",
            "restore_floor",
            "bytes",
        ):
            assert (name, size) in names
        assert ("naive_json_append", size) in names
    assert ("restore_compacted", 50) in names
    assert {t["verdict"] for t in results["targets"]} <= {"PASS", "FAIL", "SKIP"}
    assert ("locked_write", None) in names
    assert len(results["targets"]) == 7


def test_parse_sizes() -> None:
    bench = load_bench()
    assert bench.parse_sizes("1k,10000,100k") == (1000, 10000, 100000)
    assert bench.parse_sizes("50,20,50") == (20, 50)
