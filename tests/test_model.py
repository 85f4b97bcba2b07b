"""The log model: context ids, name encoding, items and their logged form, log entries."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from terrarium import (
    ContextId,
    ImagePart,
    InvalidContextId,
    InvalidEntry,
    Item,
    LogEntry,
    PodScopeSnapshot,
    ReasoningPart,
    Role,
    SegmentOrigin,
    SystemItem,
    TextPart,
    ToolCallPart,
    UsageRecord,
    from_logged,
    render_pod_event,
    to_logged,
)
from terrarium.model import MAX_NAME_BYTES, UnknownPart, decode_name, encode_name, item_text

# --------------------------------------------------------------------------- context ids


@pytest.mark.parametrize(
    ("text", "type_", "name"),
    [
        ("cli:main", "cli", "main"),
        ("irc:#python", "irc", "#python"),
        ("game:pokemon_run1", "game", "pokemon_run1"),
        ("web:session_abc", "web", "session_abc"),
        ("matrix:!room:example.org", "matrix", "!room:example.org"),
        ("my-bot_2:x", "my-bot_2", "x"),
        ("a:日本語", "a", "日本語"),
        ("t" * 32 + ":n", "t" * 32, "n"),
    ],
)
def test_valid_context_ids_parse(text: str, type_: str, name: str) -> None:
    context = ContextId.parse(text)
    assert (context.type, context.name) == (type_, name)
    assert str(context) == text
    assert ContextId.parse(context) is context
    assert ContextId.parse(str(context)) == context


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty"),
        ("climain", "expected 'type:name'"),
        ("CLI:main", "invalid context type 'CLI'"),
        ("Cli:main", "invalid context type"),
        ("1cli:main", "invalid context type '1cli'"),
        ("_cli:main", "invalid context type"),
        (":main", "invalid context type ''"),
        ("c li:main", "invalid context type"),
        ("t" * 33 + ":main", "invalid context type"),
        ("cli:", "the name is empty"),
        ("cli:a\x00b", "control character"),
        ("cli:line\nbreak", "control character"),
        ("cli:del\x7f", "control character"),
        ("cli:tab\there", "control character"),
        ("cli:\x9bcsi", "control character"),
        ("cli:a/b", "contains '/'"),
        ("cli:/", "contains '/'"),
        ("cli:../etc", "contains '/'"),
        ("cli:.", "'.' and '..' are not names"),
        ("cli:..", "'.' and '..' are not names"),
        ("cli:" + "a" * (MAX_NAME_BYTES + 1), "longer than 255 bytes"),
        ("cli:" + "é" * 128, "longer than 255 bytes"),  # 128 characters, 256 bytes
        ("cli:" + "?" * 86, "longer than 255 bytes"),  # 86 characters, 258 bytes encoded
    ],
)
def test_invalid_context_ids_name_the_problem(text: str, problem: str) -> None:
    with pytest.raises(InvalidContextId, match=_literal(problem)):
        ContextId.parse(text)


def _literal(text: str) -> str:
    return re.escape(text)


def test_invalid_context_id_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        ContextId.parse("")
    with pytest.raises(InvalidContextId, match="must be a string"):
        ContextId.parse(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidContextId):
        ContextId("cli", "a/b")


def test_a_name_of_exactly_the_maximum_length_is_valid() -> None:
    assert len(ContextId("cli", "a" * MAX_NAME_BYTES).encoded_name.encode()) == MAX_NAME_BYTES
    assert ContextId("cli", "é" * 127).name == "é" * 127  # 254 bytes


def test_a_lone_surrogate_is_an_invalid_context_id() -> None:
    with pytest.raises(InvalidContextId):
        ContextId.parse("cli:bad\ud800")


def test_context_ids_sort_by_type_then_name() -> None:
    ids = [ContextId.parse(t) for t in ["irc:python", "cli:main", "irc:#python", "cli:alpha"]]
    assert [str(c) for c in sorted(ids)] == ["cli:alpha", "cli:main", "irc:#python", "irc:python"]
    assert ContextId.parse("irc:#python") != ContextId.parse("irc:python")


# --------------------------------------------------------------------------- name encoding


@given(st.text())
def test_encode_name_round_trips(name: str) -> None:
    assert decode_name(encode_name(name)) == name


@given(st.text(min_size=1))
def test_encoded_names_are_safe_file_names(name: str) -> None:
    encoded = encode_name(name)
    assert not any(c in encoded for c in '/\\\x00<>:"|?*')
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in encoded)
    assert not encoded.startswith((".", " "))
    assert not encoded.endswith((".", " "))
    assert encoded.split(".", 1)[0].upper() not in _WINDOWS_RESERVED


@given(st.text(), st.text())
def test_distinct_names_encode_distinctly(a: str, b: str) -> None:
    assert (encode_name(a) == encode_name(b)) == (a == b)


_WINDOWS_RESERVED = {"CON", "PRN", "AUX", "NUL"} | {
    f"{p}{i}" for p in ("COM", "LPT") for i in range(1, 10)
}


@pytest.mark.parametrize(
    "name",
    ["#python", "main", "pokemon_run1", "session_abc", "日本語", "a.b", "hello world", "x-y_z~!"],
)
def test_safe_names_stay_as_they_are(name: str) -> None:
    assert encode_name(name) == name


@pytest.mark.parametrize(
    ("name", "encoded"),
    [
        ("a/b", "a%2Fb"),
        ("..", "%2E%2E"),
        (".hidden", "%2Ehidden"),
        ("dot.", "dot%2E"),
        (" pad ", "%20pad%20"),
        ("100%", "100%25"),
        ("nul\x00", "nul%00"),
        ("CON", "%43ON"),
        ("con", "%63on"),
        ("Nul.txt", "%4Eul.txt"),
        ("com1", "%63om1"),
        ("LPT9.log", "%4CPT9.log"),
        ("CONSOLE", "CONSOLE"),
    ],
)
def test_unsafe_names_are_escaped(name: str, encoded: str) -> None:
    assert encode_name(name) == encoded
    assert decode_name(encoded) == name


# --------------------------------------------------------------------------- items


ITEMS = [
    Item.user("hi"),
    Item.assistant(""),
    Item.system("be terse"),
    Item(Role.USER, "hi", name="nick"),
    Item(Role.TOOL, "42", tool_call_id="call_1"),
    Item(Role.ASSISTANT, (ToolCallPart("call_1", "add", '{"a": 1, "b": 2}'),)),
    Item(
        Role.ASSISTANT,
        (
            TextPart("let me check"),
            ToolCallPart("c1", "search", '{"q": "x"}'),
            ToolCallPart("c2", "fetch", "{}"),
        ),
    ),
    Item(Role.USER, (TextPart("look at "), ImagePart("https://x/cat.png", "high"), TextPart("!"))),
    Item(Role.USER, (ImagePart("data:image/png;base64,AAAA"),)),
    Item(Role.ASSISTANT, (ReasoningPart("2+2 is 4"), TextPart("4"))),
    Item(Role.ASSISTANT, (ReasoningPart("thinking"), ToolCallPart("c", "f", "{}"))),
    Item(Role.USER, (UnknownPart({"type": "input_audio", "input_audio": {"data": "AA=="}}),)),
    Item(Role.USER, "listen", extra={"audio": {"id": "a1"}, "x_vendor": [1, None]}),
]


@pytest.mark.parametrize("item", ITEMS, ids=repr)
def test_items_round_trip_through_their_logged_form(item: Item) -> None:
    logged = to_logged(item)
    assert from_logged(logged) == item
    assert to_logged(from_logged(logged)) == logged


def test_logged_form_is_an_openai_message() -> None:
    item = Item(
        Role.ASSISTANT,
        (ReasoningPart("hm"), TextPart("calling"), ToolCallPart("c1", "f", '{"x": 1}')),
        extra={"audio": {"id": "a"}},
    )
    assert to_logged(item) == {
        "audio": {"id": "a"},
        "role": "assistant",
        "content": [{"type": "text", "text": "calling"}],
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
        ],
        "reasoning_content": "hm",
    }
    assert to_logged(Item(Role.ASSISTANT, (ToolCallPart("c", "f", "{}"),)))["content"] is None
    image = to_logged(Item(Role.USER, (ImagePart("u", "low"),)))
    assert image["content"] == [{"type": "image_url", "image_url": {"url": "u", "detail": "low"}}]


@pytest.mark.parametrize(
    "logged",
    [
        {"role": "user", "content": "hi", "audio": {"id": "a"}},
        {"role": "tool", "content": "ok", "tool_call_id": "c", "x": 1},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "file", "file": {}}]},
        {"role": "assistant", "content": "x", "reasoning_content": "why", "name": "bot"},
    ],
    ids=repr,
)
def test_logged_items_round_trip_through_item(logged: dict[str, Any]) -> None:
    assert to_logged(from_logged(logged)) == logged


def test_unknown_keys_inside_known_parts_survive_item_round_trip() -> None:
    logged = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "see [1]", "annotations": [{"type": "url_citation"}]},
            {"type": "image_url", "image_url": {"url": "u"}, "x": 1},
        ],
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}, "i": 0}
        ],
    }
    assert to_logged(from_logged(logged)) == logged


def test_item_text_joins_text_parts() -> None:
    item = Item(Role.USER, (TextPart("a"), ImagePart("u"), TextPart("b")))
    assert item.text == "ab"
    assert Item.user("plain").text == "plain"
    assert item_text(to_logged(item)) == "ab"
    assert item_text({"role": "assistant", "content": None}) == ""


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ({"role": "robot", "content": "x"}, "invalid role 'robot'"),
        ({"content": "x"}, "invalid role None"),
        ({"role": "user"}, "user history item has no content"),
        ({"role": "assistant", "content": None}, "assistant history item has no content"),
        ({"role": "user", "content": 3}, "must be a string or a list of typed parts"),
        ({"role": "user", "content": [{"text": "untyped"}]}, "list of typed parts"),
        (["role", "user"], "must be a dict"),
    ],
)
def test_from_logged_refuses_malformed_items(bad: Any, problem: str) -> None:
    with pytest.raises(InvalidEntry, match=_literal(problem)):
        from_logged(bad)


# --------------------------------------------------------------------------- entries, records


def test_log_entry_round_trips_through_its_line() -> None:
    line = {
        "v": 1,
        "seq": 7,
        "ts": "2026-01-01T00:00:00.000001Z",
        "kind": "user_input",
        "item": {"role": "user", "content": "hi"},
        "x_extra": [1],
    }
    entry = LogEntry.from_dict(line)
    assert entry == LogEntry(
        seq=7,
        kind="user_input",
        ts="2026-01-01T00:00:00.000001Z",
        data={"item": {"role": "user", "content": "hi"}, "x_extra": [1]},
        v=1,
    )
    assert entry.to_dict() == line
    assert list(entry.to_dict())[:4] == ["v", "seq", "ts", "kind"]


def test_log_entry_of_an_unknown_kind_and_no_version() -> None:
    entry = LogEntry.from_dict({"seq": 3, "ts": "t", "kind": "hologram", "blob": {"a": None}})
    assert (entry.v, entry.kind, entry.data) == (1, "hologram", {"blob": {"a": None}})
    assert LogEntry.from_dict(entry.to_dict()) == entry


@pytest.mark.parametrize(
    "origin",
    [
        SegmentOrigin.root(),
        SegmentOrigin("fork", parent=uuid.UUID(int=5), at_seq=0),
        SegmentOrigin("compaction", parent=uuid.UUID(int=7), at_seq=12),
        SegmentOrigin("import", source="/old/cli/main.json"),
    ],
)
def test_segment_origin_round_trips(origin: SegmentOrigin) -> None:
    assert SegmentOrigin.from_dict(origin.to_dict()) == origin


def test_records_to_dict() -> None:
    snapshot = PodScopeSnapshot("/w", ("/w", "/tmp"), ("sh",))
    assert PodScopeSnapshot.from_dict(snapshot.to_dict()) == snapshot
    assert PodScopeSnapshot.from_dict({}) == PodScopeSnapshot()
    usage = UsageRecord("m", 3, 4, 1)
    assert usage.to_dict() == {
        "model": "m",
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "cached_tokens": 1,
    }
    assert usage.total_tokens == 7


def test_render_pod_event() -> None:
    assert render_pod_event(SystemItem("resumed")) == "[event: resumed]"
    rendered = render_pod_event(SystemItem("resumed", {"b": 2, "after": "3h"}))
    assert rendered == "[event: resumed] after=3h b=2"
