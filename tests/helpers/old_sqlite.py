"""A SqliteStore database rewritten in an older schema's shape, for the migration tests.

The stores of this version write only the newest schema; a test that needs a database from
before a migration builds one with a store, then copies its rows into a database migrated up
to that point (:func:`downgrade`).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from terrarium.stores.sqlite import migrations

# The FTS5 tables, their shadow tables and SQLite's own: made again, not copied.
_NOT_COPIED = ("migrations", "sqlite_", "search_fts", "search_recent")


def downgrade(source: Path, target: Path, stop_after: str) -> None:
    """Write ``target``, a database migrated up to ``stop_after`` (``m007`` to ``m014``), with
    the rows of ``source`` (a database of this version) in every table both have.

    Entries and segments go back to their keys before ``m013_segment_keys``: each entry names
    its session and segment by their ids, and the segments' rowids are numbered in descending
    id order, so that they differ from the keys ``source`` gave them. The state records
    (``sessions.state``, ``m015_session_states``) go back to m007's rows: an archived or
    trashed context's ``archived_contexts`` row, a pin's ``pins`` row; a trashed session's
    ``sessions.context`` is the id it had. The FTS5 tables are rebuilt from the copied
    ``search_docs`` and ``search_meta``.
    """
    conn = sqlite3.connect(target, isolation_level=None)
    try:
        migrations.migrate(conn, where=str(target), stop_after=stop_after)
        conn.execute("ATTACH DATABASE ? AS src", (str(source),))
        tables = [
            row[0]
            for row in conn.execute("SELECT name FROM main.sqlite_schema WHERE type = 'table'")
            if not row[0].startswith(_NOT_COPIED)
        ]
        conn.execute("BEGIN")
        for table in tables:
            conn.execute(f"DELETE FROM main.{table}")  # search_meta's row from m003
            copy = _COPY.get(table, f"INSERT INTO main.{table} SELECT * FROM src.{table}")
            if table in ("segments", "entries") and stop_after >= "m013":
                copy = f"INSERT INTO main.{table} SELECT * FROM src.{table}"  # the same keys
            conn.execute(copy)
        for fts in ("search_fts", "search_recent"):
            conn.execute(f"INSERT INTO {fts} ({fts}) VALUES ('rebuild')")
        conn.execute("COMMIT")
        conn.execute("DETACH DATABASE src")
    finally:
        conn.close()


_COPY = {
    "segments": "INSERT INTO main.segments (session_id, segment_id, created_at) "
    "SELECT session_id, segment_id, created_at FROM src.segments "
    "ORDER BY session_id DESC, segment_id DESC",
    "sessions": "INSERT INTO main.sessions SELECT session_id, "
    "coalesce(context, state ->> '$.trashed.context'), created_at FROM src.sessions",
    "pins": "INSERT INTO main.pins SELECT session_id, created_at FROM src.sessions "
    "WHERE state ->> '$.pinned'",
    "archived_contexts": "INSERT INTO main.archived_contexts SELECT a.session_id, a.context, "
    "a.type, a.segment_id, a.created_at, a.updated_at, s.state ->> '$.archived.archived_at', "
    "s.state ->> '$.archived.last_active', s.state ->> '$.archived.message_count', "
    "s.state ->> '$.cold.hot_bytes', s.state ->> '$.cold.cold_bytes', NULL, NULL, NULL "
    "FROM src.archived_contexts AS a JOIN src.sessions AS s USING (session_id) "
    "UNION ALL SELECT session_id, t ->> '$.context', substr(t ->> '$.context', 1, "
    "instr(t ->> '$.context', ':') - 1), t ->> '$.segment_id', created_at, t ->> '$.deleted_at', "
    "coalesce(state ->> '$.archived.archived_at', t ->> '$.deleted_at'), "
    "coalesce(state ->> '$.archived.last_active', ''), t ->> '$.message_count', "
    "state ->> '$.cold.hot_bytes', t ->> '$.bytes', t ->> '$.trash_id', t ->> '$.deleted_at', "
    "iif(state ->> '$.archived' IS NULL, 'hot', 'archived') "
    "FROM (SELECT *, state -> '$.trashed' AS t FROM src.sessions) WHERE t IS NOT NULL",
    "entries": "INSERT INTO main.entries (id, session_id, segment_id, seq, kind, ts, line) "
    "SELECT e.id, g.session_id, g.segment_id, e.seq, e.kind, e.ts, e.line "
    "FROM src.entries AS e JOIN src.segments AS g ON g.id = e.seg ORDER BY e.id",
}
