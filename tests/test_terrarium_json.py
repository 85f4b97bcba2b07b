"""The legacy Terrarium JSON format: reading, writing, import into the log and export from it."""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from terrarium import sessions
from terrarium.errors import ContextNotFound, InvalidContextId, InvalidEntry
from terrarium.formats import terrarium_json as tj
from terrarium.formats.terrarium_json import LegacyFormatError
from terrarium.model import (
    ContextId,
    Item,
    SegmentStartState,
    SystemItem,
    new_segment_id,
    new_session_id,
)
from terrarium.stores._files import leftovers
from terrarium.stores.base import PodActiveSegmentRef
from terrarium.stores.fs import FsStore
from terrarium.stores.memory import MemoryStore

# --------------------------------------------------------------------------- strategies

_KNOWN_TOP = {"session_id", "context_type", "system_prompt", "messages", "metadata"}
_KNOWN_META = {
    "created_at",
    "last_active",
    "message_count",
    "session_id",
    "context_type",
    "session_date",
}
_KNOWN_MESSAGE = {"role", "content", "timestamp"}


def _valid_name(name: str) -> bool:
    try:
        ContextId("cli", name)
    except InvalidContextId:
        return False
    return True


names = st.one_of(
    st.sampled_from(["#python", "main", "my chat", "café ☕", "π", "a:b", "CON", " x ", "100%"]),
    st.text(min_size=1, max_size=20).filter(_valid_name),
)
types = st.one_of(
    st.sampled_from(["cli", "irc", "game", "web"]),
    st.from_regex(r"[a-z][a-z0-9_-]{0,8}", fullmatch=True),
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


def extra_keys(known: set[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(
        st.text(min_size=1, max_size=8).filter(lambda k: k not in known), json_values, max_size=2
    )


@st.composite
def timestamps(draw: st.DrawFn) -> str:
    """ISO 8601 times as people and tools write them: naive, ``Z``, ``+00:00``, any offset."""
    when = draw(
        st.datetimes(
            min_value=dt.datetime.fromisoformat("2000-01-01T00:00:00"),
            max_value=dt.datetime.fromisoformat("2099-12-31T00:00:00"),
        )
    )
    spec = draw(st.sampled_from(["auto", "seconds", "milliseconds", "microseconds"]))
    style = draw(st.sampled_from(["naive", "z", "utc", "offset"]))
    if style == "naive":
        return when.isoformat(timespec=spec)
    if style == "z":
        return when.isoformat(timespec=spec) + "Z"
    minutes = 0 if style == "utc" else draw(st.integers(-14 * 60, 14 * 60))
    zone = dt.timezone(dt.timedelta(minutes=minutes))
    return when.replace(tzinfo=zone).isoformat(timespec=spec)


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": draw(st.sampled_from(["user", "assistant"])),
        "content": draw(st.text(max_size=40)),
        "timestamp": draw(timestamps()),
    }
    message.update(draw(extra_keys(_KNOWN_MESSAGE)))
    return message


@st.composite
def legacy_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """Complete legacy session files, keys in the order the old tool wrote them."""
    name, ctype = draw(names), draw(types)
    metadata: dict[str, Any] = {
        "created_at": draw(timestamps()),
        "last_active": draw(timestamps()),
        "message_count": draw(st.integers(0, 1000)),
        "session_id": name,
        "context_type": ctype,
        "session_date": draw(st.dates(dt.date(2000, 1, 1), dt.date(2099, 12, 31))).isoformat(),
    }
    metadata.update(draw(extra_keys(_KNOWN_META)))
    data: dict[str, Any] = {
        "session_id": name,
        "context_type": ctype,
        "system_prompt": draw(st.text(max_size=40)),
        "messages": draw(st.lists(messages(), max_size=5)),
        "metadata": metadata,
    }
    data.update(draw(extra_keys(_KNOWN_TOP)))
    return data


FAST = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@contextmanager
def tmp_store() -> Iterator[tuple[Path, FsStore]]:
    with tempfile.TemporaryDirectory() as tmp:
        store = FsStore(Path(tmp) / "sessions")
        try:
            yield Path(tmp), store
        finally:
            store.close()


def write_legacy(folder: Path, data: dict[str, Any], *, date: str | None = None) -> Path:
    """Write ``data`` where the old tool would: ``{type}/{date}/{name}.json``."""
    day = date or data["metadata"]["session_date"]
    path = folder / data["context_type"] / day / f"{data['session_id']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- round trips


@FAST
@given(data=legacy_dicts())
def test_load_dump_is_identity(data: dict[str, Any]) -> None:
    """A complete file reads and writes back unchanged, byte for byte."""
    with tempfile.TemporaryDirectory() as tmp:
        path = write_legacy(Path(tmp), data)
        session = tj.load(path)
        assert session.derived == frozenset()
        assert tj.dump(session) == data
        assert tj.dumps(session) == path.read_text(encoding="utf-8")
        copy = Path(tmp) / "copy.json"
        tj.write(copy, session)
        assert copy.read_bytes() == path.read_bytes()
        assert tj.load(copy) == session


@FAST
@given(data=legacy_dicts())
def test_import_then_export_gives_the_file_back(data: dict[str, Any]) -> None:
    """legacy -> native -> legacy keeps every field value, timestamps exactly as written."""
    with tmp_store() as (tmp, store):
        path = write_legacy(tmp / "legacy", data)
        before = path.read_bytes()
        session = tj.load(path)
        head = tj.import_session(store, session)
        context = ContextId(data["context_type"], data["session_id"])
        assert head.context == str(context)
        assert head.created_at == tj.to_log_ts(data["metadata"]["created_at"])
        assert tj.export_dict(store, context) == data
        assert json.loads(tj.export_context(store, context)) == data
        # Items stay pure OpenAI messages: timestamps live beside them, not inside.
        state = sessions.restore(store, context)
        assert state.history == [
            {"role": m["role"], "content": m["content"]} for m in data["messages"]
        ]
        assert state.system_prompt == data["system_prompt"]
        assert path.read_bytes() == before


@FAST
@given(data=legacy_dicts(), said=st.text(max_size=30), answered=st.text(max_size=30))
def test_turns_after_import_are_exported_with_their_times(
    data: dict[str, Any], said: str, answered: str
) -> None:
    """New turns follow the imported messages, stamped with their entries' times."""
    with tmp_store() as (tmp, store):
        path = write_legacy(tmp / "legacy", data)
        before = path.read_bytes()
        head = tj.import_session(store, tj.load(path))
        user = sessions.save_user_input(store, head, said)
        (reply,) = sessions.save_delta(store, head, [Item.assistant(answered)])
        sessions.save_turn_end(store, head)
        out = tj.export_dict(store, head.context)
        assert out["messages"][: len(data["messages"])] == data["messages"]
        assert out["messages"][len(data["messages"]) :] == [
            {"role": "user", "content": said, "timestamp": tj.to_legacy_ts(user.ts)},
            {"role": "assistant", "content": answered, "timestamp": tj.to_legacy_ts(reply.ts)},
        ]
        meta = out["metadata"]
        assert meta["message_count"] == len(data["messages"]) + 2
        state = sessions.restore(store, head.context)
        assert meta["last_active"] == tj.to_legacy_ts(state.last_active)
        for key in ("created_at", "session_id", "context_type", "session_date"):
            assert meta[key] == data["metadata"][key]
        assert path.read_bytes() == before
        # The export is itself a legacy file that reads back to the same thing.
        assert tj.dump(tj.from_dict(json.loads(tj.dumps(out)))) == out


# --------------------------------------------------------------------------- forgiving reads


def test_missing_metadata_is_derived_from_the_messages(tmp_path: Path) -> None:
    path = tmp_path / "irc" / "2025-11-06" / "#python.json"
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "a", "timestamp": "2025-11-06T14:30:00Z"},
                    {"role": "assistant", "content": "b"},
                    {"role": "user", "content": "c", "timestamp": "2025-11-06T15:00:00+01:00"},
                ]
            }
        )
    )
    session = tj.load(path)
    assert session.session_id == "#python"
    assert session.context_type == "irc"
    assert session.system_prompt == ""
    assert [m.timestamp for m in session.messages] == [
        "2025-11-06T14:30:00Z",
        "2025-11-06T14:30:00Z",  # a message without a time takes the one before it
        "2025-11-06T15:00:00+01:00",
    ]
    meta = session.metadata
    assert meta.created_at == "2025-11-06T14:30:00Z"
    assert meta.last_active == "2025-11-06T15:00:00+01:00"
    assert meta.message_count == 3
    assert (meta.session_id, meta.context_type, meta.session_date) == (
        "#python",
        "irc",
        "2025-11-06",
    )
    assert "metadata.created_at" in session.derived
    assert "messages[1].timestamp" in session.derived
    assert "messages[0].timestamp" not in session.derived


