"""``SqliteStore``'s schema migrations, on the registry shared with PostgreSQL.

Every open applies the pending ones (:func:`migrate`); a database this process cannot write is
never migrated (:func:`check_readable`). ``m001_initial`` builds the whole schema (the squash:
:data:`terrarium.stores.migrations.PRE_SQUASH`). Never edit a released step; add the next.

Usage::

    conn = sqlite3.connect(path, isolation_level=None)
    applied = migrate(conn, where=str(path))
"""

from __future__ import annotations

import sqlite3

from terrarium.errors import StoreError
from terrarium.model import utc_now
from terrarium.stores import _db
from terrarium.stores.migrations import PRE_SQUASH, RESPONSES_PARTS_SQL, TEXT_PARTS_SQL, Migrations
from terrarium.stores.sqlite import _sql as sql

__all__ = ["MIGRATIONS", "check_readable", "migrate", "refuse_foreign"]

MIGRATIONS: Migrations[sqlite3.Connection] = Migrations("sqlite", squashed=PRE_SQUASH)


def migrate(conn: sqlite3.Connection, *, where: str) -> list[str]:
    """Apply pending migrations on an autocommit connection; return the names applied.

    Each runs in its own ``BEGIN IMMEDIATE`` transaction with its record, the applied names
    read again under that lock, so processes opening the database at once apply each step once.

    Raises:
        FormatVersionError: the database records a migration this version does not know.
    """
    conn.execute(sql.CREATE_MIGRATIONS)
    done: list[str] = []
    # The usual case, nothing to do, takes no write lock.
    while MIGRATIONS.squashed(now := _applied(conn)) or MIGRATIONS.pending(now, where=where):
        with _db.immediate(conn):
            applied = _applied(conn)
            old = MIGRATIONS.squashed(applied)
            conn.executemany(sql.FORGET_MIGRATION, [(name,) for name in old])
            pending = MIGRATIONS.pending(applied, where=where)
            if pending:  # one step per transaction, like PostgreSQL's
                pending[0].apply(conn)
                conn.execute(sql.RECORD_MIGRATION, (pending[0].name, utc_now()))
                done.append(pending[0].name)
    return done


def check_readable(conn: sqlite3.Connection, *, where: str) -> None:
    """Refuse, in one line, a read-only database that is newer (FormatVersionError) or
    lacks migrations (StoreError: a read-only open cannot apply them)."""
    try:
        applied = _applied(conn)
    except sqlite3.OperationalError:  # no migrations table: empty, or not a terrarium database
        applied = []
    missing = [step.name for step in MIGRATIONS.pending(applied, where=where)]
    if missing:
        raise StoreError(
            f"{where}: read-only, and its schema is older than this terrarium's (it lacks "
            f"{', '.join(missing)}): open it once with write access to migrate it"
        )


def refuse_foreign(conn: sqlite3.Connection, *, where: str) -> None:
    """Refuse, before any write, a database with tables but not ours (StoreError.foreign)."""
    if tables := [row[0] for row in conn.execute(sql.FOREIGN_TABLES)]:
        raise StoreError.foreign(where, tables)


def _applied(conn: sqlite3.Connection) -> list[str]:
    return [row[0] for row in conn.execute(sql.APPLIED)]


@MIGRATIONS
def m001_initial(conn: sqlite3.Connection) -> None:
    """The whole schema (see ``._sql`` for what each table holds)."""
    for statement in (*_TABLES, *_CHANGES, *_VIEWS):
        conn.execute(statement)


