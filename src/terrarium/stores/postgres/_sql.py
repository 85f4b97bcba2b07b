"""The statements of ``PostgresStore``, one module constant each.

Pooled connections carry the store's schema on their ``search_path``, set once per connection
(:func:`set_search_path`, the pool's ``configure`` callback), so the statements name their
tables unqualified and stay constant text, which psycopg prepares once per connection. Built-in
functions and types still resolve from ``pg_catalog``, which PostgreSQL searches first. Only
the migration bookkeeping names the schema, quoted by :func:`schema_identifier`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from terrarium.stores.base import HISTORY_KINDS_SQL

_SCHEMA_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def schema_identifier(schema: str) -> sql.Identifier:
    """``schema`` quoted for a statement, once checked to be a plain lowercase name."""
    if not _SCHEMA_RE.fullmatch(schema):
        raise ValueError(f"invalid schema name {schema!r}: use lowercase letters, digits and '_'")
    return sql.Identifier(schema)


def set_search_path(schema: str) -> Callable[[psycopg.Connection[Any]], None]:
    """The pool's ``configure`` callback: put ``schema`` (alone) on a new connection's path."""
    statement = sql.SQL("SET search_path TO {}").format(schema_identifier(schema))

    def configure(conn: psycopg.Connection[Any]) -> None:
        conn.execute(statement)  # autocommit: a session setting, kept for the connection's life

    return configure


def lock_key(*parts: str) -> int:
    """A signed 64-bit advisory lock key for ``parts``.

    Not ``hashtext`` (32 bits): with many contexts, 32-bit collisions would make unrelated
    contexts wait for each other, and a caller holding two context locks could deadlock itself.
    """
    digest = hashlib.blake2b(":".join(("terrarium", *parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


# --------------------------------------------------------------------------- migrations

LOCK_MIGRATIONS = "SELECT pg_advisory_xact_lock(%s)"
FIND_TABLE = "SELECT to_regclass(%s)"
CREATE_SCHEMA = sql.SQL("CREATE SCHEMA IF NOT EXISTS {schema}")
CREATE_MIGRATIONS = sql.SQL(
    "CREATE TABLE {schema}.migrations (name text PRIMARY KEY, "
    "applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"
)
APPLIED = sql.SQL("SELECT name FROM {schema}.migrations")
# Migrations write unqualified names: they land in this schema.
MIGRATE_IN = sql.SQL("SET LOCAL search_path TO {schema}")
RECORD_MIGRATION = sql.SQL("INSERT INTO {schema}.migrations (name) VALUES (%s)")
FORGET_MIGRATIONS = sql.SQL("DELETE FROM {schema}.migrations WHERE name = ANY (%s)")

# --------------------------------------------------------------------------- appends

# One statement per append: the segment's row moves its tail from the proposed first seq
# (compare-and-set, under the row's lock) and the entries go in only if it did. It answers one
# row if they did, else none. The same update keeps the segment's listing counts and marks it
# dirty for the search index.
_MOVE = (
    "WITH seg AS (UPDATE segments SET next_seq = %(next)s, "
    "items = items + %(items)s, last_ts = %(last_ts)s, dirty = true "
    "WHERE session_id = %(session)s AND segment_id = %(segment)s "
    "AND next_seq = %(first)s RETURNING true AS moved), "
    "ins AS (INSERT INTO entries (session_id, segment_id, seq, kind, ts, line) "
)
APPEND_ONE = (
    f"{_MOVE}SELECT %(session)s, %(segment)s, %(first)s, %(kind)s, %(ts)s, %(line)s "
    "FROM seg) SELECT moved FROM seg"
)
# Many rows travel as binary arrays (no quoting of the JSON on either side); the statement
# text stays constant, so psycopg prepares it once per connection.
APPEND_MANY = (
    f"{_MOVE}SELECT %(session)s, %(segment)s, e.seq, e.kind, e.ts, e.line FROM seg, "
    "unnest(%(seqs)b::int[], %(kinds)b::text[], %(tss)b::text[], %(lines)b::text[]) "
    "AS e(seq, kind, ts, line)) SELECT moved FROM seg"
)
NEXT_SEQ = "SELECT next_seq FROM segments WHERE session_id = %s AND segment_id = %s"
#: A hot context's head and its segment's tail, one snapshot (no row: frozen, or no context).
HEAD_TAIL = (
    "SELECT c.context, c.session_id, c.segment_id, c.created_at, c.updated_at, s.next_seq "
    "FROM contexts AS c JOIN segments AS s USING (session_id, segment_id) WHERE c.context = %s"
)

# --------------------------------------------------------------------------- reads

READ = (
    "SELECT line, (SELECT max(seq) FROM entries WHERE session_id = %(session)s "
    "AND segment_id = %(segment)s) "
    "FROM entries WHERE session_id = %(session)s AND segment_id = %(segment)s "
    "AND seq <= %(stop)s ORDER BY seq"
)
APPEND_TRACE = (
    "INSERT INTO traces (session_id, segment_id, line) "
    "SELECT %s, %s, t.line FROM unnest(%s::text[]) WITH ORDINALITY AS t(line, n) "
    "ORDER BY t.n"
)
READ_TRACE = "SELECT line FROM traces WHERE session_id = %s AND segment_id = %s ORDER BY n"

# --------------------------------------------------------------------------- heads

# Every head with its counts, ids as text (a ContextSummary holds text), in (type, name) order
# as ContextId orders (collation "C": code points), from the covering index contexts_listing
# alone.
LISTING_SELECT = (
    "SELECT context, substr(created_at, 1, 10), message_count, last_active, "
    "created_at, updated_at, session_id::text, segment_id::text FROM contexts"
)
_LISTING = (
    LISTING_SELECT
    + ' {where}ORDER BY type COLLATE "C", substr(context, length(type) + 2) COLLATE "C"'
)
LISTING = _LISTING.format(where="")
LISTING_OF_TYPE = _LISTING.format(where="WHERE type = %s ")
# The planner prices the wide covering index above a parallel scan and sort, which spills 100k
# rows to disk and takes three times as long.
LISTING_BY_INDEX = "SET LOCAL enable_sort = off"
# A page of it is LISTING_SELECT completed by stores._listing.page_statement, from the indexes
# contexts_by_{last_active,created,messages}.
CONTEXT_TYPES = 'SELECT DISTINCT type COLLATE "C" FROM contexts ORDER BY 1'
SIGNATURES = (
    "SELECT context, last_active, message_count FROM contexts "
    'ORDER BY last_active COLLATE "C", context COLLATE "C"'
)
MOVE_HEAD = (
    "UPDATE contexts AS c SET segment_id = g.segment_id, updated_at = %s, "
    "message_count = g.base_items + g.items, last_active = g.last_ts "
    "FROM segments AS g WHERE g.session_id = c.session_id AND g.segment_id = %s "
    "AND c.context = %s AND c.segment_id = %s"
)
CONTEXT_SESSION = "SELECT session_id FROM contexts WHERE context = %s"
COUNT_CONTEXTS = "SELECT count(*) FROM contexts"

# --------------------------------------------------------------------------- contexts, segments

# A new segment: its header (seq 0) is indexed with it, and it starts with ``base_items``
# history items (see search.base_items).
INSERT_SEGMENT = (
    "INSERT INTO segments (session_id, segment_id, created_at, type, base_items, "
    "last_ts) VALUES (%s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (session_id, segment_id) DO NOTHING"
)
INSERT_HEADER = (
    "INSERT INTO entries (session_id, segment_id, seq, kind, ts, line) "
    "VALUES (%s, %s, 0, %s, %s, %s)"
)
# The adopted session's segments are read again from their headers, under the context's type.
ATTACH_SEGMENTS = (
    "UPDATE segments SET type = %s, indexed_seq = -1, dirty = true WHERE session_id = %s"
)
# A new head's listing counts, from its segment's row (none for a frozen session's).
HEAD_COUNTS = (
    "UPDATE contexts AS c SET message_count = g.base_items + g.items, last_active = g.last_ts "
    "FROM segments AS g WHERE g.session_id = c.session_id AND g.segment_id = c.segment_id "
    "AND c.context = %s"
)
SEGMENT_COUNTS = (
    "SELECT base_items, items, next_seq FROM segments WHERE session_id = %s AND segment_id = %s"
)
COUNT_ITEMS = (
    "SELECT count(*) FROM entries WHERE session_id = %s AND segment_id = %s "
    f"AND seq BETWEEN 1 AND %s AND kind IN {HISTORY_KINDS_SQL}"
)
# --------------------------------------------------------------------------- context locks

LOCK = "SELECT pg_advisory_lock(%s)"
UNLOCK = "SELECT pg_advisory_unlock(%s)"


def lock_session(schema: str) -> sql.Composed:
    """A new lock connection's settings: ``schema`` on its path, for the reads it runs under
    the lock, and read committed whatever the server's default. Statements pipelined after
    the lock run in one implicit transaction, so only read committed gives the read a
    snapshot taken once the lock is granted."""
    return sql.SQL(
        "SET search_path TO {}; SET default_transaction_isolation TO 'read committed'"
    ).format(schema_identifier(schema))


# --------------------------------------------------------------------------- the search index

# The catch-up: the segments with entries it has not read, locked in one order (two catch-ups
# never deadlock), then those entries.
DIRTY = (
    "SELECT session_id, segment_id, indexed_seq, next_seq, type FROM segments "
    "WHERE dirty AND (session_id, segment_id) IN (SELECT * FROM unnest(%s::uuid[], "
    "%s::uuid[])) ORDER BY session_id, segment_id FOR UPDATE"
)
ALL_DIRTY = (
    "SELECT session_id, segment_id FROM segments WHERE dirty ORDER BY session_id, segment_id"
)
UNREAD = (
    "SELECT e.session_id, e.segment_id, e.seq, e.line FROM unnest(%s::uuid[], "
    "%s::uuid[], %s::int[], %s::int[]) AS x(session_id, segment_id, low, high) "
    "JOIN entries AS e ON e.session_id = x.session_id "
    "AND e.segment_id = x.segment_id AND e.seq > x.low AND e.seq < x.high "
    f"AND (e.seq = 0 OR e.kind IN {HISTORY_KINDS_SQL})"
)
# A row holds the item's place, its filters and its ``tsvector``, not its text: the
# text is in the entry's line, which a hit reads again (see search.find).
INSERT_DOCS = (
    "INSERT INTO search_docs (session_id, segment_id, seq, n, type, role, ts, tsv) "
    "SELECT x.session_id, x.segment_id, x.seq, x.n, x.type, x.role, x.ts, "
    "to_tsvector('simple'::regconfig, x.words) FROM unnest(%b::uuid[], %b::uuid[], "
    "%b::int[], %b::int[], %b::text[], %b::text[], %b::text[], %b::text[]) "
    "AS x(session_id, segment_id, seq, n, type, role, ts, words) ON CONFLICT DO NOTHING"
)
MARK_READ = (
    "UPDATE segments AS g SET indexed_seq = x.high - 1, "
    "dirty = g.next_seq > x.high FROM unnest(%s::uuid[], %s::uuid[], %s::int[]) "
    "AS x(session_id, segment_id, high) "
    "WHERE g.session_id = x.session_id AND g.segment_id = x.segment_id"
)
# The listing counts of the heads among the segments read, copied from their rows.
COUNT_HEADS = (
    "UPDATE contexts AS c SET message_count = g.base_items + g.items, "
    "last_active = g.last_ts FROM segments AS g, unnest(%s::uuid[], %s::uuid[]) "
    "AS x(session_id, segment_id) WHERE g.session_id = x.session_id "
    "AND g.segment_id = x.segment_id AND c.session_id = g.session_id "
    "AND c.segment_id = g.segment_id AND (c.message_count, c.last_active) "
    "IS DISTINCT FROM (g.base_items + g.items, g.last_ts)"
)
# A reindex: every segment unread from its header on.
CLEAR_INDEX = (
    "DELETE FROM search_docs",
    "UPDATE segments SET indexed_seq = -1, dirty = true",
)


def _tsquery(terms: int) -> str:
    """The query of ``terms`` terms: each a phrase of its words, all required. The user's
    text only ever travels as parameters (``%(t0)s``...)."""
    return " && ".join(f"phraseto_tsquery('simple', %(t{i})s)" for i in range(terms))


def search(terms: int, filters: str) -> str:
    """The search statement for ``terms`` query terms and ``filters`` (conditions on d).

    The matches (GIN index), the most recent ``%(window)s`` of them ranked by ``ts_rank``
    (normalised by length), and the entry lines of the best ``%(limit)s``, whose items'
    texts the snippets are cut from (:func:`headlines`).
    """
    tsquery = _tsquery(terms)
    return (
        "WITH w AS (SELECT d.session_id, d.segment_id, d.seq, d.n, d.id, d.role, d.ts, d.tsv "
        f"FROM search_docs AS d WHERE d.tsv @@ ({tsquery}){filters} "
        "ORDER BY d.id DESC LIMIT %(window)s), "
        "top AS (SELECT w.session_id, w.segment_id, w.seq, w.n, w.id, w.role, w.ts, "
        f"ts_rank(w.tsv, {tsquery}, 1) AS score FROM w "
        "ORDER BY score DESC, w.id DESC LIMIT %(limit)s) "
        "SELECT t.session_id, t.segment_id, t.seq, t.n, t.score, ses.context, ses.created_at, "
        "t.role, t.ts, e.line "
        "FROM top AS t JOIN entries AS e USING (session_id, segment_id, seq) "
        "JOIN sessions AS ses USING (session_id) ORDER BY t.score DESC, t.id DESC"
    )


def headlines(terms: int) -> str:
    """``ts_headline`` of each of ``%(words)s`` (the hits' folded texts) for the query of
    ``terms`` terms, in order."""
    return (
        f"SELECT ts_headline('simple', x.words, {_tsquery(terms)}, %(options)s) "
        "FROM unnest(%(words)s::text[]) WITH ORDINALITY AS x(words, i) ORDER BY x.i"
    )
