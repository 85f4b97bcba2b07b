"""Contract: Responses API items are history items of their own kinds, and ``rewind``.

Every backend stores an item without a role (``function_call``, ``reasoning``, ...) exactly
as given, restores it equal, counts it in listings as restore does, and finds the text ones in
search. ``rewind`` drops the last history items by moving the head to a fork: nothing is
copied or deleted, across fork points and compactions, under the expected-seq check.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from helpers.responses import RESPONSES_ITEMS
from terrarium import rewind
from terrarium.errors import ConflictError, ContextNotFound, InvalidEntry
from terrarium.index import listing as lister
from terrarium.index._listing import Listing
from terrarium.index._query import SearchQuery
from terrarium.model import ContextId, UsageRecord
from terrarium.sessions import (
    create_compacted_segment,
    fork_at,
    fork_context,
    restore,
    save_delta,
    save_turn_end,
    save_usage,
    save_user_input,
)
from terrarium.stores.base import PodActiveSegmentRef, Store

MAIN = ContextId("cli", "main")


def _add(store: Store, ref: Any, items: list[dict[str, Any]]) -> None:
    save_delta(store, ref, copy.deepcopy(items))


def test_every_responses_item_restores_exactly(store: Store, main: PodActiveSegmentRef) -> None:
    """Items of every Responses type (unknown kinds, nested unknown keys, unicode, NUL) are
    stored as given and restored equal, key for key, in order."""
    save_user_input(store, main, "chat message first")
    _add(store, main, RESPONSES_ITEMS)
    history = restore(store, MAIN).history
    assert history[0] == {"role": "user", "content": "chat message first"}
    assert history[1:] == RESPONSES_ITEMS
    assert [list(item) for item in history[1:]] == [list(item) for item in RESPONSES_ITEMS]


def test_responses_items_survive_fork_and_compaction(
    store: Store, main: PodActiveSegmentRef
) -> None:
    """A fork continues them, a compaction's header holds them, and a fork into another
    context copies them, unchanged."""
    _add(store, main, RESPONSES_ITEMS[:5])
    forked = fork_at(store, main, 3)
    assert restore(store, MAIN).history == RESPONSES_ITEMS[:5]
    from terrarium.sessions import restore_by_segment

    state = restore_by_segment(store, main.session_id, forked)
    assert state.history == RESPONSES_ITEMS[:3]
    create_compacted_segment(store, main, RESPONSES_ITEMS[2:4], context=MAIN)
    assert restore(store, MAIN).history == RESPONSES_ITEMS[2:4]
    fork_context(store, MAIN, "cli:copy")
    assert restore(store, "cli:copy").history == RESPONSES_ITEMS[2:4]


def test_the_listing_counts_responses_items_as_restore_does(
    store: Store, main: PodActiveSegmentRef
) -> None:
    """Every history item counts as a message, role or not, in every backend's listing."""
    _add(store, main, RESPONSES_ITEMS)
    count = len(restore(store, MAIN).history)
    assert count == len(RESPONSES_ITEMS)
    if isinstance(lister(store), Listing):
        (summary,) = lister(store).list_contexts_fast()
        assert summary.message_count == count


def test_scan_search_finds_responses_text(store: Store, main: PodActiveSegmentRef) -> None:
    """The scan fallback reads the same text as the indexes."""
    from terrarium.search import scan

    _add(store, main, RESPONSES_ITEMS)
    hits = scan(store, SearchQuery("quokkas"))
    assert [(hit.context, hit.role) for hit in hits] == [(str(MAIN), "assistant")]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"content": "x"}, "invalid role None"),
        ({"type": "", "x": 1}, "invalid type ''"),
        ({"type": 7}, "invalid type 7"),
        ({"type": "message", "role": ["user"]}, "invalid role ['user']"),
        ({"role": ["user"], "content": "x"}, "invalid role ['user']"),
    ],
)
def test_malformed_items_are_refused_whole(
    store: Store, main: PodActiveSegmentRef, item: dict[str, Any], message: str
) -> None:
    """An item with neither a role nor a type (or a bad one) is a one-line error; nothing
    of the batch is written."""
    with pytest.raises(InvalidEntry, match=re.escape(message)) as err:
        save_delta(store, main, [RESPONSES_ITEMS[3], item])
    assert "\n" not in str(err.value)
    assert restore(store, MAIN).history == []


def test_huge_and_deeply_nested_items_are_stored_losslessly(
    store: Store, main: PodActiveSegmentRef
) -> None:
    """A 1 MB output and an item nested 100 levels deep come back equal."""
    nested: dict[str, Any] = {"leaf": "ok"}
    for _ in range(100):
        nested = {"n": nested}
    items = [
        {"type": "function_call_output", "call_id": "c", "output": "y" * 1_000_000},
        {"type": "future", "tree": nested},
    ]
    _add(store, main, items)
    assert restore(store, MAIN).history == items


# --------------------------------------------------------------------------- rewind


def _turn(store: Store, ref: Any, n: int) -> None:
    save_user_input(store, ref, f"question {n}")
    save_delta(store, ref, [{"role": "assistant", "content": f"answer {n}"}])
    save_usage(store, ref, UsageRecord("m", prompt_tokens=1, completion_tokens=1))
    save_turn_end(store, ref)


def _texts(store: Store) -> list[str]:
    return [str(item.get("content")) for item in restore(store, MAIN).history]


