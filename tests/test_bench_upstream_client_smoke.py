"""The upstream client benchmark runs end to end at tiny sizes. No timing is asserted."""

from __future__ import annotations

import importlib.util

from helpers.bench import run_bench


def test_bench_upstream_client_quick_run() -> None:
    """benchmarks/bench_upstream_client.py --quick measures every installed client."""
    result = run_bench("bench_upstream_client.py", "--quick")
    table = result.stdout.split("Results", 1)[-1]
    expected = ["httpx AsyncClient", "httpcore AsyncConnectionPool"]
    if importlib.util.find_spec("httptools"):
        expected.append("h1.Pool")
    if importlib.util.find_spec("aiohttp"):
        expected.append("aiohttp ClientSession")
    for client in expected:
        assert f"| {client}: CPU median" in table, client
        assert f"| {client}: wall median" in table, client
