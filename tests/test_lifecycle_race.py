"""Lifecycle commands racing each other and appends, in several processes, with no fault injected.

Four workers (``tests/helpers/race_child.py``) run random appends, archives, unarchives,
deletes, trash restores, purges, policy runs (``maintain``) and ``fsck --repair`` against one
store at once. Afterwards every context is in exactly one place (hot, archived or one trash
entry) unless a worker purged it, no call failed but for a context another worker had just
deleted, and every acknowledged message is in its context exactly once. The default run is a
few hundred calls per backend; ``slow`` runs thousands.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from helpers.race_child import open_spec
from pg import fresh_schema, pg_database  # noqa: F401  (the postgres store's database)
from terrarium import ContextId, Store, contexts, create_segment, sessions, states
from terrarium.stores.base import Lifecycle

CHILD = Path(__file__).with_name("helpers") / "race_child.py"
WORKERS = 4
STEADY = [f"race:steady-{i}" for i in range(6)]
CHURN = [f"race:churn-{i}" for i in range(6)]


def spec_of(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    """Where the store of ``kind`` lives, as the workers open it."""
    if kind == "fs":
        return {"kind": kind, "where": str(tmp_path / "sessions")}
    if kind == "sqlite":
        return {"kind": kind, "where": str(tmp_path / "race.db")}
    return {"kind": kind, "where": request.getfixturevalue("pg_database"), "schema": fresh_schema()}


def seed_store(store: Store) -> None:
    """Every context of both pools, with one message each."""
    for name in STEADY + CHURN:
        create_segment(store, context=name)
        head = store.get_head(ContextId.parse(name))
        assert head is not None
        sessions.save_user_input(store, head, f"first of {name}")


def run_workers(spec: dict[str, Any], tmp_path: Path, ops: int) -> list[dict[str, Any]]:
    """Run the workers to the end; every record they wrote."""
    procs = []
    for seed in range(WORKERS):
        out = tmp_path / f"worker-{seed}.jsonl"
        args = {**spec, "seed": seed, "ops": ops, "steady": STEADY, "churn": CHURN, "out": str(out)}
        procs.append((subprocess.Popen([sys.executable, str(CHILD), json.dumps(args)]), out))
    records: list[dict[str, Any]] = []
    for proc, out in procs:
        assert proc.wait(timeout=600) == 0
        records += [json.loads(line) for line in out.read_text().splitlines()]
    return records


def spurious(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Failed calls that no concurrent delete explains."""
    return [
        r
        for r in records
        if not r["ok"] and not (r.get("gone") and r.get("context") in [*CHURN, None])
    ]


def texts_of(store: Store, context: str) -> list[str]:
    """The user messages in every segment of the context's session."""
    head = store.get_head(ContextId.parse(context))
    assert head is not None, context
    found = []
    for segment in store.list_segments(head.session_id):
        for line in store.read_segment(head.session_id, segment).entries:
            if line.get("kind") == "user_input":
                found.append(line["item"]["content"])
    return found


def check(store: Store, records: list[dict[str, Any]]) -> None:
    """Nothing lost, nothing twice, no spurious error."""
    assert isinstance(store, Lifecycle)
    errors = [
        f"{r['op']} {r.get('context')}: {r['error']}\n{r.get('where', '')}"
        for r in spurious(records)
    ]
    assert errors == [], "\n".join(errors)
    purged = {r["purged"] for r in records if r.get("purged")}
    trashed = Counter(e.context for e in states.trashed_contexts(store))
    for name in STEADY + CHURN:
        live = store.get_head(ContextId.parse(name)) is not None
        assert live + trashed[name] <= 1, f"{name}: live {live}, {trashed[name]} trash entries"
    for entry in states.trashed_contexts(store):  # every removal can be undone
        states.restore_trashed(store, entry.trash_id)
    sent = {r["text"]: r["context"] for r in records if r["ok"] and r["op"] == "append"}
    for name in STEADY + CHURN:
        if store.get_head(ContextId.parse(name)) is None:
            assert name in purged, f"{name} lost"
            continue
        counts = Counter(texts_of(store, name))
        assert [t for t, n in counts.items() if n > 1] == [], name
        missing = [t for t, to in sent.items() if to == name and t not in counts]
        assert missing == [], f"{name}: {len(missing)} acknowledged messages missing"


