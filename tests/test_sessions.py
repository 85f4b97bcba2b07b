"""The sessions API beyond the store contract: replay, entry reading and argument checks.

These use the reference MemoryStore; what every backend must do is in ``tests/contract/``.
"""

from __future__ import annotations

import gc
import uuid
from typing import Any

import pytest

from terrarium import (
    ContextId,
    ContextNotFound,
    EntryKind,
    InvalidContextId,
    InvalidEntry,
    Item,
    LogEntry,
    MemoryStore,
    PodActiveSegmentRef,
    Role,
    SegmentOrigin,
    SegmentStartState,
    UsageRecord,
    append_entries,
    append_entry,
    classify_history_item,
    codec,
    collect_state,
    create_segment,
    create_segment_with_ids,
    ensure_head_or_fork,
    fork,
    fork_at,
    read_entries,
    restore,
    restore_by_segment,
    save_delta,
    save_extension,
    save_turn_end,
    save_usage,
    save_user_input,
    sessions,
)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def ref(store: MemoryStore) -> PodActiveSegmentRef:
    start = SegmentStartState(system_prompt="sp", config={"model": "m"})
    session_id, segment_id = create_segment(store, start, context="cli:main")
    return PodActiveSegmentRef(session_id, segment_id)


def _fill(store: MemoryStore, ref: PodActiveSegmentRef) -> None:
    save_user_input(store, ref, "q")
    save_delta(store, ref, [Item.assistant("a")])
    save_usage(store, ref, UsageRecord("m", 5, 6))
    save_extension(store, ref, "d", 1)
    save_turn_end(store, ref)


def test_collect_state_over_log_entries_equals_restore(
    store: MemoryStore, ref: PodActiveSegmentRef
) -> None:
    _fill(store, ref)
    entries = read_entries(store, ref)
    assert all(isinstance(e, LogEntry) for e in entries)
    state = collect_state(entries)
    assert state == restore(store, "cli:main")
    assert state.history == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]
    assert (state.usage.prompt_tokens, state.turns, state.extensions) == (5, 1, {"d": 1})


def test_collect_state_accepts_dicts_and_entries_mixed(
    store: MemoryStore, ref: PodActiveSegmentRef
) -> None:
    _fill(store, ref)
    entries = read_entries(store, ref)
    mixed: list[Any] = [e.to_dict() if e.seq % 2 else e for e in entries]
    assert collect_state(mixed) == collect_state(entries)


def test_collect_state_needs_a_header_first(store: MemoryStore, ref: PodActiveSegmentRef) -> None:
    _fill(store, ref)
    entries = read_entries(store, ref)
    with pytest.raises(InvalidEntry, match="no header"):
        collect_state([])
    with pytest.raises(InvalidEntry, match="must start with its header"):
        collect_state(entries[1:])


def test_collect_state_continues_a_fork_header(
    store: MemoryStore, ref: PodActiveSegmentRef
) -> None:
    """A fork header without history continues the state folded so far."""
    _fill(store, ref)
    branch = PodActiveSegmentRef(ref.session_id, fork_at(store, ref, 2))
    save_user_input(store, branch, "more")
    lines = [*read_entries(store, ref, stop_seq=2), *read_entries(store, branch)]
    state = collect_state(lines)
    assert [h["content"] for h in state.history] == ["q", "a", "more"]
    assert state.segment_id == branch.segment_id
    assert state.next_seq == 2
    assert state == restore_by_segment(store, branch.session_id, branch.segment_id)


def test_read_entries_returns_the_segments_own_lines(
    store: MemoryStore, ref: PodActiveSegmentRef
) -> None:
    _fill(store, ref)
    entries = read_entries(store, ref)
    assert [(e.seq, e.kind) for e in entries] == [
        (0, "header"),
        (1, "user_input"),
        (2, "item"),
        (3, "usage"),
        (4, "extension"),
        (5, "turn_end"),
    ]
    assert entries[0].data["session_id"] == str(ref.session_id)
    assert entries[0].data["system_prompt"] == "sp"
    assert [e.seq for e in read_entries(store, ref, stop_seq=2)] == [0, 1, 2]
    branch = PodActiveSegmentRef(ref.session_id, fork(store, ref))
    assert [e.kind for e in read_entries(store, branch)] == ["header"]


