"""FsStore's own behaviour: the layout on disk, name encoding, the index, heads and durability.

What every backend does is in ``tests/contract/``; this file checks what only the filesystem
store promises (see the module docstring of ``terrarium.stores.fs``).
"""

from __future__ import annotations

import datetime as dt
import errno
import json
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from terrarium import (
    ConflictError,
    ContextExists,
    ContextId,
    CorruptLog,
    FsStore,
    InvalidContextId,
    PodActiveSegmentRef,
    SegmentNotFound,
    TraceEntry,
    append_entry,
    clear_segment,
    codec,
    contexts,
    create_segment,
    create_segment_with_ids,
    fork,
    new_segment_id,
    new_session_id,
    restore,
    save_trace,
    save_user_input,
    states,
)
from terrarium.stores import fs as fs_module
from terrarium.stores.base import NewEntry
from terrarium.stores.fs._heads import read_head

TS = "2024-02-29T23:59:59.999999Z"


def _create(store: FsStore, context: str, ts: str = TS) -> PodActiveSegmentRef:
    head = create_segment_with_ids(
        store, new_session_id(), new_segment_id(), context=context, ts=ts
    )
    return head.ref


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _trash(root: Path) -> list[str]:
    """What is left in .trash (which need not exist)."""
    trash = root / ".trash"
    return sorted(os.listdir(trash)) if trash.exists() else []


def _entries(store: FsStore, ref: PodActiveSegmentRef) -> list[dict[str, Any]]:
    return store.read_segment(ref.session_id, ref.segment_id).entries


# --------------------------------------------------------------------------- layout


def test_layout_is_type_date_name_segment_and_head(store: FsStore, root: Path) -> None:
    """A context lives in {type}/{YYYY-MM-DD}/{name}/ with {segment}.jsonl and head.json."""
    ref = _create(store, "cli:main")
    save_user_input(store, ref, "hello")
    folder = root / "cli" / "2024-02-29" / "main"
    segment = folder / f"{ref.segment_id}.jsonl"
    assert store.folder_of(ContextId("cli", "main")) == folder
    assert sorted(p.name for p in folder.iterdir()) == sorted([segment.name, "head.json"])

    lines = [codec.decode(line) for line in segment.read_bytes().splitlines()]
    assert [(line["seq"], line["kind"]) for line in lines] == [(0, "header"), (1, "user_input")]
    assert lines[0]["session_id"] == str(ref.session_id)
    assert lines[1]["item"] == {"role": "user", "content": "hello"}

    head = codec.decode((folder / "head.json").read_bytes())
    assert head["context"] == "cli:main"
    assert head["session_id"] == str(ref.session_id)
    assert head["segment_id"] == str(ref.segment_id)
    assert head["created_at"] == TS


def test_a_multi_entry_append_marks_all_but_its_last_line(store: FsStore, root: Path) -> None:
    """The lines of one append but the last end in ' \\n': plain JSON, and a visible frame."""
    ref = _create(store, "cli:main")
    first = store.append(
        ref.session_id,
        ref.segment_id,
        [NewEntry("item", TS, {"item": {"role": "user", "content": f"m{n}"}}) for n in range(3)],
    )
    assert first == 1
    save_user_input(store, ref, "alone")
    raw = (root / "cli" / "2024-02-29" / "main" / f"{ref.segment_id}.jsonl").read_bytes()
    lines = raw.split(b"\n")[:-1]
    assert [line.endswith(b" ") for line in lines] == [False, True, True, False, False]
    assert [json.loads(line)["seq"] for line in lines] == [0, 1, 2, 3, 4]
    assert [e["item"]["content"] for e in _entries(store, ref)] == ["m0", "m1", "m2", "alone"]


def test_new_segments_of_a_session_share_its_folder(store: FsStore, root: Path) -> None:
    """Forks and clears are new files beside the root segment; the head file names the head."""
    ref = _create(store, "cli:main")
    forked = fork(store, ref)
    cleared = clear_segment(store, ref, context="cli:main")
    folder = root / "cli" / "2024-02-29" / "main"
    names = {p.name for p in folder.iterdir()}
    assert names == {f"{s}.jsonl" for s in (ref.segment_id, forked, cleared)} | {"head.json"}
    assert store.list_segments(ref.session_id) == sorted([ref.segment_id, forked, cleared])
    assert codec.decode((folder / "head.json").read_bytes())["segment_id"] == str(cleared)