@pytest.fixture(params=["fs", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def race_spec(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """A seeded store of each multi-process backend."""
    spec = spec_of(request.param, tmp_path, request)
    with open_spec(spec) as store:
        seed_store(store)
    return spec


def run_race(spec: dict[str, Any], tmp_path: Path, ops: int) -> None:
    records = run_workers(spec, tmp_path, ops)
    with open_spec(spec) as store:
        check(store, records)


def test_lifecycle_commands_racing_lose_nothing(race_spec: dict[str, Any], tmp_path: Path) -> None:
    """Four processes archiving, waking, deleting, restoring, purging, maintaining, repairing and
    appending at once: no context lost, no spurious error, every acknowledged message once."""
    run_race(race_spec, tmp_path, ops=80)


@pytest.mark.slow
def test_lifecycle_commands_racing_lose_nothing_long(
    race_spec: dict[str, Any], tmp_path: Path
) -> None:
    """The same race, a thousand calls per worker."""
    run_race(race_spec, tmp_path, ops=1000)


def test_deletes_at_once_keep_every_context_in_the_trash(
    race_spec: dict[str, Any], tmp_path: Path
) -> None:
    """Two processes deleting their own contexts at once: every one waits in the trash,
    restorable (a clean-up of killed moves once deleted entries another delete had just made)."""
    names = [[f"race:del-{w}-{i}" for i in range(100)] for w in range(2)]
    with open_spec(race_spec) as store:
        for name in names[0] + names[1]:
            create_segment(store, context=name)
    procs = [
        subprocess.Popen([sys.executable, str(CHILD), json.dumps({**race_spec, "delete": mine})])
        for mine in names
    ]
    assert [proc.wait(timeout=300) for proc in procs] == [0, 0]
    with open_spec(race_spec) as store:
        assert isinstance(store, Lifecycle)
        trashed = Counter(e.context for e in states.trashed_contexts(store))
        assert sorted(trashed) == sorted(names[0] + names[1])
        assert set(trashed.values()) == {1}
        for entry in states.trashed_contexts(store):
            states.restore_trashed(store, entry.trash_id)
        for name in names[0] + names[1]:
            assert store.get_head(ContextId.parse(name)) is not None, name


def kill_rounds(spec: dict[str, Any], rounds: int) -> None:
    """Kill a process changing states at random points, ``rounds`` times; check after each."""
    names = [f"kill:c{i}" for i in range(5)]
    rng = random.Random(20261128)
    for number in range(rounds):
        args = {**spec, "seed": number, "churn": names, "forever": True}
        child = subprocess.Popen(
            [sys.executable, str(CHILD), json.dumps(args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            for _ in range(rng.randint(2, 25)):
                assert child.stdout.readline(), child.communicate()[1]
        finally:
            child.kill()
            child.communicate()
        assert child.returncode == -9
        with open_spec(spec) as store:
            check_one_state(store, names)
    with open_spec(spec) as store:
        assert isinstance(store, Lifecycle)
        for number, entry in enumerate(states.trashed_contexts(store)):
            back = ContextId("restored", f"t{number}")
            states.restore_trashed(store, entry.trash_id, as_context=back)
            assert len(sessions.restore(store, back).history) == entry.message_count
            assert states.is_archived(store, back) == entry.archived


def check_one_state(store: Store, names: list[str]) -> None:
    """Each context is hot, archived or gone (never two), reads whole, with the count its
    listing shows, once a store on the shared lifecycle has finished what a kill cut in two
    (a restore or a purge: ``finish_lifecycle``, as ``fsck --repair`` runs it)."""
    assert isinstance(store, Lifecycle)
    states.finish_lifecycle(store)
    assert states.unfinished_lifecycle(store) == []
    hot = {c.context_id: c.message_count for c in contexts.list_contexts(store).rows}
    cold = {a.context: a.message_count for a in states.archived_contexts(store)}
    assert not set(hot) & set(cold), "a context is both hot and archived"
    for name in names:
        ctx = ContextId.parse(name)
        if name in hot or name in cold:
            state = sessions.restore(store, ctx)
            assert len(state.history) == {**hot, **cold}[name]
            assert all(str(i["content"]).startswith(name) for i in state.history)
        else:
            assert store.get_head(ctx) is None


@pytest.mark.parametrize("kind", ["fs", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_sigkill_during_state_changes_leaves_one_readable_state(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A process killed at random points of create, archive, unarchive, delete, restore,
    purge and wake-on-append (a few rounds; SQLite's own rounds are in test_lifecycle_sql):
    every context is in one state and reads whole; every trash entry restores whole."""
    kill_rounds(spec_of(kind, tmp_path, request), 4)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fs", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_sigkill_during_state_changes_long(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The same, 20 rounds."""
    kill_rounds(spec_of(kind, tmp_path, request), 20)
