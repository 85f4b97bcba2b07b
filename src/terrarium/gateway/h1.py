"""The gateway's plain Chat call upstream: one HTTP/1.1 POST on asyncio, its answer parsed by
httptools (the C parser uvicorn serves with), over a pool of keep-alive connections.

Measured (``benchmarks/bench_upstream_client.py``, ``docs/architecture.md``): posting a
1,000-message history and reading the answer took a median 2.5 ms of CPU through httpx,
1.6 ms through httpcore's pool, 0.9 ms through aiohttp's ``ClientSession`` and 0.3 ms here.
httpx's layers (auth, redirects, request and response models, anyio streams, h11) are what
most of that difference is; the bytes on the wire are the same.

What it keeps of a full client: one timeout for connecting and for each piece of the answer
(:class:`UpstreamTimeout`); a connection the server closed while it sat idle is never used,
and a request on a reused connection that the server closed before answering a byte is sent
once more on a new one (the keep-alive race every HTTP client meets); answers with a
``Content-Length``, chunked or ended by closing the connection; https through the default
SSL context of the HTTP package the openai client uses. Streams, ``/models`` and a proxy from
the environment stay with the openai client (``gateway/upstream.py``).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from typing import cast
from urllib.parse import urlsplit

import httptools


class UpstreamTimeout(TimeoutError):
    """The server took longer than the timeout to connect or to send the next piece."""


class UpstreamClosed(ConnectionError):
    """The server closed the connection before its answer was complete."""


MAX_IDLE = 100
"""Idle connections kept for reuse, as the openai client's pool keeps them."""
MAX_CONNECTIONS = 1000
"""Connections open at once, as the openai client's pool allows; more requests wait."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection, answering one request at a time."""

    def __init__(self, timeout: float) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.timeout = timeout
        self.closed = False
        self.received = False
        """Whether any byte of the current answer arrived (see :meth:`Pool.post`)."""
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._body: list[bytes] = []
        self._until_eof = True
        self.status = 0
        self.keep_alive = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            self.close()  # nothing was asked: a server that talks out of turn is not reused
            return
        self.received = True
        self._arm()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._finish(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            ended = self.status and self._until_eof  # an answer whose end is the close
            self._finish(None if ended else UpstreamClosed("the connection closed mid-answer"))

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._until_eof = False

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        self._finish(None)

    # requests

    async def request(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        """Send one request; its status and body."""
        assert self.transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self._body, self.status, self.received, self._until_eof = [], 0, False, True
        self.transport.writelines((head, body))
        self._arm()
        try:
            await self._waiter
        finally:
            if self._timer is not None:
                self._timer.cancel()
        return self.status, b"".join(self._body)

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(self.timeout, self._expire)

    def _expire(self) -> None:
        self._finish(UpstreamTimeout(f"no answer in {self.timeout:g} s"))
        self.close()

    def _finish(self, error: BaseException | None) -> None:
        if self._waiter is not None and not self._waiter.done():
            if error is None:
                self._waiter.set_result(None)
            else:
                self._waiter.set_exception(error)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Pool:
    """POST requests to one server, ``url``'s scheme, host and port, over pooled connections.

    ``headers`` go with every request (the key, the client's own headers); ``timeout`` bounds
    connecting and each wait for the next piece of an answer.
    """

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        timeout: float,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http:// or https:// URL: {url}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = (
            (ssl_context or ssl.create_default_context()) if parts.scheme == "https" else None
        )
        self.timeout = timeout
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        sent = {k: v for k, v in headers.items() if k.lower() not in _OWN_HEADERS}
        if any(c in k + v for k, v in sent.items() for c in "\r\n"):
            raise ValueError("an upstream header (or the upstream key) holds a line break")
        host = f"[{self.host}]" if ":" in self.host else self.host
        lines = [f"POST {self.path} HTTP/1.1", f"Host: {host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in sent.items()]
        self._head = ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1")
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)

    async def post(self, body: bytes) -> tuple[int, bytes]:
        """POST ``body`` (JSON) to the URL's path; the answer's status and body."""
        async with self._slots:
            return await self._post(self._head + b"%d\r\n\r\n" % len(body), body)

    async def _post(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        while self._idle:
            conn = self._idle.pop()
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                continue
            try:
                return await self._send(conn, head, body)
            except UpstreamClosed:
                if conn.received:
                    raise
                # The server closed this idle connection as it was reused: try a new one.
        return await self._send(await self._open(), head, body)

    async def _send(self, conn: _Connection, head: bytes, body: bytes) -> tuple[int, bytes]:
        try:
            answer = await conn.request(head, body)
        except BaseException:
            conn.close()
            raise
        if conn.keep_alive and not conn.closed and len(self._idle) < MAX_IDLE:
            self._idle.append(conn)
        else:
            conn.close()
        return answer

    async def _open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self.timeout),
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl else None,
                )
        except TimeoutError:
            raise UpstreamTimeout(f"cannot connect in {self.timeout:g} s") from None
        return conn

    def close(self) -> None:
        """Close the idle connections."""
        while self._idle:
            self._idle.pop().close()


_OWN_HEADERS = frozenset(("host", "content-length", "connection", "accept-encoding"))
"""Headers the pool writes itself, or leaves out: it asks for no compression."""
