"""The gateway benchmark runs end to end at tiny sizes. No timing is asserted: that is its job."""

from __future__ import annotations

from pathlib import Path

from helpers.bench import run_bench


def test_bench_gateway_quick_run(tmp_path: Path) -> None:
    """benchmarks/bench_gateway.py --quick measures every figure and checks every chain."""
    result = run_bench("bench_gateway.py", "--quick", tmp=tmp_path)
    table = result.stdout.split("Results", 1)[-1]
    for measure in (
        "10 messages: added median",
        "10 messages: test server's own time median",
        "10 messages: added median / server's own",
        "10 messages: added p99",
        "first streamed token: gateway median",
        "concurrent conversations: gateway requests/s",
    ):
        assert measure in table, measure
    assert "| lost or misordered turns" in table and "PASS" in table.split("misordered")[1]
    assert not list(tmp_path.glob("bench-gateway-*")), "the temporary directory is left behind"
