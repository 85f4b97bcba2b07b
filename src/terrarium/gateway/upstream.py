"""The model server behind the gateway, through the official ``openai`` client, and the
errors the gateway answers with, shaped as OpenAI shapes them.

Streams and ``/models`` go out with the client's ``post`` and ``get`` (its documented way to
make custom requests), so a Chat Completions body passes through with every key the client
sent, known to the ``openai`` package or not. A plain Chat call, the gateway's hot path, is
posted by :class:`~terrarium.gateway.h1.Pool` with the client's headers, key and timeout, and
its answer read by msgspec: the client's request machinery cost more than the rest of the
gateway's own work (``docs/architecture.md``). With a proxy in the environment for the
upstream (or without httptools), the plain call goes out on the client's own HTTP client. No
call is retried (but a request the server never read: ``gateway/h1.py``): a retry is the
gateway client's call, and a failed turn is logged once.
"""

from __future__ import annotations

import importlib
import inspect
import urllib.request
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import msgspec
import openai

try:
    from terrarium.gateway.h1 import Pool, UpstreamTimeout
except ImportError:  # httptools missing (an install older than the 'web' extra's list)
    Pool = None  # type: ignore[assignment,misc]
    UpstreamTimeout = TimeoutError  # type: ignore[assignment,misc]

_STATUS_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


class GatewayError(Exception):
    """An error the gateway answers with: an HTTP status and OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _STATUS_TYPES.get(status, "server_error")
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None) -> GatewayError:
    """HTTP 400 naming the parameter at fault."""
    return GatewayError(400, message, param=param, code="invalid_value" if param else None)


def not_found(message: str, param: str | None = None) -> GatewayError:
    """HTTP 404."""
    return GatewayError(404, message, param=param, code="not_found")


def upstream_error(exc: BaseException, url: str) -> GatewayError:
    """What the client is told when the model server failed: its own 4xx as it said it;
    its 5xx, a refused connection or a bad reply as 502; a timeout as 504."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, openai.APIStatusError):
        return status_error(exc.status_code, exc.body, str(exc))
    if isinstance(exc, openai.APITimeoutError | _HTTP.TimeoutException | UpstreamTimeout):
        return GatewayError(
            504, f"the model server at {url} timed out", type="upstream_error", code="timeout"
        )
    if isinstance(exc, openai.APIConnectionError | _HTTP.TransportError | OSError):
        return GatewayError(
            502,
            f"cannot reach the model server at {url}: {exc.__cause__ or exc}",
            type="upstream_error",
            code="upstream_unreachable",
        )
    return GatewayError(
        502,
        f"the model server at {url} sent a reply that could not be read: "
        f"{type(exc).__name__}: {exc}",
        type="upstream_error",
        code="bad_upstream_reply",
    )


def status_error(status: int, body: object, fallback: str) -> GatewayError:
    """The model server's error answer: its 4xx passed on as it said it, its 5xx as 502."""
    message = _message(body) or fallback
    if 400 <= status < 500:
        return GatewayError(status, message, code=_code(body))
    return GatewayError(
        502,
        f"the model server answered HTTP {status}: {message}",
        type="upstream_error",
        code="upstream_error",
    )


def dropped(cause: BaseException | None = None) -> GatewayError:
    """A stream the model server ended before its last chunk (502, ``upstream_dropped``)."""
    why = f": {cause}" if cause is not None and str(cause) else ""
    return GatewayError(
        502,
        f"the model server's stream ended before its last chunk{why}",
        type="upstream_error",
        code="upstream_dropped",
    )


def first_choice(answer: Mapping[str, Any], url: str) -> dict[str, Any]:
    """The first choice of a Chat answer, with a ``message`` object; a 502 when it has none."""
    choices = answer.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        raise upstream_error(ValueError("the answer has no choice with a message"), url)
    return choice


def _message(body: object) -> str | None:
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(body.get("message"), str):
            return str(body["message"])
    return None


def _code(body: object) -> str | None:
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping) and inner.get("code") is not None:
            return str(inner["code"])
    return None


# openai 1.99 to 2.x send a bytes ``body`` as it is; later releases take it as ``content``.
_POST_TAKES_CONTENT = "content" in inspect.signature(openai.AsyncOpenAI.post).parameters
# msgspec encodes a long history several times faster than the json module the client uses.
_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder()
# openai 3 sends through httpx2, earlier releases through httpx: the transport errors are
# those of the package its default HTTP client is built on.
_HTTP: Any = importlib.import_module(
    openai.DefaultAsyncHttpxClient.__mro__[1].__module__.partition(".")[0]
)


