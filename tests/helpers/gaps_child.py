"""A worker of ``tests/test_race_gaps.py``, in a process of its own, and the kill server of
``tests/test_gaps_kill.py``.

Run as ``python tests/helpers/gaps_child.py SPEC`` where SPEC is JSON: the store (``kind``,
``where``, ``schema``, as ``race_child.open_spec`` reads it), the worker's ``seed``, ``ops``,
``weights`` (the calls it makes: ``migrate``, ``import`` and ``resume`` of legacy files, the
adapters' ``agents_*`` and ``graph_*``, the gateway's ``gw_*`` requests to ``url``, and the
lifecycle commands), the pools of context names (``kept``: never purged; ``doomed``: deleted and
purged too) and the ``out`` file. It makes random calls with no fault injected and writes one
JSON line per call: ``{"n", "op", "context", "ok", "error"}`` and what the call acknowledged
(``deleted``, an added item's ``text``, a migration's ``failures``, ...); ``gone``: it met a
context, file or trash entry another worker had just moved or deleted.

Run as ``python tests/helpers/gaps_child.py serve [sdks]``, it answers each JSON line on stdin
(a store spec, ``op``, ``context``, ``kill``, ``item``) with one call made in a forked process
SIGKILLed just before its ``kill``-th write (:func:`killable`).
"""

from __future__ import annotations

import faulthandler
import io
import json
import random
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from race_child import open_spec

from terrarium import ContextId, legacy, lifecycle, sessions, states
from terrarium.errors import ContextExists, NotInTrash
from terrarium.stores.base import Store, context_lock

Call = Callable[[Store, ContextId, dict[str, Any]], None]


def migrate(store: Store, record: dict[str, Any], to_log: bool) -> None:
    """``terrarium migrate`` (``--to-log``) of the store's own folder."""
    from terrarium.migrate import migrate

    root = legacy.legacy_root(store)
    assert root is not None
    report = migrate(root, to_log=to_log, store=store if to_log else None, out=io.StringIO())
    record["failures"] = report.failures
    assert report.failed == 0, report.failures


def import_file(store: Store, record: dict[str, Any], rng: random.Random) -> None:
    """``terrarium import FILE`` of one of the store's own legacy files (an equal context
    already there is "already there")."""
    from terrarium.cli.app import CliState
    from terrarium.cli.commands import import_file

    root = legacy.legacy_root(store)
    assert root is not None
    files = sorted(legacy.iter_legacy_files(root))
    if not files:
        return
    path = record["path"] = str(rng.choice(files))
    state = CliState()
    state._store = store
    try:
        record["context"], _ = import_file(state, Path(path), None)
    except ContextExists:
        record["present"] = True
    except FileNotFoundError:  # moved by a migration, or deleted, since the listing
        record["gone"] = True


def resume(store: Store, context: ContextId, record: dict[str, Any]) -> None:
    """A turn's first write, as the manager makes it: under the context's lock, its legacy
    file imported (if only that holds it), then a message appended at its head."""
    with context_lock(store, context):
        legacy.import_legacy(store, context)
        head = store.get_head(context)
        if head is None:
            record["gone"] = True
            return
        sessions.save_user_input(store, head, record["text"])
        record["appended"] = True


def archive(store: Store, context: ContextId, record: dict[str, Any]) -> None:
    """``terrarium archive CONTEXT``: a legacy-only context is imported first."""
    from terrarium.errors import ContextNotFound

    try:
        plan = lifecycle.plan_archive(store, names=[context])
    except ContextNotFound:
        record["gone"] = True
        return
    record["archived"] = len(lifecycle.run_archive(store, plan, why="race"))


def agents(store: Store, context: ContextId, record: dict[str, Any]) -> None:
    """One call of the Agents SDK adapter (``record["op"]``: ``agents_add``, ``_pop``,
    ``_clear`` or ``_get``) on the session whose context is ``context``."""
    import asyncio

    from terrarium.integrations.openai_agents import TerrariumSession

    session = TerrariumSession(context.name, store, context=context)
    op = record["op"].removeprefix("agents_")
    if op == "add":
        item = {"role": "user", "content": record["text"]}
        asyncio.run(session.add_items([item]))  # type: ignore[list-item]
    elif op == "pop":
        popped = asyncio.run(session.pop_item())
        record["popped"] = None if popped is None else popped.get("content")  # type: ignore[union-attr]
    elif op == "clear":
        asyncio.run(session.clear_session())
    else:
        record["items"] = len(asyncio.run(session.get_items()))


