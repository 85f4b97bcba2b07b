"""SIGKILL at every step of every lifecycle move, on every persistent backend.

Lifecycle is written once (:mod:`terrarium.states`) as a few calls of
the stores' primitives, each atomic. A process is killed just before and just after each of
those calls in turn (``tests/helpers/steps_child.py``), for archive, unarchive, a write that
wakes an archived context, delete (hot and archived), restore (into the hot store and into the
archive), both purges and a pin. After each kill, ``finish_lifecycle`` (what ``fsck --repair``
runs) and then the same command again must bring the context to where the command takes it,
whole: in exactly one place at every point, nothing lost, nothing twice. The kills inside a
primitive (a file store's renames) are the backends' own tests.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.procs import ask, serving
from helpers.race_child import open_spec
from pg import fresh_schema, pg_database  # noqa: F401  (the postgres store's database)
from terrarium import ContextId, create_segment, sessions, states
from terrarium.stores.base import Lifecycle, Store

CHILD = Path(__file__).with_name("helpers") / "steps_child.py"
TEXTS = ["one", "two", "three"]

#: Each move: how its context starts, and where it must end.
MOVES = {
    "archive": ("hot", "archived"),
    "unarchive": ("archived", "hot"),
    "wake": ("archived", "hot"),
    "delete": ("hot", "trash"),
    "delete_archived": ("archived", "trash"),
    "restore": ("trash", "hot"),
    "restore_archived": ("trash_archived", "archived"),
    "purge_trashed": ("trash", "gone"),
    "purge_context": ("archived", "gone"),
    "pin": ("hot", "hot"),
}


def spec_of(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    """Where the store of ``kind`` lives, as the child opens it."""
    if kind == "fs":
        return {"kind": kind, "where": str(tmp_path / "sessions")}
    if kind == "sqlite":
        return {"kind": kind, "where": str(tmp_path / "steps.db")}
    return {"kind": kind, "where": request.getfixturevalue("pg_database"), "schema": fresh_schema()}


def prepare(store: Any, name: str, start: str) -> str | None:
    """Make ``name`` with three messages, in state ``start``; its trash id if trashed."""
    ctx = ContextId.parse(name)
    create_segment(store, context=name)
    for text in TEXTS:
        head = store.get_head(ctx)
        sessions.save_user_input(store, head, f"{name} {text}")
    states.pin_context(store, ctx)
    if start in ("archived", "trash_archived"):
        assert states.archive_context(store, ctx) is not None
    if start.startswith("trash"):
        assert states.delete_context(store, ctx)
        return str(entry_of(store, name).trash_id)
    return None


def entry_of(store: Any, name: str) -> Any:
    """The context's one trash entry, or None (two is a failure)."""
    entries = [e for e in states.trashed_contexts(store) if e.context == name]
    assert len(entries) <= 1, f"{name} is in the trash {len(entries)} times"
    return entries[0] if entries else None


def place_of(store: Any, name: str) -> str:
    """Where the context is: hot, archived, trash, trash_archived or gone; exactly one."""
    ctx = ContextId.parse(name)
    live = store.get_head(ctx) is not None
    listed = name in {h.context for h in store.list_contexts()}
    archived = name in {a.context for a in states.archived_contexts(store)}
    entry = entry_of(store, name)
    assert not (live and entry), f"{name} is live and in the trash"
    assert listed != archived or not live, f"{name}: listed {listed}, archived {archived}"
    if live:
        return "archived" if archived else "hot"
    assert not listed and not archived
    if entry is None:
        return "gone"
    assert entry.pinned and entry.message_count in (3, 4)
    return "trash_archived" if entry.archived else "trash"


def texts(store: Store, name: str) -> list[str]:
    return [str(i["content"]) for i in sessions.restore(store, ContextId.parse(name)).history]


def finish(store: Any, move: str, name: str, trash_id: str | None) -> None:
    """Run the command again, as a user would after the kill, until it is done."""
    ctx = ContextId.parse(name)
    place = place_of(store, name)
    if move == "archive" and place == "hot":
        states.archive_context(store, ctx)
    elif move == "unarchive" and place == "archived":
        states.unarchive_context(store, ctx)
    elif move == "wake" and len(texts(store, name)) == 3:
        sessions.save_user_input(store, store.get_head(ctx), f"{ctx} woken")
    elif move.startswith("delete") and place in ("hot", "archived"):
        states.delete_context(store, ctx)
    elif move.startswith("restore") and place.startswith("trash"):
        states.restore_trashed(store, entry_of(store, name).trash_id)
    elif move == "purge_trashed" and place.startswith("trash"):
        states.purge_trashed(store, trash_id)
    elif move == "purge_context" and place != "gone":
        states.purge_context(store, ctx)
    elif move == "pin":
        states.pin_context(store, ctx)


def check_end(store: Any, move: str, name: str) -> None:
    """The move is done and the context is whole where it ended."""
    end = MOVES[move][1]
    place = place_of(store, name)
    if end == "trash":
        assert place.startswith("trash"), (name, place)
        assert (place == "trash_archived") == (move == "delete_archived")
        return
    assert place == end, (name, place)
    if end == "gone":
        return
    expected = [f"{name} {t}" for t in TEXTS]
    if move == "wake":
        expected.append(f"{name} woken")
    assert texts(store, name) == expected
    assert name in states.pinned_contexts(store)


@pytest.fixture(scope="module")
def child() -> Iterator[subprocess.Popen[str]]:
    """One child for the module: it forks a fresh process for each request."""
    with serving(CHILD) as proc:
        yield proc


@pytest.mark.parametrize(
    "kind", ["fs", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
@pytest.mark.parametrize("move", sorted(MOVES))
def test_a_move_killed_at_any_step_is_completed_by_repair_and_a_rerun(
    kind: str,
    move: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    child: subprocess.Popen[str],
) -> None:
    """Kill before and after each primitive call of the move; after ``finish_lifecycle`` the
    context is in one place, whole; the command run again takes it where it goes."""
    spec = spec_of(kind, tmp_path, request)
    kill = 1
    while True:
        name = f"k:{move}-{kill}"
        with open_spec(spec) as store:
            assert isinstance(store, Lifecycle)
            trash_id = prepare(store, name, MOVES[move][0])
        op = {"delete_archived": "delete", "restore_archived": "restore"}.get(move, move)
        answer = ask(child, {**spec, "op": op, "context": name, "trash_id": trash_id, "kill": kill})
        with open_spec(spec) as store:
            assert answer["killed"] or answer["error"] == "", answer
            states.finish_lifecycle(store)
            place_of(store, name)
            finish(store, move, name, trash_id)
            check_end(store, move, name)
            assert states.unfinished_lifecycle(store) == []
        if not answer["killed"]:
            assert answer["steps"] * 2 == kill - 1, answer
            break
        kill += 1
