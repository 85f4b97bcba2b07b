"""The statements of the derived search and listing index (:mod:`terrarium.index`), by name.

The schema is created whole when the database's ``user_version`` is not ``SCHEMA_VERSION``
(an index is derived: one of another version is dropped and rebuilt, never migrated). A few
statements are templates: ``{table}`` one of ``FTS_TABLES``, ``{marks}`` one ``?`` per id,
``{type}`` and ``{name}`` read from ``sqlite_master``.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Bump when the schema changes: an index of another version is dropped and rebuilt.
SCHEMA_VERSION = 8

#: How a problem text the index keeps names the store's root (``root/``): a read puts back the
#: root the store is open at, so a moved store's problems name its files where they are now.
ROOT = "<root>/"
PROBLEM = f"replace(problem, '{ROOT}', ?)"

#: The counts of a row of ``usage``: the fields of ``UsageTotals``, in their order.
USAGE_COUNTS = tuple(
    "prompt completion cached calls estimated_prompt estimated_completion estimated".split()
)

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
        problem TEXT,
        turns INTEGER NOT NULL DEFAULT 0,
        tokens INTEGER NOT NULL DEFAULT 0,
        fork_source TEXT,
        fig_segment INTEGER,
        fig_seq INTEGER)""",
    # Covers the listing query: 100k rows are read in index order without a table lookup each.
    """CREATE INDEX sessions_by_context ON sessions(type, name, context, date, message_count,
        last_active, created_at, updated_at, session_id, head, problem)""",
    """CREATE INDEX sessions_watched ON sessions(watch_until) WHERE watch_until IS NOT NULL""",
    # An index per order a listing page walks (ties by context id); the first also covers
    # the live view's fingerprint.
    """CREATE INDEX sessions_by_last_active ON sessions(last_active, context, message_count)""",
    """CREATE INDEX sessions_by_created ON sessions(created_at, context)""",
    """CREATE INDEX sessions_by_messages ON sessions(message_count, context)""",
    # Also covers the overview's turns.
    """CREATE INDEX sessions_by_tokens ON sessions(tokens, context, turns)""",
    """CREATE INDEX sessions_by_fork_source ON sessions(fork_source)
        WHERE fork_source IS NOT NULL""",
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
        problem TEXT,
        fork_source TEXT)""",
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
    # A session's figures (index/_figures.py): per model, per day, its copies of other
    # sessions' messages and what its conversation holds of its own.
    """CREATE TABLE usage(
        session INTEGER NOT NULL,
        model TEXT NOT NULL,
        prompt INTEGER NOT NULL,
        completion INTEGER NOT NULL,
        cached INTEGER NOT NULL,
        calls INTEGER NOT NULL,
        estimated_prompt INTEGER NOT NULL,
        estimated_completion INTEGER NOT NULL,
        estimated INTEGER NOT NULL,
        PRIMARY KEY(session, model)) WITHOUT ROWID""",
    # The overview's sums per model and per day read these covering indexes in their groups'
    # order: about half and a fifth of the time of a scan and a sort, at 100k sessions.
    f"CREATE INDEX usage_by_model ON usage(model, {', '.join(USAGE_COUNTS)})",
    """CREATE TABLE days(
        session INTEGER NOT NULL,
        day TEXT NOT NULL,
        tid INTEGER NOT NULL,
        messages INTEGER NOT NULL,
        PRIMARY KEY(session, day)) WITHOUT ROWID""",
    """CREATE INDEX days_by_day ON days(day, tid, messages)""",
    """CREATE TABLE copies(
        session INTEGER NOT NULL,
        tid INTEGER NOT NULL,
        origin TEXT NOT NULL,
        segment TEXT NOT NULL,
        seq INTEGER NOT NULL,
        position INTEGER NOT NULL,
        day TEXT NOT NULL)""",
    """CREATE INDEX copies_by_session ON copies(session)""",
    """CREATE TABLE held(
        session INTEGER NOT NULL,
        origin TEXT NOT NULL,
        segment TEXT NOT NULL,
        seq INTEGER NOT NULL,
        position INTEGER NOT NULL)""",
    """CREATE INDEX held_by_session ON held(session, origin, segment, seq, position)""",
    """CREATE TABLE ranges(
        session INTEGER NOT NULL,
        segment TEXT NOT NULL,
        lo INTEGER NOT NULL,
        hi INTEGER NOT NULL,
        PRIMARY KEY(session, segment)) WITHOUT ROWID""",
    # Contexts with no session in the index: archived ones and legacy seed-format files, as
    # the caller's provider gives them (SearchIndex.others).
    """CREATE TABLE others(
        context TEXT NOT NULL,
        type TEXT NOT NULL,
        name TEXT NOT NULL,
        state TEXT NOT NULL,
        date TEXT NOT NULL,
        created_at TEXT NOT NULL,
        last_active TEXT NOT NULL,
        message_count INTEGER NOT NULL,
        legacy_path TEXT,
        PRIMARY KEY(state, context)) WITHOUT ROWID""",
    """CREATE INDEX others_by_last_active ON others(state, last_active, context)""",
    """CREATE INDEX others_by_created ON others(state, created_at, context)""",
    """CREATE INDEX others_by_messages ON others(state, message_count, context)""",
    *(
        f"""CREATE VIEW {state}_rows AS SELECT context, type, date, message_count, last_active,
        created_at, last_active AS updated_at, '' AS session_id, '' AS head, NULL AS problem,
        0 AS tokens, state, legacy_path FROM others o WHERE state = '{state}'{hidden}"""
        for state, hidden in (
            ("archived", ""),
            # A context in the log, hot or archived, hides its legacy file.
            (
                "legacy",
                " AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.type = o.type "
                "AND s.name = o.name) AND NOT EXISTS (SELECT 1 FROM others a "
                "WHERE a.state = 'archived' AND a.context = o.context)",
            ),
        )
    ),
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
# virtual ones first (dropping one drops its shadow tables: hence IF EXISTS).
DROPPED = (
    "SELECT type, name FROM sqlite_master WHERE type IN ('view', 'table') AND name NOT LIKE "
    "'sqlite%' ORDER BY type = 'view' DESC, sql LIKE 'CREATE VIRTUAL%' DESC"
)
DROP = 'DROP {type} IF EXISTS "{name}"'

# ---------------------------------------------------------------------------- connection

# The writer's only: a commit survives the process, not always the machine (the index is
# derived: what a crash loses is read again from the files).
SYNCHRONOUS = "PRAGMA synchronous=NORMAL"
PRAGMAS = ("PRAGMA temp_store=MEMORY", "PRAGMA cache_size=-32000")
# A deferred transaction: the reads of one search or listing see one snapshot.
BEGIN = "BEGIN"
COMMIT = "COMMIT"
CHECKPOINT = "PRAGMA wal_checkpoint(TRUNCATE)"

# ---------------------------------------------------------------------------- meta

# The keys: 'built' (when the first build ended), 'shape' (the date folders a filesystem
# store had), 'cursor' (the store's change cursor the index has read to), 'build_cursor'
# (where a first build's walk began on it, see index/_build.py), 'recent_count' (the items
# in fts_recent) and 'others' (the digest of the others rows).
META = "SELECT value FROM meta WHERE key = ?"
SET_META = "INSERT OR REPLACE INTO meta VALUES (?, ?)"
DELETE_META = "DELETE FROM meta WHERE key = ?"
FIGURE_TABLES = ("usage", "days", "copies", "held", "ranges")
#: What a rebuild runs first: the FTS tables emptied before ``docs``, every table, the floor.
CLEAR = (
    *(f"INSERT INTO {table}({table}) VALUES('delete-all')" for table in ("fts", "fts_recent")),
    *(
        f"DELETE FROM {table}"
        for table in ("docs", "segments", "sessions", "types", "meta", "others", *FIGURE_TABLES)
    ),
    "UPDATE recent SET floor = 1",
)

# ---------------------------------------------------------------------------- sessions

#: The ``sessions`` columns a head decides, in the order ``IndexUpdate`` keeps them.
HEAD_COLUMNS = "context, type, name, tid, date, folder, head, created_at, updated_at, head_problem"
SESSIONS = f"SELECT id, {HEAD_COLUMNS}, session_id FROM sessions"
SESSION = f"{SESSIONS} WHERE session_id = ?"
SESSION_IDS = "SELECT session_id FROM sessions"
SESSION_FOLDERS = "SELECT session_id, folder FROM sessions"
COUNT_SESSIONS = "SELECT count(*) FROM sessions"
SESSION_FOLDER = "SELECT folder FROM sessions WHERE session_id = ?"
CLAIMANTS = "SELECT session_id FROM sessions WHERE type = ? AND name = ? AND id != ?"
INSERT_SESSION = (
    f"INSERT INTO sessions({HEAD_COLUMNS}, last_active, session_id) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
)
UPDATE_SESSION_HEAD = f"UPDATE sessions SET {HEAD_COLUMNS.replace(',', '=?,')}=? WHERE id = ?"
# The last activity stays what it was while the head segment has no entry (NULL).
SET_SUMMARY = (
    "UPDATE sessions SET message_count = ?, last_active = coalesce(?, last_active), "
    "problem = ? WHERE id = ?"
)
DELETE_SESSION = "DELETE FROM sessions WHERE id = ?"

# ---------------------------------------------------------------------------- figures

#: Where a session's figures were folded to: the head segment's row and its next seq.
FOLDED = "SELECT fig_segment, fig_seq FROM sessions WHERE id = ?"
SET_FIGURES = (
    "UPDATE sessions SET turns = ?, tokens = ?, fork_source = ?, fig_segment = ?, fig_seq = ? "
    "WHERE id = ?"
)
ADD_FIGURES = "UPDATE sessions SET turns = turns + ?, tokens = tokens + ?, fig_seq = ? WHERE id = ?"
DELETE_FIGURES = tuple(f"DELETE FROM {table} WHERE session = ?" for table in FIGURE_TABLES)
ADD_USAGE = (
    "INSERT INTO usage VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT(session, model) DO UPDATE SET "
    + ", ".join(f"{n} = {n} + excluded.{n}" for n in USAGE_COUNTS)
)
ADD_DAY = (
    "INSERT INTO days VALUES (?,?,?,?) ON CONFLICT(session, day) DO UPDATE SET "
    "messages = messages + excluded.messages"
)
INSERT_COPY = "INSERT INTO copies VALUES (?,?,?,?,?,?,?)"
INSERT_HELD = "INSERT INTO held VALUES (?,?,?,?,?)"
# A segment's range of entries grows at its end; its start stays.
SET_RANGE = (
    "INSERT INTO ranges VALUES (?,?,?,?) ON CONFLICT(session, segment) DO UPDATE SET "
    "hi = excluded.hi"
)

# The totals of ``stats`` and the overview (hot contexts; legacy files count in contexts and
# messages only: the seed's format has no usage or turns), each type's legacy files apart.
PER_TYPE = (
    "SELECT type, count(*), total(message_count), 0 FROM sessions GROUP BY type "
    "UNION ALL SELECT type, count(*), total(message_count), 1 FROM legacy_rows GROUP BY type"
)
# A damaged session is counted for what of it could be read.
DAMAGED = f"SELECT context, {PROBLEM} FROM sessions WHERE problem IS NOT NULL ORDER BY context"
TURNS = "SELECT total(turns) FROM sessions"
PER_MODEL = (
    f"SELECT model, {', '.join(f'sum({n})' for n in USAGE_COUNTS)} FROM usage GROUP BY model"
)
PER_DAY = (
    "SELECT d.day, t.name, d.n FROM (SELECT day, tid, sum(messages) AS n FROM days "
    "GROUP BY day, tid) d JOIN types t ON t.id = d.tid"
)
# A fork's copy counts once, under the first of its holders' types, when no hot session's
# conversation holds its original any more (compacted away, cleared, deleted, archived).
COPIES_PER_DAY = """SELECT day, type, count(*) FROM (
    SELECT min(c.day) AS day, min(t.name) AS type FROM copies c JOIN types t ON t.id = c.tid
    WHERE NOT EXISTS (
        SELECT 1 FROM sessions o WHERE o.session_id = c.origin AND (
            EXISTS (SELECT 1 FROM held h WHERE h.session = o.id AND h.origin = c.origin
                AND h.segment = c.segment AND h.seq = c.seq AND h.position = c.position)
            OR (c.position < 0 AND EXISTS (SELECT 1 FROM ranges r WHERE r.session = o.id
                AND r.segment = c.segment AND c.seq BETWEEN r.lo AND r.hi))))
    GROUP BY c.origin, c.segment, c.seq, c.position)
