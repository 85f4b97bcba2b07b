"""The statements of ``SqliteStore``, by name, over the schema of :mod:`.migrations`.

An entry names its segment by the segment's key (``segments.id``); its header is its entry
with seq 0, so reading a segment is one indexed range scan. ``line`` is the entry's JSON as
:func:`terrarium.codec.encode` wrote it; ``kind`` and ``ts`` are copies kept for queries.
"""

from __future__ import annotations

# ---------------------------------------------------------------------------- migrations

CREATE_MIGRATIONS = (
    "CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)"
)
APPLIED = "SELECT name FROM migrations"
RECORD_MIGRATION = "INSERT INTO migrations VALUES (?, ?)"
FORGET_MIGRATION = "DELETE FROM migrations WHERE name = ?"
FOREIGN_TABLES = (
    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%' AND NOT "
    "EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'migrations') ORDER BY name LIMIT 3"
)

# ---------------------------------------------------------------------------- change cursor

# Whether the database keeps the change cursor (not those of development builds before it).
HAS_CHANGES = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'changes'"
# The newest entry id ever handed out, and the newest head change.
CHANGES_TOP = (
    "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'entries'), 0), "
    "coalesce((SELECT max(id) FROM changes), 0)"
)
# The sessions of the entries past ?1 and of the head changes past ?2.
CHANGES_AFTER = (
    "SELECT g.session_id FROM entries AS e CROSS JOIN segments AS g ON g.id = e.seg "
    "WHERE e.id > ?1 UNION SELECT session_id FROM changes WHERE id > ?2"
)

# ---------------------------------------------------------------------------- sessions, segments

# The new segment's key is the cursor's lastrowid.
INSERT_SEGMENT = "INSERT INTO segments (session_id, segment_id, created_at) VALUES (?, ?, ?)"

# ---------------------------------------------------------------------------- entries

# A segment's key and its last seq (NULL without entries): an append's miss path, one query.
SEGMENT_TAIL = (
    "SELECT id, (SELECT max(seq) FROM entries WHERE seg = g.id) FROM segments AS g "
    "WHERE session_id = ? AND segment_id = ?"
)
INSERT_ENTRY = "INSERT INTO entries (seg, seq, kind, ts, line) VALUES (?, ?, ?, ?, ?)"
# One entry at a proposed seq of the segment keyed ?1: the whole compare-and-append. UNIQUE
# (seg, seq) refuses a taken seq, and NOT NULL a line whose entry before is missing (a gap, or
# a deleted segment). VALUES with a subquery: INSERT ... SELECT would copy the SELECT into a
# temporary table first, as it reads the table it inserts into.
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
# Reads of many segments (a JSON array of [session, segment, seq]) and many sessions' heads
# with their tails (a JSON array of ids), one statement each (SqlStore.entries_from,
# SqlStore.live_sessions).
ENTRIES_FROM = (
    "SELECT r.key, e.line FROM json_each(?) AS r JOIN segments AS g "
    "ON g.session_id = json_extract(r.value, '$[0]') "
    "AND g.segment_id = json_extract(r.value, '$[1]') "
    "JOIN entries AS e ON e.seg = g.id AND e.seq >= json_extract(r.value, '$[2]') "
    "ORDER BY r.key, e.seq"
)
LIVE_SESSIONS = (
    "SELECT c.context, c.session_id, c.segment_id, c.created_at, c.updated_at, g.segment_id, "
    "(SELECT max(seq) + 1 FROM entries WHERE seg = g.id) FROM contexts AS c "
    "LEFT JOIN segments AS g ON g.session_id = c.session_id "
    "WHERE c.session_id IN (SELECT value FROM json_each(?))"
)
INSERT_TRACE = "INSERT INTO traces (session_id, segment_id, line) VALUES (?, ?, ?)"
READ_TRACE = "SELECT line FROM traces WHERE session_id = ? AND segment_id = ? ORDER BY id"

# ---------------------------------------------------------------------------- frozen sessions

# What a freeze reads of a session (SqlStore._freeze_rows): its segments with their next seq,
# and its lines and traces; entries name their segment by its key.
SESSION_SEGMENTS = (
    "SELECT segment_id, created_at, (SELECT max(seq) + 1 FROM entries WHERE seg = g.id) "
    "FROM segments AS g WHERE session_id = ?"
)
SESSION_LINES = (
    "SELECT g.segment_id, e.seq, e.line FROM segments AS g JOIN entries AS e ON e.seg = g.id "
    "WHERE g.session_id = ? ORDER BY g.segment_id, e.seq"
)
SESSION_TRACES = "SELECT segment_id, line FROM traces WHERE session_id = ? ORDER BY segment_id, id"
# A session's hot rows, dropped by a freeze and by the delete of a detached session.
DROP_HOT = (
    "DELETE FROM entries WHERE seg IN (SELECT id FROM segments WHERE session_id = ?)",
    "DELETE FROM traces WHERE session_id = ?",
    "DELETE FROM segments WHERE session_id = ?",
    "DELETE FROM contexts WHERE session_id = ?",
)

# SQLite's automatic checkpoint runs in the commit that takes the WAL past this many pages
# (16 MB): one in several thousand appends pays for it, and the append p99.9 stayed within a
# bare INSERT's (benchmarks/bench_targets.py --only append, 1k and 10k history).
AUTOCHECKPOINT = 4000
