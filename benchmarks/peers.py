"""Terrarium side by side with the floors and the peers: append, restore and bytes on disk.

Run: ``make bench-peers`` (installs the ``bench`` extra into ``.venv``, then runs this), or
``.venv/bin/python benchmarks/peers.py`` (``--quick`` for a smoke run of a few seconds,
``--depths 1000,10000`` to choose history depths, ``--out DIR`` for where the report goes:
``docs/`` by default, ``benchmarks.md`` and two PNG plots).

Every system runs in this one process, each in its own folder of a temporary directory
(removed afterwards), at each history depth N (messages already in the conversation):

* **Floors**: one ``os.write`` of the pre-encoded log line to an ``O_APPEND`` file (append),
  reading that file and ``msgspec.json.Decoder.decode_lines`` of it, the cyclic GC paused
  as terrarium's codec does (restore), its size (bytes); a bare autocommit ``INSERT`` of the
  same line into a WAL SQLite table shaped like ``SqliteStore``'s entries (same
  ``synchronous``; keyed by an integer segment key, as the store's are), restored
  by one ``SELECT`` and the same decoding.
* **Terrarium**: ``FsStore``, ``SqliteStore`` and ``PostgresStore`` (when a server answers at
  ``TERRARIUM_TEST_POSTGRES_DSN`` or the default DSN: a throwaway database, dropped after),
  appended to through the runtime's own calls (``save_user_input`` and ``save_delta`` in
  turn), restored with ``terrarium.restore``.
* **Peers**, each through its public API as its documentation shows it, when installed
  (``pip install -e '.[bench]'``; a missing one is reported as skipped): openai-agents'
  ``SQLiteSession`` (``add_items``/``get_items``, on one event loop), LangChain's
  ``SQLChatMessageHistory`` on SQLite and ``FileChatMessageHistory`` (``add_message``/
  ``messages``), LangGraph's ``SqliteSaver`` under a ``MessagesState`` graph
  (``update_state``/``get_state``), llm's log store (``LogStore.append``/``thread_messages``
  on a sqlite-utils database).
* **The seed's design**: ``bench_log.NaiveSession``, the whole session rewritten as one JSON
  file after every message.

Messages are realistic ~300-byte chat turns, user and assistant in turn. At each depth every
system is pre-filled (in batches; not timed; a ``SqliteStore`` then settled: its upkeep
thread's share of the pre-fill finished, see ``bench_stores.settle``), then its appends are
timed one call at a time, each turn taking every system once in a new random order, so load
from other processes and what the call before left behind fall on all of them alike. A
system whose call is slow gets fewer samples, spread over the turns (said in the report),
and is skipped at a depth where its calls would take minutes (extrapolated from the depth
before). Restores are interleaved
the same way. Bytes on disk are every file the system wrote (for PostgreSQL its tables and
indexes, search index included), measured after closing it, per message.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import itertools
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import msgspec  # noqa: E402

import terrarium  # noqa: E402
from bench_log import NaiveSession, label, message_text  # noqa: E402
from bench_stores import Report as PgNotes  # noqa: E402
from bench_stores import settle, throwaway_database  # noqa: E402
from terrarium import (  # noqa: E402
    FsStore,
    PodMetadata,
    SegmentStartState,
    codec,
    create_segment,
    restore,
    save_delta,
    save_user_input,
)
from terrarium.index import listing as lister  # noqa: E402
from terrarium.index._query import SearchQuery  # noqa: E402
from terrarium.model import ContextId, utc_now  # noqa: E402
from terrarium.stores.base import NewEntry, Store, iter_lines  # noqa: E402
from terrarium.stores.sqlite import SqliteStore  # noqa: E402

TEXTS = [message_text(i, 300) for i in range(101)]
SYSTEM_PROMPT = "You are a helpful AI assistant."
PREFILL_BATCH = 1000


def role(i: int) -> str:
    return "user" if i % 2 == 0 else "assistant"


def text(i: int) -> str:
    return TEXTS[i % len(TEXTS)]


def entry_line(i: int, seq: int) -> bytes:
    """Message ``i`` as the log line FsStore writes for it (the floors write the same)."""
    kind = "user_input" if i % 2 == 0 else "item"
    draft = NewEntry(kind, utc_now(), {"item": {"role": role(i), "content": text(i)}})
    return codec.encode_line(next(iter_lines([draft], seq)))


def folder_bytes(folder: Path) -> int:
    """Bytes in every file under ``folder``."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# --------------------------------------------------------------------------- systems


class Skip(Exception):
    """A system that cannot run here (its package is not installed, no server answers)."""


