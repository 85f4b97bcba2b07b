"""Lock files: a purged context or session keeps none, and removing one never lets two
holders in at once (``terrarium.stores.locks``)."""

from __future__ import annotations

import errno
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from pg import store_url
from terrarium import ContextId, SegmentStartState, Store, create_segment, lifecycle, states
from terrarium.stores.base import Lifecycle
from terrarium.stores.locks import file_lock, remove_lock
from terrarium.stores.url import open_store

SRC = Path(__file__).resolve().parents[1] / "src"


def test_a_taker_of_a_removed_lock_file_moves_on_to_the_file_made_after_it(
    tmp_path: Path,
) -> None:
    """B waits on the file while its holder removes it and lets go, and C then takes the path
    afresh: B must not hold the old file beside C."""
    path = tmp_path / "lock"
    inside: list[str] = []
    most = 0
    guard = threading.Lock()

    def hold(name: str) -> None:
        nonlocal most
        with file_lock(path):
            with guard:
                inside.append(name)
                most = max(most, len(inside))
            time.sleep(0.3)
            with guard:
                inside.remove(name)

    waiter = threading.Thread(target=hold, args=("B",))
    with file_lock(path):
        waiter.start()
        time.sleep(0.3)  # B opened the file and waits for its flock
        path.unlink()  # as remove_lock does, while holding it
    taker = threading.Thread(target=hold, args=("C",))
    taker.start()
    taker.join()
    waiter.join()
    assert most == 1


def test_remove_lock_removes_a_free_file_and_leaves_a_held_one(tmp_path: Path) -> None:
    free, held = tmp_path / "free", tmp_path / "held"
    with file_lock(free):
        pass
    with file_lock(held):
        assert remove_lock(held) is False
        assert remove_lock(free) is True
    assert not free.exists() and held.exists()
    assert remove_lock(tmp_path / "missing") is False
    (tmp_path / "target").touch()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    assert remove_lock(tmp_path / "link") is False  # never through a link
    assert (tmp_path / "link").is_symlink()


def _lock_files(tmp_path: Path) -> list[str]:
    return sorted(
        str(p.relative_to(tmp_path))
        for p in tmp_path.rglob("*")
        if p.is_file() and ("/.locks/" in str(p) or "-locks/" in str(p))
    )


@pytest.mark.parametrize("kind", ["fs", "sqlite"])
def test_a_deleted_and_purged_context_leaves_no_lock_file(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, "s", request)
    store = open_store(url)
    kept = _lock_files(tmp_path)  # the store's own (the index's, the lifecycle's)
    for name in ("gone", "purged", "live"):
        context = ContextId.parse(f"cli:{name}")
        create_segment(store, SegmentStartState(system_prompt="x"), context=str(context))
        with store.lock_context(context):  # type: ignore[attr-defined]
            pass
    live = set(_lock_files(tmp_path))
    lifecycle.delete_context(store, ContextId.parse("cli:gone"))
    lifecycle.purge(store, ContextId.parse("cli:purged"), why="test")
    assert isinstance(store, Lifecycle)
    for entry in states.trashed_contexts(store):
        states.purge_trashed(store, entry.trash_id)
    left = _lock_files(tmp_path)
    assert [p for p in left if "gone" in p or "purged" in p] == []
    assert [p for p in left if "live" in p] == sorted(p for p in live if "live" in p)
    assert not set(left) - live - set(kept) - {"s/.locks/blobs"}  # nothing new but blobs'
    store.close()


CHILD = textwrap.dedent(
    """
    import os, sys, time
    from terrarium import ContextId, SegmentStartState, create_segment, lifecycle
    from terrarium.errors import ContextExists
    from terrarium.stores.url import open_store

    url, role, marker, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    store = open_store(url)
    context = ContextId.parse("cli:churn")
    for _ in range(rounds):
        if role == "churn":  # the context goes and comes back: its lock files go with it
            try:
                create_segment(store, SegmentStartState(system_prompt="x"), context=str(context))
            except ContextExists:
                pass
            lifecycle.purge(store, context, why="test")
            continue
        with store.lock_context(context):
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                print("two holders at once", flush=True)
                sys.exit(1)
            time.sleep(0.001)
            os.unlink(marker)
    store.close()
    """
)


@pytest.mark.parametrize("kind", ["fs", "sqlite"])
def test_holders_of_a_context_lock_never_overlap_while_its_file_comes_and_goes(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Three processes take the context's lock, one purges and re-creates the context (each
    purge removes the lock file): no two holders are ever in at once."""
    url = store_url(kind, tmp_path, "s", request)
    open_store(url).close()
    marker = tmp_path / "inside"
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, url, role, str(marker), str(rounds)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for role, rounds in [("churn", 60), ("hold", 300), ("hold", 300), ("hold", 300)]
    ]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    assert [r[0] for r in results] == [0, 0, 0, 0], results


def test_lock_context_on_a_store_with_no_such_context_keeps_no_file(tmp_path: Path) -> None:
    store: Store = open_store(str(tmp_path / "s"))
    with store.lock_context(ContextId.parse("cli:never")):  # type: ignore[attr-defined]
        assert _lock_files(tmp_path) != []
    assert [p for p in _lock_files(tmp_path) if "never" in p] == []
    store.close()


@pytest.mark.parametrize("kind", ["fs", "sqlite"])
def test_a_lock_file_that_cannot_be_removed_stays_and_fails_nothing(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store whose folder takes no unlink (read-only, say): the turn's lock is still taken
    and let go, and its file stays."""
    store = open_store(store_url(kind, tmp_path, "s", request))

    def refused(self: Path, missing_ok: bool = False) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "unlink", refused)
    for _ in range(2):
        with store.lock_context(ContextId.parse("cli:never")):  # type: ignore[attr-defined]
            pass
    assert [p for p in _lock_files(tmp_path) if "never" in p] != []
    store.close()
