"""``SqliteStore``'s lifecycle: archive, trash, restore, purge and pins, one transaction each.

The tables (migration ``m007_lifecycle``)::

    archived_contexts(session_id PK, context, type, segment_id, created_at, updated_at,
                      archived_at, last_active, message_count, hot_bytes, archived_bytes,
                      trash_id UNIQUE, deleted_at, deleted_from)
    archived_segments(session_id, segment_id, created_at, next_seq, lines, trace)
                                                      PK (session_id, segment_id)
    pins(session_id PK, pinned_at)

An archived context is a row of ``archived_contexts`` (``trash_id`` NULL) holding its head and
what :class:`~terrarium.stores.base.ArchivedContext` shows, and one ``archived_segments`` row
per segment: its lines, and its trace, each one zstandard frame (:mod:`terrarium.stores._archive`).
Its ``contexts`` row, entries, traces, segments, search items and listing counts are gone from
the hot tables; its ``sessions`` row stays (blob references point at it until a purge). A
trashed context is stored the same way, with ``trash_id`` and ``deleted_at`` set and
``deleted_from`` the state a restore gives back (``hot`` or ``archived``): deleting a hot
context archives it first. Pins are keyed by session, so a pin follows its context through
archive, trash and a restore under another id, and goes with a purge.

Every function runs in the caller's write transaction (``BEGIN IMMEDIATE``), so each change of
state is atomic: a crash leaves the old state or the new, never both or neither.

Usage (in the store's write transaction, after a catch-up of the derived state)::

    archived = archive(conn, "cli:main", utc_now())
    head, top = unarchive(conn, session_id)
"""

from __future__ import annotations

import itertools
import sqlite3
import uuid
from collections.abc import Iterable
from typing import Any

from terrarium import codec
from terrarium.errors import ContextExists, NotInTrash
from terrarium.model import HISTORY_KINDS, ContextId
from terrarium.stores._archive import (
    ARCHIVED_HEAD,
    ARCHIVED_LIST,
    ARCHIVED_SEGMENT,
    ARCHIVED_SEGMENT_IDS,
    ARCHIVED_SESSION,
    DROP_COLD,
    INSERT_ARCHIVED,
    PINNED,
    PURGE,
    RENAME_SESSION,
    SESSION_STATE,
    TRASH,
    TRASH_LIST,
    UNPIN,
    UNTRASH,
    envelopes,
    jsonl_bytes,
    new_trash_id,
    pack,
    unpack,
    unpack_lines,
)
from terrarium.stores.base import ArchivedContext, PodMetadata, SegmentRead, TrashedContext
from terrarium.stores.sqlite import _sql as sql
from terrarium.stores.sqlite.search import segment_summary, unindex_session

# ---------------------------------------------------------------------------- statements

HOT_HEAD = (
    "SELECT session_id, segment_id, created_at, updated_at, type, message_count, last_active "
    "FROM contexts WHERE context = ?"
)
SESSION_TRACES = "SELECT segment_id, line FROM traces WHERE session_id = ? ORDER BY segment_id, id"
SESSION_SEGMENTS = "SELECT segment_id, created_at FROM segments WHERE session_id = ?"
# The session's lines by segment, as ``stores._archive.SESSION_LINES`` reads PostgreSQL's:
# SQLite's entries name their segment by its key (m013).
SESSION_LINES = (
    "SELECT g.segment_id, e.seq, e.line FROM segments AS g JOIN entries AS e ON e.seg = g.id "
    "WHERE g.session_id = ? ORDER BY g.segment_id, e.seq"
)
INSERT_ARCHIVED_SEGMENT = "INSERT INTO archived_segments VALUES (?, ?, ?, ?, ?, ?)"
DROP_HOT = (
    "DELETE FROM entries WHERE seg IN (SELECT id FROM segments WHERE session_id = ?)",
    "DELETE FROM traces WHERE session_id = ?",
    "DELETE FROM segments WHERE session_id = ?",
)
UNARCHIVE_ROW = (
    "SELECT context, type, segment_id, created_at, updated_at FROM archived_contexts "
    "WHERE session_id = ? AND trash_id IS NULL"
)
ARCHIVED_SEGMENTS = (
    "SELECT segment_id, created_at, lines, trace FROM archived_segments WHERE session_id = ? "
    "ORDER BY segment_id"
)
TRASHED = "SELECT session_id, context, deleted_from FROM archived_contexts WHERE trash_id = ?"
PIN = "INSERT OR IGNORE INTO pins VALUES (?, ?)"

