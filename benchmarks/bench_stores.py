"""Benchmark the stores side by side: append, restore and search on fs, SQLite and PostgreSQL.

Run: ``.venv/bin/python benchmarks/bench_stores.py`` (``--quick`` for a smoke run of a few
seconds; ``--corpus`` and ``--pg-corpus`` set the search corpora, in messages).

PostgreSQL is used when it answers at ``TERRARIUM_TEST_POSTGRES_DSN`` (or the default
``postgresql://postgres@127.0.0.1:5432/postgres``): the run creates a throwaway database
there, ``terrarium_bench_<random>``, and drops it at the end. Everything else lives in a
temporary directory, removed afterwards.

What is measured, per backend (``FsStore``, ``SqliteStore`` with its default
``synchronous=NORMAL``, ``PostgresStore``):

* **Append**: ``Store.append`` of one history item (a ~100-byte user message, which the
  search index will have to read), one call per entry; the compared operations are called one
  after another in a new random order every turn, so that background load, and what the call
  before left behind (a commit's flush, a cache), fall on all of them alike. Median, mean and
  p99 (and for SQLite p99.9, against its median): the mean includes the checkpoints of
  SQLite's WAL (the derived index is brought up to date by reads, not appends).
  The baselines, in the same run: for SQLite a bare single-row ``INSERT`` of the same line
  into a table of the same shape in its own WAL database (same ``synchronous``), autocommit;
  for PostgreSQL a bare single-row autocommit ``INSERT`` of the same row (same columns, types
  and primary key) on a connection of its own. Also: an append of an entry that is no history
  item, and batched appends of 500 entries per call, as a bulk import does (µs per entry,
  their indexing included).
* **Restore**: ``terrarium.restore`` of a context of 1k and of 10k entries (median of 5).
* **Search**: a corpus of Zipf-distributed sentences (``TextMaker`` from ``bench_search.py``)
  loaded through the store API, ten messages per context: on SQLite, contexts created and
  filled in batches of 500 inside ``SqliteStore.atomic()`` (a bulk import); on PostgreSQL
  each context is one ``create_context`` and one ten-entry append, from four writer threads,
  then the derived index built from the change cursor, as a machine's first search builds it
  (timed with the load; in a temporary ``$TERRARIUM_INDEX_DIR``), then ``VACUUM (ANALYZE)``,
  as autovacuum would do soon after such a load. Then top-20 searches
  with snippets: mid-frequency words (in 0.05 % to 0.5 % of messages), the ten most common
  words (in 8 % to 85 % of messages) and two-word queries of one of each; p50 and p95. Both
  corpora are 1,000,000 messages by default (``--pg-corpus`` makes PostgreSQL's smaller).
* **Listing**: ``list_contexts_fast()`` over the search corpus's contexts (message counts
  and last activity without restoring each context; what ``terrarium list`` shows), median of
  five; the target (< 300 ms) applies at 100,000 contexts.
"""

from __future__ import annotations

import argparse
import bisect
import gc
import itertools
import os
import platform
import random
import shutil
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_search import TYPES, TextMaker, pct  # noqa: E402
from terrarium import ContextId, FsStore, codec, index, restore  # noqa: E402
from terrarium.index import listing as lister  # noqa: E402
from terrarium.index._query import SearchQuery  # noqa: E402
from terrarium.stores.base import INDEX_DB, NewEntry, Store, iter_lines  # noqa: E402
from terrarium.stores.sqlite import SqliteStore  # noqa: E402

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
ENV_VAR = "TERRARIUM_TEST_POSTGRES_DSN"
TS = "2026-11-22T12:00:00.000000Z"
MESSAGE = "Could you remind me what we decided about the deployment window for the new cluster?"


