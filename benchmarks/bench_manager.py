"""Benchmark the MultiContextManager: its own work per turn, and concurrent throughput.

Run: ``.venv/bin/python benchmarks/bench_manager.py`` (``--quick`` for a smoke run).

1. Manager work per turn at 100, 1k and 10k messages of history: everything but the HTTP
   exchange (cache check, building the request, persisting the turn). The model is an
   in-process stand-in with the VLLMClient interface that answers at once, so the time
   measured is the manager's alone. For reference, the same turn over real HTTP against the
   test server (tests/fakeserver.py) that answers at once is timed too.
2. Throughput: 50 contexts served concurrently against a server that takes 200 ms per reply,
   in turns per second. The seed's sequential design gets 1 / 0.2 s = 5 turns/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from fakeserver import FakeServer  # noqa: E402
from terrarium import FsStore, restore  # noqa: E402
from terrarium.agent.multi_context_manager import MultiContextManager  # noqa: E402
from terrarium.errors import LLMError  # noqa: E402
from terrarium.llm.vllm_client import ChatResult, StreamEvent, VLLMClient  # noqa: E402
from terrarium.model import ContextId, UsageRecord, utc_now  # noqa: E402
from terrarium.sessions import create_segment  # noqa: E402
from terrarium.stores.base import NewEntry, Store  # noqa: E402


class InstantClient:
    """The VLLMClient interface, answering at once in process: isolates the manager's work."""

    on_trace = None

    async def chat(self, messages: Sequence[Mapping[str, Any]], **params: Any) -> ChatResult:
        text = "ok " + str(len(messages))
        return ChatResult(
            message={"role": "assistant", "content": text},
            text=text,
            usage=UsageRecord("instant", len(messages), 2, 0),
            finish_reason="stop",
            model="instant",
        )

    async def stream(
        self, messages: Sequence[Mapping[str, Any]], **params: Any
    ) -> AsyncIterator[StreamEvent]:
        result = await self.chat(messages)
        yield StreamEvent(delta=result.text)
        yield StreamEvent(result=result)

    async def aclose(self) -> None:
        return None


def prefill(store: Store, context: str, messages: int) -> None:
    """Give ``context`` a history of ``messages`` realistic messages (~370-byte lines)."""
    create_segment(store, None, context=context)
    head = store.get_head(ContextId.parse(context))
    assert head is not None
    text = "lorem ipsum dolor sit amet " * 11
    batch: list[NewEntry] = []
    for i in range(messages):
        role = "user" if i % 2 == 0 else "assistant"
        kind = "user_input" if role == "user" else "item"
        batch.append(NewEntry(kind, utc_now(), {"item": {"role": role, "content": text}}))
        if len(batch) == 1000:
            store.append(head.session_id, head.segment_id, batch)
            batch = []
    if batch:
        store.append(head.session_id, head.segment_id, batch)


async def manager_work(
    history: int, turns: int, root: Path, store: Store | None = None
) -> list[float]:
    """Per-turn wall time (µs) of the manager with an instant in-process model, on ``store``
    (closed afterwards; default a filesystem store in ``root``)."""
    store = store if store is not None else FsStore(root)
    context = f"cli:h{history}"
    prefill(store, context, history)
    manager = MultiContextManager(InstantClient(), store=store)  # type: ignore[arg-type]
    await manager.process_with_context(context, "warm up")  # restores once, fills the cache
    samples = []
    for i in range(turns):
        start = time.perf_counter_ns()
        await manager.process_with_context(context, f"question {i}")
        samples.append((time.perf_counter_ns() - start) / 1000)
    assert len(restore(store, context).history) == history + 2 * (turns + 1)
    manager.close()
    store.close()
    return samples


async def http_turn(history: int, turns: int, root: Path, server: FakeServer) -> list[float]:
    """Per-turn wall time (µs) over real HTTP against a server that answers at once."""
    store = FsStore(root)
    context = f"cli:http{history}"
    prefill(store, context, history)
    client = VLLMClient(base_url=server.base_url, max_retries=0)
    manager = MultiContextManager(client, store=store)
    await manager.process_with_context(context, "warm up")
    samples = []
    for i in range(turns):
        start = time.perf_counter_ns()
        await manager.process_with_context(context, f"question {i}")
        samples.append((time.perf_counter_ns() - start) / 1000)
    await manager.aclose()
    store.close()
    return samples


