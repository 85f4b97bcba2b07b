"""The statements of the derived search and listing index (:mod:`terrarium.index`), by name.

The schema is created whole when the database's ``user_version`` is not ``SCHEMA_VERSION``
(an index is derived: one of another version is dropped and rebuilt, never migrated). A few
statements are templates: ``{table}`` one of ``FTS_TABLES``, ``{marks}`` one ``?`` per id,
``{name}`` a name read from ``sqlite_master``.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Bump when the schema changes: an index of another version is dropped and rebuilt.
SCHEMA_VERSION = 4

# An index per order a listing page walks (``Listing``; ties by context id); the first
# also covers the signatures, three narrow columns where the listing's index is eleven wide.
# Added in version 4's lifetime: an index without them gets them when next opened for writing,
# rather than being rebuilt from the files.
LISTING_INDEXES = [
    f"CREATE INDEX IF NOT EXISTS {name} ON sessions({columns})"
    for name, columns in (
        ("sessions_by_last_active", "last_active, context, message_count"),
        ("sessions_by_created", "created_at, context"),
        ("sessions_by_messages", "message_count, context"),
    )
]

# ---------------------------------------------------------------------------- schema

SCHEMA = [
    """CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)""",
    """CREATE TABLE types(id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE)""",
    """CREATE TABLE sessions(
        id INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL UNIQUE,
        context TEXT NOT NULL,
        type TEXT NOT NULL,
        name TEXT NOT NULL,
        tid INTEGER NOT NULL,
        date TEXT NOT NULL,
        folder TEXT NOT NULL,
        head TEXT NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        message_count INTEGER NOT NULL DEFAULT 0,
        last_active TEXT NOT NULL,
        watch_until REAL,
        head_problem TEXT,
        problem TEXT)""",
    # Covers the listing query: 100k rows are read in index order without a table lookup each.
    """CREATE INDEX sessions_by_context ON sessions(type, name, context, date, message_count,
        last_active, created_at, updated_at, session_id, head, problem)""",
    """CREATE INDEX sessions_watched ON sessions(watch_until) WHERE watch_until IS NOT NULL""",
    *LISTING_INDEXES,
    """CREATE TABLE segments(
        id INTEGER PRIMARY KEY,
        session INTEGER NOT NULL,
        segment_id TEXT NOT NULL UNIQUE,
        ino INTEGER NOT NULL,
        size_seen INTEGER NOT NULL,
        offset INTEGER NOT NULL,
        next_seq INTEGER NOT NULL,
        items INTEGER NOT NULL,
        continues INTEGER NOT NULL,
        parent TEXT,
        at_seq INTEGER,
        last_ts TEXT,
        problem TEXT)""",
    """CREATE INDEX segments_by_session ON segments(session)""",
    # Every history item, with its text as indexed (see prepare_text). ``tags`` is what the
    # filters match: s<session row> r<role> t<type row>, one token each.
    """CREATE TABLE docs(
        id INTEGER PRIMARY KEY,
        segment INTEGER NOT NULL,
        session INTEGER NOT NULL,
        tid INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        role TEXT NOT NULL,
        ts TEXT NOT NULL,
        body TEXT NOT NULL,
        tags TEXT GENERATED ALWAYS AS ('s' || session || ' r' || role || ' t' || tid) VIRTUAL)""",
    """CREATE INDEX docs_by_segment ON docs(segment, seq)""",
    # Each FTS5 table's content is a view of exactly the rows it indexes, so that FTS5's
    # 'rebuild' and 'integrity-check' mean what they say.
    """CREATE TABLE recent(floor INTEGER NOT NULL)""",
    """INSERT INTO recent VALUES (1)""",
    """CREATE VIEW texts AS SELECT id, body, tags FROM docs WHERE body != ''""",
    """CREATE VIEW recent_texts AS SELECT id, body, tags FROM docs
        WHERE body != '' AND id >= (SELECT floor FROM recent)""",
    """CREATE VIRTUAL TABLE fts USING fts5(body, tags, content='texts', content_rowid='id',
        tokenize='unicode61 remove_diacritics 2')""",
    """CREATE VIRTUAL TABLE fts_recent USING fts5(body, tags, content='recent_texts',
        content_rowid='id', tokenize='unicode61 remove_diacritics 2')""",
]

USER_VERSION = "PRAGMA user_version"
SET_USER_VERSION = f"PRAGMA user_version={SCHEMA_VERSION}"
# Reading a table fails at open, not at first use, on a file that is not an index.
PROBE = "SELECT count(*) FROM meta"
# What a rebuild of another version drops: the views, then the tables but SQLite's own,
# virtual ones first (? = 1: dropping one drops its shadow tables), then the rest (? = 0).
VIEWS = "SELECT name FROM sqlite_master WHERE type = 'view'"
TABLES = (
    "SELECT name FROM sqlite_master WHERE type = 'table' "
    "AND name NOT LIKE 'sqlite%' AND (sql LIKE 'CREATE VIRTUAL%') = ?"
)
DROP_VIEW = 'DROP VIEW IF EXISTS "{name}"'
DROP_TABLE = 'DROP TABLE IF EXISTS "{name}"'

# ---------------------------------------------------------------------------- connection

# The writer's only: a commit survives the process, not always the machine (the index is
# derived: what a crash loses is read again from the files).
SYNCHRONOUS = "PRAGMA synchronous=NORMAL"
#: Every connection's: temporary b-trees in memory, a 32 MB page cache.
PRAGMAS = ("PRAGMA temp_store=MEMORY", "PRAGMA cache_size=-32000")
# A deferred transaction: the reads of one search or listing see one snapshot.
BEGIN = "BEGIN"
COMMIT = "COMMIT"
CHECKPOINT = "PRAGMA wal_checkpoint(TRUNCATE)"

# ---------------------------------------------------------------------------- meta

BUILT = "SELECT 1 FROM meta WHERE key = 'built'"
SET_BUILT = "INSERT OR REPLACE INTO meta VALUES ('built', ?)"
SHAPE = "SELECT value FROM meta WHERE key = 'shape'"
SET_SHAPE = "INSERT OR REPLACE INTO meta VALUES ('shape', ?)"
CURSOR = "SELECT value FROM meta WHERE key = 'cursor'"
SET_CURSOR = "INSERT OR REPLACE INTO meta VALUES ('cursor', ?)"
RECENT_COUNT = "SELECT value FROM meta WHERE key = 'recent_count'"
SET_RECENT_COUNT = "INSERT OR REPLACE INTO meta VALUES ('recent_count', ?)"
#: What a rebuild empties, after ``FTS_DELETE_ALL`` of each FTS table.
CLEAR = tuple(f"DELETE FROM {table}" for table in ("docs", "segments", "sessions", "types", "meta"))
RESET_RECENT_FLOOR = "UPDATE recent SET floor = 1"

# ---------------------------------------------------------------------------- sessions

#: The ``sessions`` columns a head decides, in the order ``IndexUpdate`` keeps them.
HEAD_COLUMNS = "context, type, name, tid, date, folder, head, created_at, updated_at, head_problem"
SESSIONS = f"SELECT id, {HEAD_COLUMNS}, session_id FROM sessions"
SESSION = f"SELECT id, {HEAD_COLUMNS} FROM sessions WHERE session_id = ?"
SESSION_IDS = "SELECT session_id FROM sessions"
SESSION_FOLDERS = "SELECT session_id, folder FROM sessions"
COUNT_SESSIONS = "SELECT count(*) FROM sessions"
SESSION_FOLDER = "SELECT folder FROM sessions WHERE session_id = ?"
# The other session rows that claim a context (they may be stale).
CLAIMANTS = "SELECT session_id FROM sessions WHERE type = ? AND name = ? AND id != ?"
INSERT_SESSION = (
    f"INSERT INTO sessions({HEAD_COLUMNS}, last_active, session_id) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
)
UPDATE_SESSION_HEAD = (
    "UPDATE sessions SET context=?, type=?, name=?, tid=?, date=?, folder=?, head=?, "
    "created_at=?, updated_at=?, head_problem=? WHERE id = ?"
)
SESSION_HEAD = "SELECT head, folder FROM sessions WHERE id = ?"
# The last activity stays what it was while the head segment has no entry (NULL).
SET_SUMMARY = (
    "UPDATE sessions SET message_count = ?, last_active = coalesce(?, last_active), "
    "problem = ? WHERE id = ?"
)
DELETE_SESSION = "DELETE FROM sessions WHERE id = ?"
TYPES = "SELECT id, name FROM types"
INSERT_TYPE = "INSERT INTO types(name) VALUES (?)"

# ---------------------------------------------------------------------------- watches

WATCHED = "SELECT session_id, watch_until FROM sessions WHERE watch_until IS NOT NULL"
WATCHED_IDS = "SELECT session_id FROM sessions WHERE watch_until IS NOT NULL"
#: The segment files of the watched sessions, to ``stat`` on every refresh.
WATCHED_SEGMENTS = (
    "SELECT s.folder, s.watch_until, g.segment_id, g.ino, g.size_seen "
    "FROM sessions s LEFT JOIN segments g ON g.session = s.id "
    "WHERE s.watch_until IS NOT NULL"
)
WATCH = "UPDATE sessions SET watch_until = ? WHERE session_id = ?"
UNWATCH = "UPDATE sessions SET watch_until = NULL WHERE session_id = ?"
UNWATCH_ENDED = "UPDATE sessions SET watch_until = NULL WHERE watch_until < ?"

# ---------------------------------------------------------------------------- segments

#: A segment row, in the order of :class:`terrarium.index._refresh.SegmentRow`'s fields.
SELECT_SEGMENTS = (
    "SELECT id, session, segment_id, ino, size_seen, offset, next_seq, items, continues, "
    "parent, at_seq, last_ts, problem FROM segments"
)
SESSION_SEGMENTS = f"{SELECT_SEGMENTS} WHERE session = ?"
OFFSETS = "SELECT segment_id, offset FROM segments"
INSERT_SEGMENT = (
    "INSERT INTO segments(session, segment_id, ino, size_seen, offset, next_seq, "
    "items, continues) VALUES (?, ?, ?, 0, 0, 0, 0, 0)"
)
UPDATE_SEGMENT = (
    "UPDATE segments SET size_seen=?, offset=?, next_seq=?, items=?, continues=?, "
    "parent=?, at_seq=?, last_ts=?, problem=? WHERE id = ?"
)
DELETE_SEGMENT = "DELETE FROM segments WHERE id = ?"

# ---------------------------------------------------------------------------- items

LAST_DOC = "SELECT coalesce(max(id), 0) FROM docs"
INSERT_DOCS = (
    "INSERT INTO docs(id, segment, session, tid, seq, role, ts, body) VALUES (?,?,?,?,?,?,?,?)"
)
# A parent segment's items up to the seq its child forked at.
COUNT_DOCS_TO = "SELECT count(*) FROM docs WHERE segment = ? AND seq <= ?"
# A segment's items leave both FTS tables before ``docs`` (external content: FTS5 needs the
# old values to remove their tokens); fts_recent holds those from its floor (the second ?) on.
FTS_DELETE_SEGMENT = (
    "INSERT INTO fts(fts, rowid, body, tags) SELECT 'delete', id, body, tags FROM docs "
    "WHERE segment = ? AND body != ''"
)
COUNT_RECENT_OF_SEGMENT = "SELECT count(*) FROM docs WHERE segment = ? AND body != '' AND id >= ?"
RECENT_DELETE_SEGMENT = (
    "INSERT INTO fts_recent(fts_recent, rowid, body, tags) "
    "SELECT 'delete', id, body, tags FROM docs WHERE segment = ? AND body != '' AND id >= ?"
)
DELETE_DOCS = "DELETE FROM docs WHERE segment = ?"

# ---------------------------------------------------------------------------- FTS tables

FTS = "fts"
FTS_RECENT = "fts_recent"
FTS_TABLES = (FTS, FTS_RECENT)
FTS_ADD = (
    "INSERT INTO {table}(rowid, body, tags) SELECT id, body, tags FROM docs "
    "WHERE id BETWEEN ? AND ? AND body != ''"
)
FTS_REBUILD = "INSERT INTO {table}({table}) VALUES('rebuild')"
FTS_DELETE_ALL = "INSERT INTO {table}({table}) VALUES('delete-all')"
FTS_OPTIMIZE = "INSERT INTO {table}({table}) VALUES('optimize')"
RECENT_FLOOR = "SELECT floor FROM recent"
SET_RECENT_FLOOR = "UPDATE recent SET floor = ?"
# fts_recent's new floor: the id of the ?-th newest item with text (OFFSET counts from 0).
RECENT_FLOOR_AT = "SELECT id FROM texts ORDER BY id DESC LIMIT 1 OFFSET ?"
COUNT_RECENT = "SELECT count(*) FROM recent_texts"

# ---------------------------------------------------------------------------- search, listing

SESSIONS_OF_CONTEXT = "SELECT id FROM sessions WHERE type = ? AND name = ?"
TYPE_ID = "SELECT id FROM types WHERE name = ?"
SNIPPETS = (
    "SELECT rowid, snippet(fts, 0, ?, ?, ?, ?) FROM fts WHERE fts MATCH ? AND rowid IN ({marks})"
)
# The hits whose body is too long for FTS5's snippet() (see fts.LONG_BODY).
LONG_BODIES = "SELECT id, body FROM docs WHERE id IN ({marks}) AND length(body) > ?"
HIT_ROWS = (
    "SELECT d.id, s.context, s.date, s.session_id, g.segment_id, d.seq, d.role, d.ts "
    "FROM docs d JOIN segments g ON g.id = d.segment "
    "JOIN sessions s ON s.id = d.session "
    "WHERE d.id IN ({marks})"
)
# A ContextSummary's fields, in order, from the covering index sessions_by_context.
LISTING_SELECT = (
    "SELECT context, date, message_count, last_active, created_at, updated_at, session_id, "
    "head, problem FROM sessions"
)
LISTING = f"{LISTING_SELECT} ORDER BY type, name"
LISTING_OF_TYPE = f"{LISTING_SELECT} WHERE type = ? ORDER BY name"
# A page of it is LISTING_SELECT completed by stores._listing.page_statement.
CONTEXT_TYPES = "SELECT DISTINCT type FROM sessions ORDER BY type"
SIGNATURES = (
    "SELECT context, last_active, message_count FROM sessions ORDER BY last_active, context"
)

# A search's filters are FTS5 conditions appended to its MATCH expression (a bound parameter):
# each matches tokens of the ``tags`` column (``s<session row> r<role> t<type row>``, SCHEMA).


def sessions_filter(ids: Iterable[int]) -> str:
    """Items of any of the session rows ``ids``."""
    return " AND tags : (" + " OR ".join(f'"s{i}"' for i in ids) + ")"


def type_filter(tid: int) -> str:
    """Items of the type row ``tid``."""
    return f' AND tags : "t{tid}"'


def role_filter(role: str) -> str:
    """Items of ``role``."""
    return f' AND tags : "r{role}"'