# ---------------------------------------------------------------------------- state changes


def archive(conn: sqlite3.Connection, context: str, now: str) -> ArchivedContext | None:
    """Move a hot context into the archive; None if there is no hot context of that id.

    The caller has caught the derived state up, so the head's listing counts are exact.
    """
    row = conn.execute(HOT_HEAD, (context,)).fetchone()
    if row is None:
        return None
    s, g, created, updated, type_, count, last = row
    hot, packed = _pack_session(conn, s)
    unindex_session(conn, s)
    for statement in DROP_HOT:
        conn.execute(statement, (s,))
    conn.execute(sql.DELETE_HEAD, (context,))
    conn.execute(sql.LOWER_WM)
    conn.execute(
        INSERT_ARCHIVED, (s, context, type_, g, created, updated, now, last, count, hot, packed)
    )
    return ArchivedContext(
        context, created[:10], now, last, count, hot, packed, pinned=_is_pinned(conn, s)
    )


def _pack_session(conn: sqlite3.Connection, session: str) -> tuple[int, int]:
    """Write an ``archived_segments`` row for each of the session's segments; return the
    bytes its log takes hot (as JSONL) and archived."""
    created = dict(conn.execute(SESSION_SEGMENTS, (session,)).fetchall())
    traces = {
        g: [row[1] for row in rows]
        for g, rows in itertools.groupby(
            conn.execute(SESSION_TRACES, (session,)), key=lambda row: row[0]
        )
    }
    hot = packed = 0
    rows: list[tuple[Any, ...]] = []
    for g, found in itertools.groupby(
        conn.execute(SESSION_LINES, (session,)), key=lambda row: row[0]
    ):
        entries = list(found)
        lines = [row[2] for row in entries]
        blob = pack(lines)
        trace = pack(traces[g]) if g in traces else None
        hot += jsonl_bytes(lines)
        packed += len(blob) + (len(trace) if trace is not None else 0)
        rows.append((session, g, created.get(g, ""), entries[-1][1] + 1, blob, trace))
    conn.executemany(INSERT_ARCHIVED_SEGMENT, rows)
    return hot, packed


def unarchive(conn: sqlite3.Connection, session: str) -> tuple[PodMetadata, int]:
    """Move an archived session back to the hot tables; return its head and the newest entry
    id.

    The entries go back with new arrival ids, past the derived state's watermark, so the next
    catch-up (before any search, listing or head move, or once ``SEARCH_BATCH`` entries wait)
    indexes their items and adds the head segment's to the head's listing count, as for
    appended entries: a resume pays for the rows, not for the index. The head starts with
    the items its header (or a fork's prefix) gives: a restore's count less its own items.
    Its segments get new keys (``segments.id``): a key a store cached for one of them before
    it was archived names no segment now, so an append by it fails its check and looks again.
    """
    context, type_, head, created, updated = conn.execute(UNARCHIVE_ROW, (session,)).fetchone()
    own = 0
    for g, seg_created, blob, trace in conn.execute(ARCHIVED_SEGMENTS, (session,)).fetchall():
        lines = unpack_lines(blob)
        found = envelopes(lines)
        if g == head:
            own = sum(1 for e in found if e.seq > 0 and e.kind in HISTORY_KINDS)
        seg = conn.execute(sql.INSERT_SEGMENT, (session, g, seg_created)).lastrowid
        conn.executemany(
            sql.INSERT_ENTRY,
            [(seg, e.seq, e.kind, str(e.ts), line) for e, line in zip(found, lines, strict=True)],
        )
        conn.executemany(sql.INSERT_TRACE, [(session, g, t) for t in unpack_lines(trace)])
    conn.execute(sql.INSERT_HEAD, (context, type_, session, head, created, updated))
    count, _ = segment_summary(conn, session, head)
    conn.execute(sql.SET_COUNTS, (count - own, "", session))
    for statement in DROP_COLD:
        conn.execute(statement, (session,))
    (top,) = conn.execute(sql.NEWEST_ENTRY).fetchone()
    return PodMetadata(context, uuid.UUID(session), uuid.UUID(head), created, updated), int(top)