def test_folder_date_is_the_utc_creation_date(store: FsStore, root: Path) -> None:
    """Without a chosen timestamp, the folder is named by today's date in UTC."""
    before = dt.datetime.now(dt.UTC).date().isoformat()
    session_id, _ = create_segment(store, context="cli:today")
    after = dt.datetime.now(dt.UTC).date().isoformat()
    head = store.get_head(ContextId("cli", "today"))
    assert head is not None and head.session_id == session_id
    assert head.created_at.endswith("Z")
    assert head.date in {before, after}
    assert store.folder_of(ContextId("cli", "today")) == root / "cli" / head.date / "today"


# --------------------------------------------------------------------------- names

UNSAFE_NAMES = [
    "a:b",
    "back\\slash",
    "what?",
    "star*",
    'say "hi"',
    "<tag>|pipe",
    ".hidden",
    "...",
    "..x",
    "x..",
    "trailing.",
    " leading space",
    "CON",
    "con.txt",
    "nul",
    "LPT1",
    "100%",
    "%2F",
    "日本語 ✓",
]


def test_a_safe_name_stays_readable(store: FsStore, root: Path) -> None:
    """irc:#python is stored in a folder named #python."""
    _create(store, "irc:#python")
    assert (root / "irc" / "2024-02-29" / "#python" / "head.json").is_file()


@pytest.mark.parametrize("name", UNSAFE_NAMES)
def test_unsafe_names_are_escaped_and_stay_inside_the_root(
    store: FsStore, root: Path, name: str
) -> None:
    """A name with characters unsafe on some OS gets a safe folder that round-trips."""
    context = ContextId("irc", name)
    ref = _create(store, str(context))
    save_user_input(store, ref, "hi")
    folder = store.folder_of(context)
    assert folder is not None
    encoded = folder.name
    assert folder.parent.parent.parent == root
    assert not set(encoded) & set('<>:"/\\|?*')
    assert not encoded.startswith((".", " ")) and not encoded.endswith((".", " "))
    assert encoded.split(".")[0].upper() not in {"CON", "PRN", "AUX", "NUL", "LPT1", "COM1"}
    if name in ("日本語 ✓",):
        assert encoded == name  # safe, so readable
    resolved_root = root.resolve()
    for path in _files(root):
        assert path.resolve().is_relative_to(resolved_root), path
    [head] = store.list_contexts("irc")
    assert head.context == str(context)
    assert restore(store, context).history == [{"role": "user", "content": "hi"}]


def test_names_differing_only_in_escaped_characters_get_separate_folders(
    store: FsStore,
) -> None:
    """The encoding is one to one: 'a:b', 'a%3Ab' and 'a?b' are three contexts."""
    names = ["a:b", "a%3Ab", "a?b", "a%3Fb", "CON", "%43ON"]
    for name in names:
        _create(store, f"irc:{name}")
    folders = {store.folder_of(ContextId("irc", name)) for name in names}
    assert len(folders) == len(names)
    assert [h.context for h in store.list_contexts()] == sorted(f"irc:{n}" for n in names)


@pytest.mark.parametrize("name", ["..", ".", "a/b", "../../etc", "nul\x00byte", "tab\tname", ""])
def test_names_that_could_escape_the_root_are_refused(
    store: FsStore, root: Path, name: str
) -> None:
    """'..', '/', NUL and control characters never reach the filesystem."""
    with pytest.raises(InvalidContextId):
        create_segment(store, context=f"irc:{name}")
    assert _files(root) == []


# --------------------------------------------------------------------------- the index