class System:
    """One way to keep a conversation: pre-filled, appended to, restored, measured on disk.

    ``open`` fills a new conversation of ``depth`` messages in ``folder``; ``append(i)`` adds
    message ``i``; ``restore`` reads the whole conversation back and returns how many
    messages it holds; ``close`` lets go of every handle; ``disk_bytes`` is measured after it.
    """

    name = ""
    group = "peer"
    version = ""
    note = ""
    """What a reader of the figures should know about this system, if anything."""

    def open(self, folder: Path, depth: int) -> None:
        raise NotImplementedError

    def append(self, i: int) -> None:
        raise NotImplementedError

    def restore(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        """Nothing to let go of by default."""

    def disk_bytes(self) -> int:
        return folder_bytes(self.folder)

    def search_bytes(self) -> int | None:
        """The part of :meth:`disk_bytes` that is a search index, for a system that keeps
        one (measured after ``close`` too); None for the others."""
        return None

    def free_bytes(self) -> int:
        """The part of :meth:`disk_bytes` that is free space inside the system's files
        (SQLite's free pages, reused by later writes): neither log nor search index."""
        return 0

    folder: Path


class WriteFloor(System):
    """``os.write`` of the line to an ``O_APPEND`` file; restore reads and decodes it."""

    name = "floor: os.write / read + decode_lines"
    group = "floor"

    def __init__(self) -> None:
        self.lines = [entry_line(i, 1) for i in range(len(TEXTS))]
        self.decoder = msgspec.json.Decoder()

    def open(self, folder: Path, depth: int) -> None:
        self.folder = folder
        self.path = folder / "log.jsonl"
        self.path.write_bytes(b"".join(entry_line(i, i + 1) for i in range(depth)))
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)

    def append(self, i: int) -> None:
        os.write(self.fd, self.lines[i % len(self.lines)])

    def restore(self) -> int:
        with open(self.path, "rb") as f, codec.paused_gc():
            return len(self.decoder.decode_lines(f.read()))

    def close(self) -> None:
        os.close(self.fd)


class InsertFloor(System):
    """A bare autocommit ``INSERT`` of the line, as ``SqliteStore`` stores it; one ``SELECT``
    and ``decode_lines`` to restore.

    The table has the shape of ``SqliteStore``'s entries (an
    arrival id, the segment's integer key, ``UNIQUE (seg, seq)``), so the floor stays
    like-for-like: the same row and index bytes, without the store's compare-and-append
    check and the lookup of the segment's key.
    """

    name = "floor: SQLite INSERT / SELECT + decode"
    group = "floor"

    def __init__(self, synchronous: str) -> None:
        self.synchronous = synchronous
        self.decoder = msgspec.json.Decoder()

    def open(self, folder: Path, depth: int) -> None:
        self.folder = folder
        self.conn = sqlite3.connect(folder / "bare.db", isolation_level=None)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        self.conn.execute(
            "CREATE TABLE entries (id INTEGER PRIMARY KEY, seg INTEGER NOT NULL, "
            "seq INTEGER NOT NULL, kind TEXT NOT NULL, ts TEXT NOT NULL, line TEXT NOT NULL, "
            "UNIQUE (seg, seq))"
        )
        self.seg = 1
        self.seq = itertools.count(1)
        with self.conn:
            self.conn.execute("BEGIN")
            for i in range(depth):
                self.append(i)

    def append(self, i: int) -> None:
        seq = next(self.seq)
        line = entry_line(i, seq)[:-1].decode()
        self.conn.execute(
            "INSERT INTO entries (seg, seq, kind, ts, line) VALUES (?, ?, ?, ?, ?)",
            (self.seg, seq, "item", "2026-11-25T00:00:00.000000Z", line),
        )

    def restore(self) -> int:
        rows = self.conn.execute(
            "SELECT line FROM entries WHERE seg = ? ORDER BY seq", (self.seg,)
        ).fetchall()
        with codec.paused_gc():
            return len(self.decoder.decode_lines("\n".join(r[0] for r in rows)))

    def close(self) -> None:
        self.conn.close()


class TerrariumSystem(System):
    """A terrarium store, written and read through the runtime's calls."""

    group = "terrarium"

    def __init__(self, name: str, make: Callable[[Path, int], Store]) -> None:
        self.name = name
        self.make = make
        self.version = terrarium.__version__

    def open(self, folder: Path, depth: int) -> None:
        self.folder = folder
        self.depth = depth
        self.store = self.make(folder, depth)
        self.context = "bench:peers"
        start = SegmentStartState(system_prompt=SYSTEM_PROMPT, config={"model": "bench"})
        create_segment(self.store, start, context=self.context)
        head = self.store.get_head(ContextId.parse(self.context))
        assert head is not None
        self.head: PodMetadata = head
        for first in range(0, depth, PREFILL_BATCH):
            ts = utc_now()
            batch = [
                NewEntry(
                    "user_input" if i % 2 == 0 else "item",
                    ts,
                    {"item": {"role": role(i), "content": text(i)}},
                )
                for i in range(first, min(depth, first + PREFILL_BATCH))
            ]
            self.store.append(head.session_id, head.segment_id, batch)
        settle(self.store)

    def append(self, i: int) -> None:
        if i % 2 == 0:
            save_user_input(self.store, self.head, text(i))
        else:
            save_delta(self.store, self.head, [{"role": "assistant", "content": text(i)}])

    def restore(self) -> int:
        return len(restore(self.store, self.context).history)

    def close(self) -> None:
        # A search first brings the derived state (search index, counts) up to date, so that
        # its bytes are counted whole, as a store that has served a search holds them.
        lister(self.store).search(SearchQuery("message"))
        self.store.close()

    def search_bytes(self) -> int | None:
        if isinstance(self.store, FsStore):
            return folder_bytes(self.folder / "sessions" / ".index")
        with closing(sqlite3.connect(self.folder / "t.db")) as conn:
            row = conn.execute(
                "SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name LIKE 'search%'"
            ).fetchone()
        return int(row[0])

    def free_bytes(self) -> int:
        if isinstance(self.store, FsStore):
            return 0
        with closing(sqlite3.connect(self.folder / "t.db")) as conn:
            (pages,) = conn.execute("PRAGMA freelist_count").fetchone()
            (size,) = conn.execute("PRAGMA page_size").fetchone()
        return int(pages) * int(size)


