"""``PostgresStore``'s schema migrations: :func:`migrate` and the released steps.

The registry is the one every database backend shares (:mod:`terrarium.stores.migrations`).
Each step runs in its own transaction with its record, under a transaction-level advisory lock,
so processes opening the store at the same time apply each step once. The steps write
unqualified names: ``migrate`` puts the store's schema on their ``search_path``. Released
steps are history: never edit one, add the next.

Usage::

    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, "terrarium", where="db.example (schema terrarium)")
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

import msgspec
import psycopg
from psycopg import sql

from terrarium import codec
from terrarium.model import SegmentId
from terrarium.stores.base import HISTORY_KINDS_SQL
from terrarium.stores.migrations import Migrations
from terrarium.stores.postgres import _blobs as blob_sql
from terrarium.stores.postgres import _sql
from terrarium.stores.postgres.search import base_items, line_docs, search_words

MIGRATIONS: Migrations[psycopg.Connection[Any]] = Migrations("postgres")


def migrate(
    conn: psycopg.Connection[Any], schema: str, *, where: str, stop_after: str | None = None
) -> list[str]:
    """Create ``schema`` if needed and apply pending migrations; return the names applied.

    ``conn`` must be in autocommit mode. ``stop_after`` (for tests) stops after that migration.

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
            conn.execute(_sql.LOCK_MIGRATIONS, (key,))
            found = conn.execute(_sql.FIND_TABLE, (table,)).fetchone()
            if found is None or found[0] is None:
                conn.execute(_sql.CREATE_SCHEMA.format(schema=name))
                conn.execute(_sql.CREATE_MIGRATIONS.format(schema=name))
            applied = [row[0] for row in conn.execute(_sql.APPLIED.format(schema=name))]
            pending = MIGRATIONS.pending(applied, where=where)
            if not pending or (stop_after is not None and stop_after in applied):
                return done
            step = pending[0]
            conn.execute(_sql.MIGRATE_IN.format(schema=name))
            step.apply(conn)
            conn.execute(_sql.RECORD_MIGRATION.format(schema=name), (step.name,))
            done.append(step.name)


@MIGRATIONS
def m001_initial(conn: psycopg.Connection[Any]) -> None:
    """Heads, sessions, segments and entries."""
    for statement in (
        """CREATE TABLE contexts (
            context text PRIMARY KEY,
            type text NOT NULL,
            session_id uuid NOT NULL,
            segment_id uuid NOT NULL,
            created_at text NOT NULL,
            updated_at text NOT NULL
        )""",
        "CREATE INDEX contexts_by_type ON contexts (type)",
        """CREATE TABLE sessions (
            session_id uuid PRIMARY KEY,
            context text NOT NULL,
            created_at text NOT NULL
        )""",
        """CREATE TABLE segments (
            session_id uuid NOT NULL REFERENCES sessions ON DELETE CASCADE,
            segment_id uuid NOT NULL,
            created_at text NOT NULL,
            PRIMARY KEY (session_id, segment_id)
        )""",
        """CREATE TABLE entries (
            session_id uuid NOT NULL,
            segment_id uuid NOT NULL,
            seq integer NOT NULL,
            kind text NOT NULL,
            ts text NOT NULL,
            body jsonb,
            line text NOT NULL,
            PRIMARY KEY (session_id, segment_id, seq),
            FOREIGN KEY (session_id, segment_id) REFERENCES segments ON DELETE CASCADE
        )""",
    ):
        conn.execute(statement)


@MIGRATIONS
def m002_traces(conn: psycopg.Connection[Any]) -> None:
    """Debug traces of raw stream events, per segment."""
    conn.execute(
        """CREATE TABLE traces (
            session_id uuid NOT NULL,
            segment_id uuid NOT NULL,
            n bigint GENERATED ALWAYS AS IDENTITY,
            line text NOT NULL,
            PRIMARY KEY (session_id, segment_id, n),
            FOREIGN KEY (session_id, segment_id) REFERENCES segments ON DELETE CASCADE
        )"""
    )


