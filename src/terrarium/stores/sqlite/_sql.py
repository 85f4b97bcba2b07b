"""The statements of ``SqliteStore``, by name, over the schema its migrations build::

    contexts(context PK, type, session_id, segment_id, created_at, updated_at,
             message_count, last_active)              the heads, with their listing counts
    sessions(session_id PK, context, created_at, state)  context NULL: detached; state: lifecycle's
    segments(id PK, session_id, segment_id, created_at)  UNIQUE (session_id, segment_id)
    entries(id PK, seg, seq, kind, ts, line)          UNIQUE (seg, seq); seg: segments.id
    traces(id, session_id, segment_id, line)          debug traces, oldest first by id
    search_docs(id PK, session_id, segment_id, seq, role, ts, body, tags)   history items
    search_fts, search_recent                         FTS5 over search_docs (see ``search``)
    search_meta(hw, floor, wm)                        how far the derived tables have read
    migrations(name PK, applied_at)
    archived_contexts, archived_segments              frozen sessions (``._lifecycle``)

Ids are UUID strings, times RFC 3339 strings. An entry names its segment by the segment's
integer key (``segments.id``: a few bytes of row and index instead of two 36-character
ids; ``AUTOINCREMENT``, so a key once committed never names another segment). A segment's
header is its entry with seq 0, so reading a segment is one indexed range scan. ``line`` is
the entry's JSON exactly as :func:`terrarium.codec.encode` wrote it (unknown keys and key
order survive); ``kind`` and ``ts`` are copies kept for queries. ``entries.id`` is the arrival
order (an ``INTEGER PRIMARY KEY``, so a ``VACUUM`` keeps it). A few statements are templates:
``{where}`` a filter, ``{table}`` one of the two FTS5 tables, ``{marks}`` one ``?`` per id.
"""

from __future__ import annotations

from terrarium.stores._sqlbase import MAX_SEQ
from terrarium.stores.base import HISTORY_KINDS_SQL

__all__ = ["MAX_SEQ"]

# ---------------------------------------------------------------------------- migrations

CREATE_MIGRATIONS = (
    "CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)"
)
APPLIED = "SELECT name FROM migrations"
RECORD_MIGRATION = "INSERT INTO migrations VALUES (?, ?)"
FORGET_MIGRATION = "DELETE FROM migrations WHERE name = ?"

# ---------------------------------------------------------------------------- heads

