"""FsStore's lifecycle (archive, trash, pins) on disk: the layout (frozen in place, state
records, detached sessions), agreement with the MemoryStore oracle, writes that unarchive,
writers in other stores, leftovers of killed moves, the index, fsck.

The kill tests are in ``test_lifecycle_fs_kill.py``; the cross-backend contract in
``tests/contract/test_lifecycle.py``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import stat
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zstandard
from click.testing import CliRunner, Result

from terrarium import (
    ContextExists,
    FsStore,
    PodActiveSegmentRef,
    contexts,
    create_segment,
    fork,
    fork_at,
    lifecycle,
    restore,
    save_user_input,
    sessions,
    states,
)
from terrarium.cli import cli
from terrarium.errors import CorruptLog, InvalidContextId, NotInTrash, StoreError
from terrarium.index import listing as lister
from terrarium.index._listing import ListingQuery
from terrarium.index._query import SearchQuery
from terrarium.legacy import listing
from terrarium.model import ContextId, TraceEntry
from terrarium.search import search
from terrarium.stores import fs as fs_module
from terrarium.stores.base import Lifecycle, NewEntry, Store
from terrarium.stores.fs import _states
from terrarium.stores.memory import MemoryStore

TS = "2026-05-01T12:00:00.000000Z"
MAIN = ContextId("cli", "main")


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _create(store: Store, context: str, *texts: str) -> PodActiveSegmentRef:
    session_id, segment_id = create_segment(store, context=context)
    ref = PodActiveSegmentRef(session_id, segment_id)
    for text in texts:
        save_user_input(store, ref, text)
    return ref


def _tree(root: Path) -> list[str]:
    """Every path under ``root`` but the locks, the derived index and spare folders."""
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.relative_to(root).parts[0] not in (".locks", ".index") and "spare-" not in p.name
    )


def _leftovers(root: Path) -> list[str]:
    """What killed moves left, as fsck lists it."""
    with FsStore(root) as store:
        return [str(p) for p in store.unfinished_moves()]


def _history(store: Store, context: str) -> list[Any]:
    return restore(store, context).history


# --------------------------------------------------------------------------- layout


def test_archive_freezes_every_file_in_place(store: FsStore, root: Path) -> None:
    """The folder stays; each log file becomes ``{name}.zst``, one zstd frame decompressing to
    its bytes exactly, beside ``head.json``; the record in ``.states/`` says archived, pinned
    and cold; files 0600, folders 0700; the hot listing, fast listing and search leave it
    out; a search of the archive finds it."""
    ref = _create(store, "cli:main", "the quick brown fox " * 50)
    store.append_trace(ref.session_id, ref.segment_id, [TraceEntry(TS, "chunk", {"n": 1})])
    fork(store, ref)
    states.pin_context(store, MAIN)
    folder = store.folder_of(MAIN)
    assert folder is not None
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.name != "head.json"}
    history = _history(store, "cli:main")
    assert lister(store).search(SearchQuery("fox"))

    archived = states.archive_context(store, MAIN)

    assert archived is not None and archived.pinned and archived.message_count == 1
    assert archived.archived_bytes < archived.hot_bytes
    assert archived.hot_bytes == sum(len(data) for data in before.values())
    assert store.folder_of(MAIN) == folder
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted(["head.json", *(f"{n}.zst" for n in before)])
    for name, data in before.items():
        packed = (folder / f"{name}.zst").read_bytes()
        assert zstandard.ZstdDecompressor().decompress(packed) == data
    record = json.loads((root / ".states" / f"{ref.session_id}.json").read_text())
    assert set(record) == {"archived", "pinned", "cold"}
    for path in [*folder.iterdir(), *(root / ".states").iterdir()]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for path in [folder, root / ".states"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert store.list_contexts() == []
    assert lister(store).list_contexts_fast() == []
    assert lister(store).search(SearchQuery("fox")) == []
    assert [h.context for h in search(store, SearchQuery("fox", archived=True))] == ["cli:main"]
    assert _history(store, "cli:main") == history
    assert states.is_archived(store, MAIN)
    assert states.unarchive_context(store, MAIN)
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.name != "head.json"} == before
    assert not (root / ".states" / f"{ref.session_id}.json").read_text().count("cold")
    assert [h.context for h in lister(store).search(SearchQuery("fox"))] == ["cli:main"]
    assert _leftovers(root) == []


def test_listing_the_archive_decompresses_nothing(
    store: FsStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """archived_contexts reads the state records only."""
    _create(store, "cli:main", "hello")
    _create(store, "irc:#pond", "hello")
    states.archive_context(store, MAIN)
    states.archive_context(store, ContextId.parse("irc:#pond"))

    def refuse(blob: bytes, *, where: str = "") -> bytes:
        raise AssertionError(f"decompressed {where}")

    monkeypatch.setattr(_states, "unpack", refuse)
    assert [a.context for a in states.archived_contexts(store)] == ["cli:main", "irc:#pond"]
    assert [a.context for a in states.archived_contexts(store, "irc")] == ["irc:#pond"]
    assert store.get_head(MAIN) is not None


def test_the_type_archive_is_reserved(store: FsStore) -> None:
    """A context of type ``archive`` would live in the archive's folder: refused, clearly."""
    with pytest.raises(InvalidContextId, match="archive"):
        create_segment(store, context="archive:old")
    assert not (store.root / "archive").exists()


def test_nothing_follows_a_link_out_of_the_root(store: FsStore, tmp_path: Path) -> None:
    """A ``.states`` folder that is a link out of the root is refused, not written through."""
    _create(store, "cli:main", "hello")
    outside = tmp_path / "outside"
    outside.mkdir()
    (store.root / ".states").symlink_to(outside, target_is_directory=True)
    with pytest.raises(StoreError, match="outside"):
        states.archive_context(store, MAIN)
    assert list(outside.iterdir()) == []
    assert _history(store, "cli:main") == [{"role": "user", "content": "hello"}]


def test_a_freeze_takes_nothing_along_from_outside_the_root(store: FsStore, tmp_path: Path) -> None:
    """``freeze_session(along=...)`` refuses a file whose folder leads out of the root, before
    anything moves; a store that keeps no files refuses any."""
    ref = _create(store, "cli:main", "hello")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.json").write_text("{}")
    (store.root / "cli" / "link").symlink_to(outside, target_is_directory=True)
    state = store.session_state(ref.session_id)
    with pytest.raises(StoreError, match="outside"):
        store.freeze_session(
            ref.session_id, expected=state, state=state, along=[store.root / "cli/link/x.json"]
        )
    assert (outside / "x.json").read_text() == "{}"
    assert "cold" not in store.session_state(ref.session_id)
    assert _history(store, "cli:main") == [{"role": "user", "content": "hello"}]
    memory = MemoryStore()
    ref = _create(memory, "cli:main", "hello")
    with pytest.raises(StoreError, match="keeps no files"):
        memory.freeze_session(ref.session_id, expected={}, state={}, along=[Path("x.json")])


