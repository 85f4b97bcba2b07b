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
    """Write ``target``, a database migrated up to ``stop_after`` (``m005`` to ``m012``), with
    the rows of ``source`` (a database of this version) in every table both have.

    Entries and segments go back to their keys before ``m013_segment_keys``: each entry names
    its session and segment by their ids, and the segments' rowids are numbered in descending
    id order, so that they differ from the keys ``source`` gave them. The FTS5 tables are
    rebuilt from the copied ``search_docs`` and ``search_meta``.
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
            conn.execute(_COPY.get(table, f"INSERT INTO main.{table} SELECT * FROM src.{table}"))
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
    "entries": "INSERT INTO main.entries (id, session_id, segment_id, seq, kind, ts, line) "
    "SELECT e.id, g.session_id, g.segment_id, e.seq, e.kind, e.ts, e.line "
    "FROM src.entries AS e JOIN src.segments AS g ON g.id = e.seg ORDER BY e.id",
}
