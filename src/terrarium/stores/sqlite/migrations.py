"""``SqliteStore``'s schema migrations, on the registry shared with PostgreSQL.

Every open applies the pending ones (:func:`migrate`), each in its own ``BEGIN IMMEDIATE``
transaction together with its record in ``migrations``. A database this process cannot write
is never migrated: :func:`check_readable` refuses one that needs a migration, in one line.
The migrations below are released history: never edit one, add the next.

Usage::

    conn = sqlite3.connect(path, isolation_level=None)
    applied = migrate(conn, where=str(path))
"""

from __future__ import annotations

import sqlite3
from typing import Any

from terrarium import codec
from terrarium.errors import StoreError
from terrarium.model import utc_now
from terrarium.stores import _db
from terrarium.stores.migrations import Migrations
from terrarium.stores.sqlite import _blobs as blob_sql
from terrarium.stores.sqlite import _sql as sql
from terrarium.stores.sqlite.search import SEARCH_RECENT, doc_tags, line_docs, segment_summary

__all__ = ["MIGRATIONS", "check_readable", "migrate"]

MIGRATIONS: Migrations[sqlite3.Connection] = Migrations("sqlite")


def migrate(conn: sqlite3.Connection, *, where: str, stop_after: str | None = None) -> list[str]:
    """Apply pending migrations on an autocommit connection; return the names applied.

    Each migration runs in its own ``BEGIN IMMEDIATE`` transaction with its record, and the
    list of applied names is read again under that lock, so processes opening the database at
    the same time apply each step once. ``stop_after`` (for tests) stops after that migration.

    Raises:
        FormatVersionError: the database records a migration this version does not know.
    """
    conn.execute(sql.CREATE_MIGRATIONS)
    done: list[str] = []
    if not MIGRATIONS.pending(_applied(conn), where=where):
        return done  # the usual case: no write lock taken
    for step in MIGRATIONS:
        with _db.immediate(conn):
            if step in MIGRATIONS.pending(_applied(conn), where=where):
                step.apply(conn)
                conn.execute(sql.RECORD_MIGRATION, (step.name, utc_now()))
                done.append(step.name)
        if step.name == stop_after:
            break
    return done


def check_readable(conn: sqlite3.Connection, *, where: str) -> None:
    """Refuse, in one line, a read-only database whose schema this version cannot read.

    Raises:
        FormatVersionError: it records a migration this version does not know.
        StoreError: it lacks migrations (or is empty), which a read-only open cannot apply.
    """
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


def _applied(conn: sqlite3.Connection) -> list[str]:
    return [row[0] for row in conn.execute(sql.APPLIED)]


@MIGRATIONS
def m001_initial(conn: sqlite3.Connection) -> None:
    """Heads, sessions, segments and entries."""
    for statement in (
        """CREATE TABLE contexts (
            context TEXT PRIMARY KEY,
            type TEXT NOT NULL,
            session_id TEXT NOT NULL UNIQUE,
            segment_id TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )""",
        "CREATE INDEX contexts_by_type ON contexts (type)",
        """CREATE TABLE sessions (
            session_id TEXT PRIMARY KEY,
            context TEXT NOT NULL,
            created_at TEXT NOT NULL
        )""",
        """CREATE TABLE segments (
            session_id TEXT NOT NULL,
            segment_id TEXT NOT NULL,
            created_at TEXT NOT NULL,
            PRIMARY KEY (session_id, segment_id)
        )""",
        """CREATE TABLE entries (
            session_id TEXT NOT NULL,
            segment_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            kind TEXT NOT NULL,
            ts TEXT NOT NULL,
            line TEXT NOT NULL,
            PRIMARY KEY (session_id, segment_id, seq)
        )""",
    ):
        conn.execute(statement)


@MIGRATIONS
def m002_traces(conn: sqlite3.Connection) -> None:
    """Debug traces of raw stream events, per segment."""
    conn.execute(
        """CREATE TABLE traces (
            id INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL,
            segment_id TEXT NOT NULL,
            line TEXT NOT NULL
        )"""
    )
    conn.execute("CREATE INDEX traces_by_segment ON traces (session_id, segment_id, id)")