def test_created_at_falls_back_to_the_file_time(tmp_path: Path) -> None:
    path = tmp_path / "cli" / "empty.json"
    path.parent.mkdir()
    path.write_text('{"messages": [], "system_prompt": null}')
    stamp = dt.datetime(2024, 3, 9, 12, 0, 1, 250000, tzinfo=dt.UTC)
    ns = int(stamp.timestamp()) * 10**9 + 250_000_000
    os.utime(path, ns=(ns, ns))
    session = tj.load(path)
    assert session.metadata.created_at == "2024-03-09T12:00:01.250000"
    assert session.metadata.last_active == "2024-03-09T12:00:01.250000"
    assert session.metadata.session_date == "2024-03-09"  # no date folder: from created_at
    assert session.context_type == "cli"  # the flat layout's type folder
    assert session.system_prompt == ""


def test_top_level_file_must_name_its_type(tmp_path: Path) -> None:
    path = tmp_path / "main.json"
    path.write_text('{"messages": []}')
    with pytest.raises(LegacyFormatError, match="context_type"):
        tj.load(path, root=tmp_path)
    path.write_text('{"messages": [], "metadata": {"context_type": "web"}}')
    assert tj.load(path, root=tmp_path).context_type == "web"


def test_offsets_are_converted_for_the_log_and_kept_for_export() -> None:
    data = {
        "session_id": "main",
        "context_type": "cli",
        "system_prompt": "",
        "messages": [{"role": "user", "content": "hi", "timestamp": "2025-11-06T23:30:00-05:00"}],
        "metadata": {"created_at": "2025-11-06T23:30:00-05:00"},
    }
    store = MemoryStore()
    head = tj.import_session(store, tj.from_dict(data))
    assert head.created_at == "2025-11-07T04:30:00.000000Z"
    out = tj.export_dict(store, "cli:main")
    assert out["metadata"]["created_at"] == "2025-11-06T23:30:00-05:00"
    assert out["metadata"]["session_date"] == "2025-11-06"  # the date as written
    assert out["messages"][0]["timestamp"] == "2025-11-06T23:30:00-05:00"


