"""The Conversations API: a conversation is a context (``conv:{id}``); its items are the
model history of its head, its record (creation time, metadata) an extension entry."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from terrarium import lifecycle
from terrarium.gateway.core import Core
from terrarium.gateway.http import JSON, page, read_json
from terrarium.gateway.ids import conversation_context, new_conversation_id
from terrarium.gateway.ledger import CONVERSATION_DOMAIN
from terrarium.gateway.responses import check_metadata, listed, normalize_items
from terrarium.gateway.upstream import bad_request, not_found
from terrarium.model import ContextId, LoggedItem

MAX_ITEMS = 20
"""Items one request may add, as OpenAI allows."""


def _object(conversation_id: str, record: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": conversation_id,
        "object": "conversation",
        "created_at": record.get("created_at", 0),
        "metadata": record.get("metadata") or {},
    }


def _items(body: dict[str, Any]) -> list[LoggedItem]:
    items = normalize_items(body.get("items"), "items")
    if len(items) > MAX_ITEMS:
        raise bad_request(f"at most {MAX_ITEMS} items may be added at once", "items")
    return items


def _context(request: Request) -> tuple[str, ContextId]:
    conversation_id = request.path_params["conversation_id"]
    ctx = conversation_context(conversation_id)
    if ctx is None:
        raise not_found(f"Conversation with id '{conversation_id}' not found.")
    return conversation_id, ctx


def _state(gw: Core, request: Request) -> tuple[str, dict[str, Any], list[LoggedItem]]:
    """The conversation's id, record and items (a store call: ``Core.run``)."""
    conversation_id, ctx = _context(request)
    found = gw.ledger.conversation(ctx)
    if found is None:
        raise not_found(f"Conversation with id '{conversation_id}' not found.")
    _, snap = found
    return conversation_id, dict(snap.extensions.get(CONVERSATION_DOMAIN) or {}), listed(snap.items)


async def create(gw: Core, request: Request) -> Response:
    """``POST /v1/conversations``."""
    body = await read_json(request, gw.max_body)
    record = {"created_at": int(time.time()), "metadata": check_metadata(body.get("metadata"))}
    items = _items(body)
    conversation_id = new_conversation_id()
    ctx = conversation_context(conversation_id)
    assert ctx is not None
    await gw.run(gw.ledger.create_conversation, ctx, record, items)
    return JSON(_object(conversation_id, record))


async def retrieve(gw: Core, request: Request) -> Response:
    """``GET /v1/conversations/{id}``."""
    conversation_id, record, _ = await gw.run(_state, gw, request)
    return JSON(_object(conversation_id, record))


async def update(gw: Core, request: Request) -> Response:
    """``POST /v1/conversations/{id}``: new metadata."""
    body = await read_json(request, gw.max_body)
    if "metadata" not in body:
        raise bad_request("'metadata' is required", "metadata")
    metadata = check_metadata(body.get("metadata"))
    conversation_id, record, _ = await gw.run(_state, gw, request)
    record["metadata"] = metadata
    await gw.run(gw.ledger.set_conversation, _context(request)[1], record)
    return JSON(_object(conversation_id, record))


async def delete(gw: Core, request: Request) -> Response:
    """``DELETE /v1/conversations/{id}``: the context goes to the store's trash."""
    conversation_id, ctx = _context(request)
    if not await gw.run(lifecycle.delete_context, gw.ledger.store, ctx, why="gateway"):
        raise not_found(f"Conversation with id '{conversation_id}' not found.")
    return JSON({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


async def add_items(gw: Core, request: Request) -> Response:
    """``POST /v1/conversations/{id}/items``."""
    body = await read_json(request, gw.max_body)
    items = _items(body)
    if not items:
        raise bad_request("'items' must list at least one item", "items")
    _, ctx = _context(request)
    await gw.run(_state, gw, request)  # a missing conversation is a 404
    await gw.run(gw.ledger.add_items, ctx, items)
    return JSON(page(items, {"order": "asc", "limit": "100"}, default_order="asc"))


async def list_items(gw: Core, request: Request) -> Response:
    """``GET /v1/conversations/{id}/items``."""
    _, _, items = await gw.run(_state, gw, request)
    return JSON(page(items, request.query_params))


async def get_item(gw: Core, request: Request) -> Response:
    """``GET /v1/conversations/{id}/items/{item_id}``."""
    _, _, items = await gw.run(_state, gw, request)
    item_id = request.path_params["item_id"]
    found = next((item for item in items if item.get("id") == item_id), None)
    if found is None:
        raise not_found(f"Item with id '{item_id}' not found.")
    return JSON(found)


async def delete_item(gw: Core, request: Request) -> Response:
    """``DELETE /v1/conversations/{id}/items/{item_id}``: the conversation is returned."""
    conversation_id, ctx = _context(request)
    item_id = request.path_params["item_id"]
    if not await gw.run(gw.ledger.delete_item, ctx, item_id):
        raise not_found(f"Item with id '{item_id}' not found.")
    _, record, _ = await gw.run(_state, gw, request)
    return JSON(_object(conversation_id, record))


ROUTES = [
    ("/v1/conversations", "POST", create),
    ("/v1/conversations/{conversation_id}", "GET", retrieve),
    ("/v1/conversations/{conversation_id}", "POST", update),
    ("/v1/conversations/{conversation_id}", "DELETE", delete),
    ("/v1/conversations/{conversation_id}/items", "POST", add_items),
    ("/v1/conversations/{conversation_id}/items", "GET", list_items),
    ("/v1/conversations/{conversation_id}/items/{item_id}", "GET", get_item),
    ("/v1/conversations/{conversation_id}/items/{item_id}", "DELETE", delete_item),
]
