"""The ``transcript`` view of SqliteStore and PostgresStore (made by ``m001_initial``).

For every context, the view's rows are exactly ``restore(store, context).history``, in order,
numbered 1..n, whatever forks, compactions, clears, imports and attaches made the lineage;
``text`` is what ``model.item_text`` gives for Chat Completions items, and the text parts and
refusals of Responses items. SQL users read it with the ``sqlite3`` and ``psql`` programs.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.history import build_history
from pg import fresh_schema, pg_database  # noqa: F401  (a fixture)
from terrarium import states
from terrarium.model import ContextId, SegmentOrigin, SegmentStartState, UsageRecord, item_text
from terrarium.sessions import (
    append_entry,
    attach_context,
    clear_segment,
    create_compacted_segment,
    create_segment,
    create_segment_with_ids,
    fork_at,
    fork_context,
    restore,
    save_delta,
    save_turn_end,
    save_usage,
)
from terrarium.stores.base import PodActiveSegmentRef, PodMetadata, Store

MAIN = ContextId("cli", "main")
COLUMNS = (
    "context, position, role, text, timestamp, type, kind, session_id, segment_id, seq, n, item"
)


class Backend:
    """A store and a plain SQL connection of its own to the same database."""

    def __init__(self, name: str, store: Store, conn: Any) -> None:
        self.name, self.store, self.conn = name, store, conn

    def query(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        """Rows of ``statement`` (``?`` placeholders on both backends)."""
        if self.name == "postgres":
            statement = statement.replace("?", "%s")
        return list(self.conn.execute(statement, params).fetchall())

    def rows(self, context: str | ContextId) -> list[dict[str, Any]]:
        """The view's rows of ``context``, in order, as dicts (``item`` decoded)."""
        found = self.query(
            f"SELECT {COLUMNS} FROM transcript WHERE context = ? ORDER BY position",
            str(context),
        )
        rows = [dict(zip(COLUMNS.split(", "), row, strict=True)) for row in found]
        for row in rows:
            if isinstance(row["item"], str):  # SQLite: JSON text; PostgreSQL: jsonb, decoded
                row["item"] = json.loads(row["item"])
        return rows


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        from terrarium.stores.sqlite import SqliteStore

        path = tmp_path / "terrarium.db"
        with SqliteStore(path) as store:
            conn = sqlite3.connect(path)
            try:
                yield Backend("sqlite", store, conn)
            finally:
                conn.close()
        return
    request.applymarker(pytest.mark.postgres)
    import psycopg

    from terrarium.stores.postgres import PostgresStore

    dsn, schema = request.getfixturevalue("pg_database"), fresh_schema()
    with (
        PostgresStore(dsn, schema=schema) as pg_store,
        psycopg.connect(dsn, autocommit=True) as pg_conn,
    ):
        pg_conn.execute(f'SET search_path TO "{schema}"')
        yield Backend("postgres", pg_store, pg_conn)


def assert_view_is_restore(backend: Backend, context: str | ContextId) -> list[dict[str, Any]]:
    """The view's rows of ``context`` are its restored history, and return them."""
    history = restore(backend.store, context).history
    rows = backend.rows(context)
    assert [row["position"] for row in rows] == list(range(1, len(history) + 1))
    assert [row["item"] for row in rows] == history
    assert [row["role"] for row in rows] == [item.get("role") for item in history]
    assert [row["type"] for row in rows] == [item.get("type") for item in history]
    return rows


def chat_texts_match(rows: list[dict[str, Any]]) -> None:
    """Each row's text is ``item_text`` of its item (every item a Chat Completions message)."""
    assert [row["text"] for row in rows] == [item_text(row["item"]) for row in rows]


def start(backend: Backend, *items: dict[str, Any], system: str | None = None) -> PodMetadata:
    """A new ``cli:main`` whose root header holds a system message, then ``items``."""
    history = [{"role": "system", "content": system}] if system else []
    create_segment(backend.store, SegmentStartState(history=history), context=MAIN)
    head = backend.store.get_head(MAIN)
    assert head is not None
    if items:
        save_delta(backend.store, head, list(items))
    return head


