"""A worker of the lifecycle race (``tests/test_lifecycle_race.py``), in a process of its own.

Run as ``python tests/helpers/race_child.py SPEC`` where SPEC is JSON: the store (``kind``,
``where``, ``schema``), the worker's ``seed``, how many ``ops`` to run, the pools of contexts
(``steady``: archived, woken, pinned, forked, cleared, rewound and compacted but never deleted;
``churn``: deleted, restored and purged too), the folder of the ``sources`` that copies and
imports bring in (``source_of``), the time ``gc_before`` which blob collection may collect up
to, and the ``out`` file; optionally the seed of its random choices (``rng``, the ``seed`` by
default) and ``weights`` that replace some of ``WEIGHTS``. It runs random calls with no fault
injected and writes one JSON line per call to ``out``: ``{"n", "op", "context", "ok",
"error"}`` and what the call acknowledged (an append's ``text`` and where it went, a fork's
``target``, a compaction's ``summary``, a rewind's ``dropped`` texts, a pin's ``t0``/``t1``, a
policy run's ``archived``, a purge's ``purged``, a copy's or an import's ``source`` and
report). ``gone``: the call met a context another worker had just deleted or purged.
"""

from __future__ import annotations

import faulthandler
import json
import random
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from terrarium import ContextId, FsStore, Store, contexts, lifecycle, sessions, states
from terrarium.copy import CopyReport
from terrarium.errors import ContextNotFound, InvalidEntry, NotInTrash, SegmentNotFound
from terrarium.stores.base import Reindexable, context_lock
from terrarium.stores.locks import file_lock

#: Errors a call may meet when another worker deleted or restored its context meanwhile.
GONE = (ContextNotFound, SegmentNotFound, NotInTrash)

#: Every call a worker makes, with its default weight.
WEIGHTS = {
    "append": 30,
    "archive": 8,
    "unarchive": 8,
    "delete": 6,
    "restore": 6,
    "purge": 2,
    "maintain": 2,
    "fsck": 1,
    "fork": 3,
    "clear": 2,
    "rewind": 4,
    "compact": 3,
    "pin": 3,
    "unpin": 2,
    "copy_out": 2,
    "copy_in": 2,
    "import": 2,
    "reindex": 1,
    "gc": 2,
}


def open_spec(spec: dict[str, Any]) -> Store:
    """The store the spec names."""
    if spec["kind"] == "fs":
        return FsStore(spec["where"])
    if spec["kind"] == "sqlite":
        from terrarium.stores.sqlite import SqliteStore

        return SqliteStore(spec["where"])
    from terrarium.stores.postgres import PostgresStore

    return PostgresStore(spec["where"], schema=spec["schema"])


def append(store: Store, context: str, text: str, record: dict[str, Any]) -> None:
    """One user message at the context's head (an archived context wakes first); where it
    went is noted in ``record``."""
    head = store.get_head(ContextId.parse(context))
    if head is None:
        raise ContextNotFound(f"no context {context}")
    record.update(session=str(head.session_id), segment=str(head.segment_id))
    record["seq"] = sessions.save_user_input(store, head, text).seq


def maintain(store: Store, record: dict[str, Any]) -> None:
    """A policy run that finds every context idle: it archives all but the pinned."""
    rule = lifecycle.RetentionRule(archive_after=timedelta(hours=1))
    policy = lifecycle.RetentionPolicy(default=rule, source="race")
    later = datetime.now(UTC) + timedelta(days=2)
    report = lifecycle.Maintenance(store, policy=policy, clock=lambda: later).run()
    record["archived"] = [[a.context, a.archived_at] for a in report.archived]


def fsck_repair(store: Store) -> None:
    """``terrarium fsck --repair`` on this store."""
    problems = fsck(store, repair=True)
    if problems:
        raise AssertionError(f"fsck --repair left {problems}")


def fsck(store: Store, *, repair: bool) -> list[dict[str, Any]]:
    """``terrarium fsck [--repair]`` on this store: the problems it left."""
    import click

    from terrarium.cli.app import CliState
    from terrarium.cli.fsck import run_fsck

    state = CliState()
    state._store = store
    shown: list[Any] = []
    state.out.json = shown.append  # type: ignore[method-assign]
    try:
        run_fsck(state, repair=repair, salvage=False, as_json=True)
    except click.exceptions.Exit:
        return [p for p in shown[0]["problems"] if not p.get("repaired")]
    return []


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