@MIGRATIONS
def m003_search(conn: psycopg.Connection[Any]) -> None:
    """Full-text search over history items (tsvector, GIN), backfilled from the entries."""
    for statement in (
        # One row per history item with text, keyed and distributed like entries. ``words``
        # is ``body`` folded for search (see search_words); ``id`` orders items by arrival,
        # for ranking common words among their most recent matches.
        """CREATE TABLE search_docs (
            session_id uuid NOT NULL,
            segment_id uuid NOT NULL,
            seq integer NOT NULL,
            n integer NOT NULL,
            id bigint GENERATED ALWAYS AS IDENTITY,
            type text NOT NULL,
            role text NOT NULL,
            ts text NOT NULL,
            body text NOT NULL,
            words text NOT NULL,
            tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, words)) STORED,
            PRIMARY KEY (session_id, segment_id, seq, n),
            FOREIGN KEY (session_id, segment_id) REFERENCES segments ON DELETE CASCADE
        )""",
        "CREATE INDEX search_docs_tsv ON search_docs USING gin (tsv)",
        "CREATE INDEX search_docs_recent ON search_docs (id)",
    ):
        conn.execute(statement)
    insert = (
        "INSERT INTO search_docs (session_id, segment_id, seq, n, type, role, ts, body, words) "
        "SELECT x.session_id, x.segment_id, x.seq, x.n, "
        "coalesce(split_part(s.context, ':', 1), ''), x.role, x.ts, x.body, x.words "
        "FROM unnest(%s::uuid[], %s::uuid[], %s::int[], %s::int[], %s::text[], %s::text[], "
        "%s::text[], %s::text[]) AS x(session_id, segment_id, seq, n, role, ts, body, words) "
        "LEFT JOIN sessions AS s ON s.session_id = x.session_id"
    )
    batch: list[tuple[Any, ...]] = []

    def flush() -> None:
        if batch:
            conn.execute(insert, [list(column) for column in zip(*batch, strict=True)])
            batch.clear()

    with conn.cursor(name="terrarium_search_backfill") as cursor:
        cursor.execute(
            "SELECT session_id, segment_id, seq, line FROM entries "
            "WHERE seq = 0 OR kind IN ('user_input', 'item', 'system_item') "
            "ORDER BY ts, session_id, segment_id, seq"
        )
        for session_id, segment_id, seq, text in cursor:
            line = codec.decode(text)
            ts = str(line.get("ts", "")) if isinstance(line, dict) else ""
            for n, _, role, body in line_docs(seq, line):
                batch.append((session_id, segment_id, seq, n, role, ts, body, search_words(body)))
            if len(batch) >= 5000:
                flush()
    flush()


