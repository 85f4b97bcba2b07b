"""Contract: archive, trash, restore, purge and pins (:class:`~terrarium.stores.base.Lifecycle`),
and what the layers above make of them (listing, search, stats, delete), on every backend.

``MemoryStore`` is the oracle; a backend that does not implement ``Lifecycle`` yet skips these
tests, saying so.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from helpers.history import add_context
from terrarium import contexts, lifecycle, states
from terrarium.cli.app import CliState
from terrarium.cli.lifecycle_cmds import lifecycle_rows
from terrarium.errors import ContextExists, ContextNotFound, NotInTrash
from terrarium.index import listing as lister
from terrarium.index._listing import Listing
from terrarium.index._query import SearchQuery
from terrarium.model import ContextId, TraceEntry
from terrarium.search import search
from terrarium.sessions import restore, save_delta
from terrarium.stores.base import (
    Lifecycle,
    Store,
    context_lock,
    head_and_tail,
    locked_head_and_tail,
)
from terrarium.web import data

MAIN = ContextId("cli", "main")
OTHER = ContextId("irc", "#python")


def lifecycle_of(store: Store) -> Lifecycle:
    """``store`` as a Lifecycle: every backend has one (archive, trash, pins)."""
    assert isinstance(store, Lifecycle), f"{type(store).__name__} lacks Lifecycle"
    return store


def seeded(store: Store) -> Lifecycle:
    """cli:main with three messages and irc:#python with one; the store as a Lifecycle."""
    lc = lifecycle_of(store)
    add_context(store, str(MAIN), "alpha walrus", "beta", "gamma")
    add_context(store, str(OTHER), "delta walrus")
    return lc


def history(store: Store, context: ContextId) -> list[str]:
    return [str(item["content"]) for item in restore(store, context).history]


def listed(store: Store) -> list[str]:
    return [h.context for h in store.list_contexts()]


# --------------------------------------------------------------------------- archive


def test_an_archived_context_leaves_the_hot_listing_and_still_reads(store: Store) -> None:
    """archive_context returns the store's figures; the context leaves list_contexts (and
    list_contexts_fast) but get_head, restore and archived_contexts still see it."""
    lc = seeded(store)
    archived = states.archive_context(lc, MAIN)
    assert archived is not None
    assert archived.context == str(MAIN)
    assert archived.message_count == 3
    assert archived.hot_bytes > 0 and archived.archived_bytes > 0
    assert not archived.pinned
    assert states.is_archived(lc, MAIN) and not states.is_archived(lc, OTHER)
    assert listed(store) == [str(OTHER)]
    if isinstance(lister(store), Listing):
        assert [s.context for s in lister(store).list_contexts_fast()] == [str(OTHER)]
    assert store.get_head(MAIN) is not None
    assert history(store, MAIN) == ["alpha walrus", "beta", "gamma"]
    assert [a.context for a in states.archived_contexts(lc)] == [str(MAIN)]
    assert states.archived_contexts(lc, "irc") == []
    assert [a.context for a in states.archived_contexts(lc, "cli")] == [str(MAIN)]


