"""Blobs beyond the contract: crash safety, GC over archived logs, fsck, copy, export, URLs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import zstandard
from click.testing import CliRunner

import terrarium as t
from terrarium.blobs import BLOBS_KEY, collect_garbage
from terrarium.cli.app import cli
from terrarium.copy import copy_store
from terrarium.export import export_context
from terrarium.index import listing as lister
from terrarium.stores.fs import FsStore
from terrarium.stores.fs._blobs import BLOBS
from terrarium.stores.sqlite import SqliteStore

BIG = "0123456789abcdef" * 8192  # 128 KiB


def _with_output(store: t.Store, name: str = "cli:big", content: str = BIG) -> t.PodMetadata:
    t.create_segment(store, t.SegmentStartState(), context=name)
    head = store.get_head(t.ContextId.parse(name))
    assert head is not None
    t.save_user_input(store, head, "run it")
    t.save_delta(store, head, [{"role": "tool", "tool_call_id": "c1", "content": content}])
    return head


def _fsck(root: Path | str, *args: str) -> tuple[int, dict[str, object]]:
    result = CliRunner().invoke(cli, ["fsck", "--json", *args, "--storage-dir", str(root)])
    return result.exit_code, json.loads(result.stdout)


def test_blob_files_are_private_and_named_by_digest(tmp_path: Path) -> None:
    """``.blobs/ab/cdef...`` holds the bytes, 0600 in 0700 folders."""
    store = FsStore(tmp_path)
    digest = store.put_blob(b"hello")
    path = tmp_path / BLOBS / digest[:2] / digest[2:]
    assert path.read_bytes() == b"hello"
    assert path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / BLOBS).stat().st_mode & 0o777 == 0o700
    assert path.parent.stat().st_mode & 0o777 == 0o700


_KILLED_WRITE = """
import os, signal, sys
import terrarium as t
from terrarium.stores import _files
from terrarium.stores.fs import FsStore
from terrarium.index import listing as lister

