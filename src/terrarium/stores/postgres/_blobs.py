"""``PostgresStore``'s blobs: the ``blobs`` table, and ``blob_refs`` that GC reads.

As on SQLite (:mod:`terrarium.stores.sqlite._blobs`): each blob once under its digest
(``bytea``), and a ``blob_refs(digest, session_id)`` row for each blob an entry refers to,
written in the entry's transaction. GC deletes the rows of sessions that no longer exist
(purged), then the blobs no row names.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import psycopg

from terrarium.blobs import check_digest, digest_of, line_digests
from terrarium.errors import BlobNotFound, CorruptBlob
from terrarium.model import SessionId
from terrarium.stores.postgres._pool import Pool, retried

CREATE_BLOBS = """CREATE TABLE blobs (
    digest text PRIMARY KEY,
    size bigint NOT NULL,
    data bytea NOT NULL,
    stored_at double precision NOT NULL
)"""
CREATE_BLOB_REFS = """CREATE TABLE blob_refs (
    digest text NOT NULL,
    session_id uuid NOT NULL,
    PRIMARY KEY (session_id, digest)
)"""
CREATE_BLOB_REFS_DIGEST = "CREATE INDEX blob_refs_digest ON blob_refs (digest)"

PUT_BLOB = (
    "INSERT INTO blobs (digest, size, data, stored_at) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (digest) DO UPDATE SET stored_at = excluded.stored_at"
)
TOUCH_BLOB = "UPDATE blobs SET stored_at = %s WHERE digest = %s"
GET_BLOB = "SELECT data FROM blobs WHERE digest = %s"
HAS_BLOB = "SELECT 1 FROM blobs WHERE digest = %s"
ALL_BLOBS = "SELECT digest FROM blobs ORDER BY digest"
INSERT_BLOB_REF = (
    "INSERT INTO blob_refs (digest, session_id) VALUES (%s, %s) ON CONFLICT DO NOTHING"
)
LIVE_REFS = (
    "SELECT digest, min(session_id::text) FROM blob_refs r "
    "WHERE EXISTS (SELECT 1 FROM sessions s WHERE s.session_id = r.session_id) GROUP BY digest"
)
DROP_DEAD_REFS = (
    "DELETE FROM blob_refs r WHERE NOT EXISTS "
    "(SELECT 1 FROM sessions s WHERE s.session_id = r.session_id)"
)
DELETE_UNREFERENCED = (
    "DELETE FROM blobs b WHERE stored_at < %s AND NOT EXISTS "
    "(SELECT 1 FROM blob_refs r WHERE r.digest = b.digest)"
)


def record_refs(
    conn: psycopg.Connection[Any], session_id: SessionId, lines: Iterable[Mapping[str, Any]]
) -> None:
    """Add the ``blob_refs`` rows of the blobs ``lines`` refer to (in the caller's transaction)."""
    rows = sorted({(digest, session_id) for line in lines for digest in line_digests(line)})
    if rows:
        with conn.cursor() as cur:
            cur.executemany(INSERT_BLOB_REF, rows)


class PostgresBlobs:
    """:class:`~terrarium.stores.base.BlobStore` for ``PostgresStore``."""

    blob_threshold: int | None
    _pool: Pool

    @retried
    def put_blob(self, data: bytes) -> str:
        """Store ``data`` once; return its digest."""
        data = bytes(data)
        digest = digest_of(data)
        now = time.time()
        with self._pool.connection() as conn, conn.transaction():
            if conn.execute(TOUCH_BLOB, (now, digest)).rowcount == 0:
                conn.execute(PUT_BLOB, (digest, len(data), data, now))
        return digest

    @retried
    def get_blob(self, digest: str) -> bytes:
        """The blob's bytes, checked against ``digest``."""
        with self._pool.connection() as conn:
            row = conn.execute(GET_BLOB, (check_digest(digest),)).fetchone()
        if row is None:
            raise BlobNotFound(f"blob {digest} is not in the database")
        data = bytes(row[0])
        if digest_of(data) != digest:
            raise CorruptBlob(f"blob {digest} in the database does not match its digest")
        return data

    @retried
    def has_blob(self, digest: str) -> bool:
        """Whether the blob is stored."""
        with self._pool.connection() as conn:
            return conn.execute(HAS_BLOB, (check_digest(digest),)).fetchone() is not None

    @retried
    def blob_digests(self) -> list[str]:
        """Every stored blob's digest, sorted."""
        with self._pool.connection() as conn:
            return [row[0] for row in conn.execute(ALL_BLOBS)]

    @retried
    def blob_references(self) -> dict[str, str]:
        """Every digest an existing session refers to, with one such session."""
        with self._pool.connection() as conn:
            return {row[0]: f"session {row[1]}" for row in conn.execute(LIVE_REFS)}

    @retried
    def delete_unreferenced_blobs(self, *, stored_before: float) -> int:
        """Drop the references of purged sessions, then the blobs nothing refers to."""
        with self._pool.connection() as conn, conn.transaction():
            conn.execute(DROP_DEAD_REFS)
            return int(conn.execute(DELETE_UNREFERENCED, (stored_before,)).rowcount)