@pytest.mark.parametrize(
    ("item", "kind"),
    [
        (Item.user("u"), EntryKind.USER_INPUT),
        (Item.assistant("a"), EntryKind.ITEM),
        (Item.system("s"), EntryKind.ITEM),
        (Item(Role.TOOL, "r", tool_call_id="c"), EntryKind.ITEM),
        ({"role": "user", "content": "u"}, EntryKind.USER_INPUT),
        ({"role": "assistant", "content": "a"}, EntryKind.ITEM),
        ({"role": "tool", "content": "r", "tool_call_id": "c"}, EntryKind.ITEM),
        ({"role": "system", "content": "s"}, EntryKind.ITEM),
    ],
    ids=repr,
)
def test_classify_history_item(item: Any, kind: EntryKind) -> None:
    assert classify_history_item(item) is kind


def test_save_delta_logs_user_items_as_user_input(
    store: MemoryStore, ref: PodActiveSegmentRef
) -> None:
    written = save_delta(store, ref, [Item.user("u"), Item.assistant("a"), Item.user("v")])
    assert [e.kind for e in written] == ["user_input", "item", "user_input"]
    assert [e.kind for e in read_entries(store, ref)[1:]] == ["user_input", "item", "user_input"]
    assert written == read_entries(store, ref)[1:]


@pytest.mark.parametrize("at_seq", [-1, 3, 100])
def test_fork_at_out_of_range_names_the_range(
    store: MemoryStore, ref: PodActiveSegmentRef, at_seq: int
) -> None:
    save_user_input(store, ref, "one")
    save_user_input(store, ref, "two")
    with pytest.raises(InvalidEntry, match=rf"at entry {at_seq}: it has entries 0\.\.2"):
        fork_at(store, ref, at_seq)
    assert store.list_segments(ref.session_id) == [ref.segment_id]


def test_append_entries_returns_what_was_stored(
    store: MemoryStore, ref: PodActiveSegmentRef
) -> None:
    written = append_entries(store, ref, [("turn_end", {}), ("hologram", {"x": [1]})])
    assert [(e.seq, e.kind, dict(e.data)) for e in written] == [
        (1, "turn_end", {}),
        (2, "hologram", {"x": [1]}),
    ]
    assert written == read_entries(store, ref)[1:]


@pytest.mark.parametrize("kind", ["header", "", None])
def test_append_entries_refuses_an_invalid_kind_and_writes_nothing(
    store: MemoryStore, ref: PodActiveSegmentRef, kind: Any
) -> None:
    with pytest.raises(InvalidEntry, match="invalid entry kind"):
        append_entries(store, ref, [("turn_end", {}), (kind, {})])
    with pytest.raises(InvalidEntry, match="invalid entry kind"):
        append_entry(store, ref, kind, {})
    assert store.next_seq(ref.session_id, ref.segment_id) == 1


def test_create_segment_with_ids_uses_the_given_ids_origin_and_time(store: MemoryStore) -> None:
    session_id, segment_id = uuid.UUID(int=1), uuid.UUID(int=2)
    origin = SegmentOrigin("import", source="/legacy/cli/main.json")
    head = create_segment_with_ids(
        store,
        session_id,
        segment_id,
        SegmentStartState(history=[Item.user("old")]),
        context="cli:imported",
        origin=origin,
        ts="2024-03-04T05:06:07.000000Z",
    )
    assert (head.session_id, head.segment_id, head.date) == (session_id, segment_id, "2024-03-04")
    state = restore(store, "cli:imported")
    assert state.origin == origin
    assert state.created_at == "2024-03-04T05:06:07.000000Z"
    assert state.history == [{"role": "user", "content": "old"}]


