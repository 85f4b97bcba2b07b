"""Contract: a whole store goes into a bundle (``export --all -f jsonl``) and comes back whole
(``import``), on every backend: every segment of every tree (forks, rewound branches,
compactions, clears), heads, archived contexts (archived), pins, traces, large outputs and
detached sessions; the trash stays behind. The bundle is exported from each backend and
imported into a fresh store of the same backend.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import pytest

from contract.conftest import BACKENDS
from terrarium import (
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
    restore_by_segment,
    rewind,
    save_config_changed,
    save_delta,
    save_trace,
    save_usage,
    save_user_input,
    states,
)
from terrarium.blobs import inline_line
from terrarium.bundle import import_bundle
from terrarium.export import export_many
from terrarium.model import ContextId
from terrarium.sessions import detached_sessions
from terrarium.stores.base import Lifecycle, Store

BIG = "x" * (200 * 1024)  # over any store's blob threshold: kept as a blob where it has them


def populate(store: Store) -> None:
    """A store holding every kind of thing a bundle must carry, and a trashed context."""
    session_id, root_id = create_segment(
        store, SegmentStartState(system_prompt="sys", config={"t": 1}), context="irc:#python"
    )
    main = PodActiveSegmentRef(session_id, root_id)
    save_user_input(store, main, "hi")
    save_delta(store, main, [Item.assistant("hello"), {"role": "tool", "content": BIG, "z": 1}])
    save_usage(store, main, UsageRecord("m", 3, 4, 1))
    append_entry(store, main, "from_the_future", {"payload": [1, 2]})
    append_system_item(store, main, SystemItem("resumed", {"after": "3h"}))
    save_trace(store, main, [TraceEntry("2026-01-01T00:00:00.000000Z", "chunk", {"d": "h"})])
    branch = PodActiveSegmentRef(session_id, fork_at(store, main, 2))
    save_user_input(store, branch, "on a branch")
    compacted = create_compacted_segment(store, main, [Item.user("summary")], context="irc:#python")
    now = PodActiveSegmentRef(session_id, compacted)
    save_config_changed(store, now, {"t": 2}, system_prompt="new")
    clear_segment(store, now, context="irc:#python")
    chat_id, chat_root = create_segment(store, context="cli:main")
    save_delta(store, PodActiveSegmentRef(chat_id, chat_root), [Item.user("a"), Item.user("b")])
    rewind(store, "cli:main", 1)  # the head moves to a fork; "b" stays on the old branch
    fork_context(store, "irc:#python", "cli:copy-of-python")
    old_id, old_root = create_segment(store, context="cli:old")
    save_user_input(store, PodActiveSegmentRef(old_id, old_root), "long ago")
    create_segment(store, context="cli:gone")
    loose_id, loose_root = create_segment(store, SegmentStartState(system_prompt="detached"))
    loose = PodActiveSegmentRef(loose_id, loose_root)
    save_user_input(store, loose, "nobody's")
    save_user_input(store, PodActiveSegmentRef(loose_id, fork_at(store, loose, 0)), "fork")
    assert isinstance(store, Lifecycle)
    states.pin_context(store, ContextId.parse("cli:main"))
    states.pin_context(store, ContextId.parse("cli:old"))
    states.archive_context(store, ContextId.parse("cli:old"))
    states.delete_context(store, ContextId.parse("cli:gone"))


def snapshot(store: Store) -> dict[str, Any]:
    """Everything a lossless round trip keeps, in a form two stores can be compared by."""
    assert isinstance(store, Lifecycle)
    heads = [*store.list_contexts(), *(store.get_head(ContextId.parse(a.context))
                                       for a in states.archived_contexts(store))]  # fmt: skip
    sessions = {h.session_id: h.context for h in heads if h is not None}
    sessions.update((s, None) for s in detached_sessions(store))
    trees = {}
    for session_id, context in sessions.items():
        segments = {}
        for segment in store.list_segments(session_id):
            read = store.read_segment(session_id, segment)
            lines = [inline_line(line, store) for line in (read.header, *read.entries)]
            state = restore_by_segment(store, session_id, segment)
            segments[segment] = (lines, read.next_seq, state, store.read_trace(session_id, segment))
        trees[session_id] = (context, segments)
    return {
        "heads": sorted((h.context, h.ref, h.created_at) for h in heads if h is not None),
        "hot": [h.context for h in store.list_contexts()],
        "archived": [a.context for a in states.archived_contexts(store)],
        "pinned": states.pinned_contexts(store),
        "detached": detached_sessions(store),
        "trees": trees,
    }


@pytest.mark.parametrize("dest", ["backup.tar.gz", "backup.zip", "backup/"])
def test_a_bundle_brings_back_the_whole_store(
    store: Store, backend: str, tmp_path: Path, request: pytest.FixtureRequest, dest: str
) -> None:
    populate(store)
    written = export_many(store, None, "jsonl", f"{tmp_path}/{dest}")
    assert "cli/gone.jsonl" not in written.members  # the trash stays behind
    fresh = BACKENDS[backend](tmp_path / "fresh", request)
    try:
        report = import_bundle(fresh, written.path)
        assert report.skipped == []
        assert len(report.copied) == 4 + 1  # four contexts, one detached session
        expected = snapshot(store)
        assert expected["archived"] == ["cli:old"] and len(expected["detached"]) == 1
        assert expected["pinned"] == {"cli:main", "cli:old"}
        assert snapshot(fresh) == expected
        again = import_bundle(fresh, written.path)  # a rerun: everything is there already
        assert again.copied == [] and again.entries == 0
        loose = [f"session {s}" for s in expected["detached"]]
        assert sorted(again.present) == sorted([*expected["hot"], "cli:old", *loose])
        assert snapshot(fresh) == expected
    finally:
        fresh.close()


def test_a_bundles_context_file_alone_imports_at_its_head(
    store: Store, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Each context's file is a jsonl export: the rewound context lands on its head."""
    from terrarium.formats.jsonl import import_context

    populate(store)
    export_many(store, None, "jsonl", tmp_path / "b.tgz")
    with tarfile.open(tmp_path / "b.tgz") as archive:
        member = archive.extractfile("cli/main.jsonl")
        assert member is not None
        data = member.read()
    fresh = BACKENDS[backend](tmp_path / "fresh", request)
    try:
        head = import_context(fresh, data)
        assert head.ref == store.get_head(ContextId.parse("cli:main")).ref  # type: ignore[union-attr]
    finally:
        fresh.close()


