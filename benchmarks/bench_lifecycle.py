"""Benchmark the lifecycle: archive size, hot listing after archiving, resuming, large outputs.

Run: ``.venv/bin/python benchmarks/bench_lifecycle.py`` (``--quick`` for a smoke run of a few
seconds; ``--backend sqlite`` or ``--backend postgres`` for another store, opened by
:func:`terrarium.stores.url.open_store`, when it implements ``Lifecycle``). Everything goes
through the public API (``Store``, ``Lifecycle``, ``terrarium.restore``), in a temporary
directory removed afterwards (PostgreSQL: a throwaway database, dropped).

What is measured (the issue's targets):

* **Archive size**: ``--archive`` contexts (10,000) of 40 to 200 messages each, logged as
  turns are, are archived one by one. The messages are runs of 8 to 60 words of English
  prose and markdown, taken at random from this project's documentation (``--text docs``,
  the default), or Zipf
  sentences of pseudo-words (``TextMaker`` from ``bench_search.py``, ``--text zipf``: a
  vocabulary of random syllables, far less compressible than language). The ratio of the bytes they
  take in the archive to those they took hot (``ArchivedContext.archived_bytes / hot_bytes``;
  on fs also the whole ``archive/`` folder, manifests included, against the hot folders as
  they were, in apparent bytes). Target <= 0.3.
* **Hot listing**: ``--contexts`` contexts (100,000) of two messages (on fs written straight
  in the store's layout by ``bench_search.build_store``, elsewhere through the store API);
  ``list_contexts_fast()``
  (what ``terrarium list`` shows) and ``list_contexts()``, median of 5, before and after 90 %
  of them are archived (the first listing after the archive, which brings the derived index
  up to date, is reported apart). Target <= 0.2x.
* **Resume**: a context of ``--messages`` messages (10,000). Hot: ``restore`` then one
  ``save_user_input``, as a turn does. Archived: the same on the archived context, whose
  append unarchives it first (median of 3; it is archived again, untimed, between runs).
  Target <= 3x.
* **Blobs**: a context of ``--outputs`` tool outputs (100) of ``--mib`` MiB (1) each, distinct,
  written with blobs (the default 64 KiB threshold) and with every output inline
  (``blob_threshold=0``): ``restore(blobs="lazy")`` of the first against ``restore`` of the
  second (median of 5), and the bytes of their logs (``bench_blobs.py`` has the same measure
  on every backend at once). Targets: >= 10x faster, >= 50x smaller.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_search import TextMaker, build_store  # noqa: E402
from terrarium import (  # noqa: E402
    ContextId,
    PodActiveSegmentRef,
    create_segment,
    restore,
    save_user_input,
    states,
)
from terrarium.index import listing as lister  # noqa: E402
from terrarium.index._listing import Listing  # noqa: E402
from terrarium.model import utc_now  # noqa: E402
from terrarium.stores.base import Lifecycle, NewEntry, Store  # noqa: E402
from terrarium.stores.url import open_store  # noqa: E402

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
ENV_VAR = "TERRARIUM_TEST_POSTGRES_DSN"


class Report:
    """Rows of the results table."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []

    def row(self, name: str, value: str, target: str = "", passed: bool | None = None) -> None:
        mark = "" if passed is None else ("ok" if passed else "MISSED")
        self.rows.append((name, value, target, mark))
        print(f"  {name}: {value} {target} {mark}".rstrip(), flush=True)

    def table(self) -> str:
        width = max(len(r[0]) for r in self.rows)
        lines = [f"{'measure'.ljust(width)}  value          target   "]
        for name, value, target, mark in self.rows:
            lines.append(f"{name.ljust(width)}  {value.ljust(13)}  {target.ljust(8)} {mark}")
        return "\n".join(lines)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def median_of(runs: int, call: Callable[[], object]) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


# --------------------------------------------------------------------------- stores


@contextmanager
def opened(backend: str, workdir: Path) -> Iterator[Store]:
    """A fresh store of ``backend``, closed (and its database dropped) afterwards."""
    if backend == "fs":
        store = open_store(str(workdir / "sessions"))
    elif backend == "sqlite":
        store = open_store(f"sqlite:///{workdir / 'store.db'}")
    else:
        with _pg_database() as url:
            store = open_store(url)
            try:
                yield store
            finally:
                store.close()
            return
    try:
        yield store
    finally:
        store.close()