class PostgresSystem(TerrariumSystem):
    """PostgresStore in a schema of its own per depth; bytes are its relations' sizes and its
    derived index file's (which each reading machine keeps, here in the depth's folder)."""

    def __init__(self, dsn: str) -> None:
        from terrarium.stores.postgres import PostgresStore

        def make(folder: Path, depth: int) -> Store:
            os.environ["TERRARIUM_INDEX_DIR"] = str(folder / "pg-index")
            return PostgresStore(dsn, schema=f"peers_{depth}", pool_size=2)

        super().__init__("terrarium PostgresStore", make)
        self.dsn = dsn

    def disk_bytes(self) -> int:
        return self._relations_bytes("") + self._index_bytes()

    def search_bytes(self) -> int | None:
        return self._index_bytes()

    def _index_bytes(self) -> int:
        folder = self.folder / "pg-index"
        return folder_bytes(folder) if folder.exists() else 0

    def _relations_bytes(self, prefix: str) -> int:
        """Tables (with their indexes and TOAST) of the schema whose names start so."""
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind IN ('r', 'm') AND c.relname LIKE %s",
                (f"peers_{self.depth}", f"{prefix}%"),
            ).fetchone()
        return int(row[0]) if row else 0


def _require(module: str, extra: str = "bench") -> Any:
    """Import ``module`` or raise Skip naming the extra that installs it."""
    import importlib

    try:
        with warnings.catch_warnings():
            # langchain-community warns on import that it is being sunset.
            warnings.simplefilter("ignore")
            return importlib.import_module(module)
    except ImportError as exc:
        raise Skip(f"not installed ({exc.name or module}; pip install -e '.[{extra}]')") from exc


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{dist} {version(dist)}"
    except PackageNotFoundError:
        return dist


class AgentsSession(System):
    """openai-agents' ``SQLiteSession``: ``add_items`` and ``get_items`` on one event loop."""

    name = "openai-agents SQLiteSession"

    def __init__(self) -> None:
        self.cls = _require("agents.memory").SQLiteSession
        self.version = _version("openai-agents")

    def item(self, i: int) -> dict[str, str]:
        return {"role": role(i), "content": text(i)}

    def open(self, folder: Path, depth: int) -> None:
        self.folder = folder
        self.loop = asyncio.new_event_loop()
        self.session = self.cls("bench", str(folder / "agents.db"))
        for first in range(0, depth, PREFILL_BATCH):
            items = [self.item(i) for i in range(first, min(depth, first + PREFILL_BATCH))]
            self.loop.run_until_complete(self.session.add_items(items))

    def append(self, i: int) -> None:
        self.loop.run_until_complete(self.session.add_items([self.item(i)]))

    def restore(self) -> int:
        return len(self.loop.run_until_complete(self.session.get_items()))

    def close(self) -> None:
        self.session.close()
        self.loop.close()


class LangChainHistory(System):
    """A LangChain chat history: ``add_message`` and ``messages``."""

    def __init__(self, kind: str) -> None:
        module = _require("langchain_community.chat_message_histories")
        core = _require("langchain_core.messages")
        self.human, self.ai = core.HumanMessage, core.AIMessage
        self.to_dict = core.messages_to_dict
        self.kind = kind
        if kind == "FileChatMessageHistory":
            self.note = "rewrites the whole JSON file on every message, as the seed does"
        self.cls = getattr(module, kind)
        self.name = f"LangChain {kind}"
        self.version = _version("langchain-community")

    def message(self, i: int) -> Any:
        return (self.human if i % 2 == 0 else self.ai)(content=text(i))

    def open(self, folder: Path, depth: int) -> None:
        self.folder = folder
        if self.kind == "SQLChatMessageHistory":
            self.history = self.cls("bench", connection=f"sqlite:///{folder / 'chat.db'}")
        else:
            self.history = self.cls(str(folder / "chat.json"))
        if self.kind == "FileChatMessageHistory":
            # Its add_messages calls add_message per message, and each rewrites the whole
            # file: the file is written once, in the format add_message leaves it in.
            messages = self.to_dict([self.message(i) for i in range(depth)])
            (folder / "chat.json").write_text(json.dumps(messages), encoding="utf-8")
            return
        for first in range(0, depth, PREFILL_BATCH):
            batch = [self.message(i) for i in range(first, min(depth, first + PREFILL_BATCH))]
            self.history.add_messages(batch)

    def append(self, i: int) -> None:
        self.history.add_message(self.message(i))

    def restore(self) -> int:
        return len(self.history.messages)

    def close(self) -> None:
        engine = getattr(self.history, "sync_engine", None)
        if engine is not None:
            engine.dispose()


