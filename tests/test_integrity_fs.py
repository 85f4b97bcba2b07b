"""Integrity of FsStore at its edges (issue 10): lost heads and indexes, reads that must not
write, damaged segments and their salvage, paths that lead out of the root, private modes.

Each test reproduces one way a conversation was lost, hidden or rewritten before, through the
API or the command line a user would use.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from fakeserver import FakeServer
from helpers.gateway import SRC
from helpers.procs import Child
from terrarium import (
    ContextExists,
    FsStore,
    PodActiveSegmentRef,
    SegmentStartState,
    StoreError,
    create_segment,
    fork_at,
    restore,
    save_user_input,
    states,
)
from terrarium.blobs import collect_garbage
from terrarium.cli import cli
from terrarium.errors import CorruptLog
from terrarium.index._query import SearchQuery
from terrarium.model import ContextId
from terrarium.search import search
from terrarium.stores import fs as fs_module
from terrarium.stores.fs._heads import read_head
from terrarium.web import data as web_data


def invoke(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def make(store: FsStore, context: str, *texts: str, ts: str | None = None) -> PodActiveSegmentRef:
    """Create ``context`` (created at ``ts``) holding one user message per text."""
    session_id, segment_id = create_segment(store, SegmentStartState(), context=context)
    if ts is not None:  # move it to an earlier date folder, as if created then
        store.close()
        folder = store.folder_of(ContextId.parse(context))
        assert folder is not None
        head = json.loads((folder / "head.json").read_text())
        head["created_at"] = ts
        (folder / "head.json").write_text(json.dumps(head))
        target = folder.parent.parent / ts[:10] / folder.name
        target.parent.mkdir(parents=True, exist_ok=True)
        folder.rename(target)
        folder.parent.rmdir()
        store.reindex()
    ref = PodActiveSegmentRef(session_id, segment_id)
    for text in texts:
        save_user_input(store, ref, text)
    return ref


def history(root: Path, context: str) -> list[str]:
    with FsStore(root) as store:
        return [item["content"] for item in restore(store, context).history]


def folder_of(root: Path, context: str) -> Path:
    with FsStore(root) as store:
        folder = store.folder_of(ContextId.parse(context))
    assert folder is not None
    return folder


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file of the tree but the derived index and the lock files, with its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and p.relative_to(root).parts[0] not in (".index", ".locks")
    }


# --------------------------------------------------------------------------- 1: lost heads


def test_a_chat_on_a_context_without_head_json_keeps_its_entries(
    root: Path, fake_server: FakeServer
) -> None:
    """The issue's repro: head.json removed, then `terrarium chat` that context the same day."""
    base = ["--base-url", fake_server.base_url, "--storage-dir", str(root)]
    assert invoke("chat", "cli:x", *base, input="first\n").exit_code == 0
    folder = folder_of(root, "cli:x")
    (folder / "head.json").unlink()
    result = invoke("chat", "cli:x", *base, input="second\n")
    assert result.exit_code == 0, result.output
    assert history(root, "cli:x") == ["first", "echo: first", "second", "echo: second"]
    assert [m["content"] for m in fake_server.last_request["messages"]] == [
        "first",
        "echo: first",
        "second",
    ]
    assert not (root / ".trash").exists() or not any((root / ".trash").iterdir())


def test_the_head_is_rebuilt_at_the_newest_segment_whose_chain_is_intact(store: FsStore) -> None:
    """Forks replay their parent: a fork whose parent header is unreadable is passed over."""
    ref = make(store, "cli:main", "one", "two")
    fork_id = fork_at(store, ref, 1)
    store.set_head(ContextId("cli", "main"), fork_id, expected=ref.segment_id)
    save_user_input(store, PodActiveSegmentRef(ref.session_id, fork_id), "three")
    later = fork_at(store, PodActiveSegmentRef(ref.session_id, fork_id), 1)
    folder = folder_of(store.root, "cli:main")
    assert fs_module.head_from_segments(folder).segment_id == later

    (folder / "head.json").unlink()
    (folder / f"{fork_id}.jsonl").write_bytes(b"garbage\n")  # breaks `later`'s chain
    head = fs_module.head_from_segments(folder)
    assert head.segment_id == ref.segment_id
    assert head.session_id == ref.session_id and head.context == "cli:main"
    assert store.get_head(ContextId("cli", "main")) == head
    assert not (folder / "head.json").exists()  # a read rebuilds it in memory only