def test_resolving_a_context_reads_the_index_not_the_date_folders(
    store: FsStore, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """get_head, restore and append never list a directory: the index names the folder."""
    for day in range(1, 29):
        _create(store, f"cli:ctx{day}", ts=f"2025-02-{day:02d}T10:00:00.000000Z")
    ref = _create(store, "cli:main", ts="2025-03-01T10:00:00.000000Z")
    assert len(list((root / "cli").iterdir())) == 29

    def no_listing(*args: object, **kwargs: object) -> Any:
        raise AssertionError("a directory was listed")

    monkeypatch.setattr(os, "listdir", no_listing)
    monkeypatch.setattr(os, "scandir", no_listing)
    monkeypatch.setattr(os, "walk", no_listing)
    monkeypatch.setattr(Path, "iterdir", no_listing)
    monkeypatch.setattr(Path, "glob", no_listing)
    monkeypatch.setattr(Path, "rglob", no_listing)
    with FsStore(root) as fresh:  # nothing cached
        head = fresh.get_head(ContextId("cli", "main"))
        assert head is not None and head.ref == ref
        save_user_input(fresh, ref, "hello")
        assert restore(fresh, "cli:main").history == [{"role": "user", "content": "hello"}]
        assert fresh.next_seq(ref.session_id, ref.segment_id) == 2


def test_without_the_index_every_context_is_found_from_its_folder(
    store: FsStore, root: Path
) -> None:
    """Deleting .index hides nothing: lookups and listings read the folders and re-index."""
    refs = {
        f"cli:c{n}": _create(store, f"cli:c{n}", ts=f"2025-01-{n + 1:02d}T00:00:00.000000Z")
        for n in range(5)
    }
    refs["irc:#python"] = _create(store, "irc:#python")
    refs["irc:a:b?"] = _create(store, "irc:a:b?")
    for context, ref in refs.items():
        save_user_input(store, ref, context)
    before = store.list_contexts()

    shutil.rmtree(root / ".index")
    with FsStore(root) as fresh:
        assert fresh.get_head(ContextId("cli", "c0")) == before[0]
        assert fresh.list_contexts() == before

        assert fresh.reindex() == len(refs)
        assert fresh.list_contexts() == before
        for context, ref in refs.items():
            state = restore(fresh, context)
            assert (state.session_id, state.segment_id) == (ref.session_id, ref.segment_id)
            assert state.history == [{"role": "user", "content": context}]
    leftovers = [p.name for p in (root / ".index").iterdir()]
    assert sorted(leftovers) == ["contexts", "sessions"]


def test_a_create_after_the_index_was_deleted_indexes_every_context(
    store: FsStore, root: Path
) -> None:
    """A create that finds ``.index`` deleted rebuilds it from the folders before it writes
    its own entry: else the index would hold that entry alone, and the listing and the
    session lookups that trust it would miss every other context."""
    refs = {name: _create(store, name) for name in ("cli:a", "cli:b", "irc:c")}
    shutil.rmtree(root / ".index")
    with FsStore(root) as fresh:
        _create(fresh, "cli:new")
        names = [head.context for head in fresh.list_contexts()]
        assert names == ["cli:a", "cli:b", "cli:new", "irc:c"]
        assert sorted(r.context for r in contexts.list_contexts(fresh).rows) == names
        taken = refs["cli:a"].session_id  # in use: the index says so
        with pytest.raises(ConflictError):
            create_segment_with_ids(fresh, taken, new_segment_id(), context="cli:d")


@pytest.mark.parametrize("second", ["context", "detached session"])
def test_a_lost_session_index_is_rebuilt_before_a_session_id_is_called_free(
    store: FsStore, root: Path, second: str
) -> None:
    """Only ``.index/sessions`` deleted by hand (``.index/contexts`` kept): a create on a
    session id a context holds is still refused, as a context or detached, and lookups by
    session id find its folder; the entries are rebuilt from the folders."""
    refs = {name: _create(store, name) for name in ("cli:a", "irc:b")}
    shutil.rmtree(root / ".index" / "sessions")
    taken = refs["cli:a"].session_id
    header = {
        "v": 1,
        "ts": TS,
        "kind": "header",
        "session_id": str(taken),
        "segment_id": str(new_segment_id()),
        "context": "cli:c" if second == "context" else None,
        "origin": {"kind": "root"},
        "history": [],
    }
    with FsStore(root) as fresh:
        with pytest.raises(ConflictError):
            if second == "context":
                fresh.create_context(ContextId("cli", "c"), header)
            else:
                fresh.create_session(header)
        assert not (root / ".detached").exists() or not any((root / ".detached").iterdir())
        assert [head.context for head in fresh.list_contexts()] == ["cli:a", "irc:b"]
        assert fresh.session_owner(refs["irc:b"].session_id) == "irc:b"
        assert restore(fresh, "cli:a").history == restore(store, "cli:a").history
    assert sorted(p.name for p in (root / ".index" / "sessions").iterdir()) == sorted(
        str(ref.session_id) for ref in refs.values()
    )


def test_reindex_drops_entries_whose_folder_is_gone(store: FsStore, root: Path) -> None:
    """The index is derived: a stale entry (its folder removed by hand) goes away on reindex."""
    _create(store, "cli:keep")
    _create(store, "cli:gone")
    folder = store.folder_of(ContextId("cli", "gone"))
    assert folder is not None
    shutil.rmtree(folder)
    assert store.reindex() == 1
    assert [h.context for h in store.list_contexts()] == ["cli:keep"]
    assert not (root / ".index" / "contexts" / "cli" / "gone").exists()


def test_a_create_during_a_reindex_stays_in_the_index(root: Path) -> None:
    """A context created by another process while ``reindex`` walks the folders waits for it
    to swap in the new index, so its entry lands there and ``list`` shows it (before, it went
    into the old index, which the swap threw away; the lifecycle race caught it)."""
    store, other = FsStore(root), FsStore(root)
    _create(store, "cli:old")
    walked, go, reached = threading.Event(), threading.Event(), threading.Event()
    walk, quiet = store.walk, other._quiet

    def slow_walk() -> Any:
        found = list(walk())
        walked.set()
        assert go.wait(30)
        return found

    def waiting_quiet(**kwargs: Any) -> Any:
        reached.set()  # about to wait for the reindex
        return quiet(**kwargs)

    store.walk = slow_walk  # type: ignore[method-assign]
    other._quiet = waiting_quiet  # type: ignore[method-assign]

    def create() -> None:
        _create(other, "cli:new")
        reached.set()

    reindex = threading.Thread(target=store.reindex)
    reindex.start()
    assert walked.wait(30)
    creator = threading.Thread(target=create)
    creator.start()
    assert reached.wait(30)
    go.set()
    reindex.join(30)
    creator.join(30)
    assert [h.context for h in FsStore(root).list_contexts()] == ["cli:new", "cli:old"]


def test_a_readers_rebuild_of_a_lost_index_keeps_one_rebuilt_meanwhile(root: Path) -> None:
    """A lookup that found no index rebuilds it from a walk; when another process has
    rebuilt it meanwhile (a ``reindex`` whose swap the lookup fell into) and a create has
    written its entry there since, the lookup keeps that index rather than swap in its own,
    older walk (before, the create's entry was lost and a create writing it failed with
    ENOENT; the lifecycle race caught it)."""
    store, other = FsStore(root), FsStore(root)
    _create(store, "cli:old")
    walk = store.walk

    def walk_then_create() -> Any:
        found = list(walk())
        _create(other, "cli:new")  # another process, after the walk
        return found

    store.walk = walk_then_create  # type: ignore[method-assign]
    store._rebuild_index(write_heads=False)
    assert [h.context for h in FsStore(root).list_contexts()] == ["cli:new", "cli:old"]


def test_an_index_entry_written_during_the_swap_does_not_fail_a_reindex(
    store: FsStore, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader's best-effort index entry (a context found by a walk) may land between the
    swap's removal of an old index part and the rename of the new one: the swap removes it
    again (before, the rename failed with ENOTEMPTY; the lifecycle race caught it)."""
    ref = _create(store, "cli:a")
    folder = store.folder_of(ContextId("cli", "a"))
    assert folder is not None
    discard, raced = FsStore._discard, []

    def racing_discard(self: FsStore, old: Path) -> None:
        discard(self, old)
        if old.name == "sessions" and not raced:  # another process indexes what it found
            raced.append(old)
            rel = folder.relative_to(root)
            racer = FsStore(root)
            monkeypatch.setattr(racer, "_index_lost", lambda: False)  # it looked before
            racer._write_index(ContextId("cli", "a"), ref.session_id, rel)

    monkeypatch.setattr(FsStore, "_discard", racing_discard)
    assert store.reindex() == 1
    assert [h.context for h in store.list_contexts()] == ["cli:a"]
    assert not [p for p in (root / ".index").iterdir() if p.name.startswith("new-")]


def test_a_create_clears_what_a_killed_create_left_in_its_folder(root: Path) -> None:
    """A create killed before its segment was linked in leaves its folder holding a temporary
    file and no context; creating the context again removes that file (before, it stayed, and
    fsck then called it a killed move's)."""
    folder = root / "cli" / TS[:10] / "main"
    folder.mkdir(parents=True)
    (folder / ".tmp-0123456789abcdef").write_bytes(b'{"kind": "header"}\n')
    with FsStore(root) as store:
        create_segment_with_ids(
            store, new_session_id(), new_segment_id(), context="cli:main", ts=TS
        )
        assert not [p.name for p in folder.iterdir() if p.name.startswith(".tmp-")]
        assert store.unfinished_moves() == []


def test_creating_over_a_lost_index_entry_keeps_the_existing_history(
    store: FsStore, root: Path
) -> None:
    """With the index lost, creating the same context again must not trash its folder."""
    ref = _create(store, "cli:main", ts=fs_module.utc_now())
    save_user_input(store, ref, "precious")
    shutil.rmtree(root / ".index")
    with pytest.raises(ContextExists):
        create_segment(store, context="cli:main")
    state = restore(store, "cli:main")
    assert state.history == [{"role": "user", "content": "precious"}]
    assert _trash(root) == []


def test_a_folder_left_by_a_crash_before_the_head_is_adopted_not_trashed(
    store: FsStore, root: Path
) -> None:
    """A folder whose head.json is missing keeps its entries: a create rebuilds the head."""
    ref = _create(store, "cli:main", ts=fs_module.utc_now())
    save_user_input(store, ref, "precious")
    folder = store.folder_of(ContextId("cli", "main"))
    assert folder is not None
    (folder / "head.json").unlink()
    with pytest.raises(ContextExists):
        create_segment(store, context="cli:main")
    assert read_head(folder / "head.json").segment_id == ref.segment_id
    assert restore(store, "cli:main").history == [{"role": "user", "content": "precious"}]
    assert _trash(root) == []


def test_a_create_never_removes_a_folder_with_a_damaged_segment(store: FsStore, root: Path) -> None:
    """A folder whose only segment has no usable header is damaged: kept, and create refuses."""
    folder = root / "cli" / "2024-02-29" / "main"
    folder.mkdir(parents=True)
    segment = folder / f"{new_segment_id()}.jsonl"
    segment.write_bytes(b'{"v":1,"seq":0,"kind":"header"}\n{"v":1,"seq":1,"kind":"x"}\n')
    with pytest.raises(ContextExists, match="damaged"):
        _create(store, "cli:main")
    assert sorted(p.name for p in folder.iterdir()) == [segment.name]
    assert _trash(root) == []


def test_a_corrupt_index_entry_is_bypassed_and_rewritten(
    store: FsStore, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An unreadable index file is derived state: the folder is found and the entry rebuilt."""
    ref = _create(store, "cli:main")
    pointer = root / ".index" / "contexts" / "cli" / "main"
    pointer.write_bytes(b'{"path": "cli/20')
    with FsStore(root) as fresh:
        head = fresh.get_head(ContextId("cli", "main"))
    assert head is not None and head.segment_id == ref.segment_id
    assert str(pointer) in caplog.text
    assert codec.decode(pointer.read_bytes())["path"] == "cli/2024-02-29/main"


def test_a_corrupt_head_file_is_rebuilt_in_memory_by_a_read(
    store: FsStore, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An unreadable head.json is reported (naming it) and rebuilt; the read changes no file."""
    ref = _create(store, "cli:main")
    save_user_input(store, ref, "kept")
    head = root / "cli" / "2024-02-29" / "main" / "head.json"
    for garbage in (b"", b'{"context": "cli:main"', b'{"context": "cli:main"}', b"[]"):
        head.write_bytes(garbage)
        caplog.clear()
        state = restore(store, "cli:main")
        assert state.history == [{"role": "user", "content": "kept"}]
        assert str(head) in caplog.text
        assert head.read_bytes() == garbage


def test_a_corrupt_head_with_no_intact_segment_is_reported_as_corrupt(
    store: FsStore, root: Path
) -> None:
    """When nothing can rebuild it, the error names head.json and is one line."""
    ref = _create(store, "cli:main")
    folder = root / "cli" / "2024-02-29" / "main"
    (folder / "head.json").write_bytes(b"[]")
    (folder / f"{ref.segment_id}.jsonl").write_bytes(b'{"torn header')
    with pytest.raises(CorruptLog) as caught:
        restore(store, "cli:main")
    assert str(folder / "head.json") in str(caught.value)
    assert "\n" not in str(caught.value)


# --------------------------------------------------------------------------- heads


@pytest.mark.parametrize("moves", [250, pytest.param(1000, marks=pytest.mark.slow)])
def test_head_replacement_is_atomic_under_concurrent_readers(
    store: FsStore, root: Path, moves: int
) -> None:
    """Readers of head.json see the old or the new head, whole, while it moves ``moves``
    times (250; 1000 in the slow run)."""
    ref = _create(store, "cli:main")
    other = fork(store, ref)
    context = ContextId("cli", "main")
    folder = root / "cli" / "2024-02-29" / "main"
    valid = {str(ref.segment_id), str(other)}
    moving = threading.Event()
    done = threading.Event()
    seen: list[set[str]] = []
    errors: list[BaseException] = []

    def read_raw() -> None:
        segments: set[str] = set()
        try:
            moving.wait()
            while not done.is_set():
                raw = codec.decode((folder / "head.json").read_bytes())
                segments.add(raw["segment_id"])
                head = store.get_head(context)
                assert head is not None
                segments.add(str(head.segment_id))
        except BaseException as exc:
            errors.append(exc)
        seen.append(segments)

    readers = [threading.Thread(target=read_raw) for _ in range(2)]
    for reader in readers:
        reader.start()
    current, nxt = ref.segment_id, other
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)  # hand the GIL over often: readers and mover interleave finely
    try:
        moving.set()
        for _ in range(moves):
            store.set_head(context, nxt, expected=current)
            current, nxt = nxt, current
    finally:
        done.set()
        for reader in readers:
            reader.join()
        sys.setswitchinterval(switch_interval)
    assert errors == []
    assert all(segments <= valid for segments in seen)
    assert set().union(*seen) == valid  # the readers did see the head move
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [f"{ref.segment_id}.jsonl", f"{other}.jsonl", "head.json"]
    )
    head = store.get_head(context)
    assert head is not None and head.segment_id == current


# --------------------------------------------------------------------------- durability


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], threading.Event]:
    """Record the descriptors passed to os.fdatasync; the event is set on each call."""
    calls: list[int] = []
    called = threading.Event()
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        real(fd)
        calls.append(fd)
        called.set()

    monkeypatch.setattr(fs_module.os, "fdatasync", fdatasync)
    return calls, called


