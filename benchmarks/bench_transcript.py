"""Benchmark the ``transcript`` view: one context's transcript on a big store, against restore.

Run: ``.venv/bin/python benchmarks/bench_transcript.py`` (``--quick`` for a smoke run of a few
seconds; ``--contexts`` and ``--items`` set the store's size).

Each store (SQLite in a temporary directory; PostgreSQL when it answers at
``TERRARIUM_TEST_POSTGRES_DSN`` or the default ``postgresql://postgres@127.0.0.1:5432/postgres``,
in a throwaway database ``terrarium_bench_<random>`` dropped at the end) gets ``--contexts``
contexts of ``--items`` history items each; one of them also has a compaction and a fork of
it, so that its lineage has two segments and a header history. Then, median of the runs:

* ``SELECT position, role, text FROM transcript WHERE context = ? ORDER BY position`` on a
  plain SQL connection of its own;
* ``terrarium.restore`` of the same context through the store (the baseline: what a Python
  user runs to read the same conversation);
* the ratio of the two, and, once, a ``count(*)`` of the whole view (every context).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from terrarium.model import ContextId
from terrarium.sessions import (
    create_compacted_segment,
    create_segment,
    fork_at,
    restore,
    save_delta,
)
from terrarium.stores.base import PodActiveSegmentRef, Store

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
QUERY = "SELECT position, role, text FROM transcript WHERE context = {mark} ORDER BY position"
TARGET = ContextId("cli", "c1")


def fill(store: Store, contexts: int, items: int, batch: Callable[[], Any]) -> int:
    """The store's contexts; return the history length of ``TARGET``."""
    for k in range(contexts):
        context = ContextId("cli", f"c{k}")
        with batch():
            create_segment(store, None, context=context)
            head = store.get_head(context)
            assert head is not None
            for start in range(0, items, 500):
                save_delta(
                    store,
                    head,
                    [
                        {"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i} " * 20}
                        for i in range(start, min(items, start + 500))
                    ],
                )
        if context == TARGET:
            summary = [{"role": "user", "content": "summary " * 50}]
            compacted = create_compacted_segment(store, head, summary, context=context)
            ref = PodActiveSegmentRef(head.session_id, compacted)
            save_delta(
                store, ref, [{"role": "user", "content": f"after {i}"} for i in range(items)]
            )
            fork = fork_at(store, ref, items // 2)
            save_delta(
                store,
                PodActiveSegmentRef(head.session_id, fork),
                [{"role": "user", "content": "x"}],
            )
            store.set_head(context, fork, expected=compacted)
    return len(restore(store, TARGET).history)


def timed(action: Callable[[], Any], runs: int) -> float:
    """Median milliseconds of ``action``."""
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1e3)
    return statistics.median(samples)


def measure(
    name: str, store: Store, query: Callable[[str], list[Any]], expected: int, runs: int
) -> None:
    rows = query(QUERY)
    assert len(rows) == expected, (len(rows), expected)
    view = timed(lambda: query(QUERY), runs)
    baseline = timed(lambda: restore(store, TARGET), runs)
    started = time.perf_counter()
    total = query("SELECT count(*) FROM transcript")[0][0]
    everything = time.perf_counter() - started
    print(
        f"{name:9} one context ({expected:,} items): view {view:.2f} ms, restore "
        f"{baseline:.2f} ms, view / restore {view / baseline:.2f}x; "
        f"whole view ({total:,} items) {everything:.2f} s"
    )


def run_sqlite(contexts: int, items: int, runs: int) -> None:
    from terrarium.stores.sqlite import SqliteStore

    folder = Path(tempfile.mkdtemp(prefix="bench-transcript-"))
    try:
        path = folder / "bench.db"
        with SqliteStore(path) as store:
            expected = fill(store, contexts, items, store.atomic)
            conn = sqlite3.connect(path)
            try:
                conn.execute("ANALYZE")

                def query(sql: str) -> list[Any]:
                    return conn.execute(
                        sql.format(mark="?"), (str(TARGET),) if "{mark}" in sql else ()
                    ).fetchall()

                measure("sqlite", store, query, expected, runs)
            finally:
                conn.close()
    finally:
        shutil.rmtree(folder)


def run_postgres(contexts: int, items: int, runs: int) -> None:
    try:
        import psycopg
        from psycopg.conninfo import make_conninfo
    except ImportError:
        print("postgres  skipped: psycopg is not installed")
        return
    from contextlib import nullcontext

    from terrarium.stores.postgres import PostgresStore

    admin = os.environ.get("TERRARIUM_TEST_POSTGRES_DSN", DEFAULT_DSN)
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=2) as conn:
            name = f"terrarium_bench_{uuid.uuid4().hex[:12]}"
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        print(f"postgres  skipped: {str(exc).splitlines()[0]}")
        return
    dsn = make_conninfo(admin, dbname=name)
    try:
        with PostgresStore(dsn) as store, psycopg.connect(dsn, autocommit=True) as conn:
            expected = fill(store, contexts, items, nullcontext)
            conn.execute("SET search_path TO terrarium")
            conn.execute("VACUUM ANALYZE")

            def query(sql: str) -> list[Any]:
                params = (str(TARGET),) if "{mark}" in sql else ()
                return conn.execute(sql.format(mark="%s"), params).fetchall()

            measure("postgres", store, query, expected, runs)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--contexts", type=int, default=2_000)
    parser.add_argument("--items", type=int, default=250, help="history items per context")
    args = parser.parse_args(argv)
    contexts, items, runs = (20, 50, 3) if args.quick else (args.contexts, args.items, 20)
    print(f"{contexts:,} contexts x {items:,} items")
    run_sqlite(contexts, items, runs)
    run_postgres(contexts, items, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