class Report:
    """The rows of the results table and the notes printed above it."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []
        self.notes: list[str] = []

    def row(self, name: str, value: str, target: str = "", passed: bool | None = None) -> None:
        result = "" if passed is None else ("PASS" if passed else "FAIL")
        self.rows.append((name, value, target, result))
        print(f"  {name}: {value} {target} {result}".rstrip(), flush=True)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  {text}", flush=True)

    def table(self) -> str:
        width = max(len(r[0]) for r in self.rows)
        value_width = max(10, *(len(r[1]) for r in self.rows))
        lines = [
            f"| {'measure'.ljust(width)} | {'value'.rjust(value_width)} | target     | result |",
            f"|{'-' * (width + 2)}|{'-' * (value_width + 2)}|------------|--------|",
        ]
        for name, value, target, result in self.rows:
            lines.append(
                f"| {name.ljust(width)} | {value.rjust(value_width)} | {target:<10} | {result:<6} |"
            )
        return "\n".join(lines)


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 10 else f"{seconds:.1f} s"


def entry(text: str = MESSAGE, kind: str = "user_input") -> NewEntry:
    if kind == "usage":
        return NewEntry("usage", TS, {"model": "m", "prompt_tokens": 12, "completion_tokens": 3})
    return NewEntry(kind, TS, {"item": {"role": "user", "content": text}})


def new_context(store: Store, name: str) -> tuple[uuid.UUID, uuid.UUID]:
    """Create ``cli:name`` with an empty root segment; return (session, segment)."""
    session_id, segment_id = uuid.uuid4(), uuid.uuid4()
    header = {
        "v": 1,
        "ts": TS,
        "kind": "header",
        "session_id": str(session_id),
        "segment_id": str(segment_id),
        "context": f"cli:{name}",
        "origin": {"kind": "root"},
        "system_prompt": None,
        "config": {},
        "history": [],
    }
    store.create_context(ContextId("cli", name), header)
    return session_id, segment_id


class Timing:
    """Seconds per call of one operation: wall time, and the CPU time of the calling thread
    (``cpu_*``: what the call itself did, without waits for a lock, the disk or other
    processes)."""

    def __init__(self, samples: list[float], cpu: list[float]) -> None:
        self.median = statistics.median(samples)
        self.mean = statistics.fmean(samples)
        self.p99 = sorted(samples)[int(len(samples) * 0.99)]
        self.p999 = sorted(samples)[int(len(samples) * 0.999)]
        self.cpu_median = statistics.median(cpu)
        self.cpu_p999 = sorted(cpu)[int(len(cpu) * 0.999)]


def interleaved(ops: dict[str, Callable[[], Any]], count: int) -> dict[str, Timing]:
    """Time ``count`` calls of each op, one call of each in turn, in a new random order every
    turn: background load and whatever the call before left behind (a commit's flush, a
    cache) fall on every op alike."""
    samples: dict[str, list[float]] = {name: [] for name in ops}
    cpu: dict[str, list[float]] = {name: [] for name in ops}
    names = list(ops)
    order = random.Random(7)
    perf, thread_time = time.perf_counter, time.thread_time
    for _ in range(count):
        order.shuffle(names)
        for name in names:
            c0, t0 = thread_time(), perf()
            ops[name]()
            t1, c1 = perf(), thread_time()
            samples[name].append(t1 - t0)
            cpu[name].append(c1 - c0)
    return {name: Timing(values, cpu[name]) for name, values in samples.items()}


def append_op(store: Store, name: str, kind: str = "user_input") -> Callable[[], Any]:
    session_id, segment_id = new_context(store, name)
    item = entry(kind=kind)
    return lambda: store.append(session_id, segment_id, [item])


def batched_cost(store: Store, name: str, batches: int, size: int = 500) -> float:
    """Seconds per entry of ``size``-entry appends (a bulk import)."""
    session_id, segment_id = new_context(store, name)
    items = [entry(f"{MESSAGE} {i}") for i in range(size)]
    store.append(session_id, segment_id, items)  # warm
    t0 = time.perf_counter()
    for _ in range(batches):
        store.append(session_id, segment_id, items)
    return (time.perf_counter() - t0) / (batches * size)


def restore_cost(store: Store, name: str, size: int, repeat: int = 5) -> float:
    """Median seconds of ``restore`` of a context of ``size`` entries."""
    session_id, segment_id = new_context(store, name)
    roles = itertools.cycle(("user", "assistant"))
    for start in range(0, size, 1000):
        store.append(
            session_id,
            segment_id,
            [
                NewEntry("item", TS, {"item": {"role": next(roles), "content": f"{MESSAGE} {i}"}})
                for i in range(start, min(size, start + 1000))
            ],
        )
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        state = restore(store, f"cli:{name}")
        samples.append(time.perf_counter() - t0)
        assert len(state.history) == size
    return statistics.median(samples)


# --------------------------------------------------------------------------- baselines


def bare_sqlite(path: Path, synchronous: str) -> tuple[Callable[[], Any], Callable[[], None]]:
    """A bare autocommit INSERT of an entry line into a table shaped like ``entries`` (an
    arrival id, the segment's integer key, ``UNIQUE (seg, seq)``)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute(
        "CREATE TABLE entries (id INTEGER PRIMARY KEY, seg INTEGER NOT NULL, "
        "seq INTEGER NOT NULL, kind TEXT NOT NULL, ts TEXT NOT NULL, line TEXT NOT NULL, "
        "UNIQUE (seg, seq))"
    )
    seq = itertools.count(1)
    item = entry()

    def insert() -> None:
        n = next(seq)
        line = codec.encode(next(iter_lines([item], n))).decode()
        conn.execute(
            "INSERT INTO entries (seg, seq, kind, ts, line) VALUES (?, ?, ?, ?, ?)",
            (1, n, item.kind, item.ts, line),
        )

    return insert, conn.close