@MIGRATIONS
def m003_search(conn: sqlite3.Connection) -> None:
    """Full-text search over history items (FTS5), backfilled from the entries there are."""
    for statement in (
        # hw: items up to this id are in search_fts; floor: items from this id on are in
        # search_recent (floor <= hw + 1, so every item is in one of them or both).
        "CREATE TABLE search_meta (hw INTEGER NOT NULL, floor INTEGER NOT NULL)",
        "INSERT INTO search_meta VALUES (0, 1)",
        """CREATE TABLE search_docs (
            id INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL,
            segment_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            role TEXT NOT NULL,
            ts TEXT NOT NULL,
            body TEXT NOT NULL,
            tags TEXT NOT NULL
        )""",
        # Each FTS5 table's content is a view of exactly the items it indexes, so that its
        # 'rebuild' and 'integrity-check' mean what they say.
        """CREATE VIEW search_fts_content AS SELECT id, body, tags FROM search_docs
            WHERE id <= (SELECT hw FROM search_meta)""",
        """CREATE VIEW search_recent_content AS SELECT id, body, tags FROM search_docs
            WHERE id >= (SELECT floor FROM search_meta)""",
        """CREATE VIRTUAL TABLE search_fts USING fts5(body, tags,
            content='search_fts_content', content_rowid='id',
            tokenize='unicode61 remove_diacritics 2')""",
        """CREATE VIRTUAL TABLE search_recent USING fts5(body, tags,
            content='search_recent_content', content_rowid='id',
            tokenize='unicode61 remove_diacritics 2')""",
    ):
        conn.execute(statement)
    # Backfill in arrival order (the order the entries were inserted).
    types = dict(conn.execute("SELECT session_id, type FROM contexts").fetchall())
    rows: list[tuple[Any, ...]] = []
    cursor = conn.execute(
        "SELECT session_id, segment_id, seq, line FROM entries "
        "WHERE seq = 0 OR kind IN ('user_input', 'item', 'system_item') ORDER BY rowid"
    )
    for session_id, segment_id, seq, text in cursor:
        for seq_, role, ts, body in line_docs(seq, codec.decode(text)):
            tags = doc_tags(session_id, role, types.get(session_id))
            rows.append((len(rows) + 1, session_id, segment_id, seq_, role, ts, body, tags))
    conn.executemany(sql.INSERT_DOC, rows)
    conn.execute(
        "UPDATE search_meta SET hw = ?, floor = ?",
        (len(rows), max(1, len(rows) - SEARCH_RECENT + 1)),
    )
    for table in ("search_fts", "search_recent"):
        conn.execute(f"INSERT INTO {table} ({table}) VALUES ('rebuild')")


@MIGRATIONS
def m004_derived_state(conn: sqlite3.Connection) -> None:
    """Entries get a stable arrival id, up to which the derived tables (search, listing
    counts on the heads) are brought in batches instead of in every append."""
    conn.execute(
        """CREATE TABLE entries_by_id (
            id INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL,
            segment_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            kind TEXT NOT NULL,
            ts TEXT NOT NULL,
            line TEXT NOT NULL,
            UNIQUE (session_id, segment_id, seq)
        )"""
    )
    # The rowids are the arrival order; as an INTEGER PRIMARY KEY they survive a VACUUM.
    conn.execute(
        "INSERT INTO entries_by_id SELECT rowid, session_id, segment_id, seq, kind, ts, line "
        "FROM entries ORDER BY rowid"
    )
    conn.execute("DROP TABLE entries")
    conn.execute("ALTER TABLE entries_by_id RENAME TO entries")
    conn.execute("ALTER TABLE contexts ADD COLUMN message_count INTEGER NOT NULL DEFAULT 0")
    conn.execute("ALTER TABLE contexts ADD COLUMN last_active TEXT NOT NULL DEFAULT ''")
    # Listing reads this index alone, in order: 100k contexts without a sort or a table lookup.
    conn.execute(
        f"CREATE INDEX contexts_listing ON contexts ({sql.LISTING_ORDER}, context, created_at, "
        "message_count, last_active, updated_at, session_id, segment_id)"
    )
    for s, g in conn.execute("SELECT session_id, segment_id FROM contexts").fetchall():
        count, last = segment_summary(conn, s, g, prefix=_M004_SEGMENT_PREFIX)
        conn.execute(
            "UPDATE contexts SET message_count = ?, last_active = ? WHERE session_id = ?",
            (count, last, s),
        )
    # Until now only search_recent held the newest items; from here on search_fts holds every
    # item up to hw, and hw is the newest.
    conn.execute("ALTER TABLE search_meta ADD COLUMN wm INTEGER NOT NULL DEFAULT 0")
    (hw,) = conn.execute("SELECT hw FROM search_meta").fetchone()
    (top,) = conn.execute("SELECT max(id) FROM search_docs").fetchone()
    if top is not None and top > hw:
        conn.execute(
            "INSERT INTO search_fts (rowid, body, tags) SELECT id, body, tags FROM search_docs "
            "WHERE id > ?",
            (hw,),
        )
        conn.execute("UPDATE search_meta SET hw = ?", (top,))
    # Every entry there is was indexed when it was appended.
    conn.execute("UPDATE search_meta SET wm = (SELECT coalesce(max(id), 0) FROM entries)")


