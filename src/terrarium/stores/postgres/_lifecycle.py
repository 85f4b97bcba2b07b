"""``PostgresStore``'s lifecycle: archive, trash, restore, purge and pins, one transaction each.

The tables (migration ``m007_lifecycle``) are SQLite's (:mod:`terrarium.stores.sqlite._lifecycle`)
with PostgreSQL types, keyed by ``session_id`` first like every other table::

    archived_contexts(session_id PK, context, type, segment_id, created_at, updated_at,
                      archived_at, last_active, message_count, hot_bytes, archived_bytes,
                      trash_id UNIQUE, deleted_at, deleted_from)
    archived_segments(session_id, segment_id, created_at, type, next_seq, items, base_items,
                      last_ts, lines bytea, trace bytea)        PK (session_id, segment_id)
    pins(session_id PK, pinned_at)

An archived segment keeps its row's tail and counts, so unarchiving puts the row back as it
was, marked unread from its header on: the next catch-up (before any search or listing)
indexes its items again. Its ``sessions`` row stays while archived or trashed.

Concurrency: an archive locks the session's row (``FOR UPDATE``, which waits for a
``create_segment`` holding it ``FOR KEY SHARE``), then its segments' rows in key order (as a
catch-up does: appends and trace writes wait, then find no row and take the miss path, which
unarchives), then the head. Changes that take an id or give one up (create, attach, archive,
restore) hold a transaction-level advisory lock on the id (:func:`lock_name`), so a create
never slips between an archive's delete of the head and its insert of the archived row.

Usage (inside ``with conn.transaction():``)::

    archived = archive(conn, schema, "cli:main", utc_now())
    head = unarchive(conn, session_id)
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterable
from typing import Any

import psycopg

from terrarium import codec
from terrarium.errors import ContextExists, NotInTrash
from terrarium.model import ContextId, SegmentId, SessionId
from terrarium.stores._archive import (
    envelopes,
    jsonl_bytes,
    pack,
    pyformat,
    unpack,
    unpack_lines,
)
from terrarium.stores.base import ArchivedContext, PodMetadata, SegmentRead, TrashedContext
from terrarium.stores.postgres import _sql


class shared:
    # Archived (not trashed) contexts, by id (the partial unique index archived_contexts_live).
    ARCHIVED_SESSION = (
        "SELECT session_id FROM archived_contexts WHERE context = ? AND trash_id IS NULL"
    )
    ARCHIVED_HEAD = (
        "SELECT context, session_id, segment_id, created_at, updated_at FROM archived_contexts "
        "WHERE context = ? AND trash_id IS NULL"
    )
    # One snapshot: a context an archive
    # or a wake moves between the two tables meanwhile is found in one of them (two statements
    # could miss it in both).
    HEAD_ANY = (
        "SELECT context, session_id, segment_id, created_at, updated_at FROM contexts "
        "WHERE context = ? UNION ALL SELECT context, session_id, segment_id, created_at, "
        "updated_at FROM archived_contexts WHERE context = ? AND trash_id IS NULL"
    )
    # NULL: not in the archive; 1 (true): archived; 0 (false): trashed.
    SESSION_STATE = "SELECT trash_id IS NULL FROM archived_contexts WHERE session_id = ?"
    # PostgreSQL's alone: SQLite's entries name their segment by its key (m013), so SQLite reads
    # them with a statement of its own (``sqlite/_lifecycle.SESSION_LINES``).
    SESSION_LINES = (
        "SELECT segment_id, seq, line FROM entries WHERE session_id = ? ORDER BY segment_id, seq"
    )
    INSERT_ARCHIVED = (
        "INSERT INTO archived_contexts (session_id, context, type, segment_id, created_at, "
        "updated_at, archived_at, last_active, message_count, hot_bytes, archived_bytes) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    DROP_COLD = tuple(
        f"DELETE FROM {table} WHERE session_id = ?"
        for table in ("archived_segments", "archived_contexts")
    )
    PURGE = (
        *DROP_COLD,
        "DELETE FROM pins WHERE session_id = ?",
        "DELETE FROM sessions WHERE session_id = ?",
    )
    # The archived (not trashed) segment's columns, read by reference.
    ARCHIVED_SEGMENT = (
        "SELECT {columns} FROM archived_segments AS g JOIN archived_contexts AS c "
        "USING (session_id) WHERE g.session_id = ? AND g.segment_id = ? AND c.trash_id IS NULL"
    )
    ARCHIVED_SEGMENT_IDS = (
        "SELECT g.segment_id FROM archived_segments AS g JOIN archived_contexts AS c "
        "USING (session_id) WHERE g.session_id = ? AND c.trash_id IS NULL"
    )
    PINNED_COLUMN = "EXISTS (SELECT 1 FROM pins AS p WHERE p.session_id = a.session_id)"
    ARCHIVED_LIST = (
        "SELECT context, substr(created_at, 1, 10), archived_at, last_active, message_count, "
        f"hot_bytes, archived_bytes, {PINNED_COLUMN} FROM archived_contexts AS a "
        "WHERE trash_id IS NULL {where}"
    )
    TRASH_LIST = (
        "SELECT trash_id, context, substr(created_at, 1, 10), deleted_at, "
        "deleted_from = 'archived', "
        f"message_count, archived_bytes, {PINNED_COLUMN} FROM archived_contexts AS a "
        "WHERE trash_id IS NOT NULL ORDER BY deleted_at DESC, trash_id DESC"
    )
    TRASH = (
        "UPDATE archived_contexts SET trash_id = ?, deleted_at = ?, deleted_from = ? "
        "WHERE session_id = ?"
    )
    UNTRASH = (
        "UPDATE archived_contexts SET trash_id = NULL, deleted_at = NULL, deleted_from = NULL, "
        "context = ?, type = ? WHERE session_id = ?"
    )
    RENAME_SESSION = "UPDATE sessions SET context = ? WHERE session_id = ?"
    UNPIN = "DELETE FROM pins WHERE session_id = ?"
    PINNED = (
        "SELECT c.context FROM pins JOIN contexts AS c USING (session_id) UNION ALL "
        "SELECT a.context FROM pins JOIN archived_contexts AS a USING (session_id) "
        "WHERE a.trash_id IS NULL"
    )


def new_trash_id() -> str:
    return str(uuid.uuid4())


# ---------------------------------------------------------------------------- statements

LOCK_NAME = "SELECT pg_advisory_xact_lock(%s)"
LOCK_SESSION = "SELECT 1 FROM sessions WHERE session_id = %s FOR UPDATE"
HOT_SESSION = "SELECT session_id FROM contexts WHERE context = %s"
LOCK_SEGMENTS = (
    "SELECT segment_id, created_at, type, next_seq, items, base_items, last_ts FROM segments "
    "WHERE session_id = %s ORDER BY session_id, segment_id FOR UPDATE"
)
LOCK_HEAD = (
    "SELECT segment_id, created_at, updated_at, type FROM contexts "
    "WHERE context = %s AND session_id = %s FOR UPDATE"
)
# The statements both database stores run, in PostgreSQL's placeholders.
ARCHIVED_SESSION = pyformat(shared.ARCHIVED_SESSION)
ARCHIVED_HEAD = pyformat(shared.ARCHIVED_HEAD)
HEAD_ANY = pyformat(shared.HEAD_ANY)
SESSION_STATE = pyformat(shared.SESSION_STATE)
SESSION_LINES = pyformat(shared.SESSION_LINES)
INSERT_ARCHIVED = pyformat(shared.INSERT_ARCHIVED)
DROP_COLD = tuple(map(pyformat, shared.DROP_COLD))
PURGE = tuple(map(pyformat, shared.PURGE))
ARCHIVED_SEGMENT = pyformat(shared.ARCHIVED_SEGMENT)
ARCHIVED_SEGMENT_IDS = pyformat(shared.ARCHIVED_SEGMENT_IDS)
ARCHIVED_LIST = pyformat(shared.ARCHIVED_LIST)
TRASH_LIST = pyformat(shared.TRASH_LIST)
TRASH = pyformat(shared.TRASH)
UNTRASH = pyformat(shared.UNTRASH)
RENAME_SESSION = pyformat(shared.RENAME_SESSION)
UNPIN = pyformat(shared.UNPIN)
PINNED = pyformat(shared.PINNED)
SESSION_TRACES = "SELECT segment_id, line FROM traces WHERE session_id = %s ORDER BY segment_id, n"
INSERT_ARCHIVED_SEGMENT = (
    "INSERT INTO archived_segments (session_id, segment_id, created_at, type, next_seq, items, "
    "base_items, last_ts, lines, trace) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
# Traces go with their segments (foreign key, ON DELETE CASCADE).
DROP_HOT = tuple(
    f"DELETE FROM {table} WHERE session_id = %s" for table in ("search_docs", "entries", "segments")
)
DROP_HEAD = "DELETE FROM contexts WHERE context = %s"
UNARCHIVE_ROW = (
    "SELECT context, type, segment_id, created_at, updated_at FROM archived_contexts "
    "WHERE session_id = %s AND trash_id IS NULL FOR UPDATE"
)
ARCHIVED_SEGMENTS = (
    "SELECT segment_id, created_at, type, next_seq, items, base_items, last_ts, lines, trace "
    "FROM archived_segments WHERE session_id = %s ORDER BY segment_id"
)
# Unread from the header on: the next catch-up indexes the items again.
REFILL_SEGMENT = (
    "INSERT INTO segments (session_id, segment_id, created_at, type, next_seq, items, "
    "base_items, last_ts, indexed_seq, dirty) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, -1, true)"
)
REFILL_ENTRIES = (
    "INSERT INTO entries (session_id, segment_id, seq, kind, ts, line) "
    "SELECT %s, %s, e.seq, e.kind, e.ts, e.line FROM unnest(%b::int[], %b::text[], "
    "%b::text[], %b::text[]) AS e(seq, kind, ts, line)"
)
REFILL_HEAD = (
    "INSERT INTO contexts (context, type, session_id, segment_id, created_at, updated_at, "
    "message_count, last_active) SELECT %s, %s, g.session_id, g.segment_id, %s, %s, "
    "g.base_items + g.items, g.last_ts FROM segments AS g "
    "WHERE g.session_id = %s AND g.segment_id = %s"
)
TRASHED = (
    "SELECT session_id, context, deleted_from FROM archived_contexts WHERE trash_id = %s FOR UPDATE"
)
RETYPE_SEGMENTS = "UPDATE archived_segments SET type = %s WHERE session_id = %s"
PIN = "INSERT INTO pins VALUES (%s, %s) ON CONFLICT DO NOTHING"
IS_PINNED = "SELECT 1 FROM pins WHERE session_id = %s"

Conn = psycopg.Connection[Any]

#: Passes of a trash or purge that finds its context moving between hot and archived.
_PASSES = 3

# ---------------------------------------------------------------------------- state changes


def lock_name(conn: Conn, schema: str, context: str) -> None:
    """Hold the id ``context`` until the transaction ends (creates and archives take turns).

    Not the key of ``lock_context``: a caller holding that lock may create the context.
    """
    conn.execute(LOCK_NAME, (_sql.lock_key(schema, "name", context),))


def name_taken(conn: Conn, context: str) -> bool:
    """Whether an archived context has the id ``context`` (under :func:`lock_name`)."""
    return conn.execute(ARCHIVED_SESSION, (context,)).fetchone() is not None


def archive(conn: Conn, schema: str, context: str, now: str) -> ArchivedContext | None:
    """Move a hot context into the archive; None if there is no hot context of that id."""
    lock_name(conn, schema, context)
    found = conn.execute(HOT_SESSION, (context,)).fetchone()
    if found is None:
        return None
    session = found[0]
    conn.execute(LOCK_SESSION, (session,))
    segments = {row[0]: row for row in conn.execute(LOCK_SEGMENTS, (session,)).fetchall()}
    head = conn.execute(LOCK_HEAD, (context, session)).fetchone()
    if head is None:  # deleted or archived while we waited
        return None
    g, created, updated, type_ = head
    hot, packed = _pack_session(conn, session, segments)
    for statement in DROP_HOT:
        conn.execute(statement, (session,))
    conn.execute(DROP_HEAD, (context,))
    _, _, _, _, items, base, last = segments[g]
    count = int(base + items)
    conn.execute(
        INSERT_ARCHIVED,
        (session, context, type_, g, created, updated, now, last, count, hot, packed),
    )
    pinned = conn.execute(IS_PINNED, (session,)).fetchone() is not None
    return ArchivedContext(context, created[:10], now, last, count, hot, packed, pinned=pinned)


def _pack_session(
    conn: Conn, session: SessionId, segments: dict[SegmentId, tuple[Any, ...]]
) -> tuple[int, int]:
    """Write an ``archived_segments`` row for each of the session's segments; return the
    bytes its log takes hot (as JSONL) and archived."""
    traces = {
        g: [row[1] for row in rows]
        for g, rows in itertools.groupby(
            conn.execute(SESSION_TRACES, (session,)).fetchall(), key=lambda row: row[0]
        )
    }
    lines_of = {
        g: [row[2] for row in rows]
        for g, rows in itertools.groupby(
            conn.execute(SESSION_LINES, (session,)).fetchall(), key=lambda row: row[0]
        )
    }
    hot = packed = 0
    rows: list[tuple[Any, ...]] = []
    for g, (_, created, type_, next_seq, items, base, last) in segments.items():
        lines = lines_of.get(g, [])
        blob = pack(lines)
        trace = pack(traces[g]) if g in traces else None
        hot += jsonl_bytes(lines)
        packed += len(blob) + (len(trace) if trace is not None else 0)
        rows.append((session, g, created, type_, next_seq, items, base, last, blob, trace))
    with conn.cursor() as cursor:
        cursor.executemany(INSERT_ARCHIVED_SEGMENT, rows)
    return hot, packed


def unarchive(conn: Conn, session: SessionId) -> PodMetadata | None:
    """Move an archived session back to the hot tables; its head, or None if it is not
    archived (any more: another writer woke it first)."""
    row = conn.execute(UNARCHIVE_ROW, (session,)).fetchone()
    if row is None:
        return None
    context, type_, head, created, updated = row
    for g, seg_created, seg_type, next_seq, items, base, last, blob, trace in conn.execute(
        ARCHIVED_SEGMENTS, (session,)
    ).fetchall():
        conn.execute(
            REFILL_SEGMENT, (session, g, seg_created, seg_type, next_seq, items, base, last)
        )
        lines = unpack_lines(blob)
        found = envelopes(lines)
        conn.execute(
            REFILL_ENTRIES,
            (
                session,
                g,
                [e.seq for e in found],
                [e.kind for e in found],
                [str(e.ts) for e in found],
                lines,
            ),
        )
        traced = unpack_lines(trace)
        if traced:
            conn.execute(_sql.APPEND_TRACE, (session, g, traced))
    conn.execute(REFILL_HEAD, (context, type_, created, updated, session, head))
    for statement in DROP_COLD:
        conn.execute(statement, (session,))
    return PodMetadata(context, session, head, created, updated)


def trash(conn: Conn, schema: str, context: str, now: str) -> bool:
    """Move a hot or archived context into the trash; False if there is neither.

    A hot one is archived first. An archived one that a writer wakes meanwhile is hot by the
    time its row is locked: then it is archived on the next pass.
    """
    for _ in range(_PASSES):
        came_from = "hot" if archive(conn, schema, context, now) is not None else "archived"
        row = conn.execute(ARCHIVED_SESSION + " FOR UPDATE", (context,)).fetchone()
        if row is not None:
            conn.execute(TRASH, (new_trash_id(), now, came_from, row[0]))
            return True
        if conn.execute(HOT_SESSION, (context,)).fetchone() is None:
            return False
    return False


def restore(conn: Conn, schema: str, trash_id: str, as_context: str | None) -> PodMetadata:
    """Take a context out of the trash, as ``as_context`` if given, in the state it had.

    Raises:
        NotInTrash: no trash entry of that id.
        ContextExists: the id it would take is in use.
    """
    row = conn.execute(TRASHED, (trash_id,)).fetchone()
    if row is None:
        raise NotInTrash(f"nothing in the trash has the id {trash_id!r}")
    session, context, came_from = row
    key = str(ContextId.parse(as_context)) if as_context is not None else context
    lock_name(conn, schema, key)
    if conn.execute(_sql.CONTEXT_SESSION, (key,)).fetchone() or name_taken(conn, key):
        raise ContextExists(f"context {key} already exists")
    type_ = ContextId.parse(key).type
    conn.execute(UNTRASH, (key, type_, session))
    conn.execute(RETYPE_SEGMENTS, (type_, session))
    conn.execute(RENAME_SESSION, (key, session))
    head = unarchive(conn, session) if came_from == "hot" else archived_head(conn, key)
    if head is None:  # cannot be: the row was updated in this transaction
        raise NotInTrash(f"nothing in the trash has the id {trash_id!r}")
    return head


def purge_trashed(conn: Conn, trash_id: str) -> bool:
    """Delete a trash entry for ever; False if there is none of that id."""
    row = conn.execute(TRASHED, (trash_id,)).fetchone()
    if row is None:
        return False
    _purge(conn, row[0])
    return True


def purge_context(conn: Conn, context: str) -> bool:
    """Delete a hot or archived context for ever (its ``sessions`` row too); an archived
    one that a writer wakes meanwhile is found hot on the next pass."""
    for _ in range(_PASSES):
        row = conn.execute(HOT_SESSION, (context,)).fetchone()
        if row is not None:
            params = {"session": row[0], "context": context}
            for statement in _sql.DELETE_SESSION:
                conn.execute(statement, params)
            _purge(conn, row[0])
            return True
        row = conn.execute(ARCHIVED_SESSION + " FOR UPDATE", (context,)).fetchone()
        if row is not None:
            _purge(conn, row[0])
            return True
        if conn.execute(HOT_SESSION, (context,)).fetchone() is None:
            return False
    return False


def _purge(conn: Conn, session: SessionId) -> None:
    for statement in PURGE:
        conn.execute(statement, (session,))


def pin(conn: Conn, context: str, pinned: bool, now: str) -> bool:
    """Pin or unpin a hot or archived context; False if there is none."""
    row = (
        conn.execute(HOT_SESSION, (context,)).fetchone()
        or conn.execute(ARCHIVED_SESSION, (context,)).fetchone()
    )
    if row is None:
        return False
    if pinned:
        conn.execute(PIN, (row[0], now))
    else:
        conn.execute(UNPIN, (row[0],))
    return True


# ---------------------------------------------------------------------------- reads


def archived_head(conn: Conn, context: str) -> PodMetadata | None:
    """The head of an archived context, or None."""
    row = conn.execute(ARCHIVED_HEAD, (context,)).fetchone()
    return None if row is None else PodMetadata(*row)


def session_state(conn: Conn, session: SessionId) -> bool | None:
    """True if the session's context is archived, False if trashed, None if neither."""
    row = conn.execute(SESSION_STATE, (session,)).fetchone()
    return None if row is None else bool(row[0])