GROUP BY day, type"""
FORKS_OF = "SELECT context FROM sessions WHERE fork_source = ? ORDER BY context"
# What the live view compares: any write changes a count or a last activity.
FINGERPRINT = (
    "SELECT count(*), total(message_count), max(last_active) FROM sessions "
    "UNION ALL SELECT count(*), total(message_count), max(last_active) FROM others"
)
SEGMENT_BYTES = "SELECT total(size_seen) FROM segments"
DELETE_OTHERS = "DELETE FROM others"
INSERT_OTHER = "INSERT OR REPLACE INTO others VALUES (?,?,?,?,?,?,?,?,?)"
TYPES = "SELECT id, name FROM types"
INSERT_TYPE = "INSERT INTO types(name) VALUES (?)"

# ---------------------------------------------------------------------------- watches

WATCHED = "SELECT session_id, watch_until FROM sessions WHERE watch_until IS NOT NULL"
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

#: What a refresh has read of a segment: the ``segments`` columns it updates, in the order of
#: :class:`terrarium.index._refresh.SegmentRow`'s fields (after ``ino``).
PROGRESS_COLUMNS = (
    "size_seen, offset, next_seq, items, continues, parent, at_seq, last_ts, problem, fork_source"
)
#: A segment row, in the order of ``SegmentRow``'s fields.
SELECT_SEGMENTS = f"SELECT id, session, segment_id, ino, {PROGRESS_COLUMNS} FROM segments"
SEGMENTS_OF_SESSION = (
    f"{SELECT_SEGMENTS} WHERE session = (SELECT id FROM sessions WHERE session_id = ?)"
)
OFFSETS = "SELECT segment_id, offset FROM segments"
INSERT_SEGMENT = (
    "INSERT INTO segments(session, segment_id, ino, size_seen, offset, next_seq, "
    "items, continues) VALUES (?, ?, ?, 0, 0, 0, 0, 0)"
)
UPDATE_SEGMENT = f"UPDATE segments SET {PROGRESS_COLUMNS.replace(',', '=?,')}=? WHERE id = ?"
DELETE_SEGMENT = "DELETE FROM segments WHERE id = ?"

# ---------------------------------------------------------------------------- items

LAST_DOC = "SELECT coalesce(max(id), 0) FROM docs"
INSERT_DOCS = (
    "INSERT INTO docs(id, segment, session, tid, seq, role, ts, body) VALUES (?,?,?,?,?,?,?,?)"
)
COUNT_DOCS_TO = "SELECT count(*) FROM docs WHERE segment = ? AND seq <= ?"
# A segment's items leave both FTS tables before ``docs`` (external content: FTS5 needs the
# old values to remove their tokens); fts_recent holds those from its floor (the second ?) on.
FTS_DELETE_SEGMENT = (
    "INSERT INTO {table}({table}, rowid, body, tags) SELECT 'delete', id, body, tags "
    "FROM docs WHERE segment = ? AND body != '' AND id >= ?"
)
COUNT_RECENT_OF_SEGMENT = "SELECT count(*) FROM docs WHERE segment = ? AND body != '' AND id >= ?"
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
SUMMARY = "context, date, message_count, last_active, created_at, updated_at, session_id, head"
LISTING_SELECT = f"SELECT {SUMMARY}, {PROBLEM} FROM sessions"
# The same with its tokens, state and legacy file, of a hot session or (``{view}``: the
# view ``archived_rows`` or ``legacy_rows``) another context; the types of a table or view.
HOT_ROWS = f"SELECT {SUMMARY}, {PROBLEM}, tokens, 'hot', NULL FROM sessions"
OTHER_ROWS = f"SELECT {SUMMARY}, {PROBLEM}, tokens, state, legacy_path FROM {{view}}"
TYPES_OF = "SELECT DISTINCT type FROM {view}"
LISTING = f"{LISTING_SELECT} ORDER BY type, name"
LISTING_OF_TYPE = f"{LISTING_SELECT} WHERE type = ? ORDER BY name"

# A search's filters are FTS5 conditions appended to its MATCH expression (a bound parameter):
# each matches tokens of the ``tags`` column (``s<session row> r<role> t<type row>``, SCHEMA).


def tags_filter(tag: str, values: Iterable[object]) -> str:
    """Items with any of the ``tags`` tokens ``{tag}{value}``: ``s`` a session row, ``r`` a
    role, ``t`` a type row."""
    return " AND tags : (" + " OR ".join(f'"{tag}{value}"' for value in values) + ")"