# The statement m004 counts with: ``_sql.SEGMENT_PREFIX`` as it was then, on m001's keys
# (m013 moved the live one to segment keys).
_M004_SEGMENT_PREFIX = (
    "SELECT (SELECT count(*) FROM entries e WHERE e.session_id = ?1 AND e.segment_id = ?2 "
    "AND e.seq BETWEEN 1 AND ?3 AND e.kind IN ('item', 'system_item', 'user_input')), "
    "(SELECT e.ts FROM entries e WHERE e.session_id = ?1 AND e.segment_id = ?2 "
    "AND e.seq <= ?3 ORDER BY e.seq DESC LIMIT 1), json_array_length(h.line, '$.history'), "
    "CASE WHEN json_type(h.line, '$.history') IS NOT 'array' THEN json_extract(h.line, "
    "'$.history', '$.origin.kind', '$.origin.parent', '$.origin.at_seq') END "
    "FROM entries h WHERE h.session_id = ?1 AND h.segment_id = ?2 AND h.seq = 0"
)


@MIGRATIONS
def m005_detached_sessions(conn: sqlite3.Connection) -> None:
    """A session may belong to no context yet (``sessions.context`` NULL), as the crate's
    ``create_segment`` makes one; a partial index finds those."""
    for statement in (
        """CREATE TABLE sessions_new (
            session_id TEXT PRIMARY KEY,
            context TEXT,
            created_at TEXT NOT NULL
        )""",
        "INSERT INTO sessions_new SELECT session_id, context, created_at FROM sessions",
        "DROP TABLE sessions",
        "ALTER TABLE sessions_new RENAME TO sessions",
        "CREATE INDEX sessions_detached ON sessions (session_id) WHERE context IS NULL",
    ):
        conn.execute(statement)


