#!/usr/bin/env python3
"""Archive and unarchive-on-resume of one long context on SQLite (and PostgreSQL if asked).

Resuming an archived context is an append (which moves it back to the hot tables first: its
segments decompressed, its entries and search items put back) and a restore. This times that
against the same append and restore of the hot context, and the archive itself, and prints
the size of its log hot and archived (issue 12's figure: unarchive-on-resume <= 3x a hot
restore).

    .venv/bin/python benchmarks/bench_sql_lifecycle.py                 # 10,000 messages
    .venv/bin/python benchmarks/bench_sql_lifecycle.py --quick         # 500 messages, 1 run
    .venv/bin/python benchmarks/bench_sql_lifecycle.py --postgres postgresql://postgres@127.0.0.1/postgres
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from terrarium import (
    ContextId,
    Item,
    SqliteStore,
    create_segment,
    index,
    restore,
    save_delta,
    states,
)

MAIN = ContextId("cli", "main")


def _fill(store: Any, messages: int) -> None:
    create_segment(store, context=str(MAIN))
    head = store.get_head(MAIN)
    for start in range(0, messages, 500):
        items = [
            Item.user(f"message {i}: the capybara crossed the river at dawn, again and again")
            for i in range(start, min(start + 500, messages))
        ]
        save_delta(store, head, items)


def _resume(store: Any) -> None:
    """What a resumed chat does first: an append, then a restore."""
    save_delta(store, store.get_head(MAIN), [Item.user("back again")])
    restore(store, MAIN)


def _median(runs: int, before: Callable[[], Any], timed: Callable[[], Any]) -> float:
    times = []
    for _ in range(runs):
        before()
        start = time.perf_counter()
        timed()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _measure(name: str, store: Any, messages: int, runs: int) -> None:
    _fill(store, messages)
    index.listing(store).list_contexts_fast()  # the derived index caught up, as a read does
    hot = _median(runs, lambda: None, lambda: _resume(store))
    archive = _median(
        runs,
        lambda: states.unarchive_context(store, MAIN),
        lambda: states.archive_context(store, MAIN),
    )
    cold = _median(runs, lambda: states.archive_context(store, MAIN), lambda: _resume(store))
    archived = states.archive_context(store, MAIN)
    ratio = archived.archived_bytes / archived.hot_bytes
    print(
        f"{name}: {messages:,} messages: hot resume (append + restore) {hot * 1000:.1f} ms, "
        f"archive {archive * 1000:.1f} ms, unarchive-on-resume {cold * 1000:.1f} ms "
        f"({cold / hot:.2f}x hot); log {archived.hot_bytes:,} bytes hot, "
        f"{archived.archived_bytes:,} archived ({ratio:.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 messages, one run")
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--postgres", metavar="DSN", help="also measure PostgresStore there")
    args = parser.parse_args()
    messages, runs = (500, 1) if args.quick else (args.messages, args.runs)
    with tempfile.TemporaryDirectory() as tmp, SqliteStore(Path(tmp) / "s.db") as store:
        _measure("sqlite", store, messages, runs)
    if args.postgres:
        import psycopg

        from terrarium.stores.postgres import PostgresStore

        schema = f"bench_{uuid.uuid4().hex[:12]}"
        try:
            with PostgresStore(args.postgres, schema=schema) as pg:
                _measure("postgres", pg, messages, runs)
        finally:
            with psycopg.connect(args.postgres, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


if __name__ == "__main__":
    main()
