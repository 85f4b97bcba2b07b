"""Client CPU of the gateway's plain Chat call upstream, one HTTP client against another.

Each client posts the same ``--messages``-message Chat body (encoded once, before the clock)
to the test model server (tests/fakeserver.py, in a child process so its CPU is not counted)
and decodes the answer with msgspec, as ``gateway/upstream.py`` does. The clients run in this
one process, interleaved call by call (the order reversed every round), each on one client
object kept open throughout: ``gateway/h1.py``'s ``Pool``, aiohttp's ``ClientSession``, httpx's
``AsyncClient`` and httpcore's ``AsyncConnectionPool`` (those not installed are left out). It
prints the median CPU (user and system, ``getrusage``) and wall time per call.

    python benchmarks/bench_upstream_client.py                   # 500 calls each, uvloop
    python benchmarks/bench_upstream_client.py --loop asyncio
    python benchmarks/bench_upstream_client.py --quick           # 5 calls (the smoke test)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_stores import Report  # noqa: E402

Call = Callable[[], Awaitable[Any]]
DECODER = msgspec.json.Decoder()
HEADERS = {
    "Authorization": "Bearer EMPTY",
    "User-Agent": "AsyncOpenAI/Python bench",
    "Content-Type": "application/json",
    "Accept": "application/json",
}
SERVER = f"""
import sys
sys.path.insert(0, {str(ROOT / "tests")!r})
from fakeserver import FakeServer
with FakeServer() as fake:
    print(fake.base_url, flush=True)
    sys.stdin.read()
"""


def chat_body(messages: int) -> bytes:
    """A Chat body with ``messages`` messages, as the gateway's benchmark grows them."""
    history: list[dict[str, str]] = []
    for n in range(messages // 2):
        history.append({"role": "user", "content": f"q{n}"})
        history.append({"role": "assistant", "content": f"echo: q{n}"})
    return msgspec.json.encode({"model": "fake-model", "messages": history})


async def clients(url: str, body: bytes, stack: AsyncExitStack) -> dict[str, Call]:
    """One call per installed client, each on a client object closed with ``stack``."""
    calls: dict[str, Call] = {}
    if importlib.util.find_spec("httptools"):
        from terrarium.gateway.h1 import Pool

        pool = Pool(url, HEADERS, 600.0)
        stack.callback(pool.close)

        async def h1() -> Any:
            status, data = await pool.post(body)
            return status, DECODER.decode(data)

        calls["h1.Pool"] = h1
    if importlib.util.find_spec("aiohttp"):
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=None, sock_connect=600, sock_read=600)
        session = await stack.enter_async_context(
            aiohttp.ClientSession(headers=HEADERS, timeout=timeout)
        )

        async def aio() -> Any:
            async with session.post(url, data=body) as reply:
                return reply.status, DECODER.decode(await reply.read())

        calls["aiohttp ClientSession"] = aio
    calls.update(await _httpx_clients(url, body, stack))
    return calls


async def _httpx_clients(url: str, body: bytes, stack: AsyncExitStack) -> dict[str, Call]:
    import httpcore
    import httpx

    client = await stack.enter_async_context(httpx.AsyncClient(headers=HEADERS, timeout=600))
    pool = await stack.enter_async_context(httpcore.AsyncConnectionPool())
    raw_headers = list(HEADERS.items())

    async def via_httpx() -> Any:
        reply = await client.post(url, content=body)
        return reply.status_code, DECODER.decode(reply.content)

    async def via_httpcore() -> Any:
        reply = await pool.request("POST", url, headers=raw_headers, content=body)
        return reply.status, DECODER.decode(reply.content)

    return {"httpx AsyncClient": via_httpx, "httpcore AsyncConnectionPool": via_httpcore}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure(url: str, body: bytes, calls: int, report: Report) -> None:
    """``calls`` calls per client, interleaved; a row of medians per client."""
    async with AsyncExitStack() as stack:
        chosen = await clients(url, body, stack)
        for call in chosen.values():  # connect and warm up
            for _ in range(10):
                status, answer = await call()
                assert status == 200 and answer["choices"], (status, answer)
        cpu: dict[str, list[float]] = {name: [] for name in chosen}
        wall: dict[str, list[float]] = {name: [] for name in chosen}
        names = list(chosen)
        for n in range(calls):
            for name in names if n % 2 == 0 else names[::-1]:
                start, used = time.perf_counter(), _cpu()
                await chosen[name]()
                cpu[name].append(_cpu() - used)
                wall[name].append(time.perf_counter() - start)
    for name in names:
        report.row(f"{name}: CPU median", f"{statistics.median(cpu[name]) * 1e3:.3f} ms")
        report.row(f"{name}: wall median", f"{statistics.median(wall[name]) * 1e3:.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 calls each (the smoke test)")
    parser.add_argument("--calls", type=int, default=500, help="calls per client")
    parser.add_argument("--messages", type=int, default=1000, help="messages in the body")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = parser.parse_args()
    if args.loop == "uvloop" and importlib.util.find_spec("uvloop"):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    body = chat_body(args.messages)
    print(f"{args.messages} messages, {len(body):,} bytes, {args.loop} loop", flush=True)
    command = [sys.executable, "-c", SERVER]
    with subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as server:
        assert server.stdout is not None and server.stdin is not None
        url = f"{server.stdout.readline().strip()}/chat/completions"
        report = Report()
        try:
            asyncio.run(measure(url, body, 5 if args.quick else args.calls, report))
        finally:
            server.stdin.close()
    print("\nResults\n" + report.table())


if __name__ == "__main__":
    main()
