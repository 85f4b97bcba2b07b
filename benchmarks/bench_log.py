"""Benchmark the session log: append, restore and size on disk, against a naive baseline.

Run: ``.venv/bin/python benchmarks/bench_log.py`` (``--quick`` for a smoke run,
``--sizes 1000,10000,100000`` to choose history sizes, ``--json FILE`` to save the results).

Everything is measured in one process, in a temporary directory under the system temp dir,
at each history size N (entries already in the log before the timed operations):

1. Append one message, ``terrarium.save_user_input`` and ``save_delta`` alternately, each
   writing one ~370-byte line, to an ``FsStore`` with durability ``flush`` (no fsync) and
   ``fsync``. The floor is measured in the same run: one ``os.write`` of a pre-encoded line
   to an ``O_APPEND`` file, and ``os.write`` + ``os.fdatasync``. fsync appends and raw
   write+fdatasync calls are interleaved one for one, so their ratio is like for like, and
   the sizes are timed in turns (rounds), so background load on the machine hits them all.
2. ``terrarium.restore`` of the N-entry context (warm page cache), and at the largest N the
   restore after compacting it into a 10-message segment, next to a fresh 10-message context.
3. Bytes on disk (the session's segment files).
4. The naive design this log replaces (the old Terrarium JSON format): the whole session in
   one dict with a ``messages`` list, ``json.dump(indent=2)`` of all of it after every message
   to a temporary file that is then renamed over the old one (no fsync, as the old code did).
   Its cost per message grows with N, so only a few messages are timed at large N (the count
   is printed). The same design with orjson shows that a faster encoder does not change that.
5. Decoding 10k log lines with msgspec and with orjson: the codec choice.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import gc
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import msgspec  # noqa: E402

import terrarium  # noqa: E402
from terrarium import (  # noqa: E402
    FsStore,
    PodMetadata,
    SegmentStartState,
    codec,
    create_compacted_segment,
    create_segment,
    restore,
    save_delta,
    save_user_input,
)
from terrarium.model import ContextId, utc_now  # noqa: E402
from terrarium.stores.base import NewEntry, iter_lines  # noqa: E402

orjson: ModuleType | None
try:
    import orjson
except ImportError:  # orjson comes with the dev extras; without it its rows are skipped
    orjson = None

# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class Config:
    """How much to measure."""

    sizes: tuple[int, ...] = (1000, 10000, 100000)
    appends: int = 1000
    """Timed appends per size, durability flush."""
    fsync_appends: int = 500
    """Timed appends per size, durability fsync (and as many raw write+fdatasync calls)."""
    warmup: int = 20
    rounds: int = 5
    """Timed appends are split into this many rounds that take the sizes in turn."""
    restore_runs: int = 5
    floor_writes: int = 5000
    naive_budget_s: float = 4.0
    """Time spent on timed naive appends per size and encoder (at least ``naive_min``)."""
    naive_min: int = 3
    naive_max: int = 200
    decode_lines: int = 10000
    decode_runs: int = 7
    compact_messages: int = 10


QUICK = Config(
    sizes=(100, 1000),
    appends=100,
    fsync_appends=10,
    warmup=5,
    rounds=2,
    restore_runs=2,
    floor_writes=200,
    naive_budget_s=0.2,
    naive_max=10,
    decode_lines=1000,
    decode_runs=2,
)

# Targets (see DESIGN.md, Performance budget).
APPEND_FLUSH_MAX_US = 10.0
APPEND_FLAT_MAX_RATIO = 1.5
FSYNC_MAX_RATIO = 1.3
RESTORE_100K_MAX_MS = 150.0
COMPACTED_MAX_RATIO = 1.5
# Issue 15: against the floors measured in the same run.
STORE_APPEND_MAX_RATIO = 3.0
RESTORE_FLOOR_MAX_RATIO = 1.3


@dataclass
class Measurement:
    """One figure: the median (and p99) of ``n`` samples of something at a history size."""

    name: str
    size: int | None
    unit: str
    median: float
    p99: float | None = None
    n: int = 1
    note: str = ""


@dataclass
class Report:
    """Everything one run measured."""

    config: Config
    machine: dict[str, str]
    measurements: list[Measurement] = field(default_factory=list)
    targets: list[dict[str, str]] = field(default_factory=list)

    def add(self, m: Measurement) -> Measurement:
        self.measurements.append(m)
        return m

    def get(self, name: str, size: int | None = None) -> Measurement | None:
        for m in self.measurements:
            if m.name == name and m.size == size:
                return m
        return None


# --------------------------------------------------------------------------- helpers

_WORDS = (
    "the a to of and in that is for it with as on be this you not are but or have from by "
    "function return value error file line list test case type class module import string "
    "python server request response cache session context model token prompt history agent "
    "please could would should we can will it's here there what why how when which because "
    "first then next also again maybe really think know see look try run change fix check"
).split()


def message_text(i: int, length: int = 260) -> str:
    """A deterministic, varied, English-like message of ``length`` characters."""
    rng = random.Random(i)
    words: list[str] = []
    total = 0
    while total < length:
        word = rng.choice(_WORDS)
        words.append(word)
        total += len(word) + 1
    text = " ".join(words)[:length].rstrip()
    return text[0].upper() + text[1:] + "."


TEXTS = [message_text(i) for i in range(101)]


def message(i: int) -> dict[str, str]:
    """The ``i``-th history message: users and the assistant take turns."""
    return {"role": "user" if i % 2 == 0 else "assistant", "content": TEXTS[i % len(TEXTS)]}


def summarize(samples: Sequence[float]) -> tuple[float, float]:
    """Median and p99 (nearest rank) of ``samples``."""
    ordered = sorted(samples)
    p99 = ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]
    return statistics.median(ordered), p99


def time_calls(fn: Callable[[int], object], count: int) -> list[float]:
    """Call ``fn(0..count-1)`` and return each call's wall time in µs."""
    clock = time.perf_counter_ns
    samples = []
    for i in range(count):
        start = clock()
        fn(i)
        samples.append((clock() - start) / 1000)
    return samples


