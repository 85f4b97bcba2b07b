"""Migration of a legacy sessions folder: dry run, real run, interruption, import into the log."""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from terrarium import sessions
from terrarium.formats import terrarium_json as tj
from terrarium.migrate import migrate, plan_migration
from terrarium.model import ContextId
from terrarium.stores._files import leftovers, write_atomic
from terrarium.stores.fs import FsStore

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "migrate_sessions.py"
TYPES = ("cli", "irc", "game", "web")
ODD = ("#chan{}", "user {}", "café ☕ {}", "π{}", "main{}", "a:b{}", "CON{}", " pad{} ")
MTIME = dt.datetime(2024, 2, 29, 8, 0, 0, 123456, tzinfo=dt.UTC)


@dataclass
class Legacy:
    """One legacy file the tree holds, and what the migration must make of it."""

    type: str
    name: str
    data: dict[str, Any]
    """The JSON as written."""
    date: str
    """The date folder it must end up in."""
    moves: bool


def _messages(i: int, stamped: bool) -> list[dict[str, Any]]:
    out = []
    for k in range(i % 4):
        message: dict[str, Any] = {"role": ("user", "assistant")[k % 2], "content": f"m{i}.{k} ✓"}
        if stamped:
            message["timestamp"] = f"2025-{1 + i % 12:02d}-{1 + k:02d}T10:00:0{k}.5+02:00"
        out.append(message)
    return out


def build_tree(root: Path, *, flat: int = 220, top: int = 50, dated: int = 50) -> list[Legacy]:
    """A legacy sessions folder: flat, top-level and dated files, odd names, missing fields.

    Plus one broken file (``cli/broken.json``) and one native context.
    """
    made: list[Legacy] = []
    mtime_ns = int(MTIME.timestamp()) * 10**9 + 123_456_000
    for i in range(flat + top + dated):
        ctype = TYPES[i % len(TYPES)]
        name = ODD[i % len(ODD)].format(i)
        variant = i % 5
        created = f"2025-{1 + i % 12:02d}-{1 + i % 28:02d}T23:59:59.000001"
        data: dict[str, Any] = {"session_id": name, "context_type": ctype}
        data["system_prompt"] = f"prompt {i}"
        data["messages"] = _messages(i, stamped=variant != 2)
        meta: dict[str, Any] = {
            "created_at": created,
            "last_active": created,
            "message_count": len(data["messages"]),
            "session_id": name,
            "context_type": ctype,
        }
        if variant == 1:  # no created_at: the first message's time, else the file's
            del meta["created_at"]
        if variant == 2:  # no metadata at all, no message times: the file's time
            meta = {}
        if variant == 3:  # the type only in the folder
            del data["context_type"]
            del meta["context_type"]
        if meta:
            data["metadata"] = meta
        moves = i < flat + top
        if i < flat:
            path = root / ctype / f"{name}.json"
        elif i < flat + top:
            if variant == 3:
                data["context_type"] = ctype  # a top-level file must name its type
            path = root / f"{name}.json"
        else:
            meta["session_date"] = created[:10]
            data["metadata"] = meta
            path = root / ctype / created[:10] / f"{name}.json"
        if not moves:
            date = created[:10]
        elif "created_at" in meta:
            date = meta["created_at"][:10]
        elif data["messages"] and "timestamp" in data["messages"][0]:
            date = data["messages"][0]["timestamp"][:10]
        else:
            date = MTIME.date().isoformat()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
        os.utime(path, ns=(mtime_ns, mtime_ns))
        made.append(Legacy(ctype, name, data, date, moves))
    (root / "cli" / "broken.json").write_text('{"session_id": "broken", "messages": [', "utf-8")
    store = FsStore(root)
    sessions.create_segment(store, context="cli:native-one")
    store.close()
    return made