def turn(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}, {"role": "assistant", "content": f"re: {text}"}]


def ref_of(head: PodMetadata, segment_id: Any) -> PodActiveSegmentRef:
    return PodActiveSegmentRef(head.session_id, segment_id)


def test_plain_conversation_with_tools_and_unicode(backend: Backend) -> None:
    """A conversation with a start history, tool calls and results, multipart content and
    text in many scripts reads back in order with its timestamps and entry places."""
    head = start(backend, system="Be brief. 日本語 ✓")
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    save_delta(
        backend.store,
        head,
        [
            {"role": "user", "content": "Grüße, 👩‍💻 مرحبا", "name": "zoë"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "résultat: 42"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "first "},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
                    {"type": "text", "text": "then 二"},
                ],
            },
        ],
    )
    save_usage(backend.store, head, UsageRecord("m", 1, 2))  # not history: not in the view
    save_turn_end(backend.store, head)
    rows = assert_view_is_restore(backend, MAIN)
    chat_texts_match(rows)
    assert [row["text"] for row in rows] == [
        "Be brief. 日本語 ✓",
        "Grüße, 👩‍💻 مرحبا",
        "",
        "résultat: 42",
        "first then 二",
    ]
    assert [(row["kind"], row["seq"], row["n"]) for row in rows] == [
        ("header", 0, 0),
        ("user_input", 1, None),
        ("item", 2, None),
        ("item", 3, None),
        ("item", 4, None),
    ]
    entries = backend.store.read_segment(head.session_id, head.segment_id)
    assert [row["timestamp"] for row in rows] == [
        entries.header["ts"],
        *[entry["ts"] for entry in entries.entries[:4]],
    ]
    assert {str(row["segment_id"]) for row in rows} == {str(head.segment_id)}


def test_fork_at_an_entry_then_turns_on_both_branches(backend: Backend) -> None:
    """Each branch (and a fork of a fork) reads its own lineage: the parent up to the fork's
    entry, then its own entries; the head decides which the context shows."""
    store = backend.store
    head = start(backend, *turn("one"), *turn("two"), system="sys")
    fork = fork_at(store, head, 2)  # after "re: one"
    save_delta(store, ref_of(head, fork), turn("fork"))
    save_delta(store, head, turn("three"))  # the original branch goes on too
    assert [r["text"] for r in assert_view_is_restore(backend, MAIN)][-2:] == [
        "three",
        "re: three",
    ]
    store.set_head(MAIN, fork, expected=head.segment_id)
    rows = assert_view_is_restore(backend, MAIN)
    assert [row["text"] for row in rows] == ["sys", "one", "re: one", "fork", "re: fork"]
    assert [row["depth"] for row in backend_lineage(backend, MAIN)] == [0, 1]
    deeper = fork_at(store, ref_of(head, fork), 1)  # the fork's own "fork" question
    save_delta(store, ref_of(head, deeper), turn("deeper"))
    store.set_head(MAIN, deeper, expected=fork)
    rows = assert_view_is_restore(backend, MAIN)
    assert [row["text"] for row in rows] == [
        "sys",
        "one",
        "re: one",
        "fork",
        "deeper",
        "re: deeper",
    ]
    chat_texts_match(rows)
    # a fork at the header continues the start history alone
    at_header = fork_at(store, head, 0)
    store.set_head(MAIN, at_header, expected=deeper)
    assert [row["text"] for row in assert_view_is_restore(backend, MAIN)] == ["sys"]


def backend_lineage(backend: Backend, context: ContextId) -> list[dict[str, Any]]:
    found = backend.query(
        "SELECT depth, segment_id, stop_seq FROM transcript_lineage WHERE context = ? "
        "ORDER BY depth",
        str(context),
    )
    return [{"depth": d, "segment_id": str(g), "stop_seq": s} for d, g, s in found]


