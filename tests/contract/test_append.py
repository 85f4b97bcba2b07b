"""Contract: appending entries (seqs, atomicity, optimistic concurrency, round trips)."""

from __future__ import annotations

from typing import Any

import pytest

from terrarium import (
    ConflictError,
    ContextId,
    InvalidEntry,
    Item,
    PodActiveSegmentRef,
    Role,
    SegmentNotFound,
    Store,
    append_entries,
    append_entry,
    new_segment_id,
    new_session_id,
    read_entries,
    restore_by_segment,
    save_delta,
    save_extension,
    save_user_input,
)
from terrarium.stores.base import NewEntry

TS = "2026-05-01T12:00:00.000000Z"


def _entry(n: int, ts: str = TS) -> NewEntry:
    return NewEntry("item", ts, {"item": {"role": "assistant", "content": f"m{n}"}})


def _stored(store: Store, ref: PodActiveSegmentRef) -> list[dict[str, Any]]:
    return store.read_segment(ref.session_id, ref.segment_id).entries


def _history(store: Store, ref: PodActiveSegmentRef) -> list[dict[str, Any]]:
    return restore_by_segment(store, ref.session_id, ref.segment_id).history


def test_appends_get_consecutive_seqs(store: Store, main: PodActiveSegmentRef) -> None:
    """Each append returns the seq of its first entry; seqs run 1, 2, 3, ... without gaps."""
    firsts = [
        store.append(main.session_id, main.segment_id, [_entry(1)]),
        store.append(main.session_id, main.segment_id, [_entry(2)]),
        store.append(main.session_id, main.segment_id, [_entry(3), _entry(4), _entry(5)]),
        store.append(main.session_id, main.segment_id, [_entry(6)]),
    ]
    assert firsts == [1, 2, 3, 6]
    assert store.next_seq(main.session_id, main.segment_id) == 7
    stored = _stored(store, main)
    assert [line["seq"] for line in stored] == [1, 2, 3, 4, 5, 6]
    assert [line["item"]["content"] for line in stored] == [f"m{n}" for n in range(1, 7)]
    assert all(line["v"] == 1 and line["kind"] == "item" for line in stored)


def test_stored_entry_is_envelope_plus_data(store: Store, main: PodActiveSegmentRef) -> None:
    """An appended entry is stored as {v, seq, ts, kind} plus its data keys, nothing else."""
    data = {"item": {"role": "user", "content": "hi"}, "lang": "en"}
    store.append(main.session_id, main.segment_id, [NewEntry("user_input", TS, data)])
    assert _stored(store, main) == [{"v": 1, "seq": 1, "ts": TS, "kind": "user_input", **data}]


def test_empty_append_writes_nothing(store: Store, main: PodActiveSegmentRef) -> None:
    """Appending no entries writes nothing and returns the next seq."""
    store.append(main.session_id, main.segment_id, [_entry(1)])
    assert store.append(main.session_id, main.segment_id, []) == 2
    assert store.next_seq(main.session_id, main.segment_id) == 2
    assert len(_stored(store, main)) == 1


def test_multi_entry_append_is_contiguous(store: Store, main: PodActiveSegmentRef) -> None:
    """A multi-entry save_delta occupies consecutive seqs and keeps its order."""
    save_user_input(store, main, "q")
    items: list[Item | dict[str, Any]] = [
        {"role": "assistant", "content": None, "tool_calls": [_call("c1")]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
        Item.assistant("the answer is 42"),
    ]
    written = save_delta(store, main, items)
    assert [e.seq for e in written] == [2, 3, 4]
    assert [e.kind for e in written] == ["item", "item", "item"]
    assert [line["seq"] for line in _stored(store, main)] == [1, 2, 3, 4]
    assert [h["role"] for h in _history(store, main)] == ["user", "assistant", "tool", "assistant"]


def _call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}