@contextmanager
def _pg_database() -> Iterator[str]:
    import psycopg

    dsn = os.environ.get(ENV_VAR, DEFAULT_DSN)
    name = f"terrarium_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield dsn.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def lifecycle(store: Store) -> Lifecycle:
    if not isinstance(store, Lifecycle):
        raise SystemExit(f"{type(store).__name__} does not implement Lifecycle yet")
    return store


def fill(store: Store, name: str, messages: list[str]) -> PodActiveSegmentRef:
    """A context holding ``messages`` (user and assistant in turn), logged as turns are (the
    user's input, the reply, the run's completion, the turn's end), in appends of 500."""
    session_id, segment_id = create_segment(store, context=name)
    ref = PodActiveSegmentRef(session_id, segment_id)
    entries: list[NewEntry] = []
    for n, text in enumerate(messages):
        if n % 2 == 0:
            entries.append(NewEntry("user_input", utc_now(), {"item": user(text)}))
        else:
            reply = {"role": "assistant", "content": text}
            entries.append(NewEntry("item", utc_now(), {"item": reply}))
            entries.append(NewEntry("run_completed", utc_now(), {"finish_reason": "stop"}))
            entries.append(NewEntry("turn_end", utc_now(), {}))
    for start in range(0, len(entries), 500):
        store.append(session_id, segment_id, entries[start : start + 500])
    return ref


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def apparent_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# --------------------------------------------------------------------------- measures


class DocsText:
    """Runs of words of this project's documentation (English prose, markdown, code)."""

    def __init__(self, rng: random.Random) -> None:
        paths = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
        self.words = " ".join(p.read_text() for p in paths).split()
        self.rng = rng

    def message(self, low: int, high: int) -> str:
        size = self.rng.randint(low, high)
        start = self.rng.randrange(len(self.words) - size)
        return " ".join(self.words[start : start + size])


def archive_size(
    backend: str, workdir: Path, count: int, maker: TextMaker | DocsText, out: Report
) -> None:
    with opened(backend, workdir) as store:
        life = lifecycle(store)
        rng = random.Random(1)
        names = [f"cli:old-{n}" for n in range(count)]
        for name in names:
            fill(store, name, [maker.message(8, 60) for _ in range(rng.randint(40, 200))])
        hot_tree = apparent_bytes(workdir / "sessions" / "cli") if backend == "fs" else 0
        start = time.perf_counter()
        done = [states.archive_context(life, ContextId.parse(name)) for name in names]
        took = time.perf_counter() - start
        hot = sum(a.hot_bytes for a in done if a is not None)
        packed = sum(a.archived_bytes for a in done if a is not None)
        out.row(f"archive {count:,} contexts, each", ms(took / count))
        ratio = packed / hot
        out.row("archived / hot bytes", f"{ratio:.3f}x", "<= 0.3x", ratio <= 0.3)
        if backend == "fs":
            whole = apparent_bytes(workdir / "sessions" / "cli") / hot_tree  # frozen in place
            out.row("fs frozen folders / hot folders", f"{whole:.3f}x", "<= 0.3x", whole <= 0.3)


