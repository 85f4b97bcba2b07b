#!/usr/bin/env python3
"""Restore a context whose tool outputs are large: lazy blobs against inline content.

A context of ``--outputs`` tool results of ``--mib`` MiB each (distinct texts) is written twice
per backend: once with blobs (the default threshold, 64 KiB) and once with the threshold off
(``blob_threshold=0``: every output inline in the log, as before blobs). It times
``restore(..., blobs="lazy")`` on the first and ``restore(...)`` on the second (median of
``--runs``), and compares the bytes each log takes (the segment files, or the entries
table). ``restore(...)`` with blobs (full texts) is shown too.

    .venv/bin/python benchmarks/bench_blobs.py            # 100 outputs of 1 MiB, fs and sqlite
    .venv/bin/python benchmarks/bench_blobs.py --quick    # 10 outputs of 256 KiB, one run
    .venv/bin/python benchmarks/bench_blobs.py --postgres postgresql://postgres@127.0.0.1/postgres
                                                          # PostgreSQL too (a throwaway database)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from terrarium import ContextId, FsStore, SqliteStore, create_segment, restore, save_delta
from terrarium.stores.base import Store


def _store(kind: str, folder: Path, threshold: int | None, dsn: str | None) -> Store:
    if kind == "fs":
        return FsStore(folder / "fs", blob_threshold=threshold)
    if kind == "postgres":
        from terrarium.stores.postgres import PostgresStore

        assert dsn is not None
        schema = f"bench_{uuid.uuid4().hex[:8]}"
        return PostgresStore(dsn, schema=schema, blob_threshold=threshold)
    return SqliteStore(folder / "s.db", blob_threshold=threshold)


@contextmanager
def _database(admin: str | None) -> Iterator[str | None]:
    """A throwaway database on the server of ``admin`` (dropped afterwards), or None."""
    if admin is None:
        yield None
        return
    import psycopg
    from psycopg.conninfo import make_conninfo

    name = f"terrarium_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_conninfo(admin, dbname=name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _fill(store: Store, outputs: int, size: int) -> None:
    create_segment(store, context="cli:tools")
    head = store.get_head(ContextId("cli", "tools"))
    assert head is not None
    for n in range(outputs):
        text = (f"output {n:04d} " * (size // 12 + 1))[:size]
        call = {"id": f"c{n}", "type": "function", "function": {"name": "run", "arguments": "{}"}}
        items = [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": text},
        ]
        save_delta(store, head, items)


def _log_bytes(store: Store) -> int:
    if isinstance(store, FsStore):
        return sum(p.stat().st_size for p in store.root.rglob("*.jsonl"))
    if not isinstance(store, SqliteStore):  # PostgreSQL
        with store._pool.connection() as pg:  # type: ignore[attr-defined]
            row = pg.execute("SELECT sum(octet_length(line)) FROM entries").fetchone()
        return int(row[0])
    with store._read() as conn:
        (total,) = conn.execute("SELECT sum(length(line)) FROM entries").fetchone()
    return int(total)


def _median(run: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 outputs of 256 KiB, one run")
    parser.add_argument("--outputs", type=int, default=100)
    parser.add_argument("--mib", type=float, default=1.0, help="size of each output")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--postgres", metavar="DSN", help="also PostgreSQL (admin connection)")
    args = parser.parse_args()
    outputs, size, runs = (
        (10, 256 * 1024, 1) if args.quick else (args.outputs, int(args.mib * 2**20), args.runs)
    )
    print(f"{outputs} tool outputs of {size:,} bytes each")
    kinds = ("fs", "sqlite", "postgres") if args.postgres else ("fs", "sqlite")
    for kind in kinds:
        with tempfile.TemporaryDirectory() as tmp, _database(args.postgres) as dsn:
            blobs = _store(kind, Path(tmp) / "blobs", 64 * 1024, dsn)
            inline = _store(kind, Path(tmp) / "inline", 0, dsn)
            _fill(blobs, outputs, size)
            _fill(inline, outputs, size)
            lazy = _median(lambda: restore(blobs, "cli:tools", blobs="lazy"), runs)  # noqa: B023
            full = _median(lambda: restore(blobs, "cli:tools"), runs)  # noqa: B023
            old = _median(lambda: restore(inline, "cli:tools"), runs)  # noqa: B023
            log_blobs, log_inline = _log_bytes(blobs), _log_bytes(inline)
            print(
                f"{kind:6} restore: lazy {lazy * 1000:8.1f} ms | full (blobs) {full * 1000:8.1f} "
                f"ms | inline {old * 1000:8.1f} ms | inline/lazy {old / lazy:6.1f}x"
            )
            print(
                f"{kind:6} log: with blobs {log_blobs:,} bytes | inline {log_inline:,} bytes | "
                f"{log_inline / log_blobs:6.1f}x smaller"
            )
            for store in (blobs, inline):
                store.close()


if __name__ == "__main__":
    main()
