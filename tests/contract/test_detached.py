"""Contract: detached sessions, on every backend.

The crate's quick start creates a session without a context (``create_segment(&store,
SegmentStartState {...})``). Such a session works with the whole log API by reference, never
shows in listings or search, is found by ``detached_sessions``, and a context can adopt it
once with ``attach_context``: from then on it is a context like any other.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from helpers.history import add_context
from terrarium import (
    ConflictError,
    ContextExists,
    InvalidContextId,
    PodActiveSegmentRef,
    SegmentNotFound,
    SegmentStartState,
    SessionAttached,
    Store,
    TraceEntry,
    UsageRecord,
    append_entries,
    append_entry,
    attach_context,
    clear_segment,
    create_compacted_segment,
    create_segment,
    create_segment_with_ids,
    detached_sessions,
    fork,
    fork_at,
    new_segment_id,
    new_session_id,
    read_entries,
    restore,
    restore_by_segment,
    save_config_changed,
    save_delta,
    save_extension,
    save_run_completed,
    save_trace,
    save_turn_end,
    save_usage,
    save_user_input,
    states,
)
from terrarium.index import listing as lister
from terrarium.index._listing import Listing
from terrarium.index._query import SearchQuery
from terrarium.model import ContextId
from terrarium.search import scan
from terrarium.search import search as search_any
from terrarium.sessions import lineage
from terrarium.stores.base import NewEntry


def _quick_start(store: Store) -> PodActiveSegmentRef:
    """The crate's quick start, as written: a session with no context."""
    config = {"model": "m", "temperature": 0.2}
    session_id, segment_id = create_segment(
        store, SegmentStartState(system_prompt=None, config=config, history=[])
    )
    return PodActiveSegmentRef(session_id, segment_id)


def _talk(store: Store, ref: PodActiveSegmentRef, words: str) -> None:
    save_user_input(store, ref, f"tell me about {words}")
    save_delta(store, ref, [{"role": "assistant", "content": f"{words} are interesting"}])
    save_usage(store, ref, UsageRecord("m", prompt_tokens=5, completion_tokens=3))
    save_run_completed(store, ref, finish_reason="stop")
    save_turn_end(store, ref)


def test_the_crate_quick_start_runs_as_written(store: Store) -> None:
    """create_segment(store, SegmentStartState(...)) with no context returns (session,
    segment): a root segment whose header says ``"context": null``, in a session that belongs
    to no context, listed by detached_sessions and in no listing."""
    ref = _quick_start(store)
    assert isinstance(ref.session_id, uuid.UUID) and isinstance(ref.segment_id, uuid.UUID)
    header = read_entries(store, ref)[0]
    assert header.kind == "header"
    assert header.data["context"] is None
    assert header.data["origin"] == {"kind": "root"}
    assert header.data["config"] == {"model": "m", "temperature": 0.2}
    assert store.list_segments(ref.session_id) == [ref.segment_id]
    assert store.next_seq(ref.session_id, ref.segment_id) == 1
    assert detached_sessions(store) == [ref.session_id]
    assert store.list_contexts() == []
    if isinstance(lister(store), Listing):
        assert lister(store).list_contexts_fast() == []
    state = restore_by_segment(store, ref.session_id, ref.segment_id)
    assert state.context is None and state.history == [] and state.next_seq == 1


def test_create_segment_with_a_context_is_unchanged(store: Store) -> None:
    """create_segment(..., context=...) still creates the context, attached from the start,
    and detached_sessions does not list it."""
    session_id, segment_id = create_segment(store, SegmentStartState(), context="cli:main")
    head = store.get_head(ContextId.parse("cli:main"))
    assert head is not None and (head.session_id, head.segment_id) == (session_id, segment_id)
    assert read_entries(store, head)[0].data["context"] == "cli:main"
    assert detached_sessions(store) == []