def trash(conn: sqlite3.Connection, context: str, now: str) -> bool:
    """Move a hot or archived context into the trash; False if there is neither.

    A hot one is archived first (the caller has caught the derived state up).
    """
    if archive(conn, context, now) is not None:
        came_from = "hot"
    else:
        came_from = "archived"
    row = conn.execute(ARCHIVED_SESSION, (context,)).fetchone()
    if row is None:
        return False
    conn.execute(TRASH, (new_trash_id(), now, came_from, row[0]))
    return True


def restore(
    conn: sqlite3.Connection, trash_id: str, as_context: str | None
) -> tuple[str, str, PodMetadata | None]:
    """Take a context out of the trash, as ``as_context`` if given, into the archive.

    Returns:
        Its session, its id, and its head if it is to stay archived (None: it came from the
        hot store, and the caller unarchives it).

    Raises:
        NotInTrash: no trash entry of that id.
        ContextExists: the id it would take is in use.
    """
    row = conn.execute(TRASHED, (trash_id,)).fetchone()
    if row is None:
        raise NotInTrash(f"nothing in the trash has the id {trash_id!r}")
    session, context, came_from = row
    key = str(ContextId.parse(as_context)) if as_context is not None else context
    if (
        conn.execute(sql.CONTEXT_EXISTS, (key,)).fetchone()
        or conn.execute(ARCHIVED_SESSION, (key,)).fetchone()
    ):
        raise ContextExists(f"context {key} already exists")
    conn.execute(UNTRASH, (key, ContextId.parse(key).type, session))
    conn.execute(RENAME_SESSION, (key, session))
    if came_from == "hot":
        return session, key, None
    return session, key, archived_head(conn, key)


def purge_trashed(conn: sqlite3.Connection, trash_id: str) -> bool:
    """Delete a trash entry for ever; False if there is none of that id."""
    row = conn.execute(TRASHED, (trash_id,)).fetchone()
    if row is None:
        return False
    _purge(conn, row[0])
    return True


def purge_context(conn: sqlite3.Connection, context: str) -> bool:
    """Delete a hot or archived context for ever (its ``sessions`` row too)."""
    row = conn.execute(sql.CONTEXT_SESSION, (context,)).fetchone()
    if row is not None:
        unindex_session(conn, row[0])
        for statement in DROP_HOT:
            conn.execute(statement, row)
        conn.execute(sql.DELETE_HEAD, (context,))
        conn.execute(sql.LOWER_WM)
    else:
        row = conn.execute(ARCHIVED_SESSION, (context,)).fetchone()
        if row is None:
            return False
    _purge(conn, row[0])
    return True


def _purge(conn: sqlite3.Connection, session: str) -> None:
    for statement in PURGE:
        conn.execute(statement, (session,))


def pin(conn: sqlite3.Connection, context: str, pinned: bool, now: str) -> bool:
    """Pin or unpin a hot or archived context; False if there is none."""
    row = (
        conn.execute(sql.CONTEXT_SESSION, (context,)).fetchone()
        or conn.execute(ARCHIVED_SESSION, (context,)).fetchone()
    )
    if row is None:
        return False
    if pinned:
        conn.execute(PIN, (row[0], now))
    else:
        conn.execute(UNPIN, row)
    return True


