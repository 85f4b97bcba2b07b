"""The seven performance targets of issue 27, each measured beside its floor in one run.

Run: ``.venv/bin/python benchmarks/bench_targets.py`` (sizes 1k, 10k and 100k; ``--quick``
for a smoke run of small sizes; ``--only turn,restore`` for some targets; ``--json FILE``).

Each target reuses the measuring code of the benchmark that owns it and prints one table
row per size: the target, its floor, the floor's figure, ours, the ratio (or the difference)
against the limit, and PASS or FAIL. Medians unless the target names a tail.

* ``turn``: a turn through ``MultiContextManager`` with an instant model (bench_manager.py),
  on fs, SQLite and PostgreSQL, against the same turn on ``MemoryStore``: the difference is
  the store's overhead, under 1 ms.
* ``append``: SQLite appends, p99.9, through the runtime and ``SqliteStore.append`` alone,
  against a bare ``INSERT`` of the same row (bench_sqlite_append.py): within 3x.
* ``restore``: ``restore`` of N entries against reading the segment file and decoding it
  (bench_log.py): within 1.3x at 100k.
* ``list``, ``search``, ``web``: one SQLite store of N contexts of 10 messages (bench_stores.py's
  corpus): ``list_contexts_fast`` against a bare ``SELECT`` of the contexts table, under
  300 ms at 100k; search p50 (the slowest word class) against a bare FTS5 ``MATCH``, under
  10 ms at 1M messages; the dashboard's overview and first sessions page, server time,
  against the listing they read, under 500 ms at 100k.
* ``cli``: ``terrarium list`` of 10 sessions against ``python -c pass`` (bench_cli.py),
  bytecode cached: within 8x.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

import bench_cli  # noqa: E402
import bench_log  # noqa: E402
import bench_manager  # noqa: E402
import bench_sqlite_append  # noqa: E402
import bench_stores  # noqa: E402
from bench_search import TextMaker  # noqa: E402
from peers import InsertFloor, System, TerrariumSystem  # noqa: E402
from terrarium import FsStore, MemoryStore  # noqa: E402
from terrarium.index import listing as lister  # noqa: E402
from terrarium.index._query import SearchQuery  # noqa: E402
from terrarium.stores.base import Store  # noqa: E402
from terrarium.stores.sqlite import SqliteStore  # noqa: E402

TARGETS = ("turn", "append", "restore", "list", "search", "web", "cli")


@dataclass
class Row:
    """One line of the table."""

    target: str
    size: str
    floor: str
    floor_value: float
    """Seconds."""
    figure: float
    """Seconds."""
    limit: str
    """The limit as the issue gives it."""
    compare: str
    """``ratio`` (figure / floor), ``minus`` (figure - floor) or ``figure`` (figure alone)."""
    bound: float
    """The limit as a number in the unit of ``compare`` (a ratio, or seconds)."""
    applies: bool = True
    """Whether the limit applies at this size (else the row is for the trend only)."""

    @property
    def measured(self) -> float:
        """The figure compared with ``bound``."""
        if self.compare == "ratio":
            return self.figure / self.floor_value if self.floor_value else float("inf")
        return self.figure - self.floor_value if self.compare == "minus" else self.figure

    @property
    def verdict(self) -> str:
        """PASS, FAIL, or ``-`` where the limit does not apply."""
        if not self.applies:
            return "-"
        return "PASS" if self.measured <= self.bound else "FAIL"


def label(n: int) -> str:
    """``1k``, ``100k``, ``1M``, or the number."""
    for unit, name in ((1_000_000, "M"), (1000, "k")):
        if n >= unit and n % unit == 0:
            return f"{n // unit}{name}"
    return str(n)


def shown(seconds: float) -> str:
    """A time in ms or µs."""
    return f"{seconds * 1e3:,.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:,.1f} µs"


def median_of(call: Callable[[], Any], repeat: int) -> float:
    """The median seconds of ``repeat`` calls, after one untimed call."""
    call()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


# --------------------------------------------------------------------------- turn


def backends(base: Path, dsn: str | None) -> Iterator[tuple[str, Callable[[], Store]]]:
    """The backends a turn is measured on, each as a maker of a fresh, empty store."""
    yield "fs", lambda: FsStore(base / f"fs-{time.monotonic_ns()}")
    yield "sqlite", lambda: SqliteStore(base / f"t-{time.monotonic_ns()}.db")
    if dsn is not None:
        from terrarium.stores.postgres import PostgresStore

        yield "postgres", lambda: PostgresStore(dsn, schema=f"t{time.monotonic_ns()}")


def turn(base: Path, sizes: list[int], turns: int, dsn: str | None) -> Iterator[Row]:
    """A turn's store overhead: the manager's turn on each backend minus on MemoryStore."""
    for size in sizes:
        floor = asyncio.run(bench_manager.manager_work(size, turns, base, MemoryStore()))
        for name, make in backends(base, dsn):
            ours = asyncio.run(bench_manager.manager_work(size, turns, base, make()))
            yield Row(
                f"turn store overhead ({name})",
                label(size),
                "same turn on MemoryStore",
                statistics.median(floor) / 1e6,
                statistics.median(ours) / 1e6,
                "< 1 ms more",
                "minus",
                1e-3,
            )


# --------------------------------------------------------------------------- append


def append(base: Path, sizes: list[int], count: int) -> Iterator[Row]:
    """SQLite's append p99.9 (runtime, and the store alone) against a bare INSERT's p99.9."""
    for size in sizes:
        folder = base / f"append-{size}"
        systems: dict[str, System] = {
            "runtime": TerrariumSystem("store", lambda f, _: SqliteStore(f / "t.db")),
            "Store.append": bench_sqlite_append.DirectSystem(
                "direct", lambda f, _: SqliteStore(f / "t.db")
            ),
            "floor": InsertFloor("NORMAL"),
        }
        for name, system in systems.items():
            (folder / name).mkdir(parents=True)
            system.open(folder / name, size)
        try:
            for system in systems.values():
                system.append(size)
            wall, _ = bench_sqlite_append.timed_appends(systems, size + 1, count)
        finally:
            for system in systems.values():
                system.close()
        tail = {k: bench_sqlite_append.quantile(v, 0.999) for k, v in wall.items()}
        for name in ("runtime", "Store.append"):
            yield Row(
                f"SQLite append p99.9 ({name})",
                label(size),
                "bare INSERT p99.9",
                tail["floor"],
                tail[name],
                "<= 3x",
                "ratio",
                3.0,
            )


# --------------------------------------------------------------------------- restore


def restore(base: Path, sizes: list[int], runs: int) -> Iterator[Row]:
    """Restore of N entries against reading and decoding the segment file, in turns."""
    for size in sizes:
        with FsStore(base / f"restore-{size}") as store:
            bench_log.prefill(store, "cli:r", size)
            ours: list[float] = []
            floor: list[float] = []
            for _ in range(runs):  # one of each in turn: load falls on both alike
                ours += bench_log.bench_restore(store, "cli:r", 1)
                floor += bench_log.bench_restore_floor(store, "cli:r", 1)
        yield Row(
            "restore",
            label(size),
            "read + decode the segment",
            statistics.median(floor) / 1e3,
            statistics.median(ours) / 1e3,
            "<= 1.3x at 100k",
            "ratio",
            1.3,
            applies=size >= 100_000,
        )


# --------------------------------------------------------------------------- list, search, web


def corpus_store(base: Path, contexts: int) -> Path:
    """A SQLite store of ``contexts`` contexts of 10 messages each (bench_stores.py's
    corpus, loaded through the store API and settled); its path."""
    maker = TextMaker(50_000 if contexts >= 10_000 else 5_000, random.Random(20261122))
    texts = list(bench_stores.corpus(maker, contexts, 10))
    path = base / f"corpus-{contexts}.db"
    with SqliteStore(path) as store:
        bench_stores.load(store, texts)
        bench_stores.settle(store)
    return path


def bare_rows(path: Path, sql: str, *args: Any) -> Callable[[], Any]:
    """A call of ``sql`` on the database at ``path`` through a bare ``sqlite3`` connection."""
    conn = sqlite3.connect(path)
    return lambda: conn.execute(sql, args).fetchall()


def listing(path: Path, contexts: int, repeat: int) -> Iterator[Row]:
    """``list_contexts_fast`` (what ``terrarium list`` reads) against a bare SELECT."""
    floor = median_of(bare_rows(path, "SELECT * FROM contexts"), repeat)
    with SqliteStore(path) as store:
        ours = median_of(lister(store).list_contexts_fast, repeat)
    yield Row(
        "list contexts (SQLite)",
        label(contexts),
        "bare SELECT * FROM contexts",
        floor,
        ours,
        "< 300 ms at 100k",
        "figure",
        0.300,
        applies=contexts >= 100_000,
    )


def search(path: Path, contexts: int, queries: int) -> Iterator[Row]:
    """Search p50 of the slowest word class against a bare FTS5 MATCH of the same words."""
    messages = contexts * 10
    classes = bench_stores.word_classes(path, messages, queries, random.Random(7))
    worst: tuple[float, float] = (0.0, 0.0)
    conn = sqlite3.connect(bench_stores.index_db(path))
    with SqliteStore(path) as store:
        for words in classes.values():
            ours, floor = [], []
            for text in words:  # one of each in turn
                t0 = time.perf_counter()
                lister(store).search(SearchQuery(text, limit=20))
                t1 = time.perf_counter()
                match = " ".join(f'"{w}"' for w in text.split())
                conn.execute(
                    "SELECT rowid FROM fts WHERE fts MATCH ? ORDER BY rank LIMIT 20",
                    (match,),
                ).fetchall()
                floor.append(time.perf_counter() - t1)
                ours.append(t1 - t0)
            p50 = (statistics.median(floor), statistics.median(ours))
            worst = max(worst, p50, key=lambda pair: pair[1])
    conn.close()
    yield Row(
        "search p50 (SQLite, slowest word class)",
        f"{label(messages)} msgs",
        "bare FTS5 MATCH, top 20",
        *worst,
        "< 10 ms at 1M",
        "figure",
        0.010,
        applies=messages >= 1_000_000,
    )


def web(path: Path, contexts: int, repeat: int) -> Iterator[Row]:
    """The dashboard's overview and first sessions page, server time: the first overview of
    a freshly opened store (cold), then each once the store's index holds every context (a
    dashboard left open), against the listing they read."""
    from starlette.testclient import TestClient

    from terrarium.web import create_app

    with SqliteStore(path) as store:
        floor = median_of(lister(store).list_contexts_fast, repeat)
    with SqliteStore(path) as store:  # opened afresh: nothing of it read yet in this process
        client = TestClient(create_app(store), base_url="http://127.0.0.1")
        began = time.perf_counter()
        client.get("/").raise_for_status()
        cold = time.perf_counter() - began
        yield Row(
            "dashboard overview, cold (SQLite)",
            label(contexts),
            "list_contexts_fast",
            floor,
            cold,
            "< 500 ms at 100k",
            "figure",
            0.500,
            applies=contexts >= 100_000,
        )
        while True:  # as the page's reloads do, until the index holds every context
            stats = client.get("/api/stats").json()
            if not stats["indexing"]:
                break
            time.sleep(0.2)
        for page in ("/", "/sessions"):
            ours = median_of(lambda page=page: client.get(page).raise_for_status(), repeat)
            yield Row(
                f"dashboard {'overview' if page == '/' else 'first sessions page'} (SQLite)",
                label(contexts),
                "list_contexts_fast",
                floor,
                ours,
                "< 500 ms at 100k",
                "figure",
                0.500,
                applies=contexts >= 100_000,
            )


# --------------------------------------------------------------------------- cli


def cli(base: Path, repeat: int) -> Iterator[Row]:
    """``terrarium list`` of 10 sessions against a bare interpreter, bytecode cached; the
    three commands take turns, one run each per round, so load falls on all alike."""
    py = sys.executable
    env = bench_cli.child_env(str(base / "pyc"))
    commands = {"bare": [py, "-c", "pass"]}
    for kind in ("fs", "sqlite"):
        url = str(base / "cli-fs") if kind == "fs" else f"sqlite:///{base / 'cli.db'}"
        bench_cli.build_store(url, 10)
        commands[kind] = [py, "-c", bench_cli.CLI, "list", "--storage-dir", url]
    walls: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeat):
        for name, argv in commands.items():
            walls[name].append(bench_cli.timed(argv, env, 1)[0])
    bare = statistics.median(walls["bare"])
    for kind in ("fs", "sqlite"):
        yield Row(
            f"terrarium list ({kind})",
            "10",
            "python -c pass",
            bare,
            statistics.median(walls[kind]),
            "<= 8x",
            "ratio",
            8.0,
        )


# --------------------------------------------------------------------------- main


def table(rows: list[Row]) -> str:
    """The rows as a fixed-width table."""
    head = ("target", "size", "floor", "floor fig.", "figure", "ratio / limit", "result")
    lines = [head]
    for r in rows:
        measured = f"{r.measured:.2f}x" if r.compare == "ratio" else shown(abs(r.measured))
        if r.compare == "minus":
            measured = ("+" if r.measured >= 0 else "-") + measured
        cells = (r.target, r.size, r.floor, shown(r.floor_value), shown(r.figure))
        lines.append((*cells, f"{measured} / {r.limit}", r.verdict))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    padded = ("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines)
    return "\n".join(padded)


def measure(args: argparse.Namespace, base: Path, dsn: str | None) -> Iterator[Row]:
    """Every row of the targets ``args.only`` names, in the order of :data:`TARGETS`."""
    quick = args.quick
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else None
    sizes = sizes or ([200] if quick else [1000, 10_000, 100_000])
    only = set(args.only.split(",")) if args.only else set(TARGETS)
    repeat = 3 if quick else 7
    if "turn" in only:
        yield from turn(base, sizes, 10 if quick else 200, dsn)
    if "append" in only:
        yield from append(base, sizes, 100 if quick else 3000)
    if "restore" in only:
        yield from restore(base, sizes, 3 if quick else 9)
    for contexts in sizes if only & {"list", "search", "web"} else []:
        path = corpus_store(base, contexts)
        if "list" in only:
            yield from listing(path, contexts, repeat)
        if "search" in only:
            yield from search(path, contexts, 10 if quick else 200)
        if "web" in only:
            yield from web(path, contexts, repeat)
    if "cli" in only:
        yield from cli(base, 2 if quick else 15)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--sizes", help="history sizes and context counts, comma-separated")
    parser.add_argument("--only", help=f"some targets, comma-separated: {','.join(TARGETS)}")
    parser.add_argument("--no-postgres", action="store_true", help="skip PostgreSQL's turn")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    rows: list[Row] = []
    with ExitStack() as stack:
        base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-targets-")))
        dsn = None
        if not args.no_postgres:
            dsn = stack.enter_context(bench_stores.throwaway_database(bench_stores.Report()))
        for row in measure(args, base, dsn):
            rows.append(row)
            print(f"... {row.target} at {row.size}: {shown(row.figure)}", flush=True)
    print(f"\n{table(rows)}\n")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"(total {time.perf_counter() - started:.0f} s; load average at the end: {load})")
    if args.json is not None:
        found = [{**asdict(r), "measured": r.measured, "verdict": r.verdict} for r in rows]
        args.json.write_text(json.dumps(found, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