def test_fsck_repair_and_reindex_write_a_lost_head(root: Path, store: FsStore) -> None:
    ref = make(store, "cli:main", "kept")
    make(store, "cli:other", "also kept")
    main, other = folder_of(root, "cli:main"), folder_of(root, "cli:other")
    (main / "head.json").unlink()
    (other / "head.json").write_bytes(b"{not json")

    result = invoke("fsck", "--json", "--storage-dir", str(root))
    kinds = sorted(p["kind"] for p in json.loads(result.stdout)["problems"])
    assert result.exit_code == 1 and kinds == ["head", "head"]
    assert not (main / "head.json").exists()  # fsck alone changes nothing

    result = invoke("fsck", "--repair", "--storage-dir", str(root))
    assert result.exit_code == 0, result.output
    assert read_head(main / "head.json").segment_id == ref.segment_id
    assert (other / "head.json.unreadable-1").read_bytes() == b"{not json"
    assert invoke("fsck", "--storage-dir", str(root)).exit_code == 0

    (main / "head.json").unlink()
    with FsStore(root) as fresh:
        assert fresh.reindex() == 2
    assert read_head(main / "head.json").segment_id == ref.segment_id


@pytest.mark.parametrize("durability", ["fsync", "batch"])
def test_head_writes_are_synced_where_the_mode_promises_a_power_cut(
    root: Path, durability: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsync and batch fsync head.json and its folder; flush does not promise it."""
    with FsStore(root, durability=durability) as store:  # type: ignore[arg-type]
        ref = make(store, "cli:main", "hi")
        folder = folder_of(root, "cli:main")
        synced: list[str] = []
        real_fsync = os.fsync

        def fsync(fd: int) -> None:
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", fsync)
        fork_id = fork_at(store, ref, 1)
        store.set_head(ContextId("cli", "main"), fork_id, expected=ref.segment_id)
    assert str(folder) in synced  # the rename of head.json
    assert any(Path(p).parent == folder and ".tmp-" in p for p in synced)  # its bytes


# --------------------------------------------------------------------------- 2: reads never write


def test_show_on_a_torn_header_changes_nothing_and_says_it_is_damaged(
    root: Path, store: FsStore
) -> None:
    ref = make(store, "cli:main", "hello")
    folder = folder_of(root, "cli:main")
    segment = folder / f"{ref.segment_id}.jsonl"
    segment.write_bytes(segment.read_bytes().split(b"\n")[0][:40])  # the header, cut short
    before = snapshot(root)

    result = invoke("show", "cli:main", "--storage-dir", str(root))
    assert result.exit_code == 1
    assert "damaged segment" in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert snapshot(root) == before

    result = invoke("fsck", "--json", "--storage-dir", str(root))
    [problem] = json.loads(result.stdout)["problems"]
    assert (problem["kind"], problem["line"]) == ("corrupt", 1)
    assert "header line is incomplete" in problem["message"]
    assert snapshot(root) == before


def test_an_append_refuses_a_torn_header_and_moves_nothing(store: FsStore) -> None:
    ref = make(store, "cli:main")
    path = folder_of(store.root, "cli:main") / f"{ref.segment_id}.jsonl"
    path.write_bytes(b'{"v":1,"seq":0,"kind":"hea')
    with FsStore(store.root) as other, pytest.raises(CorruptLog, match="damaged segment"):
        save_user_input(other, ref, "x")
    assert path.read_bytes() == b'{"v":1,"seq":0,"kind":"hea'
    assert list(path.parent.glob("*.torn-*")) == []


def test_reads_of_a_torn_tail_never_write(root: Path, store: FsStore) -> None:
    """restore, show, list, search, export and fsck leave a torn tail where it is."""
    ref = make(store, "cli:main", "one", "two")
    path = folder_of(root, "cli:main") / f"{ref.segment_id}.jsonl"
    with path.open("ab") as out:
        out.write(b'{"v":1,"seq":3,"kind":"user_in')
    before = snapshot(root)
    assert history(root, "cli:main") == ["one", "two"]
    for args in (
        ["show", "cli:main"],
        ["list"],
        ["search", "two"],
        ["export", "cli:main"],
        ["stats", "cli:main"],
        ["fsck"],
    ):
        invoke(*args, "--storage-dir", str(root))
        assert snapshot(root) == before, args


def test_the_next_seq_and_the_live_view_of_a_torn_tail_never_write(
    root: Path, store: FsStore
) -> None:
    """``next_seq`` (what the dashboard's live view and the gateway's GETs read) answers past
    a torn tail and leaves it where it is; the next append still sets it aside."""
    from terrarium.web import data

    ref = make(store, "cli:main", "one", "two")
    path = folder_of(root, "cli:main") / f"{ref.segment_id}.jsonl"
    with path.open("ab") as out:
        out.write(b'{"v":1,"seq":3,"kind":"user_in')
    before = snapshot(root)
    with FsStore(root) as reader:
        assert reader.next_seq(ref.session_id, ref.segment_id) == 3
        assert data.signature(reader, ContextId("cli", "main")) == f"{ref.segment_id}:3"
        assert snapshot(root) == before
        save_user_input(reader, ref, "three")
    assert history(root, "cli:main") == ["one", "two", "three"]
    assert len(list(path.parent.glob("*.torn-*"))) == 1


# --------------------------------------------------------------------------- 3: lost index


def test_a_lost_index_never_splits_a_context(root: Path, store: FsStore) -> None:
    """The issue's repro: .index deleted, then the context (made on an earlier date) resumed."""
    make(store, "cli:main", "old history", ts="2026-01-02T03:04:05.000000Z")
    store.close()
    shutil.rmtree(root / ".index")
    with FsStore(root) as fresh:
        with pytest.raises(ContextExists):
            create_segment(fresh, SegmentStartState(), context="cli:main")
        head = fresh.get_head(ContextId("cli", "main"))
        assert head is not None
        save_user_input(fresh, head.ref, "new turn")
        assert fresh.reindex() == 1
    assert history(root, "cli:main") == ["old history", "new turn"]
    today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    assert not (root / "cli" / today).exists()
    assert [p.name for p in (root / "cli").iterdir()] == ["2026-01-02"]


def test_a_split_context_left_by_an_older_version_is_reported(root: Path, store: FsStore) -> None:
    """Two folders of one context: the index picks the newer activity, fsck names the other."""
    make(store, "cli:main", "original", ts="2026-01-02T03:04:05.000000Z")
    store.close()
    older = folder_of(root, "cli:main")
    shutil.copytree(older, root / "cli" / "2026-02-03" / "main")
    newer = root / "cli" / "2026-02-03" / "main"
    head = json.loads((newer / "head.json").read_text())
    head["updated_at"] = "2099-02-03T00:00:00.000000Z"
    (newer / "head.json").write_text(json.dumps(head))
    shutil.rmtree(root / ".index")
    with FsStore(root) as fresh:
        assert fresh.folder_of(ContextId("cli", "main")) == newer
    result = invoke("fsck", "--json", "--storage-dir", str(root))
    problems = json.loads(result.stdout)["problems"]
    assert [(p["kind"], p["path"]) for p in problems] == [("duplicate", str(older))]


# --------------------------------------------------------------------------- 4, 10: fsck


def _corrupt_line(path: Path, number: int, garbage: bytes = b'{"v": 1, oops') -> bytes:
    lines = path.read_bytes().split(b"\n")
    original = lines[number - 1]
    lines[number - 1] = garbage
    path.write_bytes(b"\n".join(lines))
    return original


def test_salvage_keeps_every_readable_entry_and_sets_the_bad_line_aside(
    root: Path, store: FsStore
) -> None:
    ref = make(store, "cli:main", "one", "two", "three", "four")
    path = folder_of(root, "cli:main") / f"{ref.segment_id}.jsonl"
    _corrupt_line(path, 3)
    damaged = path.read_bytes()
    with pytest.raises(CorruptLog):
        history(root, "cli:main")

    result = invoke("fsck", "--storage-dir", str(root))
    assert result.exit_code == 1
    assert "--salvage" in result.stderr  # the hint matches the problem
    result = invoke("fsck", "--repair", "--storage-dir", str(root))
    assert result.exit_code == 1 and "--salvage" in result.stderr

    result = invoke("fsck", "--repair", "--salvage", "--json", "--storage-dir", str(root))
    [problem] = json.loads(result.stdout)["problems"]
    assert problem["repaired"] is True and "kept 3 entries" in problem["message"]
    assert history(root, "cli:main") == ["one", "three", "four"]
    assert path.read_bytes() == damaged  # the damaged file stays as it was
    side = path.with_name(f"{path.name}.corrupt-1")
    assert side.read_bytes() == b'{"v": 1, oops\n'
    result = invoke("fsck", "--storage-dir", str(root))
    assert result.exit_code == 0, result.output
    assert "salvaged into" in result.stdout
    with FsStore(root) as again:  # the salvage appends like any segment
        head = again.get_head(ContextId("cli", "main"))
        assert head is not None and head.segment_id != ref.segment_id
        save_user_input(again, head.ref, "five")
    assert history(root, "cli:main") == ["one", "three", "four", "five"]


def test_a_salvage_waiting_for_a_turn_lets_the_turn_finish(root: Path, store: FsStore) -> None:
    """``fsck --repair --salvage`` salvages a context under its turn lock. A delete that holds
    that lock, and then waits for the moves' lock, is not kept waiting by fsck's hold on the
    moves' lock (a deadlock, both waiting for good): fsck salvages once it lets go."""
    ref = make(store, "cli:main", "one", "two", "three")
    _corrupt_line(folder_of(root, "cli:main") / f"{ref.segment_id}.jsonl", 2)
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "terrarium", "--storage-dir", str(root), "fsck"]
    with FsStore(root) as turn, turn.lock_context(ContextId("cli", "main")):
        fsck = subprocess.Popen([*command, "--repair", "--salvage"], env=env, text=True)
        for _ in range(2000):  # until fsck's salvage waits for the turn (the lock we hold)
            if _waits_for_a_lock(fsck.pid):
                break
            time.sleep(0.01)
        deleting = threading.Thread(
            target=states.delete_context, args=(turn, ContextId("cli", "main"))
        )
        deleting.start()
        deleting.join(20)
        stuck = deleting.is_alive()
    deleting.join()
    assert fsck.wait(60) in (0, 1)
    assert not stuck, "the delete waited for fsck, which waited for the delete's turn"
    assert [e.context for e in states.trashed_contexts(store)] == ["cli:main"]