def test_create_segment_with_ids_without_a_context(store: Store) -> None:
    """create_segment_with_ids without a context makes a detached session with those ids and
    returns a reference to its root; the same session id twice is a conflict."""
    session_id, segment_id = new_session_id(), new_segment_id()
    ref = create_segment_with_ids(store, session_id, segment_id, SegmentStartState("be kind"))
    assert ref == PodActiveSegmentRef(session_id, segment_id)
    assert restore_by_segment(store, session_id, segment_id).system_prompt == "be kind"
    with pytest.raises(ConflictError):
        create_segment_with_ids(store, session_id, new_segment_id())
    assert store.list_segments(session_id) == [segment_id]


def test_the_whole_log_api_works_on_a_detached_session(store: Store) -> None:
    """Appends, typed saves, traces, reads, forks, compaction and clear all work by reference
    on a session that belongs to no context, and restore replays what was written."""
    ref = _quick_start(store)
    _talk(store, ref, "newts")
    save_config_changed(store, ref, {"model": "n"}, system_prompt="be brief")
    save_extension(store, ref, "notes", {"k": 1})
    append_entry(store, ref, "custom_kind", {"x": 1})
    append_entries(store, ref, [("user_input", {"item": {"role": "user", "content": "more"}})])
    save_trace(store, ref, [TraceEntry("2026-01-01T00:00:00Z", "chunk", {"t": "x"})])
    assert store.read_trace(ref.session_id, ref.segment_id) == [
        {"ts": "2026-01-01T00:00:00Z", "event": "chunk", "data": {"t": "x"}}
    ]
    state = restore_by_segment(store, ref.session_id, ref.segment_id)
    assert [m["content"] for m in state.history] == [
        "tell me about newts",
        "newts are interesting",
        "more",
    ]
    assert state.config == {"model": "n"} and state.system_prompt == "be brief"
    assert state.usage.prompt_tokens == 5 and state.turns == 1
    assert state.extensions == {"notes": {"k": 1}}
    assert state.next_seq == store.next_seq(ref.session_id, ref.segment_id) == 10
    assert [e.seq for e in read_entries(store, ref)] == list(range(10))

    forked = fork_at(store, ref, 2)
    fork_ref = PodActiveSegmentRef(ref.session_id, forked)
    save_user_input(store, fork_ref, "on the fork")
    assert [r.header["segment_id"] for r in lineage(store, ref.session_id, forked)] == [
        str(ref.segment_id),
        str(forked),
    ]
    on_fork = restore_by_segment(store, ref.session_id, forked)
    assert [m["content"] for m in on_fork.history] == [
        "tell me about newts",
        "newts are interesting",
        "on the fork",
    ]
    tail = fork(store, ref)
    assert restore_by_segment(store, ref.session_id, tail).history == state.history
    compacted = create_compacted_segment(store, state, [{"role": "system", "content": "summary"}])
    cleared = clear_segment(store, PodActiveSegmentRef(ref.session_id, compacted))
    after = restore_by_segment(store, ref.session_id, compacted)
    assert after.history == [{"role": "system", "content": "summary"}]
    assert after.usage == state.usage and after.context is None
    assert restore_by_segment(store, ref.session_id, cleared).history == []
    assert store.list_segments(ref.session_id) == sorted(
        [ref.segment_id, forked, tail, compacted, cleared]
    )
    assert detached_sessions(store) == [ref.session_id]
    assert store.list_contexts() == []