class LangGraphSaver(System):
    """LangGraph's ``SqliteSaver`` under a ``MessagesState`` graph: ``update_state`` adds a
    message (a checkpoint of the whole list), ``get_state`` restores it.

    The pre-fill is one ``update_state`` of all ``depth`` messages, so the database holds one
    checkpoint where a thread grown a message at a time would hold ``depth``: its bytes on
    disk are a lower bound.
    """

    name = "LangGraph SqliteSaver"
    note = (
        "each append writes a checkpoint of the whole list, so its bytes grow with the "
        "appends timed (at 1k, where most were, they dominate); pre-filled with one "
        "`update_state` of all the messages, one checkpoint where a thread grown a message at "
        "a time would hold one per message: at 10k and 100k its bytes are a lower bound"
    )

    def __init__(self) -> None:
        self.saver_cls = _require("langgraph.checkpoint.sqlite").SqliteSaver
        graph = _require("langgraph.graph")
        core = _require("langchain_core.messages")
        self.human, self.ai = core.HumanMessage, core.AIMessage
        builder = graph.StateGraph(graph.MessagesState)
        builder.add_node("model", lambda state: {})
        builder.add_edge(graph.START, "model")
        self.builder = builder
        self.version = _version("langgraph-checkpoint-sqlite")
        self.config = {"configurable": {"thread_id": "bench"}}

    def message(self, i: int) -> Any:
        return (self.human if i % 2 == 0 else self.ai)(content=text(i), id=str(uuid.uuid4()))

    def open(self, folder: Path, depth: int) -> None:
        self.folder = folder
        self.conn = sqlite3.connect(folder / "checkpoints.db", check_same_thread=False)
        self.app = self.builder.compile(checkpointer=self.saver_cls(self.conn))
        self.app.update_state(self.config, {"messages": [self.message(i) for i in range(depth)]})

    def append(self, i: int) -> None:
        self.app.update_state(self.config, {"messages": [self.message(i)]})

    def restore(self) -> int:
        return len(self.app.get_state(self.config).values["messages"])

    def close(self) -> None:
        self.conn.close()


class LlmLogStore(System):
    """llm's log store (``llm.logs.LogStore`` on a sqlite-utils database): ``append`` of one
    message to a thread, ``thread_messages`` to restore."""

    name = "llm LogStore"

    def __init__(self) -> None:
        self.sqlite_utils = _require("sqlite_utils")
        self.logs = _require("llm.logs")
        self.parts = _require("llm.parts")
        self.version = _version("llm")

    def message(self, i: int) -> Any:
        return (self.parts.user if i % 2 == 0 else self.parts.assistant)(text(i))

    def open(self, folder: Path, depth: int) -> None:
        self.folder = folder
        self.db = self.sqlite_utils.Database(folder / "logs.db")
        self.store = self.logs.LogStore(self.db)
        self.thread = self.store.create_thread(name="bench")
        for first in range(0, depth, PREFILL_BATCH):
            with self.db.atomic():
                batch = range(first, min(depth, first + PREFILL_BATCH))
                self.store.append(self.thread, [self.message(i) for i in batch])

    def append(self, i: int) -> None:
        self.store.append(self.thread, [self.message(i)])

    def restore(self) -> int:
        return len(self.store.thread_messages(self.thread))

    def close(self) -> None:
        self.db.close()


class SeedJson(System):
    """The seed's design (``bench_log.NaiveSession``): the whole session rewritten as one
    JSON file after every message."""

    name = "seed: rewrite the whole JSON"
    group = "seed"

    def open(self, folder: Path, depth: int) -> None:
        self.folder = folder
        self.session = NaiveSession(folder / "session.json")
        now = dt.datetime.now(dt.UTC).isoformat()
        self.session.data["messages"] = [
            {"role": role(i), "content": text(i), "timestamp": now} for i in range(depth)
        ]
        self.session.data["metadata"]["message_count"] = depth
        self.session.save()

    def append(self, i: int) -> None:
        self.session.add_message(role(i), text(i))

    def restore(self) -> int:
        return len(self.session.load()["messages"])