def _encoded(body: Mapping[str, Any]) -> dict[str, Any]:
    """The ``post`` keyword that sends ``body`` as JSON bytes, encoded once here."""
    data = _ENCODER.encode(body)
    return {"content": data} if _POST_TAKES_CONTENT else {"body": data}


class Upstream:
    """An OpenAI-compatible server (vLLM, llama.cpp, ...), reached at ``base_url``."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 600.0):
        self.url = base_url
        key = api_key or "EMPTY"
        self.http = openai.DefaultAsyncHttpxClient(timeout=timeout)
        """The client's HTTP client: the connection pool every call shares."""
        self.client = openai.AsyncOpenAI(
            base_url=base_url, api_key=key, max_retries=0, timeout=timeout, http_client=self.http
        )
        # Parsed once: a URL or headers given as text are parsed again on every request.
        self._chat_url = _HTTP.URL(f"{str(self.client.base_url).rstrip('/')}/chat/completions")
        # The client's own headers (user agent, platform), minus those it leaves out, and its
        # key, which openai 3 adds apart from them; the client's requests set them too.
        headers = {k: v for k, v in self.client.default_headers.items() if isinstance(v, str)}
        self.http.headers.update({**headers, "Authorization": f"Bearer {key}"})
        self.pool: Pool | None = None
        """The plain Chat call's connections; None with a proxy for the upstream, or
        without httptools (then the call goes on :attr:`http`)."""
        if Pool is not None and not proxied(str(self._chat_url)):
            https = self.url.startswith("https:")
            ssl_context = _HTTP.create_ssl_context() if https else None
            self.pool = Pool(str(self._chat_url), self.http.headers, timeout, ssl_context)

    async def chat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """One Chat Completions call; the server's JSON answer."""
        try:
            if self.pool is not None:
                status, data = await self.pool.post(_ENCODER.encode(body))
            else:
                reply = await self.http.post(self._chat_url, content=_ENCODER.encode(body))
                status, data = reply.status_code, reply.content
        except Exception as exc:
            raise upstream_error(exc, self.url) from exc
        try:
            answer = _DECODER.decode(data)
        except (msgspec.DecodeError, UnicodeDecodeError):
            answer = data.decode("utf-8", "replace")
            if status < 400:
                raise upstream_error(ValueError("the answer is not JSON"), self.url) from None
        if status >= 400:
            raise status_error(status, answer, f"HTTP {status}: {answer}")
        if not isinstance(answer, dict):
            raise upstream_error(ValueError("the answer is not a JSON object"), self.url)
        return answer

    async def stream(self, body: Mapping[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """A streamed Chat Completions call, opened here: a server that refuses it or cannot
        be reached raises at once, so that the client gets its HTTP status. Then each chunk as
        the server's JSON; a connection lost once the stream has begun is a drop
        (``upstream_dropped``), not a server that cannot be reached."""
        try:
            post: Any = self.client.post
            chunks = await post(
                "/chat/completions",
                cast_to=object,
                stream=True,
                stream_cls=openai.AsyncStream[object],
                **_encoded({**body, "stream": True}),
            )
        except Exception as exc:
            raise upstream_error(exc, self.url) from exc
        return self._chunks(chunks)

    async def _chunks(self, chunks: Any) -> AsyncIterator[dict[str, Any]]:
        try:
            async with chunks:
                async for chunk in chunks:
                    if isinstance(chunk, dict):
                        yield chunk
        except Exception as exc:
            error = upstream_error(exc, self.url)
            if error.code == "upstream_unreachable":
                error = dropped(exc.__cause__ or exc)
            raise error from exc

    async def models(self) -> Any:
        """The server's ``GET /models`` answer."""
        try:
            return await self.client.get("/models", cast_to=object)
        except Exception as exc:
            raise upstream_error(exc, self.url) from exc

    async def close(self) -> None:
        """Close the connection pools."""
        if self.pool is not None:
            self.pool.close()
        await self.client.close()


def proxied(url: str) -> bool:
    """Whether the environment names a proxy for ``url`` (``http_proxy``, ``no_proxy``...)."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass(parts.hostname or "")