@MIGRATIONS
def m004_derived_state(conn: psycopg.Connection[Any]) -> None:
    """Each segment's row carries its tail, its listing counts and how far the search index
    has read it: an append moves the row instead of checking foreign keys, and the search
    index catches up per segment instead of in every append. Entries lose their JSONB copy."""
    for statement in (
        "ALTER TABLE segments ADD COLUMN type text NOT NULL DEFAULT '', "
        "ADD COLUMN next_seq integer NOT NULL DEFAULT 1, "
        "ADD COLUMN items integer NOT NULL DEFAULT 0, "
        "ADD COLUMN base_items integer NOT NULL DEFAULT 0, "
        "ADD COLUMN last_ts text NOT NULL DEFAULT '', "
        "ADD COLUMN indexed_seq integer NOT NULL DEFAULT 0, "
        "ADD COLUMN dirty boolean NOT NULL DEFAULT false",
        # Room on each page for the row's new versions: an append's update stays HOT.
        "ALTER TABLE segments SET (fillfactor = 50)",
        "UPDATE segments AS g SET next_seq = x.last + 1, indexed_seq = x.last, items = x.items, "
        "last_ts = x.ts FROM (SELECT session_id, segment_id, max(seq) AS last, "
        f"count(*) FILTER (WHERE seq > 0 AND kind IN {HISTORY_KINDS_SQL}) AS items, "
        "(array_agg(ts ORDER BY seq DESC))[1] AS ts FROM entries "
        "GROUP BY session_id, segment_id) AS x "
        "WHERE g.session_id = x.session_id AND g.segment_id = x.segment_id",
        "UPDATE segments AS g SET type = split_part(s.context, ':', 1) FROM sessions AS s "
        "WHERE s.session_id = g.session_id",
        "CREATE INDEX segments_dirty ON segments (session_id, segment_id) WHERE dirty",
        "ALTER TABLE entries DROP COLUMN body",
    ):
        conn.execute(statement)
    for table in ("entries", "search_docs"):
        names = conn.execute(
            "SELECT conname FROM pg_constraint WHERE contype = 'f' AND conrelid = %s::regclass",
            (table,),
        ).fetchall()
        for (name,) in names:
            conn.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
    # Each segment's base, from its header; a fork's from its parent's, computed first.
    headers: dict[tuple[Any, Any], Any] = {}
    for session_id, segment_id, text in conn.execute(
        "SELECT session_id, segment_id, line FROM entries WHERE seq = 0"
    ):
        try:
            headers[session_id, segment_id] = codec.decode(text)
        except msgspec.DecodeError:
            headers[session_id, segment_id] = {}
    counts = {
        (row[0], row[1]): (row[2], row[3])
        for row in conn.execute("SELECT session_id, segment_id, items, next_seq FROM segments")
    }
    bases: dict[tuple[Any, Any], int] = {}

    def parent_key(key: tuple[Any, Any]) -> tuple[Any, Any] | None:
        origin = headers.get(key, {}).get("origin")
        if headers.get(key, {}).get("history") is not None or not isinstance(origin, dict):
            return None
        try:
            return (key[0], uuid.UUID(str(origin.get("parent"))))
        except ValueError:
            return None

    def prefix(session: Any, parent: SegmentId, at: int | None) -> int | None:
        key = (session, parent)
        if key not in counts:
            return None
        items, next_seq = counts[key]
        if at is not None and at < next_seq - 1:
            row = conn.execute(
                "SELECT count(*) FROM entries WHERE session_id = %s AND segment_id = %s "
                f"AND seq BETWEEN 1 AND %s AND kind IN {HISTORY_KINDS_SQL}",
                (session, parent, at),
            ).fetchone()
            items = row[0] if row else 0
        return int(bases.get(key, 0) + items)

    for key in counts:  # parents first: walk up each chain of forks, then count down it
        chain: list[tuple[Any, Any]] = []
        at: tuple[Any, Any] | None = key
        while at is not None and at not in bases and at not in chain:
            chain.append(at)
            at = parent_key(at)
        for link in reversed(chain):
            header = headers.get(link)
            bases[link] = (
                base_items(header, functools.partial(prefix, link[0]))
                if isinstance(header, dict)
                else 0
            )
    rows = [(bases[key], key[0], key[1]) for key in counts]
    conn.execute(
        "UPDATE segments AS g SET base_items = x.base FROM unnest(%s::int[], %s::uuid[], "
        "%s::uuid[]) AS x(base, session_id, segment_id) "
        "WHERE g.session_id = x.session_id AND g.segment_id = x.segment_id AND x.base <> 0",
        ([row[0] for row in rows], [row[1] for row in rows], [row[2] for row in rows]),
    )
    # The heads carry their listing counts, in a covering index in listing order.
    for statement in (
        "ALTER TABLE contexts ADD COLUMN message_count integer NOT NULL DEFAULT 0, "
        "ADD COLUMN last_active text NOT NULL DEFAULT ''",
        "UPDATE contexts AS c SET message_count = g.base_items + g.items, "
        "last_active = g.last_ts FROM segments AS g "
        "WHERE g.session_id = c.session_id AND g.segment_id = c.segment_id",
        'CREATE INDEX contexts_listing ON contexts ((type COLLATE "C"), '
        '(substr(context, length(type) + 2) COLLATE "C")) INCLUDE (context, created_at, '
        "message_count, last_active, updated_at, session_id, segment_id)",
        "CREATE INDEX contexts_by_session ON contexts (session_id)",
    ):
        conn.execute(statement)


