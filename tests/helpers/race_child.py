"""A worker of the lifecycle race (``tests/test_lifecycle_race.py``), in a process of its own.

Run as ``python tests/helpers/race_child.py SPEC`` where SPEC is JSON: the store (``kind``,
``where``, ``schema``), the worker's ``seed``, how many ``ops`` to run, the two pools of
contexts (``steady``: archived and woken but never deleted; ``churn``: deleted, restored and
purged too) and the ``out`` file. It runs random lifecycle calls and appends with no fault
injected, and writes one JSON line per call to ``out``: ``{"op", "context", "ok", "error",
"text"}``. An append is acknowledged when ``ok`` is true; a purge that removed a trash entry
names the context it held (``purged``).
"""

from __future__ import annotations

import json
import random
import sys
import traceback
from datetime import UTC, datetime, timedelta
from typing import Any

from terrarium import ContextId, FsStore, Store, lifecycle, sessions, states
from terrarium.errors import ContextNotFound, NotInTrash, SegmentNotFound

#: Errors a call may meet when another worker deleted or restored its context meanwhile.
GONE = (ContextNotFound, SegmentNotFound, NotInTrash)


def open_spec(spec: dict[str, Any]) -> Store:
    """The store the spec names."""
    if spec["kind"] == "fs":
        return FsStore(spec["where"])
    if spec["kind"] == "sqlite":
        from terrarium.stores.sqlite import SqliteStore

        return SqliteStore(spec["where"])
    from terrarium.stores.postgres import PostgresStore

    return PostgresStore(spec["where"], schema=spec["schema"])


def append(store: Store, context: str, text: str) -> None:
    """One user message at the context's head (an archived context wakes first)."""
    head = store.get_head(ContextId.parse(context))
    if head is None:
        raise ContextNotFound(f"no context {context}")
    sessions.save_user_input(store, head, text)


def maintain(store: Store) -> None:
    """A policy run that finds every context idle: it archives all but the pinned."""
    rule = lifecycle.RetentionRule(archive_after=timedelta(hours=1))
    policy = lifecycle.RetentionPolicy(default=rule, source="race")
    later = datetime.now(UTC) + timedelta(days=2)
    lifecycle.Maintenance(store, policy=policy, clock=lambda: later).run()


def fsck_repair(store: Store) -> None:
    """``terrarium fsck --repair`` on this store."""
    import click

    from terrarium.cli.app import CliState
    from terrarium.cli.fsck import run_fsck

    state = CliState()
    state._store = store
    shown: list[Any] = []
    state.out.json = shown.append  # type: ignore[method-assign]
    try:
        run_fsck(state, repair=True, salvage=False, as_json=True)
    except click.exceptions.Exit as exc:
        problems = [p for p in shown[0]["problems"] if not p.get("repaired")]
        raise AssertionError(f"fsck --repair left {problems}") from exc


def purge_one(store: Store, rng: random.Random, churn: list[str]) -> str | None:
    """Purge a trash entry of the churn pool; the context it held, or None."""
    entries = [e for e in states.trashed_contexts(store) if e.context in churn]
    if not entries:
        return None
    entry = rng.choice(entries)
    return entry.context if states.purge_trashed(store, entry.trash_id) else None


def restore_one(store: Store, rng: random.Random, churn: list[str]) -> str | None:
    """Restore a trash entry of the churn pool; the context it held, or None."""
    entries = [e for e in states.trashed_contexts(store) if e.context in churn]
    if not entries:
        return None
    entry = rng.choice(entries)
    states.restore_trashed(store, entry.trash_id)
    return entry.context


def step(
    store: Store, rng: random.Random, spec: dict[str, Any], n: int, record: dict[str, Any]
) -> None:
    """One random call, described in ``record`` before it runs."""
    steady, churn = spec["steady"], spec["churn"]
    op = rng.choices(
        ["append", "archive", "unarchive", "delete", "restore", "purge", "maintain", "fsck"],
        weights=spec.get("weights", [40, 12, 12, 8, 8, 3, 2, 2]),
    )[0]
    context = rng.choice(steady + churn)
    record.update(op=op, context=context)
    if op == "append":
        record["text"] = f"w{spec['seed']}-{n}"
        append(store, context, record["text"])
    elif op == "archive":
        states.archive_context(store, ContextId.parse(context))
    elif op == "unarchive":
        states.unarchive_context(store, ContextId.parse(context))
    elif op == "delete":
        context = record["context"] = rng.choice(churn)
        lifecycle.delete_context(store, ContextId.parse(context), why="race")
    elif op == "restore":
        record["context"] = None
        record["context"] = restore_one(store, rng, churn)
    elif op == "purge":
        record["context"] = None
        record["purged"] = purge_one(store, rng, churn)
    elif op == "maintain":
        maintain(store)
    else:
        fsck_repair(store)


def churn_forever(store: Store, spec: dict[str, Any]) -> None:
    """Random state changes and appends, each printed once done, until killed."""
    from terrarium.model import Item

    rng = random.Random(spec["seed"])
    while True:
        name = rng.choice(spec["churn"])
        ctx = ContextId.parse(name)
        trash = [t for t in states.trashed_contexts(store) if t.context == name]
        head = store.get_head(ctx)
        if head is None and not trash:
            sessions.create_segment(store, None, context=name)
            head = store.get_head(ctx)
            assert head is not None
            sessions.save_delta(store, head, [Item.user(f"{name} {i}") for i in range(50)])
            op = "create"
        elif head is None:
            op = "restore"
            states.restore_trashed(store, trash[0].trash_id)
        else:
            op = rng.choice(["archive", "unarchive", "delete", "purge", "append"])
            if op == "append":
                sessions.save_delta(store, head, [Item.user(f"{name} more")])
            elif op == "purge":
                states.purge_context(store, ctx)
            elif op == "delete":
                states.delete_context(store, ctx)
            else:
                getattr(states, f"{op}_context")(store, ctx)
        print(json.dumps({"op": op, "context": name}), flush=True)


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec.get("forever"):
        with open_spec(spec) as store:
            churn_forever(store, spec)
    if "delete" in spec:  # only delete these, in order
        with open_spec(spec) as store:
            for name in spec["delete"]:
                assert lifecycle.delete_context(store, ContextId.parse(name), why="race"), name
        return
    rng = random.Random(spec["seed"])
    with open_spec(spec) as store, open(spec["out"], "w") as out:
        for n in range(spec["ops"]):
            record: dict[str, Any] = {"n": n, "ok": False}
            try:
                step(store, rng, spec, n, record)
                record["ok"] = True
            except GONE as exc:
                record.update(gone=True, error=repr(exc))
            except Exception as exc:
                record.update(gone=False, error=repr(exc), where=traceback.format_exc(limit=-4))
            out.write(json.dumps(record) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