def systems(dsn: str | None, skipped: dict[str, str]) -> list[System]:
    """Every system that can run here; the others go into ``skipped`` with the reason."""
    found: list[System] = [
        WriteFloor(),
        InsertFloor("NORMAL"),
        TerrariumSystem("terrarium FsStore", lambda folder, _: FsStore(folder / "sessions")),
        TerrariumSystem("terrarium SqliteStore", lambda folder, _: SqliteStore(folder / "t.db")),
    ]
    if dsn is not None:
        found.append(PostgresSystem(dsn))
    makers: list[tuple[str, Callable[[], System]]] = [
        ("openai-agents SQLiteSession", AgentsSession),
        ("LangChain SQLChatMessageHistory", lambda: LangChainHistory("SQLChatMessageHistory")),
        ("LangChain FileChatMessageHistory", lambda: LangChainHistory("FileChatMessageHistory")),
        ("LangGraph SqliteSaver", LangGraphSaver),
        ("llm LogStore", LlmLogStore),
    ]
    for name, make in makers:
        try:
            found.append(make())
        except Skip as exc:
            skipped[name] = str(exc)
    found.append(SeedJson())
    return found


# --------------------------------------------------------------------------- measuring


@dataclass(frozen=True)
class Config:
    """How much to measure."""

    depths: tuple[int, ...] = (1000, 10_000, 100_000)
    appends: int = 300
    """Timed appends per system and depth, at most."""
    min_appends: int = 5
    append_budget_s: float = 6.0
    """A slow system gets as many timed appends as fit in this (at least ``min_appends``)."""
    restores: int = 7
    min_restores: int = 3
    restore_budget_s: float = 20.0
    max_call_s: float = 15.0
    """A system whose append would take longer than this at a depth is skipped there."""


QUICK = Config(
    depths=(30, 100),
    appends=5,
    min_appends=1,
    append_budget_s=0.05,
    restores=2,
    min_restores=1,
    restore_budget_s=0.05,
    max_call_s=5.0,
)


@dataclass
class Cell:
    """One system's figures at one depth."""

    append_us: float | None = None
    append_n: int = 0
    restore_ms: float | None = None
    restore_n: int = 0
    append_p99_us: float | None = None
    append_max_us: float | None = None
    bytes_per_message: float | None = None
    total_bytes: int | None = None
    search_bytes: int | None = None
    """The search index's part of ``total_bytes`` (terrarium's stores)."""
    free_bytes: int = 0
    """Free space inside the files, part of ``total_bytes`` (SQLite's free pages)."""
    note: str = ""


@dataclass
class Results:
    """Everything one run measured: ``cells[system][depth]``."""

    config: Config
    names: list[str]
    groups: dict[str, str]
    versions: dict[str, str]
    cells: dict[str, dict[int, Cell]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    system_notes: dict[str, str] = field(default_factory=dict)
    machine: dict[str, str] = field(default_factory=dict)

    def cell(self, name: str, depth: int) -> Cell:
        return self.cells.setdefault(name, {}).setdefault(depth, Cell())


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - start) / 1e9


def spread(counts: dict[str, int]) -> Iterator[list[str]]:
    """Turns of an interleaved run: each turn the systems due a sample, in random order.

    A system with fewer samples than the most takes part every ``most / its count`` turns, so
    its samples spread over the whole run rather than its start.
    """
    turns = max(counts.values(), default=0)
    order = random.Random(15)
    due = {name: [math.floor(k * turns / n) for k in range(n)] for name, n in counts.items()}
    for turn in range(turns):
        names = [name for name, turns_of in due.items() if turn in set(turns_of)]
        order.shuffle(names)
        yield names


def measure_depth(
    results: Results,
    found: list[System],
    depth: int,
    base: Path,
    previous: dict[str, tuple[int, float]],
) -> None:
    """Pre-fill every system at ``depth``, then time appends and restores, interleaved."""
    cfg = results.config
    live: list[System] = []
    for system in found:
        before = previous.get(system.name)
        guess = before[1] * depth / before[0] if before else 0.0
        if guess > cfg.max_call_s:
            results.cell(
                system.name, depth
            ).note = f"skipped: ~{guess:.0f} s per append extrapolated from the depth before"
            continue
        folder = base / f"{depth}" / re.sub(r"[^A-Za-z0-9]+", "-", system.name)
        folder.mkdir(parents=True)
        print(f"  {label(depth)}: filling {system.name}", flush=True)
        system.open(folder, depth)
        live.append(system)
    try:
        time_appends(results, live, depth, previous)
        time_restores(results, live, depth)
    finally:
        for system in live:
            system.close()
    for system in live:
        total = system.disk_bytes()
        cell = results.cell(system.name, depth)
        cell.total_bytes = total
        cell.search_bytes = system.search_bytes()
        cell.free_bytes = system.free_bytes()
        cell.bytes_per_message = total / (depth + 1 + cell.append_n)
    shutil.rmtree(base / f"{depth}", ignore_errors=True)