def graph(store: Store, context: ContextId, record: dict[str, Any]) -> None:
    """One call of the LangGraph adapter (``graph_put``, ``_writes``, ``_get``, ``_delete``) on
    the thread whose context is ``context``."""
    from langgraph.checkpoint.base import empty_checkpoint

    from terrarium.integrations.langgraph import TerrariumSaver

    saver = TerrariumSaver(store, context_type=context.type)
    config: Any = {"configurable": {"thread_id": context.name, "checkpoint_ns": ""}}
    op = record["op"].removeprefix("graph_")
    if op == "delete":
        saver.delete_thread(context.name)
        return
    latest = saver.get_tuple(config)
    record["found"] = latest is not None
    if op == "put":
        if latest is not None:
            config = latest.config
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"text": record["text"]}
        checkpoint["channel_versions"] = {"text": record["n"] + 1}
        saver.put(config, checkpoint, {"step": record["n"]}, {"text": record["n"] + 1})
    elif op == "writes" and latest is not None:
        saver.put_writes(latest.config, [("text", record["text"])], f"task-{record['text']}")


def trash_call(store: Store, context: ContextId, record: dict[str, Any]) -> None:
    """``terrarium trash restore`` or ``trash purge`` of a trash entry of ``context``."""
    entries = [e for e in states.trashed_contexts(store) if e.context == str(context)]  # type: ignore[arg-type]
    if not entries:
        return
    if record["op"] == "restore":
        try:
            states.restore_trashed(store, entries[0].trash_id)  # type: ignore[arg-type]
        except ContextExists:  # created anew since its delete: the entry waits
            record["exists"] = True
        except NotInTrash:  # restored or purged by another worker meanwhile
            record["gone"] = True
    else:
        states.purge_trashed(store, entries[0].trash_id)  # type: ignore[arg-type]


#: The gateway's URL (``/v1``), and the responses this worker made through it.
GATEWAY: dict[str, Any] = {"url": "", "responses": []}


def gateway(store: Store, context: ContextId, record: dict[str, Any]) -> None:
    """One request to the gateway (``gw_add``, ``_get``, ``_drop``: an item deleted,
    ``_delete``: the conversation, ``_respond``: a response in it, ``_unrespond``: one of this
    worker's responses deleted) on the conversation of ``context``; a 404 is ``gone``."""
    import httpx

    op, conversation = record["op"].removeprefix("gw_"), f"/conversations/{context.name}"
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ""}]}
    item["content"][0]["text"] = record["text"]  # type: ignore[index]
    with httpx.Client(base_url=GATEWAY["url"], timeout=60) as client:
        if op == "add":
            answer = client.post(f"{conversation}/items", json={"items": [item]})
        elif op in ("get", "drop"):
            answer = client.get(f"{conversation}/items", params={"limit": 100})
            items = answer.json().get("data") or [] if answer.status_code == 200 else []
            if op == "drop" and items:
                answer = client.delete(f"{conversation}/items/{random.choice(items)['id']}")
        elif op == "delete":
            answer = client.delete(conversation)
        elif op == "respond":
            body = {"model": "fake-model", "input": record["text"], "conversation": context.name}
            answer = client.post("/responses", json=body)
            if answer.status_code == 200:
                record["response"] = answer.json()["id"]
                GATEWAY["responses"].append(record["response"])
        elif GATEWAY["responses"]:
            record["response"] = GATEWAY["responses"].pop(0)
            answer = client.delete(f"/responses/{record['response']}")
        else:
            return
    record["status"] = answer.status_code
    record["gone"] = answer.status_code == 404
    assert answer.status_code in (200, 404), answer.text


