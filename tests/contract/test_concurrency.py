"""Contract: many writers at once (threads sharing one store) never lose or interleave entries."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from terrarium import (
    ConflictError,
    ContextExists,
    ContextId,
    PodActiveSegmentRef,
    Store,
    create_segment,
    fork,
    restore,
)
from terrarium.stores.base import NewEntry

TS = "2026-01-01T00:00:00.000000Z"
WRITERS = 8


def _together(count: int, work: Callable[[int], Any]) -> list[Any]:
    """Run ``work(i)`` in ``count`` threads released at once; return results or exceptions."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(i)
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_concurrent_appends_are_all_kept_whole_and_in_seq_order(
    store: Store, main: PodActiveSegmentRef
) -> None:
    """Concurrent appends lose nothing; seqs have no gaps; each append's entries stay together."""
    rounds, batch = 10, 3

    def writer(i: int) -> list[int]:
        firsts = []
        for r in range(rounds):
            entries = [
                NewEntry("item", TS, {"item": {"role": "assistant", "content": f"{i}.{r}.{k}"}})
                for k in range(batch)
            ]
            firsts.append(store.append(main.session_id, main.segment_id, entries))
        return firsts

    results = _together(WRITERS, writer)
    assert not [r for r in results if isinstance(r, Exception)]
    total = WRITERS * rounds * batch
    assert store.next_seq(main.session_id, main.segment_id) == total + 1
    stored = store.read_segment(main.session_id, main.segment_id).entries
    assert [line["seq"] for line in stored] == list(range(1, total + 1))
    contents = [line["item"]["content"] for line in stored]
    assert sorted(contents) == sorted(
        f"{i}.{r}.{k}" for i in range(WRITERS) for r in range(rounds) for k in range(batch)
    )
    for i, firsts in enumerate(results):
        for r, first in enumerate(firsts):
            assert contents[first - 1 : first - 1 + batch] == [f"{i}.{r}.{k}" for k in range(batch)]


def test_only_one_writer_with_the_same_expected_seq_wins(
    store: Store, main: PodActiveSegmentRef
) -> None:
    """Of writers racing with the same expected_seq, one appends; the rest get ConflictError."""

    def writer(i: int) -> int:
        entry = NewEntry("item", TS, {"item": {"role": "assistant", "content": str(i)}})
        return store.append(main.session_id, main.segment_id, [entry], expected_seq=1)

    results = _together(WRITERS, writer)
    assert sorted(type(r).__name__ for r in results) == ["ConflictError"] * (WRITERS - 1) + ["int"]
    assert all(isinstance(r, ConflictError | int) for r in results)
    winner = next(i for i, r in enumerate(results) if r == 1)
    stored = store.read_segment(main.session_id, main.segment_id).entries
    assert [line["item"]["content"] for line in stored] == [str(winner)]


def test_only_one_head_move_from_the_same_expected_wins(
    store: Store, main: PodActiveSegmentRef
) -> None:
    """Of head moves racing from the same expected head, one wins; the rest get ConflictError."""
    branches = [fork(store, main) for _ in range(WRITERS)]
    context = ContextId("cli", "main")
    results = _together(
        WRITERS, lambda i: store.set_head(context, branches[i], expected=main.segment_id)
    )
    winners = [i for i, r in enumerate(results) if not isinstance(r, Exception)]
    assert len(winners) == 1
    assert all(isinstance(r, ConflictError) for i, r in enumerate(results) if i != winners[0])
    head = store.get_head(context)
    assert head is not None and head.segment_id == branches[winners[0]]


def test_only_one_creator_of_a_context_wins(store: Store) -> None:
    """Of threads racing to create one context, one succeeds; the rest get ContextExists."""
    results = _together(WRITERS, lambda i: create_segment(store, context="irc:#race"))
    created = [r for r in results if not isinstance(r, Exception)]
    assert len(created) == 1
    assert all(isinstance(r, ContextExists) for r in results if r is not created[0])
    state = restore(store, "irc:#race")
    assert (state.session_id, state.segment_id) == created[0]
    assert [h.context for h in store.list_contexts()] == ["irc:#race"]
