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

# A lock held until the transaction ends: migrations take turns on one, as do creates,
# attaches and freezes on a context's id.
XACT_LOCK = "SELECT pg_advisory_xact_lock(%s)"
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
# row if they did, else none. If they did, it notes the session in the change cursor with
# this transaction's id (as the triggers do for every other write, see m001_initial): in the
# statement, a third of a row trigger's cost on the append path.
_MOVE = (
    "WITH seg AS (UPDATE segments SET next_seq = %(next)s "
    "WHERE session_id = %(session)s AND segment_id = %(segment)s "
    "AND next_seq = %(first)s RETURNING true AS moved), "
    "chg AS (INSERT INTO session_changes AS c (session_id, xid) "
    "SELECT %(session)s, pg_current_xact_id() FROM seg "
    "ON CONFLICT (session_id) DO UPDATE SET xid = excluded.xid WHERE c.xid <> excluded.xid), "
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

READ_SEGMENT = (
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

# --------------------------------------------------------------------------- contexts, segments

INSERT_SEGMENT = (
    "INSERT INTO segments (session_id, segment_id, created_at) VALUES (%s, %s, %s) "
    "ON CONFLICT (session_id, segment_id) DO NOTHING"
)
INSERT_HEADER = (
    "INSERT INTO entries (session_id, segment_id, seq, kind, ts, line) "
    "VALUES (%s, %s, 0, %s, %s, %s)"
)
# --------------------------------------------------------------------------- frozen sessions

# What a freeze reads of a session (SqlStore._freeze_rows): its segments, locked in key order
# with their tail (a thaw puts each row back as it was), and its lines and traces.
SESSION_SEGMENTS = (
    "SELECT segment_id, created_at, next_seq FROM segments "
    "WHERE session_id = %s ORDER BY session_id, segment_id FOR UPDATE"
)
SESSION_LINES = (
    "SELECT segment_id, seq, line FROM entries WHERE session_id = %s ORDER BY segment_id, seq"
)
SESSION_TRACES = "SELECT segment_id, line FROM traces WHERE session_id = %s ORDER BY segment_id, n"
# Traces go with their segments (foreign key, ON DELETE CASCADE).
DROP_HOT = tuple(
    f"DELETE FROM {table} WHERE session_id = %s" for table in ("entries", "segments", "contexts")
)
REFILL_SEGMENT = (
    "INSERT INTO segments (session_id, segment_id, created_at, next_seq) VALUES (%s, %s, %s, %s)"
)
REFILL_ENTRIES = (
    "INSERT INTO entries (session_id, segment_id, seq, kind, ts, line) "
    "SELECT %s, %s, e.seq, e.kind, e.ts, e.line FROM unnest(%b::int[], %b::text[], "
    "%b::text[], %b::text[]) AS e(seq, kind, ts, line)"
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


# --------------------------------------------------------------------------- change cursor

# The sessions written since position %(after)s, and the position now, in one statement: one
# snapshot. Each write notes its session with its transaction's id (migration m001_initial's
# triggers). A position is a snapshot (``xmin:xmax:in-progress ids``): the read names the
# sessions whose noting transaction the last read's snapshot did not see, and this read's
# snapshot does (it sees the rows it reads). Commit order is not id order, which is why the
# newest id seen, or a sequence, could not serve: a transaction holding id 5 may commit after
# a read that saw 6. Here every transaction below the last read's xmin had ended, so its rows
# were visible then, or never will be (rolled back); one at or above it that the last read
# did not see is read now if it committed since, or by a later read. A long transaction keeps
# xmin back, which costs only the index scan's length: rows it passes that the last read saw
# are skipped. The xmax comes along to tell a position of no store's (beyond it) from ours.
CHANGES = (
    "SELECT pg_current_snapshot()::text, pg_snapshot_xmax(pg_current_snapshot())::text, "
    "array(SELECT session_id FROM session_changes "
    "WHERE xid >= pg_snapshot_xmin(%(after)s::pg_snapshot) "
    "AND NOT pg_visible_in_snapshot(xid, %(after)s::pg_snapshot))"
)
POSITION = "SELECT pg_current_snapshot()::text"
# Reads of many segments (a JSON array of [session, segment, seq]) and many sessions' heads
# with their tails (a JSON array of ids), one statement each (SqlStore.entries_from,
# SqlStore.live_sessions).
ENTRIES_FROM = (
    "SELECT r.n - 1, e.line FROM json_array_elements(%s::json) WITH ORDINALITY AS r(v, n) "
    "JOIN entries AS e ON e.session_id = (r.v ->> 0)::uuid AND e.segment_id = (r.v ->> 1)::uuid "
    "AND e.seq >= (r.v ->> 2)::integer ORDER BY r.n, e.seq"
)
# The ids bound both tables: each is read by its index, whatever the planner's statistics
# (the ids on contexts alone read every segment row, a page at a time, at 10k sessions).
LIVE_SESSIONS = (
    "WITH r AS (SELECT ARRAY(SELECT json_array_elements_text(%s::json)::uuid) AS ids) "
    "SELECT c.context, c.session_id, c.segment_id, c.created_at, c.updated_at, s.segment_id, "
    "s.next_seq FROM r JOIN contexts AS c ON c.session_id = ANY (r.ids) LEFT JOIN segments "
    "AS s ON s.session_id = c.session_id AND s.session_id = ANY (r.ids)"
)
# Where the store is: its id (store_meta, made once with the schema, and carried by any copy:
# a dump restored, a database made from it as a template, a schema's rows copied), the
# cluster's system identifier (the same on every route to it and on its physical standbys),
# and the oids of its database and schema (each copy made by SQL has new ones).
STORE_ID = (
    "SELECT value, (SELECT system_identifier FROM pg_control_system()), "
    "(SELECT oid FROM pg_database WHERE datname = current_database()), "
    "to_regnamespace(current_schema())::oid FROM store_meta WHERE key = 'store_id'"
)
# The same on a server that hides pg_control_system() from this role (some hosted ones).
STORE_ID_NO_SYSTEM = STORE_ID.replace("(SELECT system_identifier FROM pg_control_system())", "NULL")
