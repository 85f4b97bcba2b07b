"""SIGKILL during archive, unarchive, delete (trash), restore and purge on FsStore: at every
step of its primitives, ``freeze_session`` (archive; delete's seal), ``thaw_session``
(unarchive; restore), ``detach_context`` (delete, purge_context), ``attach_context`` (restore)
and ``delete_session`` (purges).

Each call runs in a forked child killed just before its n-th file change (``write``,
``rename``, ``unlink``, ``mkdir``, ...; ``tests/helpers/lifecycle_child.py``), for n = 1, 2, ...
up to the number of changes the call makes. After every kill the context must be in exactly
one state (hot, archived, trashed, or gone after a purge), the state before or the state after
the call, readable with its whole history; ``fsck`` may find only leftovers, which
``fsck --repair`` deletes (``finish_lifecycle`` finishing a restore killed after its attach
changes nothing visible); and the same call run again finishes the job. The default run kills
at a sample of the points; the ``slow`` run at every one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from terrarium import (
    FsStore,
    PodActiveSegmentRef,
    create_segment,
    fork,
    restore,
    save_user_input,
    states,
)
from terrarium.cli import cli
from terrarium.model import ContextId, TraceEntry

CHILD = Path(__file__).parent / "helpers" / "lifecycle_child.py"
MAIN = ContextId("cli", "main")
TS = "2026-05-01T12:00:00.000000Z"

#: (op, the state before, the state after)
OPS = [
    ("archive", "hot", "archived"),
    ("unarchive", "archived", "hot"),
    ("delete", "hot", "trashed"),
    ("delete", "archived", "trashed-archived"),
    ("restore", "trashed", "hot"),
    ("restore", "trashed-archived", "archived"),
    ("purge_trashed", "trashed", "gone"),
    ("purge_context", "archived", "gone"),
]


class Server:
    """``lifecycle_child.py``: one forked, killable lifecycle call per request."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, **request: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def close(self) -> None:
        self.proc.communicate(timeout=30)  # closes stdin, reads to the end, closes stdout


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    child = Server()
    try:
        yield child
    finally:
        child.close()


def _pristine(root: Path, start: str) -> tuple[list[Any], str]:
    """A store whose cli:main (pinned, forked, traced) is in state ``start``; its history and
    trash id (or "")."""
    with FsStore(root) as store:
        session_id, segment_id = create_segment(store, context="cli:main")
        ref = PodActiveSegmentRef(session_id, segment_id)
        for n in range(5):
            save_user_input(store, ref, f"message {n} " * 20)
        store.append_trace(session_id, segment_id, [TraceEntry(TS, "chunk", {"n": 1})])
        fork(store, ref)
        states.pin_context(store, MAIN)
        create_segment(store, context="cli:other")
        history = restore(store, "cli:main").history
        if start in ("archived", "trashed-archived"):
            states.archive_context(store, MAIN)
        if start.startswith("trashed"):
            states.delete_context(store, MAIN)
            return history, states.trashed_contexts(store)[0].trash_id
    return history, ""


def _state(root: Path, history: list[Any]) -> str:
    """Where cli:main is (checking it is in one place only, readable whole)."""
    with FsStore(root) as store:
        hot = MAIN in {ContextId.parse(h.context) for h in store.list_contexts()}
        archived = "cli:main" in {a.context for a in states.archived_contexts(store)}
        trashed = [t for t in states.trashed_contexts(store) if t.context == "cli:main"]
        assert hot + archived + len(trashed) <= 1, (hot, archived, trashed)
        assert states.is_archived(store, MAIN) == archived
        assert [h.context for h in store.list_contexts() if h.context != "cli:main"] == [
            "cli:other"
        ]
        if hot or archived:
            assert restore(store, "cli:main").history == history
            assert states.pinned_contexts(store) == {"cli:main"}
            return "hot" if hot else "archived"
        assert store.get_head(MAIN) is None
        if trashed:
            assert trashed[0].pinned and trashed[0].message_count == len(history)
            return "trashed-archived" if trashed[0].archived else "trashed"
        return "gone"


def _fsck(root: Path) -> None:
    runner = CliRunner()
    checked = runner.invoke(cli, ["fsck", "--json", "--storage-dir", str(root)])
    kinds = {p["kind"] for p in json.loads(checked.output)["problems"]}
    assert kinds <= {"leftover", "unindexed", "unfinished"}, checked.output
    assert runner.invoke(cli, ["fsck", "--repair", "--storage-dir", str(root)]).exit_code == 0
    again = runner.invoke(cli, ["fsck", "--storage-dir", str(root)])
    assert again.exit_code == 0, again.output


def _kill_everywhere(
    server: Server, tmp_path: Path, op: str, start: str, end: str, every: int
) -> None:
    pristine = tmp_path / f"pristine-{op}-{start}"
    history, trash_id = _pristine(pristine, start)
    request = {"op": op, "context": "cli:main", "trash_id": trash_id}
    counted = tmp_path / f"counted-{op}-{start}"
    shutil.copytree(pristine, counted)
    done = server.run(root=str(counted), kill=0, **request)
    assert done["error"] == "" and not done["killed"], done
    assert _state(counted, history) == end
    total = done["mutations"]
    assert total >= 3
    seen = set()
    points = sorted({*range(1, total + 1, every), total})
    for point in points:
        root = tmp_path / f"kill-{op}-{start}-{point}"
        shutil.copytree(pristine, root)
        answer = server.run(root=str(root), kill=point, **request)
        assert answer["killed"], (point, answer)
        state = _state(root, history)
        seen.add(state)
        assert state in (start, end), (point, state)
        _fsck(root)
        assert _state(root, history) == state, point
        if state == start:  # the next call finishes the job
            again = server.run(root=str(root), kill=0, **request)
            assert again["error"] == "", (point, again)
            assert _state(root, history) == end, point
            _fsck(root)
        shutil.rmtree(root)
    assert len(seen) == 2, seen  # some kills land before the commit, some after


@pytest.mark.parametrize(("op", "start", "end"), OPS)
def test_a_kill_leaves_one_state_and_the_next_call_finishes(
    server: Server, tmp_path: Path, op: str, start: str, end: str
) -> None:
    """SIGKILL at a sample of the call's file changes: one state, readable, fsck clean after
    --repair, and the call run again reaches the end state."""
    _kill_everywhere(server, tmp_path, op, start, end, every=7)


@pytest.mark.slow
@pytest.mark.parametrize(("op", "start", "end"), OPS)
def test_a_kill_at_every_point_leaves_one_state(
    server: Server, tmp_path: Path, op: str, start: str, end: str
) -> None:
    """As above, at every one of the call's file changes."""
    _kill_everywhere(server, tmp_path, op, start, end, every=1)