def bare_postgres(dsn: str) -> tuple[Callable[[], Any], Callable[[], None]]:
    """A bare single-row autocommit INSERT of the same row into a table shaped like
    ``entries`` (same columns, types and primary key), on a connection of its own."""
    import psycopg

    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(
        "CREATE TABLE bare_entries (session_id uuid NOT NULL, segment_id uuid NOT NULL, "
        "seq integer NOT NULL, kind text NOT NULL, ts text NOT NULL, line text NOT NULL, "
        "PRIMARY KEY (session_id, segment_id, seq))"
    )
    s, g = uuid.uuid4(), uuid.uuid4()
    seq = itertools.count(1)
    item = entry()
    sql = "INSERT INTO bare_entries VALUES (%s, %s, %s, %s, %s, %s)"

    def insert() -> None:
        n = next(seq)
        line = codec.encode(next(iter_lines([item], n))).decode()
        conn.execute(sql, (s, g, n, item.kind, item.ts, line), prepare=True)

    return insert, conn.close


@contextmanager
def throwaway_database(report: Report) -> Iterator[str | None]:
    """A fresh PostgreSQL database's DSN (dropped afterwards), or None when none answers."""
    try:
        import psycopg
        from psycopg.conninfo import make_conninfo
    except ImportError:
        report.note("PostgreSQL skipped: psycopg is not installed (the postgres extra)")
        yield None
        return
    admin = os.environ.get(ENV_VAR) or DEFAULT_DSN
    try:
        conn = psycopg.connect(admin, autocommit=True, connect_timeout=2)
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        report.note(f"PostgreSQL skipped: no server at {ENV_VAR} or the default ({first})")
        yield None
        return
    name = f"terrarium_bench_{uuid.uuid4().hex[:12]}"
    with conn:
        conn.execute(f'CREATE DATABASE "{name}"')
        version = conn.execute("SHOW server_version").fetchone()
        sync = conn.execute("SHOW synchronous_commit").fetchone()
    report.note(
        f"PostgreSQL {version[0] if version else '?'} (synchronous_commit="
        f"{sync[0] if sync else '?'}), throwaway database {name}"
    )
    try:
        yield make_conninfo(admin, dbname=name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --------------------------------------------------------------------------- the corpus


def corpus(maker: TextMaker, contexts: int, per_context: int) -> Iterator[tuple[str, list[str]]]:
    """(context name, its messages) for ``contexts`` contexts of Zipf-distributed sentences."""
    rng = maker.rng
    kinds = [t for t, _ in TYPES]
    weights = list(itertools.accumulate(w for _, w in TYPES))
    for i in range(contexts):
        kind = kinds[bisect.bisect(weights, rng.random() * weights[-1])]
        texts = [
            maker.message(4, 25) if seq % 2 == 0 else maker.message(8, 60)
            for seq in range(per_context)
        ]
        yield f"{kind}:c{i}", texts


def load(store: Store, texts: list[tuple[str, list[str]]], *, writers: int = 1) -> None:
    """Create every context with its messages through the store API.

    SQLite: 500 contexts per ``atomic()`` transaction (one writer at a time anyway).
    PostgreSQL: ``writers`` threads, each creating a context and appending its messages in
    two commits; concurrent commits share the WAL flushes, as many agents' would.
    """
    start = time.mktime((2025, 1, 1, 0, 0, 0, 0, 0, 0))
    batch = 500

    def one(i: int, context: str, messages: list[str]) -> None:
        ctx = ContextId.parse(context)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(start + i * 300))
        session_id, segment_id = uuid.uuid4(), uuid.uuid4()
        header = {
            "v": 1,
            "ts": f"{stamp}.000000Z",
            "kind": "header",
            "session_id": str(session_id),
            "segment_id": str(segment_id),
            "context": context,
            "origin": {"kind": "root"},
            "system_prompt": None,
            "config": {},
            "history": [],
        }
        store.create_context(ctx, header)
        store.append(
            session_id,
            segment_id,
            [
                NewEntry(
                    "user_input" if seq % 2 == 0 else "item",
                    f"{stamp}.{seq:06d}Z",
                    {"item": {"role": "user" if seq % 2 == 0 else "assistant", "content": text}},
                )
                for seq, text in enumerate(messages)
            ],
        )

    def chunk(first: int) -> None:
        for i, (context, messages) in enumerate(texts[first : first + batch], first):
            one(i, context, messages)

    if isinstance(store, SqliteStore):
        for first in range(0, len(texts), batch):
            with store.atomic():
                chunk(first)
        return
    with ThreadPoolExecutor(writers) as pool:
        for done in pool.map(chunk, range(0, len(texts), batch)):
            assert done is None