def test_create_or_join_creates_a_new_context_or_continues_the_one_there(
    store: MemoryStore, ref: PodActiveSegmentRef
) -> None:
    ids = (uuid.UUID(int=3), uuid.UUID(int=4))
    made = sessions.create_or_join(store, ContextId.parse("cli:new"), ids=ids)
    assert (made.session_id, made.segment_id) == ids
    found = sessions.create_or_join(store, ContextId.parse("cli:main"), ids=ids)
    assert (found.session_id, found.segment_id) == (ref.session_id, ref.segment_id)


def test_restore_of_unknown_or_invalid_context(store: MemoryStore) -> None:
    # The same words as every other "no such context" (sessions.require_head, one rule).
    with pytest.raises(ContextNotFound, match=r"^no session 'cli:nothing'$"):
        restore(store, "cli:nothing")
    with pytest.raises(InvalidContextId):
        restore(store, "nothing")
    with pytest.raises(InvalidContextId):
        create_segment(store, context="CLI:main")
    assert store.list_contexts() == []


def test_ensure_head_or_fork_of_unknown_context(
    store: MemoryStore, ref: PodActiveSegmentRef
) -> None:
    with pytest.raises(ContextNotFound):
        ensure_head_or_fork(store, ContextId("cli", "other"), ref, 1)


def test_ensure_head_or_fork_with_an_impossible_view(
    store: MemoryStore, ref: PodActiveSegmentRef
) -> None:
    """A view ahead of the segment cannot be forked: InvalidEntry, the head stays."""
    with pytest.raises(InvalidEntry):
        ensure_head_or_fork(store, "cli:main", ref, 5)
    head = store.get_head(ContextId("cli", "main"))
    assert head is not None and head.segment_id == ref.segment_id


def test_restore_by_segment_stop_seq_follows_a_fork_lineage(
    store: MemoryStore, ref: PodActiveSegmentRef
) -> None:
    save_delta(store, ref, [Item.user("a"), Item.assistant("b")])
    branch = PodActiveSegmentRef(ref.session_id, fork(store, ref))
    save_delta(store, branch, [Item.user("c"), Item.assistant("d")])
    state = restore_by_segment(store, branch.session_id, branch.segment_id, stop_seq=1)
    assert [h["content"] for h in state.history] == ["a", "b", "c"]
    assert state.next_seq == 2


def _lines(count: int) -> bytes:
    return b"".join(
        codec.encode_line({"v": 1, "seq": seq, "ts": "t", "kind": "item", "item": {"n": [seq]}})
        for seq in range(count)
    )


def _in_oldest_generation(objects: list[Any]) -> list[bool]:
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    return [id(o) in oldest for o in objects]


@pytest.mark.parametrize("count", [codec.PROMOTE_AT, codec.PROMOTE_AT - 1])
def test_a_bulk_decode_puts_its_entries_in_the_collectors_oldest_generation(count: int) -> None:
    """Restored entries live long and hold no cycles: young collections need not walk them."""
    data = _lines(count)
    gc.disable()  # no collection moves them meanwhile
    try:
        entries = codec.decode_lines(data, where="x")
        assert (
            _in_oldest_generation([entries[0], entries[-1]["item"]])
            == [count >= codec.PROMOTE_AT] * 2
        )
    finally:
        gc.enable()


def test_a_bulk_decode_leaves_the_programs_frozen_objects_frozen() -> None:
    kept = [{"frozen": "by the program"}]
    gc.disable()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        entries = codec.decode_lines(_lines(codec.PROMOTE_AT), where="x")
        assert gc.get_freeze_count() == frozen
        assert _in_oldest_generation([kept, entries[0]]) == [False, False]
    finally:
        gc.unfreeze()
        gc.enable()
