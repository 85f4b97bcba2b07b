"""Search and listing at the edges: a locked, read-only, full or damaged store.

* A search index locked by another process is waited for, then read around; never deleted.
* ``terrarium list`` and ``terrarium search`` work on a read-only store (run as an unprivileged
  user over files it owns but cannot write: root ignores file modes) and on a full disk (a
  small tmpfs), and never miss an acknowledged entry: what an index cannot catch up with is
  read from the log. The gateway's GET endpoints and the dashboard's live view answer there
  too: ``FsStore.next_seq`` counts the lines of a log it cannot open for writing.
* ``list`` shows a damaged context as damaged, naming the file, and lists everything else.
* Every file and folder the indexes create is private, whatever the umask.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.disk import fill, small_tmpfs
from helpers.legacy_tree import write_legacy
from terrarium import ContextId, FsStore, index
from terrarium.errors import StoreError
from terrarium.index import _index as fs_search
from terrarium.index import listing as lister
from terrarium.index import of
from terrarium.index._index import SearchIndex
from terrarium.search import search
from terrarium.sessions import create_segment, save_delta
from terrarium.stores.fs._changes import dirty_dir
from terrarium.stores.sqlite import SqliteStore

# --------------------------------------------------------------------------- helpers


def _add(store: Any, context: str, *texts: str) -> None:
    """Create ``context`` unless it exists, then log ``texts`` as user messages."""
    ctx = ContextId.parse(context)
    if store.get_head(ctx) is None:
        create_segment(store, None, context=context)
    head = store.get_head(ctx)
    assert head is not None
    save_delta(store, head, [{"role": "user", "content": text} for text in texts])


def _cli(*args: str, unprivileged: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``terrarium ARGS`` in a child process; if ``unprivileged``, without the
    capabilities that let root ignore file modes (see :func:`_drop_dac`)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TERRARIUM_")}
    environ["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "terrarium.cli", *args],
        capture_output=True,
        text=True,
        env=environ,
        cwd="/",
        preexec_fn=_drop_dac if unprivileged else None,
        timeout=300,
        check=False,
    )


def _ok(result: subprocess.CompletedProcess[str]) -> Any:
    """The JSON a successful command printed; its stderr holds no traceback."""
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)


def _snippets(result: subprocess.CompletedProcess[str]) -> set[str]:
    return {hit["snippet"] for hit in _ok(result)["hits"]}


def _counts(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    return {row["context_id"]: row["message_count"] for row in _ok(result)["contexts"]}


# --------------------------------------------------------------------------- mechanisms

# linux/capability.h and linux/prctl.h
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH, _CAP_FOWNER, _PR_CAPBSET_DROP = 1, 2, 3, 24


def _drop_dac() -> None:
    """In a child before ``exec``: drop the capabilities that let root read, write and
    search any file whatever its mode. The program it runs is then held to the modes like any
    user: a folder ``0500`` and a file ``0400`` are read-only to it. (Running as ``nobody``
    instead does not work here: the interpreter lives under ``/root``, which is ``0700``.)"""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH, _CAP_FOWNER):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


@pytest.fixture(params=["modes", "ro mount"])
def read_only(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A function that makes a folder read-only for the commands ``_cli`` runs and returns
    (the path to give them, whether to run them ``unprivileged``).

    ``modes``: folders 0500 and files 0400, and the command runs without the capabilities
    that let root ignore them. ``ro mount``: a read-only bind mount of the folder (``EROFS``
    holds for root too).
    """
    if os.geteuid() != 0:
        pytest.skip("needs root, to drop capabilities or to mount")
    mounts: list[Path] = []

    def make(folder: Path) -> tuple[Path, bool]:
        if request.param == "modes":
            for item in [folder, *folder.rglob("*")]:
                item.chmod(0o500 if item.is_dir() else 0o400)
            target, unprivileged = folder, True
        else:
            target, unprivileged = tmp_path / "ro-mount", False
            target.mkdir()
            for command in (
                ["mount", "--bind", str(folder), str(target)],
                ["mount", "-o", "remount,ro,bind", str(target)],
            ):
                done = subprocess.run(command, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    pytest.skip(f"cannot bind-mount read-only here: {done.stderr.strip()}")
                if not mounts:
                    mounts.append(target)
        probe = subprocess.run(
            ["touch", str(target / "probe")],
            preexec_fn=_drop_dac if unprivileged else None,
            capture_output=True,
            check=False,
        )
        assert probe.returncode != 0, "the read-only mechanism does not work here"
        return target, unprivileged

    try:
        yield make
    finally:
        for mount in mounts:
            subprocess.run(["umount", str(mount)], check=False)
        for item in [tmp_path, *tmp_path.rglob("*")]:  # so that pytest can remove them
            if item.is_dir():
                with contextlib.suppress(OSError):
                    item.chmod(0o700)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, so that a test can fill its disk."""
    with small_tmpfs(tmp_path / "tmpfs") as mount:
        yield mount


# --------------------------------------------------------------------------- 6: locks


@contextlib.contextmanager
def _holding(script: str, db: Path) -> Iterator[None]:
    """Run ``script`` on ``db`` in another process while the block runs (it prints "held")."""
    with subprocess.Popen(
        [sys.executable, "-c", script, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdin is not None and holder.stdout is not None
        try:
            assert holder.stdout.readline() == "held\n"
            yield
        finally:
            holder.stdin.write("go\n")
            holder.stdin.close()
            holder.wait(timeout=60)


HOLD_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA locking_mode=EXCLUSIVE")  # no other connection may even read
conn.execute("BEGIN EXCLUSIVE")
conn.execute("INSERT OR REPLACE INTO meta VALUES ('held', '1')")
print("held", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
"""


def test_an_index_locked_by_another_process_is_waited_for_never_deleted(tmp_path: Path) -> None:
    """While another process holds search.db's lock, a search waits BUSY_TIMEOUT, then
    answers from the log (finding an entry the index has not read); search.db survives."""
    root = tmp_path / "sessions"
    with FsStore(root) as store:
        _add(store, "cli:main", "an early walrus")
        assert len(search(store, "walrus")) == 1  # the index exists and holds it
        _add(store, "cli:main", "a late walrus")  # marked, not yet indexed
    db = root / ".index" / fs_search.DB_NAME
    ino = db.stat().st_ino
    with _holding(HOLD_LOCK, db):
        searcher = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from terrarium.index import _index as fs_search; "
                "fs_search.BUSY_TIMEOUT = 0.5; from terrarium.cli import cli; "
                "cli(sys.argv[1:])",
                "search",
                "walrus",
                "--json",
                "--storage-dir",
                str(root),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert _snippets(searcher) == {"an early walrus", "a late walrus"}
        assert "busy" in searcher.stderr and "corrupt" not in searcher.stderr
        assert db.stat().st_ino == ino
    with FsStore(root) as store:  # the same file serves again, and catches up
        assert {hit.snippet for hit in of(store).search(_query("walrus"))} == {
            "an early walrus",
            "a late walrus",
        }
    assert db.stat().st_ino == ino


HOLD_READ = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN")
conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # a shared lock, rollback mode
print("held", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
"""


def test_a_wal_switch_that_meets_a_reader_is_retried_never_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search.db still in rollback mode, read by another process: switching it to WAL
    is refused at once ("database is locked", without SQLite's busy handler), so it is
    retried until ``BUSY_TIMEOUT`` and the files answer; the file is never deleted."""
    root = tmp_path / "sessions"
    with FsStore(root) as store:
        _add(store, "cli:main", "a walrus")
    db = root / ".index" / fs_search.DB_NAME
    sqlite3.connect(db).close()  # an empty database: rollback mode, as a racing opener left it
    ino = db.stat().st_ino
    monkeypatch.setattr(fs_search, "BUSY_TIMEOUT", 0.5)
    with _holding(HOLD_READ, db), FsStore(root) as store:
        assert [hit.snippet for hit in search(store, "walrus")] == ["a walrus"]
        assert db.stat().st_ino == ino
    with FsStore(root) as store:  # the reader gone, the same file becomes the index
        assert [hit.snippet for hit in of(store).search(_query("walrus"))] == ["a walrus"]
    assert db.stat().st_ino == ino


def _query(text: str) -> Any:
    from terrarium.index._query import SearchQuery

    return SearchQuery(text)


# --------------------------------------------------------------------------- 9: read-only


@pytest.mark.parametrize("index", ["current", "behind", "missing"])
def test_a_read_only_fs_store_lists_and_searches(
    index: str, read_only: Any, tmp_path: Path
) -> None:
    """A store that cannot be written: list and search answer, with every entry, whether its
    index is current (read read-only), behind the files or missing (the files are read)."""
    root = tmp_path / "sessions"
    with FsStore(root) as store:
        _add(store, "cli:main", "an early walrus", "a reply")
        _add(store, "irc:#python", "no animals here")
        if index != "missing":
            assert len(search(store, "walrus")) == 1
        if index == "behind":
            _add(store, "cli:main", "a late walrus")
    if index == "missing":
        (root / ".index" / fs_search.DB_NAME).unlink(missing_ok=True)
    where, unprivileged = read_only(root)
    expected = {"an early walrus"} | ({"a late walrus"} if index == "behind" else set())
    found = _cli(
        "search", "walrus", "--json", "--storage-dir", str(where), unprivileged=unprivileged
    )
    assert _snippets(found) == expected
    listed = _cli("list", "--json", "--storage-dir", str(where), unprivileged=unprivileged)
    assert _counts(listed) == {"cli:main": 1 + len(expected), "irc:#python": 1}
    if index == "current":  # served by the index itself, silently
        assert found.stderr == "" and listed.stderr == ""
    else:
        assert "read-only" in found.stderr and "corrupt" not in found.stderr


def test_a_legacy_file_added_beside_a_read_only_store_is_counted_by_list_and_stats(
    read_only: Any, tmp_path: Path
) -> None:
    """A legacy file put beside a read-only store after its index was last written: the
    index cannot take its row, so ``stats`` reads a walked index, and counts it as ``list``
    does (it was missing from ``stats``' totals while ``list`` showed it)."""

    root = tmp_path / "sessions"
    with FsStore(root) as store:
        _add(store, "cli:main", "a walrus", "a reply")
    assert _ok(_cli("stats", "--json", "--storage-dir", str(root)))["contexts"] == 1
    write_legacy(root, ["cli:old"])  # three messages
    where, unprivileged = read_only(root)
    listed = _cli("list", "--json", "--storage-dir", str(where), unprivileged=unprivileged)
    assert _counts(listed) == {"cli:main": 2, "cli:old": 3}
    stats = _ok(_cli("stats", "--json", "--storage-dir", str(where), unprivileged=unprivileged))
    assert (stats["contexts"], stats["messages"], stats["legacy"]) == (2, 5, 1)


def test_a_read_only_fs_store_marks_its_pins_and_writes_no_kept_records(
    read_only: Any, tmp_path: Path
) -> None:
    """The fs store keeps its lifecycle records in ``.index/records.json``; where it cannot
    write, ``list`` reads the records themselves, marks the pin, and leaves no file."""
    from terrarium.states import pin_context

    root = tmp_path / "sessions"
    with FsStore(root) as store:
        _add(store, "cli:main", "a walrus", "a reply")
        _add(store, "cli:other", "no animals here")
        pin_context(store, ContextId.parse("cli:main"))
    kept = root / ".index" / "records.json"
    kept.unlink(missing_ok=True)
    for folder in (root / ".states", root / ".detached"):  # older than a clock tick: kept
        if folder.is_dir():
            os.utime(folder, (1e9, 1e9))
    where, unprivileged = read_only(root)
    for _ in range(2):  # the second read too: nothing was kept by the first
        listed = _ok(_cli("list", "--json", "--storage-dir", str(where), unprivileged=unprivileged))
        pins = {row["context_id"]: row["pinned"] for row in listed["contexts"]}
        assert pins == {"cli:main": True, "cli:other": False}
    assert not kept.exists()


def _sqlite_store(path: Path, *, lag: bool) -> None:
    """A SqliteStore with two contexts; with ``lag``, entries its derived index has not read."""
    with SqliteStore(path) as store:
        _add(store, "cli:main", "an early walrus", "a reply")
        _add(store, "irc:#python", "no animals here")
        index.reindex(store)
        _, position = store.changes(None)
        if lag:
            _add(store, "cli:main", "a late walrus")
        assert bool(store.changes(position)[0]) == lag


LEAVE_WAL = """
import os, sys
from terrarium.stores.sqlite import SqliteStore
from terrarium.sessions import save_delta
store = SqliteStore(sys.argv[1])
head = store.get_head("cli:main")
save_delta(store, head, [{"role": "user", "content": "a late walrus"}])
os._exit(0)  # no checkpoint: the -wal and -shm files stay, as after a crash
"""


@pytest.mark.parametrize("state", ["clean", "lagging", "wal left"])
def test_a_read_only_sqlite_store_lists_and_searches(
    state: str, read_only: Any, tmp_path: Path
) -> None:
    """A database file (and folder) that cannot be written lists and searches every entry,
    including those its derived state has not read, and with a -wal file left behind."""
    folder = tmp_path / "db"
    _sqlite_store(folder / "terrarium.db", lag=state == "lagging")
    if state == "wal left":
        path = folder / "terrarium.db"
        subprocess.run([sys.executable, "-c", LEAVE_WAL, str(path)], check=True, timeout=120)
        assert Path(f"{path}-wal").stat().st_size > 0
    where, unprivileged = read_only(folder)
    url = f"sqlite://{where / 'terrarium.db'}"
    expected = {"an early walrus"} | ({"a late walrus"} if state != "clean" else set())
    found = _cli("search", "walrus", "--json", "--storage-dir", url, unprivileged=unprivileged)
    assert _snippets(found) == expected
    assert all(hit["score"] > 0 for hit in _ok(found)["hits"])
    listed = _cli("list", "--json", "--storage-dir", url, unprivileged=unprivileged)
    assert _counts(listed) == {"cli:main": 1 + len(expected), "irc:#python": 1}


@pytest.mark.parametrize("read_only", ["ro mount"], indirect=True)
@pytest.mark.parametrize("kind", ["fs current", "fs behind", "fs missing", "sqlite lagging"])
def test_the_dashboard_pages_a_read_only_store(kind: str, read_only: Any, tmp_path: Path) -> None:
    """On a store that cannot be written (a read-only mount: EROFS for root too), the
    sessions list's pages and the overview count every context and message, whether the
    index is current, behind the files, missing, or (SQLite) behind its entries: a page the
    index cannot answer comes from the whole listing, read from the files."""
    from starlette.testclient import TestClient

    from terrarium.stores.url import open_store
    from terrarium.web import create_app

    folder = tmp_path / "store"
    if kind.startswith("fs"):
        with FsStore(folder) as store:
            for n in range(5):
                _add(store, f"cli:c{n}", *["a walrus"] * (n + 1))
            if kind != "fs missing":
                assert len(lister(store).list_contexts_fast()) == 5  # the index built
            if kind == "fs behind":
                _add(store, "cli:c0", "late", "later")
        if kind == "fs missing":
            (folder / ".index" / fs_search.DB_NAME).unlink(missing_ok=True)
        counts = {f"cli:c{n}": n + 1 for n in range(5)} | {"cli:c0": 1 + 2 * (kind == "fs behind")}
    else:
        _sqlite_store(folder / "terrarium.db", lag=True)
        counts = {"cli:main": 3, "irc:#python": 1}
    where, _ = read_only(folder)
    url = str(where) if kind.startswith("fs") else f"sqlite://{where / 'terrarium.db'}"
    with open_store(url, create=False) as store:
        client = TestClient(create_app(store), base_url="http://127.0.0.1")
        seen: dict[str, int] = {}
        cursor = None
        while True:
            params = {"sort": "messages", "limit": "2", **({"cursor": cursor} if cursor else {})}
            page = client.get("/api/contexts", params=params).json()
            seen |= {row["context_id"]: row["message_count"] for row in page["contexts"]}
            if (cursor := page["next_cursor"]) is None:
                break
        assert seen == counts
        totals = client.get("/api/stats").json()["totals"]
        assert (totals["contexts"], totals["messages"]) == (len(counts), sum(counts.values()))


def test_a_read_only_sqlite_store_of_an_old_schema_says_so(read_only: Any, tmp_path: Path) -> None:
    """A read-only database that needs a migration is refused in one line, never migrated:
    here one whose first open was killed before ``m001_initial`` committed."""
    folder = tmp_path / "db"
    folder.mkdir()
    path = folder / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
    conn.close()
    where, unprivileged = read_only(folder)
    url = f"sqlite://{where / 'old.db'}"
    result = _cli("list", "--storage-dir", url, unprivileged=unprivileged)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "read-only" in lines[0] and "m001_initial" in lines[0]


# --------------------------------------------------------------------------- 9: full disk


def test_a_full_disk_is_named_and_the_fs_index_kept(tmpfs: Path) -> None:
    """On a full disk list and search answer from the log, say "disk full" (never
    "corrupt"), and leave the index file in place; with the index open, the same."""
    root = tmpfs / "sessions"
    with FsStore(root) as store:
        _add(store, "cli:main", "an early walrus")
        assert len(search(store, "walrus")) == 1
        _add(store, "cli:main", "a late walrus")
    db = root / ".index" / fs_search.DB_NAME
    ino = db.stat().st_ino
    fill(tmpfs)
    found = _cli("search", "walrus", "--json", "--storage-dir", str(root))
    assert _snippets(found) == {"an early walrus", "a late walrus"}
    listed = _cli("list", "--json", "--storage-dir", str(root))
    assert _counts(listed) == {"cli:main": 2}
    for result in (found, listed):
        assert "disk full" in result.stderr and "corrupt" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert db.stat().st_ino == ino
    (tmpfs / "filler").unlink()
    with FsStore(root) as store:  # an open index whose update meets a full disk
        assert len(search(store, "walrus")) == 2
        _add(store, "cli:main", "a third walrus")
        fill(tmpfs)
        assert {hit.snippet for hit in search(store, "third")} == {"a third walrus"}
        from terrarium.errors import IndexUnavailable

        with pytest.raises(IndexUnavailable, match="disk full"):
            lister(store).list_contexts_fast()  # the manager then restores each context
    assert db.stat().st_ino == ino


def test_a_full_disk_sqlite_store_reads_everything_and_names_the_full_disk(
    tmpfs: Path,
) -> None:
    """A SqliteStore on a full disk lists and searches every entry (including those its
    derived state could not catch up with), and an append fails in one line: disk full."""
    path = tmpfs / "terrarium.db"
    _sqlite_store(path, lag=True)
    fill(tmpfs)
    url = f"sqlite://{path}"
    found = _cli("search", "walrus", "--json", "--storage-dir", url)
    assert _snippets(found) == {"an early walrus", "a late walrus"}
    assert _counts(_cli("list", "--json", "--storage-dir", url)) == {
        "cli:main": 3,
        "irc:#python": 1,
    }
    with SqliteStore(path) as store:
        with pytest.raises(StoreError, match="disk full") as caught:
            for i in range(10_000):  # until the pages SQLite had at hand are used up
                _add(store, "cli:main", f"walrus number {i} " * 20)
        assert "\n" not in str(caught.value) and "corrupt" not in str(caught.value)


# --------------------------------------------------------------------------- 13: modes


@pytest.fixture(params=[0o022, 0o000], ids=["umask022", "umask000"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_fs_search_index_is_private(umask: int, tmp_path: Path) -> None:
    """search.db, its -wal and -shm, the dirty markers and their folder: 0600 and 0700."""
    root = tmp_path / "sessions"
    with FsStore(root) as store:
        _add(store, "cli:main", "a walrus")
        marker = dirty_dir(root)
        assert _mode(marker) == 0o700
        assert [_mode(p) for p in marker.iterdir()] == [0o600]
        assert len(search(store, "walrus")) == 1  # the index, with its connection open
        db = root / ".index" / fs_search.DB_NAME
        for suffix in ("", "-wal", "-shm"):
            assert _mode(Path(f"{db}{suffix}")) == 0o600, suffix


def test_the_sqlite_store_is_private(umask: int, tmp_path: Path) -> None:
    """The database, its derived index beside it, each one's -wal and -shm, the folders it
    creates and its lock files."""
    path = tmp_path / "new" / "folder" / "terrarium.db"
    with SqliteStore(path) as store:
        _add(store, "cli:main", "a walrus")
        with store.lock_context(ContextId.parse("cli:main")):
            pass
        assert len(search(store, "walrus")) == 1  # the index, with its connection open
        for db in (path, path.with_name("terrarium.db.search.db")):
            for suffix in ("", "-wal", "-shm"):
                assert _mode(Path(f"{db}{suffix}")) == 0o600, (db, suffix)
        assert _mode(tmp_path / "new") == _mode(path.parent) == 0o700
        locks = Path(f"{path}-locks")
        assert all(_mode(p) == (0o700 if p.is_dir() else 0o600) for p in locks.rglob("*"))


# --------------------------------------------------------------------------- 12: damage


def _damage(root: Path) -> dict[str, Path]:
    """A store with a good context and one of each kind of damage; returns, per context, the
    file that is damaged (the head.json or the segment), or the folder for the good ones.
    (The search index has not read them yet: it would not see damage done behind FsStore's
    back to a file it has read until ``reindex``, as with any such edit.)"""
    damaged: dict[str, Path] = {}
    with FsStore(root) as store:
        for name in ("good", "corrupt", "torn", "empty", "notheader", "badhead", "nohead"):
            _add(store, f"cli:{name}", f"{name} one", f"{name} two")
            context = ContextId.parse(f"cli:{name}")
            head = store.get_head(context)
            folder = store.folder_of(context)
            assert head is not None and folder is not None
            segment = folder / f"{head.segment_id}.jsonl"
            damaged[name] = {"badhead": folder / "head.json", "good": folder}.get(name, segment)
            damaged["nohead"] = folder
    for name, path in damaged.items():
        if name == "corrupt":  # a line in the middle that is not an entry
            lines = path.read_bytes().splitlines(keepends=True)
            path.write_bytes(b"".join([*lines[:2], b"{not json\n", *lines[2:]]))
        elif name == "torn":  # a header line cut short
            path.write_bytes(path.read_bytes()[:25])
        elif name == "empty":
            path.write_bytes(b"")
        elif name == "notheader":  # a whole first line that is an entry, not a header
            lines = path.read_bytes().splitlines(keepends=True)
            path.write_bytes(b"".join(lines[1:]))
        elif name == "badhead":
            path.write_bytes(b'{"context": "cli:badhead"')
    (damaged["nohead"] / "head.json").unlink()  # missing, not damaged: rebuilt silently
    return damaged


def test_list_shows_damaged_contexts_as_damaged_and_names_the_file(tmp_path: Path) -> None:
    """A corrupt line, a torn or unparsable header, an empty segment: each context is listed,
    marked damaged, with the file named (JSON ``problem``, one stderr warning each); an
    unreadable head.json is named and its head rebuilt from the segments; a missing one is
    rebuilt silently. Exit code 0."""
    root = tmp_path / "sessions"
    damaged = _damage(root)  # before the index first reads them
    result = _cli("list", "--json", "--storage-dir", str(root))
    rows = {row["context_id"]: row for row in _ok(result)["contexts"]}
    assert set(rows) == {f"cli:{name}" for name in damaged}
    for name in ("good", "nohead"):
        assert rows[f"cli:{name}"]["problem"] is None
        assert rows[f"cli:{name}"]["message_count"] == 2
    assert rows["cli:badhead"]["message_count"] == 2  # its rebuilt head
    warnings = result.stderr.strip().splitlines()
    for name in ("corrupt", "torn", "empty", "notheader", "badhead"):
        problem = rows[f"cli:{name}"]["problem"]
        assert problem is not None and str(damaged[name]) in problem and "\n" not in problem
        assert warnings.count(f"warning: {problem}") == 1
    assert len(warnings) == 5, result.stderr
    table = _cli("list", "--storage-dir", str(root))
    assert table.returncode == 0, table.stderr
    marked = {line.split()[0] for line in table.stdout.splitlines() if " damaged " in line}
    assert marked == {f"cli:{n}" for n in ("corrupt", "torn", "empty", "notheader", "badhead")}


def test_list_without_its_index_still_shows_damaged_contexts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the index is unavailable the manager restores each context: a damaged one is
    listed with its problem, never dropped and never failing the whole listing."""
    from terrarium.agent.multi_context_manager import MultiContextManager
    from terrarium.errors import IndexUnavailable

    root = tmp_path / "sessions"
    damaged = _damage(root)

    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise IndexUnavailable("search.db: busy")

    monkeypatch.setattr(SearchIndex, "list_contexts_fast", unavailable)
    with FsStore(root) as store:
        rows = {
            r["context_id"]: r
            for r in MultiContextManager(None, store=store).list_all_contexts()["cli"]  # type: ignore[arg-type]
        }
    assert set(rows) == {f"cli:{name}" for name in damaged}
    assert rows["cli:good"]["problem"] is None and rows["cli:good"]["message_count"] == 2
    for name in ("corrupt", "torn", "empty", "notheader"):
        problem = rows[f"cli:{name}"]["problem"]
        assert problem is not None and str(damaged[name]) in problem, (name, problem)


@pytest.mark.parametrize("read_only", ["ro mount"], indirect=True)
@pytest.mark.parametrize("kind", ["fs", "sqlite"])
def test_the_gateway_answers_its_reads_from_a_read_only_store(
    kind: str, read_only: Any, tmp_path: Path
) -> None:
    """On a store that cannot be written (a read-only mount), the gateway's GET endpoints
    (a response, its input items, a conversation and its items) answer as they did on the
    writable store: a read never needs to open a log for writing."""
    from starlette.testclient import TestClient

    from fakeserver import FakeServer
    from terrarium.gateway.app import create_app
    from terrarium.stores.url import open_store

    folder = tmp_path / "store"
    url = str(folder) if kind == "fs" else f"sqlite://{folder / 'terrarium.db'}"
    message = {"type": "message", "role": "user", "content": "hi"}
    with FakeServer() as fake:
        with (
            open_store(url) as store,
            TestClient(create_app(store, fake.base_url), base_url="http://127.0.0.1") as client,
        ):
            conversation = client.post("/v1/conversations", json={"items": [message]}).json()
            first = client.post(
                "/v1/responses", json={"model": "fake-model", "input": "a walrus"}
            ).json()
            second = {"model": "fake-model", "input": "more", "previous_response_id": first["id"]}
            response = client.post("/v1/responses", json=second).json()
            item = client.get(f"/v1/conversations/{conversation['id']}/items").json()["data"][0]
            paths = [
                f"/v1/responses/{first['id']}",
                f"/v1/responses/{response['id']}",
                f"/v1/responses/{response['id']}/input_items",
                f"/v1/conversations/{conversation['id']}",
                f"/v1/conversations/{conversation['id']}/items",
                f"/v1/conversations/{conversation['id']}/items/{item['id']}",
            ]
            expected = {path: client.get(path).json() for path in paths}
        where, _ = read_only(folder)
        url = str(where) if kind == "fs" else f"sqlite://{where / 'terrarium.db'}"
        with (
            open_store(url, create=False) as store,
            TestClient(create_app(store, fake.base_url), base_url="http://127.0.0.1") as client,
        ):
            for path in paths:
                answer = client.get(path)
                assert answer.status_code == 200, (path, answer.text)
                assert answer.json() == expected[path], path


SIGNATURE = """
import sys
from terrarium import ContextId, FsStore
from terrarium.web import data
with FsStore(sys.argv[1]) as store:
    print(data.signature(store, ContextId.parse("cli:main")))
"""


def test_the_dashboards_live_view_signs_a_read_only_fs_store(
    read_only: Any, tmp_path: Path
) -> None:
    """The live view's signature of a context (its head segment and next seq) is read from a
    store that cannot be written (file modes or a read-only mount), and matches the one read
    while it could be: next_seq opens no log for writing when it cannot."""
    from terrarium.web import data

    folder = tmp_path / "store"
    with FsStore(folder) as store:
        _add(store, "cli:main", "a walrus", "a reply")
        expected = data.signature(store, ContextId.parse("cli:main"))
    where, unprivileged = read_only(folder)
    found = subprocess.run(
        [sys.executable, "-c", SIGNATURE, str(where)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        cwd="/",
        preexec_fn=_drop_dac if unprivileged else None,
        timeout=120,
        check=False,
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == expected


def test_fsck_finds_no_problem_in_a_sound_read_only_fs_store(
    read_only: Any, tmp_path: Path
) -> None:
    """``fsck`` on a sound store that cannot be written (file modes or a read-only mount)
    reports no problem: a log file without its write bit in a folder without one was made
    read-only with its folder, not sealed by a killed freeze."""
    root = tmp_path / "sessions"
    with FsStore(root) as store:
        _add(store, "cli:main", "a walrus", "a reply")
        _add(store, "irc:#python", "no animals here")
    where, unprivileged = read_only(root)
    checked = _cli("fsck", "--json", "--storage-dir", str(where), unprivileged=unprivileged)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert _ok(checked)["problems"] == []