@MIGRATIONS
def m005_detached_sessions(conn: psycopg.Connection[Any]) -> None:
    """A session may belong to no context yet (``sessions.context`` NULL), as the crate's
    ``create_segment`` makes one; a partial index finds those."""
    conn.execute("ALTER TABLE sessions ALTER COLUMN context DROP NOT NULL")
    conn.execute("CREATE INDEX sessions_detached ON sessions (session_id) WHERE context IS NULL")


@MIGRATIONS
def m006_transcript_view(conn: psycopg.Connection[Any]) -> None:
    """Views for SQL users: ``entries_json`` (each entry as ``jsonb``), ``transcript_lineage``
    (the segments each context's restore reads) and ``transcript`` (each context's history, in
    order, as ``restore`` gives it).

    Lines stay ``text``, cast to ``jsonb`` as they are read (``line_jsonb``; the cost of a
    stored ``jsonb`` copy is measured in ``benchmarks/bench_pg_jsonb.py``). ``jsonb`` cannot
    hold U+0000, so ``line_jsonb`` reads a ``\\u0000`` escape as U+FFFD instead of failing.
    Each context's lineage is a ``LATERAL`` recursive walk up its fork headers by primary key,
    so ``WHERE context = ...`` reads that context's segments alone.
    """
    for statement in (
        # Escaped backslashes are set aside as U+0001 (which valid JSON never holds raw), so
        # that "\\u0000" (a backslash, then "u0000") stays; strpos spares the other lines.
        # Cast when read, not stored: a generated jsonb column measured 1.34x the batched
        # append's cost per row and 1.42x the disk, for reads 2.4x faster
        # (benchmarks/bench_pg_jsonb.py, figures in benchmarks/README.md).
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
    ):
        conn.execute(statement)


# The part types whose ``text`` is text, and those only the Responses API uses (a list holding
# one joins its texts with line breaks), as ``terrarium.model`` counts them: copied, not
# imported, since a released migration must not change when the model does.
_TEXT_PARTS = "('text', 'input_text', 'output_text', 'summary_text', 'reasoning_text')"
_RESPONSES_PARTS = (
    "('input_text', 'output_text', 'refusal', 'input_image', 'summary_text', 'reasoning_text')"
)


def _parts_text(value: str, sep: str | None = None) -> str:
    """SQL for the text of the ``jsonb`` ``value`` (m006): a string as it is; a list's text
    parts and refusals joined by ``sep`` (SQL), by default ``''`` for Chat parts and a line
    break once a Responses part is among them; else ``''``."""
    if sep is None:
        sep = (
            f"CASE WHEN EXISTS (SELECT 1 FROM jsonb_array_elements({value}) AS r(p) "
            f"WHERE p ->> 'type' IN {_RESPONSES_PARTS}) THEN chr(10) ELSE '' END"
        )
    return (
        f"CASE jsonb_typeof({value}) WHEN 'string' THEN {value} #>> '{{}}' "
        f"WHEN 'array' THEN (SELECT coalesce(string_agg(t, {sep} ORDER BY i), '') FROM ("
        f"SELECT i, CASE WHEN p ->> 'type' IN {_TEXT_PARTS} AND jsonb_typeof(p -> 'text') = "
        "'string' THEN p ->> 'text' WHEN p ->> 'type' = 'refusal' AND "
        "jsonb_typeof(p -> 'refusal') = 'string' THEN p ->> 'refusal' END AS t "
        f"FROM jsonb_array_elements({value}) WITH ORDINALITY AS x(p, i)) AS q "
        "WHERE t IS NOT NULL) "
        "ELSE '' END"
    )


