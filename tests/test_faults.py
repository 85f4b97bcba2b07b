"""FsStore under faults: torn tails, corrupt lines, newer formats, a full disk, SIGKILL.

Crashes are real where the kernel can make them: a child process is SIGKILLed in the middle of
its appends, and a short write comes from ``RLIMIT_FSIZE``. Every check waits on a pipe, never
on a clock.
"""

from __future__ import annotations

import errno
import os
import random
import re
from pathlib import Path
from typing import Any

import pytest

from helpers.procs import Child
from terrarium import (
    ContextId,
    CorruptLog,
    FormatVersionError,
    FsStore,
    PodActiveSegmentRef,
    StoreError,
    TornTail,
    codec,
    create_segment_with_ids,
    new_segment_id,
    new_session_id,
    restore,
    save_user_input,
)
from terrarium.stores import fs as fs_module
from terrarium.stores.base import NewEntry

TS = "2026-05-01T12:00:00.000000Z"
CONTEXT = "cli:main"


@pytest.fixture
def ref(store: FsStore) -> PodActiveSegmentRef:
    head = create_segment_with_ids(
        store, new_session_id(), new_segment_id(), context=CONTEXT, ts=TS
    )
    return head.ref


def _entry(text: str, **extra: Any) -> NewEntry:
    return NewEntry("item", TS, {"item": {"role": "assistant", "content": text}, **extra})


def _append(store: FsStore, ref: PodActiveSegmentRef, *texts: str, **extra: Any) -> int:
    return store.append(ref.session_id, ref.segment_id, [_entry(t, **extra) for t in texts])


def _path(store: FsStore, ref: PodActiveSegmentRef) -> Path:
    folder = store.folder_of(ContextId.parse(CONTEXT))
    assert folder is not None
    return folder / f"{ref.segment_id}.jsonl"


def _contents(state: Any) -> list[str]:
    return [item["content"] for item in state.history]


def _tear(path: Path, data: bytes) -> int:
    """Append ``data`` (no newline) as a crashed writer would; return where it starts."""
    offset = path.stat().st_size
    with path.open("ab") as out:
        out.write(data)
    return offset


def _side_files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in path.parent.glob(f"{path.name}.torn-*")}


# --------------------------------------------------------------------------- torn tails


@pytest.mark.parametrize("torn_size", [1, 300, 5000, 300_000])
@pytest.mark.parametrize("last_size", [10, 70_000])
def test_restore_reports_a_torn_tail_and_changes_nothing(
    store: FsStore, ref: PodActiveSegmentRef, torn_size: int, last_size: int
) -> None:
    """A read reports bytes after the last newline and leaves them; the next append moves them.

    They go to {segment}.jsonl.torn-{offset} before the writer's own line, never glued to it.
    """
    _append(store, ref, "a", "b")
    _append(store, ref, "c" * last_size)
    path = _path(store, ref)
    torn = (b'{"v":1,"seq":4,"ts":"' + b"x" * torn_size)[:torn_size]
    offset = _tear(path, torn)
    before = path.read_bytes()

    with FsStore(store.root) as reader:
        state = restore(reader, CONTEXT)
    assert _contents(state) == ["a", "b", "c" * last_size]
    assert state.torn == [TornTail(ref.segment_id, offset, len(torn), None)]
    assert path.read_bytes() == before
    assert _side_files(path) == {}

    side = f"{path}.torn-{offset}"
    assert _append(store, ref, "d") == 4
    assert Path(side).read_bytes() == torn
    again = restore(store, CONTEXT)
    assert _contents(again) == ["a", "b", "c" * last_size, "d"]
    assert again.torn == []
    assert Path(side).read_bytes() == torn


