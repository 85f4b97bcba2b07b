"""Responses API items beyond the store: their Chat view, the wire messages the manager sends,
``show``, every export format, and ``rewind`` from the command line and under the manager."""

from __future__ import annotations

import asyncio
import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from fakeserver import FakeServer
from helpers.responses import RESPONSES_ITEMS
from terrarium import FsStore, MemoryStore, create_segment, restore, rewind, save_delta
from terrarium.agent.multi_context_manager import MultiContextManager
from terrarium.cli import cli
from terrarium.errors import InvalidEntry
from terrarium.export import export_context
from terrarium.formats.jsonl import import_context
from terrarium.llm.vllm_client import VLLMClient
from terrarium.model import (
    ContextId,
    SegmentStartState,
    chat_view,
    from_logged,
    item_label,
    item_text,
    wire_messages,
)

MAIN = ContextId("cli", "main")

#: A Responses API agent's turn: input, reasoning, text and a call, its output, the answer.
TURN: list[dict[str, Any]] = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "look"}]},
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
    },
    {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"q": "Paris"}'},
    {"type": "function_call", "call_id": "c2", "name": "time", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    {
        "type": "function_call_output",
        "call_id": "c2",
        "output": [{"type": "input_text", "text": "noon"}],
    },
    {"type": "web_search_call", "id": "ws_1", "status": "completed"},
    {
        "type": "message",
        "role": "assistant",
        "content": [
            {"type": "output_text", "text": "Sunny at noon."},
            {"type": "refusal", "refusal": "No more."},
        ],
    },
]

#: What a Chat Completions server is sent for TURN.
WIRE: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather?"},
    {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"q": "Paris"}'},
            },
            {"id": "c2", "type": "function", "function": {"name": "time", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "c2", "content": "noon"},
    {"role": "assistant", "content": "Sunny at noon.\nNo more."},
]


def test_wire_messages_convert_responses_items() -> None:
    """Messages become role and content, function calls join the assistant message as tool
    calls, outputs become tool messages, reasoning and kinds with no Chat form are not sent."""
    assert wire_messages("Be brief.", TURN) == WIRE


def test_wire_messages_of_chat_messages_are_unchanged() -> None:
    """Chat messages (with unknown keys and parts) are sent as before: standard keys only."""
    history = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "x", "y": 1}]},
        {"role": "assistant", "content": "b", "reasoning_content": "r", "extra": 1},
    ]
    assert wire_messages(None, history) == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "x", "y": 1}]},
        {"role": "assistant", "content": "b"},
    ]


def test_odd_responses_items_on_the_wire() -> None:
    """An empty or non-text output still answers its call; an empty message, parts that are
    not objects and a reasoning item with only encrypted content send nothing."""
    history = [
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": {"not": "text"}},
        {"type": "message", "role": "assistant", "content": [1, None, "x"]},
        {"type": "reasoning", "encrypted_content": "zzz", "summary": []},
        {"type": "message", "role": "robot", "content": "who?"},
    ]
    assert wire_messages(None, history) == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": ""},
    ]
    assert [item_text(item) for item in history] == ["", "", "", "", "who?"]


def test_developer_messages_are_sent_as_system_and_images_as_image_parts() -> None:
    """A developer message (typed or not) is a system message on the wire; an input_image
    is an image_url part."""
    history = [
        {"role": "developer", "content": "rules"},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "see"},
                {"type": "input_image", "image_url": "https://x/y.png", "detail": "low"},
            ],
        },
    ]
    assert wire_messages(None, history) == [
        {"role": "system", "content": "rules"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "see"},
                {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}},
            ],
        },
    ]


def test_item_text_and_labels() -> None:
    """The text ones have text (summary, output, refusal); the others have none."""
    texts = [item_text(item) for item in TURN]
    assert texts == [
        "Weather?",
        "look",
        "Checking.",
        "",
        "",
        "sunny",
        "noon",
        "",
        "Sunny at noon.\nNo more.",
    ]
    assert [item_label(item) for item in TURN[:4]] == [
        "user",
        "reasoning",
        "assistant",
        "function_call",
    ]
    assert chat_view(TURN[7]) is None


def test_from_logged_refuses_a_responses_item_in_one_line() -> None:
    """Item models Chat messages only: a Responses item says to use the dict."""
    with pytest.raises(InvalidEntry, match=r"'function_call'.*use the dict"):
        from_logged(TURN[3])


def _store_with(root: Path, items: list[dict[str, Any]]) -> None:
    with FsStore(root) as store:
        create_segment(store, SegmentStartState(system_prompt="Be brief."), context=MAIN)
        head = store.get_head(MAIN)
        assert head is not None
        save_delta(store, head, copy.deepcopy(items))


