"""``PostgresStore``: the shared store for agents on many machines.

Needs the ``postgres`` extra (``pip install 'terrarium[postgres]'``): psycopg 3 and its
connection pool. All tables live in one schema (``terrarium`` by default), created and
migrated on open like every other backend.

**Schema** (``uuid`` ids, RFC 3339 ``text`` times kept exactly as written)::

    contexts(context PK, type, session_id, segment_id, created_at, updated_at)   the heads
    sessions(session_id PK, context, created_at)
    segments(session_id, segment_id, created_at)      PK (session_id, segment_id)
    entries(session_id, segment_id, seq, kind, ts, body jsonb, line text)
                                                      PK (session_id, segment_id, seq)
    traces(session_id, segment_id, n, line)           PK (session_id, segment_id, n)
    migrations(name PK, applied_at)

**Distributed by session.** Every table but ``migrations`` carries ``session_id``; every
primary and foreign key of ``sessions``, ``segments``, ``entries`` and ``traces`` starts with
it, so with Citus they are distributed on ``session_id`` and colocated, unchanged. Appends,
reads and segment creation name one session and touch those tables only. ``contexts`` is the
directory from a context's name to its session and head; it is keyed (and would be
distributed) by ``context``, and the write path never joins it to the session tables: head
moves and context creation and deletion read it, then act on the session.

**Exact lines and JSONB.** ``line`` holds the entry's JSON exactly as
:func:`terrarium.codec.encode` wrote it, and reads return it decoded, so a restore gives the
same dicts as :class:`MemoryStore`, with key order and unknown keys intact. ``body`` is the
same JSON as ``jsonb``, for containment queries and GIN indexes; it cannot be the source of
truth because ``jsonb`` reorders keys, drops duplicate ones and cannot hold ``\\u0000`` (for
such a line ``body`` is NULL). The price is storing an entry twice.

**Appends** are one autocommit ``INSERT``, so they cost one round trip like a bare insert;
many entries travel as binary arrays (``unnest``), so a bulk import is one statement too. The
client proposes the seq: ``expected_seq``, else the next seq this store last saw for the
segment. The primary key is the arbiter between concurrent writers: if the seq is taken, the
store reads the segment's last seq; with ``expected_seq`` that is a
:class:`~terrarium.errors.ConflictError`, without it the append retries at the new tail, so it
always succeeds in the end. A gap is impossible: when the store has not seen the segment reach
the proposed seq, the statement inserts only if the entry before it exists (once seen, an entry
stays: seqs are never removed). A foreign key ties entries to their segment, so an append
racing a ``delete_context`` either lands before the delete (and is deleted with it) or fails
with :class:`~terrarium.errors.SegmentNotFound`; no entry outlives its session.

**Durability.** An append is acknowledged once PostgreSQL has committed it; with the server's
default ``synchronous_commit = on`` it survives a crash or power loss of the server, not only
of the client. Measured here: about 1.3-1.5x a bare single-row autocommit ``INSERT`` (the
commit's WAL flush dominates both); a 500-entry append costs ~12-20 us per entry.

**Context locks** are session-level advisory locks, ``pg_advisory_lock(key)``, each on a
connection of its own that is kept aside from the pool while held (a turn can take long; it
must not starve the pool). The key is a 64-bit hash of the schema and the context name rather
than ``hashtext`` (32 bits): with many contexts, 32-bit collisions would make unrelated
contexts wait for each other, and a caller that holds two context locks could deadlock itself.
The server releases the lock if the holder's connection dies.
"""

from __future__ import annotations

import hashlib
import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from terrarium import codec
from terrarium.errors import (
    ConflictError,
    ContextExists,
    ContextNotFound,
    SegmentNotFound,
    StoreError,
)
from terrarium.model import ContextId, SegmentId, SessionId, TraceEntry, utc_now
from terrarium.stores.base import NewEntry, PodMetadata, SegmentRead, iter_lines
from terrarium.stores.migrations import Migrations
from terrarium.stores.url import redact_url

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "PostgresStore needs psycopg 3 and psycopg_pool: pip install 'terrarium[postgres]'"
    ) from exc

__all__ = ["DEFAULT_SCHEMA", "MIGRATIONS", "PostgresStore", "migrate"]

DEFAULT_SCHEMA = "terrarium"

MIGRATIONS: Migrations[psycopg.Connection[Any]] = Migrations("postgres")