def test_what_a_rerun_adds_without_lines_is_reported_written(
    store: Store, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A bundle whose detached session gained only a trace, or whose context only its
    archive, since the store imported it: the import writes that and reports the session
    imported (it was reported "already in the store", as if nothing had been written)."""
    loose_id, loose_root = create_segment(store, SegmentStartState(system_prompt="detached"))
    loose = PodActiveSegmentRef(loose_id, loose_root)
    save_user_input(store, loose, "nobody's")
    old_id, old_root = create_segment(store, context="cli:old")
    save_user_input(store, PodActiveSegmentRef(old_id, old_root), "long ago")
    before = export_many(store, None, "jsonl", tmp_path / "before.tgz").path
    save_trace(store, loose, [TraceEntry("2026-01-01T00:00:00.000000Z", "chunk", {"d": "h"})])
    assert isinstance(store, Lifecycle)
    states.archive_context(store, ContextId.parse("cli:old"))
    after = export_many(store, None, "jsonl", tmp_path / "after.tgz").path
    fresh = BACKENDS[backend](tmp_path / "fresh", request)
    try:
        assert len(import_bundle(fresh, before).copied) == 2
        report = import_bundle(fresh, after)
        assert sorted(report.copied) == ["cli:old", f"session {loose_id}"]
        assert report.skipped == [] and report.present == [] and report.entries == 0
        assert fresh.read_trace(loose_id, loose_root) == store.read_trace(loose_id, loose_root)
        assert isinstance(fresh, Lifecycle) and states.is_archived(fresh, ContextId("cli", "old"))
    finally:
        fresh.close()