def test_compaction_and_clear_start_afresh(backend: Backend) -> None:
    """After a compaction the view starts from the summary; after a clear it is empty; the
    turns after each follow, and a fork of the compaction continues it."""
    store = backend.store
    head = start(backend, *turn("one"), *turn("two"))
    summary = {"role": "user", "content": "Summary: one, two. ✂"}
    compacted = create_compacted_segment(store, head, [summary], context=MAIN)
    save_delta(store, ref_of(head, compacted), turn("three"))
    rows = assert_view_is_restore(backend, MAIN)
    assert [row["text"] for row in rows] == [summary["content"], "three", "re: three"]
    assert (rows[0]["kind"], rows[0]["seq"], rows[0]["n"]) == ("header", 0, 0)
    fork = fork_at(store, ref_of(head, compacted), 1)
    save_delta(store, ref_of(head, fork), turn("after fork"))
    store.set_head(MAIN, fork, expected=compacted)
    assert [row["text"] for row in assert_view_is_restore(backend, MAIN)] == [
        summary["content"],
        "three",
        "after fork",
        "re: after fork",
    ]
    cleared = clear_segment(store, ref_of(head, fork), context=MAIN)
    assert assert_view_is_restore(backend, MAIN) == []
    save_delta(store, ref_of(head, cleared), turn("fresh"))
    rows = assert_view_is_restore(backend, MAIN)
    assert [row["text"] for row in rows] == ["fresh", "re: fresh"]
    chat_texts_match(rows)


def test_imported_and_copied_contexts(backend: Backend) -> None:
    """An imported context and a context forked from another start from their root header's
    history; turns after it follow; the source context is unchanged."""
    store = backend.store
    imported = ContextId("irc", "#python")
    messages = [
        {"role": "system", "content": "legacy prompt"},
        {"role": "user", "content": "old question"},
        {"role": "assistant", "content": "old answer"},
    ]
    session_id, segment_id = uuid.uuid4(), uuid.uuid4()
    head = create_segment_with_ids(
        store,
        session_id,  # type: ignore[arg-type]
        segment_id,  # type: ignore[arg-type]
        SegmentStartState(history=messages),
        context=imported,
        origin=SegmentOrigin("import", source="irc/2025-01-01/#python.json"),
    )
    save_delta(store, head, turn("new question"))
    rows = assert_view_is_restore(backend, imported)
    assert [(row["kind"], row["n"]) for row in rows[:3]] == [("header", i) for i in range(3)]
    assert [row["text"] for row in rows] == [
        "legacy prompt",
        "old question",
        "old answer",
        "new question",
        "re: new question",
    ]
    copy = fork_context(store, imported, "irc:copy", at_seq=1)
    save_delta(store, copy, turn("copy only"))
    rows = assert_view_is_restore(backend, "irc:copy")
    assert [row["text"] for row in rows][-3:] == ["new question", "copy only", "re: copy only"]
    assert len(assert_view_is_restore(backend, imported)) == 5


def test_detached_session_appears_once_attached(backend: Backend) -> None:
    """A detached session is in no context, so not in the view; attached at a fork made while
    it was detached, the new context reads that fork's lineage."""
    store = backend.store
    session_id, root = create_segment(store, SegmentStartState(history=turn("before")))
    ref = PodActiveSegmentRef(session_id, root)
    save_delta(store, ref, turn("detached"))
    fork = fork_at(store, ref, 1)
    save_delta(store, PodActiveSegmentRef(session_id, fork), turn("forked"))
    assert backend.query("SELECT count(*) FROM transcript") == [(0,)]
    attach_context(store, "agents:late", PodActiveSegmentRef(session_id, fork))
    rows = assert_view_is_restore(backend, "agents:late")
    assert [row["text"] for row in rows] == [
        "before",
        "re: before",
        "detached",
        "forked",
        "re: forked",
    ]
    assert {str(row["session_id"]) for row in rows} == {str(session_id)}


