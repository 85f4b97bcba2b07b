"""A full disk (a real one: a small tmpfs filled to the last byte) under the commands and
routes around the log: what was acknowledged stays whole and readable, nothing is left half
written, and the same command or request succeeds once there is room again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from helpers.disk import fill, small_tmpfs
from helpers.history import add_context
from terrarium import FsStore
from terrarium.cli import cli


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "disk") as folder:
        yield folder


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_an_export_to_a_full_disk_leaves_the_old_file_whole(tmp_path: Path, disk: Path) -> None:
    """``export -o FILE`` on a full disk fails in one line naming the file, and leaves the
    file it would replace as it was (not truncated), and no new file half written."""
    storage = tmp_path / "sessions"
    with FsStore(storage) as store:
        add_context(store, "cli:a", *[f"line {n} " + "x" * 200 for n in range(40)])
    old = disk / "a.jsonl"
    assert _run("--storage-dir", str(storage), "export", "cli:a", "-o", str(old))[0] == 0
    before = old.read_bytes()
    with FsStore(storage) as store:
        add_context(store, "cli:b", *[f"more {n} " + "y" * 400 for n in range(40)])
    filler = fill(disk)
    for target, kept in ((old, before), (disk / "new.jsonl", None)):
        code, output = _run("--storage-dir", str(storage), "export", "cli:b", "-o", str(target))
        assert code == 1 and "No space left on device" in output and target.name in output
        assert len(output.strip().splitlines()) == 1
        assert (target.read_bytes() if target.exists() else None) == kept
    assert sorted(p.name for p in disk.iterdir()) == ["a.jsonl", "filler"]
    filler.unlink()
    assert _run("--storage-dir", str(storage), "export", "cli:b", "-o", str(old))[0] == 0
    assert old.read_bytes().count(b"more") == 40