# ---------------------------------------------------------------------------- reads


def archived_head(conn: sqlite3.Connection, context: str) -> PodMetadata | None:
    """The head of an archived context, or None."""
    row = conn.execute(ARCHIVED_HEAD, (context,)).fetchone()
    if row is None:
        return None
    return PodMetadata(row[0], uuid.UUID(row[1]), uuid.UUID(row[2]), row[3], row[4])


def session_state(conn: sqlite3.Connection, session: str) -> bool | None:
    """True if the session's context is archived, False if trashed, None if neither."""
    row = conn.execute(SESSION_STATE, (session,)).fetchone()
    return None if row is None else bool(row[0])


def read_segment(
    conn: sqlite3.Connection, session: str, segment: str, stop_seq: int | None, where: str
) -> SegmentRead | None:
    """Read an archived segment (decompressing it), or None if it is not archived."""
    row = conn.execute(ARCHIVED_SEGMENT.format(columns="g.lines"), (session, segment)).fetchone()
    if row is None:
        return None
    lines = codec.decode_lines(unpack(row[0]), where=where, first_line=0)
    stop = len(lines) if stop_seq is None else max(stop_seq, 0) + 1
    return SegmentRead(header=lines[0], entries=lines[1:stop], next_seq=len(lines))


def next_seq(conn: sqlite3.Connection, session: str, segment: str) -> int | None:
    """The next seq of an archived segment, or None if it is not archived."""
    row = conn.execute(ARCHIVED_SEGMENT.format(columns="g.next_seq"), (session, segment))
    found = row.fetchone()
    return None if found is None else int(found[0])


def segment_ids(conn: sqlite3.Connection, session: str) -> list[uuid.UUID]:
    """The segments of an archived session (none if it is not archived)."""
    return [uuid.UUID(row[0]) for row in conn.execute(ARCHIVED_SEGMENT_IDS, (session,))]


def read_trace(conn: sqlite3.Connection, session: str, segment: str) -> list[Any] | None:
    """The trace of an archived segment, or None if it is not archived."""
    row = conn.execute(ARCHIVED_SEGMENT.format(columns="g.trace"), (session, segment))
    found = row.fetchone()
    if found is None:
        return None
    return [codec.decode(line) for line in unpack_lines(found[0])]


def archived_list(conn: sqlite3.Connection, type: str | None) -> list[ArchivedContext]:
    """Every archived context, optionally of one type, sorted by context id."""
    where, args = ("AND type = ?", (type,)) if type is not None else ("", ())
    rows = conn.execute(ARCHIVED_LIST.format(where=where), args).fetchall()
    found = [_archived(row) for row in rows]
    return sorted(found, key=lambda a: a.context.partition(":")[::2])


def archived_heads(conn: sqlite3.Connection, contexts: Iterable[str]) -> list[PodMetadata]:
    """The heads of the archived ``contexts`` that exist."""
    heads = (archived_head(conn, context) for context in contexts)
    return [head for head in heads if head is not None]


def trashed_list(conn: sqlite3.Connection) -> list[TrashedContext]:
    """The trash, most recently deleted first."""
    rows = conn.execute(TRASH_LIST).fetchall()
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
        for row in rows
    ]


def pinned(conn: sqlite3.Connection) -> frozenset[str]:
    """The pinned hot and archived contexts."""
    return frozenset(row[0] for row in conn.execute(PINNED))


def _archived(row: tuple[Any, ...]) -> ArchivedContext:
    """An ``ARCHIVED_LIST`` row as an ArchivedContext."""
    context, date, archived_at, last_active, count, hot, packed, is_pinned = row
    return ArchivedContext(
        context, date, archived_at, last_active, count, hot, packed, pinned=bool(is_pinned)
    )


def _is_pinned(conn: sqlite3.Connection, session: str) -> bool:
    return (
        conn.execute("SELECT 1 FROM pins WHERE session_id = ?", (session,)).fetchone() is not None
    )