def test_a_deleted_context_leaves_the_view(backend: Backend) -> None:
    """Deleting a context removes its rows; other contexts keep theirs."""
    start(backend, *turn("gone soon"))
    create_segment(backend.store, SegmentStartState(history=turn("stays")), context="cli:other")
    assert states.delete_context(backend.store, MAIN)
    assert backend.rows(MAIN) == []
    assert backend.query("SELECT DISTINCT context FROM transcript") == [("cli:other",)]
    assert len(assert_view_is_restore(backend, "cli:other")) == 2


def test_every_context_of_a_busy_store_reads_as_its_restore(backend: Backend) -> None:
    """Several contexts, roles, a fork, a compaction, a clear and a deleted context: the view
    over the whole store holds each context's restored history and nothing else."""
    build_history(backend.store)
    contexts = [str(head.context) for head in backend.store.list_contexts()]
    for context in contexts:
        chat_texts_match(assert_view_is_restore(backend, context))
    everything = backend.query("SELECT context, position FROM transcript ORDER BY 1, 2")
    expected = [
        (context, position + 1)
        for context in sorted(contexts)
        for position in range(len(restore(backend.store, context).history))
    ]
    assert sorted(everything) == sorted(expected)


# Each item with the text ``model.item_text`` gives it once Responses items are first-class
# (issue 14): Responses parts joined by line breaks, reasoning paragraphs apart.
RESPONSES_ITEMS: list[tuple[dict[str, Any], str]] = [
    (
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        "hi",
    ),
    (
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": "Hello,", "annotations": []},
                {"type": "output_text", "text": "wörld", "annotations": []},
            ],
        },
        "Hello,\nwörld",
    ),
    (
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "refusal", "refusal": "I can't help with that."}],
        },
        "I can't help with that.",
    ),
    ({"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'}, ""),
    ({"type": "function_call_output", "call_id": "c1", "output": "42"}, "42"),
    (
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "a"}, {"type": "input_image"}],
        },
        "a",
    ),
    (
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [
                {"type": "summary_text", "text": "Thinking"},
                {"type": "summary_text", "text": "aloud"},
            ],
            "content": [{"type": "reasoning_text", "text": "deep"}],
        },
        "Thinking\n\naloud\n\ndeep",
    ),
    ({"type": "reasoning", "id": "rs_2", "summary": []}, ""),
    ({"role": "assistant", "content": None, "refusal": "No."}, ""),
    (
        {
            "role": "user",
            "content": [
                "not a part",
                {"type": "text", "text": "x"},
                {"type": "input_text", "text": "y"},
            ],
        },
        "x\ny",
    ),
    ({"type": "some_future_item", "content": "not read", "payload": {"k": [1, 2]}}, ""),
]


def test_responses_items_show_their_text(backend: Backend) -> None:
    """Responses items keep their place: role NULL and ``type`` for items without a role;
    text from ``input_text``/``output_text`` parts, refusals, tool outputs and reasoning."""
    head = start(backend, *turn("chat first"))
    for item, _ in RESPONSES_ITEMS:
        append_entry(backend.store, head, "item", {"item": item})
    rows = assert_view_is_restore(backend, MAIN)[2:]
    assert [row["text"] for row in rows] == [text for _, text in RESPONSES_ITEMS]
    assert [(row["role"], row["type"]) for row in rows][3:5] == [
        (None, "function_call"),
        (None, "function_call_output"),
    ]


def test_nul_characters_do_not_break_the_view(backend: Backend) -> None:
    """A U+0000 in an item (valid in a line; ``jsonb`` and SQLite's JSON functions cannot
    return it) reads as U+FFFD; an escaped backslash before "u0000" stays text."""
    items = [
        {"role": "user", "content": "a\x00b\x00\x00c"},
        {"role": "assistant", "content": "literal \\u0000 and \\\x00"},
    ]
    start(backend, *items, system="nul\x00in header")
    rows = backend.rows(MAIN)
    assert [row["text"] for row in rows] == [
        "nul\ufffdin header",
        "a\ufffdb\ufffd\ufffdc",
        "literal \\u0000 and \\\ufffd",
    ]
    assert rows[1]["item"] == {"role": "user", "content": "a\ufffdb\ufffd\ufffdc"}


