"""Contract: what each kind of entry does to the restored state; traces stay out of it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from terrarium import (
    POD_SCOPE_EXTENSION_DOMAIN,
    ContextId,
    Item,
    PodActiveSegmentRef,
    PodScopeSnapshot,
    RunStatus,
    SegmentNotFound,
    SegmentStartState,
    Store,
    SystemItem,
    TraceEntry,
    UsageRecord,
    UsageTotals,
    append_system_item,
    create_segment,
    fork,
    new_segment_id,
    read_entries,
    render_pod_event,
    restore,
    restore_by_segment,
    save_config_changed,
    save_delta,
    save_extension,
    save_pod_scope,
    save_run_completed,
    save_run_errored,
    save_trace,
    save_turn_end,
    save_usage,
    save_user_input,
)
from terrarium.model import RestoredState

CLI_MAIN = ContextId("cli", "main")


def _state(store: Store, ref: PodActiveSegmentRef) -> RestoredState:
    return restore_by_segment(store, ref.session_id, ref.segment_id)


def test_start_state_is_restored(store: Store) -> None:
    """A new context restores its start state: system prompt, config and initial history."""
    start = SegmentStartState(
        system_prompt="You are a bot.",
        config={"model": "qwen", "temperature": 0.7, "stop": ["\n\n"], "nested": {"a": None}},
        history=[Item.user("earlier"), {"role": "assistant", "content": "reply", "x": 1}],
    )
    create_segment(store, start, context=CLI_MAIN)
    state = restore(store, CLI_MAIN)
    assert state.system_prompt == "You are a bot."
    assert state.config == {
        "model": "qwen",
        "temperature": 0.7,
        "stop": ["\n\n"],
        "nested": {"a": None},
    }
    assert state.history == [
        {"role": "user", "content": "earlier"},
        {"role": "assistant", "content": "reply", "x": 1},
    ]
    assert (state.usage, state.extensions, state.last_run, state.turns) == (
        UsageTotals(),
        {},
        None,
        0,
    )
    assert state.unknown == []
    assert state.torn == []


def test_restore_by_context_equals_restore_of_its_head(
    store: Store, main: PodActiveSegmentRef
) -> None:
    """restore(context) is restore_by_segment of the context's head segment."""
    save_user_input(store, main, "hi")
    assert restore(store, CLI_MAIN) == _state(store, main)
    assert restore(store, "cli:main") == _state(store, main)


def test_history_keeps_the_order_of_all_history_kinds(
    store: Store, main: PodActiveSegmentRef
) -> None:
    """User input, model items and system items form one history in append order."""
    save_user_input(store, main, "what time is it?")
    save_delta(
        store,
        main,
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
        ],
    )
    append_system_item(store, main, SystemItem("resumed", {"after": "3h"}))
    save_delta(store, main, [Item.assistant("noon"), Item.user("thanks")])
    roles = [h["role"] for h in _state(store, main).history]
    assert roles == ["user", "assistant", "tool", "system", "assistant", "user"]
    kinds = [e.kind for e in read_entries(store, main)]
    assert kinds == ["header", "user_input", "item", "item", "system_item", "item", "user_input"]


def test_system_items_are_rendered_into_history(store: Store, main: PodActiveSegmentRef) -> None:
    """A system item adds render_pod_event's text as a system message; its detail is logged."""
    event = SystemItem("config_changed", {"model": "m2", "by": "op"})
    entry = append_system_item(store, main, event)
    assert _state(store, main).history == [
        {"role": "system", "content": "[event: config_changed] by=op model=m2"}
    ]
    assert render_pod_event(event) == "[event: config_changed] by=op model=m2"
    stored = read_entries(store, main)[entry.seq]
    assert stored.data["event"] == "config_changed"
    assert stored.data["detail"] == {"model": "m2", "by": "op"}


def test_usage_entries_sum_into_totals(store: Store, main: PodActiveSegmentRef) -> None:
    """Usage totals are the sums of every usage entry; calls counts them."""
    save_usage(store, main, UsageRecord("m", prompt_tokens=100, completion_tokens=20))
    save_usage(store, main, UsageRecord("m", 250, 30, cached_tokens=90))
    save_usage(store, main, UsageRecord("other"))
    usage = _state(store, main).usage
    assert usage == UsageTotals(prompt_tokens=350, completion_tokens=50, cached_tokens=90, calls=3)
    assert usage.total_tokens == 400


def test_last_run_is_the_latest_run_entry(store: Store, main: PodActiveSegmentRef) -> None:
    """last_run reports the latest run_completed or run_errored entry, with its seq and error."""
    assert _state(store, main).last_run is None
    save_run_completed(store, main, finish_reason="stop")
    assert _state(store, main).last_run == RunStatus("completed", 1)
    save_run_errored(store, main, TimeoutError("model timed out"))
    assert _state(store, main).last_run == RunStatus("errored", 2, "model timed out")
    save_user_input(store, main, "retry")
    save_run_errored(store, main, "server said 500")
    assert _state(store, main).last_run == RunStatus("errored", 4, "server said 500")
    save_run_errored(store, main, ValueError())
    assert _state(store, main).last_run == RunStatus("errored", 5, "ValueError")
    save_run_completed(store, main)
    assert _state(store, main).last_run == RunStatus("completed", 6)
    errored = read_entries(store, main)[2].data
    assert errored == {"error": "model timed out", "error_type": "TimeoutError"}


