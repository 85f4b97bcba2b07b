"""``PostgresStore``'s schema migrations, on the registry every database backend shares.

Each step runs in its own transaction with its record, under a transaction-level advisory lock,
so processes opening the store at the same time apply each step once. The steps write
unqualified names: ``migrate`` puts the store's schema on their ``search_path``. ``m001_initial``
builds the whole schema (the squash: :data:`terrarium.stores.migrations.PRE_SQUASH`). Never edit
a released step; add the next.

Usage::

    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, "terrarium", where="db.example (schema terrarium)")
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from terrarium.stores.migrations import PRE_SQUASH, RESPONSES_PARTS_SQL, TEXT_PARTS_SQL, Migrations
from terrarium.stores.postgres import _sql

MIGRATIONS: Migrations[psycopg.Connection[Any]] = Migrations("postgres", squashed=PRE_SQUASH)


def migrate(conn: psycopg.Connection[Any], schema: str, *, where: str) -> list[str]:
    """Create ``schema`` if needed and apply pending migrations on the autocommit ``conn``;
    return the names applied.

    Raises:
        ValueError: ``schema`` is not a plain lowercase name.
        FormatVersionError: the schema records a migration this version does not know.
    """
    name = _sql.schema_identifier(schema)
    table = name.as_string(conn) + ".migrations"
    done: list[str] = []
    key = _sql.lock_key(schema, "migrate")
    while True:
        with conn.transaction():
            conn.execute(_sql.XACT_LOCK, (key,))
            found = conn.execute(_sql.FIND_TABLE, (table,)).fetchone()
            if found is None or found[0] is None:
                conn.execute(_sql.CREATE_SCHEMA.format(schema=name))
                conn.execute(_sql.CREATE_MIGRATIONS.format(schema=name))
            applied = [row[0] for row in conn.execute(_sql.APPLIED.format(schema=name))]
            old = MIGRATIONS.squashed(applied)
            if old:
                conn.execute(_sql.FORGET_MIGRATIONS.format(schema=name), (old,))
            pending = MIGRATIONS.pending(applied, where=where)
            if not pending:
                return done
            step = pending[0]
            conn.execute(_sql.MIGRATE_IN.format(schema=name))
            step.apply(conn)
            conn.execute(_sql.RECORD_MIGRATION.format(schema=name), (step.name,))
            done.append(step.name)


@MIGRATIONS
def m001_initial(conn: psycopg.Connection[Any]) -> None:
    """The whole schema (see ``._sql`` for what each table holds)."""
    (schema,) = conn.execute("SELECT current_schema()").fetchone() or ("",)
    path = sql.SQL("SET search_path = {}, pg_temp").format(sql.Identifier(schema))
    for statement in (*_TABLES, *_NOTIFY, *_VIEWS):
        conn.execute(statement)
    for body in (_FEED_JOIN, _FEED_LEAVE):
        conn.execute(sql.SQL(body).format(path=path))
    for body in _CHANGES:
        conn.execute(sql.SQL(body).format(schema=sql.Identifier(schema)))
    conn.execute("ALTER TABLE segments DISABLE TRIGGER segments_notify")


_TABLES = (
    # Heads. Listing and search are the derived index's (:mod:`terrarium.index`), on each
    # machine that reads them: the store keeps no counts of its own.
    """CREATE TABLE contexts (
        context text PRIMARY KEY,
        type text NOT NULL,
        session_id uuid NOT NULL,
        segment_id uuid NOT NULL,
        created_at text NOT NULL,
        updated_at text NOT NULL
    )""",
    "CREATE INDEX contexts_by_type ON contexts (type)",
    "CREATE INDEX contexts_by_session ON contexts (session_id)",
    # context NULL: detached; state: the lifecycle's record (JSON text, NULL for {}).
    """CREATE TABLE sessions (
        session_id uuid PRIMARY KEY,
        context text,
        created_at text NOT NULL,
        state text
    )""",
    "CREATE INDEX sessions_detached ON sessions (session_id) WHERE context IS NULL",
    "CREATE INDEX sessions_stated ON sessions (session_id) WHERE state IS NOT NULL",
    # Each segment's row carries its tail: an append moves this row instead of checking
    # foreign keys on entries, and its room on each page (fillfactor) keeps that update HOT.
    """CREATE TABLE segments (
        session_id uuid NOT NULL REFERENCES sessions ON DELETE CASCADE,
        segment_id uuid NOT NULL,
        created_at text NOT NULL,
        next_seq integer NOT NULL DEFAULT 1,
        PRIMARY KEY (session_id, segment_id)
    ) WITH (fillfactor = 50)""",
    # Lines stay text, cast to jsonb as they are read (line_jsonb, below).
    """CREATE TABLE entries (
        session_id uuid NOT NULL,
        segment_id uuid NOT NULL,
        seq integer NOT NULL,
        kind text NOT NULL,
        ts text NOT NULL,
        line text NOT NULL,
        PRIMARY KEY (session_id, segment_id, seq)
    )""",
    """CREATE TABLE traces (
        session_id uuid NOT NULL,
        segment_id uuid NOT NULL,
        n bigint GENERATED ALWAYS AS IDENTITY,
        line text NOT NULL,
        PRIMARY KEY (session_id, segment_id, n),
        FOREIGN KEY (session_id, segment_id) REFERENCES segments ON DELETE CASCADE
    )""",
    # Frozen sessions (``.._sqlbase``): the heads of the attached ones, and each segment's
    # lines (and trace) zstandard-compressed, with its tail and counts. A unique index, not a
    # unique key, on context: a unique key would not start with session_id (Citus).
    """CREATE TABLE archived_contexts (
        session_id uuid PRIMARY KEY,
        context text NOT NULL,
        type text NOT NULL,
        segment_id uuid NOT NULL,
        created_at text NOT NULL,
        updated_at text NOT NULL
    )""",
    "CREATE UNIQUE INDEX archived_contexts_context ON archived_contexts (context)",
    """CREATE TABLE archived_segments (
        session_id uuid NOT NULL,
        segment_id uuid NOT NULL,
        created_at text NOT NULL,
        next_seq integer NOT NULL,
        lines bytea NOT NULL,
        trace bytea,
        PRIMARY KEY (session_id, segment_id)
    )""",
    """CREATE TABLE blobs (
        digest text PRIMARY KEY,
        size bigint NOT NULL,
        data bytea NOT NULL,
        stored_at double precision NOT NULL
    )""",
    """CREATE TABLE blob_refs (
        digest text NOT NULL,
        session_id uuid NOT NULL,
        PRIMARY KEY (session_id, digest)
    )""",
    "CREATE INDEX blob_refs_digest ON blob_refs (digest)",
)

# The change cursor the derived index follows (``PostgresStore.changes``): for each session,
# the id (``xid8``) of the last transaction that wrote it, in that transaction. An append's
# statement notes it itself (``_sql.APPEND_ONE``: measured cheaper than a row trigger);
# triggers on the rows every other write already touches keep it: a new or dropped segment
# (a create, a freeze, a thaw, a delete), a head added, moved or dropped. A deleted
# session keeps its row, so the reader hears of the delete. ``store_meta`` holds the store's
# id, made once: with where the store is, it names the index file on each machine
# (PostgresStore.store_id). The function names its table with the schema, read when it was
# made: no search_path set per call, which would cost every append.
_CHANGES = (
    """CREATE TABLE {schema}.session_changes (
        session_id uuid PRIMARY KEY,
        xid xid8 NOT NULL
    )""",
    "CREATE INDEX session_changes_by_xid ON {schema}.session_changes (xid)",
    """CREATE TABLE {schema}.store_meta (
        key text PRIMARY KEY,
        value text NOT NULL
    )""",
    "INSERT INTO {schema}.store_meta VALUES ('store_id', gen_random_uuid()::text)",
    """CREATE FUNCTION {schema}.note_change() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO {schema}.session_changes AS c (session_id, xid)
        VALUES (CASE TG_OP WHEN 'DELETE' THEN OLD.session_id ELSE NEW.session_id END,
            pg_current_xact_id())
        ON CONFLICT (session_id) DO UPDATE SET xid = excluded.xid WHERE c.xid <> excluded.xid;
        RETURN NULL;
    END $$""",
    """CREATE TRIGGER segments_change AFTER INSERT OR DELETE
    ON {schema}.segments FOR EACH ROW EXECUTE FUNCTION {schema}.note_change()""",
    """CREATE TRIGGER contexts_change AFTER INSERT OR UPDATE OR DELETE
    ON {schema}.contexts FOR EACH ROW EXECUTE FUNCTION {schema}.note_change()""",
)

# Change notes for live views (LISTEN/NOTIFY, :mod:`.notify`): every append, new segment and
# head change sends ``pg_notify`` on the channel ``terrarium.<schema>``, with ``session:<id>``
# or ``context:<id>`` as payload, once per distinct payload when its transaction commits.
# The append path's trigger (segments_notify) is on only while a ChangeFeed listens: it
# measured 1.05x an append's median with no listener, 1.22x while other writers appended at
# once (benchmarks/README.md); feed_join and feed_leave (below) switch it.
_NOTIFY = (
    """CREATE FUNCTION notify_segment() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('terrarium.' || TG_TABLE_SCHEMA, 'session:' || NEW.session_id);
        RETURN NULL;
    END $$""",
    """CREATE FUNCTION notify_context() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'DELETE' THEN
            PERFORM pg_notify('terrarium.' || TG_TABLE_SCHEMA, 'context:' || OLD.context);
        ELSE
            PERFORM pg_notify('terrarium.' || TG_TABLE_SCHEMA, 'context:' || NEW.context);
        END IF;
        RETURN NULL;
    END $$""",
    """CREATE TRIGGER segments_notify AFTER INSERT OR UPDATE OF next_seq ON segments
    FOR EACH ROW EXECUTE FUNCTION notify_segment()""",
    """CREATE TRIGGER contexts_notify AFTER INSERT OR UPDATE OR DELETE ON contexts
    FOR EACH ROW EXECUTE FUNCTION notify_context()""",
)

# A feed holds the shared advisory lock ``listening`` for its connection's life (the server
# drops it with the connection, a crash included); ``toggle``, taken for the transaction,
# orders joins and leaves. A join turns the trigger on before its LISTEN commits, and a
# ``DISABLE`` or ``ENABLE`` waits for the appends in flight (its lock conflicts with theirs),
# so every append that commits after a feed has joined notifies it. The last feed to leave
# (no one else holds ``listening``) turns it off, unless a long transaction holds the table
# (then it stays on); one that died without leaving leaves it on, until the next feed leaves.
_FEED_JOIN = """CREATE FUNCTION feed_join(toggle bigint, listening bigint) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER {path} AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(toggle);
    PERFORM pg_advisory_lock_shared(listening);
    IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'segments'::regclass
            AND tgname = 'segments_notify' AND tgenabled = 'D') THEN
        ALTER TABLE segments ENABLE TRIGGER segments_notify;
    END IF;