@MIGRATIONS
def m006_transcript_view(conn: sqlite3.Connection) -> None:
    """Views for SQL users: ``transcript_lineage`` (the segments each context's restore reads)
    and ``transcript`` (each context's history, in order, as ``restore`` gives it).

    Each context's lineage is a correlated subquery (a recursive walk up its fork headers,
    read by primary key), so ``WHERE context = ?`` reads that context's segments alone: SQLite
    pushes the filter through the window into both arms (docs/format.md shows the plan).
    SQLite's JSON functions end a text at U+0000, so a ``\\u0000`` escape reads as U+FFFD.
    """
    for statement in (
        # depth 0 is the head; each continuing fork header (history null) names the parent
        # segment it continues up to at_seq. UNION, not UNION ALL: a (corrupt) cycle of
        # headers ends instead of looping. Headers are read by scalar subqueries, not joins:
        # on an analysed database SQLite would build a Bloom filter for such a join, by a scan
        # of the whole entries table (300 ms at 500,000 entries, for a 1 ms read).
        """CREATE VIEW transcript_lineage AS
        SELECT c.context, c.session_id, l.key AS depth,
            json_extract(l.value, '$[0]') AS segment_id,
            json_extract(l.value, '$[1]') AS stop_seq
        FROM contexts AS c CROSS JOIN json_each((
            WITH RECURSIVE chain(segment_id, stop_seq, header) AS (
                SELECT c.segment_id, 2147483647, h.line FROM entries AS h
                WHERE h.session_id = c.session_id AND h.segment_id = c.segment_id
                    AND h.seq = 0
                UNION
                SELECT json_extract(chain.header, '$.origin.parent'),
                    json_extract(chain.header, '$.origin.at_seq'),
                    (SELECT p.line FROM entries AS p WHERE p.session_id = c.session_id
                        AND p.segment_id = json_extract(chain.header, '$.origin.parent')
                        AND p.seq = 0)
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
            'header' AS kind, ({_HEADER.format(column="ts")}) AS ts,
            CASE WHEN j.type IN ('object', 'array') THEN j.value ELSE json_quote(j.value) END
                AS item
        FROM transcript_lineage AS l
        CROSS JOIN json_each(({_HEADER.format(column=_nul_safe("line"))}), '$.history') AS j
        WHERE typeof(j.key) = 'integer'
        UNION ALL
        SELECT l.context, l.session_id, l.segment_id, l.depth, e.seq, NULL, e.kind, e.ts,
            {_nul_safe("e.line")} -> '$.item'
        FROM transcript_lineage AS l
        CROSS JOIN entries AS e ON e.session_id = l.session_id AND e.segment_id = l.segment_id
            AND e.seq BETWEEN 1 AND l.stop_seq
        WHERE e.kind IN ('item', 'system_item', 'user_input')""",
        # text: as model.item_text derives it (see _item_text)
        f"""CREATE VIEW transcript AS
        SELECT context,
            row_number() OVER (PARTITION BY context ORDER BY depth DESC, seq, n) AS position,
            json_extract(item, '$.role') AS role,
            {_item_text("item")} AS text,
            ts AS timestamp,
            json_extract(item, '$.type') AS type,
            kind, session_id, segment_id, seq, n, item
        FROM transcript_items""",
    ):
        conn.execute(statement)


# One lineage segment's header (its seq 0 entry), by primary key.
_HEADER = (
    "SELECT {column} FROM entries WHERE session_id = l.session_id "
    "AND segment_id = l.segment_id AND seq = 0"
)


def _nul_safe(line: str) -> str:
    r"""SQL for ``line`` with each ``\u0000`` escape made ``\ufffd`` (m006).

    Escaped backslashes are set aside as U+0001 first, which valid JSON never holds raw, so
    ``\\u0000`` (a backslash, then "u0000") stays as it is; ``instr`` spares other lines.
    """
    return (
        rf"CASE WHEN instr({line}, '\u0000') THEN replace(replace(replace({line}, '\\', "
        rf"char(1)), '\u0000', '\ufffd'), char(1), '\\') ELSE {line} END"
    )


# The part types whose ``text`` is text, and those only the Responses API uses (a list holding
# one joins its texts with line breaks), as ``terrarium.model`` counts them: copied, not
# imported, since a released migration must not change when the model does.
_TEXT_PARTS = "('text', 'input_text', 'output_text', 'summary_text', 'reasoning_text')"
_RESPONSES_PARTS = (
    "('input_text', 'output_text', 'refusal', 'input_image', 'summary_text', 'reasoning_text')"
)


def _parts_text(item: str, path: str, sep: str | None = None) -> str:
    """SQL for the text at ``path`` of the JSON ``item`` (m006): a string as it is; a list's
    text parts and refusals joined by ``sep`` (SQL), by default ``''`` for Chat parts and a
    line break once a Responses part is among them; else ``''``."""
    part = "json_extract({item}, p.fullkey || '.{key}')"
    kind, text, refusal = (part.format(item=item, key=key) for key in ("type", "text", "refusal"))
    if sep is None:
        sep = (
            f"CASE WHEN EXISTS (SELECT 1 FROM json_each({item}, '{path}') AS p "
            f"WHERE {kind} IN {_RESPONSES_PARTS}) THEN char(10) ELSE '' END"
        )
    return (
        f"CASE json_type({item}, '{path}') "
        f"WHEN 'text' THEN json_extract({item}, '{path}') "
        f"WHEN 'array' THEN (SELECT coalesce(group_concat(t, {sep}), '') FROM ("
        f"SELECT CASE WHEN {kind} IN {_TEXT_PARTS} AND json_type({item}, p.fullkey || '.text') "
        f"= 'text' THEN {text} WHEN {kind} = 'refusal' AND json_type({item}, p.fullkey || "
        f"'.refusal') = 'text' THEN {refusal} END AS t "
        f"FROM json_each({item}, '{path}') AS p ORDER BY p.id)) "
        "ELSE '' END"
    )


