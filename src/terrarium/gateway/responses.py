"""The Responses API over Chat Completions: requests translated for any OpenAI-compatible
server, and what comes back made Responses objects and stream events.

Input items are stored as Responses items (``docs/format.md`` §7a): an easy message
(``{"role", "content": "..."}``) becomes a ``message`` item with typed parts, and every item
gets an id when it has none (``msg_``, ``fc_``, ...), so conversations can list and delete
them. The upstream request is the model history's Chat messages (``model.wire_message``),
then the new items'; ``instructions`` go first as a system message, for this request only,
as OpenAI does with ``previous_response_id``. Function tools are translated; server-side
tools (web search, file search, ...) and background mode are refused with HTTP 400.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from terrarium.gateway.ids import new_item_id
from terrarium.gateway.upstream import GatewayError, bad_request
from terrarium.model import TEXT_PART_TYPES, LoggedItem

_ROLES = frozenset(("user", "assistant", "system", "developer"))
_ITEM_TYPES = frozenset(("message", "function_call", "function_call_output", "reasoning"))
"""The input item types that have a Chat message (:func:`terrarium.model.chat_view`)."""
_PASSED = ("temperature", "top_p", "parallel_tool_calls")
_REFUSED = {
    "background": "background mode is not implemented by terrarium gateway",
    "prompt": "stored prompts are not implemented by terrarium gateway",
}


@dataclass(slots=True)
class ResponseRequest:
    """A checked ``POST /v1/responses`` body."""

    model: str
    inputs: list[LoggedItem]
    instructions: str | None = None
    previous_response_id: str | None = None
    conversation: str | None = None
    store: bool = True
    stream: bool = False
    metadata: dict[str, str] = field(default_factory=dict)
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    """``temperature``, ``top_p``, ``parallel_tool_calls``, ``max_output_tokens`` as given."""
    response_format: dict[str, Any] | None = None
    """``text.format`` made Chat's ``response_format``."""


def parse_request(body: Mapping[str, Any]) -> ResponseRequest:
    """Check a request body; raise a 400 naming the parameter at fault."""
    for key, why in _REFUSED.items():
        if body.get(key):
            raise bad_request(why, key)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required: the model the upstream server serves", "model")
    req = ResponseRequest(model=model, inputs=normalize_items(body.get("input"), "input"))
    req.instructions = _optional(body, "instructions", str)
    req.previous_response_id = _optional(body, "previous_response_id", str)
    conversation = body.get("conversation")
    if isinstance(conversation, Mapping):
        conversation = conversation.get("id")
    if conversation is not None and not isinstance(conversation, str):
        raise bad_request("'conversation' must be a conversation id", "conversation")
    req.conversation = conversation
    if req.conversation and req.previous_response_id:
        raise bad_request(
            "'previous_response_id' and 'conversation' cannot be used together", "conversation"
        )
    req.store = _optional(body, "store", bool) is not False
    req.stream = bool(_optional(body, "stream", bool))
    req.metadata = check_metadata(body.get("metadata"))
    req.tools = _tools(body.get("tools"))
    req.tool_choice = body.get("tool_choice")
    req.params = {k: body[k] for k in (*_PASSED, "max_output_tokens") if body.get(k) is not None}
    req.response_format = _response_format(body.get("text"))
    return req


def _response_format(text: Any) -> dict[str, Any] | None:
    """``text.format`` as Chat's ``response_format`` (structured outputs), or None."""
    shape = text.get("format") if isinstance(text, Mapping) else None
    if not isinstance(shape, Mapping) or shape.get("type") in (None, "text"):
        return None
    if shape.get("type") == "json_object":
        return {"type": "json_object"}
    if shape.get("type") == "json_schema":
        keys = ("name", "schema", "strict", "description")
        return {"type": "json_schema", "json_schema": {k: shape[k] for k in keys if k in shape}}
    raise bad_request(f"text format {shape.get('type')!r} is not implemented", "text")


def _optional(body: Mapping[str, Any], key: str, kind: type) -> Any:
    value = body.get(key)
    if value is not None and not isinstance(value, kind):
        raise bad_request(f"'{key}' must be a {kind.__name__}", key)
    return value


def check_metadata(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or len(value) > 16:
        raise bad_request("'metadata' must be an object of at most 16 strings", "metadata")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise bad_request("'metadata' keys and values must be strings", "metadata")
    return dict(value)


def _tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad_request("'tools' must be a list", "tools")
    for tool in value:
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, Mapping) else tool
            raise bad_request(
                f"tool type {kind!r} is not implemented by terrarium gateway: "
                "only function tools, which the client runs",
                "tools",
            )
        if not isinstance(tool.get("name"), str):
            raise bad_request("a function tool needs a 'name'", "tools")
    return [dict(tool) for tool in value]