END $$"""
_FEED_LEAVE = """CREATE FUNCTION feed_leave(toggle bigint, listening bigint) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER {path} AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(toggle);
    PERFORM pg_advisory_unlock_shared(listening);
    IF pg_try_advisory_xact_lock(listening) THEN
        -- Appends queue behind the waiting ALTER: give up soon behind a long transaction
        -- (an archive, a large catch-up) and leave the notes on.
        SET LOCAL lock_timeout = '100ms';
        ALTER TABLE segments DISABLE TRIGGER segments_notify;
    END IF;
EXCEPTION WHEN lock_not_available THEN
    NULL;
END $$"""


def _parts_text(value: str, sep: str | None = None) -> str:
    """SQL for the text of the ``jsonb`` ``value``: a string as it is; a list's text
    parts and refusals joined by ``sep`` (SQL), by default ``''`` for Chat parts and a line
    break once a Responses part is among them; else ``''``."""
    if sep is None:
        sep = (
            f"CASE WHEN EXISTS (SELECT 1 FROM jsonb_array_elements({value}) AS r(p) "
            f"WHERE p ->> 'type' IN {RESPONSES_PARTS_SQL}) THEN chr(10) ELSE '' END"
        )
    return (
        f"CASE jsonb_typeof({value}) WHEN 'string' THEN {value} #>> '{{}}' "
        f"WHEN 'array' THEN (SELECT coalesce(string_agg(t, {sep} ORDER BY i), '') FROM ("
        f"SELECT i, CASE WHEN p ->> 'type' IN {TEXT_PARTS_SQL} AND jsonb_typeof(p -> 'text') = "
        "'string' THEN p ->> 'text' WHEN p ->> 'type' = 'refusal' AND "
        "jsonb_typeof(p -> 'refusal') = 'string' THEN p ->> 'refusal' END AS t "
        f"FROM jsonb_array_elements({value}) WITH ORDINALITY AS x(p, i)) AS q "
        "WHERE t IS NOT NULL) "
        "ELSE '' END"
    )


def _item_text(item: str) -> str:
    """SQL for ``terrarium.model.item_text`` of the ``jsonb`` ``item``: a Chat
    message's content; a Responses ``message``'s parts; a ``function_call_output``'s output;
    a ``reasoning`` item's summary, then its content, paragraphs apart; else ``''``."""
    paragraphs = "chr(10) || chr(10)"
    summary = _parts_text(f"{item} -> 'summary'", paragraphs)
    content = _parts_text(f"{item} -> 'content'", paragraphs)
    return (
        f"CASE WHEN NOT {item} ? 'type' OR {item} ->> 'type' = 'message' "
        f"THEN {_parts_text(f'{item} -> {chr(39)}content{chr(39)}')} "
        f"WHEN {item} ->> 'type' = 'function_call_output' "
        f"THEN {_parts_text(f'{item} -> {chr(39)}output{chr(39)}')} "
        f"WHEN {item} ->> 'type' = 'reasoning' THEN array_to_string(array_remove("
        f"ARRAY[{summary}, {content}], ''), {paragraphs}) "
        "ELSE '' END"
    )