def _item_text(item: str) -> str:
    """SQL for ``terrarium.model.item_text`` of the JSON ``item`` (m006): a Chat message's
    content; a Responses ``message``'s parts; a ``function_call_output``'s output; a
    ``reasoning`` item's summary, then its content, paragraphs apart; else ``''``."""
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


@MIGRATIONS
def m007_lifecycle(conn: sqlite3.Connection) -> None:
    """Archived and trashed contexts out of the hot tables, and pins (see ``._lifecycle``):
    a context row and one row per segment holding its lines (and trace) zstandard-compressed."""
    for statement in (
        """CREATE TABLE archived_contexts (
            session_id TEXT PRIMARY KEY,
            context TEXT NOT NULL,
            type TEXT NOT NULL,
            segment_id TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            archived_at TEXT NOT NULL,
            last_active TEXT NOT NULL,
            message_count INTEGER NOT NULL,
            hot_bytes INTEGER NOT NULL,
            archived_bytes INTEGER NOT NULL,
            trash_id TEXT UNIQUE,
            deleted_at TEXT,
            deleted_from TEXT CHECK (deleted_from IN ('hot', 'archived'))
        )""",
        # An id names at most one archived context; trashed ones may share it.
        "CREATE UNIQUE INDEX archived_contexts_live ON archived_contexts (context) "
        "WHERE trash_id IS NULL",
        """CREATE TABLE archived_segments (
            session_id TEXT NOT NULL,
            segment_id TEXT NOT NULL,
            created_at TEXT NOT NULL,
            next_seq INTEGER NOT NULL,
            lines BLOB NOT NULL,
            trace BLOB,
            PRIMARY KEY (session_id, segment_id)
        )""",
        "CREATE TABLE pins (session_id TEXT PRIMARY KEY, pinned_at TEXT NOT NULL)",
    ):
        conn.execute(statement)


@MIGRATIONS
def m008_blobs(conn: sqlite3.Connection) -> None:
    """Large outputs out of the log: ``blobs`` (each blob once, by sha256) and ``blob_refs``
    (which session refers to which blob, written with the entry; GC reads it)."""
    for statement in (
        blob_sql.CREATE_BLOBS,
        blob_sql.CREATE_BLOB_REFS,
        blob_sql.CREATE_BLOB_REFS_DIGEST,
    ):
        conn.execute(statement)


@MIGRATIONS
def m009_notify(conn: sqlite3.Connection) -> None:
    """Nothing to change: PostgreSQL's ``m009_notify`` adds triggers that send change notes
    (LISTEN/NOTIFY), which SQLite has no counterpart of (its live views poll the derived
    state). Registered so that both backends' schemas keep the same steps in the same order
    (``tests/test_migrations.py``)."""
    del conn


@MIGRATIONS
def m010_listing_sorts(conn: sqlite3.Connection) -> None:
    """An index per order the dashboard's sessions list pages in (last active, created,
    messages; ties by context id), so a page is a walk of its own rows (``PagedListing``)."""
    for statement in (
        # Covers the signatures too (context_signatures): three narrow columns.
        "CREATE INDEX contexts_by_last_active ON contexts (last_active, context, message_count)",
        "CREATE INDEX contexts_by_created ON contexts (created_at, context)",
        "CREATE INDEX contexts_by_messages ON contexts (message_count, context)",
    ):
        conn.execute(statement)


@MIGRATIONS
def m011_search_rows_without_text(conn: sqlite3.Connection) -> None:
    """Nothing to change: PostgreSQL's ``m011_search_rows_without_text`` drops the copies of
    the items' texts from its search rows. Registered so that both backends' schemas keep the
    same steps in the same order (``tests/test_migrations.py``)."""
    del conn


@MIGRATIONS
def m012_notify_only_when_listened(conn: sqlite3.Connection) -> None:
    """Nothing to change: PostgreSQL's ``m012_notify_only_when_listened`` switches its change
    notes (``m009_notify``) on only while someone listens. Registered so that both backends'
    schemas keep the same steps in the same order (``tests/test_migrations.py``)."""
    del conn