def test_expected_seq_that_matches_appends(store: Store, main: PodActiveSegmentRef) -> None:
    """append with expected_seq equal to the next seq succeeds at that seq."""
    assert store.append(main.session_id, main.segment_id, [_entry(1)], expected_seq=1) == 1
    entries = save_delta(store, main, [Item.assistant("x"), Item.user("y")], expected_seq=2)
    assert [e.seq for e in entries] == [2, 3]
    assert save_user_input(store, main, "z", expected_seq=4).seq == 4


@pytest.mark.parametrize("expected", [0, 1, 3, 100])
def test_stale_expected_seq_conflicts_and_writes_nothing(
    store: Store, main: PodActiveSegmentRef, expected: int
) -> None:
    """append whose expected_seq is not the next seq raises ConflictError and writes nothing."""
    store.append(main.session_id, main.segment_id, [_entry(1)])
    before = store.read_segment(main.session_id, main.segment_id)
    with pytest.raises(ConflictError):
        store.append(
            main.session_id, main.segment_id, [_entry(2), _entry(3)], expected_seq=expected
        )
    with pytest.raises(ConflictError):
        save_delta(store, main, [Item.assistant("late")], expected_seq=expected)
    with pytest.raises(ConflictError):
        save_user_input(store, main, "late", expected_seq=expected)
    assert store.read_segment(main.session_id, main.segment_id) == before
    assert store.next_seq(main.session_id, main.segment_id) == 2


def test_an_append_that_cannot_be_encoded_writes_nothing(
    store: Store, main: PodActiveSegmentRef
) -> None:
    """A multi-entry append whose later entry cannot be encoded writes none of its entries."""
    save_user_input(store, main, "before")
    with pytest.raises(InvalidEntry, match="a value JSON has no form for"):
        store.append(
            main.session_id,
            main.segment_id,
            [_entry(1), NewEntry("extension", TS, {"domain": "d", "data": object()})],
        )
    with pytest.raises(InvalidEntry, match="a value JSON has no form for"):
        append_entries(store, main, [("turn_end", {}), ("extension", {"data": object()})])
    assert store.next_seq(main.session_id, main.segment_id) == 2
    assert [line["seq"] for line in _stored(store, main)] == [1]
    assert save_user_input(store, main, "after").seq == 2


def test_timestamps_going_backwards_do_not_change_order(
    store: Store, main: PodActiveSegmentRef
) -> None:
    """Order comes from seq alone: entries whose ts goes backwards keep their append order."""
    stamps = [
        "2026-05-01T12:00:00.000000Z",
        "2026-05-01T11:00:00.000000Z",
        "1999-12-31T23:59:59.999999Z",
        "2026-05-01T11:30:00.000000Z",
    ]
    for n, ts in enumerate(stamps):
        store.append(main.session_id, main.segment_id, [_entry(n, ts)])
    stored = _stored(store, main)
    assert [(line["seq"], line["ts"]) for line in stored] == list(enumerate(stamps, start=1))
    state = restore_by_segment(store, main.session_id, main.segment_id)
    assert [h["content"] for h in state.history] == ["m0", "m1", "m2", "m3"]
    assert state.last_active == stamps[-1]
    assert state.next_seq == 5


def test_unknown_kind_round_trips(store: Store, main: PodActiveSegmentRef) -> None:
    """An entry of an unknown kind is stored as given and kept in RestoredState.unknown."""
    data = {"payload": {"nested": [1, "two", None, True, {"k": 3.5}]}, "note": "from v1.9"}
    written = append_entry(store, main, "hologram", data)
    save_user_input(store, main, "after")
    state = restore_by_segment(store, main.session_id, main.segment_id)
    assert state.unknown == [{"v": 1, "seq": 1, "ts": written.ts, "kind": "hologram", **data}]
    assert state.history == [{"role": "user", "content": "after"}]
    assert state.next_seq == 3
    entries = read_entries(store, main)
    assert (entries[1].kind, entries[1].data) == ("hologram", data)