def time_appends(
    results: Results, live: list[System], depth: int, previous: dict[str, tuple[int, float]]
) -> None:
    cfg = results.config
    counts: dict[str, int] = {}
    by_name = {s.name: s for s in live}
    for system in live:  # one untimed append each; it sets how many samples fit the budget
        first = timed(lambda s=system: s.append(depth))  # type: ignore[misc]
        counts[system.name] = max(
            cfg.min_appends, min(cfg.appends, int(cfg.append_budget_s / first))
        )
    samples: dict[str, list[float]] = {name: [] for name in counts}
    index = itertools.count(depth + 1)
    gc.collect()
    for names in spread(counts):
        for name in names:
            i = next(index)
            samples[name].append(timed(lambda n=name, i=i: by_name[n].append(i)))  # type: ignore[misc]
    for name, values in samples.items():
        cell = results.cell(name, depth)
        cell.append_us = statistics.median(values) * 1e6
        cell.append_p99_us = sorted(values)[math.ceil(0.99 * len(values)) - 1] * 1e6
        cell.append_max_us = max(values) * 1e6
        cell.append_n = len(values) + 1
        # For the next depth, whose append may cost in proportion to the history.
        previous[name] = (depth, statistics.median(values))


def time_restores(results: Results, live: list[System], depth: int) -> None:
    cfg = results.config
    counts: dict[str, int] = {}
    by_name = {s.name: s for s in live}
    for system in live:  # one untimed restore each: warm caches, a sample count
        first = timed(system.restore)
        counts[system.name] = max(
            cfg.min_restores, min(cfg.restores, int(cfg.restore_budget_s / max(first, 1e-9)))
        )
    samples: dict[str, list[float]] = {name: [] for name in counts}
    for names in spread(counts):
        for name in names:
            gc.collect()
            samples[name].append(timed(by_name[name].restore))
    for name, values in samples.items():
        cell = results.cell(name, depth)
        cell.restore_ms = statistics.median(values) * 1e3
        cell.restore_n = len(values)


# --------------------------------------------------------------------------- the report


def machine() -> dict[str, str]:
    """What the figures were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "sqlite": sqlite3.sqlite_version,
        "load before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"
    return f"{seconds:.2f} s"


def fmt_bytes(value: float) -> str:
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def fmt_ratio(value: float) -> str:
    return f"{value:,.0f}x" if value >= 100 else f"{value:.2f}x" if value < 10 else f"{value:.1f}x"


FS = "terrarium FsStore"
FLOOR = "floor: os.write / read + decode_lines"
INSERT = "floor: SQLite INSERT / SELECT + decode"
ON_SQLITE = (
    "terrarium SqliteStore",
    "openai-agents SQLiteSession",
    "LangChain SQLChatMessageHistory",
    "LangGraph SqliteSaver",
    "llm LogStore",
)


def table(results: Results, measure: str) -> list[str]:
    """A markdown table of one measure: rows systems, columns depths."""
    depths = results.config.depths

    def value(name: str, depth: int) -> float | None:
        cell = results.cells.get(name, {}).get(depth)
        if cell is None:
            return None
        if measure == "append":
            return None if cell.append_us is None else cell.append_us / 1e6
        if measure == "restore":
            return None if cell.restore_ms is None else cell.restore_ms / 1e3
        return cell.bytes_per_message

    what = "per message" if measure == "bytes" else "median"
    head = "| system | " + " | ".join(f"{label(d)}: {what} | ÷ floor | ÷ fs" for d in depths)
    lines = [head + " |", "| --- |" + " ---: | ---: | ---: |" * len(depths)]
    for name in results.names:
        row = [name]
        for depth in depths:
            v = value(name, depth)
            if v is None:
                cell = results.cells.get(name, {}).get(depth)
                row += ["skipped" if cell and cell.note else "-", "", ""]
                continue
            floor, fs = value(FLOOR, depth), value(FS, depth)
            shown = fmt_bytes(v) if measure == "bytes" else fmt_time(v)
            row += [
                shown,
                fmt_ratio(v / floor) if floor else "",
                fmt_ratio(v / fs) if fs else "",
            ]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def sqlite_floor(results: Results) -> list[str]:
    """The SQLite-backed systems' appends against the bare INSERT of the same run."""
    out = []
    for name in results.names:
        if name not in ON_SQLITE:
            continue
        ratios = []
        for depth in results.config.depths:
            cell = results.cells.get(name, {}).get(depth)
            bare = results.cells.get(INSERT, {}).get(depth)
            if cell and bare and cell.append_us and bare.append_us:
                ratios.append(f"{fmt_ratio(cell.append_us / bare.append_us)} at {label(depth)}")
        if ratios:
            out.append(f"- {name} ÷ the bare SQLite INSERT: " + ", ".join(ratios))
    return out