def test_attach_the_root_makes_a_context(store: Store) -> None:
    """attach_context makes a new context whose head is the session's root: restore of the
    context equals restore_by_segment, the header still says context null, the head's
    creation time is the session's, and the session is no longer detached."""
    ref = _quick_start(store)
    _talk(store, ref, "axolotls")
    head = attach_context(store, "cli:adopted", ref)
    assert (head.context, head.session_id, head.segment_id) == (
        "cli:adopted",
        ref.session_id,
        ref.segment_id,
    )
    assert head.created_at == read_entries(store, ref)[0].ts
    assert store.get_head(ContextId.parse("cli:adopted")) == head
    assert restore(store, "cli:adopted") == restore_by_segment(
        store, ref.session_id, ref.segment_id
    )
    assert read_entries(store, ref)[0].data["context"] is None  # the log is append-only
    assert detached_sessions(store) == []
    assert [h.context for h in store.list_contexts()] == ["cli:adopted"]
    assert [h.context for h in store.list_contexts("cli")] == ["cli:adopted"]
    # It is a context like any other: appends, and a compaction that moves its head.
    save_user_input(store, head, "and after?")
    state = restore(store, "cli:adopted")
    assert state.history[-1] == {"role": "user", "content": "and after?"}
    moved = create_compacted_segment(store, state, [], context="cli:adopted")
    assert store.get_head(ContextId.parse("cli:adopted")).segment_id == moved  # type: ignore[union-attr]


def test_attach_a_fork_or_compaction_made_while_detached(store: Store) -> None:
    """Any segment of the session can be the new head: a fork or a compaction made while it
    was detached, and restore of the context replays that segment."""
    ref = _quick_start(store)
    _talk(store, ref, "salamanders")
    forked = fork_at(store, ref, 1)
    save_user_input(store, PodActiveSegmentRef(ref.session_id, forked), "forked words")
    compacted = create_compacted_segment(store, ref, [{"role": "system", "content": "short"}])
    head = attach_context(store, "irc:#zoo", PodActiveSegmentRef(ref.session_id, forked))
    assert head.segment_id == forked
    state = restore(store, "irc:#zoo")
    assert state == restore_by_segment(store, ref.session_id, forked)
    assert [m["content"] for m in state.history] == ["tell me about salamanders", "forked words"]
    assert store.list_segments(ref.session_id) == sorted([ref.segment_id, forked, compacted])

    other = _quick_start(store)
    compacted = create_compacted_segment(store, other, [{"role": "system", "content": "gist"}])
    head = attach_context(store, "game:run1", PodActiveSegmentRef(other.session_id, compacted))
    assert restore(store, "game:run1").history == [{"role": "system", "content": "gist"}]
    assert [h.context for h in store.list_contexts()] == ["game:run1", "irc:#zoo"]


def test_attach_refusals_change_nothing(store: Store) -> None:
    """Attaching to an existing context (ContextExists), a session that already belongs to
    a context (SessionAttached), an unknown session or segment (SegmentNotFound), or under
    a name unfit for a new context (InvalidContextId) is refused, and nothing changes."""
    taken = add_context(store, "cli:taken", "hello")
    ref = _quick_start(store)
    with pytest.raises(ContextExists):
        attach_context(store, "cli:taken", ref)
    with pytest.raises(SessionAttached, match=str(taken.session_id)):
        attach_context(store, "cli:other", taken)
    with pytest.raises(SegmentNotFound):
        attach_context(store, "cli:other", PodActiveSegmentRef(new_session_id(), ref.segment_id))
    with pytest.raises(SegmentNotFound):
        attach_context(store, "cli:other", PodActiveSegmentRef(ref.session_id, new_segment_id()))
    with pytest.raises(InvalidContextId):
        attach_context(store, "no colon", ref)
    assert [h.context for h in store.list_contexts()] == ["cli:taken"]
    assert store.get_head(ContextId.parse("cli:taken")) == taken
    assert detached_sessions(store) == [ref.session_id]

    attach_context(store, "cli:first", ref)
    with pytest.raises(SessionAttached, match="cli:first"):
        attach_context(store, "cli:second", ref)
    assert store.get_head(ContextId.parse("cli:second")) is None
    assert [h.context for h in store.list_contexts()] == ["cli:first", "cli:taken"]


def test_detached_sessions_are_found_oldest_first_and_never_deleted(store: Store) -> None:
    """detached_sessions lists every detached session oldest first; deleting contexts,
    attaching another session, and creating contexts leave them alone."""
    refs = [_quick_start(store) for _ in range(3)]
    add_context(store, "cli:x", "hi")
    attach_context(store, "cli:y", refs[1])
    assert detached_sessions(store) == [refs[0].session_id, refs[2].session_id]
    states.delete_context(store, ContextId.parse("cli:x"))
    states.delete_context(store, ContextId.parse("cli:y"))
    assert detached_sessions(store) == [refs[0].session_id, refs[2].session_id]
    for ref in (refs[0], refs[2]):
        assert restore_by_segment(store, ref.session_id, ref.segment_id).next_seq == 1


