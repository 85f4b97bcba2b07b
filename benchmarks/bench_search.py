"""Benchmark FsStore's search index: search latency over 1M messages, listing 100k contexts.

Run: ``.venv/bin/python benchmarks/bench_search.py`` (``--quick`` for a smoke run; ``--dir``
to keep the generated store).

How the data is built:

* **Text.** A vocabulary of 50,000 pseudo-words (random syllable strings) whose frequencies
  follow Zipf's law (``p(rank r) ~ 1 / r^1.07``, as English does), so there are a few words in
  most messages, a long tail of rare ones and a band of mid-frequency words between. User
  messages have 4 to 25 words, assistant replies 8 to 60, with sentence capitals and
  punctuation.
* **Store.** 100,000 contexts of 10 messages each (1,000,000 messages) over four types and a
  year of dates, written directly as files in the ``FsStore`` layout (segment JSONL, head.json,
  the ``.index`` pointers) -- what ``FsStore`` itself writes, minus its per-append locking, so
  building takes seconds instead of minutes. The build is timed.
* **Index.** Built from those files by ``SearchIndex.rebuild()`` (:mod:`terrarium.index`;
  what ``terrarium reindex`` does), timed. Then a few contexts are restored through
  ``FsStore`` and compared with the index's listing, to check the generated files are what
  ``FsStore`` reads.

What is measured (each search: top 20, with snippets, through the index's ``search``, which first
checks for changes; and "placed", through ``terrarium.search.search``, which also reads each
hit's context to place it in its conversation): mid-frequency words (found in 0.05% to 0.5%
of messages), the ten most common words (found in 8% to 85% of messages), two-word queries (a
mid-frequency and a common word); ``list_contexts_fast()`` over all contexts. For scale,
baselines measured in the same run: a naive search that reads every segment file and looks
for the word's bytes, and ``FsStore.list_contexts()``, which reads every head.json. Also the
costs that the index's change detection pays or avoids: an idle refresh, a refresh after one
append, and a full walk that stats every session folder (the design the dirty markers
replace).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import random
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from terrarium import FsStore, codec, restore  # noqa: E402
from terrarium.index import of  # noqa: E402
from terrarium.index._query import SearchQuery  # noqa: E402
from terrarium.model import ContextId  # noqa: E402
from terrarium.search import search  # noqa: E402
from terrarium.sessions import save_user_input  # noqa: E402
from terrarium.stores.fs._changes import mark_dirty  # noqa: E402

TYPES = [("cli", 0.2), ("irc", 0.4), ("web", 0.3), ("game", 0.1)]
SYLLABLES = (
    "ka to ri ne mo sa lu pe di vo an el or us ti ba qu ze fi go ha ji ku ly mi no po ra se tu "
    "be ca da fe ga hi jo ke la me ni ol pa re si te ul va wi xo ya zu"
).split()


def vocabulary(size: int, rng: random.Random) -> list[str]:
    """``size`` distinct pseudo-words, shortest (and so most common) first."""
    words: set[str] = set()
    while len(words) < size:
        n = rng.choice((1, 2, 2, 3, 3, 3, 4))
        words.add("".join(rng.choice(SYLLABLES) for _ in range(n)))
    ordered = sorted(words, key=lambda w: (len(w), w))
    head, tail = ordered[:200], ordered[200:]
    rng.shuffle(tail)
    return head + tail


class TextMaker:
    """Sentences of Zipf-distributed words."""

    def __init__(self, size: int, rng: random.Random) -> None:
        self.words = vocabulary(size, rng)
        self.cum = list(itertools.accumulate(1.0 / (r + 1) ** 1.07 for r in range(size)))
        self.rng = rng

    def message(self, low: int, high: int) -> str:
        words = self.rng.choices(self.words, cum_weights=self.cum, k=self.rng.randint(low, high))
        out, start = [], True
        for word in words:
            out.append(word.capitalize() if start else word)
            start = False
            roll = self.rng.random()
            if roll < 0.08:
                out[-1] += "."
                start = True
            elif roll < 0.13:
                out[-1] += ","
        return " ".join(out).rstrip(",") + ("?" if self.rng.random() < 0.2 else ".")


def build_store(root: Path, sessions: int, per_session: int, maker: TextMaker) -> None:
    """Write ``sessions`` contexts of ``per_session`` messages in the FsStore layout."""
    rng = maker.rng
    kinds = [t for t, _ in TYPES]
    weights = list(itertools.accumulate(w for _, w in TYPES))
    start = time.mktime((2025, 1, 1, 0, 0, 0, 0, 0, 0))
    encode_line, encode = codec.encode_line, codec.encode
    made_dirs: set[Path] = set()
    for i in range(sessions):
        kind = kinds[bisect.bisect(weights, rng.random() * weights[-1])]
        name = {"irc": f"#chan{i}", "cli": f"main{i}", "web": f"user-{i}", "game": f"run {i}"}[kind]
        context = ContextId(kind, name)
        created = start + (i / sessions) * 365 * 86400
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
        session_id, segment_id = uuid.uuid4(), uuid.uuid4()
        rel = f"{kind}/{stamp[:10]}/{context.encoded_name}"
        folder = root / rel
        if folder.parent not in made_dirs:
            folder.parent.mkdir(parents=True, exist_ok=True)
            made_dirs.add(folder.parent)
        folder.mkdir()
        lines = [
            encode_line(
                {
                    "v": 1,
                    "seq": 0,
                    "ts": f"{stamp}.000000Z",
                    "kind": "header",
                    "session_id": str(session_id),
                    "segment_id": str(segment_id),
                    "context": str(context),
                    "origin": {"kind": "root"},
                    "system_prompt": None,
                    "config": {},
                    "history": [],
                }
            )
        ]
        last = stamp
        for seq in range(1, per_session + 1):
            user = seq % 2 == 1
            text = maker.message(4, 25) if user else maker.message(8, 60)
            last = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created + seq * 30))
            lines.append(
                encode_line(
                    {
                        "v": 1,
                        "seq": seq,
                        "ts": f"{last}.000000Z",
                        "kind": "user_input" if user else "item",
                        "item": {"role": "user" if user else "assistant", "content": text},
                    }
                )
            )
        (folder / f"{segment_id}.jsonl").write_bytes(b"".join(lines))
        head = {
            "v": 1,
            "context": str(context),
            "session_id": str(session_id),
            "segment_id": str(segment_id),
            "created_at": f"{stamp}.000000Z",
            "updated_at": f"{stamp}.000000Z",
        }
        (folder / "head.json").write_bytes(encode(head))
        pointer = encode({"path": rel, "context": str(context)})
        for path in (
            root / ".index" / "contexts" / kind / context.encoded_name,
            root / ".index" / "sessions" / str(session_id),
        ):
            if path.parent not in made_dirs:
                path.parent.mkdir(parents=True, exist_ok=True)
                made_dirs.add(path.parent)
            path.write_bytes(pointer)


def build_and_index(
    root: Path, sessions: int, per_session: int, maker: TextMaker, info: list[str]
) -> None:
    """Write the store's files, index them, and check a few contexts against a restore."""
    t0 = time.perf_counter()
    build_store(root, sessions, per_session, maker)
    build_s = time.perf_counter() - t0
    messages = sessions * per_session
    info.append(f"built {sessions:,} contexts / {messages:,} messages as files in {build_s:.1f} s")
    with FsStore(root) as store:
        index = of(store)
        assert index is not None
        t0 = time.perf_counter()
        indexed = index.rebuild()
        index_s = time.perf_counter() - t0
        size = sum(os.path.getsize(p) for p in index.path.parent.glob("search.db*") if p.is_file())
        info.append(
            f"indexed {indexed:,} sessions / {index.stats.items:,} messages in "
            f"{index_s:.1f} s ({index.stats.items / index_s:,.0f} messages/s); "
            f"search.db {size / 1e6:.0f} MB"
        )
        assert indexed == sessions
        summaries = {s.context: s for s in index.list_contexts_fast()}
        for context in random.Random(5).sample(sorted(summaries), 5):
            state = restore(store, context)
            assert summaries[context].message_count == len(state.history) == per_session
            assert summaries[context].last_active == state.last_active


