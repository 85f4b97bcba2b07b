"""PostgreSQL's bytes on disk per message, relation by relation, against FsStore's log.

Run: ``.venv/bin/python benchmarks/bench_pg_bytes.py`` (``--messages N``, 100,000 by default;
``--quick`` for 2,000). PostgreSQL is used at ``TERRARIUM_TEST_POSTGRES_DSN`` (or the default
DSN), in a throwaway database dropped at the end; FsStore in a temporary directory.

Both stores get the same conversation: N messages of about 300 characters in one context,
user and assistant in turn (``peers.py``'s messages and prefill: appends of 1,000 entries),
then the derived index (:mod:`terrarium.index`) is built from them, as a first listing on a
machine builds it. Each relation of the store's schema is measured with ``pg_relation_size``
(its main fork; a table's TOAST separately; indexes apart), and summed into the log's
relations (heads, sessions, segments, entries, traces and their indexes and TOAST), the change
cursor's (``session_changes``) and the rest (empty tables: archive, blobs, the migrations).
Each sum is divided by FsStore's bytes on disk (every file it wrote: the segment logs, its
heads); so is the derived index's file, which each reading machine keeps, not the server.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_log import message_text  # noqa: E402
from bench_stores import Report, throwaway_database  # noqa: E402
from terrarium import FsStore, SegmentStartState, create_segment, index  # noqa: E402
from terrarium.model import ContextId, utc_now  # noqa: E402
from terrarium.stores.base import NewEntry, Store  # noqa: E402

TEXTS = [message_text(i, 300) for i in range(101)]
LOG = {"contexts", "sessions", "segments", "entries", "traces"}
CURSOR = {"session_changes"}

# A relation's bytes: its main fork, its TOAST table and TOAST index, with the table each
# belongs to (an index's table; a table's own name).
SIZES = """
SELECT c.relname, c.relkind, coalesce(t.relname, c.relname) AS owner,
    pg_relation_size(c.oid), coalesce(pg_total_relation_size(c.reltoastrelid), 0)
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_index AS i ON i.indexrelid = c.oid
LEFT JOIN pg_class AS t ON t.oid = i.indrelid
WHERE n.nspname = %s AND c.relkind IN ('r', 'i', 'm')
ORDER BY 4 DESC, 1
"""


def fill(store: Store, messages: int) -> None:
    """One context of ``messages`` messages, appended 1,000 at a time."""
    start = SegmentStartState(system_prompt="You are a helpful AI assistant.", config={})
    create_segment(store, start, context="bench:bytes")
    head = store.get_head(ContextId.parse("bench:bytes"))
    assert head is not None
    for first in range(0, messages, 1000):
        ts = utc_now()
        batch = [
            NewEntry(
                "user_input" if i % 2 == 0 else "item",
                ts,
                {
                    "item": {
                        "role": "user" if i % 2 == 0 else "assistant",
                        "content": TEXTS[i % len(TEXTS)],
                    }
                },
            )
            for i in range(first, min(messages, first + 1000))
        ]
        store.append(head.session_id, head.segment_id, batch)


def relation_sizes(dsn: str, schema: str) -> list[tuple[str, str, str, int, int]]:
    """(name, kind, table, bytes, TOAST bytes) of every relation in ``schema``."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        return [tuple(row) for row in conn.execute(SIZES, (schema,))]  # type: ignore[misc]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="2,000 messages")
    args = parser.parse_args(argv)
    messages = 2000 if args.quick else args.messages
    report = Report()
    print(f"PostgreSQL bytes per message at {messages:,} messages; load {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="bench-pg-bytes-") as folder:
        with FsStore(Path(folder)) as fs:
            fill(fs, messages)
        fs_bytes = sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
    report.row("FsStore: every file", f"{fs_bytes / messages:.0f} B/msg")
    with throwaway_database(report) as dsn:
        if dsn is None:
            print("\n".join(report.notes))
            return 0
        from terrarium.stores.postgres import PostgresStore

        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="bench-pg-index-") as cache:
            os.environ["TERRARIUM_INDEX_DIR"] = cache
            with PostgresStore(dsn, schema="bytes") as store:
                fill(store, messages)
                derived = index.of(store)
                assert derived is not None
                derived.refresh()
                index_bytes = sum(p.stat().st_size for p in Path(cache).iterdir())
        report.note(f"postgres: loaded and indexed in {time.perf_counter() - t0:.1f} s")
        sums = tally(relation_sizes(dsn, "bytes"), report, messages)
    report.row("derived index file (each machine) / FsStore", f"{index_bytes / fs_bytes:.2f}x")
    for group in ("log", "cursor", "other"):
        report.row(
            f"postgres {group} relations / FsStore",
            f"{sums[group] / fs_bytes:.2f}x",
            "<= 2.5x" if group == "log" else "",
            sums[group] <= 2.5 * fs_bytes if group == "log" else None,
        )
    report.row("postgres all relations / FsStore", f"{sum(sums.values()) / fs_bytes:.2f}x")
    print("\n".join(f"- {note}" for note in report.notes))
    print(report.table())
    return 0


def tally(rows: list[Any], report: Report, messages: int) -> dict[str, int]:
    """Report each non-empty relation's bytes per message; return the groups' sums."""
    sums = {"log": 0, "cursor": 0, "other": 0}
    for name, kind, table, size, toast in rows:
        group = "log" if table in LOG else "cursor" if table in CURSOR else "other"
        sums[group] += size + toast
        if size + toast > 16384:
            what = "index" if kind == "i" else "table"
            extra = f" (+{toast / messages:.0f} TOAST)" if toast else ""
            report.row(f"postgres {group}: {what} {name}", f"{size / messages:.0f} B/msg{extra}")
    for group, total in sums.items():
        report.row(f"postgres {group} relations", f"{total / messages:.0f} B/msg")
    return sums


if __name__ == "__main__":
    raise SystemExit(main())