# --------------------------------------------------------------------------- strict reads

BROKEN = {
    "not json": b"{nope",
    "not utf-8": b'{"messages": ["\xff"]}',
    "a list": b"[]",
    "no messages": b'{"session_id": "x"}',
    "messages not a list": b'{"messages": {}}',
    "message not an object": b'{"messages": ["hi"]}',
    "content not a string": b'{"messages": [{"role": "user", "content": 5}]}',
    "unknown role": b'{"messages": [{"role": "bot", "content": "x"}]}',
    "bad timestamp": b'{"messages": [{"role": "user", "content": "x", "timestamp": "yesterday"}]}',
    "metadata not an object": b'{"messages": [], "metadata": []}',
    "count not a number": b'{"messages": [], "metadata": {"message_count": "10"}}',
    "count a boolean": b'{"messages": [], "metadata": {"message_count": true}}',
    "bad session_date": b'{"messages": [], "metadata": {"session_date": "06/11/2025"}}',
    "session_id not a string": b'{"session_id": 5, "messages": []}',
    "system_prompt not a string": b'{"system_prompt": [], "messages": []}',
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_files_raise_one_line_naming_the_file(tmp_path: Path, name: str) -> None:
    path = tmp_path / "cli" / "2025-11-06" / "bad\nname.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(BROKEN[name])
    with pytest.raises(LegacyFormatError) as info:
        tj.load(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path.parent) + "/bad\\nname.json: ")
    assert isinstance(info.value, InvalidEntry)


# --------------------------------------------------------------------------- finding files


