"""Contract: the change cursor, for every backend with the ``ChangeLog`` ability.

The derived index (:mod:`terrarium.index`) follows it: whatever a write does to a session
(an append, a new segment, a head move, an archive, a delete), the next ``changes`` from the
position before names that session, and ``live_head``, ``entries_from`` and
``segment_tails`` show it as it is.
"""

from __future__ import annotations

import uuid

import pytest

from helpers.history import add_context
from terrarium import states
from terrarium.model import ContextId
from terrarium.sessions import fork_at, save_user_input
from terrarium.stores.base import ChangeLog

pytestmark = pytest.mark.ability.with_args(ChangeLog)


def test_changes_name_each_written_session_since_a_position(store: ChangeLog) -> None:
    """No position: every session (None). At the position just returned: none. After a
    write: the sessions written, each once, whatever the write was. (A position may move
    with no write of this store's: PostgreSQL's is a snapshot of the whole server.)"""
    a = add_context(store, "cli:a", "one")
    b = add_context(store, "cli:b", "two")
    touched, start = store.changes(None)
    assert touched is None
    assert store.changes(start)[0] == []
    save_user_input(store, a, "three")
    save_user_input(store, a, "four")
    touched, after_a = store.changes(start)
    assert touched == [a.session_id]
    forked = fork_at(store, b, 1)
    store.set_head(ContextId.parse("cli:b"), forked, expected=b.segment_id)
    touched, after_b = store.changes(after_a)
    assert touched == [b.session_id]
    assert states.archive_context(store, ContextId.parse("cli:a")) is not None
    assert states.delete_context(store, ContextId.parse("cli:b"))
    touched, _ = store.changes(after_b)
    assert sorted(touched or []) == sorted([a.session_id, b.session_id])


def test_live_head_and_entries_from_show_the_session_as_it_is(store: ChangeLog) -> None:
    """``live_head`` is the context's head while the session is hot and attached (None once
    archived or deleted); ``entries_from`` gives a segment's lines from a seq on."""
    a = add_context(store, "cli:a", "one", "two")
    assert store.live_head(a.session_id) == store.get_head(ContextId.parse("cli:a"))
    lines = store.entries_from(a.session_id, a.segment_id, 0)
    assert [line["seq"] for line in lines] == [0, 1, 2]
    assert lines[0]["kind"] == "header"
    assert [line["item"]["content"] for line in lines[1:]] == ["one", "two"]
    assert store.entries_from(a.session_id, a.segment_id, 2) == lines[2:]
    assert store.entries_from(a.session_id, a.segment_id, 3) == []
    assert states.archive_context(store, ContextId.parse("cli:a")) is not None
    assert store.live_head(a.session_id) is None
    assert states.unarchive_context(store, ContextId.parse("cli:a"))
    assert store.live_head(a.session_id) is not None
    assert states.delete_context(store, ContextId.parse("cli:a"))
    assert store.live_head(a.session_id) is None


def test_segment_tails_give_each_segment_with_its_next_seq(store: ChangeLog) -> None:
    """``segment_tails`` is, in one read, what ``list_segments`` and a ``next_seq`` for each
    give; none for a session the store does not hold."""
    a = add_context(store, "cli:a", "one", "two")
    forked = fork_at(store, a, 1)
    save_user_input(store, a, "three")
    tails = store.segment_tails(a.session_id)
    assert tails == {g: store.next_seq(a.session_id, g) for g in store.list_segments(a.session_id)}
    assert tails == {a.segment_id: 4, forked: 1}
    assert store.segment_tails(uuid.uuid4()) == {}


def test_a_position_of_no_store_reads_everything(store: ChangeLog) -> None:
    """A position the store never gave (another store's, or garbage) names no sessions but
    None: the reader reads them all."""
    add_context(store, "cli:a", "one")
    assert store.changes("not a position")[0] is None
    assert store.changes("99999999.99999999")[0] is None
