"""Child process of the lifecycle kill tests (``tests/test_lifecycle_fs_kill.py``).

Run as ``python tests/helpers/lifecycle_child.py``. For each JSON line on stdin
(``{"root", "kill", "op", "context", "trash_id", "as"}``) it forks a process that runs one
lifecycle call on an ``FsStore`` and is SIGKILLed just before its ``kill``-th file change
(0: never), and answers ``{"killed", "mutations", "error"}`` on stdout.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from forked import run_forked
from fs_child import _count_mutations
from steps_child import run

from terrarium import FsStore


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)

        def work(request: dict[str, Any] = request) -> list[Any]:
            count = _count_mutations(request["kill"])
            error = ""
            try:
                with FsStore(request["root"]) as store:
                    run(store, request)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
            return [count[0], error]

        killed, done = run_forked(work)
        mutations, error = done if done else (None, None)
        sys.stdout.write(json.dumps({"killed": killed, "mutations": mutations, "error": error}))
        sys.stdout.write("\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