_TABLES = (
    # Heads (listing and search are the derived index's: terrarium.index).
    """CREATE TABLE contexts (
        context TEXT PRIMARY KEY,
        type TEXT NOT NULL,
        session_id TEXT NOT NULL UNIQUE,
        segment_id TEXT NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
    "CREATE INDEX contexts_by_type ON contexts (type)",
    # context NULL: detached; state: the lifecycle's record (JSON, NULL for {}).
    """CREATE TABLE sessions (
        session_id TEXT PRIMARY KEY,
        context TEXT,
        created_at TEXT NOT NULL,
        state TEXT
    )""",
    "CREATE INDEX sessions_detached ON sessions (session_id) WHERE context IS NULL",
    "CREATE INDEX sessions_stated ON sessions (session_id) WHERE state IS NOT NULL",
    # AUTOINCREMENT: a committed segment key never names another segment (a store may cache
    # it), and an entry's id, its arrival order, is never reused (the change cursor reads it).
    """CREATE TABLE segments (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL,
        segment_id TEXT NOT NULL,
        created_at TEXT NOT NULL,
        UNIQUE (session_id, segment_id)
    )""",
    """CREATE TABLE entries (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        seg INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        kind TEXT NOT NULL,
        ts TEXT NOT NULL,
        line TEXT NOT NULL,
        UNIQUE (seg, seq)
    )""",
    """CREATE TABLE traces (
        id INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL,
        segment_id TEXT NOT NULL,
        line TEXT NOT NULL
    )""",
    "CREATE INDEX traces_by_segment ON traces (session_id, segment_id, id)",
    # Frozen sessions (``.._sqlbase``): the heads of the attached ones, and each segment's
    # lines (and trace) zstandard-compressed.
    """CREATE TABLE archived_contexts (
        session_id TEXT PRIMARY KEY,
        context TEXT NOT NULL UNIQUE,
        type TEXT NOT NULL,
        segment_id TEXT NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
    """CREATE TABLE archived_segments (
        session_id TEXT NOT NULL,
        segment_id TEXT NOT NULL,
        created_at TEXT NOT NULL,
        next_seq INTEGER NOT NULL,
        lines BLOB NOT NULL,
        trace BLOB,
        PRIMARY KEY (session_id, segment_id)
    )""",
    """CREATE TABLE blobs (
        digest TEXT PRIMARY KEY,
        size INTEGER NOT NULL,
        data BLOB NOT NULL,
        stored_at REAL NOT NULL
    )""",
    """CREATE TABLE blob_refs (
        digest TEXT NOT NULL,
        session_id TEXT NOT NULL,
        PRIMARY KEY (session_id, digest)
    ) WITHOUT ROWID""",
    "CREATE INDEX blob_refs_digest ON blob_refs (digest)",
)

# The change cursor (``SqliteStore.changes``): the entries' ids, and a row per session whose
# head was added, moved or dropped, moved to the top (a new id) by a trigger.
_CHANGED = "INSERT OR REPLACE INTO changes (session_id) VALUES ({session})"
_CHANGES = (
    """CREATE TABLE changes (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL UNIQUE
    )""",
    f"""CREATE TRIGGER changes_on_head AFTER INSERT ON contexts
    BEGIN {_CHANGED.format(session="NEW.session_id")}; END""",
    f"""CREATE TRIGGER changes_on_move AFTER UPDATE ON contexts
    BEGIN {_CHANGED.format(session="NEW.session_id")}; END""",
    f"""CREATE TRIGGER changes_on_drop AFTER DELETE ON contexts
    BEGIN {_CHANGED.format(session="OLD.session_id")}; END""",
)


# Views for SQL users: transcript_lineage (the segments each context's restore reads) and
# transcript (each context's history, in order, as restore gives it; docs/format.md).
# Each context's lineage is a correlated subquery (a recursive walk up its fork headers, read
# by key), so ``WHERE context = ?`` reads that context's segments alone: SQLite pushes the
# filter through the window into both arms. Headers and segment keys are read by scalar
# subqueries, not joins: on an analysed database SQLite would build a Bloom filter for such a
# join, by a scan of the whole entries table (300 ms at 500,000 entries, for a 1 ms read).
_SEG = "(SELECT g.id FROM segments AS g WHERE g.session_id = {s} AND g.segment_id = {g})"
_HEAD_SEG = _SEG.format(s="c.session_id", g="c.segment_id")
_PARENT_SEG = _SEG.format(s="c.session_id", g="json_extract(chain.header, '$.origin.parent')")
_LINEAGE_SEG = _SEG.format(s="l.session_id", g="l.segment_id")
# One lineage segment's header (its seq 0 entry).
_HEADER_BY_SEG = f"SELECT {{column}} FROM entries WHERE seg = {_LINEAGE_SEG} AND seq = 0"


def _nul_safe(line: str) -> str:
    r"""SQL for ``line`` with each ``\u0000`` escape made ``\ufffd`` (SQLite's JSON functions
    end a text at U+0000).

    Escaped backslashes are set aside as U+0001 first, which valid JSON never holds raw, so
    ``\\u0000`` (a backslash, then "u0000") stays as it is; ``instr`` spares other lines.
    """
    return (
        rf"CASE WHEN instr({line}, '\u0000') THEN replace(replace(replace({line}, '\\', "
        rf"char(1)), '\u0000', '\ufffd'), char(1), '\\') ELSE {line} END"
    )


def _parts_text(item: str, path: str, sep: str | None = None) -> str:
    """SQL for the text at ``path`` of the JSON ``item``: a string as it is; a list's text
    parts and refusals joined by ``sep`` (SQL), by default ``''`` for Chat parts and a line
    break once a Responses part is among them; else ``''``."""
    part = "json_extract({item}, p.fullkey || '.{key}')"
    kind, text, refusal = (part.format(item=item, key=key) for key in ("type", "text", "refusal"))
    if sep is None:
        sep = (
            f"CASE WHEN EXISTS (SELECT 1 FROM json_each({item}, '{path}') AS p "
            f"WHERE {kind} IN {RESPONSES_PARTS_SQL}) THEN char(10) ELSE '' END"
        )
    return (
        f"CASE json_type({item}, '{path}') "
        f"WHEN 'text' THEN json_extract({item}, '{path}') "
        f"WHEN 'array' THEN (SELECT coalesce(group_concat(t, {sep}), '') FROM ("
        f"SELECT CASE WHEN {kind} IN {TEXT_PARTS_SQL} AND json_type({item}, p.fullkey || "
        f"'.text') = 'text' THEN {text} WHEN {kind} = 'refusal' AND json_type({item}, "
        f"p.fullkey || '.refusal') = 'text' THEN {refusal} END AS t "
        f"FROM json_each({item}, '{path}') AS p ORDER BY p.id)) "
        "ELSE '' END"
    )


def _item_text(item: str) -> str:
    """SQL for ``terrarium.model.item_text`` of the JSON ``item``: a Chat message's content; a
    Responses ``message``'s parts; a ``function_call_output``'s output; a ``reasoning`` item's
    summary, then its content, paragraphs apart; else ``''``."""
    paragraphs = "char(10, 10)"
    summary = _parts_text(item, "$.summary", paragraphs)
    content = _parts_text(item, "$.content", paragraphs)
    return (
        f"CASE WHEN json_type({item}, '$.type') IS NULL "
        f"OR json_extract({item}, '$.type') = 'message' THEN {_parts_text(item, '$.content')} "
        f"WHEN json_extract({item}, '$.type') = 'function_call_output' "
        f"THEN {_parts_text(item, '$.output')} "
        f"WHEN json_extract({item}, '$.type') = 'reasoning' THEN (SELECT CASE WHEN s <> '' "
        f"AND c <> '' THEN s || {paragraphs} || c ELSE s || c END "
        f"FROM (SELECT {summary} AS s, {content} AS c)) "
        "ELSE '' END"
    )


_VIEWS = (
    # depth 0 is the head; each continuing fork header (history null) names the parent
    # segment it continues up to at_seq. UNION, not UNION ALL: a (corrupt) cycle of headers
    # ends instead of looping.
    f"""CREATE VIEW transcript_lineage AS
    SELECT c.context, c.session_id, l.key AS depth,
        json_extract(l.value, '$[0]') AS segment_id,
        json_extract(l.value, '$[1]') AS stop_seq
    FROM contexts AS c CROSS JOIN json_each((
        WITH RECURSIVE chain(segment_id, stop_seq, header) AS (
            SELECT c.segment_id, 2147483647, h.line FROM entries AS h
            WHERE h.seg = {_HEAD_SEG} AND h.seq = 0
            UNION
            SELECT json_extract(chain.header, '$.origin.parent'),
                json_extract(chain.header, '$.origin.at_seq'),
                (SELECT p.line FROM entries AS p WHERE p.seg = {_PARENT_SEG} AND p.seq = 0)
            FROM chain
            WHERE json_extract(chain.header, '$.origin.kind') = 'fork'
                AND coalesce(json_type(chain.header, '$.history'), 'null') = 'null'
        )
        SELECT json_group_array(json_array(segment_id, stop_seq)) FROM chain
        WHERE header IS NOT NULL
    )) AS l""",
    # The oldest segment of a lineage may start with a history (a root, compaction, clear,
    # import, fork into another context); then come the history entries of each segment,
    # oldest segment first, up to the seq its child continues after.
    f"""CREATE VIEW transcript_items AS
    SELECT l.context, l.session_id, l.segment_id, l.depth, 0 AS seq, j.key AS n,
        'header' AS kind, ({_HEADER_BY_SEG.format(column="ts")}) AS ts,
        CASE WHEN j.type IN ('object', 'array') THEN j.value ELSE json_quote(j.value) END
            AS item
    FROM transcript_lineage AS l
    CROSS JOIN json_each(({_HEADER_BY_SEG.format(column=_nul_safe("line"))}), '$.history') AS j
    WHERE typeof(j.key) = 'integer'
    UNION ALL
    SELECT l.context, l.session_id, l.segment_id, l.depth, e.seq, NULL, e.kind, e.ts,
        {_nul_safe("e.line")} -> '$.item'
    FROM transcript_lineage AS l
    CROSS JOIN entries AS e ON e.seg = {_LINEAGE_SEG} AND e.seq BETWEEN 1 AND l.stop_seq
    WHERE e.kind IN ('item', 'system_item', 'user_input')""",
    f"""CREATE VIEW transcript AS
    SELECT context,
        row_number() OVER (PARTITION BY context ORDER BY depth DESC, seq, n) AS position,
        json_extract(item, '$.role') AS role,
        {_item_text("item")} AS text,
        ts AS timestamp,
        json_extract(item, '$.type') AS type,
        kind, session_id, segment_id, seq, n, item
    FROM transcript_items""",
)
