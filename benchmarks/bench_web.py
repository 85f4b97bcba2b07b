"""Dashboard server time: the overview and the first sessions page on a big store, and a long
session's first page, on the filesystem store (its index), SQLite and PostgreSQL.

Each request goes through the whole ASGI app (Starlette's test client, no network), so the
time is the server's: listing, aggregation and template rendering. The overview is measured
cold (its activity cache empty: it reads head lineages for at most 0.3 s and says how many
contexts are still pending), then how many more loads it takes to cover every context, then
warm (only contexts whose listing row changed are re-read: a dashboard left open).

    python benchmarks/bench_web.py --contexts 100000 --messages 10 --session 10000
    python benchmarks/bench_web.py --quick        # tiny sizes: the smoke test runs this
    python benchmarks/bench_web.py --contexts 100000 --keep /var/tmp/bench-web

With ``--keep DIR`` the stores are filled once, in ``DIR`` (fs, SQLite) and in a PostgreSQL
database named after it, and later runs with the same sizes measure them again without
filling (a 1M-message PostgreSQL store takes some 25 minutes to load here).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_stores import (  # noqa: E402
    DEFAULT_DSN,
    ENV_VAR,
    Report,
    entry,
    ms,
    new_context,
    throwaway_database,
)
from terrarium import FsStore, states  # noqa: E402
from terrarium.model import ContextId  # noqa: E402
from terrarium.stores.base import Lifecycle, Store  # noqa: E402
from terrarium.stores.sqlite import SqliteStore  # noqa: E402

BATCH = 500


def fill(store: Store, contexts: int, messages: int, session: int, pinned: int = 0) -> None:
    """``contexts`` contexts of ``messages`` user messages each, and ``cli:long`` of
    ``session`` messages; the first ``pinned`` contexts pinned (a lifecycle record each)."""
    for i in range(contexts):
        session_id, segment_id = new_context(store, f"c{i:07d}")
        store.append(
            session_id, segment_id, [entry(f"message {j} of {i}") for j in range(messages)]
        )
    session_id, segment_id = new_context(store, "long")
    for start in range(0, session, BATCH):
        size = min(BATCH, session - start)
        store.append(session_id, segment_id, [entry(f"long {start + j}") for j in range(size)])
    for i in range(pinned):
        assert isinstance(store, Lifecycle)
        states.pin_context(store, ContextId("cli", f"c{i:07d}"))


def timed(call: Callable[[], Any], repeat: int) -> float:
    """The median seconds of ``repeat`` calls."""
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure(report: Report, label: str, store: Store, repeat: int) -> None:
    from starlette.testclient import TestClient

    from terrarium.web import create_app

    client = TestClient(create_app(store), base_url="http://127.0.0.1")

    def get(url: str) -> Callable[[], Any]:
        def call() -> None:
            response = client.get(url)
            assert response.status_code == 200, (url, response.text[:200])

        return call

    cold = timed(get("/"), 1)
    report.row(f"{label} overview, cold cache", ms(cold), "<= 500 ms", cold <= 0.5)
    start, loads, slowest = time.perf_counter(), 0, 0.0
    while True:  # as the page's reloads do, a second apart (a step of the index's build each)
        began = time.perf_counter()
        stats = client.get("/api/stats").json()
        slowest = max(slowest, time.perf_counter() - began)
        if not stats["indexing"]:
            break
        loads += 1
        time.sleep(1.0)  # the page's <meta> refresh
    filled = time.perf_counter() - start
    report.row(f"{label} overview complete after", f"{loads} more loads, {filled:.1f} s")
    report.row(f"{label} slowest of those loads", ms(slowest), "<= 500 ms", slowest <= 0.5)
    warm = timed(get("/"), repeat)
    report.row(f"{label} overview, warm", ms(warm), "<= 500 ms", warm <= 0.5)
    first = timed(get("/sessions"), repeat)
    report.row(f"{label} first sessions page", ms(first), "<= 500 ms", first <= 0.5)
    api = timed(get("/api/contexts?sort=messages"), repeat)
    report.row(f"{label} /api/contexts by messages", ms(api), "<= 500 ms", api <= 0.5)
    long = timed(get("/session?c=cli:long"), repeat)
    report.row(f"{label} long session, first page", ms(long), "<= 200 ms", long <= 0.2)


def stores(base: Path, report: Report, which: set[str], keep: bool) -> Iterator[tuple[str, Store]]:
    if "fs" in which:
        with FsStore(base / "fs") as fs:
            yield "fs", fs
    if "sqlite" in which:
        with SqliteStore(base / "web.db") as sqlite:
            yield "sqlite", sqlite
    if "postgres" in which:
        kept = kept_database(base, report) if keep else throwaway_database(report)
        with kept as dsn:
            if dsn is not None:
                from terrarium.stores.postgres import PostgresStore

                with PostgresStore(dsn) as pg:
                    yield "postgres", pg


@contextlib.contextmanager
def kept_database(base: Path, report: Report) -> Iterator[str | None]:
    """The DSN of a PostgreSQL database kept for ``--keep`` runs (created the first time and
    named after the folder), or None when no server answers."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    admin = os.environ.get(ENV_VAR) or DEFAULT_DSN
    name = "terrarium_bench_web_" + hashlib.sha256(str(base).encode()).hexdigest()[:10]
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=2) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                report.note(f"PostgreSQL: kept database {name}")
            else:
                conn.execute(f'CREATE DATABASE "{name}"')
                report.note(f"PostgreSQL: new kept database {name} (drop it when done)")
    except psycopg.OperationalError as exc:
        report.note(f"PostgreSQL skipped: {str(exc).strip().splitlines()[0]}")
        yield None
        return
    yield make_conninfo(admin, dbname=name)