_SCHEMA_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_MAX_SEQ = 2**31 - 1
_SEEN_CACHE = 4096
_IDLE_LOCK_CONNECTIONS = 4


def _lock_key(*parts: str) -> int:
    """A signed 64-bit advisory lock key for ``parts``."""
    digest = hashlib.blake2b(":".join(("terrarium", *parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class _Sql:
    """The statements of one schema, formatted once (the schema name is validated)."""

    def __init__(self, schema: str) -> None:
        s = f'"{schema}"'
        self.max_seq = f"SELECT max(seq) FROM {s}.entries WHERE session_id = %s AND segment_id = %s"
        # One statement per append. The "checked" forms insert only if the entry before the
        # first one exists; they are needed only when the store has not yet seen the segment
        # reach that seq (seqs are never removed, so once seen, the entry is there for good).
        body = r"CASE WHEN strpos({0}, E'\\u0000') > 0 THEN NULL ELSE {0}::jsonb END"
        columns = f"INSERT INTO {s}.entries (session_id, segment_id, seq, kind, ts, body, line) "
        prev_exists = (
            f" WHERE EXISTS (SELECT 1 FROM {s}.entries WHERE session_id = %(session)s "
            "AND segment_id = %(segment)s AND seq = %(prev)s)"
        )
        one = (
            "SELECT %(session)s, %(segment)s, %(seq)s, %(kind)s, %(ts)s, "
            f"{body.format('%(line)s')}, %(line)s"
        )
        # Many rows travel as binary arrays (no quoting of the JSON on either side); the
        # statement text stays constant, so psycopg prepares it once per connection.
        many = (
            f"SELECT %(session)s, %(segment)s, e.seq, e.kind, e.ts, {body.format('e.line')}, "
            "e.line FROM unnest(%(seqs)b::int[], %(kinds)b::text[], %(tss)b::text[], "
            "%(lines)b::text[]) AS e(seq, kind, ts, line)"
        )
        self.append = {
            (True, False): columns + one,
            (True, True): columns + one + prev_exists,
            (False, False): columns + many,
            (False, True): columns + many + prev_exists,
        }
        self.insert_header = (
            f"INSERT INTO {s}.entries (session_id, segment_id, seq, kind, ts, body, line) "
            r"VALUES (%s, %s, 0, %s, %s, "
            r"CASE WHEN strpos(%s, E'\\u0000') > 0 THEN NULL ELSE %s::jsonb END, %s)"
        )
        self.read = (
            f"SELECT line, (SELECT max(seq) FROM {s}.entries WHERE session_id = %(session)s "
            "AND segment_id = %(segment)s) "
            f"FROM {s}.entries WHERE session_id = %(session)s AND segment_id = %(segment)s "
            "AND seq <= %(stop)s ORDER BY seq"
        )
        self.head = (
            "SELECT context, session_id, segment_id, created_at, updated_at "
            f"FROM {s}.contexts WHERE context = %s"
        )
        self.list_heads = (
            f"SELECT context, session_id, segment_id, created_at, updated_at FROM {s}.contexts"
        )
        self.move_head = (
            f"UPDATE {s}.contexts SET segment_id = %s, updated_at = %s "
            "WHERE context = %s AND segment_id = %s"
        )
        self.segment_exists = (
            f"SELECT 1 FROM {s}.segments WHERE session_id = %s AND segment_id = %s"
        )
        self.session_exists = f"SELECT 1 FROM {s}.sessions WHERE session_id = %s"
        self.insert_context = (
            f"INSERT INTO {s}.contexts (context, type, session_id, segment_id, created_at, "
            "updated_at) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (context) DO NOTHING"
        )
        self.insert_session = (
            f"INSERT INTO {s}.sessions (session_id, context, created_at) VALUES (%s, %s, %s) "
            "ON CONFLICT (session_id) DO NOTHING"
        )
        self.insert_segment = (
            f"INSERT INTO {s}.segments (session_id, segment_id, created_at) VALUES (%s, %s, %s) "
            "ON CONFLICT (session_id, segment_id) DO NOTHING"
        )
        self.delete_context = f"DELETE FROM {s}.contexts WHERE context = %s RETURNING session_id"
        self.delete_session = f"DELETE FROM {s}.sessions WHERE session_id = %s"
        self.list_segments = f"SELECT segment_id FROM {s}.segments WHERE session_id = %s"
        self.append_trace = (
            f"INSERT INTO {s}.traces (session_id, segment_id, line) "
            "SELECT %s, %s, t.line FROM unnest(%s::text[]) WITH ORDINALITY AS t(line, n) "
            "ORDER BY t.n"
        )
        self.read_trace = (
            f"SELECT line FROM {s}.traces WHERE session_id = %s AND segment_id = %s ORDER BY n"
        )


class PostgresStore:
    """A store in a PostgreSQL database, shared by many processes on many machines."""

    def __init__(
        self,
        dsn: str,
        *,
        pool_size: int = 10,
        schema: str = DEFAULT_SCHEMA,
        connect_timeout: float = 30.0,
    ) -> None:
        """Connect, create or migrate the schema, and open a connection pool.

        Args:
            dsn: a libpq connection string or ``postgresql://`` URL.
            pool_size: the most connections the pool opens (context locks use their own).
            schema: the schema that holds terrarium's tables (created if missing).
            connect_timeout: seconds to wait for a pooled connection before failing.

        Raises:
            StoreError: the server cannot be reached (the message never shows a password).
            FormatVersionError: the schema was written by a newer terrarium.
        """
        if not _SCHEMA_RE.fullmatch(schema):
            raise ValueError(
                f"invalid schema name {schema!r}: use lowercase letters, digits and '_'"
            )
        if pool_size < 1:
            raise ValueError(f"pool_size must be at least 1, not {pool_size}")
        self._dsn = dsn
        self.schema = schema
        self.pool_size = pool_size
        self._where = f"{redact_url(dsn)} (schema {schema})"
        self._sql = _Sql(schema)
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[SessionId, SegmentId], int] = OrderedDict()
        self._idle_locks: list[psycopg.Connection[Any]] = []
        self._closed = False
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                migrate(conn, schema, where=self._where)
        except psycopg.OperationalError as exc:
            raise StoreError(
                f"cannot open PostgreSQL store {self._where}: {self._scrub(exc)}"
            ) from None
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            dsn,
            min_size=1,
            max_size=pool_size,
            kwargs={"autocommit": True},
            timeout=connect_timeout,
            open=True,
            name=f"terrarium-{schema}",
        )
        # Wait for the first connection: a call made before it is ready would make the pool
        # grow, and the pool hands its connections out in turn, so a single-threaded caller
        # would then alternate between two server processes, tens of microseconds slower.
        try:
            self._pool.wait(timeout=connect_timeout)
        except PoolTimeout:
            self._pool.close()
            raise StoreError(
                f"cannot open PostgreSQL store {self._where}: no pooled connection "
                f"within {connect_timeout:g} s"
            ) from None
        except BaseException:
            self._pool.close()
            raise

    def __repr__(self) -> str:
        return f"PostgresStore({redact_url(self._dsn)!r}, schema={self.schema!r})"

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _scrub(self, exc: BaseException) -> str:
        """An error message with the DSN's password masked, should libpq ever echo it."""
        text = str(exc).strip().replace("\n", " ")
        try:
            password = psycopg.conninfo.conninfo_to_dict(self._dsn).get("password")
        except psycopg.Error:
            password = None
        return text.replace(str(password), "***") if password else text

    # ---------------------------------------------------------------- heads

    def get_head(self, context: ContextId) -> PodMetadata | None:
        """Return the context's head record, or None."""
        with self._pool.connection() as conn:
            row = conn.execute(self._sql.head, (str(context),)).fetchone()
        return None if row is None else _head(row)

    def set_head(
        self, context: ContextId, segment_id: SegmentId, *, expected: SegmentId
    ) -> PodMetadata:
        """Move the head if it is ``expected`` now (a conditional ``UPDATE``)."""
        sql = self._sql
        with self._pool.connection() as conn:
            while True:
                row = conn.execute(sql.head, (str(context),)).fetchone()
                if row is None:
                    raise ContextNotFound(f"context {context} does not exist")
                head = _head(row)
                if head.segment_id != expected:
                    raise ConflictError(
                        f"head of {context} is {head.segment_id}, not {expected}: it moved"
                    )
                exists = conn.execute(sql.segment_exists, (head.session_id, segment_id))
                if exists.fetchone() is None:
                    raise SegmentNotFound(
                        f"segment {segment_id} of session {head.session_id} does not exist"
                    )
                now = utc_now()
                cur = conn.execute(sql.move_head, (segment_id, now, str(context), expected))
                if cur.rowcount == 1:
                    return PodMetadata(
                        head.context, head.session_id, segment_id, head.created_at, now
                    )
                # The head moved or the context went between the read and the update: the
                # next pass reports which.

    def list_contexts(self, type: str | None = None) -> list[PodMetadata]:
        """Every head record, optionally of one type, sorted by context id."""
        query = self._sql.list_heads
        params: tuple[str, ...] = ()
        if type is not None:
            query, params = f"{query} WHERE type = %s", (type,)
        with self._pool.connection() as conn:
            rows = conn.execute(query, params).fetchall()
        return sorted(map(_head, rows), key=lambda h: ContextId.parse(h.context))

    # ---------------------------------------------------------------- contexts

    def create_context(self, context: ContextId, header: Mapping[str, Any]) -> PodMetadata:
        """Create the context's session, root segment (its header is entry 0) and head."""
        ctx = ContextId.parse(context)
        line = _header_line(header)
        session_id = uuid.UUID(str(line["session_id"]))
        segment_id = uuid.UUID(str(line["segment_id"]))
        ts = str(line["ts"])
        text = codec.encode(line).decode()
        sql = self._sql
        with self._pool.connection() as conn, conn.transaction():
            cur = conn.execute(
                sql.insert_context, (str(ctx), ctx.type, session_id, segment_id, ts, ts)
            )
            if cur.rowcount != 1:
                raise ContextExists(f"context {ctx} already exists")
            cur = conn.execute(sql.insert_session, (session_id, str(ctx), ts))
            if cur.rowcount != 1:
                raise ConflictError(f"session {session_id} already exists")
            conn.execute(sql.insert_segment, (session_id, segment_id, ts))
            conn.execute(
                sql.insert_header,
                (session_id, segment_id, line["kind"], ts, text, text, text),
            )
        return PodMetadata(str(ctx), session_id, segment_id, ts, ts)

    def delete_context(self, context: ContextId) -> bool:
        """Delete the context and its whole session in one transaction."""
        with self._pool.connection() as conn, conn.transaction():
            row = conn.execute(self._sql.delete_context, (str(context),)).fetchone()
            if row is None:
                return False
            # Segments, entries and traces go with the session (ON DELETE CASCADE).
            conn.execute(self._sql.delete_session, (row[0],))
        return True

    @contextmanager
    def lock_context(self, context: ContextId) -> Iterator[None]:
        """Hold the context's advisory lock, across threads, processes and machines."""
        key = _lock_key(self.schema, str(context))
        conn = self._lock_connection()
        try:
            conn.execute("SELECT pg_advisory_lock(%s)", (key,))
        except BaseException:
            conn.close()
            raise
        try:
            yield
        finally:
            try:
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
            except BaseException:
                conn.close()  # the server drops the lock with the connection
                raise
            self._release_lock_connection(conn)

    def _lock_connection(self) -> psycopg.Connection[Any]:
        with self._lock:
            if self._closed:
                raise StoreError(f"{self!r} is closed")
            if self._idle_locks:
                return self._idle_locks.pop()
        try:
            return psycopg.connect(self._dsn, autocommit=True)
        except psycopg.OperationalError as exc:
            raise StoreError(f"cannot connect to {self._where}: {self._scrub(exc)}") from None

    def _release_lock_connection(self, conn: psycopg.Connection[Any]) -> None:
        with self._lock:
            if not self._closed and len(self._idle_locks) < _IDLE_LOCK_CONNECTIONS:
                self._idle_locks.append(conn)
                return
        conn.close()

    # ---------------------------------------------------------------- segments

    def create_segment(self, session_id: SessionId, header: Mapping[str, Any]) -> None:
        """Add a segment, with its header as entry 0, to an existing session."""
        line = _header_line(header)
        segment_id = uuid.UUID(str(line["segment_id"]))
        ts = str(line["ts"])
        text = codec.encode(line).decode()
        sql = self._sql
        with self._pool.connection() as conn, conn.transaction():
            try:
                cur = conn.execute(sql.insert_segment, (session_id, segment_id, ts))
            except pg_errors.ForeignKeyViolation:
                raise SegmentNotFound(f"session {session_id} does not exist") from None
            if cur.rowcount != 1:
                raise ConflictError(f"segment {segment_id} already exists")
            conn.execute(
                sql.insert_header,
                (session_id, segment_id, line["kind"], ts, text, text, text),
            )
        self._remember((session_id, segment_id), 1)

    def append(
        self,
        session_id: SessionId,
        segment_id: SegmentId,
        entries: Sequence[NewEntry],
        *,
        expected_seq: int | None = None,
    ) -> int:
        """Append entries with one ``INSERT``; return the first one's seq (see module docs)."""
        if not entries:
            first = self.next_seq(session_id, segment_id)
            if expected_seq is not None and expected_seq != first:
                raise ConflictError(
                    f"segment {segment_id} is at seq {first}, the writer expected {expected_seq}"
                )
            return first
        count = len(entries)
        key = (session_id, segment_id)
        with self._lock:
            seen = self._seen.get(key)  # a next seq this store saw the segment reach
        proposal = expected_seq if expected_seq is not None else seen
        with self._pool.connection() as conn:
            if proposal is None:
                proposal = seen = self._last_seq(conn, session_id, segment_id) + 1
            first = proposal
            while True:
                # Entry first - 1 surely exists if the segment once reached ``seen >= first``.
                checked = seen is None or first > seen or first < 1
                params = self._append_params(session_id, segment_id, entries, first)
                try:
                    cur = conn.execute(self._sql.append[count == 1, checked], params, prepare=True)
                    inserted = cur.rowcount
                except pg_errors.UniqueViolation:
                    inserted = 0  # another writer took the seq first
                except pg_errors.ForeignKeyViolation:
                    # No such segment, or its session was deleted while we inserted.
                    raise SegmentNotFound(
                        f"segment {segment_id} of session {session_id} does not exist"
                    ) from None
                if inserted == count:
                    self._remember(key, first + count)
                    return first
                seen = self._last_seq(conn, session_id, segment_id) + 1
                self._remember(key, seen)
                if expected_seq is not None and seen != expected_seq:
                    raise ConflictError(
                        f"segment {segment_id} is at seq {seen}, the writer expected {expected_seq}"
                    )
                first = seen

    def _append_params(
        self,
        session_id: SessionId,
        segment_id: SegmentId,
        entries: Sequence[NewEntry],
        first: int,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"session": session_id, "segment": segment_id, "prev": first - 1}
        if len(entries) == 1:
            line = next(iter_lines(entries, first))
            params.update(seq=first, kind=line["kind"], ts=line["ts"])
            params["line"] = codec.encode(line).decode()
            return params
        lines = list(iter_lines(entries, first))
        params["seqs"] = list(range(first, first + len(lines)))
        params["kinds"] = [line["kind"] for line in lines]
        params["tss"] = [line["ts"] for line in lines]
        params["lines"] = [codec.encode(line).decode() for line in lines]
        return params

    def _last_seq(
        self, conn: psycopg.Connection[Any], session_id: SessionId, segment_id: SegmentId
    ) -> int:
        row = conn.execute(self._sql.max_seq, (session_id, segment_id)).fetchone()
        if row is None or row[0] is None:
            raise SegmentNotFound(f"segment {segment_id} of session {session_id} does not exist")
        return int(row[0])

    def _remember(self, key: tuple[SessionId, SegmentId], next_seq: int) -> None:
        """Note that the segment reached ``next_seq``: the guess for this store's next append."""
        with self._lock:
            if next_seq > self._seen.get(key, 0):
                self._seen[key] = next_seq
            self._seen.move_to_end(key)
            if len(self._seen) > _SEEN_CACHE:
                self._seen.popitem(last=False)

    def read_segment(
        self, session_id: SessionId, segment_id: SegmentId, *, stop_seq: int | None = None
    ) -> SegmentRead:
        """Read a segment's header and entries up to and including ``stop_seq``."""
        stop = _MAX_SEQ if stop_seq is None else max(stop_seq, 0)
        params = {"session": session_id, "segment": segment_id, "stop": stop}
        with self._pool.connection() as conn:
            rows = conn.execute(self._sql.read, params).fetchall()
        if not rows:
            raise SegmentNotFound(f"segment {segment_id} of session {session_id} does not exist")
        lines = codec.decode_lines(
            ("\n".join([row[0] for row in rows]) + "\n").encode(),
            where=f"{self._where} segment {segment_id}",
            first_line=0,
        )
        entries = lines[1:] if stop_seq is None or stop_seq >= 0 else []
        return SegmentRead(header=lines[0], entries=entries, next_seq=int(rows[0][1]) + 1)

    def next_seq(self, session_id: SessionId, segment_id: SegmentId) -> int:
        """The seq the next append gets."""
        with self._pool.connection() as conn:
            next_seq = self._last_seq(conn, session_id, segment_id) + 1
        self._remember((session_id, segment_id), next_seq)
        return next_seq

    def list_segments(self, session_id: SessionId) -> list[SegmentId]:
        """The session's segment ids, oldest first (UUIDv7 order)."""
        with self._pool.connection() as conn:
            rows = conn.execute(self._sql.list_segments, (session_id,)).fetchall()
        if not rows:
            raise SegmentNotFound(f"session {session_id} does not exist")
        return sorted(row[0] for row in rows)

    def append_trace(
        self, session_id: SessionId, segment_id: SegmentId, entries: Sequence[TraceEntry]
    ) -> None:
        """Append raw stream events to the segment's debug trace."""
        lines = [codec.encode(e.to_dict()).decode() for e in entries]
        with self._pool.connection() as conn:
            if not lines:
                if conn.execute(self._sql.segment_exists, (session_id, segment_id)).fetchone():
                    return
            else:
                try:
                    conn.execute(self._sql.append_trace, (session_id, segment_id, lines))
                    return
                except pg_errors.ForeignKeyViolation:
                    pass
        raise SegmentNotFound(f"segment {segment_id} of session {session_id} does not exist")

    def read_trace(self, session_id: SessionId, segment_id: SegmentId) -> list[dict[str, Any]]:
        """The segment's debug trace, oldest first."""
        with self._pool.connection() as conn:
            rows = conn.execute(self._sql.read_trace, (session_id, segment_id)).fetchall()
            if not rows:
                exists = conn.execute(self._sql.segment_exists, (session_id, segment_id))
                if exists.fetchone() is None:
                    raise SegmentNotFound(
                        f"segment {segment_id} of session {session_id} does not exist"
                    )
        return [codec.decode(row[0]) for row in rows]

    def close(self) -> None:
        """Close the pool and the idle lock connections (held locks close on release)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            idle, self._idle_locks = self._idle_locks, []
        for conn in idle:
            conn.close()
        self._pool.close()


# --------------------------------------------------------------------------- helpers


def _head(row: Sequence[Any]) -> PodMetadata:
    return PodMetadata(row[0], row[1], row[2], row[3], row[4])


def _header_line(header: Mapping[str, Any]) -> dict[str, Any]:
    line = dict(header)
    line["seq"] = 0
    line.setdefault("kind", "header")
    return line


# --------------------------------------------------------------------------- migrations


def migrate(
    conn: psycopg.Connection[Any], schema: str, *, where: str, stop_after: str | None = None
) -> list[str]:
    """Create ``schema`` if needed and apply pending migrations; return the names applied.

    ``conn`` must be in autocommit mode. Each migration runs in its own transaction with its
    record, under a transaction-level advisory lock, so that processes opening the store at
    the same time apply each step once. ``stop_after`` (for tests) stops after that migration.

    Raises:
        FormatVersionError: the schema records a migration this version does not know.
    """
    if not _SCHEMA_RE.fullmatch(schema):
        raise ValueError(f"invalid schema name {schema!r}")
    quoted = f'"{schema}"'
    done: list[str] = []
    key = _lock_key(schema, "migrate")
    while True:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
            table = conn.execute("SELECT to_regclass(%s)", (f"{quoted}.migrations",)).fetchone()
            if table is None or table[0] is None:
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quoted}")
                conn.execute(
                    f"CREATE TABLE {quoted}.migrations (name text PRIMARY KEY, "
                    "applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"
                )
            applied = [row[0] for row in conn.execute(f"SELECT name FROM {quoted}.migrations")]
            pending = MIGRATIONS.pending(applied, where=where)
            if not pending or (stop_after is not None and stop_after in applied):
                return done
            step = pending[0]
            # Migrations write unqualified names: they land in this schema.
            conn.execute(f"SET LOCAL search_path TO {quoted}")
            step.apply(conn)
            conn.execute(f"INSERT INTO {quoted}.migrations (name) VALUES (%s)", (step.name,))
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