def read_segment(
    conn: Conn, session: SessionId, segment: SegmentId, stop_seq: int | None, where: str
) -> SegmentRead | None:
    """Read an archived segment (decompressing it), or None if it is not archived."""
    row = conn.execute(ARCHIVED_SEGMENT.format(columns="g.lines"), (session, segment)).fetchone()
    if row is None:
        return None
    lines = codec.decode_lines(unpack(row[0]), where=where, first_line=0)
    stop = len(lines) if stop_seq is None else max(stop_seq, 0) + 1
    return SegmentRead(header=lines[0], entries=lines[1:stop], next_seq=len(lines))


def next_seq(conn: Conn, session: SessionId, segment: SegmentId) -> int | None:
    """The next seq of an archived segment, or None if it is not archived."""
    found = conn.execute(
        ARCHIVED_SEGMENT.format(columns="g.next_seq"), (session, segment)
    ).fetchone()
    return None if found is None else int(found[0])


def segment_ids(conn: Conn, session: SessionId) -> list[SegmentId]:
    """The segments of an archived session (none if it is not archived)."""
    return [row[0] for row in conn.execute(ARCHIVED_SEGMENT_IDS, (session,))]


def read_trace(conn: Conn, session: SessionId, segment: SegmentId) -> list[Any] | None:
    """The trace of an archived segment, or None if it is not archived."""
    found = conn.execute(ARCHIVED_SEGMENT.format(columns="g.trace"), (session, segment))
    row = found.fetchone()
    if row is None:
        return None
    return [codec.decode(line) for line in unpack_lines(row[0])]


