"""SIGKILL part way through the data-moving commands the other kill tests do not stop:
``terrarium migrate --to-log``, ``terrarium import`` of legacy JSON files, archive, unarchive
and delete of a context beside its legacy file, the gateway's item deletes and the adapters'
clear, pop and delete_thread.

Each call runs in a forked child (``tests/helpers/copy_child.py``, ``gaps_child.py serve``)
that dies just before its n-th write: a file change on a folder, a call of a writing method
(one transaction) on a database. After each kill, before any repair, no legacy file is lost or
half written, every context is in one place and reads whole, before or after the call; then
``fsck --repair`` leaves nothing for ``fsck`` to find and the call run again finishes the job.
The default run kills at a few points, on a folder; ``slow`` at every one, the adapters' and the
gateway's calls on every backend.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from helpers.legacy_tree import legacy_texts, outside_trash, write_legacy
from helpers.procs import ask, serving
from helpers.race_child import fsck, open_spec
from pg import pg_database  # noqa: F401  (the postgres store's database)
from terrarium import (
    ContextId,
    FsStore,
    Item,
    SqliteStore,
    contexts,
    create_segment,
    legacy,
    save_delta,
    sessions,
    states,
)
from terrarium.cli import cli
from terrarium.formats import terrarium_json as tj
from terrarium.model import item_text
from terrarium.stores._files import leftovers
from terrarium.stores.base import Lifecycle, Store
from test_ops_kill import spec_of

CHILD = Path(__file__).with_name("helpers") / "copy_child.py"
NAMES = [f"cli:m{i}" for i in range(4)]  # flat, top-level, dated, flat


@pytest.fixture(scope="module")
def child() -> Iterator[subprocess.Popen[str]]:
    with serving(CHILD) as proc:
        yield proc


def points(total: int, every: bool) -> list[int]:
    """Each write (``every``), else the first, the middle one and the last."""
    if every:
        return list(range(1, total + 1))
    return sorted({1, (total + 1) // 2, total})


def in_log(store: Store, *, complete: bool) -> None:
    """Every context the log has reads whole (``complete``: every context is there)."""
    for name in NAMES:
        context = ContextId.parse(name)
        if store.get_head(context) is None:
            assert not complete, f"{name} is not in the log"
            continue
        history = [str(i["content"]) for i in sessions.restore(store, context).history]
        assert history == legacy_texts(name), name


def run(*argv: str) -> str:
    result = CliRunner().invoke(cli, list(argv))
    assert result.exit_code == 0, result.output
    return result.output


def migrate_round(proc: subprocess.Popen[str], root: Path, kill: int) -> int:
    """Migrate a fresh legacy folder into the log, killed at write ``kill``; check, repair,
    rerun, check; how many writes the migration made (if it ran to the end)."""
    write_legacy(root, NAMES)
    argv = ["migrate", "--to-log", "--storage-dir", str(root)]
    answer = ask(proc, {"argv": argv, "kill": kill, "count": "files"})
    assert answer["killed"] == bool(kill) and answer["exit"] in (None, 0), answer
    files = outside_trash(root)  # every file whole
    assert set(files) == set(NAMES) and max(files.values()) <= 2, files  # at worst in both places
    with FsStore(root) as store:
        in_log(store, complete=not kill)
        assert fsck(store, repair=True) == []
    run(*argv)
    assert outside_trash(root) == dict.fromkeys(NAMES, 1)
    for path in tj.iter_legacy_files(root):  # each in its date folder, no temporary file left
        assert len(path.relative_to(root).parts) == 3, path
        assert not leftovers(path), path
    with FsStore(root) as store:
        in_log(store, complete=True)
        assert fsck(store, repair=False) == []
    assert run(*argv).splitlines()[-1] == "moved 0, imported 0, skipped 4, failed 0"
    return int(answer["writes"] or 0)


def migrate_rounds(proc: subprocess.Popen[str], tmp_path: Path, *, every: bool) -> None:
    total = migrate_round(proc, tmp_path / "counted", 0)
    assert total > 10, total
    for kill in points(total, every):
        migrate_round(proc, tmp_path / f"killed-{kill}", kill)


def test_a_migration_to_the_log_killed_part_way_is_finished_by_the_rerun(
    child: subprocess.Popen[str], tmp_path: Path
) -> None:
    """``migrate --to-log`` killed at a few of its file changes: no legacy file lost or half
    written, every context in the log whole; the rerun moves and imports the rest."""
    migrate_rounds(child, tmp_path, every=False)


@pytest.mark.slow
def test_a_migration_to_the_log_killed_at_any_write_is_finished_by_the_rerun(
    child: subprocess.Popen[str], tmp_path: Path
) -> None:
    """The same, killed at every file change in turn."""
    migrate_rounds(child, tmp_path, every=True)


#: destination kind -> its store URL in a folder, what counts as a write, how to open it
DESTINATIONS: dict[str, tuple[str, str, Any]] = {
    "fs": ("{}", "files", FsStore),
    "sqlite": ("sqlite:///{}.db", "terrarium.stores.sqlite:SqliteStore", SqliteStore),
}


def import_round(
    proc: subprocess.Popen[str], source: Path, kind: str, where: Path, kill: int
) -> int:
    """Import the legacy folder ``source`` into a fresh store, killed at write ``kill``; check,
    repair, rerun, check; how many writes the import made (if it ran to the end)."""
    url, count, opener = DESTINATIONS[kind]
    argv = ["import", str(source), "--storage-dir", url.format(where)]
    answer = ask(proc, {"argv": argv, "kill": kill, "count": count})
    assert answer["killed"] == bool(kill) and answer["exit"] in (None, 0), answer
    path = where if kind == "fs" else Path(f"{where}.db")
    if path.exists():
        with opener(path) as store:
            in_log(store, complete=not kill)
            assert fsck(store, repair=True) == []
    run(*argv)
    with opener(path) as store:
        in_log(store, complete=True)
        assert fsck(store, repair=False) == []
    assert run(*argv).startswith("nothing to import: 4 sessions already in "), answer
    return int(answer["writes"] or 0)


def import_rounds(proc: subprocess.Popen[str], tmp_path: Path, kind: str, *, every: bool) -> None:
    source = tmp_path / "legacy"
    write_legacy(source, NAMES)
    total = import_round(proc, source, kind, tmp_path / "counted", 0)
    assert total > 0, total
    for kill in points(total, every):
        import_round(proc, source, kind, tmp_path / f"killed-{kill}", kill)
    assert outside_trash(source) == dict.fromkeys(NAMES, 1)  # the files stay as they are


def test_an_import_of_legacy_files_killed_part_way_is_finished_by_the_rerun(
    child: subprocess.Popen[str], tmp_path: Path
) -> None:
    """``terrarium import FOLDER`` of legacy files into a folder killed at a few of its file
    changes: every context imported reads whole; the rerun imports the rest, a third run finds
    them all there."""
    import_rounds(child, tmp_path, "fs", every=False)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(DESTINATIONS))
def test_an_import_of_legacy_files_killed_at_any_write_is_finished_by_the_rerun(
    child: subprocess.Popen[str], tmp_path: Path, kind: str
) -> None:
    """The same, killed at every write in turn, into a folder and into SQLite (a write: one
    transaction)."""
    import_rounds(child, tmp_path, kind, every=True)


# ------------------------------------------------------------- the adapters and the gateway

GAPS = Path(__file__).with_name("helpers") / "gaps_child.py"
TEXTS = ["one", "two", "three"]
#: op -> (the request's op, the texts the call leaves)
MOVES = {
    "agents_clear": ("agents_clear", []),
    "agents_pop": ("agents_pop", TEXTS[:2]),
    "graph_delete": ("graph_delete", None),  # None: in the trash
    "gw_drop_last": ("gw_drop", TEXTS[:2]),
    "gw_drop_mid": ("gw_drop", [TEXTS[0], TEXTS[2]]),
}


@pytest.fixture(scope="module")
def gaps() -> Iterator[subprocess.Popen[str]]:
    with serving(GAPS, "serve") as proc:
        yield proc


@pytest.fixture(scope="module")
def gaps_sdks() -> Iterator[subprocess.Popen[str]]:
    """The same server with the adapters' frameworks imported (seconds), for their calls."""
    with serving(GAPS, "serve", "sdks") as proc:
        yield proc


