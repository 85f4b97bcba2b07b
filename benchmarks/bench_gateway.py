"""What ``terrarium gateway`` adds in front of a model server, in one run against the test
model server (tests/fakeserver.py) directly and through the gateway:

* added latency per request (median and p99) at 10 and 1,000 messages of history: a
  ``POST /v1/responses`` continuing the newest response, against the same conversation's
  ``POST /v1/chat/completions`` sent straight to the server (its body encoded before the
  clock starts: the json module's time is the client's, not the path's), the two alternated;
  beside it
  the test server's own time per request (``FakeServer.chat_times``), a yardstick of the
  machine: the added median over it says how many of the server's requests the gateway costs;
* time to first streamed token, through the gateway and straight;
* requests per second with 50 concurrent conversations (each a chain of responses), and the
  check that no turn was lost or misordered (each chain replayed from the store afterwards).

The gateway runs as ``terrarium gateway`` in a child process on a filesystem store (or
``--storage``), the fake server in this process, the clients are plain ``httpx``.

    python benchmarks/bench_gateway.py
    python benchmarks/bench_gateway.py --quick     # tiny sizes: the smoke test runs this
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_stores import Report  # noqa: E402
from fakeserver import FakeServer  # noqa: E402
from terrarium.model import ContextId, item_text  # noqa: E402
from terrarium.sessions import restore  # noqa: E402
from terrarium.stores.url import open_store  # noqa: E402

MODEL = "fake-model"
JSON_TYPE = {"content-type": "application/json"}


@contextmanager
def gateway(storage: str, upstream: str) -> Iterator[str]:
    """``terrarium gateway`` in a child process; yields its ``/v1`` URL."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    command = [sys.executable, "-m", "terrarium", "gateway", "--storage-dir", storage]
    command += ["--upstream", upstream, "--port", "0"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) as proc:
        try:
            assert proc.stdout is not None
            yield proc.stdout.readline().split()[3]
        finally:
            proc.terminate()
            proc.wait(10)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * 0.99))]


def grow(client: httpx.Client, url: str, messages: int) -> tuple[str, list[dict[str, Any]]]:
    """A chain of responses holding ``messages`` messages; its last id and Chat history."""
    previous: str | None = None
    history: list[dict[str, Any]] = []
    for n in range(messages // 2):
        text = f"message {n} " + "lorem ipsum " * 8
        body = {"model": MODEL, "input": text, "previous_response_id": previous}
        answer = client.post(f"{url}/responses", json=body).json()
        previous = answer["id"]
        history += [{"role": "user", "content": text}, {"role": "assistant", "content": "x"}]
    assert previous is not None
    return previous, history


def last_chat_time(fake: FakeServer) -> float:
    """The server's own time for the last chat request: its thread records it after the
    answer is written, so the client may have the answer first."""
    deadline = time.monotonic() + 5
    while len(fake.chat_times) < len(fake.requests) and time.monotonic() < deadline:
        time.sleep(0.0001)
    return fake.chat_times[-1]


def added_latency(
    report: Report, client: httpx.Client, url: str, fake: FakeServer, size: int, repeat: int
) -> None:
    """Gateway against direct at ``size`` messages of history."""
    previous, _ = grow(client, url, size)
    through: list[float] = []
    direct: list[float] = []
    server: list[float] = []
    for n in range(repeat):
        body = {"model": MODEL, "input": f"q{n}", "previous_response_id": previous}
        start = time.perf_counter()
        answer = client.post(f"{url}/responses", json=body).json()
        through.append(time.perf_counter() - start)
        previous = answer["id"]
        # Encoded before the clock starts, as the gateway's body is: encoding 1,000 messages
        # with the json module took longer than the gateway's whole added time.
        data = json.dumps({"model": MODEL, "messages": fake.last_request["messages"]}).encode()
        start = time.perf_counter()
        client.post(f"{fake.base_url}/chat/completions", content=data, headers=JSON_TYPE)
        direct.append(time.perf_counter() - start)
        server.append(last_chat_time(fake))
    added = statistics.median(through) - statistics.median(direct)
    own = statistics.median(server)
    report.row(f"{size} messages: test server's own time median", ms(own))
    report.row(f"{size} messages: direct median", ms(statistics.median(direct)))
    report.row(f"{size} messages: gateway median", ms(statistics.median(through)))
    report.row(
        f"{size} messages: added median",
        ms(added),
        "<= 2 ms" if size >= 1000 else "",
        added <= 0.002 if size >= 1000 else None,
    )
    report.row(f"{size} messages: added median / server's own", f"{added / own:.2f}")
    report.row(f"{size} messages: added p99", ms(p99(through) - p99(direct)))


def first_token(
    report: Report, client: httpx.Client, url: str, fake: FakeServer, repeat: int
) -> None:
    """Time to the first streamed text, through the gateway and straight."""
    through: list[float] = []
    direct: list[float] = []
    for n in range(repeat):
        body = {"model": MODEL, "input": f"stream {n}", "stream": True}
        start = time.perf_counter()
        with client.stream("POST", f"{url}/responses", json=body) as answer:
            lines = answer.iter_lines()
            for line in lines:
                if "response.output_text.delta" in line and line.startswith("data:"):
                    through.append(time.perf_counter() - start)
                    break
            for _ in lines:
                pass
        chat = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "s"}]}
        start = time.perf_counter()
        with client.stream("POST", f"{fake.base_url}/chat/completions", json=chat) as answer:
            lines = answer.iter_lines()
            for line in lines:
                if '"content": "e' in line:
                    direct.append(time.perf_counter() - start)
                    break
            for _ in lines:
                pass
    report.row("first streamed token: direct median", ms(statistics.median(direct)))
    report.row("first streamed token: gateway median", ms(statistics.median(through)))


