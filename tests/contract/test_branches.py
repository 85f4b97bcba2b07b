"""Contract: the session tree (fork, fork_at, compaction, clear, fork_context, stale writers)."""

from __future__ import annotations

from typing import Any

import pytest

from terrarium import (
    ConflictError,
    ContextExists,
    ContextId,
    ContextNotFound,
    Item,
    PodActiveSegmentRef,
    PodScopeSnapshot,
    RestoredState,
    SegmentId,
    SegmentStartState,
    Store,
    UsageRecord,
    clear_segment,
    create_compacted_segment,
    create_segment,
    ensure_head_or_fork,
    fork,
    fork_at,
    fork_context,
    restore,
    restore_by_segment,
    save_config_changed,
    save_delta,
    save_extension,
    save_pod_scope,
    save_run_completed,
    save_turn_end,
    save_usage,
    save_user_input,
    states,
)
from terrarium.model import UsageTotals
from terrarium.stores.base import SegmentRead

CLI_MAIN = ContextId("cli", "main")
START = SegmentStartState(system_prompt="You are terse.", config={"model": "m1", "t": 0.5})


def _new(store: Store, context: ContextId | str = CLI_MAIN) -> PodActiveSegmentRef:
    session_id, segment_id = create_segment(store, START, context=context)
    return PodActiveSegmentRef(session_id, segment_id)


def _on(ref: PodActiveSegmentRef, segment_id: SegmentId) -> PodActiveSegmentRef:
    return PodActiveSegmentRef(ref.session_id, segment_id)


def _say(store: Store, ref: PodActiveSegmentRef, *texts: str) -> None:
    """A turn per text: the user says it, the assistant echoes it."""
    for text in texts:
        save_user_input(store, ref, text)
        save_delta(store, ref, [Item.assistant(f"re: {text}")])
        save_turn_end(store, ref)


def _state(store: Store, ref: PodActiveSegmentRef) -> RestoredState:
    return restore_by_segment(store, ref.session_id, ref.segment_id)


def _texts(state: RestoredState) -> list[str]:
    return [item["content"] for item in state.history]


def _said(*texts: str) -> list[str]:
    return [line for text in texts for line in (text, f"re: {text}")]


def _essence(state: RestoredState) -> dict[str, Any]:
    """What a restore yields, minus where it was read from."""
    return {
        "history": state.history,
        "system_prompt": state.system_prompt,
        "config": state.config,
        "usage": state.usage,
        "extensions": state.extensions,
        "turns": state.turns,
        "last_run": state.last_run,
        "context": state.context,
    }


def _head(store: Store, context: ContextId = CLI_MAIN) -> SegmentId:
    head = store.get_head(context)
    assert head is not None
    return head.segment_id


# --------------------------------------------------------------------------- fork


def test_fork_copies_nothing(store: Store) -> None:
    """A fork's segment holds only a header naming its parent and entry; restore replays it."""
    root = _new(store)
    _say(store, root, "a", "b")
    parent_state = _state(store, root)
    branch = _on(root, fork(store, root))
    read = store.read_segment(branch.session_id, branch.segment_id)
    assert read.entries == []
    assert read.header["history"] is None
    assert read.header["origin"] == {"kind": "fork", "parent": str(root.segment_id), "at_seq": 6}
    state = _state(store, branch)
    assert _essence(state) == _essence(parent_state)
    assert state.segment_id == branch.segment_id
    assert state.next_seq == 1
    assert (state.origin.kind, state.origin.parent, state.origin.at_seq) == (
        "fork",
        root.segment_id,
        6,
    )


def test_fork_does_not_move_the_head(store: Store) -> None:
    """fork and fork_at add a segment to the session but leave the context's head alone."""
    root = _new(store)
    _say(store, root, "a")
    b1, b2 = fork(store, root), fork_at(store, root, 1)
    assert _head(store) == root.segment_id
    assert store.list_segments(root.session_id) == [root.segment_id, b1, b2]