def seed_move(store: Store, op: str) -> dict[str, Any]:
    """The context ``op`` works on, holding :data:`TEXTS`; what the request names."""
    if op.startswith("agents_"):
        from terrarium.integrations.openai_agents import TerrariumSession

        items: Any = [{"role": "user", "content": text} for text in TEXTS]
        asyncio.run(TerrariumSession("s", store).add_items(items))
        return {"context": "agents:s"}
    if op == "graph_delete":
        create_segment(store, context="langgraph:t")
        head = store.get_head(ContextId.parse("langgraph:t"))
        assert head is not None
        save_delta(store, head, [Item.user(text) for text in TEXTS])
        return {"context": "langgraph:t"}
    from terrarium.gateway.ids import conversation_context, new_conversation_id
    from terrarium.gateway.ledger import Ledger

    context = conversation_context(new_conversation_id())
    assert context is not None
    found = [
        {
            "type": "message",
            "id": f"msg_{n}",
            "role": "user",
            "content": [{"type": "input_text", "text": t}],
        }
        for n, t in enumerate(TEXTS)
    ]
    Ledger(store).create_conversation(context, {"metadata": {}}, found)
    return {"context": str(context), "item": "msg_2" if op == "gw_drop_last" else "msg_1"}


def texts_now(store: Store, context: ContextId) -> list[str] | None:
    """The context's conversation as texts; None when it is in the trash (once), not live."""
    if store.get_head(context) is None:
        assert isinstance(store, Lifecycle)
        assert [e.context for e in states.trashed_contexts(store)] == [str(context)]
        return None
    return [item_text(i) for i in sessions.restore(store, context).model_history]


