"""Contract: the change cursor, for every backend with the ``ChangeLog`` ability.

The derived index (:mod:`terrarium.index`) follows it: whatever a write does to a session
(an append, a new segment, a head move, an archive, a delete), the next ``changes`` from the
position before names that session, and ``live_sessions`` and ``entries_from`` show it as
it is.
"""

from __future__ import annotations

import itertools
import math
import uuid
from types import SimpleNamespace

import pytest

from helpers.history import add_context, snippets
from terrarium import index, states
from terrarium.index import _build, _cursor
from terrarium.index._query import SearchQuery
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


def test_live_sessions_and_entries_from_show_the_sessions_as_they_are(store: ChangeLog) -> None:
    """``live_sessions`` gives each hot and attached session of those asked for, with its
    context's head and its segments' next seqs, in one read (none once archived or deleted,
    nor for a session the store does not hold); ``entries_from`` gives each read's segment
    lines from a seq on."""
    a = add_context(store, "cli:a", "one", "two")
    b = add_context(store, "cli:b", "three")
    forked = fork_at(store, a, 1)
    save_user_input(store, a, "four")
    found = store.live_sessions([a.session_id, uuid.uuid4(), b.session_id])
    assert found == {
        a.session_id: (store.get_head(ContextId.parse("cli:a")), {a.segment_id: 4, forked: 1}),
        b.session_id: (store.get_head(ContextId.parse("cli:b")), {b.segment_id: 2}),
    }
    assert found[a.session_id][1] == {
        g: store.next_seq(a.session_id, g) for g in store.list_segments(a.session_id)
    }
    lines, rest, none, other = store.entries_from(
        [
            (a.session_id, a.segment_id, 0),
            (a.session_id, a.segment_id, 2),
            (a.session_id, a.segment_id, 4),
            (b.session_id, b.segment_id, 1),
        ]
    )
    assert [line["seq"] for line in lines] == [0, 1, 2, 3]
    assert lines[0]["kind"] == "header"
    assert [line["item"]["content"] for line in lines[1:]] == ["one", "two", "four"]
    assert (rest, none) == (lines[2:], [])
    assert [line["item"]["content"] for line in other] == ["three"]
    assert store.entries_from([(uuid.uuid4(), a.segment_id, 0)]) == [[]]
    assert states.archive_context(store, ContextId.parse("cli:a")) is not None
    assert set(store.live_sessions([a.session_id, b.session_id])) == {b.session_id}
    assert states.unarchive_context(store, ContextId.parse("cli:a"))
    assert set(store.live_sessions([a.session_id])) == {a.session_id}
    assert states.delete_context(store, ContextId.parse("cli:a"))
    assert store.live_sessions([a.session_id]) == {}


def test_a_position_of_no_store_reads_everything(store: ChangeLog) -> None:
    """A position the store never gave (another store's, or garbage) names no sessions but
    None: the reader reads them all."""
    add_context(store, "cli:a", "one")
    assert store.changes("not a position")[0] is None
    assert store.changes("99999999.99999999")[0] is None


def test_a_build_a_step_at_a_time_misses_no_write_made_meanwhile(
    store: ChangeLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first build given a budget indexes a session a step here, and reads a page of
    sessions at once: what is written meanwhile to a session indexed already, or read with
    its page and not indexed yet (an append, an archive, a delete), is what the index holds
    once the build ends, as is a write to the last page read."""
    monkeypatch.setattr(_cursor, "PAGE", 4)
    monkeypatch.setattr(_build, "SMALL", 0)
    ticks = itertools.cycle([0.0, math.inf])  # each step: one session, then the budget is out
    monkeypatch.setattr(_build, "time", SimpleNamespace(monotonic=lambda: next(ticks)))
    heads = [add_context(store, f"cli:c{n}", f"first{n}") for n in range(8)]
    found = index.of(store)
    assert found is not None
    steps = 0
    while found.read(lambda reader: reader.left, budget=1.0):
        steps += 1
        if steps == 1:  # c0 indexed; c1, c2, c3 read with it
            save_user_input(store, heads[0], "afterzero")
            save_user_input(store, heads[2], "aftertwo")
            assert states.archive_context(store, ContextId.parse("cli:c1")) is not None
            assert states.delete_context(store, ContextId.parse("cli:c3"))
        if steps == 6:  # c4 and c5 indexed; c6 and c7 read with them
            save_user_input(store, heads[7], "afterseven")
            save_user_input(store, heads[5], "afterfive")
    assert steps >= 7
    listed = [summary.context for summary in found.list_contexts_fast()]
    assert listed == [str(head.context) for head in store.list_contexts()]
    assert "cli:c1" not in listed and "cli:c3" not in listed
    for word in ("afterzero", "aftertwo", "afterfive", "afterseven", "first7"):
        assert snippets(found.search(SearchQuery(word))) == [word]
    assert snippets(found.search(SearchQuery("first1"))) == []