def tree_hash(root: Path) -> str:
    """A hash of every path, file content and modification time under ``root``."""
    digest = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files):
            path = Path(folder) / name
            digest.update(str(path.relative_to(root)).encode("utf-8", "surrogateescape"))
            digest.update(path.read_bytes())
            digest.update(str(path.stat().st_mtime_ns).encode())
        digest.update(folder.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def check_migrated(root: Path, made: list[Legacy]) -> None:
    """Every session exactly once, in its date folder, with its content intact."""
    found: dict[tuple[str, str], list[Path]] = {}
    for path in tj.iter_legacy_files(root):
        if path.name == "broken.json":
            continue
        session = tj.load(path, root=root)
        found.setdefault((session.context_type, session.session_id), []).append(path)
    assert len(found) == len(made)
    for legacy in made:
        (path,) = found[(legacy.type, legacy.name)]
        assert path == root / legacy.type / legacy.date / f"{legacy.name}.json"
        data = json.loads(path.read_text("utf-8"))
        assert data["system_prompt"] == legacy.data["system_prompt"]
        assert [(m["role"], m["content"]) for m in data["messages"]] == [
            (m["role"], m["content"]) for m in legacy.data["messages"]
        ]
        for original, moved in zip(legacy.data["messages"], data["messages"], strict=True):
            if "timestamp" in original:
                assert moved["timestamp"] == original["timestamp"]
        assert data["metadata"]["session_date"] == legacy.date
        for key, value in legacy.data.get("metadata", {}).items():
            assert data["metadata"][key] == value
    assert not list(root.rglob(".tmp-*"))
    assert (root / "cli" / "broken.json").exists()


# --------------------------------------------------------------------------- runs


def test_dry_run_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    made = build_tree(root)
    before = tree_hash(root)
    out = io.StringIO()
    report = migrate(root, dry_run=True, to_log=True, out=out)
    assert tree_hash(root) == before
    moving = sum(legacy.moves for legacy in made)
    assert (report.moved, report.imported, report.skipped, report.failed) == (
        moving,
        len(made),
        0,
        1,
    )
    lines = out.getvalue().splitlines()
    assert lines[-1] == report.summary()
    assert lines[-1].startswith("dry run, nothing changed: would move 270")
    assert any(line.startswith("failed cli/broken.json: not valid JSON") for line in lines)
    assert report.exit_code == 1
    report = migrate(root, dry_run=True, out=io.StringIO())
    assert (report.moved, report.imported, report.skipped, report.failed) == (270, 0, 50, 1)
    assert tree_hash(root) == before


def test_migration_moves_everything_and_reports_the_broken_file(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    made = build_tree(root)
    native = (root / ".index").exists(), tree_hash(root / ".index")
    out = io.StringIO()
    report = migrate(root, out=out)
    assert (report.moved, report.imported, report.skipped, report.failed) == (270, 0, 50, 1)
    assert report.failures == [
        "cli/broken.json: not valid JSON (Expecting value at line 1 column 39)"
    ]
    assert report.exit_code == 1
    lines = out.getvalue().splitlines()
    assert len(lines) == len(made) + 2  # one per file, and the summary
    assert "moved cli/#chan0.json -> cli/2025-01-01/#chan0.json" in lines
    check_migrated(root, made)
    assert (True, tree_hash(root / ".index")) == native  # the native store is untouched
    again = migrate(root, out=io.StringIO())
    assert (again.moved, again.skipped, again.failed) == (0, 320, 1)


def test_a_migrated_file_is_private_whatever_the_umask(tmp_path: Path) -> None:
    """A legacy file moved into its date folder is 0600, as every transcript terrarium writes."""
    root = tmp_path / "sessions"
    build_tree(root)
    old = os.umask(0o022)
    try:
        migrate(root, out=io.StringIO())
    finally:
        os.umask(old)
    moved = root / "cli" / "2025-01-01" / "#chan0.json"
    assert moved.stat().st_mode & 0o777 == 0o600


def test_a_killed_run_finishes_on_rerun(tmp_path: Path) -> None:
    """SIGKILL after K progress lines, run again: every session once, content intact."""
    root = tmp_path / "sessions"
    made = build_tree(root)
    read_end, write_end = os.pipe()
    # A small pipe keeps the child at most a few lines ahead of what we read, so it is
    # still migrating when it is killed.
    fcntl.fcntl(write_end, 1031, 4096)  # F_SETPIPE_SZ
    with (tmp_path / "stderr").open("wb") as err:
        child = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--storage-dir", str(root)],
            stdout=write_end,
            stderr=err,
            cwd=tmp_path,
        )
    os.close(write_end)
    with os.fdopen(read_end, encoding="utf-8") as progress:
        seen = [progress.readline() for _ in range(100)]
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert all(line.endswith("\n") for line in seen)
    moved_before = sum(line.startswith("moved ") for line in seen)
    assert moved_before > 0
    flat_left = [p for p in tj.iter_legacy_files(root) if len(p.relative_to(root).parts) < 3]
    assert len(flat_left) > 1  # more than the broken file: it was interrupted
    rerun = subprocess.run(
        [sys.executable, str(SCRIPT), "--storage-dir", str(root)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert rerun.returncode == 1, rerun.stderr
    summary = rerun.stdout.splitlines()[-1]
    moved = int(summary.split(",")[0].removeprefix("moved "))
    assert 0 < moved <= 270 - moved_before
    assert summary.endswith("failed 1")
    check_migrated(root, made)


def test_rerun_after_a_crash_between_write_and_remove(tmp_path: Path) -> None:
    """A destination already written is recognised; a leftover temporary file is removed."""
    root = tmp_path / "sessions"
    source = root / "cli" / "main.json"
    source.parent.mkdir(parents=True)
    data = {
        "session_id": "main",
        "context_type": "cli",
        "system_prompt": "",
        "messages": [],
        "metadata": {"created_at": "2025-11-06T14:30:00.123456"},
    }
    source.write_text(json.dumps(data))
    (step,) = plan_migration(root)
    assert step.destination == root / "cli" / "2025-11-06" / "main.json"
    assert step.session is not None
    step.destination.parent.mkdir()
    step.destination.write_bytes(tj.dumps(step.session).encode())
    with pytest.MonkeyPatch.context() as patch:  # die after the temp file, before the rename
        patch.setattr(os, "replace", _die)
        patch.setattr(os, "unlink", _die)
        with pytest.raises(KeyboardInterrupt):
            write_atomic(step.destination, b"half", sync=True)
    (leftover,) = leftovers(step.destination)
    assert leftover.read_bytes() == b"half"
    assert step.destination.read_bytes() != b"half"
    assert [s.source for s in plan_migration(root)] == [source]  # not the destination too
    report = migrate(root, to_log=True, out=io.StringIO())
    assert (report.moved, report.imported, report.skipped, report.failed) == (1, 1, 0, 0)
    assert not source.exists() and not leftover.exists()
    assert tj.load(step.destination).metadata.session_date == "2025-11-06"


def _die(*args: object, **kwargs: object) -> None:
    raise KeyboardInterrupt


def test_a_different_destination_is_a_conflict_and_is_kept(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    (root / "cli" / "2025-11-06").mkdir(parents=True)
    source = root / "cli" / "main.json"
    source.write_text('{"messages": [], "metadata": {"created_at": "2025-11-06T10:00:00"}}')
    other = root / "cli" / "2025-11-06" / "main.json"
    other.write_text('{"messages": [{"role": "user", "content": "other"}]}')
    twin = root / "main.json"  # a top-level file that would land in the same place
    twin.write_text(
        '{"context_type": "cli", "messages": [], "metadata": {"session_date": "2025-11-07"}}'
    )
    (root / "cli" / "2025-11-07").mkdir()
    (root / "cli" / "2025-11-07" / "main.json").write_text(tj.dumps(tj.load(twin, root=root)))
    before = other.read_bytes()
    out = io.StringIO()
    report = migrate(root, out=out)
    assert report.failed == 1 and report.exit_code == 1
    assert (
        "cli/main.json: cli/2025-11-06/main.json exists with different content"
        in (report.failures[0])
    )
    assert source.exists() and other.read_bytes() == before
    assert not twin.exists()  # its destination held exactly what it would write


def test_to_log_imports_once(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    made = build_tree(root, flat=30, top=10, dated=10)
    report = migrate(root, to_log=True, out=io.StringIO())
    assert (report.moved, report.imported, report.skipped, report.failed) == (40, 50, 0, 1)
    store = FsStore(root)
    try:
        for legacy in made:
            context = ContextId(legacy.type, legacy.name)
            path = root / legacy.type / legacy.date / f"{legacy.name}.json"
            assert tj.export_dict(store, context) == tj.dump(tj.load(path, root=root))
            head = store.get_head(context)
            assert head is not None
            header = store.read_segment(head.session_id, head.segment_id).header
            assert header["origin"] == {"kind": "import", "source": str(path.absolute())}
        contexts = len(store.list_contexts())
    finally:
        store.close()
    assert contexts == len(made) + 1
    before = tree_hash(root)
    again = migrate(root, to_log=True, out=io.StringIO())
    assert (again.moved, again.imported, again.skipped, again.failed) == (0, 0, 50, 1)
    assert tree_hash(root) == before


def test_to_log_imports_the_newest_copy(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    for day, text in (("2025-11-05", "old"), ("2025-11-07", "new"), ("2025-11-06", "mid")):
        path = root / "cli" / day / "main.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"messages": [{"role": "user", "content": text}]}))
    out = io.StringIO()
    report = migrate(root, to_log=True, out=out)
    assert (report.imported, report.skipped) == (1, 2)
    store = FsStore(root)
    assert sessions.restore(store, "cli:main").history == [{"role": "user", "content": "new"}]
    store.close()
    assert "an older copy of cli:main (cli/2025-11-07/main.json)" in out.getvalue()


def test_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    root = tmp_path / "sessions"
    build_tree(root, flat=5, top=0, dated=0)
    out = Terminal()
    report = migrate(root, out=out)
    assert report.moved == 5
    text = out.getvalue()
    assert "moved 5, imported 0, skipped 0, failed 1" in text
    assert "failed cli/broken.json" in text
    assert "\x1b[" in text  # drawn by rich


def test_script_usage(tmp_path: Path) -> None:
    missing = subprocess.run(
        [sys.executable, str(SCRIPT), "--storage-dir", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"error: no sessions folder at {tmp_path / 'nope'}"
    empty = tmp_path / "sessions"
    empty.mkdir()
    ok = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines() == [
        "dry run, nothing changed: would move 0, would import 0, skipped 0, failed 0"
    ]


def test_script_runs_from_a_plain_checkout(tmp_path: Path) -> None:
    """Without the package installed, the script finds it in ``src/``."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, checkout / "scripts")
    shutil.copytree(SCRIPT.parent.parent / "src" / "terrarium", checkout / "src" / "terrarium")
    (tmp_path / "sessions").mkdir()
    # -S skips site-packages and its .pth files (the editable install); PYTHONPATH gives back
    # the third-party packages alone.
    env = dict(os.environ, PYTHONPATH=sysconfig.get_paths()["purelib"])
    result = subprocess.run(
        [sys.executable, "-S", str(checkout / "scripts" / "migrate_sessions.py"), "--dry-run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("dry run, nothing changed")
    blocked = subprocess.run(
        [sys.executable, "-S", "-c", "import terrarium"], env=env, capture_output=True, check=False
    )
    assert blocked.returncode != 0  # so the script did use its src/ fallback


@pytest.mark.parametrize("layout", ["flat", "top"])
def test_plan_names_each_step(tmp_path: Path, layout: str) -> None:
    root = tmp_path / "sessions"
    path = root / "irc" / "#python.json" if layout == "flat" else root / "#python.json"
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps(
            {
                "context_type": "irc",
                "messages": [{"role": "user", "content": "x", "timestamp": "2025-11-06T01:00Z"}],
            }
        )
    )
    (step,) = plan_migration(root)
    assert step.moves and step.problem is None
    assert step.context == ContextId("irc", "#python")
    assert step.destination == root / "irc" / "2025-11-06" / "#python.json"


def test_a_link_out_of_the_folder_is_neither_read_nor_written_through(tmp_path: Path) -> None:
    """A legacy file that is a link out of the sessions folder is not read, and a date folder
    that is one is not written into: each is a one-line failure, and what lies outside stays
    exactly as it was."""
    root = tmp_path / "sessions"
    outside = tmp_path / "outside"
    (outside / "dated").mkdir(parents=True)
    secret = outside / "secret.json"
    secret.write_text('{"messages": [{"role": "user", "content": "private"}]}')
    (root / "cli").mkdir(parents=True)
    (root / "cli" / "secret.json").symlink_to(secret)
    flat = root / "irc" / "main.json"
    flat.parent.mkdir()
    flat.write_text('{"messages": [], "metadata": {"session_date": "2025-11-06"}}')
    (root / "irc" / "2025-11-06").symlink_to(outside / "dated", target_is_directory=True)
    before = tree_hash(outside)
    report = migrate(root, to_log=True, out=io.StringIO())
    assert report.failed == 2 and report.exit_code == 1
    assert all("outside" in line and "\n" not in line for line in report.failures)
    assert tree_hash(outside) == before
    assert flat.exists() and (root / "cli" / "secret.json").is_symlink()
    with FsStore(root) as store:
        assert store.get_head(ContextId.parse("cli:secret")) is None
