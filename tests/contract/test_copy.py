"""Copying sessions into any backend is lossless (terrarium.copy)."""

from __future__ import annotations

from pathlib import Path

from terrarium import (
    FsStore,
    Item,
    PodActiveSegmentRef,
    SegmentStartState,
    SystemItem,
    TraceEntry,
    UsageRecord,
    append_entry,
    append_system_item,
    clear_segment,
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
)
from terrarium.copy import copy_store
from terrarium.model import ContextId
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
        src.pin_context(ContextId.parse("cli:main"))
        src.archive_context(ContextId.parse("irc:#python"))
        src.delete_context(ContextId.parse("cli:copy-of-python"))
        history = restore(src, "irc:#python").history
        report = copy_store(src, store)
        assert sorted(report.copied) == ["cli:main", "irc:#python"]
        assert [a.context for a in store.archived_contexts()] == ["irc:#python"]
        assert [h.context for h in store.list_contexts()] == ["cli:main"]
        assert store.pinned_contexts() == frozenset({"cli:main"})
        assert store.trashed_contexts() == []
        assert restore(store, "irc:#python").history == history