def _segment_inode(store: FsStore, ref: PodActiveSegmentRef) -> int:
    folder = store.folder_of(ContextId("cli", "main"))
    assert folder is not None
    return (folder / f"{ref.segment_id}.jsonl").stat().st_ino


@pytest.mark.parametrize("durability", ["flush", "fsync", "batch"])
def test_every_durability_persists_acknowledged_entries(root: Path, durability: Any) -> None:
    """Whatever the durability, a fresh store reads back every acknowledged entry."""
    with FsStore(root, durability=durability) as store:
        ref = _create(store, "cli:main")
        for n in range(20):
            append_entry(store, ref, "item", {"item": {"role": "assistant", "content": f"m{n}"}})
    with FsStore(root) as fresh:
        history = restore(fresh, "cli:main").history
    assert [item["content"] for item in history] == [f"m{n}" for n in range(20)]


def test_fsync_durability_syncs_every_append(
    root: Path, synced: tuple[list[int], threading.Event]
) -> None:
    """durability='fsync' calls fdatasync on the segment before each append returns."""
    calls, _ = synced
    with FsStore(root, durability="fsync") as store:
        ref = _create(store, "cli:main")
        inode = _segment_inode(store, ref)
        for n in range(5):
            before = len(calls)
            save_user_input(store, ref, f"u{n}")
            assert len(calls) == before + 1
            assert os.fstat(calls[-1]).st_ino == inode