def _item_text(item: str) -> str:
    """SQL for ``terrarium.model.item_text`` of the ``jsonb`` ``item`` (m006): a Chat
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


@MIGRATIONS
def m007_lifecycle(conn: psycopg.Connection[Any]) -> None:
    """Archived and trashed contexts out of the hot tables, and pins (see ``._lifecycle``):
    a context row and one row per segment holding its lines (and trace) zstandard-compressed,
    with the segment's tail and counts."""
    for statement in (
        """CREATE TABLE archived_contexts (
            session_id uuid PRIMARY KEY,
            context text NOT NULL,
            type text NOT NULL,
            segment_id uuid NOT NULL,
            created_at text NOT NULL,
            updated_at text NOT NULL,
            archived_at text NOT NULL,
            last_active text NOT NULL,
            message_count integer NOT NULL,
            hot_bytes bigint NOT NULL,
            archived_bytes bigint NOT NULL,
            trash_id text,
            deleted_at text,
            deleted_from text CHECK (deleted_from IN ('hot', 'archived'))
        )""",
        # An id names at most one archived context; trashed ones may share it. Trash ids are
        # random UUIDs: an index finds them (a unique key would not start with session_id).
        "CREATE UNIQUE INDEX archived_contexts_live ON archived_contexts (context) "
        "WHERE trash_id IS NULL",
        "CREATE INDEX archived_contexts_trash ON archived_contexts (trash_id) "
        "WHERE trash_id IS NOT NULL",
        """CREATE TABLE archived_segments (
            session_id uuid NOT NULL,
            segment_id uuid NOT NULL,
            created_at text NOT NULL,
            type text NOT NULL,
            next_seq integer NOT NULL,
            items integer NOT NULL,
            base_items integer NOT NULL,
            last_ts text NOT NULL,
            lines bytea NOT NULL,
            trace bytea,
            PRIMARY KEY (session_id, segment_id)
        )""",
        "CREATE TABLE pins (session_id uuid PRIMARY KEY, pinned_at text NOT NULL)",
    ):
        conn.execute(statement)


@MIGRATIONS
def m008_blobs(conn: psycopg.Connection[Any]) -> None:
    """Large outputs out of the log: ``blobs`` (each blob once, by sha256) and ``blob_refs``
    (which session refers to which blob, written with the entry; GC reads it)."""
    for statement in (
        blob_sql.CREATE_BLOBS,
        blob_sql.CREATE_BLOB_REFS,
        blob_sql.CREATE_BLOB_REFS_DIGEST,
    ):
        conn.execute(statement)


@MIGRATIONS
def m009_notify(conn: psycopg.Connection[Any]) -> None:
    """Change notifications for live views (LISTEN/NOTIFY): every append, new segment and
    head change sends ``pg_notify`` on the channel ``terrarium.<schema>``
    (:func:`terrarium.stores.postgres.notify.channel`), with ``session:<id>`` or
    ``context:<id>`` as payload. A notification is sent when its transaction commits, once per
    distinct payload; with no listener it costs the server next to nothing."""
    for statement in (
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
    ):
        conn.execute(statement)


@MIGRATIONS
def m010_listing_sorts(conn: psycopg.Connection[Any]) -> None:
    """An index per order the dashboard's sessions list pages in (last active, created,
    messages; ties by context id, in code point order), so a page is a walk of its own rows
    (``PagedListing``)."""
    for statement in (
        # Covers the signatures too (context_signatures): an index-only scan.
        'CREATE INDEX contexts_by_last_active ON contexts (last_active COLLATE "C", '
        'context COLLATE "C") INCLUDE (message_count)',
        'CREATE INDEX contexts_by_created ON contexts (created_at COLLATE "C", '
        'context COLLATE "C")',
        'CREATE INDEX contexts_by_messages ON contexts (message_count, context COLLATE "C")',
    ):
        conn.execute(statement)