def test_listing_and_search_see_the_attached_context(store: Store) -> None:
    """Before attach a detached session's items are in no search and no listing; after it,
    search (the store's own index, or the scan) finds them under the new context, with the
    type filter, and the fast listing counts them as a restore does."""
    add_context(store, "cli:main", "nothing here")
    ref = _quick_start(store)
    _talk(store, ref, "capybaras")
    forked = fork(store, ref)
    save_user_input(store, PodActiveSegmentRef(ref.session_id, forked), "capybaras swim")
    assert search_any(store, "capybaras") == []
    assert scan(store, "capybaras") == []
    if isinstance(lister(store), Listing):
        assert [s.context for s in lister(store).list_contexts_fast()] == ["cli:main"]

    attach_context(store, "irc:#rodents", PodActiveSegmentRef(ref.session_id, forked))
    hits = search_any(store, "capybaras")
    assert {(h.segment_id, h.seq) for h in hits} == {
        (ref.segment_id, 1),
        (ref.segment_id, 2),
        (forked, 1),
    }
    assert {(h.context, h.session_id) for h in hits} == {("irc:#rodents", ref.session_id)}
    assert {h.date for h in hits} == {read_entries(store, ref)[0].ts[:10]}
    typed = search_any(store, SearchQuery("capybaras", type="irc"))
    assert {h.context for h in typed} == {"irc:#rodents"}
    assert search_any(store, SearchQuery("capybaras", type="cli")) == []
    in_context = search_any(store, SearchQuery("capybaras", context="irc:#rodents"))
    assert len(in_context) == len(hits)
    assert {h.context for h in scan(store, "capybaras")} == {"irc:#rodents"}
    if isinstance(lister(store), Listing):
        summaries = {s.context: s for s in lister(store).list_contexts_fast()}
        state = restore(store, "irc:#rodents")
        assert summaries["irc:#rodents"].message_count == len(state.history) == 3
        assert summaries["irc:#rodents"].last_active == state.last_active
        assert summaries["irc:#rodents"].date == state.created_at[:10]
    # Written after the attach: found and counted too.
    head = store.get_head(ContextId.parse("irc:#rodents"))
    assert head is not None
    save_user_input(store, head, "capybaras again")
    assert len(search_any(store, SearchQuery("again", context="irc:#rodents"))) == 1
    if isinstance(lister(store), Listing):
        summaries = {s.context: s for s in lister(store).list_contexts_fast()}
        assert summaries["irc:#rodents"].message_count == 4


def test_attach_seen_by_another_store_on_the_same_data(store: Store, other: Store) -> None:
    """A second store (another process, in effect) that wrote to the session while it was
    detached keeps writing to it after the first attached it, and sees the context."""
    ref = _quick_start(store)
    save_user_input(other, ref, "from the other")
    assert store.list_segments(ref.session_id) == other.list_segments(ref.session_id)
    attach_context(store, "cli:shared", ref)
    save_user_input(other, ref, "still the other")
    forked = fork(other, ref)
    assert forked in store.list_segments(ref.session_id)
    assert other.get_head(ContextId.parse("cli:shared")) is not None
    assert [m["content"] for m in restore(other, "cli:shared").history] == [
        "from the other",
        "still the other",
    ]
    with pytest.raises(SessionAttached):
        attach_context(other, "cli:again", ref)
    assert detached_sessions(other) == []