# --------------------------------------------------------------------------- the oracle


def _script(store: Store) -> list[Any]:
    """A run of lifecycle calls; what each returned, without times, ids and byte counts."""
    assert isinstance(store, Lifecycle)
    seen: list[Any] = []
    a = _create(store, "cli:a", "one", "two")
    _create(store, "cli:b", "three")
    _create(store, "irc:#c", "four")

    def trash_view() -> list[Any]:
        return states.trashed_contexts(store)

    def state() -> None:
        seen.append(
            (
                [h.context for h in store.list_contexts()],
                [(x.context, x.message_count, x.pinned) for x in states.archived_contexts(store)],
                [
                    (t.context, t.archived, t.pinned, t.message_count)
                    for t in states.trashed_contexts(store)
                ],
                sorted(states.pinned_contexts(store)),
            )
        )

    seen.append(states.pin_context(store, ContextId.parse("cli:a")))
    seen.append(states.archive_context(store, ContextId.parse("cli:a")) is not None)
    seen.append(states.archive_context(store, ContextId.parse("cli:a")))
    seen.append(states.archive_context(store, ContextId.parse("cli:zz")))
    state()
    with pytest.raises(ContextExists):
        create_segment(store, context="cli:a")
    save_user_input(store, a, "five")  # unarchives
    state()
    seen.append(states.archive_context(store, ContextId.parse("irc:#c")) is not None)
    seen.append(states.delete_context(store, ContextId.parse("irc:#c")))
    seen.append(states.delete_context(store, ContextId.parse("cli:b")))
    state()
    seen.append(store.get_head(ContextId.parse("irc:#c")))
    _create(store, "irc:#c", "new")
    trashed = {t.context: t.trash_id for t in states.trashed_contexts(store)}
    with pytest.raises(ContextExists):
        states.restore_trashed(store, trashed["irc:#c"])
    states.restore_trashed(store, trashed["irc:#c"], as_context=ContextId.parse("irc:#old"))
    seen.append(states.is_archived(store, ContextId.parse("irc:#old")))
    seen.append(_history(store, "irc:#old"))
    with pytest.raises(NotInTrash):
        states.restore_trashed(store, trashed["irc:#c"])
    seen.append(states.purge_trashed(store, trashed["cli:b"]))
    seen.append(states.purge_trashed(store, trashed["cli:b"]))
    seen.append(states.purge_context(store, ContextId.parse("irc:#old")))
    seen.append(states.purge_context(store, ContextId.parse("irc:#old")))
    seen.append(states.pin_context(store, ContextId.parse("cli:a"), False))
    seen.append(states.pin_context(store, ContextId.parse("cli:gone")))
    state()
    seen.append(_history(store, "cli:a"))
    return seen


def test_fs_agrees_with_the_memory_oracle(store: FsStore) -> None:
    """The same lifecycle run gives the same answers on FsStore as on MemoryStore."""
    assert _script(store) == _script(MemoryStore())


# --------------------------------------------------------------------------- writes wake it


@pytest.mark.parametrize("write", ["append", "create_segment", "set_head", "append_trace"])
def test_any_write_unarchives_the_context_first(store: FsStore, write: str) -> None:
    """append, create_segment, set_head and append_trace each move an archived context back
    to the hot tree with its full history, then write."""
    ref = _create(store, "cli:main", "before")
    new = fork(store, ref)
    head = store.get_head(MAIN)
    assert head is not None
    states.archive_context(store, MAIN)
    if write == "append":
        store.append(ref.session_id, head.segment_id, [NewEntry("note", TS, {"n": 1})])
    elif write == "create_segment":
        fork(store, ref)
    elif write == "set_head":
        store.set_head(MAIN, new, expected=head.segment_id)
    else:
        store.append_trace(ref.session_id, ref.segment_id, [TraceEntry(TS, "chunk", {})])
    assert not states.is_archived(store, MAIN)
    assert [h.context for h in store.list_contexts()] == ["cli:main"]
    assert _history(store, "cli:main") == [{"role": "user", "content": "before"}]
    assert states.archived_contexts(store) == []
    assert not (store.root / "archive" / "cli" / head.date / "main").exists()


def test_a_writer_in_another_store_follows_the_context_into_the_archive(root: Path) -> None:
    """A descriptor cached before an archive finds its file deleted, and its append unarchives
    the context: nothing is written into a file that left."""
    with FsStore(root) as archiver, FsStore(root) as writer:
        ref = _create(archiver, "cli:main", "first")
        save_user_input(writer, ref, "cached")  # the writer holds the file open
        assert states.archive_context(archiver, MAIN) is not None
        save_user_input(writer, ref, "after")
        assert not states.is_archived(archiver, MAIN)
        texts = [m["content"] for m in _history(archiver, "cli:main")]
        assert texts == ["first", "cached", "after"]


def test_next_seq_from_a_cached_descriptor_sees_another_stores_moves(root: Path) -> None:
    """``next_seq`` answers from the descriptor an append left open: after another store
    archives the context, appends in the thawed file and archives it again, it still gives
    the log's next seq, never the old file's."""
    with FsStore(root) as other, FsStore(root) as reader:
        ref = _create(other, "cli:main", "first")
        seg = (ref.session_id, ref.segment_id)
        save_user_input(reader, ref, "cached")  # the reader holds the file open
        assert reader.next_seq(*seg) == 3
        assert states.archive_context(other, MAIN) is not None
        assert reader.next_seq(*seg) == 3  # the frozen log
        save_user_input(other, ref, "thawed")  # wakes it: a new file
        assert reader.next_seq(*seg) == 4
        save_user_input(reader, ref, "again")
        assert other.next_seq(*seg) == reader.next_seq(*seg) == 5


class _Killed(BaseException):
    """Stands for a SIGKILL: nothing of the archiver runs after it (no clean-up of ours)."""