CALLS: dict[str, Call] = {
    **dict.fromkeys((f"gw_{op}" for op in ("add", "get", "drop", "delete", "respond")), gateway),
    "gw_unrespond": gateway,
    **dict.fromkeys(("agents_add", "agents_pop", "agents_clear", "agents_get"), agents),
    **dict.fromkeys(("graph_put", "graph_writes", "graph_get", "graph_delete"), graph),
    "restore": trash_call,
    "purge": trash_call,
    "purge_context": lambda s, c, r: r.update(purged=states.purge_context(s, c)),  # type: ignore[arg-type]
    "delete": lambda s, c, r: r.update(deleted=lifecycle.delete_context(s, c, why="race")),
    "archive": archive,
    "unarchive": lambda s, c, r: r.update(done=states.unarchive_context(s, c)),  # type: ignore[arg-type]
    "resume": resume,
}


def step(store: Store, rng: random.Random, spec: dict[str, Any], record: dict[str, Any]) -> None:
    """One random call, described in ``record`` before it runs."""
    weights = spec["weights"]
    op = rng.choices(list(weights), weights=list(weights.values()))[0]
    pool = spec["kept"] + spec["doomed"]
    if op.startswith(("agents_", "graph_", "gw_")):  # an adapter's or the gateway's own
        kind = {"agents": "agents:", "graph": "langgraph:", "gw": "conv:"}[op.partition("_")[0]]
        pool = [name for name in pool if name.startswith(kind)]
    elif op in ("delete", "purge", "purge_context"):
        pool = spec["doomed"]
    record.update(op=op, context=rng.choice(pool))
    if op in ("migrate", "migrate_log"):
        record["context"] = None
        migrate(store, record, op == "migrate_log")
    elif op == "import":
        record["context"] = None
        import_file(store, record, rng)
    else:
        record["text"] = f"w{spec['seed']}-{record['n']}"
        CALLS[op](store, ContextId.parse(record["context"]), record)


def killable(request: dict[str, Any]) -> list[Any]:
    """Open the store, count its writes (SIGKILL just before write ``kill``), make the call
    ``op`` (an adapter's, or the gateway's ledger's ``drop`` of the item ``item``); the count,
    and the error the call raised if any."""
    from fs_child import _count_mutations
    from ops_child import count_calls

    from terrarium.gateway.ledger import Ledger

    if request["kind"] == "fs":
        count = _count_mutations(request["kill"])
    error = ""
    with open_spec(request) as store:
        if request["kind"] != "fs":
            count = count_calls(store, request["kill"])
        context = ContextId.parse(request["context"])
        try:
            if request["op"] == "gw_drop":
                assert Ledger(store).delete_item(context, request["item"])
            else:
                CALLS[request["op"]](store, context, {"op": request["op"], "n": 0, "text": ""})
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
    return [count[0], error]


def serve(sdks: bool) -> None:
    """The kill tests' server: for each JSON line on stdin (a store spec, ``op``, ``context``,
    ``kill``, ``item``), :func:`killable` in a forked process; answers ``{"killed", "writes",
    "error"}``. ``sdks``: the adapters' frameworks imported first (seconds), for their calls."""
    from forked import answer_each

    import terrarium.gateway.ledger
    import terrarium.stores.fs
    import terrarium.stores.sqlite

    if sdks:
        import terrarium.integrations.langgraph
        import terrarium.integrations.openai_agents  # noqa: F401

    answer_each(killable)


def main() -> None:
    faulthandler.enable()  # SIGABRT: a hung worker's stack
    if sys.argv[1] == "serve":
        serve(sdks=sys.argv[2:] == ["sdks"])
        return
    spec = json.loads(sys.argv[1])
    GATEWAY["url"] = spec.get("url", "")
    rng = random.Random(spec["seed"])
    with open_spec(spec) as store, open(spec["out"], "w") as out:
        for n in range(spec["ops"]):
            record: dict[str, Any] = {"n": n, "ok": False, "seed": spec["seed"]}
            try:
                step(store, rng, spec, record)
                record["ok"] = True
            except Exception as exc:
                record.update(error=repr(exc), where=traceback.format_exc(limit=-4))
            out.write(json.dumps(record) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
