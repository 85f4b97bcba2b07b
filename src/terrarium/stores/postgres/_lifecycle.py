"""``PostgresStore``'s frozen sessions: the physical moves under the shared lifecycle.

Lifecycle itself is :mod:`terrarium.states`, over the state record
``sessions.state`` (:class:`~terrarium.stores._sqlbase.SqlStore`); here are the rows a freeze
and a thaw move, in the caller's transaction, between the hot tables and
``archived_contexts`` and ``archived_segments`` (SQLite's, with PostgreSQL types).

A frozen segment keeps its row's tail, so a thaw puts the row back as it was. Each move's
writes to ``contexts`` and ``segments`` note the session in the change cursor (their
triggers), so the derived index hears of it.

Concurrency: every move first locks the session's row (``FOR UPDATE``, in
:class:`~terrarium.stores._sqlbase.SqlStore`; a ``create_segment`` holds it ``FOR KEY
SHARE``). A freeze then holds the transaction-level advisory lock on its context's id
(:func:`lock_name`), as a create and an attach do, so that a create never slips between its
delete of the head and its insert of the frozen one; then it locks the segments' rows in key
order (appends and trace writes wait, then find no row and take the miss path, which wakes
the session). Locks are taken in that order: session row, then id.
"""

from __future__ import annotations

from typing import Any

import psycopg

from terrarium.model import SegmentId, SessionId
from terrarium.stores import _sqlbase
from terrarium.stores._archive import envelopes, pack_session, unpack_lines
from terrarium.stores._sqlbase import pyformat, run_each
from terrarium.stores.postgres import _sql

Conn = psycopg.Connection[Any]

LOCK_NAME = "SELECT pg_advisory_xact_lock(%s)"
LOCK_SEGMENTS = (
    "SELECT segment_id, created_at, next_seq FROM segments "
    "WHERE session_id = %s ORDER BY session_id, segment_id FOR UPDATE"
)
OWNER = pyformat(_sqlbase.SESSION_OWNER) + " FOR UPDATE"
LOCK_HEAD = pyformat(_sqlbase.HOT_HEAD) + " FOR UPDATE"
COLD_HEAD = pyformat(_sqlbase.COLD_HEAD)
INSERT_COLD_HEAD = pyformat(_sqlbase.INSERT_COLD_HEAD)
SESSION_TRACES = "SELECT segment_id, line FROM traces WHERE session_id = %s ORDER BY segment_id, n"
SESSION_LINES = (
    "SELECT segment_id, seq, line FROM entries WHERE session_id = %s ORDER BY segment_id, seq"
)
INSERT_ARCHIVED_SEGMENT = (
    "INSERT INTO archived_segments (session_id, segment_id, created_at, next_seq, lines, "
    "trace) VALUES (%s, %s, %s, %s, %s, %s)"
)
# Traces go with their segments (foreign key, ON DELETE CASCADE).
DROP_HOT = tuple(
    f"DELETE FROM {table} WHERE session_id = %s" for table in ("entries", "segments", "contexts")
)
ARCHIVED_SEGMENTS = (
    "SELECT segment_id, created_at, next_seq, lines, trace "
    "FROM archived_segments WHERE session_id = %s ORDER BY segment_id"
)
REFILL_SEGMENT = (
    "INSERT INTO segments (session_id, segment_id, created_at, next_seq) VALUES (%s, %s, %s, %s)"
)
REFILL_ENTRIES = (
    "INSERT INTO entries (session_id, segment_id, seq, kind, ts, line) "
    "SELECT %s, %s, e.seq, e.kind, e.ts, e.line FROM unnest(%b::int[], %b::text[], "
    "%b::text[], %b::text[]) AS e(seq, kind, ts, line)"
)
REFILL_HEAD = pyformat(_sqlbase.INSERT_HEAD)
DROP_COLD = tuple(map(pyformat, _sqlbase.DROP_COLD))


def lock_name(conn: Conn, schema: str, context: str) -> None:
    """Hold the id ``context`` until the transaction ends (creates and freezes take turns).

    Not the key of ``lock_context``: a caller holding that lock may create the context.
    """
    conn.execute(LOCK_NAME, (_sql.lock_key(schema, "name", context),))


def freeze(conn: Conn, schema: str, session: SessionId) -> tuple[int, int]:
    """Move a hot session out of the hot tables (its head, if any, to ``archived_contexts``);
    return the bytes its log took hot (as JSONL) and takes frozen."""
    named = conn.execute(OWNER, (session,)).fetchone()
    if named is not None and named[0] is not None:
        lock_name(conn, schema, named[0])
    segments = {row[0]: row for row in conn.execute(LOCK_SEGMENTS, (session,)).fetchall()}
    head = conn.execute(LOCK_HEAD, (session,)).fetchone()
    hot, packed = _pack_session(conn, session, segments)
    if head is not None:
        conn.execute(INSERT_COLD_HEAD, (session, *head))
    run_each(conn, DROP_HOT, session)
    return hot, packed


def _pack_session(
    conn: Conn, session: SessionId, segments: dict[SegmentId, tuple[Any, ...]]
) -> tuple[int, int]:
    """Write an ``archived_segments`` row for each of the session's segments (locked, as
    ``segments`` holds them); return the bytes its log takes hot (as JSONL) and frozen."""
    frozen = pack_session(
        conn.execute(SESSION_LINES, (session,)).fetchall(),
        conn.execute(SESSION_TRACES, (session,)).fetchall(),
    )
    rows = [
        (session, g, created, next_seq, *frozen.segments[g][1:])
        for g, (_, created, next_seq) in segments.items()
    ]
    with conn.cursor() as cursor:
        cursor.executemany(INSERT_ARCHIVED_SEGMENT, rows)
    return frozen.hot_bytes, frozen.cold_bytes


def thaw(conn: Conn, session: SessionId) -> None:
    """Move a frozen session back to the hot tables, its head too if it has one."""
    head = conn.execute(COLD_HEAD, (session,)).fetchone()
    for g, seg_created, next_seq, blob, trace in conn.execute(
        ARCHIVED_SEGMENTS, (session,)
    ).fetchall():
        conn.execute(REFILL_SEGMENT, (session, g, seg_created, next_seq))
        lines = unpack_lines(blob)
        found = envelopes(lines)
        columns = ([e.seq for e in found], [e.kind for e in found], [str(e.ts) for e in found])
        conn.execute(REFILL_ENTRIES, (session, g, *columns, lines))
        traced = unpack_lines(trace)
        if traced:
            conn.execute(_sql.APPEND_TRACE, (session, g, traced))
    if head is not None:
        context, type_, g, created, updated = head
        conn.execute(REFILL_HEAD, (context, type_, session, g, created, updated))
    run_each(conn, DROP_COLD, session)