def _make_manager(server: FakeServer, root: Path) -> MultiContextManager:
    client = VLLMClient(base_url=server.root_url, max_retries=0, backoff_base=0.001)
    return MultiContextManager(client, storage_dir=str(root))


def test_the_manager_sends_responses_history_as_chat(
    fake_server: FakeServer, tmp_path: Path
) -> None:
    """A turn on a context whose history holds Responses items sends their Chat form."""
    root = tmp_path / "sessions"
    _store_with(root, TURN)

    async def main() -> str:
        async with _make_manager(fake_server, root) as manager:
            return await manager.process_with_context(str(MAIN), "thanks")

    assert asyncio.run(main()) == "echo: thanks"
    assert fake_server.requests[-1]["messages"] == [
        *WIRE,
        {"role": "user", "content": "thanks"},
    ]
    with FsStore(root) as store:
        assert restore(store, MAIN).history[: len(TURN)] == TURN


def test_the_manager_sees_a_rewind_on_its_next_turn(
    fake_server: FakeServer, tmp_path: Path
) -> None:
    """A rewind by another store instance between turns: the next request leaves the
    dropped items out, and the manager's history follows the new head."""
    root = tmp_path / "sessions"

    async def main() -> None:
        async with _make_manager(fake_server, root) as manager:
            await manager.process_with_context("cli:r", "one")
            await manager.process_with_context("cli:r", "two")
            with FsStore(root) as other:
                dropped = rewind(other, "cli:r", 2)
            assert [item["content"] for item in dropped] == ["two", "echo: two"]
            await manager.process_with_context("cli:r", "three")
            history = manager.history("cli:r")
            assert [item["content"] for item in history] == [
                "one",
                "echo: one",
                "three",
                "echo: three",
            ]

    asyncio.run(main())
    assert [m["content"] for m in fake_server.requests[-1]["messages"]] == [
        "one",
        "echo: one",
        "three",
    ]


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_show_prints_responses_items(tmp_path: Path) -> None:
    """show labels each item with its role or kind, and prints its text, calls and results."""
    root = tmp_path / "sessions"
    _store_with(root, TURN)
    result = invoke("show", str(MAIN), "--storage-dir", str(root))
    assert result.exit_code == 0, result.output
    out = result.stdout
    for needle in (
        "[user ",
        "Weather?",
        "[reasoning ",
        "look",
        "[function_call ",
        '-> weather({"q": "Paris"})',
        "[function_call_output ",
        "(result of c1)",
        "sunny",
        "[web_search_call ",
        '"id": "ws_1"',
        "Sunny at noon.\nNo more.",
    ):
        assert needle in out, needle
    assert "9 messages" in out


def test_rewind_command(tmp_path: Path) -> None:
    """rewind -n N drops N items; too many is a one-line error and changes nothing."""
    root = tmp_path / "sessions"
    _store_with(root, TURN)
    result = invoke("rewind", str(MAIN), "-n", "2", "--storage-dir", str(root))
    assert result.exit_code == 0, result.output
    assert "dropped 2 items" in result.stderr
    with FsStore(root) as store:
        assert restore(store, MAIN).history == TURN[:-2]
    result = CliRunner().invoke(cli, ["rewind", str(MAIN), "-n", "99", "--storage-dir", str(root)])
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and "has only 7" in result.stderr
    result = CliRunner().invoke(cli, ["rewind", "cli:ghost", "--storage-dir", str(root)])
    assert result.exit_code == 1 and "cli:ghost" in result.stderr


@pytest.fixture
def store() -> MemoryStore:
    memory = MemoryStore()
    create_segment(memory, SegmentStartState(system_prompt="Be brief."), context=MAIN)
    head = memory.get_head(MAIN)
    assert head is not None
    save_delta(memory, head, copy.deepcopy(TURN))
    return memory


def test_markdown_and_html_render_responses_items(store: MemoryStore) -> None:
    """Each item under its role and kind: text, reasoning, calls, results, and the JSON of a
    kind with no Chat form."""
    md = str(export_context(store, MAIN, "markdown"))
    for needle in (
        "### User ·",
        "Weather?",
        "### Assistant (`reasoning`)",
        "> look",
        "### Assistant (`function_call`)",
        "**Tool call** `weather` (id `c1`)",
        "### Tool result (`function_call_output`) for `c1`",
        "### `web_search_call`",
        '"id": "ws_1"',
        "Sunny at noon.\nNo more.",
    ):
        assert needle in md, needle
    page = str(export_context(store, MAIN, "html"))
    for needle in (
        "Weather?",
        "<summary>Reasoning</summary>",
        '<span class="call-name">weather</span>',
        "Tool result</b> (function_call_output) for c1",
        "<b>web_search_call</b>",
        "Sunny at noon.\nNo more.",
    ):
        assert needle in page, needle