def _waits_for_a_lock(pid: int) -> bool:
    """Whether process ``pid`` is blocked on a file lock (a ``->`` line of /proc/locks)."""
    with open("/proc/locks") as locks:
        return any(f[1:2] == ["->"] and f[5:6] == [str(pid)] for f in map(str.split, locks))


def test_salvage_copies_forks_of_the_damaged_segment_and_moves_the_head(
    root: Path, store: FsStore
) -> None:
    ref = make(store, "cli:main", "one", "two", "three")
    fork_id = fork_at(store, ref, 3)
    store.set_head(ContextId("cli", "main"), fork_id, expected=ref.segment_id)
    save_user_input(store, PodActiveSegmentRef(ref.session_id, fork_id), "on the fork")
    _corrupt_line(folder_of(root, "cli:main") / f"{ref.segment_id}.jsonl", 2)
    done = store.salvage_segment(ContextId("cli", "main"), ref.segment_id)
    assert done.set_aside == [2] and done.kept == 2
    assert list(done.copies) == [fork_id] and done.head == done.copies[fork_id]
    assert history(root, "cli:main") == ["two", "three", "on the fork"]


def test_salvage_of_a_damaged_header_or_an_empty_segment(root: Path, store: FsStore) -> None:
    """A root segment whose header is lost still gives back its entries, under a new root."""
    ref = make(store, "cli:main", "one", "two")
    path = folder_of(root, "cli:main") / f"{ref.segment_id}.jsonl"
    _corrupt_line(path, 1, b'{"v":1,"seq":0,"kind":"hea')
    make(store, "cli:empty")
    empty = folder_of(root, "cli:empty")
    for segment in empty.glob("*.jsonl"):
        segment.write_bytes(b"")

    report = json.loads(invoke("fsck", "--json", "--storage-dir", str(root)).stdout)
    kinds = sorted(p["kind"] for p in report["problems"])
    assert kinds == ["corrupt", "corrupt"]
    result = invoke("fsck", "--repair", "--salvage", "--storage-dir", str(root))
    assert result.exit_code == 0, result.output
    assert history(root, "cli:main") == ["one", "two"]
    assert history(root, "cli:empty") == []
    assert invoke("fsck", "--storage-dir", str(root)).exit_code == 0