def tails(results: Results) -> list[str]:
    """terrarium's appends and the floors: the slowest 1 % and the slowest one, against the
    median (a stall from a catch-up or a checkpoint shows here, not in the median)."""
    depths = results.config.depths
    head = "| system | " + " | ".join(f"{label(d)}: p99 ÷ median | max ÷ median" for d in depths)
    lines = [head + " |", "| --- |" + " ---: | ---: |" * len(depths)]
    for name in results.names:
        if results.groups.get(name) not in ("floor", "terrarium"):
            continue
        row = [name]
        for depth in depths:
            cell = results.cells.get(name, {}).get(depth)
            if cell is None or not cell.append_us or cell.append_p99_us is None:
                row += ["-", "-"]
                continue
            assert cell.append_max_us is not None
            worst = cell.append_max_us
            row += [
                fmt_ratio(cell.append_p99_us / cell.append_us),
                f"{fmt_ratio(worst / cell.append_us)} ({fmt_time(worst / 1e6)})",
            ]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def log_and_search(results: Results) -> list[str]:
    """terrarium's bytes per message apart: the log (entries, heads, listing state) and the
    search index, each against FsStore's."""
    depths = results.config.depths
    head = "| store | " + " | ".join(
        f"{label(d)}: log | ÷ fs log | search index | total ÷ fs total" for d in depths
    )
    lines = [head + " |", "| --- |" + " ---: | ---: | ---: | ---: |" * len(depths)]

    def parts(name: str, depth: int) -> tuple[float, float, float] | None:
        cell = results.cells.get(name, {}).get(depth)
        if cell is None or cell.total_bytes is None or cell.search_bytes is None:
            return None
        messages = cell.total_bytes / (cell.bytes_per_message or 1)
        log = (cell.total_bytes - cell.search_bytes - cell.free_bytes) / messages
        return log, cell.search_bytes / messages, cell.total_bytes / messages

    for name in results.names:
        if not any(parts(name, d) for d in depths):
            continue
        row = [name]
        for depth in depths:
            ours, fs = parts(name, depth), parts(FS, depth)
            if ours is None or fs is None:
                row += ["-", "", "", ""]
                continue
            row += [
                fmt_bytes(ours[0]),
                fmt_ratio(ours[0] / fs[0]),
                fmt_bytes(ours[1]),
                fmt_ratio(ours[2] / fs[2]),
            ]
        lines.append("| " + " | ".join(row) + " |")
    for name in results.names:
        free = [
            f"{fmt_bytes(cell.free_bytes * cell.bytes_per_message / cell.total_bytes)} a "
            f"message at {label(depth)}"
            for depth, cell in sorted(results.cells.get(name, {}).items())
            if cell.free_bytes and cell.total_bytes and cell.bytes_per_message
        ]
        if free:
            lines += [
                "",
                f"{name}: free pages (in the totals, in neither column): " + ", ".join(free),
            ]
    return lines


def samples_note(results: Results) -> list[str]:
    """Which systems had fewer samples than the most, or were skipped, and where."""
    cfg = results.config
    out = []
    for name in results.names:
        parts = []
        for depth, cell in sorted(results.cells.get(name, {}).items()):
            if cell.note:
                parts.append(f"{label(depth)} {cell.note}")
            elif cell.append_n - 1 < cfg.appends or cell.restore_n < cfg.restores:
                parts.append(
                    f"{label(depth)}: {cell.append_n - 1} appends, {cell.restore_n} restores"
                )
        if parts:
            out.append(f"- {name}: " + "; ".join(parts))
    return out