def hot_listing(backend: str, workdir: Path, count: int, maker: TextMaker, out: Report) -> None:
    if backend == "fs":
        build_store(workdir / "sessions", count, 2, maker)
    with opened(backend, workdir) as store:
        life = lifecycle(store)
        if backend != "fs":
            for n in range(count):
                fill(store, f"irc:#chan-{n}", ["hello there", "hi, how can I help?"])
        names = [head.context for head in store.list_contexts()]
        assert len(names) == count
        fast = lister(store).list_contexts_fast if isinstance(lister(store), Listing) else None
        if fast is not None:
            fast()  # brings the derived index up to date
        before_fast = median_of(5, fast) if fast is not None else 0.0
        before_heads = median_of(5, store.list_contexts)
        start = time.perf_counter()
        for n, name in enumerate(names):
            if n % 10:
                states.archive_context(life, ContextId.parse(name))
        each = (time.perf_counter() - start) / (count - (count + 9) // 10)
        out.row(f"archive 90% of {count:,} contexts, each", ms(each))
        if fast is not None:
            start = time.perf_counter()
            assert len(fast()) == (count + 9) // 10
            out.row("first list_contexts_fast after it", ms(time.perf_counter() - start))
            after_fast = median_of(5, fast)
            ratio = after_fast / before_fast
            out.row("list_contexts_fast before", ms(before_fast))
            out.row("list_contexts_fast after", ms(after_fast))
            out.row("list_contexts_fast after / before", f"{ratio:.3f}x", "<= 0.2x", ratio <= 0.2)
        after_heads = median_of(5, store.list_contexts)
        ratio = after_heads / before_heads
        out.row("list_contexts before", ms(before_heads))
        out.row("list_contexts after", ms(after_heads))
        out.row("list_contexts after / before", f"{ratio:.3f}x", "<= 0.2x", ratio <= 0.2)


def resume(backend: str, workdir: Path, messages: int, maker: TextMaker, out: Report) -> None:
    with opened(backend, workdir) as store:
        life = lifecycle(store)
        ref = fill(store, "cli:long", [maker.message(8, 40) for _ in range(messages)])
        context = ContextId.parse("cli:long")

        def turn() -> Any:
            state = restore(store, context)
            save_user_input(store, ref, "one more thing")
            return state

        hot = median_of(3, turn)
        samples = []
        for _ in range(3):
            states.archive_context(life, context)
            start = time.perf_counter()
            turn()
            samples.append(time.perf_counter() - start)
            assert not states.is_archived(life, context)
        cold = statistics.median(samples)
        out.row(f"hot restore + append, {messages:,} messages", ms(hot))
        out.row("archived: unarchive + restore + append", ms(cold))
        out.row("resume archived / hot", f"{cold / hot:.2f}x", "<= 3x", cold / hot <= 3)


def blobs(backend: str, workdir: Path, outputs: int, size: int, out: Report) -> None:
    """A context of ``outputs`` distinct tool outputs of ``size`` bytes, written with blobs
    (the default 64 KiB threshold) and with every output inline (``blob_threshold=0``):
    ``restore(blobs="lazy")`` of the first against ``restore`` of the second, and their logs'
    bytes (the measure of ``bench_blobs.py``, on this run's backend)."""
    from bench_blobs import _fill, _log_bytes, _store

    database = _pg_database() if backend == "postgres" else contextlib.nullcontext(None)
    with database as dsn:
        with_blobs = _store(backend, workdir / "blobs", 64 * 1024, dsn)
        inline = _store(backend, workdir / "inline", 0, dsn)
        try:
            _fill(with_blobs, outputs, size)
            _fill(inline, outputs, size)
            lazy = median_of(5, lambda: restore(with_blobs, "cli:tools", blobs="lazy"))
            whole = median_of(5, lambda: restore(inline, "cli:tools"))
            smaller = _log_bytes(inline) / _log_bytes(with_blobs)
        finally:
            with_blobs.close()
            inline.close()
    what = f"{outputs} tool outputs of {size / 2**20:g} MiB"
    out.row(f"restore, {what}, lazy blobs", ms(lazy))
    out.row(f"restore, {what}, inline", ms(whole))
    out.row("restore inline / lazy blobs", f"{whole / lazy:.1f}x", ">= 10x", whole / lazy >= 10)
    out.row("log inline / log with blobs", f"{smaller:.0f}x", ">= 50x", smaller >= 50)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--backend", choices=("fs", "sqlite", "postgres"), default="fs")
    parser.add_argument("--archive", type=int, default=10_000, help="contexts archived")
    parser.add_argument("--contexts", type=int, default=100_000, help="contexts listed")
    parser.add_argument("--messages", type=int, default=10_000, help="messages resumed")
    parser.add_argument("--outputs", type=int, default=100, help="large tool outputs")
    parser.add_argument("--mib", type=float, default=1.0, help="size of each output")
    parser.add_argument(
        "--only",
        default="archive,list,resume,blobs",
        help="the measures to run (comma-separated)",
    )
    parser.add_argument("--text", choices=("docs", "zipf"), default="docs", help="archived text")
    args = parser.parse_args()
    if args.quick:
        args.archive, args.contexts, args.messages = 30, 300, 500
        args.outputs, args.mib = 10, 0.25
    maker = TextMaker(20_000, random.Random(7))
    text = DocsText(random.Random(7)) if args.text == "docs" else maker
    out = Report()
    workdir = Path(tempfile.mkdtemp(prefix="bench-lifecycle-"))
    print(f"backend {args.backend}, in {workdir}", flush=True)
    try:
        steps = {
            "archive": lambda d: archive_size(args.backend, d, args.archive, text, out),
            "list": lambda d: hot_listing(args.backend, d, args.contexts, maker, out),
            "resume": lambda d: resume(args.backend, d, args.messages, maker, out),
            "blobs": lambda d: blobs(args.backend, d, args.outputs, int(args.mib * 2**20), out),
        }
        for name in args.only.split(","):
            folder = workdir / name
            folder.mkdir()
            steps[name](folder)
            shutil.rmtree(folder)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("\nResults\n" + out.table())


if __name__ == "__main__":
    main()