def test_flush_durability_never_syncs_appends(
    root: Path, synced: tuple[list[int], threading.Event]
) -> None:
    """durability='flush' hands appends to the kernel only."""
    calls, _ = synced
    with FsStore(root, durability="flush") as store:
        ref = _create(store, "cli:main")
        for n in range(5):
            save_user_input(store, ref, f"u{n}")
    assert calls == []


def test_batch_durability_syncs_within_the_interval(
    root: Path, synced: tuple[list[int], threading.Event]
) -> None:
    """durability='batch' syncs dirty segments from its background thread."""
    calls, called = synced
    with FsStore(root, durability="batch", batch_interval=0.01) as store:
        ref = _create(store, "cli:main")
        inode = _segment_inode(store, ref)
        save_user_input(store, ref, "hello")
        assert called.wait(timeout=30), "the background sync never ran"
        assert os.fstat(calls[0]).st_ino == inode
        handle = store._open[ref.segment_id]
        assert not handle.dirty


def test_batch_durability_syncs_pending_appends_on_close(
    root: Path, synced: tuple[list[int], threading.Event]
) -> None:
    """close() syncs what batch mode has not synced yet, before closing the descriptors."""
    calls, _ = synced
    store = FsStore(root, durability="batch", batch_interval=3600)
    try:
        ref = _create(store, "cli:main")
        save_user_input(store, ref, "hello")
        assert calls == []  # the first background sync is an hour away
        fd = store._open[ref.segment_id].fd
    finally:
        store.close()
    assert calls == [fd]
    with pytest.raises(OSError) as closed:
        os.fstat(fd)
    assert closed.value.errno == errno.EBADF
    with FsStore(root) as fresh:
        assert restore(fresh, "cli:main").history == [{"role": "user", "content": "hello"}]


