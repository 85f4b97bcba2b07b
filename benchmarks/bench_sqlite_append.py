"""SqliteStore's append against its floor, tail included: p50, p99, p99.9 and max.

Run: ``.venv/bin/python benchmarks/bench_sqlite_append.py`` (``--quick`` for a smoke run of a
few seconds; ``--depths 1000,10000,100000`` and ``--appends 3000`` to choose).

At each history depth (messages already in the conversation) three systems are pre-filled in
a temporary directory: ``store``, peers.py's ``terrarium SqliteStore``, appended to through
the runtime's calls (``save_user_input`` and ``save_delta`` in turn); ``direct``, another
``SqliteStore`` whose appends call ``SqliteStore.append`` with the entry the runtime would
build (the store's own share); and ``floor``, peers.py's bare autocommit ``INSERT`` of the
same line into a WAL table shaped like ``SqliteStore``'s entries (same ``synchronous``). Then
their appends are timed one call at a time (the stores first brought up to date, their
upkeep thread idle: see ``bench_stores.settle``), each turn taking each in a new random order, so
load from other processes falls on all alike. Each call's wall time and the CPU time of the
calling thread are reported (the latter is not inflated by other processes' load, nor by
waits for a lock or the disk). The tail is what the issue's target is about: an append must
not stall on the
derived-state catch-up (search tables, listing counts) or on a WAL checkpoint, so p99.9 is
reported next to the median, with their ratio (target: p99.9 <= 20x the median; the median
<= 1.3x the floor's).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from peers import InsertFloor, System, TerrariumSystem, role, text  # noqa: E402
from terrarium.model import utc_now  # noqa: E402
from terrarium.stores.base import NewEntry  # noqa: E402
from terrarium.stores.sqlite import SqliteStore  # noqa: E402


class DirectSystem(TerrariumSystem):
    """``SqliteStore.append`` called directly with the entry the runtime would build: the
    store's own share of an append, without the runtime's (``terrarium.sessions``)."""

    def append(self, i: int) -> None:
        kind = "user_input" if i % 2 == 0 else "item"
        entry = NewEntry(kind, utc_now(), {"item": {"role": role(i), "content": text(i)}})
        self.store.append(self.head.session_id, self.head.segment_id, [entry])


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def timed_appends(
    systems: dict[str, System], depth: int, count: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """``count`` appends of each system, one of each per turn in a new random order: the
    seconds each took, and the CPU seconds of the calling thread (which other processes'
    load does not inflate, nor waits for a lock or a disk)."""
    wall: dict[str, list[float]] = {name: [] for name in systems}
    cpu: dict[str, list[float]] = {name: [] for name in systems}
    names = list(systems)
    order = random.Random(15)
    perf, thread_time = time.perf_counter_ns, time.thread_time_ns
    gc.collect()
    for i in range(depth, depth + count):
        order.shuffle(names)
        for name in names:
            append = systems[name].append
            c0, t0 = thread_time(), perf()
            append(i)
            t1, c1 = perf(), thread_time()
            wall[name].append((t1 - t0) / 1e9)
            cpu[name].append((c1 - c0) / 1e9)
    return wall, cpu


def row(name: str, values: list[float]) -> str:
    p50 = quantile(values, 0.5)
    cells = [p50, quantile(values, 0.99), quantile(values, 0.999), max(values)]
    shown = " / ".join(f"{v * 1e6:,.1f}" for v in cells)
    return f"  {name:<8} p50 / p99 / p99.9 / max: {shown} µs; p99.9 = {cells[2] / p50:.1f}x p50"


def measure(depth: int, count: int, base: Path) -> None:
    folder = base / str(depth)
    systems: dict[str, System] = {
        "store": TerrariumSystem("store", lambda f, _: SqliteStore(f / "t.db")),
        "direct": DirectSystem("direct", lambda f, _: SqliteStore(f / "t.db")),
        "floor": InsertFloor("NORMAL"),
    }
    for name, system in systems.items():
        (folder / name).mkdir(parents=True)
        system.open(folder / name, depth)  # a terrarium store settled (bench_stores.settle)
    try:
        for system in systems.values():  # one untimed append each: warm caches
            system.append(depth)
        wall, cpu = timed_appends(systems, depth + 1, count)
    finally:
        for system in systems.values():
            system.close()
    print(f"depth {depth:,}, {count:,} appends each (load {os.getloadavg()[0]:.2f}):")
    for what, samples in (("time", wall), ("thread CPU", cpu)):
        print(f" {what}:")
        for name, values in samples.items():
            print(row(name, values))
        floor = quantile(samples["floor"], 0.5)
        for name in ("store", "direct"):
            ratio = quantile(samples[name], 0.5) / floor
            print(f"  {name} / floor, median: {ratio:.2f}x (target <= 1.3x)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--depths", help="history depths, comma-separated")
    parser.add_argument("--appends", type=int, help="timed appends per system and depth")
    args = parser.parse_args(argv)
    depths = [
        int(d) for d in (args.depths or ("100" if args.quick else "1000,10000,100000")).split(",")
    ]
    count = args.appends or (200 if args.quick else 3000)
    with tempfile.TemporaryDirectory(prefix="bench-sqlite-append-") as tmp:
        for depth in depths:
            measure(depth, count, Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