def test_config_changed_replaces_config_and_optionally_the_prompt(store: Store) -> None:
    """A config change replaces the config wholesale; the prompt changes only when given."""
    start = SegmentStartState(system_prompt="old", config={"model": "m1", "temperature": 0.2})
    session_id, segment_id = create_segment(store, start, context=CLI_MAIN)
    ref = PodActiveSegmentRef(session_id, segment_id)
    save_config_changed(store, ref, {"model": "m2"})
    state = _state(store, ref)
    assert (state.config, state.system_prompt) == ({"model": "m2"}, "old")
    save_config_changed(store, ref, {"model": "m3", "top_p": 0.9}, system_prompt="new")
    state = _state(store, ref)
    assert (state.config, state.system_prompt) == ({"model": "m3", "top_p": 0.9}, "new")
    save_config_changed(store, ref, {}, system_prompt=None)
    state = _state(store, ref)
    assert (state.config, state.system_prompt) == ({}, None)


def test_extensions_keep_the_latest_value_per_domain(
    store: Store, main: PodActiveSegmentRef
) -> None:
    """Each extension domain restores to its latest value; other domains are unaffected."""
    save_extension(store, main, "memory", {"facts": ["a"]})
    save_extension(store, main, "game", {"level": 1})
    save_extension(store, main, "memory", {"facts": ["a", "b"]})
    save_extension(store, main, "flags", None)
    assert _state(store, main).extensions == {
        "memory": {"facts": ["a", "b"]},
        "game": {"level": 1},
        "flags": None,
    }


def test_pod_scope_restores_the_latest_snapshot(store: Store, main: PodActiveSegmentRef) -> None:
    """save_pod_scope is an extension under POD_SCOPE_EXTENSION_DOMAIN; pod_scope reads it."""
    assert _state(store, main).pod_scope is None
    save_pod_scope(store, main, PodScopeSnapshot("/a", ("/a",), ("ls",)))
    latest = PodScopeSnapshot(working_dir="/b", allowed_paths=("/b", "/tmp"), tools=("sh", "web"))
    save_pod_scope(store, main, latest)
    state = _state(store, main)
    assert state.pod_scope == latest
    assert state.extensions[POD_SCOPE_EXTENSION_DOMAIN] == latest.to_dict()


def test_turns_count_turn_ends(store: Store, main: PodActiveSegmentRef) -> None:
    """turns is the number of turn_end entries; other entries do not count."""
    for n in range(3):
        save_user_input(store, main, f"q{n}")
        save_delta(store, main, [Item.assistant(f"a{n}")])
        save_turn_end(store, main)
    save_user_input(store, main, "unanswered")
    state = _state(store, main)
    assert state.turns == 3
    assert state.message_count == 7
    assert state.next_seq == 11


def test_next_seq_and_timestamps_follow_the_last_entry(
    store: Store, main: PodActiveSegmentRef
) -> None:
    """next_seq is the last seq + 1; created_at is the header's ts, last_active the last one's."""
    header_ts = read_entries(store, main)[0].ts
    state = _state(store, main)
    assert (state.next_seq, state.created_at, state.last_active) == (1, header_ts, header_ts)
    last = save_turn_end(store, main)
    state = _state(store, main)
    assert (state.next_seq, state.created_at, state.last_active) == (2, header_ts, last.ts)
    assert state.next_seq == store.next_seq(main.session_id, main.segment_id)


# --------------------------------------------------------------------------- traces


def _trace(n: int) -> TraceEntry:
    return TraceEntry(f"2026-01-01T00:00:0{n}.000000Z", "chunk", {"n": n, "delta": f"tok{n}"})


def test_traces_round_trip_in_order(store: Store, main: PodActiveSegmentRef) -> None:
    """read_trace returns every traced event of the segment, oldest first, as stored."""
    assert store.read_trace(main.session_id, main.segment_id) == []
    store.append_trace(main.session_id, main.segment_id, [_trace(1), _trace(2)])
    save_trace(store, main, [_trace(3)])
    assert store.read_trace(main.session_id, main.segment_id) == [
        _trace(n).to_dict() for n in (1, 2, 3)
    ]


def test_an_empty_trace_stores_nothing_and_still_checks_the_segment(
    store: Store, main: PodActiveSegmentRef
) -> None:
    """Saving no trace events stores nothing; a segment that does not exist is still refused."""
    save_trace(store, main, [])
    assert store.read_trace(main.session_id, main.segment_id) == []
    with pytest.raises(SegmentNotFound):
        store.append_trace(main.session_id, new_segment_id(), [])


def test_traces_do_not_affect_the_log(store: Store, main: PodActiveSegmentRef) -> None:
    """Traces are separate from the log: restore, read_entries and next_seq ignore them."""
    save_user_input(store, main, "hi")
    before = (_state(store, main), read_entries(store, main))
    save_trace(store, main, [_trace(1), _trace(2)])
    assert (_state(store, main), read_entries(store, main)) == before
    assert store.next_seq(main.session_id, main.segment_id) == 2
    assert save_turn_end(store, main).seq == 2


def test_traces_belong_to_one_segment(store: Store, main: PodActiveSegmentRef) -> None:
    """A fork has its own (empty) trace; tracing it leaves the parent's trace alone."""
    save_trace(store, main, [_trace(1)])
    branch = PodActiveSegmentRef(main.session_id, fork(store, main))
    assert store.read_trace(branch.session_id, branch.segment_id) == []
    save_trace(store, branch, [_trace(2)])
    assert store.read_trace(main.session_id, main.segment_id) == [_trace(1).to_dict()]
    assert store.read_trace(branch.session_id, branch.segment_id) == [_trace(2).to_dict()]


def test_tracing_an_unknown_segment_raises(
    store: Store, main: PodActiveSegmentRef, xfail_on: Callable[..., None]
) -> None:
    """append_trace to a segment that does not exist raises SegmentNotFound."""
    with pytest.raises(SegmentNotFound):
        store.append_trace(main.session_id, new_segment_id(), [_trace(1)])
