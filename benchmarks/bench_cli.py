"""Benchmark the command line's start: how long a user waits for ``terrarium`` to answer.

Run: ``.venv/bin/python benchmarks/bench_cli.py`` (``--quick`` for a smoke run).

Each command runs as a real process, several times; the median wall time is reported as a
ratio to a bare ``python -c pass`` timed in the same run (the floor no Python tool goes below):

* ``import terrarium``;
* ``terrarium --help``;
* ``terrarium list`` on 10 sessions and on 10k sessions, on a filesystem and an SQLite store
  (the 10k figure also as a ratio to the 10-session one, and in seconds); with ``--pinned``
  every session is pinned (a lifecycle record each, which ``list`` reads for its marks);
* ``terrarium stats`` (the totals) on the 10k sessions.

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
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from terrarium import sessions, states  # noqa: E402
from terrarium.model import ContextId, EntryKind, SegmentStartState, utc_now  # noqa: E402
from terrarium.stores.base import Lifecycle, NewEntry, Store  # noqa: E402
from terrarium.stores.fs._states import STILL_NS  # noqa: E402
from terrarium.stores.url import open_store  # noqa: E402

#: Targets: (what, limit, unit).
START_RATIO = 8.0
LIST_10K_SECONDS = 0.5

CLI = "from terrarium.cli import main; main()"


def build_store(url: str, count: int, pinned: bool = False) -> None:
    """A store of ``count`` contexts, each with a system prompt and one exchange (and
    ``pinned``)."""
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
            if pinned and isinstance(store, Lifecycle):
                states.pin_context(store, context)
    finally:
        store.close()


def child_env(cache: str) -> dict[str, str]:
    """The environment of the timed processes: bytecode cached, as an installed package."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = cache
    env["PYTHONPATH"] = str(ROOT / "src")
    return env


def timed(argv: Sequence[str], env: dict[str, str], repeat: int) -> tuple[float, float]:
    """Median wall time and median CPU time (user + system) of ``argv`` over ``repeat``
    runs, after one warm-up run. CPU time says less about what a user waits for, and more
    about the work done when other processes share the machine."""
    walls, cpus = [], []
    for i in range(repeat + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if i:  # the first run warms the caches (bytecode, page cache)
            walls.append(wall)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="Few repetitions (a smoke run).")
    parser.add_argument("--small", type=int, default=10, help="Sessions in the small store.")
    parser.add_argument("--large", type=int, default=10_000, help="Sessions in the large store.")
    parser.add_argument("--repeat", type=int, default=None, help="Runs per command.")
    parser.add_argument("--json", type=Path, help="Also write the results here.")
    parser.add_argument("--pinned", action="store_true", help="Pin every session.")
    args = parser.parse_args(argv)
    repeat = args.repeat or (3 if args.quick else 15)
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        env = child_env(str(Path(tmp) / "pyc"))
        commands = {
            "import terrarium": [py, "-c", "import terrarium"],
            "terrarium --help": [py, "-c", CLI, "--help"],
        }
        for kind in ("fs", "sqlite"):
            for size in (args.small, args.large):
                place = Path(tmp) / f"{kind}-{size}"
                url = str(place) if kind == "fs" else f"sqlite:///{place}.db"
                build_store(url, size, args.pinned)
                commands[list_name(kind, size)] = [py, "-c", CLI, "list", "--storage-dir", url]
                if size == args.large:  # the totals, from the index the list brought up to date
                    stats = f"terrarium stats ({kind}, {size} sessions)"
                    commands[stats] = [py, "-c", CLI, "stats", "--storage-dir", url]
        if args.pinned:  # past STILL_NS a store's records are kept, as pins made long ago
            time.sleep(STILL_NS / 1e9)
        bare = timed([py, "-c", "pass"], env, repeat)
        rows = {name: timed(argv, env, repeat) for name, argv in commands.items()}
    results = report(bare, rows, args.small, args.large)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def list_name(kind: str, size: int) -> str:
    return f"terrarium list ({kind}, {size} sessions)"


def report(
    bare: tuple[float, float], rows: dict[str, tuple[float, float]], small: int, large: int
) -> dict[str, object]:
    """Print the table and the targets (judged on wall time); return them as JSON data."""
    print(
        f"bare interpreter (python -c pass): {bare[0] * 1000:.1f} ms wall, "
        f"{bare[1] * 1000:.1f} ms CPU"
    )
    print(f"{'command':<42} {'wall ms':>8} {'x bare':>7} {'CPU ms':>8} {'x bare':>7}")
    for name, (wall, cpu) in rows.items():
        print(
            f"{name:<42} {wall * 1000:8.1f} {wall / bare[0]:7.1f} "
            f"{cpu * 1000:8.1f} {cpu / max(bare[1], 1e-3):7.1f}"
        )
    targets = []
    for name in ("terrarium --help", list_name("fs", small), list_name("sqlite", small)):
        ratio = rows[name][0] / bare[0]
        targets.append((f"{name} <= {START_RATIO:g}x bare", ratio, ratio <= START_RATIO))
    for kind in ("fs", "sqlite"):
        big, little = rows[list_name(kind, large)][0], rows[list_name(kind, small)][0]
        print(f"list {kind}: {large} sessions take {big / little:.1f}x {small} sessions")
        what = f"{list_name(kind, large)} <= {LIST_10K_SECONDS} s"
        targets.append((what, big, big <= LIST_10K_SECONDS))
    print("Targets")
    for what, value, ok in targets:
        print(f"  {'PASS' if ok else 'FAIL'}  {what}: {value:.2f}")
    return {
        "bare": {"wall": bare[0], "cpu": bare[1]},
        "measurements": [
            {"name": n, "wall": w, "cpu": c, "ratio": w / bare[0]} for n, (w, c) in rows.items()
        ],
        "targets": [
            {"what": w, "value": v, "verdict": "PASS" if ok else "FAIL"} for w, v, ok in targets
        ],
    }


if __name__ == "__main__":
    raise SystemExit(main())