def filled(base: Path, label: str, args: argparse.Namespace, mark: bool = False) -> bool:
    """Whether a kept store was filled with these sizes already; with ``mark``, say it is."""
    marker = base / f"{label}.filled"
    sizes = f"{args.contexts} {args.messages} {args.session}"
    sizes += f" {args.pinned}\n" if args.pinned else "\n"  # a kept store of before it reads on
    if mark:
        marker.write_text(sizes)
    if not marker.exists():
        return False
    if marker.read_text() != sizes:
        raise SystemExit(f"{base} holds a {label} store of other sizes: {marker.read_text()}")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (the smoke test)")
    parser.add_argument("--contexts", type=int, default=10_000, help="contexts in the store")
    parser.add_argument("--messages", type=int, default=10, help="messages per context")
    parser.add_argument("--session", type=int, default=10_000, help="messages of cli:long")
    parser.add_argument("--repeat", type=int, default=5, help="timed requests per measure")
    parser.add_argument(
        "--pinned", type=int, default=0, help="contexts pinned (each a lifecycle record)"
    )
    parser.add_argument(
        "--stores", default="fs,sqlite,postgres", help="comma-separated: fs, sqlite, postgres"
    )
    parser.add_argument(
        "--keep", type=Path, help="fill the stores in this folder once and reuse them"
    )
    parser.add_argument("--fill-only", action="store_true", help="fill (with --keep), no timing")
    args = parser.parse_args(argv)
    if args.quick:
        args.contexts, args.messages, args.session, args.repeat = 20, 3, 50, 2
    which = set(args.stores.split(","))
    report = Report()
    total = args.contexts * args.messages + args.session
    print(f"{args.contexts:,} contexts x {args.messages} messages, cli:long {args.session:,}")
    if args.pinned:
        print(f"{args.pinned:,} of them pinned")
    with contextlib.ExitStack() as stack:
        if args.keep:
            base = args.keep.resolve()
            base.mkdir(parents=True, exist_ok=True)
        else:
            base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-web-")))
        for label, store in stores(base, report, which, args.keep is not None):
            if args.keep and filled(base, label, args):
                report.note(f"{label}: kept store, {total:,} messages")
            else:
                start = time.perf_counter()
                fill(store, args.contexts, args.messages, args.session, args.pinned)
                report.note(
                    f"{label}: {total:,} messages written in {time.perf_counter() - start:.0f} s"
                )
                if args.keep:
                    filled(base, label, args, mark=True)
            if not args.fill_only:
                measure(report, label, store, args.repeat)
    if report.rows:
        print("\nResults\n" + report.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