def normalize_items(value: Any, param: str) -> list[LoggedItem]:
    """Input (text or items) as stored Responses items, each with an id."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise bad_request(f"'{param}' must be a string or a list of items", param)
    return [_item(raw, param) for raw in value]


def listed(items: Sequence[LoggedItem]) -> list[LoggedItem]:
    """Items as a conversation lists them. One that another writer logged as a Chat message
    without an id (``terrarium chat``, a compaction) is shown as a message item whose id is
    derived from it (and from how many equal ones come before it): the same on every read."""
    seen: dict[str, int] = {}
    out: list[LoggedItem] = []
    for item in items:
        if isinstance(item.get("id"), str) and item["id"]:
            out.append(item)
            continue
        text = json.dumps(item, sort_keys=True, default=str)
        seen[text] = seen.get(text, 0) + 1
        shown = {
            **item,
            "id": "msg_" + hashlib.sha256(f"{seen[text]}:{text}".encode()).hexdigest()[:32],
        }
        try:
            out.append(_item(shown, "items"))
        except GatewayError:  # no message item says it (a tool result): shown as logged
            out.append(shown)
    return out


def _item(raw: Any, param: str) -> LoggedItem:
    if not isinstance(raw, Mapping):
        raise bad_request(f"every item of '{param}' must be an object", param)
    item = dict(raw)
    kind = item.setdefault("type", "message")
    if not isinstance(kind, str):
        raise bad_request(f"an item's 'type' must be a string in '{param}'", param)
    if kind == "item_reference":
        raise bad_request("item references are not implemented by terrarium gateway", param)
    if kind not in _ITEM_TYPES:  # it has no Chat message: it would be dropped unsaid
        shown = ", ".join(repr(t) for t in sorted(_ITEM_TYPES))
        raise bad_request(
            f"item type {kind!r} is not implemented by terrarium gateway (it takes {shown})", param
        )
    if kind == "message":
        role, content = item.get("role"), item.get("content")
        if role not in _ROLES:
            raise bad_request(f"a message's role must be one of {sorted(_ROLES)}", param)
        if isinstance(content, str):
            part = "output_text" if role == "assistant" else "input_text"
            item["content"] = [_text_part(part, content)]
        elif not isinstance(content, list):
            raise bad_request("a message's content must be a string or a list of parts", param)
        else:
            _check_parts(content, param)
        item.setdefault("status", "completed")
    if not isinstance(item.get("id"), str) or not item.get("id"):
        item["id"] = new_item_id(kind)
    return item


def _check_parts(parts: list[Any], param: str) -> None:
    """Each part an object with a string ``type``, a text part's ``text`` a string: a part
    that is not would leave the message without it, or the message out, unsaid."""
    for part in parts:
        if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
            raise bad_request(
                "every part of a message's content must be an object with a string 'type'", param
            )
        if part["type"] in TEXT_PART_TYPES and not isinstance(part.get("text"), str):
            raise bad_request(f"a message's {part['type']!r} part needs a string 'text'", param)


def _text_part(kind: str, text: str) -> dict[str, Any]:
    return (
        {"type": kind, "text": text, "annotations": []}
        if kind == "output_text"
        else {
            "type": kind,
            "text": text,
        }
    )


# --------------------------------------------------------------------------- upstream


def chat_body(req: ResponseRequest, messages: list[Any]) -> dict[str, Any]:
    """The Chat Completions request for ``req`` over ``messages`` (dicts, or each already
    encoded as a ``msgspec.Raw``)."""
    if req.instructions:
        messages = [{"role": "system", "content": req.instructions}, *messages]
    body: dict[str, Any] = {"model": req.model, "messages": messages}
    body.update((k, req.params[k]) for k in _PASSED if k in req.params)
    if "max_output_tokens" in req.params:
        body["max_tokens"] = req.params["max_output_tokens"]
    if req.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    k: tool[k] for k in ("name", "description", "parameters") if k in tool
                },
            }
            for tool in req.tools
        ]
        choice = req.tool_choice
        if isinstance(choice, Mapping) and choice.get("type") == "function":
            body["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif choice in ("auto", "none", "required"):
            body["tool_choice"] = choice
    if req.response_format is not None:
        body["response_format"] = req.response_format
    if req.stream:
        body["stream_options"] = {"include_usage": True}
    return body


def message_item(text: str, status: str = "completed", item_id: str | None = None) -> LoggedItem:
    """An assistant ``message`` item holding ``text``."""
    return {
        "type": "message",
        "id": item_id or new_item_id("message"),
        "role": "assistant",
        "status": status,
        "content": [_text_part("output_text", text)] if status == "completed" or text else [],
    }


def call_item(call: Mapping[str, Any], item_id: str | None = None) -> LoggedItem:
    """A ``function_call`` item from a Chat tool call."""
    function = call.get("function") or {}
    return {
        "type": "function_call",
        "id": item_id or new_item_id("function_call"),
        "call_id": str(call.get("id") or new_item_id("call")),
        "name": str(function.get("name") or ""),
        "arguments": str(function.get("arguments") or ""),
        "status": "completed",
    }


def reasoning_item(text: str, item_id: str | None = None) -> LoggedItem:
    """A ``reasoning`` item holding the server's reasoning text."""
    return {
        "type": "reasoning",
        "id": item_id or new_item_id("reasoning"),
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def output_items(message: Mapping[str, Any]) -> list[LoggedItem]:
    """The output items of a Chat answer's message."""
    out: list[LoggedItem] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        out.append(reasoning_item(reasoning))
    content = message.get("content")
    calls = message.get("tool_calls") or []
    if (isinstance(content, str) and content) or not calls:
        out.append(message_item(content if isinstance(content, str) else ""))
    out.extend(call_item(call) for call in calls if isinstance(call, Mapping))
    return out


def usage_of(usage: Any) -> dict[str, Any] | None:
    """A Chat ``usage`` object as the Responses API's."""
    if not isinstance(usage, Mapping):
        return None
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details")
    cached = int(details.get("cached_tokens") or 0) if isinstance(details, Mapping) else 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def usage_entry(model: str, usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The log's ``usage`` entry (``UsageRecord`` keys) for a Responses usage object."""
    if usage is None:
        return None
    return {
        "model": model,
        "prompt_tokens": usage["input_tokens"],
        "completion_tokens": usage["output_tokens"],
        "cached_tokens": usage["input_tokens_details"]["cached_tokens"],
    }


# --------------------------------------------------------------------------- objects


def _text_format(response_format: Mapping[str, Any] | None) -> dict[str, Any]:
    """The response's ``text.format`` for a request's ``response_format``."""
    if response_format is None:
        return {"type": "text"}
    if response_format["type"] == "json_schema":
        return {"type": "json_schema", **response_format["json_schema"]}
    return {"type": "json_object"}


def new_record(req: ResponseRequest, response_id: str) -> dict[str, Any]:
    """What a stored response records about itself (all but its items)."""
    return {
        "id": response_id,
        "created_at": int(time.time()),
        "status": "in_progress",
        "model": req.model,
        "instructions": req.instructions,
        "metadata": req.metadata,
        "previous_response_id": req.previous_response_id,
        "conversation": req.conversation,
        "tools": req.tools,
        "tool_choice": req.tool_choice,
        "store": req.store,
        "text": {"format": _text_format(req.response_format)},
        "inputs": len(req.inputs),
        **req.params,
        "usage": None,
        "error": None,
        "incomplete_details": None,
    }


def finish(record: dict[str, Any], finish_reason: Any, usage: dict[str, Any] | None) -> None:
    """Mark a record completed (or incomplete, when the server stopped at the limit)."""
    record["usage"] = usage
    if finish_reason == "length":
        record["status"] = "incomplete"
        record["incomplete_details"] = {"reason": "max_output_tokens"}
    else:
        record["status"] = "completed"


def fail(record: dict[str, Any], message: str) -> None:
    """Mark a record failed."""
    record["status"] = "failed"
    record["error"] = {"code": "server_error", "message": message}


def response_object(record: Mapping[str, Any], output: Sequence[LoggedItem]) -> dict[str, Any]:
    """The Responses API's ``response`` object."""
    conversation = record.get("conversation")
    choice = record.get("tool_choice")
    return {
        "id": record["id"],
        "object": "response",
        "created_at": record["created_at"],
        "status": record["status"],
        "background": False,
        "error": record.get("error"),
        "incomplete_details": record.get("incomplete_details"),
        "instructions": record.get("instructions"),
        "max_output_tokens": record.get("max_output_tokens"),
        "metadata": record.get("metadata") or {},
        "model": record["model"],
        "output": list(output),
        "parallel_tool_calls": record.get("parallel_tool_calls", True),
        "previous_response_id": record.get("previous_response_id"),
        "conversation": {"id": conversation} if conversation else None,
        "store": record.get("store", True),
        "temperature": record.get("temperature"),
        "text": record.get("text") or {"format": {"type": "text"}},
        "tool_choice": choice if choice is not None else "auto",
        "tools": [{"strict": None, **tool} for tool in record.get("tools") or []],
        "top_p": record.get("top_p"),
        "truncation": "disabled",
        "usage": record.get("usage"),
    }