# Views for SQL users: entries_json (each entry as jsonb), transcript_lineage (the segments
# each context's restore reads) and transcript (each context's history, in order, as restore
# gives it). Each context's lineage is a LATERAL recursive walk up its fork headers by primary
# key, so ``WHERE context = ...`` reads that context's segments alone. jsonb cannot hold
# U+0000, so line_jsonb reads a ``\\u0000`` escape as U+FFFD instead of failing.
_VIEWS = (
    # Escaped backslashes are set aside as U+0001 (which valid JSON never holds raw), so that
    # "\\u0000" (a backslash, then "u0000") stays; strpos spares the other lines. Cast when
    # read, not stored: a generated jsonb column measured 1.34x the batched append's cost per
    # row and 1.42x the disk, for reads 2.4x faster (benchmarks/bench_pg_jsonb.py).
    r"""CREATE FUNCTION line_jsonb(line text) RETURNS jsonb
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
        SELECT (CASE WHEN strpos(line, '\u0000') = 0 THEN line
            ELSE replace(replace(replace(line, '\\', chr(1)), '\u0000', '\ufffd'),
                chr(1), '\\') END)::jsonb
    $$""",
    """CREATE VIEW entries_json AS
    SELECT session_id, segment_id, seq, kind, ts, line_jsonb(line) AS entry FROM entries""",
    # depth 0 is the head; each continuing fork header (history null) names the parent
    # segment it continues up to at_seq. ``path`` ends a (corrupt) cycle of headers.
    """CREATE VIEW transcript_lineage AS
    SELECT c.context, c.session_id, l.depth, l.segment_id, l.stop_seq, l.header
    FROM contexts AS c CROSS JOIN LATERAL (
        WITH RECURSIVE chain(depth, segment_id, stop_seq, header, path) AS (
            SELECT 0, h.segment_id, 2147483647, line_jsonb(h.line), ARRAY[h.segment_id]
            FROM entries AS h
            WHERE h.session_id = c.session_id AND h.segment_id = c.segment_id
                AND h.seq = 0
            UNION ALL
            SELECT chain.depth + 1, p.segment_id,
                (chain.header -> 'origin' ->> 'at_seq')::integer, line_jsonb(p.line),
                chain.path || p.segment_id
            FROM chain JOIN entries AS p ON p.session_id = c.session_id
                AND p.segment_id = (chain.header -> 'origin' ->> 'parent')::uuid
                AND p.seq = 0
            WHERE chain.header -> 'origin' ->> 'kind' = 'fork'
                AND coalesce(jsonb_typeof(chain.header -> 'history'), 'null') = 'null'
                AND NOT p.segment_id = ANY (chain.path)
        )
        SELECT depth, segment_id, stop_seq, header FROM chain
    ) AS l""",
    # The oldest segment of a lineage may start with a history (a root, compaction, clear,
    # import, fork into another context); then come the history entries of each segment,
    # oldest segment first, up to the seq its child continues after.
    """CREATE VIEW transcript_items AS
    SELECT l.context, l.session_id, l.segment_id, l.depth, 0 AS seq,
        (j.n - 1)::integer AS n, 'header' AS kind, l.header ->> 'ts' AS ts, j.item
    FROM transcript_lineage AS l CROSS JOIN LATERAL jsonb_array_elements(
        CASE WHEN jsonb_typeof(l.header -> 'history') = 'array' THEN l.header -> 'history'
        END) WITH ORDINALITY AS j(item, n)
    UNION ALL
    SELECT l.context, l.session_id, l.segment_id, l.depth, e.seq, NULL, e.kind, e.ts,
        line_jsonb(e.line) -> 'item'
    FROM transcript_lineage AS l JOIN entries AS e ON e.session_id = l.session_id
        AND e.segment_id = l.segment_id AND e.seq BETWEEN 1 AND l.stop_seq
    WHERE e.kind IN ('item', 'system_item', 'user_input')""",
    # text: as model.item_text derives it (see _item_text)
    f"""CREATE VIEW transcript AS
    SELECT context,
        row_number() OVER (PARTITION BY context ORDER BY depth DESC, seq, n) AS position,
        item ->> 'role' AS role,
        {_item_text("item")} AS text,
        ts AS timestamp,
        item ->> 'type' AS type,
        kind, session_id, segment_id, seq, n, item
    FROM transcript_items""",
)