@MIGRATIONS
def m013_segment_keys(conn: sqlite3.Connection) -> None:
    """Entries keyed by a small integer segment key instead of two 36-character ids.

    ``segments`` gets ``id INTEGER PRIMARY KEY AUTOINCREMENT`` (its rowids, kept), and
    ``entries`` becomes ``(id, seg, seq, kind, ts, line)``, ``UNIQUE (seg, seq)``: a message
    takes 528 bytes (row and key) instead of 684 at 100k messages (``benchmarks/README.md``).
    Entries keep their ids, so arrival order and ``search_meta.wm`` stay valid.
    ``AUTOINCREMENT``: a key, once committed, never names another segment, so a store may
    cache it (``SqliteStore.append``). The m006 views are made again on the new keys, with
    the same rows. One ``INSERT ... SELECT`` per table, in the migration's transaction (0.7 s
    for 100k entries); the old tables' pages stay in the file as free pages, which later
    writes reuse (``VACUUM`` returns them to the file system).
    """
    for view in ("transcript", "transcript_items", "transcript_lineage"):
        conn.execute(f"DROP VIEW {view}")  # else the renames below refuse their old columns
    for statement in (
        """CREATE TABLE segments_keyed (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            session_id TEXT NOT NULL,
            segment_id TEXT NOT NULL,
            created_at TEXT NOT NULL,
            UNIQUE (session_id, segment_id)
        )""",
        "INSERT INTO segments_keyed (id, session_id, segment_id, created_at) "
        "SELECT rowid, session_id, segment_id, created_at FROM segments ORDER BY rowid",
        _M013_ORPHANS,
        """CREATE TABLE entries_keyed (
            id INTEGER PRIMARY KEY,
            seg INTEGER NOT NULL,
            seq INTEGER NOT NULL,
            kind TEXT NOT NULL,
            ts TEXT NOT NULL,
            line TEXT NOT NULL,
            UNIQUE (seg, seq)
        )""",
        # CROSS JOIN: the entries in id order, each finding its key by the unique index.
        "INSERT INTO entries_keyed (id, seg, seq, kind, ts, line) "
        "SELECT e.id, g.id, e.seq, e.kind, e.ts, e.line FROM entries AS e "
        "CROSS JOIN segments_keyed AS g "
        "ON g.session_id = e.session_id AND g.segment_id = e.segment_id ORDER BY e.id",
        "DROP TABLE entries",
        "DROP TABLE segments",
        "ALTER TABLE segments_keyed RENAME TO segments",
        "ALTER TABLE entries_keyed RENAME TO entries",
        *_M013_VIEWS,
    ):
        conn.execute(statement)


# Entries that no segment row names (the store never wrote such, but a hand-made row must not
# be lost) get one, created at their first entry's time; found by a walk of the old key alone.
_M013_ORPHANS = """INSERT INTO segments_keyed (session_id, segment_id, created_at)
    SELECT o.session_id, o.segment_id, (SELECT h.ts FROM entries AS h
        WHERE h.session_id = o.session_id AND h.segment_id = o.segment_id ORDER BY h.seq LIMIT 1)
    FROM (SELECT DISTINCT session_id, segment_id FROM entries) AS o
    WHERE NOT EXISTS (SELECT 1 FROM segments_keyed AS k
        WHERE k.session_id = o.session_id AND k.segment_id = o.segment_id)"""

# A segment's key by its ids (m013), as a scalar subquery: a join would let SQLite build a
# Bloom filter on entries by scanning them all (see m006).
_SEG = "(SELECT g.id FROM segments AS g WHERE g.session_id = {s} AND g.segment_id = {g})"
_HEAD_SEG = _SEG.format(s="c.session_id", g="c.segment_id")
_PARENT_SEG = _SEG.format(s="c.session_id", g="json_extract(chain.header, '$.origin.parent')")
_LINEAGE_SEG = _SEG.format(s="l.session_id", g="l.segment_id")
# One lineage segment's header (its seq 0 entry), by key (m013).
_HEADER_BY_SEG = f"SELECT {{column}} FROM entries WHERE seg = {_LINEAGE_SEG} AND seq = 0"