def timed_queries(store: FsStore, words: list[str]) -> list[float]:
    """Each query's time through ``terrarium.search.search``: the index's hits, each placed in
    its context's conversation (its head's lineage read), each message once."""
    samples = []
    for text in words:
        t0 = time.perf_counter()
        hits = search(store, SearchQuery(text, limit=20))
        samples.append(time.perf_counter() - t0)
        assert all(hit.message is not None for hit in hits)
    return samples


def timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    """Seconds per call, for ``repeat`` calls."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def doc_freqs(db: Path) -> list[tuple[str, int]]:
    """Every indexed word with the number of messages containing it, most common first."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        conn.execute("CREATE VIRTUAL TABLE temp.vocab USING fts5vocab(main, fts, row)")
        rows = conn.execute("SELECT term, doc FROM temp.vocab").fetchall()
    finally:
        conn.close()
    tags = {"ruser", "rassistant", "rsystem", "rtool", "rother"}
    words = [(t, d) for t, d in rows if t not in tags and not (t[0] in "st" and t[1:].isdigit())]
    return sorted(words, key=lambda pair: -pair[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--dir", type=Path, help="build the store here and keep it")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="with --dir: measure the store built there by an earlier run of the same size",
    )
    args = parser.parse_args()
    if args.reuse and args.dir is None:
        parser.error("--reuse needs --dir")
    sessions, per_session, vocab, queries, lists = (
        (500, 10, 2_000, 20, 3) if args.quick else (100_000, 10, 50_000, 200, 15)
    )
    messages = sessions * per_session
    rng = random.Random(20261122)
    base = args.dir or Path(tempfile.mkdtemp(prefix="bench-search-"))
    root = base / "sessions"
    built = base / "built.json"
    shape = {"sessions": sessions, "per_session": per_session, "vocab": vocab}
    reuse = args.reuse and built.exists() and json.loads(built.read_text()) == shape
    if root.exists() and not reuse:
        shutil.rmtree(root)
        built.unlink(missing_ok=True)
    rows: list[tuple[str, str, str, str]] = []
    info: list[str] = []
    try:
        maker = TextMaker(vocab, rng)
        if reuse:
            info.append(f"reused the store built in {base} by an earlier run")
        else:
            build_and_index(root, sessions, per_session, maker, info)
            built.write_text(json.dumps(shape))
        rng = random.Random(20261127)  # the queries: the same whether built now or reused
        with FsStore(root) as store:
            index = of(store)
            assert index is not None
            summaries = {s.context: s for s in index.list_contexts_fast()}
            assert len(summaries) == sessions

            freqs = doc_freqs(index.path)
            total = messages
            mid = [w for w, d in freqs if 0.0005 * total <= d <= 0.005 * total]
            common = [w for w, _ in freqs[:10]]
            info.append(
                f"{len(mid):,} mid-frequency words (in {int(0.0005 * total):,} to "
                f"{int(0.005 * total):,} messages); common words in "
                f"{freqs[9][1] / total:.0%} to {freqs[0][1] / total:.0%} of messages"
            )
            classes = {
                "mid-frequency word": [rng.choice(mid) for _ in range(queries)],
                "very common word": [common[i % len(common)] for i in range(queries)],
                "mid + common words": [
                    f"{rng.choice(mid)} {common[i % len(common)]}" for i in range(queries)
                ],
            }
            for words in classes.values():  # warm the page cache and the connection
                for text in words[:5]:
                    index.search(SearchQuery(text))
            all_samples: list[float] = []
            for label, words in classes.items():
                samples = []
                found = 0
                for text in words:
                    t0 = time.perf_counter()
                    hits = index.search(SearchQuery(text, limit=20))
                    samples.append(time.perf_counter() - t0)
                    found += len(hits)
                    assert all(h.highlights for h in hits)
                all_samples += samples
                p50, p95 = pct(samples, 0.5), pct(samples, 0.95)
                rows.append((f"search p50, {label}", ms(p50), "< 10 ms", _ok(p50 < 0.010)))
                rows.append((f"search p95, {label}", ms(p95), "< 80 ms", _ok(p95 < 0.080)))
                info.append(f"{label}: {found / len(words):.1f} hits per query on average")
                placed = timed_queries(store, words)
                p50, p95 = pct(placed, 0.5), pct(placed, 0.95)
                rows.append((f"placed search p50, {label}", ms(p50), "< 10 ms", _ok(p50 < 0.010)))
                rows.append((f"placed search p95, {label}", ms(p95), "< 80 ms", _ok(p95 < 0.080)))
            naive_word = classes["mid-frequency word"][0]
            naive = timed(lambda: naive_search(root, naive_word), 1)[0]
            info.append(
                f"baseline: naive search (read every segment file, bytes.find) {ms(naive)} = "
                f"{naive / statistics.median(all_samples):,.0f}x the index's median"
            )

            listing = timed(index.list_contexts_fast, lists)
            p50 = pct(listing, 0.5)
            rows.append((f"list {sessions:,} contexts p50", ms(p50), "< 300 ms", _ok(p50 < 0.300)))
            rows.append(
                (
                    f"list {sessions:,} contexts max",
                    ms(max(listing)),
                    "< 300 ms",
                    _ok(max(listing) < 0.300),
                )
            )
            slow = timed(store.list_contexts, 1)[0]
            info.append(
                f"baseline: FsStore.list_contexts() (reads every head.json, no message "
                f"counts) {ms(slow)} = {slow / p50:,.0f}x list_contexts_fast"
            )

            idle = timed(index.refresh, 200)
            info.append(
                f"idle refresh (nothing changed, nothing watched): p50 {ms(pct(idle, 0.5))}"
            )
            head = store.get_head(ContextId.parse(next(iter(summaries))))
            assert head is not None

            def append_then_refresh() -> None:
                save_user_input(store, head, maker.message(4, 25))
                mark_dirty(store.root, head.session_id)
                index.refresh()

            after = timed(append_then_refresh, 50)
            info.append(
                f"append + refresh (one marked session, new bytes only): p50 {ms(pct(after, 0.5))}"
            )
            walk = timed(lambda: sum(1 for _ in index.source.walk()), 1)[0]
            info.append(
                f"stat walk (scandir + stat of every session folder, the alternative to dirty "
                f"markers, per refresh): {ms(walk)} = {walk / pct(idle, 0.5):,.0f}x an idle refresh"
            )
            full = timed(lambda: index.refresh(full=True), 1)[0]
            info.append(f"refresh(full=True) with nothing changed (walk + compare): {ms(full)}")
            marker = timed(lambda: mark_dirty(store.root, head.session_id), 1000)
            info.append(
                f"mark_dirty when the marker exists (an append pays it at most every 5 s): "
                f"p50 {pct(marker, 0.5) * 1e6:.1f} µs"
            )
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)

    width = max(len(r[0]) for r in rows)
    print(
        f"\nSearch benchmark ({'quick' if args.quick else 'full'}): {messages:,} messages, "
        f"{sessions:,} contexts"
    )
    for line in info:
        print(f"  {line}")
    print()
    print(f"| {'measure'.ljust(width)} | {'value':>10} | {'target':>8} | result |")
    print(f"|{'-' * (width + 2)}|{'-' * 12}|{'-' * 10}|--------|")
    for name, value, target, result in rows:
        print(f"| {name.ljust(width)} | {value:>10} | {target:>8} | {result:<6} |")
    return 0


def naive_search(root: Path, word: str) -> int:
    """What searching costs without an index: read every segment file and look for the word."""
    needle = word.encode()
    found = 0
    for kind in os.scandir(root):
        if kind.name.startswith(".") or not kind.is_dir():
            continue
        for date in os.scandir(kind.path):
            for folder in os.scandir(date.path):
                for entry in os.scandir(folder.path):
                    if entry.name.endswith(".jsonl"):
                        with open(entry.path, "rb") as f:
                            if f.read().find(needle) >= 0:
                                found += 1
    return found


def _ok(passed: bool) -> str:
    return "PASS" if passed else "FAIL"


if __name__ == "__main__":
    raise SystemExit(main())