def encode_entries(count: int) -> bytes:
    """``count`` message entries encoded exactly as FsStore writes them (seq 1..count)."""
    ts = utc_now()
    drafts = [NewEntry(kind_of(message(i)), ts, {"item": message(i)}) for i in range(count)]
    return b"".join(codec.encode_line(line) for line in iter_lines(drafts, 1))


def kind_of(item: dict[str, str]) -> str:
    return "user_input" if item["role"] == "user" else "item"


def label(size: int) -> str:
    """1000 -> 1k, 100000 -> 100k."""
    return f"{size // 1000}k" if size >= 1000 and size % 1000 == 0 else str(size)


# --------------------------------------------------------------------------- FsStore


def prefill(store: FsStore, context: str, count: int) -> PodMetadata:
    """Create ``context`` with ``count`` message entries (appended 1,000 per write)."""
    start = SegmentStartState(
        system_prompt="You are a helpful AI assistant.",
        config={"model": "bench", "temperature": 0.7},
    )
    create_segment(store, start, context=context)
    head = store.get_head(ContextId.parse(context))
    assert head is not None
    for first in range(0, count, 1000):
        ts = utc_now()
        batch = [
            NewEntry(kind_of(message(i)), ts, {"item": message(i)})
            for i in range(first, min(count, first + 1000))
        ]
        store.append(head.session_id, head.segment_id, batch)
    return head


def segment_bytes(store: FsStore, context: str) -> int:
    """Bytes in the context's segment files (traces and side files excluded)."""
    folder = store.folder_of(ContextId.parse(context))
    assert folder is not None
    return sum(
        p.stat().st_size for p in folder.glob("*.jsonl") if not p.name.endswith(".trace.jsonl")
    )


def append_message(store: FsStore, head: PodMetadata, i: int) -> None:
    """One message the way the runtime logs it: user input, or the assistant's step delta."""
    item = message(i)
    if item["role"] == "user":
        save_user_input(store, head, item["content"])
    else:
        save_delta(store, head, [item])


def bench_fsync_round(
    store: FsStore, head: PodMetadata, raw_fd: int, line: bytes, count: int, offset: int
) -> tuple[list[float], list[float]]:
    """fsync appends and raw write+fdatasync calls, interleaved: (store µs, raw µs)."""
    clock = time.perf_counter_ns
    ours: list[float] = []
    floor: list[float] = []
    for i in range(offset, offset + count):
        # Alternate which goes first, so neither always follows the other's journal commit.
        for store_turn in (i % 2 == 0, i % 2 == 1):
            start = clock()
            if store_turn:
                append_message(store, head, i)
            else:
                os.write(raw_fd, line)
                os.fdatasync(raw_fd)
            (ours if store_turn else floor).append((clock() - start) / 1000)
    return ours, floor