def write_markdown(results: Results, out: Path, plots: list[str], command: str) -> Path:
    m = results.machine
    cfg = results.config
    lines = [
        "# Terrarium next to its peers",
        "",
        "Written by `benchmarks/peers.py` (method in its docstring and in "
        "[benchmarks/README.md](../benchmarks/README.md#peerspy)). Every system ran in one "
        "process, interleaved in a new random order each turn; figures are medians. "
        "Ratios compare within this run only: **÷ floor** is to the floor row "
        "(`os.write` of the same line to an `O_APPEND` file; for restore, reading that file "
        "and msgspec `decode_lines`, GC paused; for bytes, the JSONL lines themselves), "
        "**÷ fs** to terrarium's `FsStore`.",
        "",
        f"Run: {command}, {m.get('date', '')}, {m.get('duration', '')}.",
        f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, SQLite {m['sqlite']}"
        + (f", PostgreSQL {m['postgres']}" if "postgres" in m else "")
        + f", {m['platform']}.",
        f"Load average (1, 5, 15 min): {m['load before']} before, {m.get('load after', '?')} "
        "after; the machine is shared, so absolute times move with load and the ratios "
        "within one run are what to compare.",
        "",
    ]
    for plot in plots:
        lines += [f"![{plot}]({plot})", ""]
    for title, measure in (
        ("Append one message (latency)", "append"),
        ("Restore the whole conversation", "restore"),
        (
            "Bytes on disk per message (every file written, after close; terrarium's "
            "search index included)",
            "bytes",
        ),
    ):
        lines += [f"## {title}", "", *table(results, measure), ""]
        if measure == "append":
            lines += [*sqlite_floor(results), ""]
            lines += ["Tails of the same appends:", "", *tails(results), ""]
        if measure == "bytes":
            lines += [
                "terrarium's stores, the log and the search index apart (each store brought "
                "its search index up to date with one search before closing; FsStore's is "
                "`.index/`, SQLite's the `search*` tables, PostgreSQL's its derived index file):",
                "",
                *log_and_search(results),
                "",
            ]
    notes = samples_note(results)
    lines += [
        "## Samples and skips",
        "",
        f"Up to {cfg.appends} timed appends and {cfg.restores} restores per system and depth; "
        "slower systems get as many as fit in "
        f"{cfg.append_budget_s:g} s of appends and {cfg.restore_budget_s:g} s of restores "
        f"(at least {cfg.min_appends} and {cfg.min_restores}), and a system is skipped at a "
        f"depth where one append would take over {cfg.max_call_s:g} s.",
        "",
        *(notes or ["- every system had every sample"]),
        *(f"- {name}: not measured, {why}" for name, why in results.skipped.items()),
        *(f"- {name}: {note}" for name, note in results.system_notes.items()),
        *(f"- {note}" for note in results.notes),
        "",
        "## Versions",
        "",
        *(f"- {name}: {v}" for name, v in results.versions.items() if v),
        "",
        "## Rerun",
        "",
        "```",
        "make bench-peers                                   # installs the bench extra, full run",
        ".venv/bin/pip install -e '.[bench]'                # or by hand:",
        ".venv/bin/python benchmarks/peers.py               # writes docs/benchmarks.md + PNGs",
        ".venv/bin/python benchmarks/peers.py --quick --out /tmp/peers   # smoke run",
        "```",
        "",
    ]
    path = out / "benchmarks.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def plot(results: Results, out: Path, measure: str) -> str | None:
    """A log-log PNG of ``measure`` against history depth, one line per system."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(11, 5.5), dpi=110)
    colors = iter(plt.get_cmap("tab20").colors)
    styles = {"floor": ":", "terrarium": "-", "peer": "--", "seed": "-."}
    for name in results.names:
        points = [
            (depth, (c.append_us / 1e6) if measure == "append" else (c.restore_ms or 0) / 1e3)
            for depth, c in sorted(results.cells.get(name, {}).items())
            if (c.append_us if measure == "append" else c.restore_ms) is not None
        ]
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        width = 2.4 if results.groups[name] == "terrarium" else 1.4
        color = next(colors)
        ax.plot(xs, ys, styles[results.groups[name]], marker="o", lw=width, label=name, c=color)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("history depth (messages already in the conversation)")
    ax.set_ylabel("seconds (median)")
    what = "append one message" if measure == "append" else "restore the whole conversation"
    ax.set_title(f"{what}: latency against history depth (log-log, lower is better)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    name = f"benchmarks-{measure}.png"
    fig.savefig(out / name)
    plt.close(fig)
    return name


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny depths")
    parser.add_argument("--depths", help="history depths, comma-separated (1000,10000,100000)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="where the report goes")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cfg = QUICK if args.quick else Config()
    if args.depths:
        depths = tuple(int(d) for d in args.depths.split(","))
        cfg = Config(**{**cfg.__dict__, "depths": depths})
    args.out.mkdir(parents=True, exist_ok=True)
    info = machine()
    started = time.perf_counter()
    print(f"Peers benchmark ({'quick' if args.quick else 'full'}), load {info['load before']}")
    base = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    pg = PgNotes()
    skipped: dict[str, str] = {}
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, base, True)
        dsn = stack.enter_context(throwaway_database(pg))
        if dsn is None:
            skipped["terrarium PostgresStore"] = pg.notes[-1].split(": ", 1)[-1]
        found = systems(dsn, skipped)
        results = Results(
            cfg,
            [s.name for s in found],
            {s.name: s.group for s in found},
            {s.name: s.version for s in found},
            skipped=skipped,
            system_notes={s.name: s.note for s in found if s.note},
            notes=[n for n in pg.notes if not n.startswith("PostgreSQL skipped")],
        )
        if dsn is not None:
            info["postgres"] = pg.notes[-1].split()[1]
        previous: dict[str, tuple[int, float]] = {}
        for depth in cfg.depths:
            measure_depth(results, found, depth, base, previous)
    info["load after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    info["date"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    info["duration"] = f"{time.perf_counter() - started:.0f} s"
    results.machine = info
    plots = [p for p in (plot(results, args.out, m) for m in ("append", "restore")) if p]
    if not plots:
        results.notes.append("plots not drawn: matplotlib is not installed (the bench extra)")
    command = "`.venv/bin/python benchmarks/peers.py" + (" --quick`" if args.quick else "`")
    path = write_markdown(results, args.out, plots, command)
    print(path.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