def test_fsck_reports_every_problem_and_never_stops_at_the_first(
    root: Path, store: FsStore
) -> None:
    """An unparsable head and a 0-byte head segment are both reported, with the rest."""
    make(store, "cli:a", "a")
    ref_b = make(store, "cli:b", "b")
    make(store, "cli:c", "c")
    (folder_of(root, "cli:a") / "head.json").write_bytes(b"\x00\xff")
    (folder_of(root, "cli:b") / f"{ref_b.segment_id}.jsonl").write_bytes(b"")
    result = invoke("fsck", "--json", "--storage-dir", str(root))
    report = json.loads(result.stdout)
    assert result.exit_code == 1 and report["contexts"] == 3
    found = {(p["kind"], Path(p["path"]).name) for p in report["problems"]}
    assert ("head", "head.json") in found
    assert ("corrupt", f"{ref_b.segment_id}.jsonl") in found
    text = invoke("fsck", "--storage-dir", str(root))
    assert "Traceback" not in text.output
    assert str(folder_of(root, "cli:a") / "head.json") in text.stdout


# --------------------------------------------------------------------------- 7: the root


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[Path]:
    """A folder beside the store that nothing may touch."""
    path = tmp_path / "outside"
    (path / "victim").mkdir(parents=True)
    (path / "victim" / "file").write_text("precious")
    yield path
    assert (path / "victim" / "file").read_text() == "precious"