async def _chain(client: httpx.AsyncClient, url: str, name: int, turns: int) -> list[str]:
    previous = None
    ids = []
    for turn in range(turns):
        body = {"model": MODEL, "input": f"c{name} t{turn}", "previous_response_id": previous}
        answer = await client.post(f"{url}/responses", json=body)
        answer.raise_for_status()
        previous = answer.json()["id"]
        ids.append(previous)
    return ids


async def _direct_chain(client: httpx.AsyncClient, url: str, name: int, turns: int) -> None:
    messages: list[dict[str, Any]] = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"c{name} t{turn}"})
        answer = await client.post(
            f"{url}/chat/completions", json={"model": MODEL, "messages": messages}
        )
        answer.raise_for_status()
        messages.append(answer.json()["choices"][0]["message"])


async def _direct(url: str, conversations: int, turns: int) -> float:
    limits = httpx.Limits(max_connections=conversations)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        start = time.perf_counter()
        await asyncio.gather(*(_direct_chain(client, url, n, turns) for n in range(conversations)))
        return time.perf_counter() - start


async def _concurrent(url: str, conversations: int, turns: int) -> tuple[float, list[list[str]]]:
    limits = httpx.Limits(max_connections=conversations)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        start = time.perf_counter()
        chains = await asyncio.gather(
            *(_chain(client, url, n, turns) for n in range(conversations))
        )
        return time.perf_counter() - start, list(chains)


def throughput(
    report: Report, url: str, fake: FakeServer, storage: str, conversations: int, turns: int
) -> None:
    """Requests per second with many conversations at once, through the gateway and
    straight; then every chain checked."""
    direct = asyncio.run(_direct(fake.base_url, conversations, turns))
    elapsed, chains = asyncio.run(_concurrent(url, conversations, turns))
    requests = conversations * turns
    report.row(
        f"{conversations} concurrent conversations: direct requests/s", f"{requests / direct:.0f}"
    )
    report.row(
        f"{conversations} concurrent conversations: gateway requests/s", f"{requests / elapsed:.0f}"
    )
    wrong = 0
    with open_store(storage, create=False) as store:
        for n, ids in enumerate(chains):
            state = restore(store, ContextId("resp", ids[-1][6:32]))
            texts = [item_text(item) for item in state.history]
            expected = [
                t for turn in range(turns) for t in (f"c{n} t{turn}", f"echo: c{n} t{turn}")
            ]
            wrong += texts != expected
    report.row("lost or misordered turns", str(wrong), "0", wrong == 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (the smoke test)")
    parser.add_argument("--storage", help="a store URL (default: a temporary folder)")
    parser.add_argument("--repeat", type=int, default=300, help="requests per latency figure")
    args = parser.parse_args()
    sizes, repeat = ((10, 40), 5) if args.quick else ((10, 1000), args.repeat)
    conversations, turns = (5, 3) if args.quick else (50, 20)
    report = Report()
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        storage = args.storage or str(Path(tmp) / "sessions")
        with FakeServer(chunks=8) as fake, gateway(storage, fake.base_url) as url:
            with httpx.Client(timeout=60) as client:
                for size in sizes:
                    added_latency(report, client, url, fake, size, repeat)
                first_token(report, client, url, fake, repeat)
            throughput(report, url, fake, storage, conversations, turns)
    print("\nResults\n")
    print(report.table())


if __name__ == "__main__":
    main()