store = FsStore(sys.argv[1])
t.create_segment(store, t.SegmentStartState(), context="cli:big")
head = store.get_head(t.ContextId.parse("cli:big"))
real = _files.write_all
def half_then_die(fd, data):
    if len(data) > 100_000:
        real(fd, data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    real(fd, data)
_files.write_all = half_then_die
big = "0123456789abcdef" * 8192
t.save_delta(store, head, [{"role": "tool", "tool_call_id": "c1", "content": big}])
"""


def test_sigkill_during_a_blob_write_leaves_no_reference(tmp_path: Path) -> None:
    """A kill while the blob is half written: no entry refers to it, no blob file is visible,
    fsck is clean, and GC removes the leftover temporary file."""
    script = textwrap.dedent(_KILLED_WRITE)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=False)
    assert done.returncode == -signal.SIGKILL
    store = FsStore(tmp_path)
    assert t.restore(store, "cli:big").history == []
    assert store.blob_digests() == [] and store.blob_references() == {}
    leftovers = list((tmp_path / BLOBS).rglob(".tmp-*"))
    assert len(leftovers) == 1
    assert _fsck(tmp_path)[0] == 0
    os.utime(leftovers[0], (0, 0))
    collect_garbage(store)
    assert list((tmp_path / BLOBS).rglob("*.tmp-*")) == [] and not leftovers[0].exists()


@pytest.mark.parametrize("kind", ["fs", "sqlite"])
def test_a_blob_written_before_a_failed_append_is_collected(tmp_path: Path, kind: str) -> None:
    """The blob goes first; if the append then fails, GC finds the blob unreferenced."""
    store = FsStore(tmp_path) if kind == "fs" else SqliteStore(tmp_path / "s.db")
    head = _with_output(store)
    try:
        t.save_delta(
            store,
            head,
            [{"role": "tool", "tool_call_id": "c2", "content": BIG * 2}],
            expected_seq=1,
        )
    except t.ConflictError:
        pass
    assert len(store.blob_digests()) == 2
    assert collect_garbage(store, min_age=0) == 1
    assert t.restore(store, "cli:big").history[-1]["content"] == BIG


def test_gc_scans_compressed_and_trashed_logs(tmp_path: Path) -> None:
    """A reference in a ``.jsonl.zst`` anywhere under the root (archive, trash) keeps its
    blob; ``.index`` does not count."""
    store = FsStore(tmp_path)
    head = _with_output(store)
    folder = store.folder_of(t.ContextId.parse("cli:big"))
    assert folder is not None
    segment = folder / f"{head.segment_id}.jsonl"
    archived = tmp_path / "archive" / "cli" / "2026-01-01" / "big" / segment.name
    archived.parent.mkdir(parents=True)
    archived.with_suffix(".jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(segment.read_bytes())
    )
    segment.unlink()
    (tmp_path / ".index" / "stray.jsonl").write_bytes(b'{"sha256":"' + b"0" * 64 + b'"}')
    (digest,) = store.blob_digests()
    assert digest in store.blob_references()
    assert collect_garbage(store, min_age=0) == 0
    archived.with_suffix(".jsonl.zst").unlink()
    assert collect_garbage(store, min_age=0) == 1


def test_gc_keeps_a_blob_whose_log_moves_while_it_scans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No move (another process's trash restore, renaming the session's folder into a place
    the scan has passed) runs while a collection scans, so the scan cannot miss the log and
    delete its blob (the lifecycle race caught a blob missing after a collection). The move
    is tried mid-scan where the lifecycle lock lets it start; the fix makes it wait."""
    import fcntl

    from terrarium.stores.fs import _blobs

    store = FsStore(tmp_path)
    _with_output(store)
    t.states.delete_context(store, t.ContextId.parse("cli:big"))  # into .detached/
    (entry,) = t.states.trashed_contexts(store)
    (digest,) = store.blob_digests()
    os.utime(tmp_path / BLOBS / digest[:2] / digest[2:], (0, 0))  # an old blob
    walk, moved = os.walk, []

    def move_if_it_may() -> None:
        with open(tmp_path / ".locks" / "lifecycle", "rb") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # a move would wait for the collection
            fcntl.flock(lock, fcntl.LOCK_UN)
        with FsStore(tmp_path) as other:
            t.states.restore_trashed(other, entry.trash_id)
        moved.append(True)

    def sorted_walk(top: str | Path, *args: object, **kwargs: object) -> object:
        for folder, dirs, files in walk(top, *args, **kwargs):  # type: ignore[call-overload]
            dirs.sort(reverse=True)  # cli before .detached
            if Path(folder) == tmp_path / ".detached":  # cli scanned, .detached not yet
                move_if_it_may()
                dirs[:] = sorted(os.listdir(folder), reverse=True)
            yield folder, dirs, files

    monkeypatch.setattr(_blobs.os, "walk", sorted_walk)
    assert collect_garbage(store, min_age=0) == 0
    assert store.has_blob(digest)
    if not moved:
        t.states.restore_trashed(store, entry.trash_id)
    assert t.restore(store, "cli:big").history[-1]["content"] == BIG


def test_fsck_reports_missing_and_damaged_blobs_and_cannot_repair_them(tmp_path: Path) -> None:
    """A missing blob and a blob whose bytes changed are problems ``--repair`` leaves."""
    store = FsStore(tmp_path)
    _with_output(store)
    (digest,) = store.blob_digests()
    path = tmp_path / BLOBS / digest[:2] / digest[2:]
    assert _fsck(tmp_path)[0] == 0
    path.write_bytes(b"changed")
    code, report = _fsck(tmp_path)
    problems = report["problems"]
    assert code == 1 and isinstance(problems, list)
    assert [p["kind"] for p in problems] == ["blob"] and "match" in problems[0]["message"]
    path.unlink()
    code, report = _fsck(tmp_path, "--repair")
    problems = report["problems"]
    assert code == 1 and isinstance(problems, list)
    assert "missing" in problems[0]["message"] and not problems[0]["repaired"]
    result = CliRunner().invoke(cli, ["fsck", "--storage-dir", str(tmp_path)])
    assert "cannot be recreated" in result.stderr


def test_copy_carries_blobs_or_inlines_them(tmp_path: Path) -> None:
    """Copied into a store with blobs, the output is a blob there; into one without, inline."""
    src = t.MemoryStore()
    _with_output(src)
    with SqliteStore(tmp_path / "a.db") as dst:
        copy_store(src, dst)
        assert dst.blob_digests() == src.blob_digests()
        assert t.restore(dst, "cli:big").history[-1]["content"] == BIG
    inline = FsStore(tmp_path / "inline", blob_threshold=0)
    copy_store(src, inline)
    head = inline.get_head(t.ContextId.parse("cli:big"))
    assert head is not None
    line = inline.read_segment(head.session_id, head.segment_id).entries[-1]
    assert BLOBS_KEY not in line and line["item"]["content"] == BIG
    assert inline.blob_digests() == []


def test_exports_hold_the_whole_output(tmp_path: Path) -> None:
    """Every export format sees the full text; a JSONL export imports into any store."""
    store = FsStore(tmp_path)
    head = _with_output(store)
    t.save_delta(store, head, [{"role": "assistant", "content": BIG}])
    for fmt in ("jsonl", "markdown", "openai", "terrarium-json"):
        text = export_context(store, "cli:big", fmt)
        assert (BIG in text) if isinstance(text, str) else (BIG.encode() in text), fmt
    exported = str(export_context(store, "cli:big", "jsonl"))
    assert BLOBS_KEY not in exported
    other = t.MemoryStore()
    from terrarium.formats.jsonl import import_context

    import_context(other, exported, context="cli:again")
    assert t.restore(other, "cli:again").history[-2]["content"] == BIG
    assert len(other.blob_digests()) == 1


def test_store_url_sets_the_threshold(tmp_path: Path) -> None:
    """``?blob_threshold=`` on fs: and sqlite: URLs; a bad value is a one-line error."""
    fs = t.open_store(f"fs:{tmp_path / 'fs'}?blob_threshold=10")
    assert isinstance(fs, FsStore) and fs.blob_threshold == 10
    db = t.open_store(f"sqlite:{tmp_path / 'x.db'}?blob_threshold=0")
    assert isinstance(db, SqliteStore) and db.blob_threshold == 0
    db.close()
    try:
        t.open_store(f"fs:{tmp_path}?blob_threshold=big")
    except t.StoreURLError as exc:
        assert "blob_threshold must be a number" in str(exc)
    else:
        raise AssertionError("accepted a bad threshold")


def test_the_session_manager_gets_the_whole_output(tmp_path: Path) -> None:
    """What the model is sent is the full text: the default restore resolves every blob."""
    store = FsStore(tmp_path)
    _with_output(store)
    state = t.restore_by_segment(store, *_ids(store))
    assert state.history[-1]["content"] == BIG


def _ids(store: t.Store) -> tuple[t.SessionId, t.SegmentId]:
    head = store.get_head(t.ContextId.parse("cli:big"))
    assert head is not None
    return head.session_id, head.segment_id


def test_search_sees_the_preview(tmp_path: Path) -> None:
    """The search index holds the preview: a word in the first characters is found, one only
    past them is not (docs/format.md says so)."""
    from terrarium.index._query import SearchQuery

    store = FsStore(tmp_path)
    _with_output(store, content="zebraword " + BIG + " giraffeword")
    assert [h.context for h in lister(store).search(SearchQuery("zebraword"))] == ["cli:big"]
    assert lister(store).search(SearchQuery("giraffeword")) == []


def test_fsck_on_sqlite_reports_a_missing_blob(tmp_path: Path) -> None:
    """On SQLite, a blob_refs row whose blob is gone is a ``blob`` problem."""
    path = tmp_path / "s.db"
    with SqliteStore(path) as store:
        _with_output(store)
        with store.atomic(), store._write() as conn:
            conn.execute("DELETE FROM blobs")
    code, report = _fsck(f"sqlite:{path}")
    problems = report["problems"]
    assert code == 1 and isinstance(problems, list)
    assert [p["kind"] for p in problems] == ["blob"] and "missing" in problems[0]["message"]


def test_a_malformed_reference_list_is_a_corrupt_log() -> None:
    """A ``_blobs`` list that is not a list of references is CorruptLog, naming the entry."""
    from terrarium.blobs import resolve_line

    store = t.MemoryStore()
    for refs in (
        "x",
        [{"path": [], "sha256": "0" * 64, "bytes": 1, "chars": 1}],
        [{"path": ["a"]}],
    ):
        line = {"seq": 3, "kind": "item", "item": {"content": "p"}, BLOBS_KEY: refs}
        with pytest.raises(t.CorruptLog, match="entry 3"):
            resolve_line(line, store, "full")


class _Text(str):
    """A str subclass: the write calls' quick check must not take it for something else."""


@pytest.mark.parametrize(
    "item",
    [
        {"role": "tool", "content": [{"type": "text", "text": BIG}]},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": BIG}}]},
        {"role": "tool", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": BIG}]},
        {"role": "tool", "content": _Text(BIG)},
        {"type": "function_call_output", "output": BIG, "n": 3, "ok": True, "x": 1.5},
    ],
)
def test_a_large_string_anywhere_in_an_item_goes_to_a_blob(tmp_path: Path, item: dict) -> None:
    """Every large string of an item is offloaded, however deep, in lists, tuples or as a str
    subclass, so the quick check of ordinary items never lets one through."""
    store = FsStore(tmp_path)
    t.create_segment(store, t.SegmentStartState(), context="cli:big")
    head = store.get_head(t.ContextId.parse("cli:big"))
    assert head is not None
    [entry] = t.save_delta(store, head, [item])
    assert len(entry.data[BLOBS_KEY]) == 1
    assert BIG not in json.dumps(entry.data)
    assert BIG in json.dumps(t.restore(store, "cli:big").history[-1])


def test_a_large_string_in_a_tuple_of_any_entry_goes_to_a_blob(tmp_path: Path) -> None:
    """Entries of any kind are offloaded too, tuples included."""
    store = FsStore(tmp_path)
    t.create_segment(store, t.SegmentStartState(), context="cli:big")
    head = store.get_head(t.ContextId.parse("cli:big"))
    assert head is not None
    entry = t.append_entry(store, head, "x_note", {"item": {"parts": ("a", (BIG,))}})
    assert entry.data[BLOBS_KEY][0]["path"] == ["item", "parts", 1, 0]


def test_an_ordinary_item_is_logged_as_given(tmp_path: Path) -> None:
    """Below the threshold nothing is copied or marked: the entry holds the item itself."""
    store = FsStore(tmp_path, blob_threshold=1024)
    t.create_segment(store, t.SegmentStartState(), context="cli:small")
    head = store.get_head(t.ContextId.parse("cli:small"))
    assert head is not None
    item = {"role": "assistant", "content": "x" * 256, "tool_calls": [{"id": "c", "n": 1}]}
    [entry] = t.save_delta(store, head, [item])
    assert BLOBS_KEY not in entry.data
    assert entry.data["item"] == item
    [bigger] = t.save_delta(store, head, [{"role": "assistant", "content": "y" * 1025}])
    assert bigger.data[BLOBS_KEY][0]["bytes"] == 1025