@pytest.mark.parametrize("linked", [".detached", ".states", ".staging"])
def test_delete_never_follows_a_linked_folder_out_of_the_root(
    root: Path, store: FsStore, outside: Path, linked: str
) -> None:
    """The folders a delete writes in (detached sessions, state records, what is being
    deleted for ever) are checked to be inside the root before anything moves."""
    make(store, "cli:main", "x")
    (root / linked).symlink_to(outside, target_is_directory=True)
    if linked == ".staging":
        assert states.delete_context(store, ContextId("cli", "main"))
        (entry,) = states.trashed_contexts(store)
        with pytest.raises(StoreError, match="outside the store"):
            states.purge_trashed(store, entry.trash_id)
        assert sorted(p.name for p in outside.iterdir()) == ["victim"]
        (record,) = states.unfinished_lifecycle(store)  # marked purging, its bytes untouched
        assert (root / ".detached" / str(record.session_id)).is_dir()
        (root / linked).unlink()
        assert states.finish_lifecycle(store) == 1 and store.session_records() == []
        return
    with pytest.raises(StoreError, match="outside the store"):
        states.delete_context(store, ContextId("cli", "main"))
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert history(root, "cli:main") == ["x"]


def test_an_index_entry_naming_another_folder_is_never_followed(
    root: Path, store: FsStore, outside: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make(store, "cli:main", "mine")
    store.close()
    rel = os.path.relpath(outside / "victim", root)
    for pointer in (
        root / ".index" / "contexts" / "cli" / "main",
        *(root / ".index" / "sessions").iterdir(),
    ):
        pointer.write_text(json.dumps({"path": rel, "context": "cli:main"}))
    with FsStore(root) as fresh:
        head = fresh.get_head(ContextId("cli", "main"))
        assert head is not None
        save_user_input(fresh, head.ref, "appended")
        assert states.delete_context(fresh, ContextId("cli", "main")) is True
    assert "not a folder of cli:main" in caplog.text
    assert sorted(p.name for p in (outside / "victim").iterdir()) == ["file"]


def test_a_linked_type_folder_or_segment_is_refused(
    root: Path, store: FsStore, outside: Path
) -> None:
    ref = make(store, "cli:main", "x")
    (root / "irc").symlink_to(outside, target_is_directory=True)
    with pytest.raises(StoreError, match="outside the store"):
        create_segment(store, SegmentStartState(), context="irc:#python")
    segment = folder_of(root, "cli:main") / f"{ref.segment_id}.jsonl"
    target = outside / "segment.jsonl"
    segment.rename(target)
    segment.symlink_to(target)
    with FsStore(root) as fresh:
        with pytest.raises(StoreError, match="symbolic link"):
            save_user_input(fresh, ref, "through the link")
        with pytest.raises(StoreError, match="symbolic link"):
            restore(fresh, "cli:main")
    assert b"through the link" not in target.read_bytes()
    assert sorted(p.name for p in outside.iterdir()) == ["segment.jsonl", "victim"]
    report = json.loads(invoke("fsck", "--json", "--storage-dir", str(root)).stdout)
    links = {p["path"] for p in report["problems"] if p["kind"] == "link"}
    assert links == {str(root / "irc"), str(segment)}


#: Every folder (and the one file) of an FsStore's own state besides the contexts' folders.
DERIVED = [
    ".index",
    ".index/dirty",
    ".index/contexts",
    ".index/sessions",
    ".index/archive",
    ".index/pins",
    ".index/search.db",
    ".locks",
    ".locks/turn",
    ".locks/head",
    ".staging",
    ".blobs",
    ".trash",
    ".detached",
]


def _tree_of(path: Path) -> dict[str, bytes | None]:
    """Every file (with its bytes) and folder under ``path``, links not followed."""
    found: dict[str, bytes | None] = {}
    for folder, dirs, files in os.walk(path):
        for name in dirs:
            found[os.path.relpath(os.path.join(folder, name), path)] = None
        for name in files:
            file = Path(folder, name)
            found[os.path.relpath(file, path)] = file.read_bytes()
    return found


def _every_kind_of_write(store: FsStore) -> list[str]:
    """Write, move, index and collect in every way a store does; the StoreErrors raised."""
    main = ContextId("cli", "main")

    def main_ref() -> PodActiveSegmentRef:
        head = store.get_head(main)
        assert head is not None
        return head.ref

    calls = [
        lambda: make(store, "cli:new", "fresh walrus"),
        lambda: save_user_input(store, main_ref(), "more walrus"),
        lambda: fork_at(store, main_ref(), 1),
        lambda: search(store, SearchQuery("walrus", archived=True)),
        lambda: states.archive_context(store, main),
        lambda: states.unarchive_context(store, main),
        lambda: states.unarchive_context(store, ContextId("cli", "old")),
        lambda: states.pin_context(store, main, False),
        lambda: store.put_blob(b"new blob " * 600),
        lambda: states.delete_context(store, ContextId("cli", "new")),
        lambda: [
            states.restore_trashed(store, entry.trash_id, as_context=ContextId("cli", f"back{n}"))
            for n, entry in enumerate(states.trashed_contexts(store))
        ],
        lambda: collect_garbage(store, min_age=0),
        store.reindex,
    ]
    refused = []
    for call in calls:
        try:
            call()
        except StoreError as exc:
            refused.append(str(exc))
    return refused


@pytest.mark.parametrize("derived", DERIVED)
def test_a_linked_folder_of_the_stores_own_state_is_never_written_through(
    root: Path, store: FsStore, tmp_path: Path, derived: str
) -> None:
    """A folder of the store's own state (or its search database) that is a link out of the
    root is refused, never written, moved or deleted through: whatever the store does, and
    ``fsck --repair``, the link's target stays exactly as it was."""
    make(store, "cli:main", "walrus one", "two")
    make(store, "irc:#x", "walrus three")
    make(store, "cli:old", "four")
    states.archive_context(store, ContextId("cli", "old"))
    states.pin_context(store, ContextId("cli", "main"))
    store.put_blob(b"old blob " * 600)
    search(store, SearchQuery("walrus"))
    states.delete_context(store, ContextId("irc", "#x"))
    make(store, "cli:marked", "a marker for the index")
    store.close()
    for folder in DERIVED:  # each there, as a store that ran a while has them
        if not (root / folder).exists():
            (root / folder).mkdir(mode=0o700, parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.move(root / derived, outside / "target")
    (root / derived).symlink_to(outside / "target")
    before = _tree_of(outside)
    with FsStore(root) as linked:
        refused = _every_kind_of_write(linked)
        # what the dashboard asks: an answer, or the store's refusal of its own state's link
        try:
            assert web_data.overview(linked)["totals"]["contexts"] >= 0
        except StoreError as exc:
            assert "leads outside the store" in str(exc)
    repair = invoke("fsck", "--repair", "--storage-dir", str(root))
    assert _tree_of(outside) == before
    assert all("\n" not in message for message in refused)
    assert repair.exit_code == 1 and "Traceback" not in repair.output
    assert str(root / derived) in repair.output


# --------------------------------------------------------------------------- 13: modes


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_every_file_is_private_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    root = tmp_path / "sessions"
    old = os.umask(umask)
    try:
        with FsStore(root, durability="fsync") as store:
            ref = make(store, "cli:main", "secret")
            store.append_trace(ref.session_id, ref.segment_id, [])
            fork_at(store, ref, 1)
            make(store, "irc:#python", "also secret")
            states.delete_context(store, ContextId("irc", "#python"))
            path = folder_of(root, "cli:main") / f"{ref.segment_id}.jsonl"
            with path.open("ab") as out:
                out.write(b"{torn")
            store.set_aside_torn_tail(ref.session_id, ref.segment_id)
            store.reindex()
    finally:
        os.umask(old)
    seen = [root, *root.rglob("*")]
    assert any(".torn-" in p.name for p in seen)
    for path in seen:
        mode = stat.S_IMODE(path.lstat().st_mode)
        expected = 0o700 if path.is_dir() else 0o600
        if ".trash" in path.parts and path.suffix == ".jsonl":
            expected = 0o400  # sealed by the delete: a writer that held it looks again
        assert mode == expected, f"{path} is {oct(mode)}"


# --------------------------------------------------------------------------- SIGKILL


def _damaged_store(root: Path) -> dict[str, list[str]]:
    """A store with a lost head, a corrupt line under a fork, a torn tail and no index."""
    with FsStore(root) as store:
        make(store, "cli:a", "a1", "a2")
        (folder_of(root, "cli:a") / "head.json").unlink()
        ref = make(store, "cli:b", "b1", "b2", "b3")
        fork_id = fork_at(store, ref, 3)
        store.set_head(ContextId("cli", "b"), fork_id, expected=ref.segment_id)
        save_user_input(store, PodActiveSegmentRef(ref.session_id, fork_id), "b4")
        _corrupt_line(folder_of(root, "cli:b") / f"{ref.segment_id}.jsonl", 3)
        ref_c = make(store, "cli:c", "c1")
        with (folder_of(root, "cli:c") / f"{ref_c.segment_id}.jsonl").open("ab") as out:
            out.write(b'{"v":1,"seq":2,"kind":"user_input","item":{"content":"c')
    shutil.rmtree(root / ".index")
    return {"cli:a": ["a1", "a2"], "cli:b": ["b1", "b3", "b4"], "cli:c": ["c1"]}


def _check_nothing_lost(root: Path, original: dict[str, bytes]) -> None:
    """Every segment file is still there, whole; a torn tail only moved to its side file."""
    for name, data in original.items():
        path = root / name
        if not name.endswith(".jsonl"):
            continue
        now = path.read_bytes()
        if now != data:
            complete, tail = fs_module.codec.split_complete(data)
            assert now == complete, f"{name} changed"
            sides = path.parent.glob(f"{path.name}.torn-{len(complete)}*")
            assert tail in [side.read_bytes() for side in sides]
    assert history(root, "cli:a") == ["a1", "a2"]
    assert history(root, "cli:c") == ["c1"]


def _kill_fsck(tmp_path: Path, every_point: bool) -> None:
    """SIGKILL before file changes of `fsck --repair --salvage` in turn, then rerun it: at
    every change, or at the first change of each kind (the call and the stack making it)."""
    pristine = tmp_path / "pristine"
    expected = _damaged_store(pristine)
    original = snapshot(pristine)
    with Child("repair_server") as server:

        def run(root: Path, kill: int) -> dict[str, Any]:
            assert server.proc.stdin is not None
            server.proc.stdin.write(json.dumps({"root": str(root), "kill": kill}) + "\n")
            server.proc.stdin.flush()
            return server.read()

        counted = tmp_path / "counted"
        shutil.copytree(pristine, counted)
        kinds = run(counted, 0)["kinds"]
        assert len(kinds) > 10
        points = range(1, len(kinds) + 1)
        if not every_point:  # the first change of each kind: about half of them
            points = sorted({kind: n for n, kind in reversed(list(enumerate(kinds, 1)))}.values())
        for point in points:
            root = tmp_path / f"kill-{point}"
            shutil.copytree(pristine, root)
            assert run(root, point)["killed"] is True, point
            _check_nothing_lost(root, original)
            try:  # damaged until the salvage moves the head, and then whole
                assert history(root, "cli:b") == expected["cli:b"], point
            except CorruptLog:
                pass
            assert run(root, 0)["killed"] is False
            _check_nothing_lost(root, original)
            for context, texts in expected.items():
                assert history(root, context) == texts, (point, context)
            result = invoke("fsck", "--storage-dir", str(root))
            assert result.exit_code == 0, (point, result.output)


def test_fsck_repair_and_salvage_killed_at_each_kind_of_step_lose_nothing(
    tmp_path: Path,
) -> None:
    """SIGKILL before the first file change of each kind (the call and the stack of
    functions making it) of `fsck --repair --salvage` in turn; then rerun it.

    Covers the head rebuild, the torn-tail move, the salvage and its fork copy, and the
    index rebuild: after each kill every byte is where it was or in its side file, the
    contexts that were readable still read the same, and the next run finishes the job.
    """
    _kill_fsck(tmp_path, every_point=False)


@pytest.mark.slow
def test_fsck_repair_and_salvage_killed_at_any_step_lose_nothing(tmp_path: Path) -> None:
    """The same, before every file change."""
    _kill_fsck(tmp_path, every_point=True)


def test_a_salvaged_context_reads_everywhere(root: Path, store: FsStore) -> None:
    """After ``fsck --repair --salvage`` says repaired, the context reads in every view: show
    (the damaged segment, left as it was, shows which segment holds its entries), the
    listing (no longer damaged), stats, and the dashboard's page and API."""
    from starlette.testclient import TestClient

    from terrarium.web import create_app

    ref = make(store, "cli:main", "one", "two", "three", "four")
    _corrupt_line(folder_of(root, "cli:main") / f"{ref.segment_id}.jsonl", 3)
    assert invoke("fsck", "--repair", "--salvage", "--storage-dir", str(root)).exit_code == 0
    result = invoke("show", "cli:main", "--storage-dir", str(root))
    assert result.exit_code == 0, result.output
    assert "three" in result.stdout and "two" not in result.stdout
    shown = json.loads(
        invoke("show", "cli:main", "--segments", "--json", "--storage-dir", str(root)).stdout
    )
    damaged = next(s for s in shown["segments"] if s["segment_id"] == str(ref.segment_id))
    new = next(s for s in shown["segments"] if s["head"])
    assert damaged["entries"] is None and damaged["salvaged_into"] == new["segment_id"]
    listed = json.loads(invoke("list", "--json", "--storage-dir", str(root)).stdout)
    assert [c["problem"] for c in listed["contexts"]] == [None]
    assert invoke("stats", "cli:main", "--storage-dir", str(root)).exit_code == 0
    with FsStore(root) as again:
        web = TestClient(create_app(again), base_url="http://127.0.0.1:8765")
        assert web.get("/session", params={"c": "cli:main"}).status_code == 200
        assert web.get("/api/context", params={"c": "cli:main"}).status_code == 200


def test_a_salvage_rerun_after_a_full_disk_sets_the_bad_lines_aside_once(
    root: Path, store: FsStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A salvage that failed on a full disk after setting the bad lines aside, run again,
    reuses that side file rather than writing the same lines a second time."""
    from terrarium.stores.fs import salvage

    ref = make(store, "cli:main", "one", "two", "three")
    path = folder_of(root, "cli:main") / f"{ref.segment_id}.jsonl"
    _corrupt_line(path, 2)

    def full(*args: object, **kwargs: object) -> object:
        raise StoreError("cannot write: the disk is full")

    with monkeypatch.context() as patch:
        patch.setattr("terrarium.stores.fs.salvage_copy", full)
        with pytest.raises(StoreError):
            store.salvage_segment(ContextId("cli", "main"), ref.segment_id)
    assert len(list(path.parent.glob(f"{path.name}.corrupt-*"))) == 1
    store.salvage_segment(ContextId("cli", "main"), ref.segment_id)
    assert [p.name for p in path.parent.glob(f"{path.name}.corrupt-*")] == [
        f"{path.name}.corrupt-1"
    ]
    assert salvage.salvaged_into(path.parent)


def test_a_context_folder_made_a_link_after_its_date_folder_was_checked_is_refused(
    root: Path, store: FsStore, outside: Path
) -> None:
    """A folder is checked part by part, each part once a process: a context folder that
    becomes a link out of the root under a date folder already checked is still refused."""
    make(store, "cli:main", "x")
    make(store, "cli:other", "y")
    with FsStore(root) as fresh:
        assert fresh.get_head(ContextId("cli", "main")) is not None  # its date folder checked
        folder = folder_of(root, "cli:other")
        shutil.move(folder, outside / "other")
        folder.symlink_to(outside / "other", target_is_directory=True)
        with pytest.raises(StoreError, match="outside the store"):
            fresh.get_head(ContextId("cli", "other"))


@pytest.mark.parametrize(
    "planted", [".locks/session", ".locks/head/cli/main", ".locks/turn/cli/main", ".locks/index"]
)
def test_a_lock_linked_out_of_the_root_is_never_created_or_locked_through(
    root: Path, tmp_path: Path, planted: str
) -> None:
    """A lock file, or a folder of them, that is a link out of the root is refused: no
    file is created or opened through it, whatever a write, a turn or a reindex takes."""
    with FsStore(root) as store:
        make(store, "cli:main", "one")
    outside = tmp_path / "outside"
    outside.mkdir()
    lock = root / planted
    if lock.is_dir():
        shutil.rmtree(lock)
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.unlink(missing_ok=True)
    lock.symlink_to(outside if planted == ".locks/session" else outside / "lock")
    with FsStore(root) as store:
        with contextlib.suppress(StoreError, OSError):
            with store.lock_context(ContextId("cli", "main")):
                make(store, "cli:other", "two")
        with contextlib.suppress(StoreError, OSError):
            store.reindex()
    assert list(outside.iterdir()) == []
