"""The gateway's plain Chat call client (``gateway/h1.py``) against scripted servers: the
answer framings it reads, connections kept and dropped, the keep-alive race, timeouts; and
when the gateway leaves the call to the openai client's own HTTP client (a proxy)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

h1 = pytest.importorskip("terrarium.gateway.h1", reason="httptools is not installed")

from terrarium.gateway.upstream import Upstream, proxied  # noqa: E402

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]
"""Reads one request on a connection and answers it; False closes the connection after."""

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    return await reader.readexactly(length)


def serve(answer: Answer, calls: int, **pool: Any) -> tuple[list[tuple[int, bytes]], list[int]]:
    """Make ``calls`` posts through a new :class:`h1.Pool` to a server answering with
    ``answer``; the answers, and how many requests each connection the server accepted took."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(0)
        at = len(connections) - 1
        try:
            while True:
                await read_request(reader)
                connections[at] += 1
                if not await answer(reader, writer, connections[at]):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def run() -> list[tuple[int, bytes]]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = h1.Pool(f"http://127.0.0.1:{port}/v1/chat/completions", {}, **pool)
        try:
            return [await client.post(b'{"n": %d}' % n) for n in range(calls)]
        finally:
            client.close()
            server.close()
            await server.wait_closed()

    return asyncio.run(run()), connections


def test_answers_by_length_chunked_and_by_close_are_read_whole() -> None:
    async def chunked(reader: Any, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b'3\r\n{"a\r\n5\r\n": 1}\r\n0\r\n\r\n')
        return True

    answers, connections = serve(chunked, 3, timeout=5)
    assert answers == [(200, b'{"a": 1}')] * 3
    assert connections == [3]  # one connection kept for all three

    async def until_close(reader: Any, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b'HTTP/1.1 503 Busy\r\nConnection: close\r\n\r\n{"error": "busy"}')
        return False

    answers, connections = serve(until_close, 2, timeout=5)
    assert answers == [(503, b'{"error": "busy"}')] * 2
    assert connections == [1, 1]


def test_a_connection_the_server_closed_is_not_used_again() -> None:
    """The server closes each connection after its answer, as one at its keep-alive limit
    does; and one closes a reused connection as the request arrives (the keep-alive race):
    the request goes once more on a new connection. A new connection closed unanswered is
    an error, not retried."""

    async def one_each(reader: Any, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(OK)
        await writer.drain()
        return False

    answers, connections = serve(one_each, 3, timeout=5)
    assert answers == [(200, b"{}")] * 3 and connections == [1, 1, 1]

    async def race(reader: Any, writer: asyncio.StreamWriter, n: int) -> bool:
        if n == 2:  # the second request on a connection: closed without a byte
            return False
        writer.write(OK)
        return True

    answers, connections = serve(race, 3, timeout=5)
    assert answers == [(200, b"{}")] * 3
    assert connections == [2, 2, 1]  # each second request went again, on a new connection

    async def never(reader: Any, writer: asyncio.StreamWriter, n: int) -> bool:
        return False

    with pytest.raises(h1.UpstreamClosed):
        serve(never, 1, timeout=5)


def test_a_server_that_stops_answering_times_out() -> None:
    async def stalls(reader: Any, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{")
        await reader.read()  # until the client gives up and closes
        return False

    with pytest.raises(h1.UpstreamTimeout):
        serve(stalls, 1, timeout=0.3)


def test_a_refused_connection_is_an_os_error() -> None:
    async def run() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        await h1.Pool(f"http://127.0.0.1:{port}/v1", {}, timeout=5).post(b"{}")

    with pytest.raises(OSError):
        asyncio.run(run())


def test_a_proxy_in_the_environment_leaves_the_call_to_the_openai_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert not proxied("http://10.1.2.3:8000/v1/chat/completions")
    assert Upstream("http://10.1.2.3:8000/v1").pool is not None
    monkeypatch.setenv("http_proxy", "http://proxy.example:3128")
    assert proxied("http://10.1.2.3:8000/v1/chat/completions")
    assert Upstream("http://10.1.2.3:8000/v1").pool is None
    monkeypatch.setenv("no_proxy", "10.1.2.3")
    assert not proxied("http://10.1.2.3:8000/v1/chat/completions")


def test_an_upstream_key_with_a_line_break_is_refused_in_one_line(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from terrarium.cli import cli

    monkeypatch.setenv("TERRARIUM_UPSTREAM_API_KEY", "key\r\nX-Injected: 1")
    where = ["--storage-dir", str(tmp_path / "s"), "--upstream", "http://127.0.0.1:9/v1"]
    result = CliRunner().invoke(cli, ["gateway", *where])
    assert result.exit_code == 1
    assert result.output.strip() == (
        "Error: an upstream header (or the upstream key) holds a line break"
    )