def word_classes(db: Path, messages: int, queries: int, rng: random.Random) -> dict[str, list[str]]:
    """Query words by class, from the vocabulary of the SQLite store ``db``'s derived index
    (documents per word)."""
    conn = sqlite3.connect(f"file:{index_db(db)}?mode=ro", uri=True)
    try:
        conn.execute("CREATE VIRTUAL TABLE temp.vocab USING fts5vocab(main, fts, col)")
        rows = conn.execute("SELECT term, doc FROM temp.vocab WHERE col = 'body'").fetchall()
    finally:
        conn.close()
    freqs = sorted(rows, key=lambda pair: -pair[1])
    mid = [w for w, d in freqs if 0.0005 * messages <= d <= 0.005 * messages] or [freqs[-1][0]]
    common = [w for w, _ in freqs[:10]]
    return {
        "mid-frequency word": [rng.choice(mid) for _ in range(queries)],
        "very common word": [common[i % len(common)] for i in range(queries)],
        "mid + common words": [
            f"{rng.choice(mid)} {common[i % len(common)]}" for i in range(queries)
        ],
    }


def search_latency(
    store: Any, classes: dict[str, list[str]], report: Report, label: str, targets: bool
) -> None:
    for words in classes.values():  # warm the caches and the connections
        for text in words[:5]:
            lister(store).search(SearchQuery(text, limit=20))
    for name, words in classes.items():
        samples = []
        found = 0
        for text in words:
            t0 = time.perf_counter()
            hits = lister(store).search(SearchQuery(text, limit=20))
            samples.append(time.perf_counter() - t0)
            found += len(hits)
            assert all(hit.highlights for hit in hits), text
        p50, p95 = pct(samples, 0.5), pct(samples, 0.95)
        report.row(
            f"{label} search p50, {name}",
            ms(p50),
            "< 10 ms" if targets else "",
            None if not targets else p50 < 0.010,
        )
        report.row(
            f"{label} search p95, {name}",
            ms(p95),
            "< 80 ms" if targets else "",
            None if not targets else p95 < 0.080,
        )
        report.note(f"{label} {name}: {found / len(words):.1f} hits per query on average")


