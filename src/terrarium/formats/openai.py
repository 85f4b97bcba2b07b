"""A context as OpenAI chat messages, and many contexts as an OpenAI fine-tuning file.

The messages are those the model is sent (:func:`terrarium.model.wire_messages`, as the runtime
builds them). A fine-tuning line is ``{"messages": [...]}``, with a config's ``tools`` list as
its ``tools``; a conversation without an assistant message teaches nothing and is skipped.
"""

from __future__ import annotations

import json
from typing import Any

from terrarium.formats.jsonl import load_transcript
from terrarium.model import ContextId, RestoredState, wire_messages
from terrarium.stores.base import Store


def chat_messages(state: RestoredState) -> list[dict[str, Any]]:
    """The messages the model is sent: system prompt first, no failed run, standard keys only."""
    return wire_messages(state.system_prompt, state.model_history)


def export_context(store: Store, context: ContextId | str) -> str:
    """The context's chat messages as an indented JSON array (ContextNotFound if there is none)."""
    messages = chat_messages(load_transcript(store, context).state)
    return json.dumps(messages, indent=2, ensure_ascii=False) + "\n"


def export_finetune_context(store: Store, context: ContextId | str) -> str:
    """One context's fine-tuning JSONL line, or "" without an assistant message.

    Many contexts, filtered by type and date, go through :func:`terrarium.export.export_many`.
    """
    state = load_transcript(store, context).state
    messages = chat_messages(state)
    if not any(message.get("role") == "assistant" for message in messages):
        return ""
    record: dict[str, Any] = {"messages": messages}
    tools = state.config.get("tools")
    if isinstance(tools, list) and tools:
        record["tools"] = tools
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
