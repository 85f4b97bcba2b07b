"""``SqliteStore``'s frozen sessions: the rows a freeze, a thaw and a delete move.

They run in the caller's write transaction, under :mod:`terrarium.states`' rules. A frozen
session keeps one ``archived_segments`` row per segment (its lines and its trace, one
zstandard frame each: :mod:`terrarium.stores._archive`) and, while attached, its head as an
``archived_contexts`` row, which ``get_head`` reads with the hot ones in one statement.

Usage (in the store's write transaction)::

    hot_bytes, cold_bytes = freeze(conn, session_id)
    thaw(conn, session_id)
"""

from __future__ import annotations

import sqlite3

from terrarium.stores._archive import envelopes, pack_session, unpack_lines
from terrarium.stores._sqlbase import (
    COLD_HEAD,
    DROP_COLD,
    HOT_HEAD,
    INSERT_COLD_HEAD,
    INSERT_HEAD,
    run_each,
)
from terrarium.stores.sqlite import _sql as sql

SESSION_TRACES = "SELECT segment_id, line FROM traces WHERE session_id = ? ORDER BY segment_id, id"
SESSION_SEGMENTS = "SELECT segment_id, created_at FROM segments WHERE session_id = ?"
# SQLite's entries name their segment by its key (``segments.id``).
SESSION_LINES = (
    "SELECT g.segment_id, e.seq, e.line FROM segments AS g JOIN entries AS e ON e.seg = g.id "
    "WHERE g.session_id = ? ORDER BY g.segment_id, e.seq"
)
INSERT_ARCHIVED_SEGMENT = (
    "INSERT INTO archived_segments (session_id, segment_id, created_at, next_seq, lines, "
    "trace) VALUES (?, ?, ?, ?, ?, ?)"
)
DROP_HOT = (
    "DELETE FROM entries WHERE seg IN (SELECT id FROM segments WHERE session_id = ?)",
    "DELETE FROM traces WHERE session_id = ?",
    "DELETE FROM segments WHERE session_id = ?",
    "DELETE FROM contexts WHERE session_id = ?",
)
ARCHIVED_SEGMENTS = (
    "SELECT segment_id, created_at, lines, trace FROM archived_segments WHERE session_id = ? "
    "ORDER BY segment_id"
)


def freeze(conn: sqlite3.Connection, session: str) -> tuple[int, int]:
    """Move a hot session out of the hot tables (its head, if any, to ``archived_contexts``);
    return the bytes its log took hot (as JSONL) and takes frozen."""
    hot, packed = _pack_session(conn, session)
    head = conn.execute(HOT_HEAD, (session,)).fetchone()
    if head is not None:
        conn.execute(INSERT_COLD_HEAD, (session, *head))
    run_each(conn, DROP_HOT, session)
    return hot, packed


def _pack_session(conn: sqlite3.Connection, session: str) -> tuple[int, int]:
    """Write an ``archived_segments`` row for each of the session's segments; return the
    bytes its log takes hot (as JSONL) and frozen."""
    created = dict(conn.execute(SESSION_SEGMENTS, (session,)).fetchall())
    frozen = pack_session(
        conn.execute(SESSION_LINES, (session,)), conn.execute(SESSION_TRACES, (session,))
    )
    conn.executemany(
        INSERT_ARCHIVED_SEGMENT,
        [(session, g, created[g], *packed) for g, packed in frozen.segments.items()],
    )
    return frozen.hot_bytes, frozen.cold_bytes


def thaw(conn: sqlite3.Connection, session: str) -> None:
    """Move a frozen session back to the hot tables.

    Its segments get new keys, so an append with a key cached before the freeze fails its check
    and looks again.
    """
    head = conn.execute(COLD_HEAD, (session,)).fetchone()
    for g, seg_created, blob, trace in conn.execute(ARCHIVED_SEGMENTS, (session,)).fetchall():
        lines = unpack_lines(blob)
        found = envelopes(lines)
        seg = conn.execute(sql.INSERT_SEGMENT, (session, g, seg_created)).lastrowid
        conn.executemany(
            sql.INSERT_ENTRY,
            [(seg, e.seq, e.kind, str(e.ts), line) for e, line in zip(found, lines, strict=True)],
        )
        conn.executemany(sql.INSERT_TRACE, [(session, g, t) for t in unpack_lines(trace)])
    if head is not None:
        context, type_, g, created, updated = head
        conn.execute(INSERT_HEAD, (context, type_, session, g, created, updated))
    run_each(conn, DROP_COLD, session)
