"""SIGKILL part way through a policy run, a fork into a new context, a reindex and a blob
collection, on every persistent backend.

Each command runs in a forked child (``tests/helpers/ops_child.py``) that dies just before its
n-th write: a file change on a folder, a call of a writing method (one transaction) on a
database. The store was seeded with hot contexts (one pinned, two holding a blob), two in
the trash and blobs no log names. After each kill, before any repair, every context is in one
place and reads whole, the listing names each hot one, and a fork's new context is absent or
whole; then ``fsck --repair`` leaves nothing for ``fsck`` to find, the command run again ends
where it goes, and every trash entry left restores whole. The default run kills at a few
points per command; ``slow`` at every one.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.procs import ask, serving
from helpers.race_child import fsck, open_spec
from pg import fresh_schema, pg_database  # noqa: F401  (the postgres store's database)
from terrarium import ContextId, contexts, create_segment, sessions, states
from terrarium.stores.base import BlobStore, Lifecycle, Store

CHILD = Path(__file__).with_name("helpers") / "ops_child.py"
HOT = [f"k:hot-{i}" for i in range(4)]
OLD = [f"k:old-{i}" for i in range(2)]
PINNED = "k:hot-2"
BIG = "x" * 70_000  # over the blob threshold
ORPHANS = [f"blob {i} that no log names ".encode() * 4_000 for i in range(4)]
FORK_FROM, FORK_TO = "k:hot-1", "k:fork"  # a fork's source (with a blob) and new context


def texts_of(name: str) -> list[str]:
    """What the seed wrote to ``name``: three messages, the odd ones' second a blob."""
    number = int(name[-1])
    return [f"{name} one", f"{name} two {BIG}" if number % 2 else f"{name} two", f"{name} three"]


def seed(store: Store) -> list[str]:
    """The contexts (hot, pinned, in the trash) and the blobs no log names; their digests."""
    for name in HOT + OLD:
        create_segment(store, context=name)
        for text in texts_of(name):
            head = store.get_head(ContextId.parse(name))
            assert head is not None
            sessions.save_user_input(store, head, text)
    assert isinstance(store, Lifecycle) and isinstance(store, BlobStore)
    states.pin_context(store, ContextId.parse(PINNED))
    for name in OLD:
        assert states.delete_context(store, ContextId.parse(name))
    return [store.put_blob(data) for data in ORPHANS]


def history(store: Store, name: str) -> list[str]:
    return [str(i["content"]) for i in sessions.restore(store, ContextId.parse(name)).history]


def check_places(store: Any, op: str) -> None:
    """Each context in one place and whole; the listing names each hot one."""
    hot = {h.context for h in store.list_contexts()}
    archived = {a.context for a in states.archived_contexts(store)}
    listed = {row.context for row in contexts.list_contexts(store).rows}
    trashed = [e.context for e in states.trashed_contexts(store)]
    assert not hot & archived and hot <= listed, (hot, archived, listed)
    for name in HOT:
        assert (name in hot) != (name in archived), name
        assert history(store, name) == texts_of(name), name
        assert op == "maintain" or name in hot, name
    assert PINNED in hot
    for name in OLD:
        assert store.get_head(ContextId.parse(name)) is None
        assert trashed.count(name) == 1 or (op == "maintain" and name not in trashed), name
    if store.get_head(ContextId.parse(FORK_TO)) is not None:
        assert history(store, FORK_TO) == texts_of(FORK_FROM)


def check_end(store: Any, op: str, orphans: list[str]) -> None:
    """Where the command takes the store, once it has run to the end."""
    archived = {a.context for a in states.archived_contexts(store)}
    if op == "maintain":
        assert archived == set(HOT) - {PINNED}
        assert states.trashed_contexts(store) == []
    if op == "fork":
        assert history(store, FORK_TO) == texts_of(FORK_FROM)
    assert [store.has_blob(digest) for digest in orphans] == [op != "gc"] * len(orphans)
    for entry in states.trashed_contexts(store):
        states.restore_trashed(store, entry.trash_id)
        assert history(store, entry.context) == texts_of(entry.context)


def spec_of(kind: str, tmp_path: Path, request: pytest.FixtureRequest, round: int) -> Any:
    """A fresh store of ``kind`` for one round, as the child opens it."""
    if kind == "fs":
        return {"kind": kind, "where": str(tmp_path / f"sessions-{round}")}
    if kind == "sqlite":
        return {"kind": kind, "where": str(tmp_path / f"ops-{round}.db")}
    return {"kind": kind, "where": request.getfixturevalue("pg_database"), "schema": fresh_schema()}


@pytest.fixture(scope="module")
def child() -> Iterator[subprocess.Popen[str]]:
    with serving(CHILD) as proc:
        yield proc


def one_round(proc: subprocess.Popen[str], spec: dict[str, Any], op: str, kill: int) -> int:
    """Seed a store, run ``op`` killed at write ``kill``, check, repair, rerun, check; how
    many writes the command made (if it ran to the end)."""
    with open_spec(spec) as store:
        orphans = seed(store)
    command = {**spec, "op": op, "source": FORK_FROM, "target": FORK_TO}
    answer = ask(proc, {**command, "kill": kill})
    assert answer["killed"] == bool(kill) and answer["error"] in ("", None), answer
    with open_spec(spec) as store:
        check_places(store, op)
        assert fsck(store, repair=True) == []
        assert fsck(store, repair=False) == []
        check_places(store, op)
        if op != "fork" or store.get_head(ContextId.parse(FORK_TO)) is None:
            assert ask(proc, {**command, "kill": 0})["error"] == ""  # the command run again
        check_end(store, op, orphans)
        assert fsck(store, repair=False) == []
    return int(answer["writes"] or 0)


def points(total: int, every: bool) -> list[int]:
    """Each write (``every``), else six spread over the run, the first and the last among them."""
    if every:
        return list(range(1, total + 1))
    return sorted({1, total // 5, 2 * total // 5, 3 * total // 5, 4 * total // 5, total} - {0})


def kill_rounds(kind: str, op: str, tmp_path: Path, request: Any, *, every: bool) -> None:
    """A round run to the end counts the writes; then one round killed at each point."""
    proc = request.getfixturevalue("child")
    total = one_round(proc, spec_of(kind, tmp_path, request, 0), op, 0)
    assert total > 0, (kind, op)
    for kill in points(total, every):
        one_round(proc, spec_of(kind, tmp_path, request, kill), op, kill)


def cases() -> list[Any]:
    """Every command on every persistent backend, but ``reindex`` on the databases: it only
    rebuilds their derived index there, and writes nothing of the store."""
    return [
        pytest.param(kind, op, marks=[pytest.mark.postgres] if kind == "postgres" else [])
        for kind in ("fs", "sqlite", "postgres")
        for op in ("maintain", "fork", "reindex", "gc")
        if kind == "fs" or op != "reindex"
    ]


@pytest.mark.parametrize(("kind", "op"), cases())
def test_a_command_killed_part_way_loses_nothing(
    kind: str, op: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Killed at a few of its writes: every context in one place and whole, listed if hot, a
    fork absent or whole; fsck clean after repair; the rerun ends where the command goes."""
    kill_rounds(kind, op, tmp_path, request, every=False)


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "op"), cases())
def test_a_command_killed_at_any_write_loses_nothing(
    kind: str, op: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The same, killed at every write."""
    kill_rounds(kind, op, tmp_path, request, every=True)