def test_unknown_keys_in_items_round_trip(store: Store, main: PodActiveSegmentRef) -> None:
    """Keys this version does not know, inside an item or a part, survive append and restore."""
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "listen", "audio": {"id": "a1", "format": "wav"}},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "look", "annotations": [{"kind": "cite"}]},
                {"type": "input_audio", "input_audio": {"data": "AAA=", "format": "mp3"}},
            ],
            "refusal": None,
            "x_vendor": {"score": 0.5},
        },
    ]
    save_delta(store, main, items)
    assert _history(store, main) == items


def test_unknown_keys_in_entries_round_trip(store: Store, main: PodActiveSegmentRef) -> None:
    """Unknown keys next to a known entry's own keys are stored and read back untouched."""
    data = {"item": {"role": "user", "content": "hi"}, "client": {"name": "irc", "v": 2}}
    store.append(main.session_id, main.segment_id, [NewEntry("user_input", TS, data)])
    store.append(main.session_id, main.segment_id, [NewEntry("turn_end", TS, {"why": "eos"})])
    assert read_entries(store, main)[1].data == data
    assert read_entries(store, main)[2].data == {"why": "eos"}
    state = restore_by_segment(store, main.session_id, main.segment_id)
    assert state.history == [{"role": "user", "content": "hi"}]
    assert state.turns == 1


def test_unknown_keys_in_a_header_round_trip(store: Store) -> None:
    """A header's unknown keys are stored as given and do not disturb restore."""
    session_id, segment_id = new_session_id(), new_segment_id()
    header = {
        "v": 1,
        "ts": TS,
        "kind": "header",
        "session_id": str(session_id),
        "segment_id": str(segment_id),
        "context": "cli:main",
        "origin": {"kind": "root", "x_note": "migrated"},
        "system_prompt": "sp",
        "config": {"model": "m"},
        "history": [{"role": "user", "content": "seed", "audio": {"id": "x"}}],
        "x_future": {"tags": ["a", "b"]},
    }
    store.create_context(ContextId("cli", "main"), header)
    read = store.read_segment(session_id, segment_id)
    assert read.header["x_future"] == {"tags": ["a", "b"]}
    assert read.header["origin"] == {"kind": "root", "x_note": "migrated"}
    ref = PodActiveSegmentRef(session_id, segment_id)
    assert read_entries(store, ref)[0].data["x_future"] == {"tags": ["a", "b"]}
    state = restore_by_segment(store, session_id, segment_id)
    assert state.history == header["history"]
    assert (state.system_prompt, state.config) == ("sp", {"model": "m"})


def test_any_text_round_trips(store: Store, main: PodActiveSegmentRef) -> None:
    """Item text of any Unicode, including NUL, newlines and U+2028, is read back exactly."""
    texts = [
        "nul\x00inside",
        "line\nbreak\r\n",
        "sep\u2028\u2029",
        "emoji 🐍🏳️‍🌈",
        "rtl \u202eabc",
        'quote " back \\ slash',
        "",
        "\x7f\x1b[31m",
    ]
    save_delta(store, main, [{"role": "user", "content": t} for t in texts])
    save_extension(store, main, "d", {"big": 2**63 - 1, "neg": -(2**63), "text": texts[0]})
    state = restore_by_segment(store, main.session_id, main.segment_id)
    assert [h["content"] for h in state.history] == texts
    assert state.extensions["d"] == {"big": 2**63 - 1, "neg": -(2**63), "text": texts[0]}


def test_envelope_keys_in_data_cannot_rewrite_the_envelope(
    store: Store, main: PodActiveSegmentRef
) -> None:
    """Entry data naming seq/kind/v/ts never changes the stored seq or kind of the entry."""
    try:
        append_entry(store, main, "custom", {"seq": 99, "kind": "item"})
    except InvalidEntry:
        pass  # refusing such data is fine too
    save_user_input(store, main, "after")
    stored = _stored(store, main)
    assert [line["seq"] for line in stored] == list(range(1, len(stored) + 1))
    state = restore_by_segment(store, main.session_id, main.segment_id)
    assert state.next_seq == store.next_seq(main.session_id, main.segment_id)