@pytest.mark.parametrize("kept", [True, False], ids=["record", "older-record"])
def test_list_and_the_dashboard_give_an_archived_context_created_at_in_full(
    store: Store, kept: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``list --archived --json`` and the dashboard's archived rows both give an archived
    context's ``created_at`` as its head has it, the full time a hot row shows, not only its
    date; also from an archive record written before the record kept it (``older-record``)."""
    lc = seeded(store)
    head = store.get_head(MAIN)
    assert head is not None
    if not kept:  # what an earlier version wrote
        summary = states._summary

        def older(*args: Any) -> dict[str, Any]:
            return {k: v for k, v in summary(*args).items() if k != "created_at"}

        monkeypatch.setattr(states, "_summary", older)
    assert states.archive_context(lc, MAIN) is not None
    page = data.list_page(store, state="archived")
    assert [(r["context_id"], r["created_at"]) for r in page["contexts"]] == [
        (str(MAIN), head.created_at)
    ]
    cli = CliState()
    cli._store = store
    rows, _ = lifecycle_rows(cli, [], None, "archived")
    assert [(r.context, r.created_at) for r in rows] == [(str(MAIN), head.created_at)]


def test_archive_of_a_missing_or_archived_context_is_none(store: Store) -> None:
    """Only a hot context can be archived; anything else returns None and changes nothing."""
    lc = seeded(store)
    assert states.archive_context(lc, ContextId("cli", "nope")) is None
    assert states.archive_context(lc, MAIN) is not None
    assert states.archive_context(lc, MAIN) is None
    assert states.is_archived(lc, MAIN)


def test_unarchive_puts_it_back_with_its_whole_history(store: Store) -> None:
    """unarchive_context returns True once, then False; the context is hot and complete."""
    lc = seeded(store)
    states.archive_context(lc, MAIN)
    assert states.unarchive_context(lc, MAIN) is True
    assert states.unarchive_context(lc, MAIN) is False
    assert states.unarchive_context(lc, ContextId("cli", "nope")) is False
    assert not states.is_archived(lc, MAIN)
    assert listed(store) == [str(MAIN), str(OTHER)]
    assert history(store, MAIN) == ["alpha walrus", "beta", "gamma"]


def test_a_write_to_an_archived_context_unarchives_it_first(store: Store) -> None:
    """An append to an archived context brings it back hot, history and new entry both kept."""
    lc = seeded(store)
    states.archive_context(lc, MAIN)
    head = store.get_head(MAIN)
    assert head is not None
    save_delta(store, head, [{"role": "user", "content": "delta"}])
    assert not states.is_archived(lc, MAIN)
    assert str(MAIN) in listed(store)
    assert history(store, MAIN) == ["alpha walrus", "beta", "gamma", "delta"]


#: Every code point ``str.splitlines`` breaks a line at (besides ``\n``); JSON leaves the last
#: three raw in a line, so a codec that splits text rather than bytes tears that line in two.
LINE_BREAKS = ["\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize(
    "brk", LINE_BREAKS, ids=[f"U+{ord(b[0]):04X}{'+LF' * (len(b) > 1)}" for b in LINE_BREAKS]
)
def test_line_breaks_inside_text_survive_archive_and_unarchive(store: Store, brk: str) -> None:
    """An entry and a trace event whose text holds a line break other than ``\\n`` read back
    the same archived, unarchived, archived again and written to again: the archive splits
    its frames at the byte ``\\n`` only."""
    lc = lifecycle_of(store)
    texts = [f"one{brk}two", f"{brk}", f"tail{brk}"]
    head = add_context(store, str(MAIN), *texts)
    event = TraceEntry("2026-01-01T00:00:01.000000Z", "chunk", {"delta": f"a{brk}b"})
    store.append_trace(head.session_id, head.segment_id, [event])
    for _ in range(2):
        assert states.archive_context(lc, MAIN) is not None
        assert history(store, MAIN) == texts
        assert store.read_trace(head.session_id, head.segment_id) == [event.to_dict()]
        assert states.unarchive_context(lc, MAIN) is True
        assert history(store, MAIN) == texts
        assert store.read_trace(head.session_id, head.segment_id) == [event.to_dict()]
    states.archive_context(lc, MAIN)
    now = store.get_head(MAIN)
    assert now is not None
    save_delta(store, now, [{"role": "user", "content": f"more{brk}"}])
    assert history(store, MAIN) == [*texts, f"more{brk}"]
    assert store.read_trace(head.session_id, head.segment_id) == [event.to_dict()]


def test_create_of_an_archived_id_is_refused(store: Store) -> None:
    """An archived context's id is taken: creating it again raises ContextExists."""
    lc = seeded(store)
    states.archive_context(lc, MAIN)
    with pytest.raises(ContextExists):
        add_context(store, str(MAIN), "again")
    assert history(store, MAIN) == ["alpha walrus", "beta", "gamma"]


# --------------------------------------------------------------------------- trash


def test_delete_moves_to_the_trash_and_frees_the_id(store: Store) -> None:
    """delete_context empties get_head and the listing; the trash holds the context; the id
    can be created again at once."""
    lc = seeded(store)
    assert states.delete_context(store, MAIN) is True
    assert store.get_head(MAIN) is None
    assert listed(store) == [str(OTHER)]
    (entry,) = states.trashed_contexts(lc)
    assert entry.context == str(MAIN)
    assert not entry.archived and entry.message_count == 3 and entry.bytes > 0
    add_context(store, str(MAIN), "fresh")
    assert history(store, MAIN) == ["fresh"]
    assert states.delete_context(store, ContextId("cli", "nope")) is False


def test_restore_brings_it_back_in_its_state_or_under_another_id(store: Store) -> None:
    """restore_trashed refuses an id in use (ContextExists) and keeps the entry; with
    as_context it restores there, whole; an unknown trash id raises NotInTrash."""
    lc = seeded(store)
    states.delete_context(store, MAIN)
    (entry,) = states.trashed_contexts(lc)
    add_context(store, str(MAIN), "fresh")
    with pytest.raises(ContextExists):
        states.restore_trashed(lc, entry.trash_id)
    assert [e.trash_id for e in states.trashed_contexts(lc)] == [entry.trash_id]
    back = ContextId("cli", "back")
    head = states.restore_trashed(lc, entry.trash_id, as_context=back)
    assert head.context == str(back)
    assert history(store, back) == ["alpha walrus", "beta", "gamma"]
    assert history(store, MAIN) == ["fresh"]
    assert states.trashed_contexts(lc) == []
    with pytest.raises(NotInTrash):
        states.restore_trashed(lc, entry.trash_id)


def test_an_archived_context_goes_to_the_trash_archived_and_comes_back_archived(
    store: Store,
) -> None:
    """The trash keeps the archived state; a restore puts the context back into the archive."""
    lc = seeded(store)
    states.archive_context(lc, MAIN)
    assert states.delete_context(store, MAIN) is True
    assert not states.is_archived(lc, MAIN)
    assert states.archived_contexts(lc) == []
    (entry,) = states.trashed_contexts(lc)
    assert entry.archived
    states.restore_trashed(lc, entry.trash_id)
    assert states.is_archived(lc, MAIN)
    assert str(MAIN) not in listed(store)
    assert history(store, MAIN) == ["alpha walrus", "beta", "gamma"]


def test_the_trash_lists_the_latest_deletion_first(store: Store) -> None:
    """trashed_contexts is most recently deleted first, each deletion its own entry."""
    lc = seeded(store)
    states.delete_context(store, MAIN)
    add_context(store, str(MAIN), "second life")
    states.delete_context(store, MAIN)
    states.delete_context(store, OTHER)
    entries = states.trashed_contexts(lc)
    assert [e.context for e in entries] == [str(OTHER), str(MAIN), str(MAIN)]
    assert [e.message_count for e in entries] == [1, 1, 3]
    assert len({e.trash_id for e in entries}) == 3
    assert lifecycle.find_trashed(store, str(MAIN)).trash_id == entries[1].trash_id


def test_a_delete_keeps_a_head_move_made_just_after_it_read_the_head(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delete that read the head just before a rewind (a clear, a compaction) moved it
    trashes the moved head: restored, the context is where the acknowledged move left it
    (the trash entry named the head the delete first read, so a restore undid the move)."""
    lc = seeded(store)
    read_state = lc.session_state

    def read_then_rewind(session_id: Any) -> Any:
        monkeypatch.setattr(lc, "session_state", read_state)  # once
        assert len(contexts.rewind_context(lc, MAIN, 1)) == 1  # another process's rewind
        return read_state(session_id)

    monkeypatch.setattr(lc, "session_state", read_then_rewind)
    assert states.delete_context(lc, MAIN)
    [entry] = states.trashed_contexts(lc)
    states.restore_trashed(lc, entry.trash_id)
    assert history(lc, MAIN) == ["alpha walrus", "beta"]
    assert entry.message_count == 2


def test_a_delete_of_a_context_a_restore_took_from_a_purge_keeps_it_in_the_trash(
    store: Store,
) -> None:
    """A restore attaches a trash entry that a purge marked just after the restore found it
    (the purge then gives way); before the restore's clean-up drops the mark, another process
    deletes the context: the new trash entry is listed and restorable, not marked for purging
    (it copied the stale mark, so it was no trash entry, and a repair purged it)."""
    lc = seeded(store)
    head = store.get_head(MAIN)
    assert head is not None and states.delete_context(lc, MAIN)
    found = lc.session_state(head.session_id)  # what the restore found
    lc.set_session_state(head.session_id, {**found, "purging": True}, expected=found)
    lc.attach_context(MAIN, head.session_id, head.segment_id)  # the restore's attach
    assert states.delete_context(lc, MAIN)  # another process's delete, before the clean-up
    states.finish_lifecycle(lc)  # the restore's clean-up, or a repair's
    [entry] = states.trashed_contexts(lc)
    states.restore_trashed(lc, entry.trash_id)
    assert history(store, MAIN) == ["alpha walrus", "beta", "gamma"]


def test_purge_deletes_for_ever(store: Store) -> None:
    """purge_trashed empties a trash entry (True once, then False); purge_context deletes a
    hot or archived context without the trash; neither can be restored."""
    lc = seeded(store)
    states.delete_context(store, MAIN)
    (entry,) = states.trashed_contexts(lc)
    assert states.purge_trashed(lc, entry.trash_id) is True
    assert states.purge_trashed(lc, entry.trash_id) is False
    with pytest.raises(NotInTrash):
        states.restore_trashed(lc, entry.trash_id)
    states.archive_context(lc, OTHER)
    assert states.purge_context(lc, OTHER) is True
    assert states.purge_context(lc, OTHER) is False
    assert store.get_head(OTHER) is None and states.archived_contexts(lc) == []
    assert states.trashed_contexts(lc) == []
    assert listed(store) == []


# --------------------------------------------------------------------------- pins


def test_a_pin_stays_with_the_context_through_archive_trash_and_restore(store: Store) -> None:
    """pinned_contexts shows hot and archived pins, not trashed ones; the trash entry and the
    restored context keep the pin; unpin removes it; a missing context cannot be pinned."""
    lc = seeded(store)
    assert states.pin_context(lc, MAIN) is True
    assert states.pinned_contexts(lc) == {str(MAIN)}
    archived = states.archive_context(lc, MAIN)
    assert archived is not None and archived.pinned
    assert states.pinned_contexts(lc) == {str(MAIN)}
    assert [a.pinned for a in states.archived_contexts(lc)] == [True]
    states.delete_context(store, MAIN)
    assert states.pinned_contexts(lc) == frozenset()
    (entry,) = states.trashed_contexts(lc)
    assert entry.pinned
    states.restore_trashed(lc, entry.trash_id)
    assert states.pinned_contexts(lc) == {str(MAIN)} and states.is_archived(lc, MAIN)
    assert states.pin_context(lc, MAIN, False) is True
    assert states.pinned_contexts(lc) == frozenset()
    assert states.pin_context(lc, ContextId("cli", "nope")) is False


# --------------------------------------------------------------------------- above the store


def test_search_leaves_archived_contexts_out_unless_asked(store: Store) -> None:
    """search (the store's index or a scan) finds an archived context's messages only with
    ``archived=True``, and finds them again once it is unarchived."""
    lc = seeded(store)
    states.archive_context(lc, MAIN)
    hot = {hit.context for hit in search(store, SearchQuery("walrus"))}
    assert hot == {str(OTHER)}
    both = {hit.context for hit in search(store, SearchQuery("walrus", archived=True))}
    assert both == {str(MAIN), str(OTHER)}
    states.unarchive_context(lc, MAIN)
    assert {hit.context for hit in search(store, SearchQuery("walrus"))} == both


def test_the_python_delete_keeps_its_seed_meaning_and_is_undoable(store: Store) -> None:
    """lifecycle.delete_context: gone from list and get_stats, but in the trash, restorable;
    the removal is in the maintenance log."""
    lc = seeded(store)
    assert lifecycle.delete_context(store, MAIN) is True
    assert [r.context for r in contexts.list_contexts(store).rows] == [str(OTHER)]
    with pytest.raises(ContextNotFound):
        contexts.get_stats(store, MAIN)
    (entry,) = states.trashed_contexts(lc)
    states.restore_trashed(lc, entry.trash_id)
    assert contexts.get_stats(store, MAIN)["message_count"] == 3
    (record,) = lifecycle.MaintenanceLog.of(store).records()
    assert record["action"] == "trash" and record["context"] == str(MAIN)
    assert record["trash_id"] == entry.trash_id


def test_a_plan_by_age_skips_pins_and_names_take_them(store: Store) -> None:
    """plan_archive by age selects inactive hot contexts but not pinned ones; a named pinned
    context is selected; run_archive archives and logs each with the store's figures."""
    lc = seeded(store)
    states.pin_context(lc, OTHER)
    later = datetime.now(UTC) + timedelta(days=40)
    plan = lifecycle.plan_archive(store, older_than=timedelta(days=30), now=later)
    assert [c.context for c in plan.candidates] == [str(MAIN)]
    assert plan.skipped_pinned == [str(OTHER)]
    assert plan.hot_bytes == lifecycle.hot_bytes(store, MAIN) > 0
    assert lifecycle.plan_archive(store, older_than=timedelta(days=30)).candidates == []
    named = lifecycle.plan_archive(store, names=[OTHER])
    assert [(c.context, c.pinned) for c in named.candidates] == [(str(OTHER), True)]
    done = lifecycle.run_archive(store, plan, why="test")
    assert [a.context for a in done] == [str(MAIN)] and states.is_archived(lc, MAIN)
    records = lifecycle.MaintenanceLog.of(store).records()
    assert [(r["action"], r["context"], r["why"]) for r in records] == [
        ("archive", str(MAIN), "test")
    ]


def test_head_and_tail_agree_with_the_head_and_next_seq(store: Store) -> None:
    """head_and_tail (one read on a store with HeadTail) gives get_head and next_seq's
    answers: for a hot context after an append, an archived one, and None for none."""
    lc = seeded(store)
    for context in (MAIN, OTHER):
        head = store.get_head(context)
        assert head is not None
        assert head_and_tail(store, context) == (
            head,
            store.next_seq(head.session_id, head.segment_id),
        )
    before = head_and_tail(store, MAIN)
    assert before is not None
    save_delta(store, before[0], [{"role": "user", "content": "delta"}])
    after = head_and_tail(store, MAIN)
    assert after is not None and after[1] == before[1] + 1
    states.archive_context(lc, MAIN)
    assert head_and_tail(store, MAIN) == after
    assert head_and_tail(store, ContextId("cli", "nobody")) is None


def test_locked_head_and_tail_reads_under_the_lock(store: Store) -> None:
    """locked_head_and_tail holds the context's lock and reads once it is held: it gives
    head_and_tail's answer after every write of the lock's previous holder, and no writer
    that takes the lock writes while it holds it; hot, archived and absent contexts alike."""
    lc = seeded(store)
    before = head_and_tail(store, MAIN)
    assert before is not None
    held, go = threading.Event(), threading.Event()

    def write_under_lock(wait: threading.Event | None) -> None:
        with context_lock(store, MAIN):
            held.set()
            if wait is not None:
                wait.wait(5)  # let the main thread ask for the lock first
            save_delta(store, before[0], [{"role": "user", "content": "under the lock"}])

    writer = threading.Thread(target=write_under_lock, args=(go,))
    writer.start()
    assert held.wait(5)
    threading.Timer(0.2, go.set).start()
    with locked_head_and_tail(store, MAIN) as found:
        assert found == (before[0], before[1] + 1)  # the previous holder's write is seen
        held.clear()
        blocked = threading.Thread(target=write_under_lock, args=(None,))
        blocked.start()
        assert not held.wait(0.2)  # it waits for our lock
        assert head_and_tail(store, MAIN) == found
    blocked.join(5)
    writer.join(5)
    after = head_and_tail(store, MAIN)
    assert after == (before[0], before[1] + 2)
    states.archive_context(lc, MAIN)
    with locked_head_and_tail(store, MAIN) as found:
        assert found == after
    with locked_head_and_tail(store, ContextId("cli", "nobody")) as found:
        assert found is None


@pytest.mark.parametrize("overtaken", ["delete", "purge"])
def test_a_delete_or_purge_a_purge_overtakes_finds_the_context_gone(
    store: Store, overtaken: str
) -> None:
    """A purge (``delete --purge``) that lands between a delete's (or a purge's) read of the
    head and its detach: the slower call finds no context and says so (False), not an error
    about a missing session."""
    lc = seeded(store)
    real = store.detach_context

    def purged_first(*args: Any, **kwargs: Any) -> Any:
        store.detach_context = real  # type: ignore[method-assign]
        assert states.purge_context(lc, MAIN)
        return real(*args, **kwargs)

    store.detach_context = purged_first  # type: ignore[method-assign]
    move = states.delete_context if overtaken == "delete" else states.purge_context
    assert move(lc, MAIN) is False
    assert store.get_head(MAIN) is None and states.trashed_contexts(lc) == []