@pytest.mark.parametrize("writer_kind", ["the same store", "another store"])
@pytest.mark.parametrize("torn_size", [7, 9000])
def test_an_append_after_a_crash_sets_the_torn_tail_aside(
    store: FsStore, ref: PodActiveSegmentRef, writer_kind: str, torn_size: int
) -> None:
    """A writer that finds a torn tail sets it aside first: its line is never glued to it."""
    _append(store, ref, "a")
    path = _path(store, ref)
    torn = b'{"v":1,"seq":2,"kind":"item","item":{"content":"' + b"y" * torn_size
    offset = _tear(path, torn)

    writer = store if writer_kind == "the same store" else FsStore(store.root)
    try:
        assert _append(writer, ref, "b", "c") == 2
        assert writer.next_seq(ref.session_id, ref.segment_id) == 4
    finally:
        if writer is not store:
            writer.close()
    assert _side_files(path) == {f"{path.name}.torn-{offset}": torn}
    lines = path.read_bytes().splitlines()
    assert [codec.decode(line)["seq"] for line in lines] == [0, 1, 2, 3]
    state = restore(store, CONTEXT)
    assert _contents(state) == ["a", "b", "c"]
    assert state.torn == []  # set aside by the writer already, and logged then


def test_two_torn_tails_at_the_same_offset_keep_their_own_side_files(
    store: FsStore, ref: PodActiveSegmentRef
) -> None:
    """A second crash at the same offset does not mix its bytes into the first one's file."""
    _append(store, ref, "a")
    path = _path(store, ref)
    first, second = b'{"first crash', b'{"second crash, longer'
    offset = _tear(path, first)
    torn_one = store.set_aside_torn_tail(ref.session_id, ref.segment_id)
    assert _tear(path, second) == offset
    torn_two = store.set_aside_torn_tail(ref.session_id, ref.segment_id)
    assert torn_one is not None and torn_two is not None
    assert torn_one.offset == torn_two.offset == offset
    assert torn_one.set_aside_to != torn_two.set_aside_to
    assert torn_one.set_aside_to is not None and torn_two.set_aside_to is not None
    assert Path(torn_one.set_aside_to).read_bytes() == first
    assert Path(torn_two.set_aside_to).read_bytes() == second
    assert _contents(restore(store, CONTEXT)) == ["a"]


@pytest.mark.parametrize(
    ("sizes", "cut"),
    [
        ([100_000], "half"),
        ([300, 300, 300], "after-first-line"),
        ([300, 200_000], "after-first-line"),
        ([50_000, 50_000, 10], "half"),
    ],
)
def test_a_writer_killed_mid_write_leaves_nothing_of_its_append(
    store: FsStore, ref: PodActiveSegmentRef, sizes: list[int], cut: str, tmp_path: Path
) -> None:
    """SIGKILL inside the write of a batch: restore sees none of the batch and reports it.

    An append is all or nothing, so a batch whose first lines were complete when the writer
    died is set aside whole by the next append, not replayed in part.
    """
    _append(store, ref, "before")
    path = _path(store, ref)
    size_before = path.stat().st_size
    written = tmp_path / "written.bin"
    args = {"root": str(store.root), "context": CONTEXT, "sizes": sizes, "cut": cut}
    with Child("tear", **args, written=str(written)) as child:
        assert child.wait() == -9
    torn = written.read_bytes()
    assert path.read_bytes()[size_before:] == torn

    state = restore(store, CONTEXT)
    assert _contents(state) == ["before"]
    assert state.torn == [TornTail(ref.segment_id, size_before, len(torn), None)]
    assert path.read_bytes()[size_before:] == torn  # the read moved nothing
    assert _append(store, ref, "after") == 2
    assert Path(f"{path}.torn-{size_before}").read_bytes() == torn
    assert _contents(restore(store, CONTEXT)) == ["before", "after"]


# --------------------------------------------------------------------------- corrupt lines


def _rewrite_line(path: Path, number: int, replacement: bytes) -> None:
    """Replace line ``number`` (1-based) of the file by ``replacement`` (may hold newlines)."""
    lines = path.read_bytes().split(b"\n")
    lines[number - 1] = replacement
    path.write_bytes(b"\n".join(lines))


def _stored_line(path: Path, number: int) -> bytes:
    return path.read_bytes().split(b"\n")[number - 1]