def test_rewind_drops_the_last_items_and_keeps_them_in_the_tree(
    store: Store, main: PodActiveSegmentRef
) -> None:
    """The head moves to a fork just before the first dropped item; the old segment is
    untouched, and the items dropped are returned."""
    _turn(store, main, 1)
    _turn(store, main, 2)
    before = store.read_segment(main.session_id, main.segment_id).entries
    dropped = rewind(store, MAIN)
    assert dropped == [{"role": "assistant", "content": "answer 2"}]
    assert _texts(store) == ["question 1", "answer 1", "question 2"]
    head = store.get_head(MAIN)
    assert head is not None and head.segment_id != main.segment_id
    assert store.read_segment(main.session_id, main.segment_id).entries == before
    state = restore(store, MAIN)
    assert state.origin.kind == "fork" and state.origin.parent == main.segment_id
    assert state.usage.calls == 1  # the dropped answer's usage went with it
    rewind(store, MAIN, 2)
    assert _texts(store) == ["question 1"]
    if isinstance(lister(store), Listing):
        (summary,) = lister(store).list_contexts_fast()
        assert summary.message_count == 1


def test_rewind_zero_changes_nothing(store: Store, main: PodActiveSegmentRef) -> None:
    """``n=0`` leaves the head where it was."""
    _turn(store, main, 1)
    assert rewind(store, MAIN, 0) == []
    head = store.get_head(MAIN)
    assert head is not None and head.segment_id == main.segment_id


@pytest.mark.parametrize("n", [3, -1, 1.5, True, "1"])
def test_rewind_past_the_history_or_by_a_non_count_changes_nothing(
    store: Store, main: PodActiveSegmentRef, n: Any
) -> None:
    """More items than the history has, or an n that is not a count: a one-line error, and
    the head and segments stay as they were."""
    save_user_input(store, main, "only")
    save_delta(store, main, [{"role": "assistant", "content": "two"}])
    with pytest.raises(InvalidEntry) as err:
        rewind(store, MAIN, n)
    assert "\n" not in str(err.value)
    head = store.get_head(MAIN)
    assert head is not None and head.segment_id == main.segment_id
    assert store.list_segments(main.session_id) == [main.segment_id]


def test_rewind_crosses_fork_points(store: Store, main: PodActiveSegmentRef) -> None:
    """Dropping more items than the head segment holds forks the parent at the right entry."""
    _turn(store, main, 1)
    _turn(store, main, 2)
    rewind(store, MAIN, 1)  # head: fork of root, holding nothing of its own yet
    head = store.get_head(MAIN)
    assert head is not None
    save_delta(store, head, [{"role": "assistant", "content": "answer 2b"}])
    assert _texts(store) == ["question 1", "answer 1", "question 2", "answer 2b"]
    dropped = rewind(store, MAIN, 3)
    assert dropped == [
        {"role": "assistant", "content": "answer 1"},
        {"role": "user", "content": "question 2"},
        {"role": "assistant", "content": "answer 2b"},
    ]
    assert _texts(store) == ["question 1"]
    assert restore(store, MAIN).origin.parent == main.segment_id
    assert rewind(store, MAIN, 1) == [{"role": "user", "content": "question 1"}]
    assert restore(store, MAIN).history == []


def test_rewind_into_a_compacted_history(store: Store, main: PodActiveSegmentRef) -> None:
    """A cut inside the history a compaction's header holds gives a segment holding the kept
    part of it; config and usage totals carry over."""
    _turn(store, main, 1)
    summary = [
        {"role": "user", "content": "summary a"},
        {"type": "message", "role": "assistant", "content": "summary b"},
    ]
    compacted = create_compacted_segment(store, main, summary, context=MAIN)
    ref = PodActiveSegmentRef(main.session_id, compacted)
    save_user_input(store, ref, "after")
    dropped = rewind(store, MAIN, 2)
    assert dropped == [summary[1], {"role": "user", "content": "after"}]
    state = restore(store, MAIN)
    assert state.history == summary[:1]
    assert state.usage.calls == 1 and state.context == str(MAIN)
    assert state.origin.parent == compacted
    if isinstance(lister(store), Listing):
        (summary_row,) = lister(store).list_contexts_fast()
        assert summary_row.message_count == 1


def test_rewind_checks_the_expected_seq(store: Store, main: PodActiveSegmentRef) -> None:
    """A writer whose view of the head is stale gets a conflict, and nothing changes."""
    _turn(store, main, 1)
    with pytest.raises(ConflictError):
        rewind(store, MAIN, 1, expected_seq=3)
    head = store.get_head(MAIN)
    assert head is not None and head.segment_id == main.segment_id
    rewind(store, MAIN, 1, expected_seq=5)
    assert _texts(store) == ["question 1"]


def test_rewind_of_a_missing_context(store: Store) -> None:
    """No such context: ContextNotFound."""
    with pytest.raises(ContextNotFound):
        rewind(store, "cli:nobody")


def test_rewind_drops_responses_items_one_by_one(store: Store, main: PodActiveSegmentRef) -> None:
    """Role-less items are history items like any other for rewind (pop_item's need)."""
    _add(store, main, RESPONSES_ITEMS[:5])
    assert rewind(store, MAIN) == [RESPONSES_ITEMS[4]]
    assert rewind(store, MAIN) == [RESPONSES_ITEMS[3]]
    assert restore(store, MAIN).history == RESPONSES_ITEMS[:3]


def test_an_item_nested_past_the_codec_limit_is_a_one_line_error(
    store: Store, main: PodActiveSegmentRef
) -> None:
    """JSON nested more than 256 levels deep is refused whole, in one line."""
    nested: dict[str, Any] = {"leaf": 1}
    for _ in range(300):
        nested = {"n": nested}
    with pytest.raises(InvalidEntry, match="256 levels") as err:
        save_delta(store, main, [RESPONSES_ITEMS[2], {"type": "deep", "tree": nested}])
    assert "\n" not in str(err.value)
    assert restore(store, MAIN).history == []