# The sqlite_stat1 rows (search tables aside) that ANALYZE wrote for a store of 2,000
# contexts and 500,000 entries (benchmarks/bench_transcript.py's), on which a join to a
# parent's header made SQLite scan the whole entries table to build a Bloom filter; the
# entries' row is for its key (seg, seq): 502,253 entries in 2,002 segments.
BIG_STORE_STATS = [
    ("sessions", "sqlite_autoindex_sessions_1", "2000 1"),
    ("migrations", "sqlite_autoindex_migrations_1", "6 1"),
    ("segments", "sqlite_autoindex_segments_1", "2002 1 1"),
    ("contexts", "contexts_listing", "2000 2000 1 1 1 1 1 1 1 1"),
    ("contexts", "contexts_by_type", "2000 2000"),
    ("contexts", "sqlite_autoindex_contexts_2", "2000 1"),
    ("contexts", "sqlite_autoindex_contexts_1", "2000 1"),
    ("entries", "sqlite_autoindex_entries_1", "502253 251 1"),
]


@pytest.mark.parametrize("stats", ["analysed", "big store"])
def test_reading_one_context_touches_only_its_segments(tmp_path: Path, stats: str) -> None:
    """SQLite's plan for one context's transcript finds the context by its key, each segment's
    key by its ids and every entry it reads by (segment key, seq): no scan of the entries
    table, not even to build a Bloom filter, with the statistics of this store or of a big
    one."""
    from terrarium.stores.sqlite import SqliteStore

    path = tmp_path / "plan.db"
    with SqliteStore(path) as store:
        build_history(store)
    conn = sqlite3.connect(path)
    try:
        conn.execute("ANALYZE")
        if stats == "big store":
            conn.execute("DELETE FROM sqlite_stat1")
            conn.executemany("INSERT INTO sqlite_stat1 VALUES (?, ?, ?)", BIG_STORE_STATS)
            conn.commit()
            conn.execute("ANALYZE sqlite_schema")  # load the statistics just written
        plan = [
            row[3]
            for row in conn.execute(
                "EXPLAIN QUERY PLAN SELECT * FROM transcript WHERE context = ?", ("cli:main",)
            )
        ]
    finally:
        conn.close()
    # contexts is c; entries is h (the head's header), p (a parent's header), e (entries),
    # and unnamed in the subqueries that read the lineage's headers; segments is g
    tables = [
        step
        for step in plan
        if re.match(r"(SCAN|SEARCH|BLOOM FILTER ON) (c|h|p|e|g|entries) ", step)
        and "VIRTUAL TABLE" not in step
    ]
    assert "SEARCH c USING INDEX sqlite_autoindex_contexts_1 (context=?)" in tables, plan
    # (a Bloom filter is only worth its scan on a small table: allowed on this one alone)
    if stats == "big store":
        assert not any("BLOOM" in step for step in plan), plan
    entry_reads = [
        step
        for step in tables
        if step.startswith(("SCAN", "SEARCH entries ", "SEARCH h ", "SEARCH p ", "SEARCH e "))
    ]
    assert {step.split()[1] for step in entry_reads} == {"h", "p", "e", "entries"}, plan
    for step in entry_reads:
        assert step.startswith("SEARCH") and "(seg=? AND seq" in step
    key_reads = [step for step in tables if step.split()[1] == "g"]
    assert key_reads, plan
    for step in key_reads:
        assert step.startswith("SEARCH") and "(session_id=? AND segment_id=?)" in step


