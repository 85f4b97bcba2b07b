"""Benchmark the three ways PostgreSQL entries can be queried as ``jsonb``.

Run: ``.venv/bin/python benchmarks/bench_pg_jsonb.py`` (``--quick`` for a smoke run of a few
seconds; ``--rows`` sets the size of the loaded table).

It needs PostgreSQL at ``TERRARIUM_TEST_POSTGRES_DSN`` (or the default
``postgresql://postgres@127.0.0.1:5432/postgres``), where it creates a throwaway database,
``terrarium_bench_<random>``, and drops it at the end.

Three tables of the shape of ``entries`` (key ``(session_id, segment_id, seq)``, ``kind``,
``ts``), filled with the same lines, as :func:`terrarium.codec.encode` writes them for a
conversation (user messages of 50-400 characters, assistant replies of 200-2,000, usage,
run and turn-end entries):

* ``cast``: ``line text`` alone, what the store keeps; views cast with ``line_jsonb(line)``
  (migration ``m001_initial``), paying the parse on every read;
* ``stored``: ``line text`` plus ``body jsonb GENERATED ALWAYS AS (line_jsonb(line)) STORED``,
  paying the parse and a second copy on every append;
* ``jsonb``: ``line jsonb`` instead of text, for reference only: it cannot keep a line as
  written (key order, spacing, U+0000), which restore and export promise.

Measured: an autocommit single-row ``INSERT`` of one line (the three compared in a new random
order every round, median and p99, µs); a 500-row insert from arrays (as a batched append
sends them, µs per row); bytes on disk of each table with its TOAST and index after the load;
and reading one segment's 1,000 history items as ``jsonb`` (role and content extracted, as
the ``transcript`` view does; median of the runs, ms).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from terrarium import codec

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
VARIANTS = ("cast", "stored", "jsonb")
WORDS = "the a model tool result user reply café 東京 data line search fork token agent".split()
LINE_JSONB = r"""CREATE FUNCTION line_jsonb(line text) RETURNS jsonb
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
        SELECT (CASE WHEN strpos(line, '\u0000') = 0 THEN line
            ELSE replace(replace(replace(line, '\\', chr(1)), '\u0000', '\ufffd'),
                chr(1), '\\') END)::jsonb
    $$"""
TABLES = {
    "cast": "line text NOT NULL",
    "stored": "line text NOT NULL, body jsonb GENERATED ALWAYS AS (line_jsonb(line)) STORED",
    "jsonb": "line jsonb NOT NULL",
}
READS = {
    "cast": "line_jsonb(line)",
    "stored": "body",
    "jsonb": "line",
}


def text(rng: random.Random, low: int, high: int) -> str:
    """Words up to a length drawn between ``low`` and ``high`` characters."""
    size, out = rng.randint(low, high), []
    while sum(len(word) + 1 for word in out) < size:
        out.append(rng.choice(WORDS))
    return " ".join(out)


def lines(rng: random.Random, count: int) -> Iterator[tuple[str, str, str]]:
    """``count`` (kind, ts, line) of a conversation, turn after turn, seq 1 on."""
    seq = 0
    while True:
        ts = "2026-11-24T12:00:00.000000Z"
        turn: list[dict[str, Any]] = [
            {"kind": "user_input", "item": {"role": "user", "content": text(rng, 50, 400)}},
            {"kind": "item", "item": {"role": "assistant", "content": text(rng, 200, 2000)}},
            {"kind": "usage", "model": "m", "prompt_tokens": 900, "completion_tokens": 120},
            {"kind": "run_completed", "finish_reason": "stop"},
            {"kind": "turn_end"},
        ]
        for body in turn:
            seq += 1
            if seq > count:
                return
            entry = {"v": 1, "seq": seq, "ts": ts, **body}
            yield body["kind"], ts, codec.encode(entry).decode()


@contextmanager
def throwaway_database(admin: str) -> Iterator[str]:
    """A new database on the server of ``admin``, dropped afterwards."""
    name = f"terrarium_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_conninfo(admin, dbname=name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def create(conn: psycopg.Connection[Any]) -> None:
    conn.execute(LINE_JSONB)
    for name, columns in TABLES.items():
        conn.execute(
            f"CREATE TABLE entries_{name} (session_id uuid NOT NULL, segment_id uuid NOT NULL, "
            f"seq integer NOT NULL, kind text NOT NULL, ts text NOT NULL, {columns}, "
            "PRIMARY KEY (session_id, segment_id, seq))"
        )


def load(conn: psycopg.Connection[Any], rows: int, segment: uuid.UUID) -> None:
    """``rows`` entries in segments of 1,000, the first of which is ``segment``."""
    rng = random.Random(7)
    session = uuid.UUID(int=1)
    data = list(lines(rng, rows))
    for name in VARIANTS:
        with (
            conn.cursor() as cur,
            cur.copy(
                f"COPY entries_{name} (session_id, segment_id, seq, kind, ts, line) FROM STDIN"
            ) as copy,
        ):
            for i, (kind, ts, line) in enumerate(data):
                part = i // 1000
                seg = segment if part == 0 else uuid.UUID(int=part + 1)
                copy.write_row((session, seg, i % 1000 + 1, kind, ts, line))
    conn.execute("VACUUM ANALYZE")


def size(conn: psycopg.Connection[Any], table: str) -> int:
    row = conn.execute("SELECT pg_total_relation_size(%s::regclass)", (table,)).fetchone()
    return int(row[0]) if row else 0


def append_one(conn: psycopg.Connection[Any], rounds: int) -> dict[str, list[float]]:
    """Microseconds of one autocommit single-row insert, per variant, interleaved."""
    rng = random.Random(11)
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    session, segment = uuid.uuid4(), uuid.uuid4()
    source = lines(rng, rounds)
    for seq, (kind, ts, line) in enumerate(source, start=1):
        order = list(VARIANTS)
        rng.shuffle(order)
        for name in order:
            statement = (
                f"INSERT INTO entries_{name} (session_id, segment_id, seq, kind, ts, line) "
                "VALUES (%s, %s, %s, %s, %s, %s)"
            )
            started = time.perf_counter()
            conn.execute(statement, (session, segment, seq, kind, ts, line), prepare=True)
            samples[name].append((time.perf_counter() - started) * 1e6)
    return samples


def append_batch(conn: psycopg.Connection[Any], batches: int) -> dict[str, float]:
    """Microseconds per row of 500-row inserts from arrays, per variant (median batch)."""
    rng = random.Random(13)
    out: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(batches):
        data = list(lines(rng, 500))
        session, segment = uuid.uuid4(), uuid.uuid4()
        order = list(VARIANTS)
        rng.shuffle(order)
        for name in order:
            started = time.perf_counter()
            conn.execute(
                f"INSERT INTO entries_{name} (session_id, segment_id, seq, kind, ts, line) "
                f"SELECT %s, %s, e.seq, e.kind, e.ts, e.line{'::jsonb' if name == 'jsonb' else ''} "
                "FROM unnest(%s::int[], "
                "%s::text[], %s::text[], %s::text[]) AS e(seq, kind, ts, line)",
                (
                    session,
                    segment,
                    list(range(1, 501)),
                    [d[0] for d in data],
                    [d[1] for d in data],
                    [d[2] for d in data],
                ),
            )
            out[name].append((time.perf_counter() - started) * 1e6 / 500)
    return {name: statistics.median(values) for name, values in out.items()}


def read_segment(conn: psycopg.Connection[Any], segment: uuid.UUID, runs: int) -> dict[str, float]:
    """Milliseconds to read one segment's history items' role and content as jsonb."""
    rng = random.Random(17)
    out: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(runs):
        order = list(VARIANTS)
        rng.shuffle(order)
        for name in order:
            started = time.perf_counter()
            conn.execute(
                f"SELECT x -> 'item' ->> 'role', x -> 'item' ->> 'content' FROM (SELECT "
                f"{READS[name]} AS x FROM entries_{name} WHERE session_id = %s AND segment_id = %s "
                "AND seq BETWEEN 1 AND 1000 AND kind IN ('item', 'system_item', "
                "'user_input') ORDER BY seq) AS q",
                (uuid.UUID(int=1), segment),
                prepare=True,
            ).fetchall()
            out[name].append((time.perf_counter() - started) * 1e3)
    return {name: statistics.median(values) for name, values in out.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--rows", type=int, default=200_000, help="rows loaded per table")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    rows, rounds, batches, runs = (2_000, 50, 3, 3) if args.quick else (args.rows, 3_000, 40, 30)
    admin = os.environ.get("TERRARIUM_TEST_POSTGRES_DSN", DEFAULT_DSN)
    segment = uuid.UUID(int=10**9)
    with throwaway_database(admin) as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        server = conn.execute("SHOW server_version").fetchone()
        create(conn)
        load(conn, rows, segment)
        sizes = {name: size(conn, f"entries_{name}") for name in VARIANTS}
        reads = read_segment(conn, segment, runs)
        singles = append_one(conn, rounds)
        batched = append_batch(conn, batches)
    results: dict[str, Any] = {"server": server[0] if server else "?", "rows": rows}
    print(f"PostgreSQL {results['server']}, {rows:,} rows loaded per table")
    print(
        f"{'variant':8} {'append p50 µs':>14} {'p99 µs':>8} {'batch µs/row':>13} "
        f"{'MB on disk':>11} {'read 1k items ms':>17}"
    )
    for name in VARIANTS:
        one = sorted(singles[name])
        p50, p99 = statistics.median(one), one[min(len(one) - 1, int(len(one) * 0.99))]
        results[name] = {
            "append_p50_us": round(p50, 1),
            "append_p99_us": round(p99, 1),
            "batch_us_per_row": round(batched[name], 2),
            "bytes": sizes[name],
            "read_ms": round(reads[name], 2),
        }
        print(
            f"{name:8} {p50:14.1f} {p99:8.1f} {batched[name]:13.2f} "
            f"{sizes[name] / 1e6:11.1f} {reads[name]:17.2f}"
        )
    base = results["cast"]
    for name in ("stored", "jsonb"):
        other = results[name]
        print(
            f"{name} / cast: append {other['append_p50_us'] / base['append_p50_us']:.2f}x, "
            f"batch {other['batch_us_per_row'] / base['batch_us_per_row']:.2f}x, "
            f"disk {other['bytes'] / base['bytes']:.2f}x, "
            f"read {other['read_ms'] / base['read_ms']:.2f}x"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