def test_openai_and_finetune_exports_are_chat_messages(store: MemoryStore) -> None:
    """The OpenAI formats hold what the server would be sent."""
    assert json.loads(export_context(store, MAIN, "openai")) == WIRE
    (record,) = [
        json.loads(line) for line in str(export_context(store, MAIN, "finetune")).splitlines()
    ]
    assert record["messages"] == WIRE


def test_terrarium_json_keeps_the_messages_with_text(store: MemoryStore) -> None:
    """The legacy format has user and assistant messages only: tool calls, results and
    reasoning are left out, as for Chat tool calls."""
    data = json.loads(export_context(store, MAIN, "terrarium-json"))
    assert [(m["role"], m["content"]) for m in data["messages"]] == [
        ("user", "Weather?"),
        ("assistant", "Checking."),
        ("assistant", "Sunny at noon.\nNo more."),
    ]


def test_jsonl_round_trips_every_item_type(store: MemoryStore) -> None:
    """The lossless export imports back to the same items and the same lines."""
    more = copy.deepcopy(RESPONSES_ITEMS)
    head = store.get_head(MAIN)
    assert head is not None
    save_delta(store, head, more)
    text = str(export_context(store, MAIN, "jsonl"))
    other = MemoryStore()
    import_context(other, text)
    assert restore(other, MAIN).history == [*TURN, *RESPONSES_ITEMS]
    assert str(export_context(other, MAIN, "jsonl")) == text


def test_compaction_summarises_a_responses_history(fake_server: FakeServer, tmp_path: Path) -> None:
    """The summary request carries the Chat form of the items; the compacted segment keeps
    the recent tail (from a user message on) exactly as stored."""
    root = tmp_path / "sessions"
    _store_with(root, [*TURN, *TURN])

    async def main() -> None:
        client = VLLMClient(base_url=fake_server.root_url, max_retries=0, backoff_base=0.001)
        async with MultiContextManager(
            client, storage_dir=str(root), keep_after_compaction=len(TURN)
        ) as manager:
            await manager.compact_context(str(MAIN))

    asyncio.run(main())
    sent = fake_server.requests[-1]["messages"]
    assert sent[: len(WIRE)] == WIRE
    assert sent[-1]["role"] == "user" and "summar" in sent[-1]["content"].lower()
    with FsStore(root) as store:
        state = restore(store, MAIN)
    assert state.origin.kind == "compaction"
    assert state.history[2:] == TURN


def test_compaction_size_counts_responses_calls_and_text() -> None:
    """A requested compaction measures a function_call's arguments as it does Chat calls'."""
    from terrarium.agent.compaction import size

    assert size([TURN[3]]) == len('{"q": "Paris"}')
    assert size([TURN[5], TURN[1]]) == len("sunny") + len("look")


def test_chat_history_command_labels_responses_items(
    fake_server: FakeServer, tmp_path: Path
) -> None:
    """/history in the chat shows each item under its role or kind, as show does."""
    root = tmp_path / "sessions"
    _store_with(root, TURN)
    result = CliRunner().invoke(
        cli,
        ["chat", str(MAIN), "--base-url", fake_server.base_url, "--storage-dir", str(root)],
        input="/history\n",
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    out = re.sub(r"\[(\w+) [\d-]+ [\d:]+\]", r"[\1]", result.stdout)  # as show: role and time
    assert "[reasoning]\nlook" in out
    assert '[function_call]\n-> weather({"q": "Paris"})' in out
    assert "[function_call_output]\n(result of c1)\nsunny" in out


def test_rewind_command_imports_a_legacy_file_first(tmp_path: Path) -> None:
    """A session only a legacy file holds is imported, then rewound; the file is untouched."""
    root = tmp_path / "sessions"
    path = root / "cli" / "2025-11-06" / "old.json"
    path.parent.mkdir(parents=True)
    messages = [
        {"role": "user", "content": "Hello!", "timestamp": "2025-11-06T14:30:00.123456"},
        {"role": "assistant", "content": "Hi!", "timestamp": "2025-11-06T14:30:03.456789"},
    ]
    path.write_text(json.dumps({"session_id": "old", "context_type": "cli", "messages": messages}))
    before = path.read_bytes()
    result = invoke("rewind", "cli:old", "--storage-dir", str(root))
    assert result.exit_code == 0, result.output
    with FsStore(root) as store:
        assert [m["content"] for m in restore(store, "cli:old").history] == ["Hello!"]
    assert path.read_bytes() == before
