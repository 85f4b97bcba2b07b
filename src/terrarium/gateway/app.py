"""The gateway's ASGI app: the Responses and Conversations APIs kept in a store, and Chat
Completions passed through (recorded when the request names a session). Store calls run one
at a time, on the event loop or in a worker thread (:mod:`terrarium.gateway.core`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from terrarium import Store
from terrarium.gateway import conversations
from terrarium.gateway.chat import chat_completions
from terrarium.gateway.core import Core
from terrarium.gateway.http import (
    JSON,
    MAX_BODY,
    Guard,
    endpoint,
    error_response,
    not_stored,
    page,
    read_json,
    sse,
)
from terrarium.gateway.ids import (
    THREAD_TYPE,
    conversation_context,
    new_response_id,
    new_token,
    response_context,
    thread_context,
)
from terrarium.gateway.ledger import EMPTY, Point, Snapshot, encoded_messages, turn_entries
from terrarium.gateway.responses import (
    ResponseRequest,
    chat_body,
    fail,
    finish,
    new_record,
    output_items,
    parse_request,
    response_object,
    usage_entry,
    usage_of,
)
from terrarium.gateway.streaming import StreamBuilder
from terrarium.gateway.upstream import (
    GatewayError,
    Upstream,
    bad_request,
    dropped,
    first_choice,
    not_found,
)
from terrarium.model import ContextId, LoggedItem, SegmentId, add_wire_message

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Target:
    """Where a response goes: after ``point`` (a previous response, or a conversation's
    head), or into a new thread ``context`` when ``point`` is None."""

    context: ContextId
    point: Point | None
    snapshot: Snapshot
    conversation: bool
    head: SegmentId | None = None
    """The context's head segment as read to find ``point`` (``Ledger.continue_from``)."""


class Gateway(Core):
    """The shared state (:class:`~terrarium.gateway.core.Core`) and the Responses API."""

    # ------------------------------------------------------------------ responses

    def target(self, req: ResponseRequest) -> Target:
        """Where ``req`` continues from (a store call: ``Core.run``)."""
        if req.conversation:
            ctx = conversation_context(req.conversation)
            head = self.ledger.head(ctx) if ctx is not None else None
            if ctx is None or head is None:
                raise not_found(f"Conversation '{req.conversation}' not found.", "conversation")
            return Target(ctx, head, self.ledger.snapshot(head), True)
        if req.previous_response_id:
            rid = req.previous_response_id
            ctx = response_context(rid)
            found = self.ledger.find(rid, ctx) if ctx is not None else None
            if ctx is None or found is None:
                raise not_found(
                    f"Previous response with id '{rid}' not found.", "previous_response_id"
                )
            point = found.point
            return Target(ctx, point, self.ledger.snapshot(point), False, found.head)
        return Target(thread_context(new_token()), None, EMPTY, False)

    def commit(
        self,
        req: ResponseRequest,
        target: Target,
        record: dict[str, Any],
        output: list[LoggedItem],
        error: dict[str, Any] | None = None,
    ) -> None:
        """Store a turn (a store call: ``Core.run``)."""
        entries = turn_entries(
            req.inputs,
            output,
            usage=usage_entry(req.model, record.get("usage")),
            finish=None if error else record.get("finish_reason"),
            error=error,
            record=record,
        )
        if target.point is None:
            self.ledger.start_thread(target.context, entries)
        elif target.conversation:
            self.ledger.append_to_head(target.context, entries)
        else:
            self.ledger.continue_from(
                target.point,
                entries,
                move_head=target.context.type == THREAD_TYPE,
                base=target.snapshot,
                head=target.head,
            )


async def create_response(gw: Gateway, request: Request) -> Response:
    """``POST /v1/responses``."""
    req = parse_request(await read_json(request, gw.max_body))
    if req.conversation or req.previous_response_id:
        target = await gw.run(gw.target, req)
    else:  # a new thread: nothing to read from the store
        target = gw.target(req)
    messages = list(target.snapshot.messages)
    for item in req.inputs:
        add_wire_message(messages, item)
    if not messages:
        raise bad_request("'input' is empty and there is no history to answer", "input")
    body = chat_body(req, encoded_messages(messages, target.snapshot))
    record = new_record(req, new_response_id(target.context if req.store else None))
    try:
        if req.stream:  # opened first: a refusal is the client's HTTP error too
            events = _stream_response(gw, req, target, record, await gw.upstream.stream(body))
            return StreamingResponse(events, media_type="text/event-stream")
        answer = await gw.upstream.chat(body)
        choice = first_choice(answer, gw.upstream.url)
        output = output_items(choice["message"])
    except GatewayError as exc:
        fail(record, exc.message)
        if req.store:
            await gw.run(
                gw.commit, req, target, record, [], _errored(exc.message, exc.code or exc.type)
            )
        raise
    finish(record, choice.get("finish_reason"), usage_of(answer.get("usage")))
    record["finish_reason"] = choice.get("finish_reason")
    if req.store:
        await gw.run(gw.commit, req, target, record, output)
    return JSON(response_object(record, output))


def _errored(error: str, kind: str | None, builder: StreamBuilder | None = None) -> dict[str, Any]:
    """``run_errored`` data; with a stream's text so far (``partial``), whose message id the
    record keeps, so that a retrieval shows it under the id the stream gave it."""
    data: dict[str, Any] = {"error": error, "error_type": kind}
    if builder is not None and builder.partial_text():
        data["partial"] = builder.partial_text()
        builder.record["partial_id"] = builder.text_id
    return data


GONE = "the client went away before the response completed"