def move_round(proc: subprocess.Popen[str], spec: dict[str, Any], op: str, kill: int) -> int:
    """Seed, make the call killed at write ``kill``, check the context holds what it held before
    or after, repair, rerun if it was before, check; how many writes the call made."""
    call, after = MOVES[op]
    with open_spec(spec) as store:
        request = {**spec, **seed_move(store, op), "op": call, "kill": kill}
    answer = ask(proc, request)
    assert answer["killed"] == bool(kill) and answer["error"] in ("", None), answer
    context = ContextId.parse(request["context"])
    with open_spec(spec) as store:
        assert texts_now(store, context) in (TEXTS, after), op
        assert fsck(store, repair=True) == []
        if texts_now(store, context) == TEXTS:
            assert ask(proc, {**request, "kill": 0})["error"] == ""
        assert texts_now(store, context) == after, op
        assert fsck(store, repair=False) == []
    return int(answer["writes"] or 0)


def move_rounds(kind: str, op: str, tmp_path: Path, request: Any, *, every: bool) -> None:
    proc = request.getfixturevalue("gaps" if op.startswith("gw_") else "gaps_sdks")
    total = move_round(proc, spec_of(kind, tmp_path, request, 0), op, 0)
    assert total > 0, (kind, op)
    for kill in points(total, every):
        move_round(proc, spec_of(kind, tmp_path, request, kill), op, kill)


MOVE_CASES = [
    pytest.param(kind, op, marks=[pytest.mark.postgres] if kind == "postgres" else [])
    for kind in ("fs", "sqlite", "postgres")
    for op in MOVES
]