def test_iter_legacy_files_skips_the_native_store(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    store = FsStore(root)
    sessions.create_segment(store, context="cli:native")
    store.close()
    expected = [
        root / "cli" / "2025-11-06" / "main.json",
        root / "cli" / "flat.json",
        root / "irc" / "2025-11-06" / "#python.json",
        root / "top.json",
    ]
    for path in expected:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    (root / "cli" / "2025-11-06" / ".tmp-0123").write_text("{}")
    (root / "cli" / "2025-11-06" / "notes.txt").write_text("")
    (root / "cli" / "misc").mkdir()
    (root / "cli" / "misc" / "other.json").write_text("{}")
    (root / ".trash" / "x").mkdir(parents=True)
    (root / ".trash" / "x" / "old.json").write_text("{}")
    (root / "cli" / "2025-11-06" / "seg.jsonl").write_text("")
    assert list(tj.iter_legacy_files(root)) == expected
    assert list(tj.iter_legacy_files(tmp_path / "missing")) == []


# --------------------------------------------------------------------------- export


def test_export_of_a_native_context() -> None:
    """Only user and assistant text is exported; times are naive UTC with microseconds."""
    store = MemoryStore()
    session_id, segment_id = sessions.create_segment(
        store, SegmentStartState(system_prompt=None), context="irc:#chan"
    )
    ref = PodActiveSegmentRef(session_id, segment_id)
    said = sessions.save_user_input(store, ref, {"role": "user", "content": "hi", "name": "bob"})
    sessions.append_system_item(store, ref, SystemItem("resumed"))
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": ""}}],
    }
    tool = {"role": "tool", "tool_call_id": "1", "content": "42"}
    text = {"role": "assistant", "content": [{"type": "text", "text": "it is 42"}]}
    entries = sessions.save_delta(store, ref, [call, tool, text])
    out = tj.export_dict(store, "irc:#chan")
    head = store.get_head(ContextId.parse("irc:#chan"))
    assert head is not None
    state = sessions.restore(store, "irc:#chan")
    assert out == {
        "session_id": "#chan",
        "context_type": "irc",
        "system_prompt": "",
        "messages": [
            {
                "role": "user",
                "content": "hi",
                "timestamp": tj.to_legacy_ts(said.ts),
                "name": "bob",
            },
            {
                "role": "assistant",
                "content": "it is 42",
                "timestamp": tj.to_legacy_ts(entries[2].ts),
            },
        ],
        "metadata": {
            "created_at": tj.to_legacy_ts(head.created_at),
            "last_active": tj.to_legacy_ts(state.last_active),
            "message_count": 2,
            "session_id": "#chan",
            "context_type": "irc",
            "session_date": head.date,
        },
    }
    assert out["messages"][0]["timestamp"].endswith(said.ts[19:-1])  # microseconds, no Z


def test_export_after_compaction_keeps_the_legacy_metadata() -> None:
    store = MemoryStore()
    data = {
        "session_id": "main",
        "context_type": "cli",
        "system_prompt": "be brief",
        "messages": [
            {"role": "user", "content": "a", "timestamp": "2025-01-01T10:00:00"},
            {"role": "assistant", "content": "b", "timestamp": "2025-01-01T10:00:01"},
        ],
        "metadata": {
            "created_at": "2025-01-01T10:00:00",
            "last_active": "2025-01-01T10:00:01",
            "message_count": 2,
            "session_id": "main",
            "context_type": "cli",
            "session_date": "2025-01-01",
            "owner": "me",
        },
        "tags": ["x"],
    }
    head = tj.import_session(store, tj.from_dict(data))
    sessions.create_compacted_segment(
        store, head, [{"role": "assistant", "content": "summary"}], context="cli:main"
    )
    out = tj.export_dict(store, "cli:main")
    assert out["metadata"]["created_at"] == "2025-01-01T10:00:00"
    assert out["metadata"]["owner"] == "me"
    assert out["metadata"]["message_count"] == 1
    assert out["tags"] == ["x"]
    assert [m["content"] for m in out["messages"]] == ["summary"]


def test_import_into_another_context_renames_it() -> None:
    store = MemoryStore()
    data = {"session_id": "a/b", "context_type": "cli", "messages": []}
    session = tj.from_dict(data)
    with pytest.raises(InvalidContextId):
        tj.import_session(store, session)
    tj.import_session(store, session, context="cli:a-b")
    out = tj.export_dict(store, "cli:a-b")
    assert (out["session_id"], out["metadata"]["session_id"]) == ("a-b", "a-b")


def test_export_of_a_missing_context_raises() -> None:
    with pytest.raises(ContextNotFound):
        tj.export_context(MemoryStore(), "cli:nope")


def test_header_extra_may_not_replace_header_keys() -> None:
    with pytest.raises(InvalidEntry):
        sessions.create_segment_with_ids(
            MemoryStore(),
            new_session_id(),
            new_segment_id(),
            context="cli:x",
            header_extra={"history": []},
        )


def test_write_fits_names_near_the_file_name_limit(tmp_path: Path) -> None:
    """The temporary file's name does not grow with the session's name."""
    name = "é" * 120  # 240 bytes, 245 with ".json"
    session = tj.from_dict({"session_id": name, "context_type": "cli", "messages": []})
    path = tmp_path / f"{name}.json"
    tj.write(path, session)
    assert tj.load(path) == session
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert leftovers(path) == []