async def _stream_response(
    gw: Gateway,
    req: ResponseRequest,
    target: Target,
    record: dict[str, Any],
    chunks: AsyncIterator[Any],
) -> AsyncIterator[bytes]:
    """The stream of events. A client that goes away before the end (the stream closed or
    cancelled) leaves a failed turn, as Ctrl-C does in the chat loop; it is handed to the
    store without waiting (``Core.submit``), as nothing may be awaited once a task is cancelled."""
    builder = StreamBuilder(record)
    try:
        async for piece in _events(gw, req, target, builder, chunks):
            yield piece
    except (asyncio.CancelledError, GeneratorExit):
        if req.store and record["status"] == "in_progress":
            fail(record, GONE)
            error = _errored(GONE, "client_disconnected", builder)
            gw.submit(gw.commit, req, target, record, [], error)
        raise


async def _events(
    gw: Gateway,
    req: ResponseRequest,
    target: Target,
    builder: StreamBuilder,
    chunks: AsyncIterator[Any],
) -> AsyncIterator[bytes]:
    """The events of a stream; the turn is stored before ``response.completed`` is sent."""
    record = builder.record
    for event in builder.start():
        yield sse(event)
    try:
        async for chunk in chunks:
            for event in builder.feed(chunk):
                yield sse(event)
        if builder.finish_reason is None:
            raise dropped()
    except GatewayError as exc:
        fail(record, exc.message)
        if req.store:
            error = _errored(exc.message, exc.code or exc.type, builder)
            await _store(gw, record, gw.commit, req, target, record, [], error)
        yield sse(builder.end())
        return
    for event in builder.close():
        yield sse(event)
    finish(record, builder.finish_reason, builder.usage)
    record["finish_reason"] = builder.finish_reason
    if req.store:
        await _store(gw, record, gw.commit, req, target, record, builder.output)
    yield sse(builder.end())


async def _store(gw: Gateway, record: dict[str, Any], *call: Any) -> None:
    """Store a streamed turn; one that cannot be (a full disk, a store gone) marks the
    response failed, so that the stream ends in ``response.failed``, not a cut connection."""
    try:
        await gw.run(*call)
    except Exception as exc:
        fail(record, not_stored(exc, "the response").message)


def _stored(gw: Gateway, response_id: str) -> tuple[Point, dict[str, Any]]:
    ctx = response_context(response_id)
    found = gw.ledger.find(response_id, ctx) if ctx is not None else None
    if found is None:
        raise not_found(f"Response with id '{response_id}' not found.")
    return found.point, found.record


def _retrieve(gw: Gateway, response_id: str) -> tuple[dict[str, Any], list[LoggedItem]]:
    point, record = _stored(gw, response_id)
    inputs, outputs = gw.ledger.response_items(point, record)
    return response_object(record, outputs), inputs


async def get_response(gw: Gateway, request: Request) -> Response:
    """``GET /v1/responses/{id}``."""
    obj, _ = await gw.run(_retrieve, gw, request.path_params["response_id"])
    return JSON(obj)


async def input_items(gw: Gateway, request: Request) -> Response:
    """``GET /v1/responses/{id}/input_items``."""
    _, inputs = await gw.run(_retrieve, gw, request.path_params["response_id"])
    return JSON(page(inputs, request.query_params))


async def delete_response(gw: Gateway, request: Request) -> Response:
    """``DELETE /v1/responses/{id}``."""
    rid = request.path_params["response_id"]
    ctx = response_context(rid)
    deleted = ctx is not None and await gw.run(gw.ledger.delete_response, rid, ctx)
    if not deleted:
        raise not_found(f"Response with id '{rid}' not found.")
    return JSON({"id": rid, "object": "response.deleted", "deleted": True})


async def list_models(gw: Gateway, request: Request) -> Response:
    """``GET /v1/models``, the upstream's."""
    return JSON(await gw.upstream.models())


def create_app(
    store: Store,
    upstream: str | Upstream,
    *,
    token: str | None = None,
    max_body: int = MAX_BODY,
    store_thread: bool = True,
) -> Any:
    """The gateway as an ASGI app over ``store``, forwarding to ``upstream`` (a base URL such
    as ``http://localhost:8000/v1``, or an :class:`Upstream`); ``store_thread`` as
    :class:`~terrarium.gateway.core.Core` takes it."""
    gw = Gateway(
        store,
        Upstream(upstream) if isinstance(upstream, str) else upstream,
        max_body=max_body,
        store_thread=store_thread,
    )

    def bind(handler: Callable[[Gateway, Request], Any]) -> Any:
        async def call(request: Request) -> Response:
            result: Response = await handler(gw, request)
            return result

        call.__name__ = handler.__name__
        return endpoint(call)

    routes = [
        Route("/v1/responses", bind(create_response), methods=["POST"]),
        Route("/v1/responses/{response_id}", bind(get_response), methods=["GET"]),
        Route("/v1/responses/{response_id}", bind(delete_response), methods=["DELETE"]),
        Route("/v1/responses/{response_id}/input_items", bind(input_items), methods=["GET"]),
        Route("/v1/chat/completions", bind(chat_completions), methods=["POST"]),
        Route("/v1/models", bind(list_models), methods=["GET"]),
        *[Route(path, bind(fn), methods=[m]) for path, m, fn in conversations.ROUTES],
    ]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await gw.close()

    async def no_route(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        message = f"{request.method} {request.url.path} is not served by terrarium gateway"
        return error_response(GatewayError(status, message, code="unknown_route"))

    app = Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={404: no_route, 405: no_route}
    )
    app.state.gateway = gw
    return Guard(app, token)