@pytest.mark.postgres
def test_postgres_reads_one_context_by_index(pg_database: str) -> None:  # noqa: F811
    """PostgreSQL's plan for one context's transcript on an analysed store reads entries only
    by index, on (session, segment, seq): never a sequential scan of the entries."""
    import psycopg

    from terrarium.stores.postgres import PostgresStore

    schema = fresh_schema()
    with PostgresStore(pg_database, schema=schema) as store:
        for k in range(20):
            context = f"cli:c{k}"
            create_segment(store, None, context=context)
            head = store.get_head(ContextId.parse(context))
            assert head is not None
            for _ in range(5):
                save_delta(store, head, [item for i in range(20) for item in turn(f"m{i}")])
            compacted = create_compacted_segment(store, head, turn("sum"), context=context)
            save_delta(store, ref_of(head, compacted), turn("after"))
            fork = fork_at(store, ref_of(head, compacted), 1)
            store.set_head(ContextId.parse(context), fork, expected=compacted)
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        tables = "SELECT tablename FROM pg_tables WHERE schemaname = %s"
        for (table,) in conn.execute(tables, (schema,)).fetchall():
            # This schema's tables only: a bare ANALYZE reads every test's schema in the
            # shared database (24 s late in a full run).
            conn.execute(f'ANALYZE "{schema}"."{table}"')
        plan = [
            row[0]
            for row in conn.execute(
                "EXPLAIN SELECT * FROM transcript WHERE context = %s", ("cli:c3",)
            )
        ]
    text = "\n".join(plan)
    assert "Seq Scan on entries" not in text, text
    scans = [i for i, line in enumerate(plan) if " on entries " in line]
    assert scans, text
    for i in scans:
        assert "Index" in plan[i] and "segment_id =" in plan[i + 1], text


def test_sqlite3_program_reads_the_view(tmp_path: Path) -> None:
    """The ``sqlite3`` program (or Python's sqlite3 module without it), in another process,
    reads a conversation in order with one query."""
    from terrarium.stores.sqlite import SqliteStore

    path = tmp_path / "cli.db"
    with SqliteStore(path) as store:
        create_segment(store, SegmentStartState(history=turn("zero")), context=MAIN)
        head = store.get_head(MAIN)
        assert head is not None
        save_delta(store, head, turn("naïve ☕"))
        fork = fork_at(store, head, 1)
        save_delta(store, ref_of(head, fork), turn("fork"))
        store.set_head(MAIN, fork, expected=head.segment_id)
    query = (
        "SELECT position, role, text FROM transcript WHERE context = 'cli:main' ORDER BY position"
    )
    program = shutil.which("sqlite3")
    if program:
        command = [program, "-separator", "|", str(path), query]
    else:
        script = "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
        script += "[print(*r, sep='|') for r in c.execute(sys.argv[2])]"
        command = [sys.executable, "-c", script, str(path), query]
    out = subprocess.run(command, capture_output=True, text=True, check=True, encoding="utf-8")
    assert out.stdout.splitlines() == [
        "1|user|zero",
        "2|assistant|re: zero",
        "3|user|naïve ☕",
        "4|user|fork",
        "5|assistant|re: fork",
    ]


@pytest.mark.postgres
def test_psql_reads_the_view(pg_database: str) -> None:  # noqa: F811
    """``psql -c`` reads a conversation in order with one query (and ``entries_json`` gives
    every entry as ``jsonb``)."""
    from terrarium.stores.postgres import PostgresStore

    program = shutil.which("psql")
    if program is None:
        pytest.skip("psql is not installed")
    schema = fresh_schema()
    with PostgresStore(pg_database, schema=schema) as store:
        create_segment(store, SegmentStartState(history=turn("zero")), context=MAIN)
        head = store.get_head(MAIN)
        assert head is not None
        save_delta(store, head, turn("naïve ☕"))
    transcript = (
        f"SELECT position, role, text FROM {schema}.transcript "
        "WHERE context = 'cli:main' ORDER BY position"
    )
    entries = (
        f"SELECT entry -> 'item' ->> 'content' FROM {schema}.entries_json "
        "WHERE kind = 'user_input' ORDER BY seq"
    )
    out = subprocess.run(
        [program, "-X", "-A", "-t", "-d", pg_database, "-c", transcript, "-c", entries],
        capture_output=True,
        text=True,
        check=True,
        encoding="utf-8",
    )
    assert out.stdout.splitlines() == [
        "1|user|zero",
        "2|assistant|re: zero",
        "3|user|naïve ☕",
        "4|assistant|re: naïve ☕",
        "naïve ☕",
    ]