@MIGRATIONS
def m011_search_rows_without_text(conn: psycopg.Connection[Any]) -> None:
    """Search rows lose their two copies of the item's text (``body`` and ``words``, each as
    long as the item): a hit reads its text from its entry's line, which holds it anyway, and
    ``tsv`` becomes a plain column the catch-up fills. At 100k messages of one conversation
    this took the search rows from 1,365 to 744 bytes per message (benchmarks/README.md).

    The table is copied rather than altered, so the space its text held is given back now, not
    by some later ``VACUUM FULL``: the rows keep their ``id`` (arrival order) and ``tsv``, and
    the indexes are built once, after the copy.
    """
    for statement in (
        """CREATE TABLE search_docs_new (
            session_id uuid NOT NULL,
            segment_id uuid NOT NULL,
            seq integer NOT NULL,
            n integer NOT NULL,
            id bigint GENERATED ALWAYS AS IDENTITY,
            type text NOT NULL,
            role text NOT NULL,
            ts text NOT NULL,
            tsv tsvector NOT NULL
        )""",
        "INSERT INTO search_docs_new (session_id, segment_id, seq, n, id, type, role, ts, tsv) "
        "OVERRIDING SYSTEM VALUE SELECT session_id, segment_id, seq, n, id, type, role, ts, tsv "
        "FROM search_docs ORDER BY id",
        "DROP TABLE search_docs",
        "ALTER TABLE search_docs_new RENAME TO search_docs",
        "ALTER SEQUENCE search_docs_new_id_seq RENAME TO search_docs_id_seq",
        "SELECT setval('search_docs_id_seq', coalesce(max(id), 0) + 1, false) FROM search_docs",
        "ALTER TABLE search_docs ADD CONSTRAINT search_docs_pkey "
        "PRIMARY KEY (session_id, segment_id, seq, n)",
        "CREATE INDEX search_docs_tsv ON search_docs USING gin (tsv)",
        "CREATE INDEX search_docs_recent ON search_docs (id)",
        # A new table has no statistics: without them the planner reads a common word's
        # matches from the GIN index (0.9 s at 1M messages) instead of newest first (10 ms).
        "ANALYZE search_docs",
    ):
        conn.execute(statement)


@MIGRATIONS
def m012_notify_only_when_listened(conn: psycopg.Connection[Any]) -> None:
    """The append path's notification (``segments_notify``) is on only while a
    :class:`~terrarium.stores.postgres.notify.ChangeFeed` listens: a statement of
    ``feed_join`` / ``feed_leave`` (see :mod:`.notify`) turns it on and off.

    With no listener, ``pg_notify`` still queues each note and writes it to the notification
    queue at commit: the trigger measured 1.05x an append's median, 1.22x while other writers
    appended (and notified) at once (benchmarks/README.md).
    Heads' notes (``contexts_notify``) are not on the append path and stay on. The functions
    run as their owner (the tables' owner, who alone may switch a trigger), with this schema
    and then ``pg_temp`` on their path. A feed of a terrarium from before this step does not
    join: restart such listeners after upgrading.
    """
    (schema,) = conn.execute("SELECT current_schema()").fetchone() or ("",)
    path = sql.SQL("SET search_path = {}, pg_temp").format(sql.Identifier(schema))
    for body in (_FEED_JOIN, _FEED_LEAVE):
        conn.execute(sql.SQL(body).format(path=path))
    conn.execute("ALTER TABLE segments DISABLE TRIGGER segments_notify")


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