def test_a_gateway_item_delete_killed_part_way_leaves_before_or_after(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The gateway's delete of a conversation's item that is not its last (a new segment) on a
    folder, killed at a few of its file changes: the conversation holds what it held before or
    after, whole; repair and a rerun finish the move. (The last item's delete and the Agents
    SDK's pop are ``rewind``, its clear is ``clear``, LangGraph's delete_thread is ``delete``:
    test_lifecycle_race kills those calls by default; their own rounds, with the frameworks'
    seconds of imports, are ``slow``.)"""
    move_rounds("fs", "gw_drop_mid", tmp_path, request, every=False)


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "op"), MOVE_CASES)
def test_an_adapter_or_gateway_move_killed_at_any_write_leaves_before_or_after(
    kind: str, op: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The same, LangGraph's delete_thread and the gateway's delete of the last item (a
    rewind) too, on every persistent backend, killed at every write in turn (a file change on
    a folder, a writing call, one transaction, on a database)."""
    move_rounds(kind, op, tmp_path, request, every=True)


# ----------------------------------------------------------- lifecycle moves of legacy files

#: op -> (the state before, the state after) of a context in the log beside its legacy file
LEGACY_MOVES = {"archive": ("hot", "archived"), "unarchive": ("archived", "hot")}
LEGACY_MOVES["delete"] = ("hot", "trashed")


def legacy_state(root: Path) -> str:
    """Where cli:m0 is, checking it reads whole and shows once, in that place only (a legacy
    file of it that a kill left out beside it is hidden by the log, archived or not), and that
    its legacy file is kept: beside it, packed with it, or in the trash."""
    context = ContextId.parse(NAMES[0])
    with FsStore(root) as store:
        trashed = [e.context for e in states.trashed_contexts(store)]
        listed = [row.context for row in contexts.list_contexts(store).rows]
        if store.get_head(context) is None:
            assert trashed == [NAMES[0]], trashed
            state = "trashed"
        else:
            assert trashed == [] and sessions.restore(store, context).history
            state = "archived" if states.is_archived(store, context) else "hot"
    assert listed.count(NAMES[0]) == (state == "hot"), (state, listed)
    out = outside_trash(root)[NAMES[0]]
    kept = [*root.glob(".trash/legacy/*/**/m0.json"), *root.rglob("legacy-1.json.zst")]
    assert out <= 1 and out + len(kept) >= 1, (out, kept)
    return state


def legacy_move_round(proc: subprocess.Popen[str], root: Path, op: str, kill: int) -> int:
    """A context imported from its legacy file (which stays), moved by ``op`` killed at file
    change ``kill``: before or after, its file where that state keeps it; repaired, rerun."""
    start, end = LEGACY_MOVES[op]
    write_legacy(root, NAMES[:2])
    with FsStore(root) as store:
        legacy.resume(store, ContextId.parse(NAMES[0]))
        if start == "archived":
            states.archive_context(store, ContextId.parse(NAMES[0]))
    request = {"kind": "fs", "where": str(root), "op": op, "context": NAMES[0], "kill": kill}
    answer = ask(proc, request)
    assert answer["killed"] == bool(kill) and answer["error"] in ("", None), answer
    state = legacy_state(root)
    assert state in (start, end), (kill, state)
    with FsStore(root) as store:
        assert fsck(store, repair=True) == []
    assert legacy_state(root) == state
    if state == start:
        assert ask(proc, {**request, "kill": 0})["error"] == ""
    assert legacy_state(root) == end
    assert outside_trash(root)[NAMES[0]] == (end == "hot") or end == "archived"
    return int(answer["writes"] or 0)


def legacy_move_rounds(proc: subprocess.Popen[str], tmp_path: Path, op: str, every: bool) -> None:
    total = legacy_move_round(proc, tmp_path / "counted", op, 0)
    for kill in points(total, every):
        legacy_move_round(proc, tmp_path / f"killed-{kill}", op, kill)


@pytest.mark.parametrize("op", sorted(LEGACY_MOVES))
def test_a_move_of_a_context_with_a_legacy_file_killed_part_way_keeps_the_file_once(
    gaps: subprocess.Popen[str], tmp_path: Path, op: str
) -> None:
    """``terrarium archive``, ``unarchive`` and ``delete`` of a context whose legacy file lies
    beside it, killed at a few file changes: the context in one state, its legacy file where
    that state keeps it (never lost, never out beside an archived or deleted context)."""
    legacy_move_rounds(gaps, tmp_path, op, every=False)


@pytest.mark.slow
@pytest.mark.parametrize("op", sorted(LEGACY_MOVES))
def test_a_move_of_a_context_with_a_legacy_file_killed_anywhere_keeps_the_file_once(
    gaps: subprocess.Popen[str], tmp_path: Path, op: str
) -> None:
    """The same, killed at every file change in turn."""
    legacy_move_rounds(gaps, tmp_path, op, every=True)
