#!/usr/bin/env python3
"""Search for a word that one long message holds many times: the snippet's cost.

FTS5's ``snippet()`` scores each candidate window against every match in a row, so its time
grows with the square of the matches; terrarium cuts the snippet of a body longer than
``fts.LONG_BODY`` in Python instead (:func:`terrarium.index._fts.long_snippet`). This times
one search on the filesystem and SQLite stores (both through the derived index), with and
without that rule (the limit set past the body, as before the rule).

    .venv/bin/python benchmarks/bench_long_snippet.py             # 35,000 matches in ~210 KB
    .venv/bin/python benchmarks/bench_long_snippet.py --quick      # 2,000 matches
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from terrarium import ContextId, FsStore, SqliteStore, create_segment, save_user_input
from terrarium.index import _fts as fts
from terrarium.index import _index as fs_search
from terrarium.index import listing
from terrarium.index._query import SearchQuery
from terrarium.stores.base import Store


def _store(kind: str, folder: Path, words: int) -> Store:
    store: Store = FsStore(folder / "fs") if kind == "fs" else SqliteStore(folder / "s.db")
    create_segment(store, context="cli:big")
    head = store.get_head(ContextId("cli", "big"))
    assert head is not None
    save_user_input(store, head, "intro words " + "alert " * words + "the end")
    return store


def _time(store: Store, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        [hit] = listing(store).search(SearchQuery("alert"))  # type: ignore[union-attr]
        times.append(time.perf_counter() - start)
        assert hit.highlights
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 matches, one run")
    parser.add_argument("--words", type=int, default=35_000, help="matches in the message")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    words, runs = (2_000, 1) if args.quick else (args.words, args.runs)
    print(f"one message of {words:,} matches ({len('alert ') * words:,} characters)")
    for kind in ("fs", "sqlite"):
        with tempfile.TemporaryDirectory() as tmp:
            store = _store(kind, Path(tmp), words)
            listing(store).search(SearchQuery("alert"))  # type: ignore[union-attr]  # build the index
            now = _time(store, runs)
            fs_search.LONG_BODY = 10**9  # type: ignore[attr-defined]  # FTS5's snippet() for all
            try:
                before = _time(store, runs)
            finally:
                fs_search.LONG_BODY = fts.LONG_BODY  # type: ignore[attr-defined]
            store.close()
        python_ms, fts_ms = now * 1000, before * 1000
        print(f"{kind:7s} snippet cut in Python {python_ms:8.1f} ms   by FTS5 {fts_ms:9.1f} ms")


if __name__ == "__main__":
    main()