def listing(store: Any, report: Report, label: str, contexts: int) -> None:
    """``list_contexts_fast`` (what ``terrarium list`` uses): median of 5; the target applies
    at 100,000 contexts."""
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        found = lister(store).list_contexts_fast()
        samples.append(time.perf_counter() - t0)
        assert len(found) == contexts
    p50 = statistics.median(samples)
    full = contexts >= 100_000
    report.row(
        f"{label} list {contexts:,} contexts with counts: median",
        ms(p50),
        "< 300 ms" if full else "",
        p50 < 0.300 if full else None,
    )


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--corpus", type=int, help="messages in SQLite's search corpus")
    parser.add_argument("--pg-corpus", type=int, help="messages in PostgreSQL's search corpus")
    args = parser.parse_args(argv)
    # A run stopped with SIGTERM still drops its throwaway database and temporary files.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    quick = args.quick
    appends = 300 if quick else 4000
    sizes = (100, 1000) if quick else (1000, 10_000)
    batches = 2 if quick else 20
    messages = args.corpus or (5_000 if quick else 1_000_000)
    pg_messages = min(messages, args.pg_corpus or (2_000 if quick else 1_000_000))
    queries = 20 if quick else 200
    per_context = 10
    report = Report()
    base = Path(tempfile.mkdtemp(prefix="bench-stores-"))
    started = time.perf_counter()
    print(
        f"Store benchmark ({'quick' if quick else 'full'}) on {platform.node()}: "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}; load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    try:
        with throwaway_database(report) as dsn:
            run_fs(base, report, appends, sizes)
            run_sqlite(base, report, appends, sizes, batches)
            if dsn is not None:
                # Each machine's derived index of a PostgreSQL store: here, not the user's.
                os.environ["TERRARIUM_INDEX_DIR"] = str(base / "pg-index")
                run_postgres(dsn, report, appends, sizes, batches)
            # The search corpora, loaded through the store API; the texts are then let go
            # before anything is timed, as a process that searches would not hold them.
            rng = random.Random(20261122)
            maker = TextMaker(2_000 if quick else 50_000, rng)
            t0 = time.perf_counter()
            texts = list(corpus(maker, messages // per_context, per_context))
            report.note(f"generated {messages:,} messages in {time.perf_counter() - t0:.1f} s")
            path = load_sqlite(base, report, texts)
            pg_contexts = 0
            if dsn is not None:
                pg_contexts = load_postgres(dsn, report, texts[: pg_messages // per_context])
            contexts = len(texts)
            del texts, maker
            gc.collect()
            classes = word_classes(path, messages, queries, rng)
            with SqliteStore(path) as store:
                search_latency(store, classes, report, f"sqlite {messages:,} msgs", True)
                listing(store, report, "sqlite", contexts)
            if dsn is not None:
                from terrarium.stores.postgres import PostgresStore

                with PostgresStore(dsn, schema="search") as store:
                    label = f"postgres {pg_contexts * per_context:,} msgs"
                    search_latency(store, classes, report, label, False)
                    listing(store, report, "postgres", pg_contexts)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(
        f"\nResults ({time.perf_counter() - started:.0f} s in all; load now "
        f"{os.getloadavg()[0]:.2f}):\n"
    )
    for note in report.notes:
        print(f"- {note}")
    print()
    print(report.table())
    return 0


def run_fs(base: Path, report: Report, appends: int, sizes: tuple[int, int]) -> None:
    print("fs:", flush=True)
    with FsStore(base / "fs") as store:
        result = interleaved({"append": append_op(store, "append")}, appends)
        report.row("fs append, one history item", us(result["append"].median))
        for size in sizes:
            report.row(f"fs restore {size:,} entries", ms(restore_cost(store, f"r{size}", size)))


def run_sqlite(
    base: Path,
    report: Report,
    appends: int,
    sizes: tuple[int, int],
    batches: int,
) -> None:
    """SQLite's appends and restores."""
    print("sqlite:", flush=True)
    with SqliteStore(base / "sqlite.db") as store:
        bare, close = bare_sqlite(base / "bare.db", store.synchronous)
        try:
            result = interleaved(
                {
                    "append": append_op(store, "append"),
                    "bare": bare,
                    "plain": append_op(store, "plain", kind="usage"),
                },
                appends,
            )
        finally:
            close()
        append, bare_insert = result["append"], result["bare"]
        report.row(
            "sqlite append, one history item: median",
            us(append.median),
            "< 50 µs",
            append.median < 50e-6,
        )
        report.row("sqlite bare INSERT (baseline): median", us(bare_insert.median))
        report.row(
            "sqlite append / bare INSERT, median", f"{append.median / bare_insert.median:.2f}x"
        )
        report.row(
            "sqlite append: mean (with the catch-ups) / p99 / p99.9",
            f"{us(append.mean)} / {us(append.p99)} / {us(append.p999)}",
        )
        report.row(
            "sqlite bare INSERT: mean / p99 / p99.9",
            f"{us(bare_insert.mean)} / {us(bare_insert.p99)} / {us(bare_insert.p999)}",
        )
        report.row(
            "sqlite append p99.9 / its median, wall (waits for upkeep slices included)",
            f"{append.p999 / append.median:.1f}x",
            "<= 20x",
            append.p999 <= 20 * append.median,
        )
        report.row(
            "sqlite append p99.9 / its median, CPU of the appending thread",
            f"{append.cpu_p999 / append.cpu_median:.1f}x "
            f"({us(append.cpu_p999)} / {us(append.cpu_median)})",
            "<= 20x",
            append.cpu_p999 <= 20 * append.cpu_median,
        )
        report.row("sqlite append, no history item: median", us(result["plain"].median))
        report.row(
            "sqlite batched append (500/call)",
            f"{batched_cost(store, 'bulk', batches) * 1e6:.1f} µs/entry",
        )
        for size in sizes:
            report.row(
                f"sqlite restore {size:,} entries", ms(restore_cost(store, f"r{size}", size))
            )


def settle(store: Store) -> None:
    """Bring the store's derived index up to date with what a bulk write left: the steady
    state of a store that has served a search, which timed appends and searches start from.
    A store with native search (PostgreSQL) has none."""
    found = index.of(store)
    if found is not None:
        found.refresh()


def index_db(db: Path) -> Path:
    """The derived index's database beside the SQLite store ``db``."""
    return db.with_name(f"{db.name}.{INDEX_DB}")


def load_sqlite(base: Path, report: Report, texts: list[tuple[str, list[str]]]) -> Path:
    """SQLite's search corpus; return the database's path."""
    print("sqlite: loading the search corpus", flush=True)
    path = base / "search.db"
    with SqliteStore(path) as store:
        messages = sum(len(m) for _, m in texts)
        t0 = time.perf_counter()
        load(store, texts)
        settle(store)  # the load's share of the upkeep thread's work, timed with it
        elapsed = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in base.glob("search.db*"))
        report.note(
            f"sqlite: loaded {messages:,} messages ({len(texts):,} contexts) through the store "
            f"API in {elapsed:.1f} s ({messages / elapsed:,.0f} messages/s); "
            f"database {size / 1e6:.0f} MB"
        )
    return path


def run_postgres(
    dsn: str,
    report: Report,
    appends: int,
    sizes: tuple[int, int],
    batches: int,
) -> None:
    """PostgreSQL's appends and restores."""
    from terrarium.stores.postgres import PostgresStore

    print("postgres:", flush=True)
    with PostgresStore(dsn) as store:
        bare, close = bare_postgres(dsn)
        try:
            result = interleaved(
                {
                    "append": append_op(store, "append"),
                    "bare": bare,
                    "plain": append_op(store, "plain", kind="usage"),
                },
                appends,
            )
        finally:
            close()
        append, bare_insert, plain = result["append"], result["bare"], result["plain"]
        ratio = append.median / bare_insert.median
        report.row("postgres append, one history item: median", us(append.median))
        report.row("postgres bare INSERT (baseline): median", us(bare_insert.median))
        report.row(
            "postgres append / bare INSERT, median", f"{ratio:.2f}x", "<= 1.2x", ratio <= 1.2
        )
        report.row(
            "postgres append / bare INSERT, mean",
            f"{append.mean / bare_insert.mean:.2f}x",
        )
        report.row("postgres append, no history item: median", us(plain.median))
        report.row(
            "postgres append (no history) / bare, median",
            f"{plain.median / bare_insert.median:.2f}x",
        )
        report.row(
            "postgres batched append (500/call)",
            f"{batched_cost(store, 'bulk', batches) * 1e6:.1f} µs/entry",
        )
        for size in sizes:
            report.row(
                f"postgres restore {size:,} entries", ms(restore_cost(store, f"r{size}", size))
            )


def load_postgres(dsn: str, report: Report, subset: list[tuple[str, list[str]]]) -> int:
    """PostgreSQL's search corpus, in schema ``search``; return how many contexts."""
    import psycopg

    from terrarium.stores.postgres import PostgresStore

    print("postgres: loading the search corpus", flush=True)
    with PostgresStore(dsn, schema="search") as store:
        messages = sum(len(m) for _, m in subset)
        t0 = time.perf_counter()
        load(store, subset, writers=4)
        loaded = time.perf_counter() - t0
        derived = index.of(store)  # what the first search does: index every item appended
        assert derived is not None
        derived.refresh()
        indexed = time.perf_counter() - t0 - loaded
        with psycopg.connect(dsn, autocommit=True) as conn:
            # As autovacuum would soon: planner statistics, and the old row versions of
            # segments and the change cursor (appends update them) cleared.
            for table in ("segments", "contexts", "session_changes"):
                conn.execute(f"VACUUM (ANALYZE) search.{table}")
        elapsed = time.perf_counter() - t0
        report.note(
            f"postgres: loaded {messages:,} messages ({len(subset):,} contexts) through the "
            f"store API in {loaded:.1f} s, indexed them for search in {indexed:.1f} s "
            f"({messages / (loaded + indexed):,.0f} messages/s in all), vacuumed in "
            f"{elapsed - loaded - indexed:.1f} s"
        )
    return len(subset)


if __name__ == "__main__":
    raise SystemExit(main())
