"""Child process of ``tests/test_lifecycle_steps_kill.py``: one lifecycle call per request,
SIGKILLed at one of its steps.

Run as ``python tests/helpers/steps_child.py``. For each JSON line on stdin (the store spec of
``race_child.open_spec`` plus ``op``, ``context``, ``trash_id``, ``kill``) it forks a process
that opens the store, runs the call and is SIGKILLed at step ``kill``: step ``2k - 1`` is just
before the ``k``-th call of a primitive that changes something (the steps of
:mod:`terrarium.states`), step ``2k`` just after it returns; 0 never.
It answers ``{"killed", "steps", "error"}`` on stdout (``steps``: primitive calls made).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from forked import run_forked
from race_child import open_spec

from terrarium import sessions, states
from terrarium.model import ContextId
from terrarium.stores.base import Store

#: The primitives by which terrarium.states changes a store.
STEPS = (
    "set_session_state",
    "freeze_session",
    "thaw_session",
    "detach_context",
    "attach_context",
    "delete_session",
)


def instrument(store: Store, kill: int) -> list[int]:
    """Wrap the store's primitives so the process dies at step ``kill``; the call count."""
    count = [0]

    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            if 2 * count[0] - 1 == kill:
                os.kill(os.getpid(), signal.SIGKILL)
            result = method(*args, **kwargs)
            if 2 * count[0] == kill:
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        return step

    for name in STEPS:
        setattr(store, name, wrap(getattr(store, name)))
    return count


def run(store: Any, request: dict[str, Any]) -> None:
    """The call ``request["op"]`` names."""
    context = ContextId.parse(request["context"])
    op = request["op"]
    if op == "archive":
        states.archive_context(store, context)
    elif op == "unarchive":
        states.unarchive_context(store, context)
    elif op == "wake":
        head = store.get_head(context)
        sessions.save_user_input(store, head, f"{context} woken")
    elif op == "delete":
        states.delete_context(store, context)
    elif op == "restore":
        target = ContextId.parse(request["as"]) if request.get("as") else None
        states.restore_trashed(store, request["trash_id"], as_context=target)
    elif op == "purge_trashed":
        states.purge_trashed(store, request["trash_id"])
    elif op == "purge_context":
        states.purge_context(store, context)
    elif op == "pin":
        states.pin_context(store, context)
    else:
        raise ValueError(f"unknown op {op!r}")


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)

        def work(request: dict[str, Any] = request) -> list[Any]:
            error = ""
            with open_spec(request) as store:
                count = instrument(store, request["kill"])
                try:
                    run(store, request)
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
            return [count[0], error]

        killed, done = run_forked(work)
        steps, error = done if done else (None, None)
        sys.stdout.write(json.dumps({"killed": killed, "steps": steps, "error": error}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
