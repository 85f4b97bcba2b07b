"""The SQL of ``FsStore``'s search index (:mod:`terrarium.stores.fs.search`): schema, statements.

The schema is created whole when the database's ``user_version`` is not ``SCHEMA_VERSION``
(an index is derived: one of another version is dropped and rebuilt, never migrated).
"""

from __future__ import annotations

#: The ``sessions`` columns a head decides, in the order ``IndexUpdate`` keeps them.
HEAD_COLUMNS = "context, type, name, tid, date, folder, head, created_at, updated_at, head_problem"
#: A ContextSummary's fields, in order.
LISTING = (
    "SELECT context, date, message_count, last_active, created_at, updated_at, session_id, "
    "head, problem FROM sessions"
)

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


#: A segment row, in the order of :class:`terrarium.stores.fs._refresh.SegmentRow`'s fields.
SELECT_SEGMENTS = (
    "SELECT id, session, segment_id, ino, size_seen, offset, next_seq, items, continues, "
    "parent, at_seq, last_ts, problem FROM segments"
)
INSERT_SEGMENT = (
    "INSERT INTO segments(session, segment_id, ino, size_seen, offset, next_seq, "
    "items, continues) VALUES (?, ?, ?, 0, 0, 0, 0, 0)"
)
UPDATE_SEGMENT = (
    "UPDATE segments SET size_seen=?, offset=?, next_seq=?, items=?, continues=?, "
    "parent=?, at_seq=?, last_ts=?, problem=? WHERE id = ?"
)
INSERT_SESSION = (
    f"INSERT INTO sessions({HEAD_COLUMNS}, last_active, session_id) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
)
UPDATE_SESSION_HEAD = (
    "UPDATE sessions SET context=?, type=?, name=?, tid=?, date=?, folder=?, head=?, "
    "created_at=?, updated_at=?, head_problem=? WHERE id = ?"
)
INSERT_DOCS = (
    "INSERT INTO docs(id, segment, session, tid, seq, role, ts, body) VALUES (?,?,?,?,?,?,?,?)"
)
#: The segment files of the watched sessions, to ``stat`` on every refresh.
WATCHED_SEGMENTS = (
    "SELECT s.folder, s.watch_until, g.segment_id, g.ino, g.size_seen "
    "FROM sessions s LEFT JOIN segments g ON g.session = s.id "
    "WHERE s.watch_until IS NOT NULL"
)