async def throughput(
    contexts: int, turns: int, delay: float, root: Path
) -> tuple[float, float, int]:
    """Turns per second with ``contexts`` conversations at once against a slow server, and
    what the server alone allows (the same load from a bare HTTP client).

    The server runs in its own process, as a model server would, so it does not share this
    process's interpreter lock with the manager.
    """
    port = _free_port()
    server = subprocess.Popen(  # noqa: ASYNC220 - started once, before the measurement
        [
            sys.executable,
            str(ROOT / "tests" / "fakeserver.py"),
            "--port",
            str(port),
            "--delay",
            str(delay),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        client = VLLMClient(
            base_url=f"http://127.0.0.1:{port}/v1", max_retries=5, backoff_base=0.05
        )
        await _wait_until_up(client)
        floor = await _bare_client_rate(port, contexts, turns)
        # A cache that holds every context served: with the default 10 each of the 50
        # contexts is evicted between its turns and restored from the log on the next.
        manager = MultiContextManager(
            client, storage_dir=str(root), max_concurrency=contexts, cache_size=contexts
        )

        async def converse(n: int) -> None:
            for t in range(turns):
                await manager.process_with_context(f"web:t{n}", f"turn {t}")

        start = time.perf_counter()
        await asyncio.gather(*(converse(n) for n in range(contexts)))
        elapsed = time.perf_counter() - start
        await manager.aclose()
    finally:
        server.terminate()
        server.wait()
    return contexts * turns / elapsed, floor, contexts * turns


async def _bare_client_rate(port: int, contexts: int, turns: int) -> float:
    """Requests per second the server answers to ``contexts`` keep-alive connections of a
    bare HTTP/1.1 client (a fixed request, no JSON parsing): the most any client can get
    from it here. Close to ``contexts / delay`` means the server is not the bottleneck."""
    body = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]})
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    ).encode()

    async def converse() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for _ in range(turns):
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                assert length is not None, head
                await reader.readexactly(int(length.group(1)))
        finally:
            writer.close()
            await writer.wait_closed()

    start = time.perf_counter()
    await asyncio.gather(*(converse() for _ in range(contexts)))
    return contexts * turns / (time.perf_counter() - start)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _wait_until_up(client: VLLMClient) -> None:
    for _ in range(200):
        try:
            await client.list_models()
            return
        except LLMError:
            await asyncio.sleep(0.05)  # the server process is still starting
    raise RuntimeError("the benchmark's model server did not start")


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    args = parser.parse_args(argv)
    sizes = [100, 1000] if args.quick else [100, 1000, 10000]
    turns = 20 if args.quick else 300
    conc_turns, delay = (2, 0.05) if args.quick else (10, 0.2)

    print("Manager work per turn (in-process instant model; FsStore, durability=flush)")
    print(f"{'history':>8} {'median µs':>10} {'p95 µs':>8} {'http median µs':>15}")
    medians = {}
    with tempfile.TemporaryDirectory() as tmp, FakeServer() as server:
        for size in sizes:
            work = asyncio.run(manager_work(size, turns, Path(tmp) / f"w{size}"))
            http = asyncio.run(http_turn(size, turns // 2, Path(tmp) / f"h{size}", server))
            medians[size] = statistics.median(work)
            print(
                f"{size:>8} {medians[size]:>10.0f} {pct(work, 0.95):>8.0f}"
                f" {statistics.median(http):>15.0f}"
            )
    flat = max(medians.values()) / min(medians.values())
    biggest = medians[sizes[-1]]
    verdict = "PASS" if biggest < 1000 else "FAIL"
    print(
        f"target: < 1000 µs at {sizes[-1]} messages, flat: {biggest:.0f} µs, "
        f"max/min over sizes {flat:.2f}x -> {verdict}"
    )

    with tempfile.TemporaryDirectory() as tmp:
        rate, floor, total = asyncio.run(throughput(50, conc_turns, delay, Path(tmp)))
    ideal = 50 / delay
    print(
        f"Throughput: 50 contexts x {conc_turns} turns, server {delay * 1000:.0f} ms/reply: "
        f"{rate:.1f} turns/s ({rate / ideal:.0%} of the ideal {ideal:.0f}/s; "
        f"sequential: {1 / delay:.0f}/s) over {total} turns"
    )
    print(
        f"The server alone (a bare HTTP client, same load): {floor:.1f} requests/s "
        f"({floor / ideal:.0%} of the ideal)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
