"""The lifecycle written once (:mod:`terrarium.states`): moves that another process
overtakes between their steps end in one state.

Each test interleaves a second move at one step of the first (on the reference store: the
moves are the same on every backend); the multi-process race and kill tests run them for real
on the persistent backends.
"""

from __future__ import annotations

from typing import Any

import pytest

from terrarium import ContextId, MemoryStore, create_segment, restore, sessions, states
from terrarium.model import SegmentId, SessionId

MAIN = ContextId("cli", "main")


class Interleaved(MemoryStore):
    """A store that runs ``between`` once, just after its ``after`` primitive returns."""

    def __init__(self, after: str, between: Any) -> None:
        super().__init__()
        self.after, self.between = after, between

    def _step(self, name: str) -> None:
        if name == self.after and self.between is not None:
            between, self.between = self.between, None
            between(self)

    def attach_context(
        self, context: ContextId, session_id: SessionId, segment_id: SegmentId
    ) -> Any:
        head = super().attach_context(context, session_id, segment_id)
        self._step("attach_context")
        return head

    def set_session_state(self, session_id: SessionId, state: Any, *, expected: Any) -> None:
        super().set_session_state(session_id, state, expected=expected)
        self._step("set_session_state")

    def session_records(self) -> Any:
        records = super().session_records()
        self._step("session_records")
        return records


def seeded(store: MemoryStore) -> None:
    create_segment(store, context=MAIN)
    head = store.get_head(MAIN)
    assert head is not None
    sessions.save_user_input(store, head, "kept")


def test_a_delete_between_a_restores_two_steps_keeps_its_own_trash_entry() -> None:
    """Restored, then deleted again by another process before the restore dropped its mark:
    the new trash entry stays, sealed; the restore does not undo it."""
    store = Interleaved("attach_context", lambda s: states.delete_context(s, MAIN))
    seeded(store)
    states.delete_context(store, MAIN)
    (first,) = states.trashed_contexts(store)
    states.restore_trashed(store, first.trash_id)
    (second,) = states.trashed_contexts(store)
    assert second.trash_id != first.trash_id and store.get_head(MAIN) is None
    assert states.unfinished_lifecycle(store) == []
    states.restore_trashed(store, second.trash_id)
    assert [m["content"] for m in restore(store, MAIN).history] == ["kept"]


def test_a_restore_between_a_purges_two_steps_wins() -> None:
    """A purge that marked its entry, overtaken by a restore of it: nothing is deleted, the
    purge says False, and the restored context carries no mark."""
    calls: list[bool] = []
    store = Interleaved("set_session_state", None)
    seeded(store)
    states.delete_context(store, MAIN)
    (entry,) = states.trashed_contexts(store)

    def overtake(s: MemoryStore) -> None:
        calls.append(True)
        record = next(r for r in s.session_records() if r.state.get("purging"))
        s.attach_context(MAIN, record.session_id, SegmentId(record.state["trashed"]["segment_id"]))

    store.between = overtake
    assert states.purge_trashed(store, entry.trash_id) is False
    assert calls == [True]
    assert store.get_head(MAIN) is not None
    assert (
        states.finish_lifecycle(store) == 1
    )  # the restore's second step, as fsck --repair runs it
    assert states.unfinished_lifecycle(store) == [] and states.trashed_contexts(store) == []
    assert [m["content"] for m in restore(store, MAIN).history] == ["kept"]


def test_a_restore_between_a_repairs_read_and_its_purge_wins() -> None:
    """A repair that read a killed purge's record, overtaken by a restore of the entry before it
    deletes: nothing is deleted, the repair does not fail, the restore has the last word."""
    store = Interleaved("session_records", None)
    seeded(store)
    states.delete_context(store, MAIN)
    (record,) = store.session_records()
    store.set_session_state(
        record.session_id, {**record.state, "purging": True}, expected=record.state
    )
    segment = SegmentId(record.state["trashed"]["segment_id"])
    store.between = lambda s: s.attach_context(MAIN, record.session_id, segment)
    assert states.finish_lifecycle(store) == 0
    assert states.finish_lifecycle(store) == 1  # the restore's second step, as fsck runs it
    assert states.unfinished_lifecycle(store) == [] and states.trashed_contexts(store) == []
    assert [m["content"] for m in restore(store, MAIN).history] == ["kept"]


class PurgedAfterLookup(MemoryStore):
    """A store whose context is purged by another process just after its head is read."""

    armed = False

    def get_head(self, context: ContextId) -> Any:
        head = super().get_head(context)
        if self.armed and head is not None:
            self.armed = False
            states.purge_context(self, context)
        return head


@pytest.mark.parametrize(
    ("move", "answer"),
    [
        (lambda s: states.archive_context(s, MAIN), None),
        (lambda s: states.unarchive_context(s, MAIN), False),
        (lambda s: states.is_archived(s, MAIN), False),
        (lambda s: states.delete_context(s, MAIN), False),
        (lambda s: states.purge_context(s, MAIN), False),
        (lambda s: states.pin_context(s, MAIN), False),
    ],
    ids=["archive", "unarchive", "is_archived", "delete", "purge", "pin"],
)
def test_a_context_purged_between_its_head_and_its_record_is_simply_gone(
    move: Any, answer: Any
) -> None:
    """A policy run (``maintain``) met a context another process purged between the reads of
    its head and of its session's record: no error, the context is gone (the race test found
    ``SegmentNotFound`` escaping from archive)."""
    store = PurgedAfterLookup()
    seeded(store)
    store.armed = True
    assert move(store) == answer
    assert store.get_head(MAIN) is None and states.trashed_contexts(store) == []