CORRUPTIONS: dict[str, Any] = {
    "not json": lambda line: b"this is not json",
    "empty line": lambda line: b"",
    "blank line": lambda line: b"   ",
    "half a line": lambda line: line[: len(line) // 2],
    "no seq": lambda line: codec.encode(
        {k: v for k, v in codec.decode(line).items() if k != "seq"}
    ),
    "no kind": lambda line: codec.encode(
        {k: v for k, v in codec.decode(line).items() if k != "kind"}
    ),
    "seq not an int": lambda line: line.replace(b'"seq":3', b'"seq":"3"'),
    "not an object": lambda line: b"[1, 2, 3]",
    "a string": lambda line: b'"seq"',
    "two objects on one line": lambda line: line + b"," + line.replace(b'"seq":3', b'"seq":4'),
    "an object broken over two lines": lambda line: line.replace(b"[1,2]", b"[1\n2]"),
    "a duplicated seq": lambda line: line.replace(b'"seq":3', b'"seq":2'),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_corrupt_line_in_the_middle_names_the_file_and_line(
    store: FsStore, ref: PodActiveSegmentRef, corruption: str
) -> None:
    """Restore raises CorruptLog with path:line, never a not-found error or a silent loss."""
    for text in "abcd":
        _append(store, ref, text, nums=[1, 2])
    path = _path(store, ref)
    line = _stored_line(path, 4)  # seq 3
    assert b'"seq":3' in line and b"[1,2]" in line
    _rewrite_line(path, 4, CORRUPTIONS[corruption](line))
    with pytest.raises(CorruptLog) as caught:
        restore(store, CONTEXT)
    message = str(caught.value)
    if corruption in ("empty line", "blank line"):
        # A blank line holds no entry and is skipped: the loss shows at the next line.
        assert f"{path}:5: seq 4 out of order (expected 3)" in message
    else:
        assert f"{path}:4:" in message
    assert "\n" not in message
    assert not isinstance(caught.value, KeyError)  # not ContextNotFound or SegmentNotFound


def test_a_corrupt_header_names_line_one(store: FsStore, ref: PodActiveSegmentRef) -> None:
    """A broken first line is corruption of line 1, not a missing segment."""
    _append(store, ref, "a")
    path = _path(store, ref)
    _rewrite_line(path, 1, b'{"v":1,"seq":0,"kind":"item"}')
    with pytest.raises(CorruptLog, match=rf"{path}:1:"):
        restore(store, CONTEXT)
    _rewrite_line(path, 1, b"{")
    with pytest.raises(CorruptLog, match=rf"{path}:1:"):
        restore(store, CONTEXT)


def test_an_appender_refuses_to_continue_a_corrupt_last_line(
    store: FsStore, ref: PodActiveSegmentRef
) -> None:
    """A writer that cannot read the last line's seq raises CorruptLog, and writes nothing."""
    _append(store, ref, "a", "b")
    path = _path(store, ref)
    _rewrite_line(path, 3, b"garbage")
    size = path.stat().st_size
    with FsStore(store.root) as writer, pytest.raises(CorruptLog, match=str(path)):
        _append(writer, ref, "c")
    assert path.stat().st_size == size


# --------------------------------------------------------------------------- versions


@pytest.mark.parametrize(
    "future",
    [
        {"v": 2, "seq": 2, "ts": TS, "kind": "item", "item": {"role": "user", "content": "x"}},
        {"v": 2, "sequence": 2, "type": "something new"},
    ],
    ids=["v2 entry", "v2 entry with a new envelope"],
)
def test_a_line_from_a_newer_format_says_to_upgrade(
    store: FsStore, ref: PodActiveSegmentRef, future: dict[str, Any]
) -> None:
    """A line with a newer major version is refused with FormatVersionError: upgrade."""
    _append(store, ref, "a")
    path = _path(store, ref)
    with path.open("ab") as out:
        out.write(codec.encode_line(future))
    with pytest.raises(FormatVersionError) as caught:
        restore(store, CONTEXT)
    message = str(caught.value)
    assert message.startswith(f"{path}:3: ")
    assert "newer" in message.removeprefix(str(path)) and "upgrade" in message
    assert "\n" not in message


def test_a_newer_header_says_to_upgrade(store: FsStore, ref: PodActiveSegmentRef) -> None:
    """Even the header line's version is checked."""
    path = _path(store, ref)
    header = codec.decode(_stored_line(path, 1))
    _rewrite_line(path, 1, codec.encode({**header, "v": 3}))
    with pytest.raises(FormatVersionError, match="upgrade"):
        restore(store, CONTEXT)


# --------------------------------------------------------------------------- full disk


def test_a_short_write_at_the_file_size_limit_is_rolled_back(
    store: FsStore, ref: PodActiveSegmentRef
) -> None:
    """RLIMIT_FSIZE cuts a big append short: StoreError, file back to its size, no half line."""
    _append(store, ref, "a", "b")
    path = _path(store, ref)
    before = path.read_bytes()
    with Child("fsize", root=str(store.root), context=CONTEXT, room=5000, size=200_000) as child:
        [result] = child.finish()
    assert result["before"] == len(before)
    assert result["error"] is not None
    assert result["error"].startswith("StoreError: append to segment")
    assert "\n" not in result["error"]
    assert result["after_failure"] == len(before)
    assert result["seq"] == 3  # the next append, which fits, gets the next seq
    assert path.read_bytes().startswith(before)
    state = restore(store, CONTEXT)
    assert _contents(state) == ["a", "b", "x" * 10]
    assert state.torn == []
    assert _side_files(path) == {}


@pytest.mark.parametrize(
    ("code", "says"), [(errno.ENOSPC, "the disk is full"), (errno.EDQUOT, "the disk is full")]
)
def test_a_full_disk_mid_write_leaves_no_half_line(
    store: FsStore, ref: PodActiveSegmentRef, monkeypatch: pytest.MonkeyPatch, code: int, says: str
) -> None:
    """A write that stops half way with ENOSPC is rolled back; the message says the disk is full."""
    _append(store, ref, "a")
    path = _path(store, ref)
    before = path.read_bytes()
    real_write = os.write
    failures = []

    def half_then_full(fd: int, data: Any) -> int:
        if failures:
            return real_write(fd, data)
        failures.append(fd)
        real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fs_module.os, "write", half_then_full)
    with pytest.raises(StoreError) as caught:
        _append(store, ref, "b" * 10_000, "c")
    message = str(caught.value)
    assert says in message and str(ref.segment_id) in message
    assert "\n" not in message
    assert path.read_bytes() == before
    monkeypatch.undo()

    assert _append(store, ref, "d") == 2
    state = restore(store, CONTEXT)
    assert _contents(state) == ["a", "d"]
    assert state.torn == []


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_blob_write_on_a_full_disk_is_a_store_error(
    store: FsStore, ref: PodActiveSegmentRef, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """A blob that cannot be written (the disk full half way) is a one-line StoreError naming
    the blob and the full disk, from ``put_blob`` and from an append that offloads a large
    string; nothing half written is left, and the same put succeeds once there is room."""
    data = b"large output " * 20_000  # over the default blob threshold
    real_write = os.write

    def full(fd: int, chunk: Any) -> int:
        real_write(fd, bytes(chunk)[: len(chunk) // 2])
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fs_module.os, "write", full)
    for attempt in (
        lambda: store.put_blob(data),
        lambda: save_user_input(store, ref, data.decode()),
    ):
        with pytest.raises(StoreError) as caught:
            attempt()
        message = str(caught.value)
        assert type(caught.value) is StoreError and not isinstance(caught.value, OSError)
        assert "the disk is full" in message and "blob" in message and "\n" not in message
    monkeypatch.undo()
    assert [p.name for p in (store.root / ".blobs").rglob("*") if p.is_file()] == []
    assert restore(store, CONTEXT).history == []
    digest = store.put_blob(data)
    assert store.get_blob(digest) == data


def test_a_short_write_is_completed_into_one_whole_line(
    store: FsStore, ref: PodActiveSegmentRef, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that takes only part of the line (a signal, a nearly full disk) is followed by
    the rest, under the same lock: the append succeeds, its line whole, the next seq next."""
    _append(store, ref, "a")
    real_write = os.write
    calls: list[int] = []

    def half_first(fd: int, data: Any) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data)[: len(data) // 2])
        return real_write(fd, data)

    monkeypatch.setattr(fs_module.os, "write", half_first)
    assert _append(store, ref, "b" * 1000) == 2
    monkeypatch.undo()
    assert len(calls) == 2 and calls[1] == calls[0] - calls[0] // 2
    assert _append(store, ref, "c") == 3
    state = restore(store, CONTEXT)
    assert _contents(state) == ["a", "b" * 1000, "c"]
    assert state.torn == []


# --------------------------------------------------------------------------- SIGKILL


@pytest.mark.parametrize("rounds", [12, pytest.param(30, marks=pytest.mark.slow)])
def test_acknowledged_appends_survive_repeated_sigkills(
    store: FsStore, ref: PodActiveSegmentRef, rounds: int
) -> None:
    """Kill a writer at random points, ``rounds`` times: every acked entry is there once, in
    order.

    Each round starts a new writer process on the same context; it acknowledges each append on
    a pipe, and the parent kills it after a random number of acks. A torn tail left by a kill
    is reported by the parent's restore (which changes nothing) and set aside by the next
    writer's first append, or at the end as ``fsck --repair`` does.
    """
    rng = random.Random(20261122)
    path = _path(store, ref)
    acked: list[str] = []
    observed: list[tuple[int, bytes]] = []  # torn tails seen after a kill: (end, bytes)
    reported: list[TornTail] = []
    for round_number in range(rounds):
        with Child(
            "appender", root=str(store.root), context=CONTEXT, round=round_number, seed=round_number
        ) as child:
            for _ in range(rng.randint(1, 12)):
                acked.extend(child.read()["tags"])
            for message in child.kill():
                acked.extend(message["tags"])
        data = path.read_bytes()
        complete, tail = codec.split_complete(data)
        if tail:
            observed.append((len(data), tail))
        if round_number % 2:
            state = restore(store, CONTEXT)
            if tail:
                [torn] = state.torn
                assert (torn.offset, torn.size) == (len(complete), len(tail))
                assert torn.set_aside_to is None
                assert path.read_bytes() == data
                reported.append(torn)
            else:
                assert state.torn == []

    store.set_aside_torn_tail(ref.session_id, ref.segment_id)
    state = restore(store, CONTEXT)
    entries = store.read_segment(ref.session_id, ref.segment_id).entries
    tags = [entry["tag"] for entry in entries]
    assert len(tags) == len(set(tags)), "an entry was written twice"
    acked_set = set(acked)
    assert [tag for tag in tags if tag in acked_set] == acked, "an acked entry is lost or moved"
    batches: dict[str, list[str]] = {}
    for entry in entries:
        batches.setdefault(entry["batch"], []).append(entry["tag"])
        assert len(entry["item"]["content"]) in (200_000, *range(10, 3001))
    counts = {entry["batch"]: entry["count"] for entry in entries}
    for batch, members in batches.items():
        assert members == [f"{batch}.{i}" for i in range(counts[batch])], f"{batch} is partial"
    # Every torn tail a kill left is in a side file, whole, ending where the file ended.
    sides = [
        (int(p.name.rsplit("-", 1)[1].split(".")[0]), p.read_bytes())
        for p in path.parent.glob("*.torn-*")
    ]
    for end, tail in observed:
        assert any(start + len(data) == end and data.endswith(tail) for start, data in sides), (
            f"the torn tail ending at {end} was not set aside"
        )
    assert len(sides) == len(observed)
    assert state.torn == []
    assert path.read_bytes().endswith(b"\n")
    assert len(reported) <= len(observed)


def test_blank_lines_are_skipped_by_restore_and_reported_by_fsck(
    store: FsStore, ref: PodActiveSegmentRef
) -> None:
    """A blank line holds no entry: restore loses nothing over it; fsck names its line."""
    from click.testing import CliRunner

    from terrarium.cli import cli

    for text in "abcd":
        _append(store, ref, text, nums=[1, 2])
    path = _path(store, ref)
    before = restore(store, CONTEXT)
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join([*lines[:3], b"", *lines[3:]]))  # a blank line 4
    after = restore(store, CONTEXT)
    assert after.history == before.history and after.next_seq == before.next_seq
    result = CliRunner().invoke(cli, ["fsck", "--storage-dir", str(store.root)])
    assert result.exit_code == 1
    assert f"{path}:4:" in result.output
    # and a real corruption after it is still named by its own line in the file
    lines = path.read_bytes().split(b"\n")
    lines[5] = b"not json"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(CorruptLog, match=f"{re.escape(str(path))}:6: not valid JSON"):
        restore(store, CONTEXT)