def test_a_freeze_killed_after_its_commit_keeps_appends_out_of_the_left_files(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The freezer dies after its commit (the record says cold) but before it deletes the
    plain files, as its locks go: a writer that held the file open must not append into
    that leftover, which the next move deletes; the seal sends it through a wake."""
    with FsStore(root) as archiver, FsStore(root) as writer:
        ref = _create(archiver, "cli:main", "first")
        save_user_input(writer, ref, "cached")  # the writer holds the file open
        real_unlink = _states.os.unlink

        def die_at_the_first_plain_delete(path: Any, *args: Any, **kwargs: Any) -> None:
            if str(path).endswith(".jsonl"):
                raise _Killed
            real_unlink(path, *args, **kwargs)

        monkeypatch.setattr(_states.os, "unlink", die_at_the_first_plain_delete)
        with pytest.raises(_Killed):
            states.archive_context(archiver, MAIN)
        monkeypatch.undo()
        assert states.is_archived(archiver, MAIN)  # committed
        assert archiver.unfinished_moves() != []
        save_user_input(writer, ref, "after")  # acknowledged: it woke the context
        assert archiver.unfinished_moves() == []
    with FsStore(root) as store:
        texts = [m["content"] for m in _history(store, "cli:main")]
        assert texts == ["first", "cached", "after"]
        assert not states.is_archived(store, MAIN)


def test_a_purge_killed_after_its_folder_went_is_no_damage_to_fsck(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trash purge killed after it moved the session's folder out, its ``purging`` record
    left: fsck reports the unfinished purge only (not the session as unreadable), and
    ``--repair`` completes it and exits 0 (a killed policy run found it)."""
    with FsStore(root) as store:
        _create(store, "cli:main", "bye")
        assert states.delete_context(store, MAIN)
        [entry] = states.trashed_contexts(store)
        real_rename = _states.os.rename

        def die_after_the_move(*args: Any) -> None:
            real_rename(*args)
            raise _Killed

        monkeypatch.setattr(_states.os, "rename", die_after_the_move)
        with pytest.raises(_Killed):
            states.purge_trashed(store, entry.trash_id)
        monkeypatch.undo()
    checked = json.loads(invoke("fsck", "--json", "--storage-dir", str(root)).output)
    assert sorted(p["kind"] for p in checked["problems"]) == ["leftover", "unfinished"]
    assert invoke("fsck", "--repair", "--storage-dir", str(root)).exit_code == 0
    assert invoke("fsck", "--storage-dir", str(root)).exit_code == 0
    with FsStore(root) as store:
        assert states.trashed_contexts(store) == []


def test_a_delete_killed_at_its_commit_is_in_the_trash_and_nowhere_else(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delete killed just after the rename that commits it, before its pending record took
    the record's place: the context is in the trash (a session with no record before, neither
    pinned nor archived, has only the pending one), not a detached session of no one's, and the
    next delete of that id finds nothing to delete."""
    with FsStore(root) as store:
        _create(store, "cli:main", "kept")

        real_replace = os.replace

        def die_at_the_record(source: Any, target: Any) -> None:
            if str(source).endswith(_states.PENDING):  # after the rename that commits it
                raise _Killed
            real_replace(source, target)

        monkeypatch.setattr(os, "replace", die_at_the_record)
        with pytest.raises(_Killed):
            states.delete_context(store, MAIN)
        monkeypatch.undo()
    with FsStore(root) as store:
        assert [e.context for e in states.trashed_contexts(store)] == ["cli:main"]
        assert sessions.detached_sessions(store) == []
        assert not states.delete_context(store, MAIN)
        [entry] = states.trashed_contexts(store)
        states.restore_trashed(store, entry.trash_id)
        assert [m["content"] for m in _history(store, "cli:main")] == ["kept"]


def test_a_seal_left_in_a_hot_folder_is_lifted_by_the_next_write(root: Path) -> None:
    """A freeze killed before its commit leaves the folder hot, its files sealed: the next
    append unseals them (under the session's lock) and writes."""
    with FsStore(root) as store:
        ref = _create(store, "cli:main", "first")
        folder = store.folder_of(MAIN)
        assert folder is not None
        with _states._segment_locks(folder):
            pass  # sealed, then "killed"
        segment = folder / f"{ref.segment_id}.jsonl"
        assert stat.S_IMODE(segment.stat().st_mode) == 0o400
    with FsStore(root) as store:
        save_user_input(store, ref, "second")
        assert stat.S_IMODE(segment.stat().st_mode) == 0o600
        assert [m["content"] for m in _history(store, "cli:main")] == ["first", "second"]


def test_appends_racing_an_archiver_lose_nothing(root: Path) -> None:
    """A thread appends while another archives the context over and over: every acknowledged
    entry is in the log, in order, once."""
    with FsStore(root) as store, FsStore(root) as other:
        ref = _create(store, "cli:main")
        done = threading.Event()
        errors: list[BaseException] = []

        def archive_loop() -> None:
            try:
                while not done.is_set():
                    states.archive_context(other, MAIN)
            except BaseException as exc:  # reported below
                errors.append(exc)

        thread = threading.Thread(target=archive_loop)
        thread.start()
        try:
            for n in range(150):
                store.append(ref.session_id, ref.segment_id, [NewEntry("note", TS, {"n": n})])
        finally:
            done.set()
            thread.join()
        assert errors == []
        entries = store.read_segment(ref.session_id, ref.segment_id).entries
        assert [e["n"] for e in entries] == list(range(150))


@pytest.mark.parametrize("move", ["freeze", "thaw"])
@pytest.mark.parametrize("read", ["segment_ids", "whole_lines"])
def test_a_read_sees_through_a_move_between_its_two_looks(
    root: Path, move: str, read: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``list_segments`` and ``read_trace`` read whether the session is frozen, then the files
    of that kind: a freeze or thaw in another store between the two looks (reads take no
    lock) is read through, never an empty listing or trace of a session that has them."""
    with FsStore(root) as store, FsStore(root) as other:
        ref = _create(store, "cli:main", "hello")
        store.append_trace(ref.session_id, ref.segment_id, [TraceEntry(TS, "chunk", {"n": 1})])
        if move == "thaw":
            states.archive_context(store, MAIN)
        real = getattr(fs_module, read)
        mover = states.archive_context if move == "freeze" else states.unarchive_context
        moves = [lambda: mover(other, MAIN)]

        def moved_meanwhile(*args: Any, **kwargs: Any) -> Any:
            if moves:
                moves.pop()()
            return real(*args, **kwargs)

        monkeypatch.setattr(fs_module, read, moved_meanwhile)
        assert store.list_segments(ref.session_id) == [ref.segment_id]
        assert [e["event"] for e in store.read_trace(ref.session_id, ref.segment_id)] == ["chunk"]


# --------------------------------------------------------------------------- trash, pins, index


def test_trash_restore_and_purge_on_disk(store: FsStore, root: Path) -> None:
    """A deleted archived context waits detached and frozen in .detached/{session}/ (its
    record says trashed), comes back archived under another name, and a purge leaves
    nothing of it."""
    ref = _create(store, "cli:main", "hello")
    states.pin_context(store, MAIN)
    states.archive_context(store, MAIN)
    assert states.delete_context(store, MAIN)
    (entry,) = states.trashed_contexts(store)
    assert entry.archived and entry.pinned and entry.message_count == 1
    folder = root / ".detached" / str(ref.session_id)
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["head.json", f"{ref.segment_id}.jsonl.zst"]
    )
    record = json.loads((root / ".states" / f"{ref.session_id}.json").read_text())
    assert record["trashed"]["context"] == "cli:main"
    assert store.get_head(MAIN) is None and states.pinned_contexts(store) == frozenset()
    other = ContextId("cli", "other")
    head = states.restore_trashed(store, entry.trash_id, as_context=other)
    assert head.context == "cli:other" and states.is_archived(store, other)
    assert states.pinned_contexts(store) == {"cli:other"}
    assert _history(store, "cli:other") == [{"role": "user", "content": "hello"}]
    assert states.purge_context(store, other)
    assert [p for p in _tree(root) if not p.startswith("cli")] == [
        ".detached",
        ".staging",
        ".states",
    ]
    assert [p for p in _tree(root) if p.count("/") >= 3] == []


def test_a_lost_index_finds_archived_sessions_and_pins_again(store: FsStore, root: Path) -> None:
    """With .index deleted, an archived session is read by its id, stays out of the hot
    listing, and pins are listed (the records are the truth), before and after a reindex."""
    ref = _create(store, "cli:main", "hello")
    _create(store, "cli:hot", "hi")
    states.pin_context(store, MAIN)
    states.pin_context(store, ContextId("cli", "hot"))
    states.archive_context(store, MAIN)
    shutil.rmtree(root / ".index")
    with FsStore(root) as fresh:
        assert fresh.read_segment(ref.session_id, ref.segment_id).entries[0]["item"] == {
            "role": "user",
            "content": "hello",
        }
        assert [h.context for h in fresh.list_contexts()] == ["cli:hot"]
        assert states.pinned_contexts(fresh) == {"cli:main", "cli:hot"}
        fresh.reindex()
        assert [h.context for h in fresh.list_contexts()] == ["cli:hot"]
        assert states.pinned_contexts(fresh) == {"cli:main", "cli:hot"}
        assert [a.context for a in states.archived_contexts(fresh)] == ["cli:main"]


def test_a_pin_is_a_key_of_the_session_record(store: FsStore, root: Path) -> None:
    """Pinning writes ``pinned`` into the session's record (nothing in its folder); it
    follows the session into the trash and back; unpinning leaves no record behind."""
    ref = _create(store, "cli:main", "hello")
    folder = store.folder_of(MAIN)
    assert folder is not None
    states.pin_context(store, MAIN)
    path = root / ".states" / f"{ref.session_id}.json"
    assert json.loads(path.read_text()) == {"pinned": True}
    assert "pinned" not in {p.name for p in folder.iterdir()}
    states.delete_context(store, MAIN)
    assert states.pinned_contexts(store) == frozenset()
    (entry,) = states.trashed_contexts(store)
    assert entry.pinned
    states.restore_trashed(store, entry.trash_id)
    assert states.pinned_contexts(store) == {"cli:main"}
    states.pin_context(store, MAIN, False)
    assert not path.exists() and states.pinned_contexts(store) == frozenset()


def _plant_zst_copies(folder: Path) -> list[Path]:
    """What a freeze killed before its commit leaves: a compressed copy of each log file."""
    planted = []
    for path in folder.glob("*.jsonl"):
        copy = path.with_name(f"{path.name}.zst")
        copy.write_bytes(zstandard.ZstdCompressor().compress(path.read_bytes()))
        planted.append(copy)
    return planted


def test_what_a_killed_freeze_or_thaw_left_is_a_leftover(store: FsStore, root: Path) -> None:
    """A ``.zst`` beside its plain file in a hot folder (a freeze killed before its commit)
    and a plain file beside its ``.zst`` in a frozen one (killed after it, or a thaw killed
    before its own) are provably leftovers: reads ignore them, fsck reports them, --repair
    deletes them and nothing else (a file without its twin stays)."""
    ref = _create(store, "cli:main", "hello")
    _create(store, "cli:cold", "brr")
    states.archive_context(store, ContextId("cli", "cold"))
    hot, cold = store.folder_of(MAIN), store.folder_of(ContextId("cli", "cold"))
    assert hot is not None and cold is not None
    planted = _plant_zst_copies(hot)
    (frozen,) = cold.glob("*.jsonl.zst")
    plain = frozen.with_name(frozen.name.removesuffix(".zst"))  # its twin, left by a thaw
    plain.write_bytes(b"junk\n")
    alone = hot / f"{ref.session_id}.jsonl.zst"  # no twin: not provably a leftover
    kept = zstandard.ZstdCompressor().compress(b"")
    alone.write_bytes(kept)
    assert _history(store, "cli:main") == [{"role": "user", "content": "hello"}]
    checked = json.loads(invoke("fsck", "--json", "--storage-dir", str(root)).output)
    assert sorted(p["path"] for p in checked["problems"] if p["kind"] == "leftover") == sorted(
        str(p) for p in [*planted, plain]
    )
    assert invoke("fsck", "--repair", "--storage-dir", str(root)).exit_code == 0
    assert not plain.exists() and not any(p.exists() for p in planted)
    assert alone.read_bytes() == kept
    assert invoke("fsck", "--storage-dir", str(root)).exit_code == 0
    assert _history(store, "cli:main") == [{"role": "user", "content": "hello"}]
    assert _history(store, "cli:cold") == [{"role": "user", "content": "brr"}]
    assert states.is_archived(store, ContextId("cli", "cold"))


def test_legacy_files_in_the_archive_folder_are_not_hot(store: FsStore, root: Path) -> None:
    """Legacy JSON files moved under archive/ by hand (as the seed suggests) are archived:
    the legacy listing leaves them out rather than reporting them as misplaced."""
    folder = root / "archive" / "cli" / "2024-01-02"
    folder.mkdir(parents=True)
    (folder / "old.json").write_text("{}")
    (root / "archive" / "stray.json").write_text("{}")
    assert listing(store).problems == ()
    assert listing(store).sessions == ()


def test_archive_then_list_via_the_cli(store: FsStore, root: Path) -> None:
    """The hot listing of the command line leaves an archived context out."""
    _create(store, "cli:main", "hello")
    _create(store, "cli:other", "hi")
    states.archive_context(store, MAIN)
    out = invoke("list", "--json", "--storage-dir", str(root)).output
    assert "cli:main" not in out and "cli:other" in out


def test_the_oracle_script_leaves_a_clean_fsck(store: FsStore, root: Path) -> None:
    """After a run of every lifecycle call, fsck finds nothing wrong."""
    _script(store)
    result = invoke("fsck", "--storage-dir", str(root))
    assert result.exit_code == 0, result.output


def test_delete_of_a_damaged_context_says_what_is_wrong(store: FsStore, root: Path) -> None:
    """A folder whose head cannot be rebuilt cannot be trashed (the trash entry is made from
    its head): the delete names the damage and moves nothing; fsck reports it."""
    _create(store, "cli:main", "hello")
    folder = store.folder_of(MAIN)
    assert folder is not None
    (folder / "head.json").write_text("not json")
    for segment in folder.glob("*.jsonl"):
        segment.write_bytes(b"garbage\n")
    with pytest.raises(CorruptLog):
        states.delete_context(store, MAIN)
    assert folder.exists() and states.trashed_contexts(store) == []
    checked = json.loads(invoke("fsck", "--json", "--storage-dir", str(root)).output)
    assert "damaged" in {p["kind"] for p in checked["problems"]}


def test_archived_segments_read_as_the_hot_ones_did(store: FsStore) -> None:
    """read_segment (with stop_seq), next_seq, list_segments and read_trace give the same
    answers for an archived context as for the hot one."""
    ref = _create(store, "cli:main", "a", "b", "c")
    store.append_trace(ref.session_id, ref.segment_id, [TraceEntry(TS, "chunk", {"n": 2})])
    segs = store.list_segments(ref.session_id)

    def snapshot() -> Any:
        return (
            store.list_segments(ref.session_id),
            [
                msgspec.structs.replace(
                    store.read_segment(ref.session_id, s, stop_seq=2), torn=None
                )
                for s in segs
            ],
            [store.next_seq(ref.session_id, s) for s in segs],
            [store.read_trace(ref.session_id, s) for s in segs],
        )

    hot = snapshot()
    states.archive_context(store, MAIN)
    assert snapshot() == hot
    assert states.is_archived(store, MAIN)  # reads never unarchive
    assert _leftovers(store.root) == []


def _legacy_file(root: Path, context: str, date: str = "2024-03-05") -> Path:
    """A legacy Terrarium JSON file holding ``context`` with one exchange."""
    ctx = ContextId.parse(context)
    stamp = f"{date}T14:00:00.123456"
    messages = [
        {"role": "user", "content": "old question", "timestamp": stamp},
        {"role": "assistant", "content": "old answer", "timestamp": stamp},
    ]
    data = {
        "session_id": ctx.name,
        "context_type": ctx.type,
        "system_prompt": "be brief",
        "messages": messages,
        "metadata": {
            "created_at": stamp,
            "last_active": stamp,
            "message_count": 2,
            "session_id": ctx.name,
            "context_type": ctx.type,
            "session_date": date,
        },
    }
    path = root / ctx.type / date / f"{ctx.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return path


def test_a_legacy_file_is_archived_with_its_context_and_put_back(
    store: FsStore, root: Path
) -> None:
    """Archiving a context only a legacy file holds (``terrarium archive``, a policy) imports
    it, then takes the file into the archive (``legacy-1.json.zst``, its bytes exactly):
    neither the hot listing nor the legacy scan shows it. Unarchiving puts the file back where
    it was."""
    path = _legacy_file(root, "cli:old")
    data = path.read_bytes()
    plan = lifecycle.plan_archive(store, names=[ContextId("cli", "old")])
    (archived,) = lifecycle.run_archive(store, plan, why="test")
    assert archived.message_count == 2
    assert not path.exists()
    folder = store.folder_of(ContextId("cli", "old"))
    assert folder is not None
    packed = (folder / "legacy-1.json.zst").read_bytes()
    assert zstandard.ZstdDecompressor().decompress(packed) == data
    assert listing(store).sessions == ()
    out = invoke("list", "--json", "--storage-dir", str(root)).output
    assert "cli:old" not in out
    texts = [m["content"] for m in _history(store, "cli:old")]
    assert texts == ["old question", "old answer"]
    assert states.unarchive_context(store, ContextId("cli", "old"))
    assert path.read_bytes() == data
    assert "cli:old" in invoke("list", "--json", "--storage-dir", str(root)).output


def test_an_imported_context_takes_its_legacy_file_into_the_archive(
    store: FsStore, root: Path
) -> None:
    """A context imported from a legacy file long ago still has the file in place: archiving
    the context moves it too, so the listing does not show the file as a context again."""
    path = _legacy_file(root, "cli:old")
    save_user_input(store, _imported(store, "cli:old"), "new question")
    assert states.archive_context(store, ContextId("cli", "old")) is not None
    assert not path.exists()
    assert "cli:old" not in invoke("list", "--json", "--storage-dir", str(root)).output


def test_an_archived_context_hides_a_legacy_file_of_it_left_out(
    store: FsStore, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An archive killed after its commit, before it removed the legacy file it packed (or an
    unarchive killed after it put the file back, before its commit): the context is archived
    and its file lies out too. The log wins, as for a hot context: neither ``list`` nor the
    dashboard's listing shows the file as a second, hot copy of the context; an unarchive
    leaves the one file."""
    path = _legacy_file(root, "cli:old")
    _imported(store, "cli:old")
    real_unlink = Path.unlink

    def die_at_the_legacy_file(self: Path, missing_ok: bool = False) -> None:
        if self == path:
            raise _Killed
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", die_at_the_legacy_file)
    with pytest.raises(_Killed):
        states.archive_context(store, ContextId("cli", "old"))
    monkeypatch.undo()
    with FsStore(root) as other:
        assert states.is_archived(other, ContextId("cli", "old")) and path.exists()
        assert "cli:old" not in invoke("list", "--json", "--storage-dir", str(root)).output
        for state, shown in (("hot", []), ("archived", ["cli:old"])):
            page = contexts.listing_index(other).read(
                lambda r, state=state: r.page(ListingQuery(), state)
            )
            assert [row.context for row in page] == shown, state
        assert states.unarchive_context(other, ContextId("cli", "old"))
        assert [info.legacy_path for info in listing(other).sessions] == [str(path)]


def test_list_export_search_and_dashboard_agree_an_archived_context_is_not_hot(
    store: FsStore, root: Path, tmp_path: Path
) -> None:
    """An archived context with a legacy file of it beside it (an archive or unarchive killed
    between its steps, or a seed file copied back): ``list``, ``export --all``, ``search`` and
    the dashboard's hot listing all leave out both the context and its hidden file. A bundle
    (``-f jsonl``) is a whole-store backup: it takes the archived context, from the log."""
    _create(store, "cli:hot", "warm words")
    _create(store, "cli:old", "logged words")
    states.archive_context(store, ContextId("cli", "old"))
    path = _legacy_file(root, "cli:old")
    shown = {"cli:hot"}
    listed = json.loads(invoke("list", "--json", "--storage-dir", str(root)).output)
    assert {row["context_id"] for rows in listed.values() for row in rows} == shown
    page = contexts.listing_index(store).read(lambda r: r.page(ListingQuery(), "hot"))
    assert {row.context for row in page} == shown
    assert {hit.context for hit in search(store, SearchQuery("words"))} == shown
    for fmt in ("markdown", "terrarium-json"):
        out = tmp_path / fmt
        invoke("export", "--all", "-f", fmt, "-o", str(out), "--storage-dir", str(root))
        assert {p.stem for p in out.rglob("*.*")} == {"hot"}, fmt
    bundle = tmp_path / "all.tar.gz"
    invoke("export", "--all", "-f", "jsonl", "-o", str(bundle), "--storage-dir", str(root))
    with tarfile.open(bundle) as tar:
        old = tar.extractfile("cli/old.jsonl")
        assert old is not None and b"logged words" in old.read()
    assert path.exists()  # a read leaves the file alone


def test_fsck_removes_a_legacy_file_left_out_only_when_the_archive_holds_its_bytes(
    store: FsStore, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file a killed archive left out beside the copy it packed is a leftover: ``fsck``
    reports it and ``--repair`` deletes it (an unarchive puts the packed copy back). One whose
    bytes differ from the packed copy is reported for a person and never deleted (before,
    neither was reported, and ``--repair`` left both)."""
    same, changed = _legacy_file(root, "cli:old"), _legacy_file(root, "cli:other")
    data = same.read_bytes()
    real_unlink = Path.unlink

    def die_at_a_legacy_file(self: Path, missing_ok: bool = False) -> None:
        if self in (same, changed):
            raise _Killed
        real_unlink(self, missing_ok=missing_ok)

    for name in ("cli:old", "cli:other"):
        _imported(store, name)
        with monkeypatch.context() as patch, pytest.raises(_Killed):
            patch.setattr(Path, "unlink", die_at_a_legacy_file)
            states.archive_context(store, ContextId.parse(name))
    changed.write_text(changed.read_text().replace("old answer", "edited since"))
    checked = invoke("fsck", "--json", "--storage-dir", str(root))
    problems = {p["path"]: p for p in json.loads(checked.output)["problems"]}
    assert checked.exit_code == 1 and set(problems) == {str(same), str(changed)}
    assert (problems[str(same)]["kind"], problems[str(changed)]["kind"]) == ("leftover", "legacy")
    assert same.exists() and changed.exists()  # a check changes nothing

    repaired = invoke("fsck", "--repair", "--json", "--storage-dir", str(root))
    problems = {p["path"]: p for p in json.loads(repaired.output)["problems"]}
    assert problems[str(same)]["repaired"] and not problems[str(changed)]["repaired"]
    assert repaired.exit_code == 1 and "edited since" in changed.read_text()
    assert not same.exists()
    # A file that changed between the check and the repair goes back in place, whole.
    from terrarium.cli.fsck import _drop_left_legacy

    kept = changed.read_bytes()
    folder = store.folder_of(ContextId("cli", "other"))
    assert folder is not None
    with pytest.raises(OSError, match="changed since the check"):
        _drop_left_legacy(changed, folder / "legacy-1.json.zst")
    assert changed.read_bytes() == kept and not list(changed.parent.glob(".*.fsck-*"))
    assert states.unarchive_context(store, ContextId("cli", "old"))
    assert same.read_bytes() == data


def test_delete_purge_takes_the_legacy_file_of_the_context_too(store: FsStore, root: Path) -> None:
    """``terrarium delete --purge`` of a context imported from a legacy file, which stays:
    the file goes into ``.trash/legacy/`` as a delete's does, so ``list`` does not show the
    purged context again."""
    path = _legacy_file(root, "cli:old")
    _imported(store, "cli:old")
    result = invoke("delete", "cli:old", "--purge", "--yes", "--storage-dir", str(root))
    assert result.exit_code == 0, result.output
    assert not path.exists() and list((root / ".trash" / "legacy").rglob("old.json"))
    assert "cli:old" not in invoke("list", "--json", "--storage-dir", str(root)).output


def test_a_delete_killed_before_its_detach_leaves_the_context_hot(
    store: FsStore, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delete of a context beside its legacy file moves the file first, then detaches the
    context: killed between the two, the context is still hot and shows once (its file, which
    the log hid, in the trash), never deleted and shown by its legacy file at once."""
    path = _legacy_file(root, "cli:old")
    _imported(store, "cli:old")

    def killed(*args: Any, **kwargs: Any) -> None:
        raise _Killed

    monkeypatch.setattr(FsStore, "detach_context", killed)
    with pytest.raises(_Killed):
        lifecycle.delete_context(store, ContextId("cli", "old"))
    monkeypatch.undo()
    assert not path.exists() and store.get_head(ContextId("cli", "old")) is not None
    assert states.trashed_contexts(store) == []
    assert lifecycle.delete_context(store, ContextId("cli", "old"))
    assert "cli:old" not in invoke("list", "--json", "--storage-dir", str(root)).output


def _imported(store: FsStore, context: str) -> PodActiveSegmentRef:
    from terrarium import legacy

    assert legacy.resume(store, ContextId.parse(context))
    head = store.get_head(ContextId.parse(context))
    assert head is not None
    return head.ref


def test_the_scan_searches_archived_contexts_only_when_asked() -> None:
    """terrarium.search.scan (what MemoryStore and an unavailable index use) leaves archived
    contexts out unless SearchQuery.archived is set, as FsStore.search does."""

    store = MemoryStore()
    _create(store, "cli:hot", "apples and pears")
    _create(store, "cli:cold", "apples and plums")
    states.archive_context(store, ContextId("cli", "cold"))
    assert [h.context for h in search(store, SearchQuery("apples"))] == ["cli:hot"]
    found = {h.context for h in search(store, SearchQuery("apples", archived=True))}
    assert found == {"cli:hot", "cli:cold"}


def test_a_legacy_file_is_archived_by_age(store: FsStore, root: Path) -> None:
    """``archive --older-than 30d`` takes an old context that only a legacy seed-format file
    holds, as the seed advises for old sessions, beside the log contexts."""
    path = _legacy_file(root, "cli:oldlegacy", date="2024-02-01")
    plan = lifecycle.plan_archive(store, older_than=lifecycle.parse_age("30d"))
    assert [c.context for c in plan.candidates] == ["cli:oldlegacy"]
    assert plan.candidates[0].hot_bytes == path.stat().st_size
    result = invoke("archive", "--older-than", "30d", "--storage-dir", str(root))
    assert result.exit_code == 0, result.output
    assert states.is_archived(store, ContextId("cli", "oldlegacy"))
    assert not path.exists()


def test_delete_on_a_nearly_full_disk_reports_what_it_did(
    store: FsStore, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills up as a delete moves a context into the trash: the delete happened, so
    the command says so and exits 0, logs it, and its undo id restores it."""
    ref = create_segment(store, context="cli:big")
    head = store.get_head(ContextId.parse("cli:big"))
    assert head is not None and ref
    for n in range(20):
        save_user_input(store, head, f"message {n} " + "x" * 100)
    full = threading.Event()
    rename, write = os.rename, os.write

    def renaming(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        rename(src, dst, *args, **kwargs)
        if str(dst).endswith("/context"):
            full.set()  # from the commit on, only a few bytes fit

    def writing(fd: int, data: Any) -> int:
        if full.is_set() and len(data) > 400:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(fd, data)

    monkeypatch.setattr(os, "rename", renaming)
    monkeypatch.setattr(os, "write", writing)
    result = invoke("delete", "cli:big", "--yes", "--storage-dir", str(root))
    monkeypatch.undo()
    assert result.exit_code == 0, result.output
    [entry] = states.trashed_contexts(store)
    assert entry.trash_id[:8] in result.output
    assert any(r["action"] == "trash" for r in lifecycle.MaintenanceLog.of(store).records())
    restored = invoke("trash", "restore", entry.trash_id, "--storage-dir", str(root))
    assert restored.exit_code == 0, restored.output
    head = store.get_head(ContextId.parse("cli:big"))
    assert head is not None
    save_user_input(store, head, "after the restore")  # a sealed file is unsealed by a write
    assert len(restore(store, ContextId.parse("cli:big")).history) == 21


def test_names_up_to_the_file_name_limit_archive_delete_fork_and_export(
    store: FsStore, root: Path, tmp_path: Path
) -> None:
    """Context names of 251 to 255 encoded bytes are valid: archive, unarchive, delete,
    restore, a fork into one, the first message of a PersistentSession and an export to a
    folder all work (no legacy ``{name}.json`` can be that long, so none is looked for)."""
    from terrarium.agent.session_manager import PersistentSession

    for size in (251, 255):
        name = f"cli:{'n' * size}"
        create_segment(store, context=name)
        for command in (
            ["archive", name],
            ["unarchive", name],
            ["fork", name, f"cli:{'f' * size}"],
        ):
            result = invoke(*command, "--storage-dir", str(root))
            assert result.exit_code == 0, (command, result.output)
        out = tmp_path / f"export-{size}"
        result = invoke(
            "export",
            name,
            f"cli:{'f' * size}",
            "-f",
            "html",
            "-o",
            str(out),
            "--storage-dir",
            str(root),
        )
        assert result.exit_code == 0, result.output
        assert len(list(out.rglob("*.html"))) == 2
        result = invoke("delete", name, "--yes", "--storage-dir", str(root))
        assert result.exit_code == 0, result.output
        [entry] = [e for e in states.trashed_contexts(store) if e.context == name]
        states.restore_trashed(store, entry.trash_id)
        session = PersistentSession(store, ContextId.parse(f"cli:{'p' * size}"))
        session.add_message("user", "hello")
        session.save()


def test_a_fork_on_a_full_disk_either_happens_or_leaves_nothing(
    store: FsStore, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills up once a fork's segment is written: the fork exists, so the command
    says so and exits 0 (its head.json, derived from the segment, follows); a
    fork whose segment does not fit leaves nothing, and a retry then works."""
    create_segment(store, context="cli:src")
    head = store.get_head(ContextId.parse("cli:src"))
    assert head is not None
    save_user_input(store, head, "hello")

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    committed = threading.Event()
    write_new, write_atomic = FsStore._write_new, fs_module.write_atomic

    def segment(self: FsStore, path: Path, data: bytes, **kwargs: Any) -> None:
        write_new(self, path, data, **kwargs)
        committed.set()  # from here on, the disk is full

    def head_file(*args: Any, **kwargs: Any) -> None:
        if committed.is_set():
            full()
        write_atomic(*args, **kwargs)

    monkeypatch.setattr(FsStore, "_write_new", segment)
    monkeypatch.setattr(fs_module, "write_atomic", head_file)
    result = invoke("fork", "cli:src", "cli:copy", "--storage-dir", str(root))
    monkeypatch.undo()
    assert result.exit_code == 0, result.output
    with FsStore(root) as fresh:
        assert [m["content"] for m in _history(fresh, "cli:copy")] == ["hello"]
    again = invoke("fork", "cli:src", "cli:copy", "--storage-dir", str(root))
    assert again.exit_code == 1 and "exists" in again.output

    monkeypatch.setattr(fs_module, "write_new", full)
    monkeypatch.setattr(FsStore, "_write_new", full)
    result = invoke("fork", "cli:src", "cli:other", "--storage-dir", str(root))
    monkeypatch.undo()
    assert result.exit_code == 1 and "No space" in result.output
    assert store.get_head(ContextId.parse("cli:other")) is None
    assert invoke("fork", "cli:src", "cli:other", "--storage-dir", str(root)).exit_code == 0


def test_a_store_in_the_unreleased_old_layout_opens(root: Path) -> None:
    """The lifecycle's first layout (``archive/``, ``.trash/{id}/``, ``.index/pins``) was never
    released: it is not read, but a store holding it opens, lists, archives and checks."""
    with FsStore(root) as store:
        _create(store, "cli:main", "hello")
    old = root / "archive" / "cli" / "2026-01-01" / "gone"
    old.mkdir(parents=True)
    (old / "archive.json").write_text("{}")
    (root / ".trash" / ("a" * 32) / "context").mkdir(parents=True)
    (root / ".index" / "pins" / "cli").mkdir(parents=True)
    (root / ".index" / "pins" / "cli" / "main").write_text("")
    with FsStore(root) as store:
        assert [h.context for h in store.list_contexts()] == ["cli:main"]
        assert states.archived_contexts(store) == [] and states.trashed_contexts(store) == []
        assert states.pinned_contexts(store) == frozenset()
        assert states.archive_context(store, MAIN) is not None
        assert [a.context for a in states.archived_contexts(store)] == ["cli:main"]
    assert invoke("fsck", "--storage-dir", str(root)).exit_code == 0


def test_terrarium_archive_names_a_context_only_a_legacy_file_holds(
    store: FsStore, root: Path
) -> None:
    """``terrarium archive cli:old`` takes a legacy-only context by name (imported, then
    archived), as an archive by age does; an unknown name is still refused."""
    path = _legacy_file(root, "cli:old")
    result = invoke("archive", "cli:old", "--storage-dir", str(root))
    assert result.exit_code == 0, result.output
    assert not path.exists() and states.is_archived(store, ContextId("cli", "old"))
    refused = CliRunner().invoke(cli, ["archive", "cli:never", "--storage-dir", str(root)])
    assert refused.exit_code == 1 and "cli:never" in refused.output


def test_an_append_overtaken_by_archives_again_and_again_still_lands(root: Path) -> None:
    """Another process archives the context again right after each wake, five times: the
    append still lands, once (it used to give up after three tries: 'was deleted'; the
    4-process race found it)."""

    class Rearchived(FsStore):
        times = 5

        def thaw_session(self, session_id: Any, **change: Any) -> None:
            super().thaw_session(session_id, **change)  # the wake of a write
            if self.times:
                self.times -= 1
                with FsStore(root) as other:
                    assert states.archive_context(other, MAIN) is not None

    with FsStore(root) as setup:
        create_segment(setup, context=MAIN)
    with Rearchived(root) as store:
        head = store.get_head(MAIN)
        assert head is not None
        assert states.archive_context(store, MAIN) is not None
        save_user_input(store, head, "landed")
        assert store.times == 0 and not states.is_archived(store, MAIN)
        assert [m["content"] for m in restore(store, MAIN).history] == ["landed"]


def test_a_sessions_owner_is_its_folder_whatever_a_move_does_to_its_files(root: Path) -> None:
    """The owner of a session is the context its folder names: read while a freeze or thaw
    swaps the files (here, the head segment's file gone for a moment), it is still the
    context, not a damaged one (the 4-process race met ``CorruptLog`` from a purge)."""
    with FsStore(root) as store:
        session_id, segment_id = create_segment(store, context=MAIN)
        folder = store.folder_of(MAIN)
        assert folder is not None
        segment = folder / f"{segment_id}.jsonl"
        aside = folder.parent / "aside.jsonl"
        segment.rename(aside)
        try:
            assert store.session_owner(session_id) == str(MAIN)
        finally:
            aside.rename(segment)


def test_a_head_move_takes_the_head_lock_before_the_sessions(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head move (set_head: a rewind's, a clear's) takes the context's head lock before its
    session's lock, the store's lock order. Taken the other way round, the move holds the
    session's lock shared and waits for the head lock while a delete (or a trash restore)
    holds the head lock and waits for the session's: both wait forever (four workers of the
    lifecycle race hung so, a rewind against a restore). Here a delete starts as soon as the
    move holds the session's lock; the move goes first, then the delete."""
    with FsStore(root) as setup:
        head = _create(setup, str(MAIN), "one", "two")
        target = fork_at(setup, head, 1)
    mover, deleter = FsStore(root), FsStore(root)
    held: set[str] = set()
    asked, waiting = threading.Event(), threading.Event()
    deleting = threading.Thread(target=lambda: states.delete_context(deleter, MAIN))
    session_lock, head_lock = FsStore._session_lock, FsStore._head_lock

    @contextlib.contextmanager
    def tracked_session(self: FsStore, session_id: Any, **how: Any) -> Iterator[None]:
        if self is deleter and not how.get("shared") and "deleter head" in held:
            waiting.set()  # the delete holds the head lock and asks for the session's
        with session_lock(self, session_id, **how):
            if self is mover and deleting.ident is None:
                deleting.start()  # the delete comes in now
                assert asked.wait(10), "the delete never asked for the head lock"
            held.add(f"{'mover' if self is mover else 'deleter'} session")
            try:
                yield
            finally:
                held.discard(f"{'mover' if self is mover else 'deleter'} session")

    @contextlib.contextmanager
    def tracked_head(self: FsStore, context: ContextId) -> Iterator[None]:
        who = "mover" if self is mover else "deleter"
        if self is deleter:
            asked.set()
        elif "mover session" in held and "mover head" not in held:  # the order reversed
            assert waiting.wait(10), "the delete never took the head lock"
            path = root / ".locks" / "head" / context.type / context.encoded_name
            with open(path, "rb") as probe:
                try:
                    fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise AssertionError("deadlock: the delete waits for us, we for it") from None
        with head_lock(self, context):
            held.add(f"{who} head")
            try:
                yield
            finally:
                held.discard(f"{who} head")

    monkeypatch.setattr(FsStore, "_session_lock", tracked_session)
    monkeypatch.setattr(FsStore, "_head_lock", tracked_head)
    try:
        mover.set_head(MAIN, target, expected=head.segment_id)
    finally:
        if deleting.ident is not None:
            deleting.join(10)
        mover.close()
        deleter.close()
    assert deleting.ident is not None and not deleting.is_alive()
    with FsStore(root) as store:
        assert [t.context for t in states.trashed_contexts(store)] == [str(MAIN)]


def test_an_unarchive_keeps_the_archived_legacy_file_when_another_lies_in_its_place(
    store: FsStore, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unarchive puts a packed legacy file back where it lay; when a different file lies
    there now (left out by a killed archive and edited since), that one keeps its place and
    the archived bytes go beside it as ``{name}.archived-{n}``: neither is lost."""
    legacy = _legacy_file(root, "cli:other")
    archived = legacy.read_bytes()
    real_unlink = Path.unlink

    def die_at_the_legacy_file(self: Path, missing_ok: bool = False) -> None:
        if self == legacy:
            raise _Killed
        real_unlink(self, missing_ok=missing_ok)

    _imported(store, "cli:other")
    with monkeypatch.context() as patch, pytest.raises(_Killed):
        patch.setattr(Path, "unlink", die_at_the_legacy_file)
        states.archive_context(store, ContextId("cli", "other"))
    legacy.write_text(legacy.read_text().replace("old answer", "edited since"))
    edited = legacy.read_bytes()

    assert states.unarchive_context(store, ContextId("cli", "other"))
    assert legacy.read_bytes() == edited
    assert legacy.with_name(f"{legacy.name}.archived-1").read_bytes() == archived
