"""The gateway's HTTP plumbing: the token or loopback check, bodies read with a size limit,
paged lists, and every failure answered as OpenAI answers one."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from functools import wraps
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from terrarium import codec
from terrarium.errors import (
    ContextNotFound,
    CorruptLog,
    InvalidContextId,
    InvalidEntry,
    StoreUnavailable,
)
from terrarium.gateway.upstream import GatewayError, bad_request
from terrarium.guard import is_loopback_header, token_matches
from terrarium.stores import _db

log = logging.getLogger("terrarium.gateway")

MAX_BODY = 32 * 1024 * 1024
"""The largest request body taken by default (a long history sent whole, as clients that
keep it themselves do)."""

_ENCODER = msgspec.json.Encoder()


def encode(value: Any) -> bytes:
    """``value`` as JSON bytes."""
    return _ENCODER.encode(value)


class JSON(JSONResponse):
    """A JSON response encoded by msgspec (several times faster than the json module)."""

    def render(self, content: Any) -> bytes:
        return _ENCODER.encode(content)


def error_response(error: GatewayError) -> JSONResponse:
    """The error as OpenAI's JSON, with its status."""
    return JSON(error.body(), status_code=error.status)


class Guard:
    """ASGI middleware: with a token, every request must carry it (``Authorization: Bearer``,
    which is how OpenAI clients send their API key); without one, only a loopback ``Host`` is
    answered (so a web page cannot reach the gateway by DNS rebinding)."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                await error_response(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> GatewayError | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.token is None:
            if is_loopback_header(headers.get("host", "")):
                return None
            return GatewayError(403, "this gateway answers only on loopback", code="forbidden")
        auth = headers.get("authorization", "")
        given = auth[7:] if auth.startswith("Bearer ") else headers.get("api-key", "")
        if token_matches(given, self.token):
            return None
        return GatewayError(
            401, "a valid token is required: send it as the API key", code="invalid_api_key"
        )


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object, at most ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    try:
        body = codec.decode(b"".join(chunks))  # a body nested too deep: DecodeError
    except msgspec.DecodeError as exc:
        raise bad_request(f"the request body is not valid JSON ({exc})") from None
    except (ValueError, UnicodeDecodeError):
        raise bad_request("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _too_large(limit: int) -> GatewayError:
    return GatewayError(
        413, f"the request body is larger than {limit} bytes", code="request_too_large"
    )


Handler = Callable[[Request], Awaitable[Response]]


def endpoint(handler: Handler) -> Handler:
    """Answer every failure of ``handler`` as OpenAI would: one message, never a traceback."""

    @wraps(handler)
    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except GatewayError as exc:
            return error_response(exc)
        except ContextNotFound as exc:
            return error_response(GatewayError(404, str(exc).strip("'\""), code="not_found"))
        except (InvalidContextId, InvalidEntry) as exc:
            return error_response(bad_request(str(exc)))
        except StoreUnavailable as exc:
            return error_response(GatewayError(503, f"the store is unavailable: {exc}"))
        except CorruptLog as exc:  # the log is damaged, not the gateway: no traceback
            log.warning("gateway: %s %s: %s", request.method, request.url.path, exc)
            return error_response(damaged_log(exc))
        except Exception as exc:
            log.exception("gateway: %s %s failed", request.method, request.url.path)
            full = any(_db.kind(e) == "full" for e in (exc, exc.__cause__) if e is not None)
            what = "the store's disk is full" if full else "internal error"
            message = f"{what}: {type(exc).__name__}: {exc}".splitlines()[0]
            return error_response(GatewayError(507 if full else 500, message))

    return run


def damaged_log(exc: CorruptLog) -> GatewayError:
    """The error for a conversation whose log is damaged: it names the line and fsck."""
    message = f"the conversation's log is damaged: {exc}; {CorruptLog.HINT}"
    return GatewayError(500, message, code="damaged_log")


def not_stored(exc: Exception, what: str) -> GatewayError:
    """The error ending a stream whose turn the store refused, logged: a damaged log as a
    warning (:func:`damaged_log`), anything else (a full disk, a store gone) with its trace."""
    if isinstance(exc, CorruptLog):
        log.warning("gateway: %s was not stored: %s", what, exc)
        return damaged_log(exc)
    log.exception("gateway: %s could not be stored", what)
    return GatewayError(500, f"{what} could not be stored: {type(exc).__name__}: {exc}")


def page(
    items: Sequence[Mapping[str, Any]], query: Mapping[str, str], *, default_order: str = "desc"
) -> dict[str, Any]:
    """A paged list (``after``, ``limit`` 1-100, ``order``), as OpenAI lists items."""
    order = query.get("order", default_order)
    if order not in ("asc", "desc"):
        raise bad_request("'order' must be 'asc' or 'desc'", "order")
    raw = query.get("limit", "20")
    if not raw.isdigit() or not 1 <= int(raw) <= 100:
        raise bad_request("'limit' must be a number from 1 to 100", "limit")
    ordered = list(items) if order == "asc" else list(reversed(items))
    after = query.get("after")
    if after:
        at = next((i for i, item in enumerate(ordered) if item.get("id") == after), None)
        if at is None:
            raise bad_request(f"no item {after!r} to list after", "after")
        ordered = ordered[at + 1 :]
    data = ordered[: int(raw)]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0].get("id") if data else None,
        "last_id": data[-1].get("id") if data else None,
        "has_more": len(ordered) > len(data),
    }


def sse(event: Mapping[str, Any]) -> bytes:
    """One server-sent event: its ``type`` as the event name, the event as its data."""
    return b"event: %s\ndata: %s\n\n" % (event["type"].encode(), _ENCODER.encode(event))


def headers_of(scope: MutableMapping[str, Any]) -> dict[str, str]:
    """The request's headers, names lowercased."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