BAD_ITEMS: list[Any] = [
    {"role": "robot", "content": "beep"},
    {"content": "no role"},
    {"role": "user"},
    {"role": "assistant", "content": None},
    {"role": "user", "content": 42},
    {"role": "user", "content": [{"text": "part without type"}]},
    {"role": "user", "content": ["bare string part"]},
    "not a dict",
]


@pytest.mark.parametrize("bad", BAD_ITEMS, ids=repr)
def test_malformed_items_raise_invalid_entry_and_write_nothing(
    store: Store, main: PodActiveSegmentRef, bad: Any
) -> None:
    """A malformed item raises InvalidEntry from every write call; nothing is written."""
    save_user_input(store, main, "ok")
    good = {"role": "assistant", "content": "fine"}
    with pytest.raises(InvalidEntry):
        save_delta(store, main, [good, bad])
    with pytest.raises(InvalidEntry):
        save_delta(store, main, [bad])
    if not isinstance(bad, str):  # a string is the user's text
        with pytest.raises(InvalidEntry):
            save_user_input(store, main, bad)
    assert store.next_seq(main.session_id, main.segment_id) == 2
    assert _history(store, main) == [{"role": "user", "content": "ok"}]


def test_user_input_must_have_the_user_role(store: Store, main: PodActiveSegmentRef) -> None:
    """save_user_input refuses an item of another role with InvalidEntry; nothing is written."""
    with pytest.raises(InvalidEntry, match="'assistant'"):
        save_user_input(store, main, Item.assistant("not the user"))
    with pytest.raises(InvalidEntry, match="'system'"):
        save_user_input(store, main, {"role": "system", "content": "x"})
    assert store.next_seq(main.session_id, main.segment_id) == 1


@pytest.mark.parametrize("kind", ["header", ""])
def test_invalid_entry_kinds_are_refused(
    store: Store, main: PodActiveSegmentRef, kind: str
) -> None:
    """append_entry refuses the header kind and an empty kind; nothing is written."""
    with pytest.raises(InvalidEntry):
        append_entry(store, main, kind, {})
    with pytest.raises(InvalidEntry):
        save_extension(store, main, "", {"x": 1})
    assert store.next_seq(main.session_id, main.segment_id) == 1


def test_read_segment_stops_at_stop_seq(store: Store, main: PodActiveSegmentRef) -> None:
    """read_segment(stop_seq=N) returns entries 1..N inclusive; next_seq is the whole segment's."""
    store.append(main.session_id, main.segment_id, [_entry(n) for n in range(1, 6)])
    for stop, count in [(0, 0), (1, 1), (3, 3), (5, 5), (50, 5)]:
        read = store.read_segment(main.session_id, main.segment_id, stop_seq=stop)
        assert [line["seq"] for line in read.entries] == list(range(1, count + 1))
        assert read.next_seq == 6
        assert read.header["seq"] == 0
    state = restore_by_segment(store, main.session_id, main.segment_id, stop_seq=2)
    assert [h["content"] for h in state.history] == ["m1", "m2"]
    assert state.next_seq == 3


def test_append_to_unknown_segment_raises(store: Store, main: PodActiveSegmentRef) -> None:
    """Appending to a segment that does not exist raises SegmentNotFound."""
    with pytest.raises(SegmentNotFound):
        store.append(main.session_id, new_segment_id(), [_entry(1)])
    with pytest.raises(SegmentNotFound):
        save_user_input(store, PodActiveSegmentRef(main.session_id, new_segment_id()), "x")


def test_item_objects_are_stored_in_logged_form(store: Store, main: PodActiveSegmentRef) -> None:
    """Items given as Item objects are stored as OpenAI message dicts."""
    save_delta(store, main, [Item(Role.USER, "hi", name="nick"), Item.system("sys")])
    assert _history(store, main) == [
        {"role": "user", "content": "hi", "name": "nick"},
        {"role": "system", "content": "sys"},
    ]