# m006's views, reading entries by m013's keys: the same columns and rows.
_M013_VIEWS = (
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


@MIGRATIONS
def m014_staged_search_items(conn: sqlite3.Connection) -> None:
    """``search_recent``'s content is its items from ``floor`` up to ``hw``, no further.

    Items past ``hw`` are now staged in ``search_docs`` by the appends' catch-up and added to
    both FTS5 tables later, by the upkeep thread or the next read
    (:func:`.search.index_staged`). ``search_fts_content`` already ends at ``hw``; this view
    ended nowhere, and would have offered staged items to FTS5's ``'rebuild'`` and
    ``'integrity-check'`` as if ``search_recent`` held them.
    """
    conn.execute("DROP VIEW search_recent_content")
    conn.execute(
        """CREATE VIEW search_recent_content AS SELECT id, body, tags FROM search_docs
            WHERE id >= (SELECT floor FROM search_meta) AND id <= (SELECT hw FROM search_meta)"""
    )


@MIGRATIONS
def m015_session_states(conn: sqlite3.Connection) -> None:
    """Lifecycle is one state record per session (``sessions.state``, JSON, NULL for ``{}``:
    :mod:`terrarium.stores.lifecycle`): the archive, trash and pin rows of m007 become keys of
    it. ``archived_contexts`` keeps only the heads of frozen attached sessions (a trashed
    session is detached: ``sessions.context`` NULL, no head); ``pins`` goes."""
    conn.execute("ALTER TABLE sessions ADD COLUMN state TEXT")
    conn.execute("CREATE INDEX sessions_stated ON sessions (session_id) WHERE state IS NOT NULL")
    pins = {row[0] for row in conn.execute("SELECT session_id FROM pins")}
    for session, context, state in _m015_states(conn, pins):
        conn.execute(
            "UPDATE sessions SET state = ?, context = ? WHERE session_id = ?",
            (codec.encode(state).decode(), context, session),
        )
    for statement in (
        """CREATE TABLE archived_heads (
            session_id TEXT PRIMARY KEY,
            context TEXT NOT NULL UNIQUE,
            type TEXT NOT NULL,
            segment_id TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )""",
        "INSERT INTO archived_heads SELECT session_id, context, type, segment_id, created_at, "
        "updated_at FROM archived_contexts WHERE trash_id IS NULL",
        "DROP TABLE archived_contexts",
        "ALTER TABLE archived_heads RENAME TO archived_contexts",
        "DROP TABLE pins",
    ):
        conn.execute(statement)


def _m015_states(conn: sqlite3.Connection, pins: set[str]) -> list[tuple[str, Any, Any]]:
    """(session, context or NULL, record) for each session m007's tables say something of."""
    rows = conn.execute(
        "SELECT session_id, context, segment_id, created_at, archived_at, last_active, "
        "message_count, hot_bytes, archived_bytes, trash_id, deleted_at, deleted_from "
        "FROM archived_contexts"
    ).fetchall()
    found: list[tuple[str, Any, Any]] = []
    for (
        s,
        context,
        g,
        created,
        archived_at,
        last,
        count,
        hot,
        cold,
        trash_id,
        deleted_at,
        was,
    ) in rows:
        state: dict[str, Any] = {"cold": {"hot_bytes": hot, "cold_bytes": cold}}
        if trash_id is None or was == "archived":
            state["archived"] = {
                "date": created[:10],
                "last_active": last,
                "message_count": count,
                "archived_at": archived_at,
            }
        if trash_id is not None:
            state["trashed"] = {
                "trash_id": trash_id,
                "context": context,
                "date": created[:10],
                "deleted_at": deleted_at,
                "segment_id": g,
                "message_count": count,
                "bytes": cold,
            }
        if s in pins:
            state["pinned"] = True
        found.append((s, context if trash_id is None else None, state))
    hot_pins = conn.execute(
        "SELECT session_id, context FROM sessions WHERE session_id IN (SELECT session_id FROM "
        "pins) AND session_id NOT IN (SELECT session_id FROM archived_contexts)"
    ).fetchall()
    return found + [(s, c, {"pinned": True}) for s, c in hot_pins]
