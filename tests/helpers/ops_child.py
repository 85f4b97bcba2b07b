"""Child process of ``tests/test_ops_kill.py``: one policy run, fork, reindex or blob
collection per request, SIGKILLed just before its n-th write.

Run as ``python tests/helpers/ops_child.py``. For each JSON line on stdin (the store spec of
``race_child.open_spec``, ``op``, ``kill`` and a fork's ``source`` and ``target``) it forks a
process that opens the store, runs the command and is SIGKILLed just before write number
``kill`` (0: never). What a write is depends on the store: on a folder, a file change of the
process (``fs_child._count_mutations``); on a database, a call of a store method that writes
(one transaction: a kill inside one is a kill before it). It answers ``{"killed", "writes",
"error"}`` on stdout.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from copy_child import WRITES
from forked import answer_each
from fs_child import _count_mutations
from race_child import open_spec

from terrarium import contexts, index, lifecycle
from terrarium.blobs import collect_garbage
from terrarium.model import ContextId
from terrarium.stores.base import Store


def count_calls(store: Store, kill: int) -> list[int]:
    """Wrap the store's writing methods so the process dies just before call ``kill``."""
    count = [0]

    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            if count[0] == kill:
                os.kill(os.getpid(), signal.SIGKILL)
            return method(*args, **kwargs)

        return counted

    for name in (*WRITES, "delete_unreferenced_blobs"):
        if hasattr(store, name):
            setattr(store, name, wrap(getattr(store, name)))
    return count


def run(store: Store, request: dict[str, Any]) -> None:
    """The command ``op`` names: ``maintain`` (every context idle: it archives all but the
    pinned and purges the trash), ``fork``, ``reindex`` or ``gc`` (any unreferenced blob)."""
    op = request["op"]
    if op == "maintain":
        rule = lifecycle.RetentionRule(
            archive_after=timedelta(hours=1), purge_trash_after=timedelta(hours=1)
        )
        policy = lifecycle.RetentionPolicy(default=rule, source="kill")
        later = datetime.now(UTC) + timedelta(days=2)
        lifecycle.Maintenance(store, policy=policy, clock=lambda: later).run()
    elif op == "fork":
        source, target = ContextId.parse(request["source"]), ContextId.parse(request["target"])
        contexts.fork_context(store, source, target)
    elif op == "reindex":
        index.reindex(store)
    elif op == "gc":
        collect_garbage(store, min_age=0)
    else:
        raise ValueError(f"unknown op {op!r}")


def work(request: dict[str, Any]) -> list[Any]:
    """Open the store, count its writes (dying at ``kill``), run the command; the count and
    the error it raised, if any."""
    error = ""
    if request["kind"] == "fs":
        count = _count_mutations(request["kill"])
    with open_spec(request) as store:
        if request["kind"] != "fs":
            count = count_calls(store, request["kill"])
        try:
            run(store, request)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
    return [count[0], error]


def main() -> None:
    import terrarium.stores.fs
    import terrarium.stores.sqlite  # noqa: F401  (imported once, before the forks)

    answer_each(work)


if __name__ == "__main__":
    main()