def test_the_manager_and_exports_see_the_attached_context(store: Store) -> None:
    """MultiContextManager's list_all_contexts and get_stats, and every export format, show
    an attached context, with what was written while it was detached."""
    from terrarium import MultiContextManager
    from terrarium.export import export_context, get_format

    ref = _quick_start(store)
    _talk(store, ref, "geckos")
    manager = MultiContextManager(None, store=store)  # type: ignore[arg-type]
    assert manager.list_all_contexts() == {}
    attach_context(store, "cli:geckos", ref)
    listed = manager.list_all_contexts()
    assert [c["session_id"] for c in listed["cli"]] == ["geckos"]
    stats = manager.get_stats("cli:geckos")
    assert stats["message_count"] == 2
    for fmt in ("markdown", "jsonl", "terrarium-json", "openai"):
        exported = export_context(store, "cli:geckos", get_format(fmt))
        text = exported if isinstance(exported, str) else exported.decode()
        assert "geckos are interesting" in text, fmt


def test_copying_a_whole_store_carries_detached_sessions(store: Store, tmp_path: Path) -> None:
    """copy_store of every context copies detached sessions too (detached in the
    destination, every segment, entry and trace as stored); an interrupted copy is completed
    by the next; a session the destination holds in a context is skipped, not touched."""
    from terrarium import FsStore
    from terrarium.copy import complete_session, copy_store, read_source

    src = FsStore(tmp_path / "src")
    try:
        ref = _quick_start(src)
        _talk(src, ref, "lizards")
        forked = fork_at(src, ref, 2)
        save_user_input(src, PodActiveSegmentRef(ref.session_id, forked), "branch")
        save_trace(src, ref, [TraceEntry("2026-01-01T00:00:00Z", "chunk", {"t": "y"})])
        add_context(src, "cli:plain", "hello")
        # An interrupted earlier copy: the root and part of its entries only.
        store.create_session(read_entries(src, ref)[0].to_dict())
        first = src.read_segment(ref.session_id, ref.segment_id).entries[0]
        data = {k: v for k, v in first.items() if k not in ("v", "seq", "ts", "kind")}
        store.append(ref.session_id, ref.segment_id, [NewEntry(first["kind"], first["ts"], data)])
        report = copy_store(src, store)
        assert sorted(report.copied) == ["cli:plain", f"session {ref.session_id}"]
        assert detached_sessions(store) == [ref.session_id]
        for segment_id in (ref.segment_id, forked):
            assert read_entries(store, PodActiveSegmentRef(ref.session_id, segment_id)) == (
                read_entries(src, PodActiveSegmentRef(ref.session_id, segment_id))
            )
        assert store.read_trace(ref.session_id, ref.segment_id) == src.read_trace(
            ref.session_id, ref.segment_id
        )
        with pytest.raises(ContextExists):  # nothing left to copy
            complete_session(store, read_source(src, session_id=ref.session_id))
        attach_context(store, "cli:lizards", ref)
        again = copy_store(src, store)
        assert [name for name, _ in again.skipped] == ["cli:plain", f"session {ref.session_id}"]
        assert copy_store(src, store, ["cli:plain"]).skipped[0][0] == "cli:plain"
    finally:
        src.close()


def test_racing_attaches_of_one_session_attach_it_once(store: Store, other: Store) -> None:
    """Two stores (processes, in effect) attaching one session to two contexts at once: one
    wins, the other gets SessionAttached, and only the winner's context exists."""
    from concurrent.futures import ThreadPoolExecutor

    for round_ in range(5):
        ref = _quick_start(store)
        names = (f"cli:a{round_}", f"cli:b{round_}")

        def attach(pair: tuple[Store, str], ref: PodActiveSegmentRef = ref) -> str:
            try:
                return attach_context(pair[0], pair[1], ref).context
            except SessionAttached:
                return ""

        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(attach, [(store, names[0]), (other, names[1])]))
        [winner] = [r for r in results if r]
        assert sorted(results) == ["", winner]
        heads = [store.get_head(ContextId.parse(n)) for n in names]
        assert [h.context for h in heads if h is not None] == [winner]
    assert detached_sessions(store) == [] and detached_sessions(other) == []
    assert len(store.list_contexts()) == 5
