"""Responses API items of every type, for the tests of items without a role."""

from __future__ import annotations

from typing import Any

#: One item of every Responses type, with nested unknown keys and unicode.
RESPONSES_ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "plain easy input message"},
    {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Bonjour ünïcödé 日本語 zebrafish"}],
    },
    {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "thinking about quokkas"}],
        "encrypted_content": "gAAAA" + "x" * 100,
    },
    {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
        "status": "completed",
    },
    {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": "sunny with narwhals",
        "x_future": {"nested": [1, {"deeper": None, "flag": True}], "float": 1.5},
    },
    {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [
            {"type": "output_text", "text": "It is sunny 🌞 axolotl", "annotations": []},
            {"type": "refusal", "refusal": "no platypus talk"},
        ],
    },
    {"type": "message", "role": "developer", "content": "be terse"},
    {"role": "developer", "content": "typeless developer message"},
    {"type": "file_search_call", "id": "fs_1", "queries": ["q"], "status": "completed"},
    {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"q": "x"}},
    {"type": "computer_call", "id": "cc_1", "call_id": "c2", "action": {"type": "click"}},
    {"type": "item_reference", "id": "msg_0"},
    {"type": "some_future_kind", "payload": {"a": ["b", {"c": "\u00e9\u0000"}]}},
]