def bench_restore(store: FsStore, context: str, runs: int) -> list[float]:
    """Wall time (ms) of ``terrarium.restore``, ``runs`` times (one untimed run first)."""
    restore(store, context)
    samples = []
    for _ in range(runs):
        gc.collect()
        start = time.perf_counter_ns()
        restore(store, context)
        samples.append((time.perf_counter_ns() - start) / 1e6)
    return samples


def bench_floor(folder: Path, line: bytes, count: int) -> list[float]:
    """One ``os.write`` of a pre-encoded line to an ``O_APPEND`` file, in µs."""
    fd = os.open(folder / "floor.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for _ in range(100):
            os.write(fd, line)
        return time_calls(lambda _: os.write(fd, line), count)
    finally:
        os.close(fd)


def bench_locked_floor(folder: Path, line: bytes, count: int) -> list[float]:
    """The system calls an FsStore append cannot do without, in µs: an exclusive ``flock``
    (writers in other processes), an ``fstat`` (another writer's lines, a file archived or
    deleted meanwhile), the ``os.write``, the unlock."""
    fd = os.open(folder / "locked.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def append(_: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.fstat(fd)
        os.write(fd, line)
        fcntl.flock(fd, fcntl.LOCK_UN)

    try:
        for i in range(100):
            append(i)
        return time_calls(append, count)
    finally:
        os.close(fd)


def bench_restore_floor(store: FsStore, context: str, runs: int) -> list[float]:
    """Reading the context's segment file and ``msgspec`` ``decode_lines`` of it, the cyclic
    GC paused (as the codec does), in ms: the floor of a restore."""
    folder = store.folder_of(ContextId.parse(context))
    assert folder is not None
    [path] = folder.glob("*.jsonl")
    decoder = msgspec.json.Decoder()
    samples = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        with codec.paused_gc():
            decoder.decode_lines(path.read_bytes())
        samples.append((time.perf_counter_ns() - start) / 1e6)
    return samples


@dataclass
class Subject:
    """One pre-filled context in its own FsStore."""

    size: int
    root: Path
    context: str
    head: PodMetadata
    store: FsStore


def setup_fs(report: Report, folder: Path, size: int) -> Subject:
    """Pre-fill a context of ``size`` entries; measure its bytes and restore time."""
    context = f"bench:n{size}"
    store = FsStore(folder / "sessions", durability="flush")
    head = prefill(store, context, size)
    report.add(Measurement("bytes", size, "B", segment_bytes(store, context)))
    ours: list[float] = []
    floor: list[float] = []
    for _ in range(report.config.restore_runs):  # one for one, so load falls on both alike
        ours += bench_restore(store, context, 1)
        floor += bench_restore_floor(store, context, 1)
    report.add(Measurement("restore", size, "ms", *summarize(ours), n=len(ours)))
    report.add(Measurement("restore_floor", size, "ms", *summarize(floor), n=len(floor)))
    return Subject(size, folder / "sessions", context, head, store)


def rounds(total: int, count: int) -> list[int]:
    """Split ``total`` timed calls into ``count`` near-equal rounds."""
    count = max(1, min(count, total))
    return [total // count + (1 if r < total % count else 0) for r in range(count)]


def run_appends(report: Report, subjects: list[Subject], line: bytes) -> None:
    """Time appends at every size, in rounds that take the sizes in turn.

    Interleaving the sizes spreads any background load on the machine over all of them, so
    the flatness ratio compares like with like.
    """
    cfg = report.config
    flush: dict[int, list[float]] = {s.size: [] for s in subjects}
    for s in subjects:
        for i in range(cfg.warmup):
            append_message(s.store, s.head, i)
    direct: dict[int, list[float]] = {s.size: [] for s in subjects}
    drafts = [NewEntry(kind_of(message(i)), utc_now(), {"item": message(i)}) for i in (0, 1)]
    for r, count in enumerate(rounds(cfg.appends, cfg.rounds)):
        order = subjects if r % 2 == 0 else subjects[::-1]
        for s in order:
            gc.collect()
            flush[s.size] += time_calls(partial(append_message, s.store, s.head), count)
            append = partial(s.store.append, s.head.session_id, s.head.segment_id)
            direct[s.size] += time_calls(lambda i, f=append: f(drafts[i % 2 : i % 2 + 1]), count)
    for s in subjects:
        samples = flush[s.size]
        report.add(Measurement("append_flush", s.size, "µs", *summarize(samples), len(samples)))
        samples = direct[s.size]
        report.add(Measurement("store_append", s.size, "µs", *summarize(samples), len(samples)))
        s.store.close()
        s.store = FsStore(s.root, durability="fsync")

    os.sync()  # start fsync timing with no dirty pages left from the pre-fill
    ours: dict[int, list[float]] = {s.size: [] for s in subjects}
    floor: dict[int, list[float]] = {s.size: [] for s in subjects}
    folder = subjects[0].root.parent.parent
    raw_fd = os.open(folder / "raw-fsync.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for s in subjects:
            bench_fsync_round(s.store, s.head, raw_fd, line, max(2, cfg.warmup // 4), 0)
        offset = 0
        for r, count in enumerate(rounds(cfg.fsync_appends, cfg.rounds)):
            order = subjects if r % 2 == 0 else subjects[::-1]
            for s in order:
                a, b = bench_fsync_round(s.store, s.head, raw_fd, line, count, offset)
                ours[s.size] += a
                floor[s.size] += b
            offset += count
    finally:
        os.close(raw_fd)
    for s in subjects:
        a, b = ours[s.size], floor[s.size]
        report.add(Measurement("append_fsync", s.size, "µs", *summarize(a), n=len(a)))
        report.add(Measurement("raw_fdatasync", s.size, "µs", *summarize(b), n=len(b)))


def run_compaction(report: Report, root: Path, context: str, size: int) -> None:
    """Compact ``context`` into a short summary and time its restore, next to a fresh one."""
    cfg = report.config
    summary = [message(i) for i in range(cfg.compact_messages)]
    store = FsStore(root)
    try:
        state = restore(store, context)
        create_compacted_segment(store, state, summary, context=context)
        del state
        after = bench_restore(store, context, max(cfg.restore_runs, 5))
        fresh_context = "bench:fresh"
        prefill(store, fresh_context, cfg.compact_messages)
        fresh = bench_restore(store, fresh_context, max(cfg.restore_runs, 5))
    finally:
        store.close()
    note = f"{label(size)} entries compacted into {cfg.compact_messages} messages"
    report.add(Measurement("restore_compacted", size, "ms", *summarize(after), len(after), note))
    report.add(Measurement("restore_fresh_small", cfg.compact_messages, "ms", *summarize(fresh)))


# --------------------------------------------------------------------------- naive baseline


class NaiveSession:
    """The old Terrarium design: one JSON file per session, rewritten after every message.

    Saving writes the whole session with ``json.dump(indent=2)`` (the format of
    ``seeds/004``) to a temporary file in the same folder and renames it over the old file,
    so a crash never leaves a half-written session. No fsync, as in the old code.
    """

    def __init__(self, path: Path, encoder: str = "json") -> None:
        self.path = path
        self.encoder = encoder
        now = _iso_now()
        self.data: dict[str, Any] = {
            "session_id": "main",
            "context_type": "cli",
            "system_prompt": "You are a helpful AI assistant.",
            "messages": [],
            "metadata": {
                "created_at": now,
                "last_active": now,
                "message_count": 0,
                "session_id": "main",
                "context_type": "cli",
                "session_date": now[:10],
            },
        }

    def add_message(self, role: str, content: str) -> None:
        """Add a message and save the whole session, as the old manager did on every message."""
        now = _iso_now()
        self.data["messages"].append({"role": role, "content": content, "timestamp": now})
        meta = self.data["metadata"]
        meta["last_active"] = now
        meta["message_count"] = len(self.data["messages"])
        self.save()

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        if self.encoder == "orjson" and orjson is not None:
            tmp.write_bytes(orjson.dumps(self.data, option=orjson.OPT_INDENT_2))
        else:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(self.data, f, indent=2, ensure_ascii=False)
        os.replace(tmp, self.path)

    def load(self) -> dict[str, Any]:
        if self.encoder == "orjson" and orjson is not None:
            data: dict[str, Any] = orjson.loads(self.path.read_bytes())
            return data
        with open(self.path, encoding="utf-8") as f:
            data = json.load(f)
            return data


def _iso_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


def run_naive(report: Report, folder: Path, size: int, encoder: str) -> None:
    """The naive design at one history size: cost per message, load time, bytes."""
    cfg = report.config
    session = NaiveSession(folder / f"naive-{encoder}-{size}.json", encoder)
    now = _iso_now()
    session.data["messages"] = [{**message(i), "timestamp": now} for i in range(size)]
    session.data["metadata"]["message_count"] = size
    session.save()
    size_on_disk = session.path.stat().st_size
    gc.collect()

    def add(i: int) -> None:
        item = message(size + i)
        session.add_message(item["role"], item["content"])

    samples = time_calls(add, 1)
    count = int(cfg.naive_budget_s * 1e6 / samples[0])
    count = max(cfg.naive_min, min(cfg.naive_max, count)) - 1
    samples += time_calls(lambda i: add(i + 1), count)
    note = f"n={len(samples)} messages timed" if len(samples) < cfg.naive_max else ""
    name = f"naive_{encoder}"
    report.add(Measurement(f"{name}_append", size, "µs", *summarize(samples), len(samples), note))
    report.add(Measurement(f"{name}_bytes", size, "B", size_on_disk))
    loads = []
    for _ in range(max(1, min(cfg.restore_runs, 3 if size >= 100000 else cfg.restore_runs))):
        gc.collect()
        start = time.perf_counter_ns()
        session.load()
        loads.append((time.perf_counter_ns() - start) / 1e6)
    report.add(Measurement(f"{name}_load", size, "ms", *summarize(loads), n=len(loads)))
    session.path.unlink()


# --------------------------------------------------------------------------- decoding


def run_decode(report: Report) -> None:
    """Decode the same JSONL lines with msgspec and orjson, several ways."""
    cfg = report.config
    buf = encode_entries(cfg.decode_lines)
    lines = buf.splitlines()
    joined = b"[" + buf[:-1].replace(b"\n", b",") + b"]"
    decoder = msgspec.json.Decoder()
    ways: list[tuple[str, Callable[[], object]]] = [
        ("decode_codec", lambda: codec.decode_lines(buf, where="bench")),
        ("decode_msgspec_lines", lambda: [decoder.decode(line) for line in lines]),
        ("decode_msgspec_decode_lines", lambda: decoder.decode_lines(buf)),
        ("decode_msgspec_array", lambda: decoder.decode(joined)),
    ]
    if orjson is not None:
        loads = orjson.loads
        ways += [
            ("decode_orjson_lines", lambda: [loads(line) for line in lines]),
            ("decode_orjson_array", lambda: loads(joined)),
        ]
    for name, fn in ways:
        fn()
        samples = []
        for _ in range(cfg.decode_runs):
            gc.collect()
            start = time.perf_counter_ns()
            fn()
            samples.append((time.perf_counter_ns() - start) / 1e6)
        report.add(Measurement(name, cfg.decode_lines, "ms", *summarize(samples), len(samples)))


# --------------------------------------------------------------------------- report


def machine() -> dict[str, str]:
    """What the numbers were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        for text in Path("/proc/cpuinfo").read_text().splitlines():
            if text.startswith("model name"):
                cpu = text.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    tmp = os.path.realpath(tempfile.gettempdir())
    fs = "?"
    try:
        best = ""
        for text in Path("/proc/mounts").read_text().splitlines():
            parts = text.split()
            mount = parts[1]
            if (tmp + "/").startswith(mount.rstrip("/") + "/") and len(mount) >= len(best):
                best, fs = mount, f"{parts[2]} on {parts[0]}"
    except (OSError, IndexError):
        pass
    return {
        "cpus": str(os.cpu_count()),
        "cpu": cpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "terrarium": terrarium.__version__,
        "msgspec": msgspec.__version__,
        "orjson": orjson.__version__ if orjson is not None else "not installed",
        "tmp": f"{tmp} ({fs})",
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def fmt(value: float | None, unit: str = "") -> str:
    """A figure with sensible precision."""
    if value is None:
        return "-"
    if unit == "x":
        return f"{value:,.0f}x" if value >= 100 else f"{value:.2f}x"
    if unit == "B":
        for scale, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if value >= scale:
                return f"{value / scale:.1f} {name}"
        return f"{value:.0f} B"
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def ratio(a: Measurement | None, b: Measurement | None) -> float | None:
    if a is None or b is None or not b.median:
        return None
    return a.median / b.median


def evaluate(report: Report) -> None:
    """Fill ``report.targets`` with PASS / FAIL / SKIP verdicts."""
    sizes = report.config.sizes
    targets = report.targets

    def add(name: str, ok: bool | None, detail: str) -> None:
        verdict = "SKIP" if ok is None else "PASS" if ok else "FAIL"
        targets.append({"target": name, "verdict": verdict, "measured": detail})

    flush = [m for s in sizes if (m := report.get("append_flush", s)) is not None]
    worst = max(flush, key=lambda m: m.median)
    add(
        f"append without fsync: median ≤ {APPEND_FLUSH_MAX_US:g} µs at every size",
        worst.median <= APPEND_FLUSH_MAX_US,
        f"worst {worst.median:.2f} µs at {label(worst.size or 0)}",
    )
    spread = max(m.median for m in flush) / min(m.median for m in flush)
    add(
        f"append without fsync flat in N: max/min of medians ≤ {APPEND_FLAT_MAX_RATIO:g}x",
        spread <= APPEND_FLAT_MAX_RATIO,
        f"{spread:.2f}x over {', '.join(label(s) for s in sizes)}",
    )
    ratios = [
        (s, r)
        for s in sizes
        if (r := ratio(report.get("append_fsync", s), report.get("raw_fdatasync", s)))
    ]
    s, r = max(ratios, key=lambda x: x[1])
    add(
        f"append with fsync within {FSYNC_MAX_RATIO:g}x of raw write+fdatasync",
        r <= FSYNC_MAX_RATIO,
        f"worst {r:.2f}x at {label(s)}",
    )
    worst_direct = max(
        (
            (r, s)
            for s in sizes
            if (r := ratio(report.get("store_append", s), report.get("raw_write")))
        ),
        default=None,
    )
    if worst_direct is not None:
        locked = ratio(report.get("locked_write"), report.get("raw_write"))
        add(
            f"Store.append ≤ {STORE_APPEND_MAX_RATIO:g}x a raw os.write (issue 15)",
            worst_direct[0] <= STORE_APPEND_MAX_RATIO,
            f"worst {worst_direct[0]:.2f}x at {label(worst_direct[1])}; the locked floor "
            f"alone is {locked or 0:.2f}x",
        )
    big_ratio = ratio(report.get("restore", 100000), report.get("restore_floor", 100000))
    add(
        f"restore of 100k entries ≤ {RESTORE_FLOOR_MAX_RATIO:g}x read + decode_lines (issue 15)",
        None if big_ratio is None else big_ratio <= RESTORE_FLOOR_MAX_RATIO,
        "not measured (100k not in --sizes)" if big_ratio is None else f"{big_ratio:.2f}x",
    )
    big = report.get("restore", 100000)
    add(
        f"restore of 100k entries < {RESTORE_100K_MAX_MS:g} ms",
        None if big is None else big.median < RESTORE_100K_MAX_MS,
        "not measured (100k not in --sizes)" if big is None else f"{big.median:.1f} ms",
    )
    compacted = report.get("restore_compacted", sizes[-1])
    fresh = report.get("restore_fresh_small", report.config.compact_messages)
    r2 = ratio(compacted, fresh)
    add(
        f"restore after compaction ≤ {COMPACTED_MAX_RATIO:g}x a fresh "
        f"{report.config.compact_messages}-message context",
        None if r2 is None else r2 <= COMPACTED_MAX_RATIO,
        "-"
        if r2 is None or compacted is None or fresh is None
        else f"{compacted.median * 1000:.0f} µs vs {fresh.median * 1000:.0f} µs = {r2:.2f}x",
    )


def render(report: Report) -> str:
    """The results as a plain-text table."""
    sizes = report.config.sizes
    out: list[str] = []
    width = 50

    def row(text: str, values: Sequence[str], note: str = "") -> None:
        cells = "".join(f"{v:>13}" for v in values)
        out.append(f"{text:<{width}}{cells}{('  ' + note) if note else ''}".rstrip())

    def series(name: str, attr: str = "median", unit: str = "") -> list[str]:
        values = []
        for s in sizes:
            m = report.get(name, s)
            values.append(fmt(None if m is None else getattr(m, attr), unit))
        return values

    def ratios(a: str, b: str) -> list[str]:
        return [fmt(ratio(report.get(a, s), report.get(b, s)), "x") for s in sizes]

    mach = report.machine
    line = report.get("line_bytes")
    floor = report.get("raw_write")
    out.append(
        "terrarium log benchmark: FsStore vs the floor and the naive rewrite-everything JSON"
    )
    out.append(f"machine: {mach['cpus']} cores, {mach['cpu']}, {mach['platform']}")
    out.append(f"load average at start (1, 5, 15 min): {mach['load']}")
    out.append(
        f"python {mach['python']}, msgspec {mach['msgspec']}, orjson {mach['orjson']}; "
        f"files in {mach['tmp']}"
    )
    if line is not None:
        out.append(f"entry: one user or assistant message, mean line {line.median:.0f} bytes")
    out.append("")
    row("history size N (entries)", [label(s) for s in sizes])
    out.append("")
    out.append("Append one message (save_user_input / save_delta)")
    row("  FsStore flush: median µs", series("append_flush"))
    row("  FsStore flush: p99 µs", series("append_flush", "p99"))
    locked = report.get("locked_write")
    if floor is not None:
        row(
            f"    ÷ raw os.write ({floor.median:.2f} µs)",
            [fmt(ratio(report.get("append_flush", s), floor), "x") for s in sizes],
        )
        row("  Store.append of a built entry: median µs", series("store_append"))
        row(
            "    ÷ raw os.write",
            [fmt(ratio(report.get("store_append", s), floor), "x") for s in sizes],
        )
        if locked is not None:
            out.append(
                f"  floor of a locked append (flock, fstat, write, unlock): {locked.median:.2f}"
                f" µs = {locked.median / floor.median:.2f}x a raw os.write"
            )
    row("  FsStore fsync: median µs", series("append_fsync"))
    row("  FsStore fsync: p99 µs", series("append_fsync", "p99"))
    row("  raw write+fdatasync: median µs", series("raw_fdatasync"))
    row("    fsync append ÷ raw write+fdatasync", ratios("append_fsync", "raw_fdatasync"))
    for encoder, title in (("json", "json.dump(indent=2)"), ("orjson", "orjson(INDENT_2)")):
        name = f"naive_{encoder}_append"
        if all(report.get(name, s) is None for s in sizes):
            continue
        counts = [report.get(name, s) for s in sizes]
        timed = ", ".join(
            f"{label(s)}: {m.n}" for s, m in zip(sizes, counts, strict=True) if m is not None
        )
        row(f"  naive {title}+rename: median µs", series(name), f"(messages timed: {timed})")
        row("    naive ÷ FsStore flush", ratios(name, "append_flush"))
    out.append("")
    out.append("Restore (warm page cache)")
    row("  terrarium.restore: median ms", series("restore"))
    row("  floor (read + msgspec decode_lines): ms", series("restore_floor"))
    row("    restore ÷ floor", ratios("restore", "restore_floor"))
    per_entry = []
    for s in sizes:
        m = report.get("restore", s)
        per_entry.append(fmt(None if m is None else m.median * 1000 / s))
    row("    µs per entry", per_entry)
    for encoder, title in (("json", "json.load"), ("orjson", "orjson.loads")):
        name = f"naive_{encoder}_load"
        if all(report.get(name, s) is None for s in sizes):
            continue
        row(f"  naive {title}: median ms", series(name))
        row("    restore ÷ naive load", ratios("restore", name))
    compacted = report.get("restore_compacted", sizes[-1])
    fresh = report.get("restore_fresh_small", report.config.compact_messages)
    if compacted is not None and fresh is not None:
        out.append(
            f"  after compaction ({compacted.note}): {compacted.median * 1000:.0f} µs; "
            f"fresh {report.config.compact_messages}-message context: "
            f"{fresh.median * 1000:.0f} µs ({compacted.median / fresh.median:.2f}x)"
        )
    out.append("")
    out.append("Bytes on disk")
    row("  FsStore segment files", series("bytes", unit="B"))
    row("  naive JSON file (indent=2)", series("naive_json_bytes", unit="B"))
    row("    FsStore ÷ naive", ratios("bytes", "naive_json_bytes"))
    decode = [m for m in report.measurements if m.name.startswith("decode_")]
    if decode:
        base = report.get("decode_codec", report.config.decode_lines)
        out.append("")
        out.append(f"Decode {label(report.config.decode_lines)} log lines (median ms)")
        titles = {
            "decode_codec": "msgspec, as restore does (codec.decode_lines)",
            "decode_msgspec_lines": "msgspec, line by line",
            "decode_msgspec_decode_lines": "msgspec Decoder.decode_lines",
            "decode_msgspec_array": "msgspec, lines joined into one array",
            "decode_orjson_lines": "orjson, line by line",
            "decode_orjson_array": "orjson, lines joined into one array",
        }
        for m in decode:
            rel = fmt(ratio(m, base), "x")
            row(f"  {titles.get(m.name, m.name)}", [fmt(m.median), rel])
    out.append("")
    out.append("Targets")
    for t in report.targets:
        out.append(f"  [{t['verdict']}] {t['target']}: {t['measured']}")
    return "\n".join(out)


# --------------------------------------------------------------------------- main


def parse_sizes(text: str) -> tuple[int, ...]:
    """``1000,10k,100k`` -> (1000, 10000, 100000)."""
    sizes = []
    for part in text.split(","):
        part = part.strip().lower()
        sizes.append(int(part[:-1]) * 1000 if part.endswith("k") else int(part))
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("sizes must be positive integers")
    return tuple(sorted(set(sizes)))


def run(cfg: Config, *, progress: Callable[[str], None] | None = None) -> Report:
    """Take every measurement of ``cfg`` and return the report."""
    say = progress or (lambda _: None)
    report = Report(cfg, machine())
    line = encode_entries(2)
    first = line[: line.index(b"\n") + 1]
    report.add(Measurement("line_bytes", None, "B", len(encode_entries(1000)) / 1000))
    with tempfile.TemporaryDirectory(prefix="terrarium-bench-") as tmp:
        folder = Path(tmp)
        say("raw os.write floor")
        floor = bench_floor(folder, first, cfg.floor_writes)
        report.add(Measurement("raw_write", None, "µs", *summarize(floor), n=len(floor)))
        locked = bench_locked_floor(folder, first, cfg.floor_writes)
        report.add(Measurement("locked_write", None, "µs", *summarize(locked), n=len(locked)))
        subjects: list[Subject] = []
        try:
            for size in cfg.sizes:
                say(f"FsStore: pre-fill {label(size)}, bytes, restore")
                subjects.append(setup_fs(report, folder / f"fs-{size}", size))
            say("FsStore: appends (flush, then fsync), sizes in turn")
            run_appends(report, subjects, first)
        finally:
            for s in subjects:
                s.store.close()
        say("FsStore: restore after compaction")
        biggest = subjects[-1]
        run_compaction(report, biggest.root, biggest.context, biggest.size)
        for size in cfg.sizes:
            for encoder in ("json", "orjson") if orjson is not None else ("json",):
                say(f"naive {encoder} at {label(size)}")
                run_naive(report, folder, size, encoder)
        say("decoding")
        run_decode(report)
    evaluate(report)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes and counts: a smoke run")
    parser.add_argument("--sizes", type=parse_sizes, help="history sizes, e.g. 1000,10000,100000")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also save the results here")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a target fails")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else Config()
    if args.sizes:
        cfg = Config(**{**asdict(cfg), "sizes": args.sizes})
    started = time.perf_counter()
    report = run(cfg, progress=lambda text: print(f"... {text}", file=sys.stderr, flush=True))
    print(render(report))
    print(f"\n(total run time {time.perf_counter() - started:.0f} s)")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "config": asdict(report.config),
                    "machine": report.machine,
                    "measurements": [asdict(m) for m in report.measurements],
                    "targets": report.targets,
                },
                indent=2,
                ensure_ascii=False,
            )
            + "\n"
        )
    failed = any(t["verdict"] == "FAIL" for t in report.targets)
    return 1 if failed and args.strict else 0


if __name__ == "__main__":
    raise SystemExit(main())
