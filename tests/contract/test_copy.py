"""Copying sessions into any backend is lossless (terrarium.copy)."""

from __future__ import annotations

import threading
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest

from terrarium import (
    FsStore,
    Item,
    MemoryStore,
    PodActiveSegmentRef,
    SegmentStartState,
    SystemItem,
    TraceEntry,
    UsageRecord,
    append_entry,
    append_system_item,
    clear_segment,
    copy,
    create_compacted_segment,
    create_segment,
    fork_at,
    fork_context,
    restore,
    restore_by_segment,
    save_config_changed,
    save_delta,
    save_trace,
    save_usage,
    save_user_input,
    states,
)
from terrarium.blobs import inline_line, offload_line
from terrarium.copy import complete_session, copy_store, read_source, session_segments
from terrarium.errors import ContextExists, SessionConflict
from terrarium.model import ContextId, SegmentId
from terrarium.sessions import detached_sessions
from terrarium.stores.base import Lifecycle, Store


def _source(root: Path) -> FsStore:
    """A filesystem store with a session tree exercising every kind of segment."""
    src = FsStore(root)
    session_id, root_id = create_segment(
        src, SegmentStartState(system_prompt="sys", config={"t": 1}), context="irc:#python"
    )
    main = PodActiveSegmentRef(session_id, root_id)
    save_user_input(src, main, "hi")
    save_delta(src, main, [Item.assistant("hello"), {"role": "assistant", "content": "x", "z": 1}])
    save_usage(src, main, UsageRecord("m", 3, 4, 1))
    append_entry(src, main, "from_the_future", {"payload": [1, 2]})
    append_system_item(src, main, SystemItem("resumed", {"after": "3h"}))
    save_trace(src, main, [TraceEntry("2026-01-01T00:00:00.000000Z", "chunk", {"d": "h"})])
    branch = PodActiveSegmentRef(session_id, fork_at(src, main, 2))
    save_user_input(src, branch, "on a branch")
    compacted = create_compacted_segment(src, main, [Item.user("summary")], context="irc:#python")
    now = PodActiveSegmentRef(session_id, compacted)
    save_config_changed(src, now, {"t": 2}, system_prompt="new")
    clear_segment(src, now, context="irc:#python")
    create_segment(src, context="cli:main")
    fork_context(src, "irc:#python", "cli:copy-of-python")
    return src


def test_copy_into_any_backend_restores_every_segment_the_same(
    store: Store, tmp_path: Path
) -> None:
    """Every segment of every copied context restores to the same state, lines and traces."""
    with _source(tmp_path / "src") as src:
        report = copy_store(src, store)
        assert sorted(report.copied) == ["cli:copy-of-python", "cli:main", "irc:#python"]
        assert report.skipped == []
        assert [h.context for h in store.list_contexts()] == [
            h.context for h in src.list_contexts()
        ]
        for head in src.list_contexts():
            copied = store.get_head(ContextId.parse(head.context))
            assert copied is not None  # updated_at is when the head moved here
            assert copied.ref == head.ref and copied.created_at == head.created_at
            segments = src.list_segments(head.session_id)
            assert store.list_segments(head.session_id) == segments
            for segment in segments:
                a = src.read_segment(head.session_id, segment)
                b = store.read_segment(head.session_id, segment)
                assert (a.header, a.entries, a.next_seq) == (b.header, b.entries, b.next_seq)
                assert restore_by_segment(src, head.session_id, segment) == restore_by_segment(
                    store, head.session_id, segment
                )
                assert src.read_trace(head.session_id, segment) == store.read_trace(
                    head.session_id, segment
                )


def test_copy_skips_contexts_the_destination_has(store: Store, tmp_path: Path) -> None:
    """A second copy changes nothing and reports every context as skipped."""
    with _source(tmp_path / "src") as src:
        copy_store(src, store, ["cli:main"])
        again = copy_store(src, store)
        assert again.copied == ["cli:copy-of-python", "irc:#python"]
        assert [c for c, _ in again.skipped] == ["cli:main"]
        assert copy_store(src, store).copied == []


def test_archived_contexts_and_pins_are_copied_as_they_are(store: Store, tmp_path: Path) -> None:
    """A copy of a whole store takes its archived contexts along, archived, and its pins;
    not its trash."""
    assert isinstance(store, Lifecycle)
    with _source(tmp_path / "src") as src:
        states.pin_context(src, ContextId.parse("cli:main"))
        states.archive_context(src, ContextId.parse("irc:#python"))
        states.delete_context(src, ContextId.parse("cli:copy-of-python"))
        history = restore(src, "irc:#python").history
        report = copy_store(src, store)
        assert sorted(report.copied) == ["cli:main", "irc:#python"]
        assert [a.context for a in states.archived_contexts(store)] == ["irc:#python"]
        assert [h.context for h in store.list_contexts()] == ["cli:main"]
        assert states.pinned_contexts(store) == frozenset({"cli:main"})
        assert states.trashed_contexts(store) == []
        assert restore(store, "irc:#python").history == history