def test_fork_at_a_past_point_leaves_the_original_untouched(store: Store) -> None:
    """fork_at(N) continues entries 0..N; the original keeps all its entries and stays writable."""
    root = _new(store)
    _say(store, root, "a", "b", "c")
    before = store.read_segment(root.session_id, root.segment_id)
    branch = _on(root, fork_at(store, root, 3))  # after the first turn
    assert store.read_segment(root.session_id, root.segment_id) == before
    assert _texts(_state(store, branch)) == _said("a")
    assert _state(store, branch).turns == 1

    _say(store, branch, "x")
    _say(store, root, "d")
    assert _texts(_state(store, branch)) == _said("a", "x")
    assert _texts(_state(store, root)) == _said("a", "b", "c", "d")
    assert _state(store, root).next_seq == 13
    assert _state(store, branch).next_seq == 4


def test_fork_at_the_header_starts_from_the_start_state(store: Store) -> None:
    """fork_at(0) continues only the header: the start state and none of the entries."""
    root = _new(store)
    _say(store, root, "a")
    save_config_changed(store, root, {"model": "m2"}, system_prompt="new prompt")
    state = _state(store, _on(root, fork_at(store, root, 0)))
    assert state.history == []
    assert (state.system_prompt, state.config) == (START.system_prompt, dict(START.config))
    assert state.turns == 0


def test_fork_of_a_fork_replays_the_whole_lineage(store: Store) -> None:
    """A fork of a fork restores root prefix + first fork's prefix + its own entries."""
    root = _new(store)
    _say(store, root, "a", "b")
    first = _on(root, fork_at(store, root, 3))
    _say(store, first, "x", "y")
    second = _on(root, fork_at(store, first, 3))  # after "x"
    _say(store, second, "z")
    third = _on(root, fork(store, second))
    assert _texts(_state(store, second)) == _said("a", "x", "z")
    assert _texts(_state(store, third)) == _said("a", "x", "z")
    assert _texts(_state(store, first)) == _said("a", "x", "y")
    assert _texts(_state(store, root)) == _said("a", "b")
    assert _state(store, third).turns == 3
    assert _state(store, third).context == "cli:main"


def test_fork_carries_state_up_to_the_fork_point(store: Store) -> None:
    """A fork inherits config, usage, extensions and last run as they were at the fork point."""
    root = _new(store)
    save_usage(store, root, UsageRecord("m1", 10, 5, 2))
    save_extension(store, root, "memo", {"k": 1})
    save_run_completed(store, root, finish_reason="stop")  # seq 3
    at = store.next_seq(root.session_id, root.segment_id) - 1
    save_usage(store, root, UsageRecord("m1", 100, 50))
    save_extension(store, root, "memo", {"k": 2})
    save_config_changed(store, root, {"model": "m2"})
    state = _state(store, _on(root, fork_at(store, root, at)))
    assert (state.usage.prompt_tokens, state.usage.completion_tokens) == (10, 5)
    assert (state.usage.cached_tokens, state.usage.calls) == (2, 1)
    assert state.extensions == {"memo": {"k": 1}}
    assert state.config == dict(START.config)
    assert state.last_run is not None
    assert (state.last_run.status, state.last_run.seq) == ("completed", 3)


# --------------------------------------------------------------------------- compaction