HEAD_SEGMENTS = "SELECT session_id, segment_id FROM contexts"
CONTEXT_SESSION = "SELECT session_id FROM contexts WHERE context = ?"
SESSION_CONTEXT = "SELECT context, created_at FROM contexts WHERE session_id = ?"
SESSION_TYPE = "SELECT type FROM contexts WHERE session_id = ?"
INSERT_HEAD = (
    "INSERT INTO contexts (context, type, session_id, segment_id, created_at, updated_at) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
MOVE_HEAD = (
    "UPDATE contexts SET segment_id = ?, updated_at = ?, message_count = ?, last_active = ? "
    "WHERE context = ?"
)
SET_COUNTS = "UPDATE contexts SET message_count = ?, last_active = ? WHERE session_id = ?"
ADD_COUNTS = (
    "UPDATE contexts SET message_count = message_count + ?, last_active = ? "
    "WHERE session_id = ? AND segment_id = ?"
)
# In (type, name) order, as ContextId orders, from the covering index contexts_listing.
LISTING_ORDER = "type, substr(context, length(type) + 2)"
LISTING_SELECT = (
    "SELECT context, substr(created_at, 1, 10), message_count, last_active, created_at, "
    "updated_at, session_id, segment_id FROM contexts"
)
LISTING = LISTING_SELECT + " {where} " + f"ORDER BY {LISTING_ORDER}"
# A page of it is LISTING_SELECT completed by stores._listing.page_statement, from the indexes
# contexts_by_{last_active,created,messages}.
CONTEXT_TYPES = "SELECT DISTINCT type FROM contexts ORDER BY type"
SIGNATURES = (
    "SELECT context, last_active, message_count FROM contexts ORDER BY last_active, context"
)

# ---------------------------------------------------------------------------- sessions, segments

SESSION_EXISTS = "SELECT 1 FROM sessions WHERE session_id = ?"
ATTACH_SESSION = "UPDATE sessions SET context = ? WHERE session_id = ? AND context IS NULL"
# A session's entries that hold history items (its headers, its items), in arrival order.
SESSION_DOC_ENTRIES = (
    "SELECT g.segment_id, e.seq, e.kind, e.ts, e.line FROM segments AS g "
    "JOIN entries AS e ON e.seg = g.id WHERE g.session_id = ? "
    f"AND (e.seq = 0 OR e.kind IN {HISTORY_KINDS_SQL}) ORDER BY e.id"
)
# The new segment's key is the cursor's lastrowid.
INSERT_SEGMENT = "INSERT INTO segments (session_id, segment_id, created_at) VALUES (?, ?, ?)"

# ---------------------------------------------------------------------------- entries

# A segment's key and its last seq (NULL without entries): an append's miss path, one query.
SEGMENT_TAIL = (
    "SELECT id, (SELECT max(seq) FROM entries WHERE seg = g.id) FROM segments AS g "
    "WHERE session_id = ? AND segment_id = ?"
)
NEWEST_ENTRY = "SELECT max(id) FROM entries"
INSERT_ENTRY = "INSERT INTO entries (seg, seq, kind, ts, line) VALUES (?, ?, ?, ?, ?)"
# One entry at a proposed seq of the segment keyed ?1: the whole compare-and-append in one
# statement. The unique key on (seg, seq) refuses a seq that is taken, and the line is NULL,
# which NOT NULL refuses, unless the entry before exists (so no gap, and no entry for a
# deleted segment, whose key no other segment ever takes). (VALUES with a subquery, not INSERT
# ... SELECT: that would copy the SELECT into a temporary table first, because it reads the
# table it inserts into.)
APPEND_ONE = (
    "INSERT INTO entries (seg, seq, kind, ts, line) VALUES (?1, ?2, ?3, ?4, CASE WHEN EXISTS "
    "(SELECT 1 FROM entries WHERE seg = ?1 AND seq = ?2 - 1) THEN ?5 END)"
)
# The key of the segment, found once per statement (an uncorrelated subquery).
_KEY = "(SELECT id FROM segments WHERE session_id = :session AND segment_id = :segment)"
READ_SEGMENT = (
    f"SELECT line, (SELECT max(seq) FROM entries WHERE seg = {_KEY}) FROM entries "
    f"WHERE seg = {_KEY} AND seq <= :stop ORDER BY seq"
)
# The entries the derived tables have not read yet, in arrival order (by id: a GROUP BY would
# have SQLite walk the whole (seg, seq) index instead), with their segments' ids.
_ENTRIES_AFTER = (
    "{id}g.session_id, g.segment_id, e.seq, e.kind, e.ts, e.line FROM entries AS e "
    "CROSS JOIN segments AS g ON g.id = e.seg WHERE e.id > ? ORDER BY e.id"
)
ENTRIES_AFTER = "SELECT " + _ENTRIES_AFTER.format(id="")
# The same with their ids, all of them or the oldest ``?2``: the catch-up, in slices.
ENTRIES_AFTER_IDS = "SELECT " + _ENTRIES_AFTER.format(id="e.id, ")
ENTRIES_SLICE = f"{ENTRIES_AFTER_IDS} LIMIT ?"
INSERT_TRACE = "INSERT INTO traces (session_id, segment_id, line) VALUES (?, ?, ?)"
READ_TRACE = "SELECT line FROM traces WHERE session_id = ? AND segment_id = ? ORDER BY id"

# ---------------------------------------------------------------------------- listing counts

# A header's history length if it has a history list, else its origin (kind, parent, at_seq)
# as a JSON array: the usual header (a root with an empty history) is parsed once.
_HEADER_FIELDS = (
    "json_array_length(h.line, '$.history'), "
    "CASE WHEN json_type(h.line, '$.history') IS NOT 'array' THEN json_extract(h.line, "
    "'$.history', '$.origin.kind', '$.origin.parent', '$.origin.at_seq') END"
)
# Of one segment up to seq ?3: its history items among the entries, its last entry's time and
# its header's history (see _HEADER_FIELDS).
SEGMENT_PREFIX = (
    "SELECT (SELECT count(*) FROM entries e WHERE e.seg = g.id "
    f"AND e.seq BETWEEN 1 AND ?3 AND e.kind IN {HISTORY_KINDS_SQL}), "
    "(SELECT e.ts FROM entries e WHERE e.seg = g.id "
    f"AND e.seq <= ?3 ORDER BY e.seq DESC LIMIT 1), {_HEADER_FIELDS} "
    "FROM segments g JOIN entries h ON h.seg = g.id AND h.seq = 0 "
    "WHERE g.session_id = ?1 AND g.segment_id = ?2"
)

# ---------------------------------------------------------------------------- derived state

PENDING = "SELECT wm, (SELECT max(id) FROM entries) FROM search_meta"
# The same; whether search_recent lacks some of the newest ?1 items (search.refill_recent);
# whether items are staged (search.index_staged).
PENDING_WORK = (
    "SELECT wm, (SELECT max(id) FROM entries), floor > max(1, hw - ?1 + 1), "
    "coalesce((SELECT max(id) FROM search_docs), 0) > hw FROM search_meta"
)

META = "SELECT wm, hw, floor FROM search_meta"
SET_WM = "UPDATE search_meta SET wm = ?"
FLOOR = "SELECT floor FROM search_meta"
SET_WINDOWS = "UPDATE search_meta SET hw = ?, floor = ?"
RESET_META = "UPDATE search_meta SET wm = 0, hw = 0, floor = 1"
# After a delete: ids of the newest entries may be handed out again, so the derived tables
# must not count them as read (they read what is above ``wm``).
LOWER_WM = "UPDATE search_meta SET wm = min(wm, (SELECT coalesce(max(id), 0) FROM entries))"
INSERT_DOC = (
    "INSERT INTO search_docs (id, session_id, segment_id, seq, role, ts, body, tags) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
# Staged items: in search_docs past hw, in neither FTS5 table yet (search.index_staged).
NEWEST_DOC = "SELECT max(id) FROM search_docs"
NEXT_DOC = "SELECT max(hw, coalesce((SELECT max(id) FROM search_docs), 0)) + 1 FROM search_meta"
STAGED_DOCS = (
    "SELECT session_id, segment_id, seq, role, ts, body FROM search_docs "
    "WHERE id > (SELECT hw FROM search_meta) ORDER BY id"
)
DELETE_STAGED_OF = (
    "DELETE FROM search_docs WHERE id > (SELECT hw FROM search_meta) AND session_id = ?"
)
DELETE_DOCS = "DELETE FROM search_docs"
DELETE_DOCS_IN = "DELETE FROM search_docs WHERE id IN (SELECT value FROM json_each(?))"
FTS_TABLES = ("search_fts", "search_recent")
FTS_ADD_RANGE = (
    "INSERT INTO {table} (rowid, body, tags) SELECT id, body, tags FROM search_docs "
    "WHERE id >= ? AND id < ?"
)
# Up to ? pages of FTS5's incremental merge, in levels that hold several segments.
FTS_MERGE = "INSERT INTO {table} ({table}, rank) VALUES ('merge', ?)"
CHECKPOINT = "PRAGMA wal_checkpoint(PASSIVE)"
# SQLite's automatic checkpoint runs in the commit that takes the WAL past this many pages.
# The upkeep thread's connection keeps SQLite's 1000, so its commits run it; the store's own
# connections, which append, only past 4000 (16 MB of WAL): a bound should the thread not run.
AUTOCHECKPOINT = 4000
AUTOCHECKPOINT_UPKEEP = 1000
FTS_DELETE_ALL = "INSERT INTO {table} ({table}) VALUES ('delete-all')"
# External content: FTS5 needs the old values to remove an item's tokens.
FTS_DELETE_IN = (
    "INSERT INTO {table} ({table}, rowid, body, tags) SELECT 'delete', id, body, tags "
    "FROM search_docs WHERE id IN (SELECT value FROM json_each(?)) AND id >= ?"
)

# ---------------------------------------------------------------------------- search

FTS_IDS = "SELECT rowid FROM search_fts WHERE search_fts MATCH ?"
FTS_COUNT = "SELECT count(*) FROM search_fts WHERE search_fts MATCH ?"
SEARCH_RANGE = "SELECT hw, floor, (SELECT min(id) FROM search_docs) FROM search_meta"
# CROSS JOIN: FTS5 gets one rowid at a time, never the whole match.
SNIPPETS = (
    "SELECT f.rowid, snippet({table}, 0, ?, ?, ?, ?) FROM json_each(?) AS j "
    "CROSS JOIN {table} AS f WHERE f.rowid = j.value AND {table} MATCH ?"
)
# The hits whose body is too long for FTS5's snippet() (see fts.LONG_BODY).
LONG_BODIES = (
    "SELECT id, body FROM search_docs WHERE id IN (SELECT value FROM json_each(?)) "
    "AND length(body) > ?"
)
HIT_ROWS = (
    "SELECT d.id, c.context, c.created_at, d.session_id, d.segment_id, d.seq, d.role, "
    "d.ts FROM search_docs d JOIN contexts c ON c.session_id = d.session_id "
    "WHERE d.id IN ({marks})"
)