@MIGRATIONS
def m013_segment_keys(conn: psycopg.Connection[Any]) -> None:
    """Nothing to change: SQLite's ``m013_segment_keys`` keys its entries by a small integer
    segment key instead of two 36-character ids, to save bytes. PostgreSQL's entries keep
    their ``uuid`` keys, 16 bytes each, and the session id that distributes every table by
    session (Citus). Registered so that both backends' schemas keep the same steps in the same
    order (``tests/test_migrations.py``)."""
    del conn


@MIGRATIONS
def m014_staged_search_items(conn: psycopg.Connection[Any]) -> None:
    """Nothing to change: SQLite's ``m014_staged_search_items`` ends a view of its search
    tables at the items they index, now that its appends stage items for its upkeep thread.
    Registered so that both backends' schemas keep the same steps in the same order
    (``tests/test_migrations.py``)."""
    del conn


@MIGRATIONS
def m015_session_states(conn: psycopg.Connection[Any]) -> None:
    """Lifecycle is one state record per session (``sessions.state``, JSON text, NULL for
    ``{}``: :mod:`terrarium.stores.lifecycle`): the archive, trash and pin rows of m007 become
    keys of it. ``archived_contexts`` keeps only the heads of frozen attached sessions (a
    trashed session is detached: ``sessions.context`` NULL, no head); ``pins`` goes."""
    for statement in (
        "ALTER TABLE sessions ADD COLUMN state text",
        "CREATE INDEX sessions_stated ON sessions (session_id) WHERE state IS NOT NULL",
        M015_CARRY,
        "UPDATE sessions SET state = '{\"pinned\": true}' WHERE session_id IN (SELECT "
        "session_id FROM pins) AND session_id NOT IN (SELECT session_id FROM archived_contexts)",
        """CREATE TABLE archived_heads (
            session_id uuid PRIMARY KEY,
            context text NOT NULL,
            type text NOT NULL,
            segment_id uuid NOT NULL,
            created_at text NOT NULL,
            updated_at text NOT NULL
        )""",
        "INSERT INTO archived_heads SELECT session_id, context, type, segment_id, created_at, "
        "updated_at FROM archived_contexts WHERE trash_id IS NULL",
        "DROP TABLE archived_contexts",
        "ALTER TABLE archived_heads RENAME TO archived_contexts",
        "ALTER INDEX archived_heads_pkey RENAME TO archived_contexts_pkey",
        # An index, not a unique key: a unique key would not start with session_id (Citus).
        "CREATE UNIQUE INDEX archived_contexts_context ON archived_contexts (context)",
        "DROP TABLE pins",
    ):
        conn.execute(statement)


# m007's archived and trashed rows as records (SQLite's m015 builds the same in Python).
M015_CARRY = """UPDATE sessions AS s SET
    context = CASE WHEN a.trash_id IS NULL THEN a.context END,
    state = jsonb_strip_nulls(jsonb_build_object(
        'cold', jsonb_build_object('hot_bytes', a.hot_bytes, 'cold_bytes', a.archived_bytes),
        'archived', CASE WHEN a.trash_id IS NULL OR a.deleted_from = 'archived' THEN
            jsonb_build_object('date', left(a.created_at, 10), 'last_active', a.last_active,
                'message_count', a.message_count, 'archived_at', a.archived_at) END,
        'trashed', CASE WHEN a.trash_id IS NOT NULL THEN
            jsonb_build_object('trash_id', a.trash_id, 'context', a.context,
                'date', left(a.created_at, 10), 'deleted_at', a.deleted_at,
                'segment_id', a.segment_id::text, 'message_count', a.message_count,
                'bytes', a.archived_bytes) END,
        'pinned', CASE WHEN p.session_id IS NOT NULL THEN true END))::text
    FROM archived_contexts AS a LEFT JOIN pins AS p USING (session_id)
    WHERE s.session_id = a.session_id"""