def test_a_session_in_the_destinations_trash_is_a_conflict_not_a_second_copy(
    store: Store, tmp_path: Path
) -> None:
    """Copied, then deleted in the destination: a second copy names the trash and writes
    nothing (the session would be live and trashed at once); restored there, it is equal."""
    assert isinstance(store, Lifecycle)
    with _source(tmp_path / "src") as src:
        complete_session(store, read_source(src, "cli:main"))
        assert states.delete_context(store, ContextId.parse("cli:main"))
        with pytest.raises(SessionConflict, match="trash"):
            complete_session(store, read_source(src, "cli:main"))
        assert store.get_head(ContextId.parse("cli:main")) is None
        (entry,) = states.trashed_contexts(store)
        states.restore_trashed(store, entry.trash_id)
        assert copy_store(src, store, ["cli:main"]).copied == []


@pytest.mark.parametrize("step", ["create_session", "create_segment", "append"])
def test_a_copy_of_a_detached_session_meeting_a_copy_of_it_as_a_context_writes_it_once(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """A copy of the same session as a context's (another process's, from another source,
    holding no lock of this copy's: an earlier version's, which took the context's lock
    only; copies now take turns, ``test_race_gaps.py``) writes all of it and attaches it
    between this copy's plan and its ``step``: this copy plans again and skips it as a
    context's, no conflict or error (before, the other's write failed it as a conflict or an
    error; the lifecycle race caught it on contexts)."""
    with _source(tmp_path / "src") as src:
        session_id, root = create_segment(src, SegmentStartState(system_prompt="nobody's"))
        main = PodActiveSegmentRef(session_id, root)
        save_user_input(src, main, "hi")
        branch = PodActiveSegmentRef(session_id, fork_at(src, main, 1))
        save_user_input(src, branch, "on a branch")
        adopted = MemoryStore()
        copy_store(src, adopted, [], detached=True)
        adopted.attach_context(ContextId.parse("cli:adopted"), session_id, root)
        real = getattr(store, step)

        def racing(*args: object, **kwargs: object) -> object:
            monkeypatch.setattr(store, step, real)  # the other copy writes as usual
            with monkeypatch.context() as unlocked:  # and takes none of the locks held here
                unlocked.setattr(copy, "context_lock", lambda *_: nullcontext())
                assert copy_store(adopted, store, ["cli:adopted"]).copied == ["cli:adopted"]
            return real(*args, **kwargs)

        monkeypatch.setattr(store, step, racing)
        report = copy_store(src, store, [], detached=True)
        assert report.conflicts == [] and report.copied == []
        assert [name for name, _ in report.skipped] == [f"session {session_id}"], report
        assert detached_sessions(store) == []
        for segment in src.list_segments(session_id):
            there = store.read_segment(session_id, segment)
            want = src.read_segment(session_id, segment)
            assert [there.header, *there.entries] == [want.header, *want.entries]


def _with_detached(root: Path) -> FsStore:
    """:func:`_source`, and a detached session whose two segments have traces."""
    src = _source(root)
    session_id, root_id = create_segment(src, SegmentStartState(system_prompt="nobody's"))
    main = PodActiveSegmentRef(session_id, root_id)
    save_user_input(src, main, "hi")
    save_trace(src, main, [TraceEntry("2026-01-01T00:00:00.000000Z", "chunk", {"d": "h"})])
    branch = PodActiveSegmentRef(session_id, fork_at(src, main, 1))
    save_trace(src, branch, [TraceEntry("2026-01-01T00:00:01.000000Z", "end", {})])
    return src


@pytest.mark.parametrize("what", ["context", "detached session"])
def test_two_copies_of_a_session_at_once_write_its_traces_once(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    """Two copies of one context, or of one detached session, at once (two threads here, two
    processes in the race): a trace has no sequence number to compare and set, so the copies
    take turns under the lock the session's id picks (a context's copy under the context's
    lock too), and each trace entry is written once (before, both wrote it: the lifecycle
    race caught it on contexts; a detached session had no lock)."""
    with _with_detached(tmp_path / "src") as src:
        [session_id] = detached_sessions(src)
        if what == "context":
            head = src.get_head(ContextId.parse("irc:#python"))
            assert head is not None
            session_id, which, detached = head.session_id, ["irc:#python"], False
        else:
            which, detached = [], True
        at_trace, other_waits = threading.Event(), threading.Event()
        append_trace, lock_context = store.append_trace, getattr(store, "lock_context", None)

        def held_trace(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is copier and not at_trace.is_set():
                at_trace.set()
                assert other_waits.wait(30)
            return append_trace(*args, **kwargs)

        def lock(context: ContextId) -> Any:
            if threading.current_thread() is worker:
                other_waits.set()  # about to wait for the first copy
            assert lock_context is not None
            return lock_context(context)

        monkeypatch.setattr(store, "append_trace", held_trace)
        if lock_context is not None:
            monkeypatch.setattr(store, "lock_context", lock)

        def other() -> None:
            copy_store(src, store, which, detached=detached)
            other_waits.set()

        worker = threading.Thread(target=other)
        copier = threading.Thread(target=lambda: copy_store(src, store, which, detached=detached))
        copier.start()
        assert at_trace.wait(30)
        worker.start()
        copier.join(30)
        worker.join(30)
        traces = {s: src.read_trace(session_id, s) for s in src.list_segments(session_id)}
        assert traces == {s: store.read_trace(session_id, s) for s in traces}
        assert sum(map(bool, traces.values())) == 1 + detached  # the segments with one


def _lines(store: Store, context: str) -> dict[str, list[dict[str, object]]]:
    """Every segment's lines of the context's session, by segment id."""
    head = store.get_head(ContextId.parse(context))
    assert head is not None
    return {
        str(s): [
            inline_line(line, store)
            for line in (lambda r: [r.header, *r.entries])(store.read_segment(head.session_id, s))
        ]
        for s in store.list_segments(head.session_id)
    }


def test_a_copy_cut_short_is_completed_not_taken_for_done(store: Store, tmp_path: Path) -> None:
    """What an older, interrupted copy left (the context made with its root header only, the
    head on it; part of a segment; a detached part of a session) is completed by the next
    copy: missing lines, segments and traces written, the head moved to the source's. A
    third copy finds it all there."""
    with _source(tmp_path / "src") as src:
        python = src.get_head(ContextId.parse("irc:#python"))
        assert python is not None
        segments = session_segments(src, python.session_id)
        root = SegmentId(segments[0][0]["segment_id"])
        store.create_context(ContextId.parse("irc:#python"), offload_line(store, segments[0][0]))
        assert store.get_head(ContextId.parse("irc:#python")).segment_id == root  # type: ignore[union-attr]
        main = src.get_head(ContextId.parse("cli:main"))
        assert main is not None
        header = src.read_segment(main.session_id, main.segment_id).header
        store.create_session(header)  # a detached part: the new copy's first step
        report = copy_store(src, store)
        assert sorted(report.completed) == ["cli:main", "irc:#python"]
        assert report.present == [] and report.conflicts == []
        for head in src.list_contexts():
            copied = store.get_head(ContextId.parse(head.context))
            assert copied is not None and copied.ref == head.ref, head.context
            assert _lines(store, head.context) == _lines(src, head.context)
            for segment in src.list_segments(head.session_id):
                assert store.read_trace(head.session_id, segment) == src.read_trace(
                    head.session_id, segment
                )
        assert detached_sessions(store) == detached_sessions(src)
        again = copy_store(src, store)
        assert again.copied == [] and len(again.present) == len(again.skipped) == 3


def test_a_destination_that_differs_is_a_conflict_and_left_alone(
    store: Store, tmp_path: Path
) -> None:
    """A session the destination holds otherwise than the source (a line that differs, lines
    or a segment the source has not, another session under the id) is reported as a conflict
    and not written to; the others are copied."""
    with _source(tmp_path / "src") as src:
        copy_store(src, store)
        main = src.get_head(ContextId.parse("cli:main"))
        assert main is not None
        save_user_input(src, main.ref, "said in the source")
        save_user_input(store, main.ref, "said in the destination")  # differs at that seq
        python = src.get_head(ContextId.parse("irc:#python"))
        assert python is not None
        fork_at(store, python.ref, 0)  # a segment the source has not
        states.delete_context(store, ContextId.parse("cli:copy-of-python"))
        create_segment(store, context="cli:copy-of-python")  # another session under the id
        before = {c: _lines(store, c) for c in ("cli:main", "irc:#python", "cli:copy-of-python")}
        create_segment(src, context="cli:new")
        report = copy_store(src, store)
        assert report.copied == ["cli:new"]
        conflicts = dict(report.conflicts)
        assert sorted(conflicts) == ["cli:copy-of-python", "cli:main", "irc:#python"]
        assert "line 1 differs" in conflicts["cli:main"]
        assert "segment" in conflicts["irc:#python"]
        assert "another session" in conflicts["cli:copy-of-python"]
        assert all("\n" not in reason for reason in conflicts.values())
        assert {c: _lines(store, c) for c in before} == before  # nothing overwritten
        with pytest.raises(SessionConflict):
            complete_session(store, read_source(src, "cli:main"))


def test_a_destination_ahead_of_the_source_is_a_conflict(store: Store, tmp_path: Path) -> None:
    """Lines the destination has past the source's end are not "already there": the copy
    there has moved on, and the copy says so instead of calling them equal."""
    with _source(tmp_path / "src") as src:
        copy_store(src, store, ["cli:main"])
        head = store.get_head(ContextId.parse("cli:main"))
        assert head is not None
        save_user_input(store, head.ref, "only here")
        with pytest.raises(SessionConflict, match="1 more line in the destination than the source"):
            complete_session(store, read_source(src, "cli:main"))
        copy_store(src, store, ["irc:#python"])
        with pytest.raises(ContextExists, match="same lines"):
            complete_session(store, read_source(src, "irc:#python"))