class _CountingStore:
    """Wraps a store and records which segments are read."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.reads: list[SegmentId] = []

    def read_segment(self, session_id: Any, segment_id: Any, *, stop_seq: Any = None) -> Any:
        self.reads.append(segment_id)
        result: SegmentRead = self.inner.read_segment(session_id, segment_id, stop_seq=stop_seq)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_restore_after_compaction_equals_the_compacted_state(store: Store) -> None:
    """After compaction, restore yields the summary plus carried config, usage and extensions."""
    root = _new(store)
    _say(store, root, *[f"turn {n}" for n in range(150)])  # 450 entries of old history
    save_usage(store, root, UsageRecord("m1", 1000, 200, 50))
    save_pod_scope(store, root, PodScopeSnapshot("/w", ("/w",), ("sh",)))
    old = _state(store, root)
    summary = [Item.system("Summary: 150 turns about numbers."), Item.user("and now?")]
    new = create_compacted_segment(store, root, summary, context=CLI_MAIN)
    assert _head(store) == new

    state = restore(store, CLI_MAIN)
    assert state.segment_id == new
    assert state.history == [
        {"role": "system", "content": "Summary: 150 turns about numbers."},
        {"role": "user", "content": "and now?"},
    ]
    assert (state.system_prompt, state.config) == (old.system_prompt, old.config)
    assert state.usage == old.usage
    assert state.usage_by_model == old.usage_by_model == {"m1": old.usage}
    assert state.turns == 150
    assert state.extensions == old.extensions
    assert state.pod_scope == PodScopeSnapshot("/w", ("/w",), ("sh",))
    assert state.next_seq == 1
    assert (state.origin.kind, state.origin.parent, state.origin.at_seq) == (
        "compaction",
        root.segment_id,
        old.next_seq - 1,
    )

    counting = _CountingStore(store)
    restore_by_segment(counting, root.session_id, new)
    assert counting.reads == [new]  # the old history is not read at all


def test_compaction_keeps_the_old_segment_readable(store: Store) -> None:
    """Compaction starts a new segment; the old one and its entries stay in the session tree."""
    root = _new(store)
    _say(store, root, "a", "b")
    before = store.read_segment(root.session_id, root.segment_id)
    new = create_compacted_segment(store, root, [Item.system("sum")], context=CLI_MAIN)
    assert store.list_segments(root.session_id) == [root.segment_id, new]
    assert store.read_segment(root.session_id, root.segment_id) == before
    assert _texts(_state(store, root)) == _said("a", "b")
    _say(store, _on(root, new), "c")
    assert _texts(restore(store, CLI_MAIN)) == ["sum", *_said("c")]


def test_compaction_can_replace_the_system_prompt(store: Store) -> None:
    """create_compacted_segment(system_prompt=...) starts the new segment with that prompt."""
    root = _new(store)
    new = create_compacted_segment(store, root, [], system_prompt="Now be verbose.")
    state = _state(store, _on(root, new))
    assert state.system_prompt == "Now be verbose."
    assert _head(store) == root.segment_id  # no context given: the head stays


def test_compaction_of_a_stale_head_conflicts(store: Store) -> None:
    """Compacting with a context whose head moved elsewhere raises ConflictError; head stays."""
    root = _new(store)
    branch = fork(store, root)
    store.set_head(CLI_MAIN, branch, expected=root.segment_id)
    with pytest.raises(ConflictError):
        create_compacted_segment(store, root, [Item.system("sum")], context=CLI_MAIN)
    assert _head(store) == branch


def test_compaction_of_a_fork_replays_from_the_summary(store: Store) -> None:
    """Compacting a fork yields the summary; later forks of it do not reach back past it."""
    root = _new(store)
    _say(store, root, "a", "b")
    branch = _on(root, fork_at(store, root, 3))
    _say(store, branch, "x")
    compacted = _on(root, create_compacted_segment(store, branch, [Item.system("sum a x")]))
    _say(store, compacted, "y")
    again = _on(root, fork(store, compacted))
    assert _texts(_state(store, again)) == ["sum a x", *_said("y")]
    assert _state(store, again).turns == 3


# --------------------------------------------------------------------------- clear


def test_clear_starts_empty_but_keeps_prompt_and_config(store: Store) -> None:
    """Clear starts an empty history on the head with the same system prompt and config."""
    root = _new(store)
    save_config_changed(store, root, {"model": "m2"}, system_prompt="changed")
    _say(store, root, "a", "b")
    save_usage(store, root, UsageRecord("m2", 7, 3))
    cleared = clear_segment(store, root, context=CLI_MAIN)
    assert _head(store) == cleared
    state = restore(store, CLI_MAIN)
    assert state.history == []
    assert (state.system_prompt, state.config) == ("changed", {"model": "m2"})
    assert state.origin.kind == "clear"
    assert state.origin.parent == root.segment_id
    assert state.usage.prompt_tokens == 7
    assert state.next_seq == 1


def test_cleared_history_stays_readable(store: Store) -> None:
    """After a clear, the old segment is still listed and restores to the old history."""
    root = _new(store)
    _say(store, root, "old")
    cleared = clear_segment(store, root, context=CLI_MAIN)
    _say(store, _on(root, cleared), "new")
    segments = store.list_segments(root.session_id)
    assert segments == [root.segment_id, cleared]
    assert [_texts(_state(store, _on(root, s))) for s in segments] == [_said("old"), _said("new")]


# --------------------------------------------------------------------------- fork_context


def test_fork_context_copies_into_an_isolated_context(store: Store) -> None:
    """fork_context makes a new context in a new session; later source writes stay out of it."""
    root = _new(store)
    _say(store, root, "a")
    save_extension(store, root, "memo", [1])
    head = fork_context(store, CLI_MAIN, "cli:copy")
    assert head.context == "cli:copy"
    assert head.session_id != root.session_id
    copy = restore(store, "cli:copy")
    assert _texts(copy) == _said("a")
    assert (copy.system_prompt, copy.config) == (START.system_prompt, dict(START.config))
    assert copy.extensions == {"memo": [1]}
    assert copy.context == "cli:copy"
    assert (copy.origin.kind, copy.origin.parent, copy.origin.source) == (
        "fork",
        root.segment_id,
        "cli:main",
    )

    _say(store, root, "b")
    _say(store, head.ref, "c")
    assert _texts(restore(store, "cli:copy")) == _said("a", "c")
    assert _texts(restore(store, CLI_MAIN)) == _said("a", "b")
    assert store.list_segments(head.session_id) == [head.segment_id]


def test_fork_context_at_a_past_entry(store: Store) -> None:
    """fork_context(at_seq=N) copies the source's history after entry N only; its figures
    (turns, usage) start afresh: they were spent, and are counted, in the source."""
    root = _new(store)
    _say(store, root, "a", "b")
    save_usage(store, root, UsageRecord("m1", 10, 5))
    fork_context(store, CLI_MAIN, "web:copy", at_seq=3)
    copy = restore(store, "web:copy")
    assert _texts(copy) == _said("a")
    assert (copy.turns, copy.usage, copy.usage_by_model) == (0, UsageTotals(), {})
    assert restore(store, CLI_MAIN).turns == 2


def test_fork_context_survives_deleting_the_source(store: Store) -> None:
    """A context forked from another keeps its history when the source is deleted."""
    root = _new(store)
    _say(store, root, "a")
    fork_context(store, CLI_MAIN, "cli:copy")
    states.delete_context(store, CLI_MAIN)
    assert _texts(restore(store, "cli:copy")) == _said("a")


def test_fork_context_refuses_existing_targets_and_unknown_sources(store: Store) -> None:
    """fork_context raises ContextExists for an existing target, ContextNotFound for no source."""
    _new(store)
    _new(store, "cli:taken")
    with pytest.raises(ContextExists):
        fork_context(store, CLI_MAIN, "cli:taken")
    with pytest.raises(ContextNotFound):
        fork_context(store, "cli:nothing", "cli:new")
    assert store.get_head(ContextId("cli", "new")) is None


# --------------------------------------------------------------------------- stale writers


def test_ensure_head_or_fork_with_a_fresh_view_returns_the_same_segment(store: Store) -> None:
    """A writer whose view is current appends to its own segment: no fork, the head stays."""
    root = _new(store)
    _say(store, root, "a")
    expected = store.next_seq(root.session_id, root.segment_id)
    assert ensure_head_or_fork(store, CLI_MAIN, root, expected) == root.segment_id
    assert _head(store) == root.segment_id
    assert store.list_segments(root.session_id) == [root.segment_id]


def test_ensure_head_or_fork_forks_when_another_writer_appended(store: Store) -> None:
    """A stale writer gets a fork of its view; the head moves there; the other's entries stay."""
    root = _new(store)
    _say(store, root, "a")
    mine = store.next_seq(root.session_id, root.segment_id)
    _say(store, root, "theirs")  # another writer moves on
    target = ensure_head_or_fork(store, CLI_MAIN, root, mine)
    assert target != root.segment_id
    assert _head(store) == target
    _say(store, _on(root, target), "mine")
    assert _texts(restore(store, CLI_MAIN)) == _said("a", "mine")
    assert _texts(_state(store, root)) == _said("a", "theirs")
    assert store.list_segments(root.session_id) == [root.segment_id, target]


def test_ensure_head_or_fork_forks_when_the_head_moved(store: Store) -> None:
    """A writer on a segment that is no longer the head gets a fork; the head moves to it."""
    root = _new(store)
    _say(store, root, "a")
    mine = store.next_seq(root.session_id, root.segment_id)
    compacted = create_compacted_segment(store, root, [Item.system("sum")], context=CLI_MAIN)
    target = ensure_head_or_fork(store, CLI_MAIN, root, mine)
    assert target not in (root.segment_id, compacted)
    assert _head(store) == target
    assert _texts(restore(store, CLI_MAIN)) == _said("a")
    assert _texts(_state(store, _on(root, compacted))) == ["sum"]
    assert set(store.list_segments(root.session_id)) == {root.segment_id, compacted, target}