def test_fsync_durability_syncs_the_folder_of_a_new_segment(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork's file name is made durable too (fsync of its folder), not only its bytes."""
    with FsStore(root, durability="fsync") as store:
        ref = _create(store, "cli:main")
        folder = store.folder_of(ContextId("cli", "main"))
        assert folder is not None
        synced: list[int] = []
        real = os.fsync

        def fsync(fd: int) -> None:
            real(fd)
            synced.append(os.fstat(fd).st_ino)

        monkeypatch.setattr(fs_module.os, "fsync", fsync)
        forked = fork(store, ref)
        assert (folder / f"{forked}.jsonl").stat().st_ino in synced
        assert folder.stat().st_ino in synced


def test_unknown_durability_is_a_value_error(root: Path) -> None:
    """A misspelt durability fails at once and names the valid ones."""
    with pytest.raises(ValueError, match="fsync"):
        FsStore(root, durability="sometimes")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- delete


def test_delete_context_moves_the_folder_to_the_trash_and_frees_the_name(
    store: FsStore, root: Path
) -> None:
    """After delete_context the context's folder and index entries are gone, its name is
    free, and its session waits detached and frozen (each file compressed) in
    ``.detached/{session}/``, its record in ``.states/``, until purged."""
    ref = _create(store, "cli:main")
    save_user_input(store, ref, "bye")
    fork(store, ref)
    store.append_trace(ref.session_id, ref.segment_id, [TraceEntry(TS, "chunk", {"n": 1})])
    _create(store, "cli:other")
    folder = store.folder_of(ContextId("cli", "main"))
    assert folder is not None
    files = sorted(p.name for p in folder.iterdir() if p.name != "head.json")

    assert states.delete_context(store, ContextId("cli", "main")) is True
    assert not folder.exists()
    assert not (root / ".index" / "contexts" / "cli" / "main").exists()
    assert not (root / ".index" / "sessions" / str(ref.session_id)).exists()
    (entry,) = states.trashed_contexts(store)
    kept = root / ".detached" / str(ref.session_id)
    assert sorted(p.name for p in kept.iterdir() if p.name != "head.json") == [
        f"{name}.zst" for name in files
    ]
    record = json.loads((root / ".states" / f"{ref.session_id}.json").read_text())
    assert record["trashed"]["trash_id"] == entry.trash_id and "cold" in record
    assert store.get_head(ContextId("cli", "main")) is None
    assert [h.context for h in store.list_contexts()] == ["cli:other"]
    with pytest.raises(SegmentNotFound):
        save_user_input(store, ref, "to the trash?")
    assert states.delete_context(store, ContextId("cli", "main")) is False

    again = _create(store, "cli:main")
    assert restore(store, "cli:main").session_id == again.session_id
    assert states.purge_trashed(store, entry.trash_id) is True
    assert not kept.exists() and not (root / ".states" / f"{ref.session_id}.json").exists()
    assert os.listdir(root / ".staging") == []


def test_a_writer_in_another_store_cannot_append_to_a_deleted_context(root: Path) -> None:
    """A descriptor cached before the delete notices the file is gone (no silent write)."""
    with FsStore(root) as deleter, FsStore(root) as writer:
        ref = _create(deleter, "cli:main")
        save_user_input(writer, ref, "cached")  # the writer now holds the file open
        assert states.delete_context(deleter, ContextId("cli", "main"))
        with pytest.raises(SegmentNotFound):
            save_user_input(writer, ref, "lost?")


# --------------------------------------------------------------------------- traces


def test_trace_files_sit_beside_the_segment_and_do_not_affect_restore(
    store: FsStore, root: Path
) -> None:
    """{segment}.trace.jsonl is written next to the segment and ignored by restore."""
    ref = _create(store, "cli:main")
    save_user_input(store, ref, "hi")
    before = restore(store, "cli:main")
    events = [TraceEntry(TS, "chunk", {"delta": f"d{n}", "s": "\n{}"}) for n in range(3)]
    save_trace(store, ref, events)
    save_trace(store, ref, events[:1])

    folder = root / "cli" / "2024-02-29" / "main"
    trace = folder / f"{ref.segment_id}.trace.jsonl"
    assert trace.is_file()
    assert len(trace.read_bytes().splitlines()) == 4
    assert store.read_trace(ref.session_id, ref.segment_id) == [
        e.to_dict() for e in [*events, events[0]]
    ]
    after = restore(store, "cli:main")
    assert after == before
    assert store.list_segments(ref.session_id) == [ref.segment_id]
    save_trace(store, ref, [])  # nothing to trace: no file for a fork that has none
    other = PodActiveSegmentRef(ref.session_id, fork(store, ref))
    save_trace(store, other, [])
    assert not (folder / f"{other.segment_id}.trace.jsonl").exists()

    with trace.open("ab") as out:
        out.write(b'{"ts": "torn')  # a trace is best effort: a torn line is skipped
    assert len(store.read_trace(ref.session_id, ref.segment_id)) == 4
    assert restore(store, "cli:main") == before


def test_a_create_killed_before_its_segment_leaves_the_session_id_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create killed after its index entry, before its segment (the commit), leaves an entry
    naming an empty folder: the same session id may be created again (a resumed copy does)."""
    store = FsStore(tmp_path / "s")
    session_id, segment_id = new_session_id(), new_segment_id()
    header = {
        "v": 1,
        "ts": TS,
        "kind": "header",
        "session_id": str(session_id),
        "segment_id": str(segment_id),
        "context": "cli:main",
        "origin": {"kind": "root"},
        "history": [],
    }

    def killed(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt  # stands for the kill: nothing after it runs

    with monkeypatch.context() as patched:
        patched.setattr(FsStore, "_write_new", killed)
        with pytest.raises(KeyboardInterrupt):
            store.create_context(ContextId("cli", "main"), header)
    assert (tmp_path / "s" / ".index" / "sessions" / str(session_id)).exists()
    head = FsStore(tmp_path / "s").create_context(ContextId("cli", "main"), header)
    assert (head.session_id, head.segment_id) == (session_id, segment_id)
    assert restore(store, "cli:main").history == []


@pytest.mark.parametrize("second", ["context", "detached session"])
def test_two_creates_on_one_session_id_at_once_make_one_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, second: str
) -> None:
    """Two stores (two processes) creating on one session id at once, each past its check
    before the other writes: the second waits for the first and is refused, so the session
    has one folder. Only a copied or hand-made header carries an existing session id."""
    first, other = FsStore(tmp_path / "s"), FsStore(tmp_path / "s")
    session_id = new_session_id()

    def header(context: str | None) -> dict[str, Any]:
        return {
            "v": 1,
            "ts": TS,
            "kind": "header",
            "session_id": str(session_id),
            "segment_id": str(new_segment_id()),
            "context": context,
            "origin": {"kind": "root"},
            "history": [],
        }

    checked, second_done = threading.Event(), threading.Event()
    in_use = first._session_in_use

    def paused(sid: Any) -> bool:
        found = in_use(sid)
        checked.set()
        second_done.wait(1.0)  # the second create's whole run fits here, unless it waits
        return found

    monkeypatch.setattr(first, "_session_in_use", paused)
    outcomes: dict[str, str] = {}

    def run(name: str, create: Any) -> None:
        try:
            create()
            outcomes[name] = "created"
        except ConflictError:
            outcomes[name] = "refused"
        finally:
            if name == "second":
                second_done.set()

    one = threading.Thread(
        target=run,
        args=("first", lambda: first.create_context(ContextId("cli", "a"), header("cli:a"))),
    )
    one.start()
    assert checked.wait(10)
    if second == "context":
        make = lambda: other.create_context(ContextId("cli", "b"), header("cli:b"))  # noqa: E731
    else:
        make = lambda: other.create_session(header(None))  # noqa: E731
    run("second", make)
    one.join(10)
    assert outcomes == {"first": "created", "second": "refused"}
    assert [entry.context for entry in first.walk()] == [ContextId("cli", "a")]
    assert not (tmp_path / "s" / ".detached" / str(session_id)).exists()
    assert first.get_head(ContextId("cli", "b")) is None


def test_a_folder_where_a_log_file_should_be_is_refused_without_leaking_its_descriptor(
    tmp_path: Path,
) -> None:
    """The no-follow chunk reader (blob scans, fsck) raises for a folder and closes what it
    opened: a store scanned often must not run out of descriptors."""
    from terrarium.stores._files import read_chunks

    folder = tmp_path / "0190a8a4-0000-7000-8000-000000000000.jsonl"
    folder.mkdir()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        with pytest.raises(IsADirectoryError):
            list(read_chunks(folder))
    assert len(os.listdir("/proc/self/fd")) == before
