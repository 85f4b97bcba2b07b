"""Contract: fast listing, for every backend with the ``Listing`` ability.

``list_contexts_fast`` reads each context's message count and last activity from an index the
backend keeps; whatever the history (forks, compactions, clears, branches written before the
head moved onto them), it must agree with restoring every context.
"""

from __future__ import annotations

import pytest

from helpers.history import add_context, build_history
from terrarium import states
from terrarium.index import listing as lister
from terrarium.index._listing import Listing
from terrarium.model import ContextId
from terrarium.sessions import fork_at, restore, save_user_input
from terrarium.stores.base import PodActiveSegmentRef, PodMetadata, Store

pytestmark = pytest.mark.ability.with_args(Listing)


def _main_on_a_fork(store: Store) -> PodMetadata:
    """:func:`build_history`, then move cli:main's head onto a fork at seq 2 and write there."""
    build_history(store)
    head = store.get_head(ContextId.parse("cli:main"))
    assert head is not None
    forked = fork_at(store, head, 2)
    moved = store.set_head(ContextId.parse("cli:main"), forked, expected=head.segment_id)
    save_user_input(store, moved, "on the fork")
    return moved


def test_fast_listing_agrees_with_restoring_every_context(store: Store) -> None:
    """list_contexts_fast names each head's session, segment, creation and update times as
    list_contexts does, and gives its date, message count and last activity as a restore of
    it would, forks, compactions and clears included, without restoring any."""
    assert isinstance(lister(store), Listing)
    moved = _main_on_a_fork(store)
    deeper = fork_at(store, moved, 1)  # a fork of a fork: two parents' prefixes
    store.set_head(ContextId.parse("cli:main"), deeper, expected=moved.segment_id)
    summaries = lister(store).list_contexts_fast()
    heads = store.list_contexts()
    assert [s.context for s in summaries] == [h.context for h in heads]
    for summary, head in zip(summaries, heads, strict=True):
        state = restore(store, head.context)
        assert summary.date == head.date
        assert (summary.session_id, summary.segment_id) == (head.session_id, head.segment_id)
        assert (summary.created_at, summary.updated_at) == (head.created_at, head.updated_at)
        assert summary.last_active == state.last_active
        assert summary.message_count == len(state.history), head.context
    assert [s.context for s in lister(store).list_contexts_fast("irc")] == ["irc:#python"]
    assert lister(store).list_contexts_fast("nope") == []


def test_fast_listing_counts_a_branch_written_before_it_became_the_head(store: Store) -> None:
    """Entries appended to a segment before the head moves onto it are counted once, and the
    old head's later entries not at all."""
    assert isinstance(lister(store), Listing)
    head = add_context(store, "cli:a", "one", "two")
    branch = PodActiveSegmentRef(head.session_id, fork_at(store, head, 1))
    save_user_input(store, branch, "on the branch")
    save_user_input(store, branch, "still on the branch")
    store.set_head(ContextId.parse("cli:a"), branch.segment_id, expected=head.segment_id)
    save_user_input(store, head, "on the old head, after it moved")
    save_user_input(store, branch, "on the new head")
    [summary] = lister(store).list_contexts_fast()
    state = restore(store, "cli:a")
    assert summary.message_count == len(state.history) == 4
    assert summary.last_active == state.last_active


def test_a_deleted_context_leaves_the_fast_listing(store: Store) -> None:
    """Deleting a context removes it from list_contexts_fast; the others stay."""
    assert isinstance(lister(store), Listing)
    add_context(store, "cli:a", "kept")
    add_context(store, "cli:b", "gone", "gone too")
    assert [s.context for s in lister(store).list_contexts_fast()] == ["cli:a", "cli:b"]
    assert states.delete_context(store, ContextId("cli", "b"))
    assert [s.context for s in lister(store).list_contexts_fast()] == ["cli:a"]