def fork(store: Store, context: str, record: dict[str, Any]) -> None:
    """``terrarium fork`` of the context into a new context of the worker's own."""
    target = record["target"] = f"race:fork-w{record['seed']}-{record['n']}"
    contexts.fork_context(store, ContextId.parse(context), ContextId.parse(target))


def rewind(store: Store, context: str, record: dict[str, Any]) -> None:
    """``terrarium rewind`` by one item; an empty history refuses it (``empty``)."""
    try:
        dropped = contexts.rewind_context(store, ContextId.parse(context), 1)
    except InvalidEntry as exc:
        if "its history has only 0" not in str(exc):
            raise
        record["empty"] = True
        return
    record["dropped"] = [str(item.get("content")) for item in dropped]


def compact(store: Store, context: str, record: dict[str, Any]) -> None:
    """A compaction as the manager makes it, without a model: under the context's lock, a
    new segment whose history is a summary and the last two items, and the head moved."""
    ctx = ContextId.parse(context)
    summary = record["summary"] = f"{context} summary w{record['seed']}-{record['n']}"
    with context_lock(store, ctx):
        state = sessions.restore(store, ctx)
        history = [{"role": "user", "content": summary}, *state.history[-2:]]
        sessions.create_compacted_segment(store, state, history, context=ctx)


def pin(store: Store, context: str, record: dict[str, Any], pinned: bool) -> None:
    """Pin or unpin, with when the call began and ended (``t0``, ``t1``: UTC stamps)."""
    record["t0"] = datetime.now(UTC).isoformat()
    record["done"] = states.pin_context(store, ContextId.parse(context), pinned)
    record["t1"] = datetime.now(UTC).isoformat()


def copy_out(store: Store) -> None:
    """``terrarium copy`` of the whole racing store into a fresh store: what it copied reads
    whole and nothing of it conflicts."""
    from terrarium.copy import copy_store
    from terrarium.stores.memory import MemoryStore

    there = MemoryStore()
    report = copy_store(store, there)
    assert report.conflicts == [], report.conflicts
    for name in report.copied:
        if not name.startswith("session "):
            sessions.restore(there, ContextId.parse(name))


def source_of(folder: str | Path, number: int) -> tuple[dict[str, Any], Path]:
    """Source ``number`` in ``folder``: its store and its bundle, built by the first worker that
    asks (``helpers.copies.fill``'s every shape of a session tree, a blob, a detached session,
    archived and pinned contexts), under contexts ``copy:s{number}-00``... of its own."""
    source = {"kind": "sqlite", "where": str(Path(folder) / f"source-{number}.db")}
    bundle = Path(folder) / f"source-{number}.tar.gz"
    with file_lock(Path(folder) / f"source-{number}.lock"):
        if not bundle.exists():
            from helpers.copies import fill
            from terrarium.export import export_many

            with open_spec(source) as store:
                fill(store, 6, archived=1, big=True, prefix=f"copy:s{number}-")
                export_many(store, None, "jsonl", bundle)
    return source, bundle


def bring_in(spec: dict[str, Any], store: Store, record: dict[str, Any]) -> None:
    """``terrarium copy`` of a source store into the racing store, or ``terrarium import`` of
    its bundle. A worker's k-th call brings in source k, as every other worker's k-th does: each
    source is new to the racing store when the first call brings it in, and the workers' calls
    of one source may meet."""
    from terrarium.bundle import import_bundle
    from terrarium.copy import copy_store

    number = record["source"] = spec.get("brought", 0)
    spec["brought"] = number + 1
    source, bundle = source_of(spec["sources"], number)
    if record["op"] == "import":
        note_copy(import_bundle(store, bundle), record)
        return
    with open_spec(source) as there:
        note_copy(copy_store(there, store), record)


def note_copy(report: CopyReport, record: dict[str, Any]) -> None:
    """What a copy or an import did; only "already there" is a reason to skip."""
    record["report"] = {"copied": report.copied, "skipped": report.skipped}
    odd = [s for s in report.skipped if s[0] not in report.present]
    assert report.conflicts == [] and odd == [], report


def reindex(store: Store) -> None:
    """``terrarium reindex``."""
    if isinstance(store, Reindexable):
        store.reindex()


def collect_blobs(spec: dict[str, Any], store: Store) -> None:
    """Blob collection that may take any blob put before the race began (``gc_before``):
    one put during it may be about to be named, which the real age limit guards."""
    from terrarium.blobs import collect_garbage

    collect_garbage(store, min_age=time.time() - spec["gc_before"])


