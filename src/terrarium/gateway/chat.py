"""Chat Completions passed through to the upstream, and recorded when the request names a
session: the ``X-Session-Id`` header (aliases: ``X-Conversation-Id``, ``X-Chat-Id``, Open
WebUI's ``X-OpenWebUI-Chat-Id``), or ``metadata.session_id`` in the body (taken out before the body
goes upstream). The session is the context ``chat:{name}``; the request's messages are
matched against its history (``Ledger.record_chat``): new ones are appended with the reply,
and a request that diverges (an edited or regenerated turn) forks where it diverges.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from terrarium.gateway.core import Core
from terrarium.gateway.http import JSON, encode, headers_of, not_stored, read_json
from terrarium.gateway.ids import CHAT_TYPE
from terrarium.gateway.ledger import turn_entries
from terrarium.gateway.upstream import GatewayError, bad_request, dropped, first_choice
from terrarium.model import ContextId, LoggedItem

SESSION_HEADERS = ("x-session-id", "x-conversation-id", "x-chat-id", "x-openwebui-chat-id")
"""The request headers that name a session, in order of preference."""


def session_of(request: Request, body: dict[str, Any]) -> ContextId | None:
    """The context a request names, if any; ``metadata.session_id`` is removed from
    ``body`` (the upstream does not know it)."""
    headers = headers_of(request.scope)
    name = next((headers[h] for h in SESSION_HEADERS if headers.get(h)), None)
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and "session_id" in metadata:
        given = metadata.pop("session_id")
        if given is not None and not isinstance(given, str):
            raise bad_request("'metadata.session_id' must be a string", "metadata")
        if not metadata:
            body.pop("metadata")
        name = name or given
    if not name:
        return None
    return ContextId(CHAT_TYPE, name).check_new()


class _Reply:
    """A streamed answer put back together."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish: Any = None
        self.usage: Any = None
        self.recorded = False
        """Whether the turn was handed to the store (done or failed)."""

    def feed(self, chunk: Mapping[str, Any]) -> None:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.text.append(delta["content"])
            if isinstance(delta.get("reasoning_content"), str):
                self.reasoning.append(delta["reasoning_content"])
            for call in delta.get("tool_calls") or ():
                slot = self.calls.setdefault(
                    int(call.get("index") or 0),
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                slot["id"] = call.get("id") or slot["id"]
                function = call.get("function") or {}
                slot["function"]["name"] += function.get("name") or ""
                slot["function"]["arguments"] += function.get("arguments") or ""
            self.finish = choice.get("finish_reason") or self.finish

    def error(self, message: str, kind: str | None) -> dict[str, Any]:
        """A failed run's ``run_errored`` data, with the reply text streamed so far."""
        return _errored(message, kind, "".join(self.text))

    def message(self) -> dict[str, Any]:
        return _message(
            {
                "content": "".join(self.text),
                "reasoning_content": "".join(self.reasoning),
                "tool_calls": [self.calls[i] for i in sorted(self.calls)],
            }
        )


def _message(answer: Mapping[str, Any]) -> LoggedItem:
    """The assistant message to log (and to match the client's next request against)."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.get("content") or ""}
    if answer.get("tool_calls"):
        message["tool_calls"] = list(answer["tool_calls"])
        message["content"] = answer.get("content") or None
    if answer.get("reasoning_content"):
        message["reasoning_content"] = answer["reasoning_content"]
    return message


def _usage(model: str, usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, Mapping):
        return None
    details = usage.get("prompt_tokens_details")
    return {
        "model": model,
        "prompt_tokens": int(usage.get("prompt_tokens") or 0),
        "completion_tokens": int(usage.get("completion_tokens") or 0),
        "cached_tokens": int((details or {}).get("cached_tokens") or 0)
        if isinstance(details, Mapping)
        else 0,
    }


def _errored(message: str, kind: str | None, partial: str = "") -> dict[str, Any]:
    """``run_errored`` data; ``partial``: the reply text streamed before the failure."""
    data: dict[str, Any] = {"error": message, "error_type": kind}
    if partial:
        data["partial"] = partial
    return data


async def _record(
    gw: Core,
    ctx: ContextId,
    body: Mapping[str, Any],
    reply: LoggedItem | None,
    usage: Any,
    finish: Any,
    error: dict[str, Any] | None = None,
) -> None:
    tail = turn_entries(
        [],
        [reply] if reply is not None else [],
        usage=_usage(str(body.get("model")), usage),
        finish=finish,
        error=error,
        record=None,
    )
    await gw.run(gw.ledger.record_chat, ctx, body["messages"], tail)


async def chat_completions(gw: Core, request: Request) -> Response:
    """``POST /v1/chat/completions``."""
    body = await read_json(request, gw.max_body)
    ctx = session_of(request, body)
    messages = body.get("messages")
    if not (isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages)):
        raise bad_request("'messages' must be a non-empty list of message objects", "messages")
    if ctx is not None:  # a session the store cannot continue is refused before the model call
        await gw.run(gw.ledger.read_chat, ctx)
    try:
        if body.get("stream"):  # opened first: a refusal is the client's HTTP error too
            chunks = await gw.upstream.stream(body)
            return StreamingResponse(_stream(gw, ctx, body, chunks), media_type="text/event-stream")
        answer = await gw.upstream.chat(body)
    except GatewayError as exc:
        if ctx is not None:
            await _record(gw, ctx, body, None, None, None, _errored(exc.message, exc.code))
        raise
    if ctx is not None:
        choice = first_choice(answer, gw.upstream.url)
        reply = _message(choice["message"])
        await _record(gw, ctx, body, reply, answer.get("usage"), choice.get("finish_reason"))
    return JSON(answer)


async def _stream(
    gw: Core, ctx: ContextId | None, body: dict[str, Any], chunks: AsyncIterator[Any]
) -> AsyncIterator[bytes]:
    """The upstream's chunks as they come; the turn is recorded before ``[DONE]``. A client
    that goes away first leaves a failed turn (handed to ``Core.submit``, not awaited)."""
    reply = _Reply()
    done = False
    try:
        async for piece in _chunks(gw, ctx, body, reply, chunks):
            yield piece
        done = True
    finally:
        if not done and ctx is not None and not reply.recorded:
            error = reply.error(GONE, "client_disconnected")
            tail = turn_entries([], [], usage=None, finish=None, error=error, record=None)
            gw.submit(gw.ledger.record_chat, ctx, body["messages"], tail)


GONE = "the client went away before the reply completed"


async def _chunks(
    gw: Core,
    ctx: ContextId | None,
    body: dict[str, Any],
    reply: _Reply,
    chunks: AsyncIterator[Any],
) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            reply.feed(chunk)
            yield b"data: " + encode(chunk) + b"\n\n"
        if reply.finish is None:
            raise dropped()
    except GatewayError as exc:
        if ctx is not None:
            reply.recorded = True
            await _record(gw, ctx, body, None, None, None, reply.error(exc.message, exc.code))
        yield b"data: " + encode(exc.body()) + b"\n\n"
        return
    if ctx is not None:
        reply.recorded = True
        try:
            await _record(gw, ctx, body, reply.message(), reply.usage, reply.finish)
        except Exception as exc:  # a full disk, a damaged log: an error line, not a cut stream
            yield b"data: " + encode(not_stored(exc, "the turn").body()) + b"\n\n"
            return
    yield b"data: [DONE]\n\n"
