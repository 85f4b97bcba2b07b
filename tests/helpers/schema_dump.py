"""The schema of a terrarium database as normalised text, for ``tests/test_schema.py``.

``tests/fixtures/schema_sqlite.txt`` and ``schema_postgres.txt`` hold what the 15 migration
steps made before they were squashed into one ``m001_initial`` (dumped from that code); the
test checks that a fresh database gets exactly that schema. Regenerate them, after a schema
change made on purpose, with ``TERRARIUM_WRITE_SCHEMA=1 pytest tests/test_schema.py``.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

_SPACE = re.compile(r"\s+")
_TIGHT = re.compile(r"\s*([(),])\s*")


def _norm(text: str | None) -> str:
    """``text`` on one line: runs of white space as one space, none around ``(``, ``)``, ``,``;
    double quotes dropped (SQLite's ``RENAME`` quotes the new name, a ``CREATE`` does not)."""
    if text is None:
        return "-"
    return _TIGHT.sub(r"\1", _SPACE.sub(" ", text.replace('"', ""))).strip()


def sqlite_schema(conn: sqlite3.Connection) -> str:
    """Every object in ``sqlite_master``."""
    lines = [
        f"{kind} {name} on {table}: {_norm(text)}"
        for kind, name, table, text in conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
        )
    ]
    return "\n".join(lines) + "\n"


_PG_QUERIES = (
    (
        "relation",
        "SELECT c.relname, c.relkind, c.reloptions::text FROM pg_class AS c "
        "WHERE c.relnamespace = %(ns)s::regnamespace AND c.relkind IN ('r', 'v', 'S') "
        "ORDER BY c.relname",
    ),
    (
        "column",
        "SELECT table_name, column_name, data_type, is_nullable, column_default, is_identity, "
        "identity_generation, is_generated, generation_expression, collation_name "
        "FROM information_schema.columns WHERE table_schema = %(ns)s "
        "ORDER BY table_name, ordinal_position",
    ),
    (
        "index",
        "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = %(ns)s "
        "ORDER BY tablename, indexname",
    ),
    (
        "constraint",
        "SELECT r.relname, k.conname, k.contype, pg_get_constraintdef(k.oid) "
        "FROM pg_constraint AS k JOIN pg_class AS r ON r.oid = k.conrelid "
        "WHERE k.connamespace = %(ns)s::regnamespace ORDER BY r.relname, k.conname",
    ),
    (
        "sequence",
        "SELECT s.relname, d.refobjid::regclass::text, d.refobjsubid FROM pg_class AS s "
        "LEFT JOIN pg_depend AS d ON d.objid = s.oid AND d.deptype IN ('a', 'i') "
        "AND d.classid = 'pg_class'::regclass "
        "WHERE s.relnamespace = %(ns)s::regnamespace AND s.relkind = 'S' ORDER BY s.relname",
    ),
    (
        "view",
        "SELECT viewname, definition FROM pg_views WHERE schemaname = %(ns)s ORDER BY viewname",
    ),
    (
        "function",
        "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc AS p "
        "WHERE p.pronamespace = %(ns)s::regnamespace ORDER BY p.proname",
    ),
    (
        "trigger",
        "SELECT t.tgname, t.tgenabled, pg_get_triggerdef(t.oid) FROM pg_trigger AS t "
        "JOIN pg_class AS r ON r.oid = t.tgrelid "
        "WHERE r.relnamespace = %(ns)s::regnamespace AND NOT t.tgisinternal "
        "ORDER BY r.relname, t.tgname",
    ),
)


def postgres_schema(conn: Any, schema: str) -> str:
    """Relations, columns, indexes, constraints, sequences, views, functions and triggers of
    ``schema``, with its name written ``<schema>``."""
    lines: list[str] = []
    for what, query in _PG_QUERIES:
        for row in conn.execute(query, {"ns": schema}):
            values = (_norm(None if value is None else str(value)) for value in row)
            lines.append(f"{what}: " + " | ".join(values))
    return "\n".join(lines).replace(schema, "<schema>") + "\n"