def on_context(op: str) -> Callable[[Store, str, dict[str, Any]], None]:
    """The call ``op`` that names one context."""
    calls: dict[str, Callable[[Store, str, dict[str, Any]], Any]] = {
        "append": lambda s, c, r: append(s, c, r["text"], r),
        "archive": lambda s, c, r: states.archive_context(s, ContextId.parse(c)),
        "unarchive": lambda s, c, r: states.unarchive_context(s, ContextId.parse(c)),
        "delete": lambda s, c, r: lifecycle.delete_context(s, ContextId.parse(c), why="race"),
        "fork": fork,
        "clear": lambda s, c, r: contexts.clear_context(s, ContextId.parse(c)),
        "rewind": rewind,
        "compact": compact,
        "pin": lambda s, c, r: pin(s, c, r, True),
        "unpin": lambda s, c, r: pin(s, c, r, False),
    }
    return calls[op]


def step(
    store: Store, rng: random.Random, spec: dict[str, Any], n: int, record: dict[str, Any]
) -> None:
    """One random call, described in ``record`` before it runs."""
    steady, churn = spec["steady"], spec["churn"]
    weights = {**WEIGHTS, **spec.get("weights", {})}
    op = rng.choices(list(weights), weights=list(weights.values()))[0]
    if n == 0 and "sources" in spec:  # every worker brings the same sessions in at once
        op = "copy_in" if spec["seed"] % 2 else "import"
    context = rng.choice(churn if op == "delete" else steady + churn)
    record.update(op=op, context=context, seed=spec["seed"])
    if op == "append":
        record["text"] = f"w{spec['seed']}-{n}"
    if op in {"restore", "purge"}:
        record["context"] = None
        found = (restore_one if op == "restore" else purge_one)(store, rng, churn)
        record["context" if op == "restore" else "purged"] = found
    elif op == "maintain":
        maintain(store, record)
    elif op == "fsck":
        fsck_repair(store)
    elif op in {"copy_out", "copy_in", "import", "reindex", "gc"}:
        record["context"] = None
        if op == "copy_out":
            copy_out(store)
        elif op in {"copy_in", "import"}:
            bring_in(spec, store, record)
        else:
            reindex(store) if op == "reindex" else collect_blobs(spec, store)
    else:
        on_context(op)(store, context, record)


HEAD_MOVES = ("clear", "rewind", "compact", "pin", "unpin")


def move_head(store: Store, op: str, name: str) -> None:
    """A clear, a rewind, a compaction (every item its context's), or a pin, for the kills."""
    record = {"seed": "k", "n": 0}
    if op == "clear":
        contexts.clear_context(store, ContextId.parse(name))
    elif op == "rewind":
        rewind(store, name, record)
    elif op == "compact":
        compact(store, name, record)
    else:
        states.pin_context(store, ContextId.parse(name), op == "pin")


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
            op = rng.choice(["archive", "unarchive", "delete", "purge", "append", *HEAD_MOVES])
            if op == "append":
                sessions.save_delta(store, head, [Item.user(f"{name} more")])
            elif op in HEAD_MOVES:
                move_head(store, op, name)
            elif op == "purge":
                states.purge_context(store, ctx)
            elif op == "delete":
                states.delete_context(store, ctx)
            else:
                getattr(states, f"{op}_context")(store, ctx)
        print(json.dumps({"op": op, "context": name}), flush=True)


def main() -> None:
    faulthandler.enable()  # SIGABRT: the race shows a hung worker's stack
    sys.path.insert(0, str(Path(__file__).parents[1]))  # ``helpers.copies``, as the tests import
    spec = json.loads(sys.argv[1])
    if spec.get("forever"):
        with open_spec(spec) as store:
            churn_forever(store, spec)
    if "delete" in spec:  # only delete these, in order
        with open_spec(spec) as store:
            for name in spec["delete"]:
                assert lifecycle.delete_context(store, ContextId.parse(name), why="race"), name
        return
    rng = random.Random(spec.get("rng", spec["seed"]))
    with open_spec(spec) as store, open(spec["out"], "w") as out:
        for n in range(spec["ops"]):
            record: dict[str, Any] = {"n": n, "ok": False}
            try:
                step(store, rng, spec, n, record)
                record["ok"] = True
            except GONE as exc:
                record.update(gone=True, error=repr(exc), where=traceback.format_exc(limit=-6))
            except Exception as exc:
                record.update(gone=False, error=repr(exc), where=traceback.format_exc(limit=-4))
            out.write(json.dumps(record) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
