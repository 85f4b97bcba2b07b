"""Contract: estimated usage stays marked through every replay (fork, compaction, clear, a fork
into another context) and every backend folds it the same way."""

from __future__ import annotations

from terrarium import (
    ContextId,
    PodActiveSegmentRef,
    Store,
    UsageRecord,
    UsageTotals,
    clear_segment,
    create_compacted_segment,
    fork_at,
    fork_context,
    read_entries,
    restore,
    restore_by_segment,
    save_usage,
)

CLI_MAIN = ContextId("cli", "main")

EXACT = UsageRecord("m", prompt_tokens=100, completion_tokens=20, cached_tokens=40)
ESTIMATED = UsageRecord("m", prompt_tokens=30, completion_tokens=7, estimated="chars")
BY_TOKENIZER = UsageRecord("m", prompt_tokens=11, completion_tokens=3, estimated="tokenizer")

BOTH = UsageTotals(
    prompt_tokens=130,
    completion_tokens=27,
    cached_tokens=40,
    calls=2,
    estimated_prompt_tokens=30,
    estimated_completion_tokens=7,
    estimated_calls=1,
)


def test_estimated_usage_entries_keep_their_marker(store: Store, main: PodActiveSegmentRef) -> None:
    """A usage entry's ``estimated`` key is stored as written; an exact entry has none."""
    save_usage(store, main, EXACT)
    save_usage(store, main, ESTIMATED)
    exact, estimated = read_entries(store, main)[1:]
    assert "estimated" not in exact.data
    assert estimated.data["estimated"] == "chars"


def test_totals_keep_the_estimated_part_apart(store: Store, main: PodActiveSegmentRef) -> None:
    """Totals count every call; the ``estimated_*`` fields are the part that was estimated,
    whichever way (tokenizer or characters)."""
    save_usage(store, main, EXACT)
    save_usage(store, main, ESTIMATED)
    state = restore(store, CLI_MAIN)
    assert state.usage == BOTH
    assert state.usage.is_estimated
    save_usage(store, main, BY_TOKENIZER)
    usage = restore(store, CLI_MAIN).usage
    assert (usage.calls, usage.estimated_calls, usage.estimated_prompt_tokens) == (3, 2, 41)


def test_exact_usage_only_is_not_estimated(store: Store, main: PodActiveSegmentRef) -> None:
    """Where every call was reported by the server, nothing is marked estimated."""
    save_usage(store, main, EXACT)
    usage = restore(store, CLI_MAIN).usage
    assert not usage.is_estimated
    assert usage == UsageTotals(100, 20, 40, 1)


def test_estimated_totals_survive_fork_compaction_and_clear(
    store: Store, main: PodActiveSegmentRef
) -> None:
    """A fork replays its parent's prefix; compaction and clear carry the totals in their
    headers, per model too: the estimated part is carried with them. A fork into another
    context starts its own figures (the source's tokens are counted once, in the source)."""
    save_usage(store, main, EXACT)
    save_usage(store, main, ESTIMATED)
    at = store.next_seq(main.session_id, main.segment_id) - 1
    save_usage(store, main, BY_TOKENIZER)

    forked = fork_at(store, main, at)
    assert restore_by_segment(store, main.session_id, forked).usage == BOTH

    state = restore(store, CLI_MAIN)
    compacted = create_compacted_segment(store, state, [], context=CLI_MAIN)
    assert restore(store, CLI_MAIN).segment_id == compacted
    assert restore(store, CLI_MAIN).usage == state.usage
    cleared = clear_segment(store, restore(store, CLI_MAIN), context=CLI_MAIN)
    assert restore(store, CLI_MAIN).segment_id == cleared
    assert restore(store, CLI_MAIN).usage == state.usage
    assert restore(store, CLI_MAIN).usage_by_model == state.usage_by_model
    assert sum(u.estimated_calls for u in state.usage_by_model.values()) == 2

    other = ContextId("cli", "other")
    fork_context(store, CLI_MAIN, other)
    assert restore(store, other).usage == UsageTotals()


def test_carried_exact_totals_write_no_estimated_keys(
    store: Store, main: PodActiveSegmentRef
) -> None:
    """A header carrying totals with nothing estimated has the four keys older readers know."""
    save_usage(store, main, EXACT)
    create_compacted_segment(store, restore(store, CLI_MAIN), [], context=CLI_MAIN)
    head = store.get_head(CLI_MAIN)
    assert head is not None
    header = read_entries(store, PodActiveSegmentRef(head.session_id, head.segment_id))[0]
    assert header.data["usage"] == {
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "cached_tokens": 40,
        "calls": 1,
    }
