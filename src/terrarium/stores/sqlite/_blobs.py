"""``SqliteStore``'s blobs: the ``blobs`` table, and ``blob_refs`` that GC reads.

``blobs`` holds each blob's bytes once under its digest; ``blob_refs(digest, session_id)``
gets a row for each blob an entry refers to, in the transaction that writes the entry (an
append, a new segment's header), so a reference and its row commit together. GC deletes the
rows of sessions that no longer exist (purged), then the blobs no row names.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from terrarium.blobs import check_digest, digest_of, line_digests
from terrarium.errors import BlobNotFound, CorruptBlob

CREATE_BLOBS = """CREATE TABLE blobs (
    digest TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    data BLOB NOT NULL,
    stored_at REAL NOT NULL
)"""
CREATE_BLOB_REFS = """CREATE TABLE blob_refs (
    digest TEXT NOT NULL,
    session_id TEXT NOT NULL,
    PRIMARY KEY (session_id, digest)
) WITHOUT ROWID"""
CREATE_BLOB_REFS_DIGEST = "CREATE INDEX blob_refs_digest ON blob_refs (digest)"

TOUCH_BLOB = "UPDATE blobs SET stored_at = ? WHERE digest = ?"
INSERT_BLOB = "INSERT INTO blobs (digest, size, data, stored_at) VALUES (?, ?, ?, ?)"
GET_BLOB = "SELECT data FROM blobs WHERE digest = ?"
HAS_BLOB = "SELECT 1 FROM blobs WHERE digest = ?"
ALL_BLOBS = "SELECT digest FROM blobs ORDER BY digest"
INSERT_BLOB_REF = "INSERT OR IGNORE INTO blob_refs (digest, session_id) VALUES (?, ?)"
LIVE_REFS = (
    "SELECT digest, min(session_id) FROM blob_refs r "
    "WHERE EXISTS (SELECT 1 FROM sessions s WHERE s.session_id = r.session_id) GROUP BY digest"
)
DROP_DEAD_REFS = (
    "DELETE FROM blob_refs WHERE NOT EXISTS "
    "(SELECT 1 FROM sessions s WHERE s.session_id = blob_refs.session_id)"
)
DELETE_UNREFERENCED = (
    "DELETE FROM blobs WHERE stored_at < ? AND NOT EXISTS "
    "(SELECT 1 FROM blob_refs r WHERE r.digest = blobs.digest)"
)


def record_refs(conn: sqlite3.Connection, session: str, lines: Iterable[Mapping[str, Any]]) -> None:
    """Add the ``blob_refs`` rows of the blobs ``lines`` refer to (in the caller's transaction)."""
    rows = {(digest, session) for line in lines for digest in line_digests(line)}
    if rows:
        conn.executemany(INSERT_BLOB_REF, sorted(rows))


class SqliteBlobs:
    """:class:`~terrarium.stores.base.BlobStore` for ``SqliteStore``."""

    blob_threshold: int | None
    _read: Callable[[], AbstractContextManager[sqlite3.Connection]]
    _write: Callable[[], AbstractContextManager[sqlite3.Connection]]

    def put_blob(self, data: bytes) -> str:
        """Store ``data`` once; return its digest."""
        data = bytes(data)
        digest = digest_of(data)
        now = time.time()
        with self._write() as conn:
            if conn.execute(TOUCH_BLOB, (now, digest)).rowcount == 0:
                conn.execute(INSERT_BLOB, (digest, len(data), data, now))
        return digest

    def get_blob(self, digest: str) -> bytes:
        """The blob's bytes, checked against ``digest``."""
        with self._read() as conn:
            row = conn.execute(GET_BLOB, (check_digest(digest),)).fetchone()
        if row is None:
            raise BlobNotFound(f"blob {digest} is not in the database")
        data = bytes(row[0])
        if digest_of(data) != digest:
            raise CorruptBlob(f"blob {digest} in the database does not match its digest")
        return data

    def has_blob(self, digest: str) -> bool:
        """Whether the blob is stored."""
        with self._read() as conn:
            return conn.execute(HAS_BLOB, (check_digest(digest),)).fetchone() is not None

    def blob_digests(self) -> list[str]:
        """Every stored blob's digest, sorted."""
        with self._read() as conn:
            return [row[0] for row in conn.execute(ALL_BLOBS)]

    def blob_references(self) -> dict[str, str]:
        """Every digest an existing session refers to, with one such session."""
        with self._read() as conn:
            return {row[0]: f"session {row[1]}" for row in conn.execute(LIVE_REFS)}

    def delete_unreferenced_blobs(self, *, stored_before: float) -> int:
        """Drop the references of purged sessions, then the blobs nothing refers to."""
        with self._write() as conn:
            conn.execute(DROP_DEAD_REFS)
            return int(conn.execute(DELETE_UNREFERENCED, (stored_before,)).rowcount)
