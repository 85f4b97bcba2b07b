"""Benchmark the command line's start: how long a user waits for ``terrarium`` to answer.

Run: ``.venv/bin/python benchmarks/bench_cli.py`` (``--quick`` for a smoke run).

Each command runs as a real process, several times; the median wall time is reported as a
ratio to a bare ``python -c pass`` timed in the same run (the floor no Python tool goes below):

* ``import terrarium``;
* ``terrarium --help``;
* ``terrarium list`` on 10 sessions and on 10k sessions, on a filesystem and an SQLite store
  (the 10k figure also as a ratio to the 10-session one, and in seconds).

Stores are built through the store API (``sessions.create_segment`` and one append per
context), not through chat. The children run with bytecode caching on (``.pyc`` files in a
temporary folder), as an installed package does, and with one warm-up run each.

Targets (issue 16): ``--help`` and ``list`` on 10 sessions at most 8x a bare interpreter;
``list`` on 10k sessions at most 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from terrarium import sessions  # noqa: E402
from terrarium.model import ContextId, EntryKind, SegmentStartState, utc_now  # noqa: E402
from terrarium.stores.base import NewEntry, Store  # noqa: E402
from terrarium.stores.url import open_store  # noqa: E402

#: Targets: (what, limit, unit).
START_RATIO = 8.0
LIST_10K_SECONDS = 0.5

CLI = "from terrarium.cli import main; main()"


def build_store(url: str, count: int) -> None:
    """A store of ``count`` contexts, each with a system prompt and one exchange."""
    store: Store = open_store(url)
    try:
        for i in range(count):
            context = ContextId("cli", f"s{i:05d}")
            session_id, segment_id = sessions.create_segment(
                store, SegmentStartState("be brief"), context=context
            )
            ts = utc_now()
            exchange = [
                NewEntry(EntryKind.USER_INPUT, ts, {"item": {"role": "user", "content": "hi"}}),
                NewEntry(EntryKind.ITEM, ts, {"item": {"role": "assistant", "content": "hello"}}),
                NewEntry(EntryKind.TURN_END, ts, {}),
            ]
            store.append(session_id, segment_id, exchange, expected_seq=1)
    finally:
        store.close()


def child_env(cache: str) -> dict[str, str]:
    """The environment of the timed processes: bytecode cached, as an installed package."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = cache
    env["PYTHONPATH"] = str(ROOT / "src")
    return env


def timed(argv: Sequence[str], env: dict[str, str], repeat: int) -> float:
    """Median wall time of ``argv`` over ``repeat`` runs, after one warm-up run."""
    times = []
    for i in range(repeat + 1):
        start = time.perf_counter()
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
        if i:  # the first run warms the caches (bytecode, page cache)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="Few repetitions (a smoke run).")
    parser.add_argument("--small", type=int, default=10, help="Sessions in the small store.")
    parser.add_argument("--large", type=int, default=10_000, help="Sessions in the large store.")
    parser.add_argument("--repeat", type=int, default=None, help="Runs per command.")
    parser.add_argument("--json", type=Path, help="Also write the results here.")
    args = parser.parse_args(argv)
    repeat = args.repeat or (3 if args.quick else 15)
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        env = child_env(str(Path(tmp) / "pyc"))
        stores = {}
        for kind in ("fs", "sqlite"):
            for size in (args.small, args.large):
                place = Path(tmp) / f"{kind}-{size}"
                url = str(place) if kind == "fs" else f"sqlite:///{place}.db"
                build_store(url, size)
                stores[kind, size] = url
        bare = timed([py, "-c", "pass"], env, repeat)
        rows: list[tuple[str, float]] = [
            ("import terrarium", timed([py, "-c", "import terrarium"], env, repeat)),
            ("terrarium --help", timed([py, "-c", CLI, "--help"], env, repeat)),
        ]
        for kind in ("fs", "sqlite"):
            for size in (args.small, args.large):
                argv = [py, "-c", CLI, "list", "--storage-dir", stores[kind, size]]
                rows.append((f"terrarium list ({kind}, {size} sessions)", timed(argv, env, repeat)))
    results = report(bare, rows, args.small, args.large)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def report(bare: float, rows: list[tuple[str, float]], small: int, large: int) -> dict[str, object]:
    """Print the table and the targets; return them as JSON-ready data."""
    print(f"bare interpreter (python -c pass): {bare * 1000:.1f} ms")
    print(f"{'command':<42} {'ms':>8} {'x bare':>8}")
    for name, seconds in rows:
        print(f"{name:<42} {seconds * 1000:8.1f} {seconds / bare:8.1f}")
    times = dict(rows)
    targets = []
    for name in (
        "terrarium --help",
        *(f"terrarium list ({k}, {small} sessions)" for k in ("fs", "sqlite")),
    ):
        ratio = times[name] / bare
        targets.append((f"{name} <= {START_RATIO:g}x bare", ratio, ratio <= START_RATIO))
    for kind in ("fs", "sqlite"):
        big, little = (
            times[f"terrarium list ({kind}, {large} sessions)"],
            times[f"terrarium list ({kind}, {small} sessions)"],
        )
        print(f"list {kind}: {large} sessions = {big / little:.1f}x {small} sessions")
        targets.append(
            (
                f"terrarium list ({kind}, {large}) <= {LIST_10K_SECONDS} s",
                big,
                big <= LIST_10K_SECONDS,
            )
        )
    print("Targets")
    for what, value, ok in targets:
        print(f"  {'PASS' if ok else 'FAIL'}  {what}: {value:.2f}")
    return {
        "bare_seconds": bare,
        "measurements": [{"name": n, "seconds": s, "ratio": s / bare} for n, s in rows],
        "targets": [
            {"what": w, "value": v, "verdict": "PASS" if ok else "FAIL"} for w, v, ok in targets
        ],
    }


if __name__ == "__main__":
    raise SystemExit(main())
