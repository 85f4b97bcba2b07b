"""FsStore's detached sessions: where they live, what walks past them, and attach's steps.

A session created without a context lives in ``.detached/{session}/``; attaching it writes
``head.json`` there, renames the folder to ``{type}/{date}/{name}/`` and writes the index
entries. Each step is safe to kill (``test_attach_killed_at_any_step_...``).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from helpers.procs import Child
from terrarium import (
    FsStore,
    PodActiveSegmentRef,
    SegmentStartState,
    SessionAttached,
    StoreError,
    attach_context,
    create_segment,
    detached_sessions,
    fork_at,
    restore,
    restore_by_segment,
    save_delta,
    save_user_input,
)
from terrarium.cli import cli
from terrarium.formats.terrarium_json import iter_legacy_files
from terrarium.index import listing as lister
from terrarium.index._query import SearchQuery
from terrarium.legacy import listing
from terrarium.model import ContextId


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _detached(store: FsStore, *texts: str) -> PodActiveSegmentRef:
    session_id, segment_id = create_segment(store, SegmentStartState(system_prompt="hi"))
    ref = PodActiveSegmentRef(session_id, segment_id)
    for text in texts:
        save_delta(
            store, ref, [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]
        )
    return ref


def _modes(root: Path) -> set[tuple[str, int]]:
    """(kind, permission bits) of everything in the tree but the lock files."""
    found = set()
    for path in root.rglob("*"):
        if ".locks" in path.relative_to(root).parts:
            continue
        mode = stat.S_IMODE(path.lstat().st_mode)
        found.add(("dir" if path.is_dir() else "file", mode))
    return found


def test_a_detached_session_lives_in_a_private_dot_folder_nothing_walks(
    root: Path, store: FsStore
) -> None:
    """Its segments are in .detached/{session}/ (0600 files, 0700 folders); no listing,
    reindex, legacy scan, export or fsck takes that folder for a context type, and reindex
    leaves it where it is."""
    ref = _detached(store, "tadpoles")
    folder = root / ".detached" / str(ref.session_id)
    assert sorted(p.name for p in folder.iterdir()) == [f"{ref.segment_id}.jsonl"]
    assert _modes(root) <= {("dir", 0o700), ("file", 0o600)}
    assert list(store.walk()) == [] and store.list_contexts() == []
    assert store.reindex() == 0 and lister(store).list_contexts_fast() == []
    assert list(iter_legacy_files(root)) == []
    assert listing(store).sessions == () and listing(store).problems == ()
    assert folder.is_dir() and detached_sessions(store) == [ref.session_id]
    listed = invoke("list", "--json", "--storage-dir", str(root))
    assert listed.exit_code == 0 and json.loads(listed.output) == {"contexts": []}
    checked = invoke("fsck", "--json", "--storage-dir", str(root))
    report = json.loads(checked.output)
    assert checked.exit_code == 0 and report["problems"] == []
    assert (report["contexts"], report["segments"], report["entries"]) == (1, 1, 2)
    out = root.parent / "export"
    exported = invoke("export", "--all", "--storage-dir", str(root), "-o", str(out))
    assert exported.exit_code == 0, exported.output
    assert not out.exists() or not any(out.rglob("*.*"))


def test_attach_moves_the_folder_into_its_date_and_keeps_it_private(
    root: Path, store: FsStore
) -> None:
    """After attach the session is in {type}/{root date}/{name}/ with a head.json naming the
    chosen segment (not the newest), the index knows it, .detached/ holds nothing of it, and
    every file and folder is still private."""
    ref = _detached(store, "newts")
    forked = fork_at(store, ref, 1)  # newer than the root, which becomes the head
    head = attach_context(store, "irc:#pond", ref)
    folder = root / "irc" / head.created_at[:10] / "#pond"
    assert store.folder_of(ContextId.parse("irc:#pond")) == folder
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["head.json", f"{ref.segment_id}.jsonl", f"{forked}.jsonl"]
    )
    assert json.loads((folder / "head.json").read_text())["segment_id"] == str(ref.segment_id)
    assert not (root / ".detached" / str(ref.session_id)).exists()
    assert (root / ".index" / "sessions" / str(ref.session_id)).exists()
    assert _modes(root) <= {("dir", 0o700), ("file", 0o600)}
    with FsStore(root) as fresh:  # another process: finds it through the index
        assert restore(fresh, "irc:#pond") == restore_by_segment(
            fresh, ref.session_id, ref.segment_id
        )
        assert detached_sessions(fresh) == []


def test_a_lost_head_of_an_attached_session_is_rebuilt_with_its_folders_context(
    root: Path, store: FsStore
) -> None:
    """The headers of a session that began detached say context null: a head rebuilt from
    the segments takes the context its folder names, and fsck --repair writes it."""
    ref = _detached(store, "frogs")
    attach_context(store, "cli:frogs", ref)
    folder = store.folder_of(ContextId.parse("cli:frogs"))
    assert folder is not None
    (folder / "head.json").unlink()
    with FsStore(root) as fresh:
        head = fresh.get_head(ContextId.parse("cli:frogs"))
        assert head is not None and head.context == "cli:frogs"
        assert head.segment_id == ref.segment_id
    checked = invoke("fsck", "--json", "--storage-dir", str(root))
    assert [p["kind"] for p in json.loads(checked.output)["problems"]] == ["head"]
    assert invoke("fsck", "--repair", "--storage-dir", str(root)).exit_code == 0
    assert json.loads((folder / "head.json").read_text())["context"] == "cli:frogs"
    assert invoke("fsck", "--storage-dir", str(root)).exit_code == 0


def test_fsck_checks_and_repairs_the_segments_of_detached_sessions(
    root: Path, store: FsStore
) -> None:
    """A torn tail in a detached session's segment is reported with its file, and --repair
    sets it aside; a healthy detached session reports nothing."""
    ref = _detached(store, "one")
    path = root / ".detached" / str(ref.session_id) / f"{ref.segment_id}.jsonl"
    with path.open("ab") as file:
        file.write(b'{"v":1,"seq":3,"ki')
    checked = invoke("fsck", "--json", "--storage-dir", str(root))
    [problem] = json.loads(checked.output)["problems"]
    assert checked.exit_code == 1
    assert (problem["kind"], problem["path"], problem["context"]) == ("torn", str(path), None)
    assert invoke("fsck", "--repair", "--storage-dir", str(root)).exit_code == 0
    assert invoke("fsck", "--storage-dir", str(root)).exit_code == 0
    assert [p.name for p in path.parent.glob("*.torn-*")] != []
    assert restore_by_segment(store, ref.session_id, ref.segment_id).next_seq == 3


def test_a_linked_detached_folder_is_refused(root: Path, tmp_path: Path) -> None:
    """.detached linked out of the root: creating a detached session there is refused and
    nothing is written outside."""
    outside = tmp_path / "outside"
    outside.mkdir()
    root.mkdir()
    (root / ".detached").symlink_to(outside, target_is_directory=True)
    with FsStore(root) as store:
        with pytest.raises(StoreError, match="outside"):
            create_segment(store)
        assert list(outside.iterdir()) == []


def test_the_cli_works_on_an_attached_context(root: Path, store: FsStore) -> None:
    """list, show and search show an attached context like any other."""
    ref = _detached(store, "where do newts live?")
    attach_context(store, "cli:newts", ref)
    listed = invoke("list", "--json", "--storage-dir", str(root))
    [row] = json.loads(listed.output)["contexts"]
    assert row["context_id"] == "cli:newts" and row["message_count"] == 2
    shown = invoke("show", "cli:newts", "--storage-dir", str(root))
    assert shown.exit_code == 0 and "where do newts live?" in shown.output
    found = invoke("search", "newts", "--json", "--storage-dir", str(root))
    assert found.exit_code == 0 and "cli:newts" in found.output
    assert [h.context for h in lister(store).search(SearchQuery("newts"))] == ["cli:newts"]


# --------------------------------------------------------------------------- crash safety


def _where(root: Path, session: str) -> list[str]:
    """Every folder of the tree holding a segment of ``session``."""
    folders = {
        str(p.parent.relative_to(root))
        for p in root.rglob("*.jsonl")
        if json.loads(p.read_text().splitlines()[0])["session_id"] == session
    }
    return sorted(folders)


def test_attach_killed_at_any_step_leaves_the_session_detached_or_attached(
    tmp_path: Path,
) -> None:
    """SIGKILL attach before each of its file changes in turn (the head written into the
    detached folder, the search marker, the index entries, the rename, which is the commit
    and the last of them): the session is then in exactly one place, reads the same, is
    detached (and attaches on the next try), and fsck finds nothing wrong, or only what
    --repair deletes or writes. Run to its end, it is attached with the chosen segment as
    its head (and attaching it again, to it or to another context, is refused)."""
    pristine = tmp_path / "pristine"
    with FsStore(pristine) as store:
        ref = _detached(store, "eggs", "larvae")
        newer = fork_at(store, ref, 1)  # the head must stay the chosen root, not this
        save_user_input(store, PodActiveSegmentRef(ref.session_id, newer), "elsewhere")
        create_segment(store, context="cli:other")
        expected = restore_by_segment(store, ref.session_id, ref.segment_id)
        assert lister(store).search(SearchQuery("larvae")) == []  # the search index is built
    session = str(ref.session_id)
    request: dict[str, Any] = {
        "context": "irc:#pond",
        "session": session,
        "segment": str(ref.segment_id),
    }
    with Child("attach_server") as server:

        def run(root: Path, kill: int, context: str = "irc:#pond") -> dict[str, Any]:
            assert server.proc.stdin is not None
            asked = {"root": str(root), "kill": kill, **request, "context": context}
            server.proc.stdin.write(json.dumps(asked))
            server.proc.stdin.write("\n")
            server.proc.stdin.flush()
            return server.read()

        counted = tmp_path / "counted"
        shutil.copytree(pristine, counted)
        done = run(counted, 0)
        assert done["error"] == "" and done["killed"] is False
        total = done["mutations"]
        assert total >= 6  # head (write, rename), folders, the rename, index entries
        with FsStore(counted) as store:
            head = store.get_head(ContextId.parse("irc:#pond"))
            assert head is not None and head.segment_id == ref.segment_id
        assert run(counted, 0, "cli:elsewhere")["error"] == "SessionAttached"
        outcomes = set()
        for point in range(1, total + 1):
            root = tmp_path / f"kill-{point}"
            shutil.copytree(pristine, root)
            assert run(root, point)["killed"] is True, point
            places = _where(root, session)
            assert len(places) == 1, (point, places)
            attached = not places[0].startswith(".detached")
            outcomes.add(attached)
            with FsStore(root) as store:
                assert restore_by_segment(store, ref.session_id, ref.segment_id) == expected
                assert detached_sessions(store) == ([] if attached else [ref.session_id])
                head = store.get_head(ContextId.parse("irc:#pond"))
                if attached:
                    assert head is not None and head.segment_id == ref.segment_id, point
                    assert restore(store, "irc:#pond") == expected
                else:
                    assert head is None, point
            checked = json.loads(invoke("fsck", "--json", "--storage-dir", str(root)).output)
            # A kill inside a write leaves its temporary file: a leftover, which --repair deletes.
            kinds = {p["kind"] for p in checked["problems"]}
            assert kinds <= {"unindexed", "leftover"}, (point, checked)
            assert invoke("fsck", "--repair", "--storage-dir", str(root)).exit_code == 0
            assert invoke("fsck", "--storage-dir", str(root)).exit_code == 0, point
            with FsStore(root) as store:
                found = {h.context for h in lister(store).search(SearchQuery("larvae"))}
                assert found == ({"irc:#pond"} if attached else set()), point
            elsewhere = run(root, 0, "cli:elsewhere")  # refused once attached
            assert elsewhere["error"] == ("SessionAttached" if attached else ""), point
            if not attached:  # this retry attached it elsewhere: start again from the kill
                shutil.rmtree(root)
                shutil.copytree(pristine, root)
                assert run(root, point)["killed"] is True
            again = run(root, 0)
            assert again["error"] == ("ContextExists" if attached else ""), (point, again)
            with FsStore(root) as store:
                assert [h.context for h in store.list_contexts()] == ["cli:other", "irc:#pond"]
                assert restore(store, "irc:#pond") == expected
                assert detached_sessions(store) == []
                assert {h.context for h in lister(store).search(SearchQuery("larvae"))} == {
                    "irc:#pond"
                }
            assert _where(root, session) == [_where(counted, session)[0]]
        assert outcomes == {False}  # every change precedes the commit


def test_a_store_that_cached_the_detached_folder_follows_the_attach(root: Path) -> None:
    """A store that wrote to the session while detached (its folder cached) reads, appends
    and forks in the new folder after another store attached it."""
    with FsStore(root) as first, FsStore(root) as second:
        ref = _detached(first)
        save_user_input(second, ref, "before")
        attach_context(first, "cli:moved", ref)
        save_user_input(second, ref, "after")
        fork_at(second, ref, 1)
        assert [m["content"] for m in restore(second, "cli:moved").history] == ["before", "after"]
        assert not (root / ".detached" / str(ref.session_id)).exists()
        with pytest.raises(SessionAttached):
            attach_context(second, "cli:again", ref)
        assert detached_sessions(second) == []
        assert os.listdir(root / ".detached") == []


def test_terrarium_copy_of_a_whole_store_carries_detached_sessions(
    root: Path, store: FsStore, tmp_path: Path
) -> None:
    """`terrarium copy SRC DST` copies detached sessions too (detached there); with
    --context, only those contexts."""
    ref = _detached(store, "iguanas")
    dest, only = tmp_path / "dest", tmp_path / "only"
    create_segment(store, context="cli:a")
    result = invoke("copy", "-v", str(root), str(dest))
    assert result.exit_code == 0, result.output
    assert f"copied session {ref.session_id}" in result.output
    assert "copied 2 sessions" in result.output
    with FsStore(dest) as copied:
        assert detached_sessions(copied) == [ref.session_id]
        state = restore_by_segment(copied, ref.session_id, ref.segment_id)
        assert state == restore_by_segment(store, ref.session_id, ref.segment_id)
    assert invoke("copy", str(root), str(only), "--context", "cli:a").exit_code == 0
    with FsStore(only) as copied:
        assert detached_sessions(copied) == []