def archived_list(conn: Conn, type: str | None) -> list[ArchivedContext]:
    """Every archived context, optionally of one type, sorted by context id."""
    where, args = ("AND type = %s", (type,)) if type is not None else ("", ())
    rows = conn.execute(ARCHIVED_LIST.format(where=where), args).fetchall()
    found = [
        ArchivedContext(context, date, at, last, count, hot, packed, pinned=bool(is_pinned))
        for context, date, at, last, count, hot, packed, is_pinned in rows
    ]
    return sorted(found, key=lambda a: a.context.partition(":")[::2])


def archived_heads(conn: Conn, contexts: Iterable[str]) -> list[PodMetadata]:
    """The heads of the archived ``contexts`` that exist."""
    heads = (archived_head(conn, context) for context in contexts)
    return [head for head in heads if head is not None]


def trashed_list(conn: Conn) -> list[TrashedContext]:
    """The trash, most recently deleted first."""
    return [
        TrashedContext(
            trash_id=row[0],
            context=row[1],
            date=row[2],
            deleted_at=row[3],
            archived=bool(row[4]),
            message_count=row[5],
            bytes=row[6],
            pinned=bool(row[7]),
        )
        for row in conn.execute(TRASH_LIST).fetchall()
    ]


def pinned(conn: Conn) -> frozenset[str]:
    """The pinned hot and archived contexts."""
    return frozenset(row[0] for row in conn.execute(PINNED))
