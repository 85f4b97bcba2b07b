"""``PostgresStore``: the shared store for agents on many machines.

Needs the ``postgres`` extra (``pip install 'terrarium[postgres]'``): psycopg 3 and its
connection pool. All tables live in one schema (``terrarium`` by default), created and
migrated on open like every other backend.

**Schema** (``uuid`` ids, RFC 3339 ``text`` times kept exactly as written)::

    contexts(context PK, type, session_id, segment_id, created_at, updated_at,
             message_count, last_active)          the heads, with their listing counts
    sessions(session_id PK, context, created_at)
    segments(session_id, segment_id, created_at, type, next_seq, items, base_items,
             last_ts, indexed_seq, dirty)         PK (session_id, segment_id)
    entries(session_id, segment_id, seq, kind, ts, line)
                                                  PK (session_id, segment_id, seq)
    traces(session_id, segment_id, n, line)       PK (session_id, segment_id, n)
    search_docs(session_id, segment_id, seq, n, id, type, role, ts, body, words, tsv)
                                                  PK (session_id, segment_id, seq, n)
    migrations(name PK, applied_at)

**Distributed by session.** Every table but ``migrations`` carries ``session_id``; every
primary and foreign key of ``sessions``, ``segments``, ``entries``, ``traces`` and
``search_docs`` starts with it, so with Citus they are distributed on ``session_id`` and
colocated, unchanged. Appends, reads and segment creation name one session and touch those
tables only. ``contexts`` is the directory from a context's name to its session and head; it
is keyed (and would be distributed) by ``context``, and the write path never joins it to the
session tables: head moves and context creation and deletion read it, then act on the
session. Search and :meth:`PostgresStore.list_contexts_fast` fan out: both catch up every
shard's dirty segments, then the search reads every shard's newest matches and the listing
the directory of heads.

**Exact lines.** ``line`` holds the entry's JSON exactly as :func:`terrarium.codec.encode`
wrote it, and reads return it decoded, so a restore gives the same dicts as
:class:`MemoryStore`, with key order and unknown keys intact. It is text, not ``jsonb``
(which reorders keys, drops duplicate ones and cannot hold ``\u0000``); ad hoc queries use
``line::jsonb``.

**Appends** are one autocommit statement, so they cost one round trip like a bare insert;
many entries travel as binary arrays (``unnest``), so a bulk import is one statement too. The
segment's row is the arbiter: it holds the segment's tail (``next_seq``), and the statement
moves it from the proposed first seq to the one after the new entries (compare-and-set, under
the row's lock) and inserts the entries only if it did. The client proposes ``expected_seq``,
else the next seq this store last saw the segment reach; if the row is elsewhere the store
reads it: with ``expected_seq`` that is a :class:`~terrarium.errors.ConflictError`, without
it the append retries at the new tail, so it always succeeds in the end. Concurrent writers
queue on the row; no gap is possible, and the primary key would refuse a duplicate seq if
anything got past. The same update keeps the segment's listing counts (``items``, its history
items; ``last_ts``) and marks it ``dirty`` for the search index. The row's lock is also what
keeps an entry from outliving a racing ``delete_context``, which deletes the session's rows
(the segments' with it, waiting for the appends that hold them) before its entries and items:
an append either lands before and is deleted with the rest, or finds no row and fails with
:class:`~terrarium.errors.SegmentNotFound`. The table leaves room on each page
(``fillfactor``) so that this update is HOT: no index is touched.

**Durability.** An append is acknowledged once PostgreSQL has committed it; with the server's
default ``synchronous_commit = on`` it survives a crash or power loss of the server, not only
of the client. Measured here (``benchmarks/bench_stores.py``, see ``benchmarks/README.md``):
an append costs about 1.1x a bare single-row autocommit ``INSERT`` of the same row (median;
the commit's WAL flush dominates both), and the search index's batch catch-up adds ~50-70 us
per history item on average.

**Search** (:class:`~terrarium.stores.base.Searchable`) finds what FsStore's index finds
(:mod:`terrarium.stores.fs_search`): every history item with text, a header's history with seq
0, the user's words as data, every term required, a term of several words as a phrase, case
and accents folded, CJK characters found inside words. Each item is a ``search_docs`` row.
Like the other stores' indexes it is derived state, brought up to the entries in batches: a
segment's row records how far the index has read it (``indexed_seq``) and whether entries wait
(``dirty``, under a partial index). :meth:`PostgresStore.catch_up` reads every dirty segment's
waiting entries, holding the segments' rows (locked in one order, so catch-ups never deadlock);
a search runs it first, so an acknowledged entry is found by the next search, and so does a
store every ``SEARCH_BATCH`` entries it appends, which bounds the backlog a search finds to
about that many per writing process. A segment's header
history is indexed with the segment. :meth:`PostgresStore.reindex` rebuilds the rows.
PostgreSQL's text parser depends on the database's locale and finds e-mail addresses, URLs and
numbers, and folding accents needs the ``unaccent`` extension; so the item's ``words`` are
made in Python (:func:`search_words`): FsStore's word characters folded one for one,
everything else a space. ``tsv`` is ``to_tsvector('simple', words)`` (a generated column)
under a GIN index; a query is one ``phraseto_tsquery('simple', ...)`` per term, ANDed, the
terms bound as parameters. Ranking is ``ts_rank`` (normalised by length) among the
``RANK_WINDOW`` most recent matches (``id`` orders items by arrival: each batch is indexed in
time order): the planner reads a rare word's matches from the GIN index and a common word's
newest rows backwards by ``id`` until enough match, so neither costs more than the window. The
statement is never prepared: a generic plan cannot tell the two apart. Snippets come from
``ts_headline`` of the words, which is the text at the same offsets; the phrase matches in
that slice are then highlighted as FsStore highlights them (whole phrases, spans in
characters).

**Listing.** A segment's message count is the items it starts with (``base_items``: its
header's history, or a fork's count of its parent up to the fork point, set when it is made)
plus its own, kept by every append. The heads carry a copy, made when a head moves and by
every catch-up for the heads among the segments it reads (so it locks segments, then heads;
a delete does the same, and the two never deadlock). :meth:`PostgresStore.list_contexts_fast`
runs a catch-up first, then reads one covering index of the heads, already in (type, name)
order. Keeping the copy on the heads at every append instead would put a write to the
directory table (keyed by context) on the append path.

**Context locks** are session-level advisory locks, ``pg_advisory_lock(key)``, each on a
connection of its own that is kept aside from the pool while held (a turn can take long; it
must not starve the pool). The key is a 64-bit hash of the schema and the context name rather
than ``hashtext`` (32 bits): with many contexts, 32-bit collisions would make unrelated
contexts wait for each other, and a caller that holds two context locks could deadlock itself.
The server releases the lock if the holder's connection dies.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import msgspec

from terrarium import codec
from terrarium.errors import (
    ConflictError,
    ContextExists,
    ContextNotFound,
    SegmentNotFound,
    StoreError,
)
from terrarium.model import HISTORY_KINDS, ContextId, SegmentId, SessionId, TraceEntry, utc_now
from terrarium.stores._seqs import SeqGuesses
from terrarium.stores.base import (
    HISTORY_KINDS_SQL,
    ContextSummary,
    NewEntry,
    PodMetadata,
    SearchHit,
    SearchQuery,
    SegmentRead,
    header_line,
    iter_lines,
)
from terrarium.stores.fts import (
    check_query,
)
from terrarium.stores.migrations import Migrations
from terrarium.stores.url import redact_url
from terrarium.text import (
    ELLIPSIS,
    HIGHLIGHT_CLOSE,
    HIGHLIGHT_OPEN,
    SEPARATOR,
    SNIPPET_TOKENS,
    TOKEN_RE,
    fold,
    indexed_item,
    match_spans,
    query_terms,
    snippet_spans,
    tokenize,
)

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.rows import args_row
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "PostgresStore needs psycopg 3 and psycopg_pool: pip install 'terrarium[postgres]'"
    ) from exc

__all__ = [
    "DEFAULT_SCHEMA",
    "MIGRATIONS",
    "RANK_WINDOW",
    "SEARCH_BATCH",
    "PostgresStore",
    "migrate",
    "search_words",
]

DEFAULT_SCHEMA = "terrarium"

log = logging.getLogger(__name__)

MIGRATIONS: Migrations[psycopg.Connection[Any]] = Migrations("postgres")

_SCHEMA_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_MAX_SEQ = 2**31 - 1
_SEEN_CACHE = 4096
_IDLE_LOCK_CONNECTIONS = 4

#: Queries matching more items than this are ranked among their most recent matches.
RANK_WINDOW = 5000
#: Every this many entries it appends, a store brings the search index up to date (see
#: "Search" in the module docstring).
SEARCH_BATCH = 256
_CATCH_UP_SEGMENTS = 500
# ts_headline: the same markers and about the same length as FsStore's FTS5 snippets.
_HEADLINE_OPTIONS = (
    f'StartSel="{HIGHLIGHT_OPEN}", StopSel="{HIGHLIGHT_CLOSE}", MaxWords={SNIPPET_TOKENS}, '
    f"MinWords={SNIPPET_TOKENS // 2}, ShortWord=0, MaxFragments=1, HighlightAll=false"
)


def _lock_key(*parts: str) -> int:
    """A signed 64-bit advisory lock key for ``parts``."""
    digest = hashlib.blake2b(":".join(("terrarium", *parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class _Sql:
    """The statements of one schema, formatted once (the schema name is validated)."""

    def __init__(self, schema: str) -> None:
        s = f'"{schema}"'
        self.quoted = s
        # One statement per append (see "Appends" in the module docstring): the segment's row
        # moves its tail from the proposed first seq (compare-and-set, under the row's lock)
        # and the entries go in only if it did. It answers one row if they did, else none.
        move = (
            f"WITH seg AS (UPDATE {s}.segments SET next_seq = %(next)s, "
            "items = items + %(items)s, last_ts = %(last_ts)s, dirty = true "
            "WHERE session_id = %(session)s AND segment_id = %(segment)s "
            "AND next_seq = %(first)s RETURNING true AS moved), "
            f"ins AS (INSERT INTO {s}.entries (session_id, segment_id, seq, kind, ts, line) "
        )
        self.append_one = (
            f"{move}SELECT %(session)s, %(segment)s, %(first)s, %(kind)s, %(ts)s, %(line)s "
            "FROM seg) SELECT moved FROM seg"
        )
        # Many rows travel as binary arrays (no quoting of the JSON on either side); the
        # statement text stays constant, so psycopg prepares it once per connection.
        self.append_many = (
            f"{move}SELECT %(session)s, %(segment)s, e.seq, e.kind, e.ts, e.line FROM seg, "
            "unnest(%(seqs)b::int[], %(kinds)b::text[], %(tss)b::text[], %(lines)b::text[]) "
            "AS e(seq, kind, ts, line)) SELECT moved FROM seg"
        )
        self.next_seq = (
            f"SELECT next_seq FROM {s}.segments WHERE session_id = %s AND segment_id = %s"
        )
        self.segment_counts = (
            f"SELECT base_items, items, next_seq FROM {s}.segments "
            "WHERE session_id = %s AND segment_id = %s"
        )
        self.count_items = (
            f"SELECT count(*) FROM {s}.entries WHERE session_id = %s AND segment_id = %s "
            f"AND seq BETWEEN 1 AND %s AND kind IN {HISTORY_KINDS_SQL}"
        )
        self.insert_header = (
            f"INSERT INTO {s}.entries (session_id, segment_id, seq, kind, ts, line) "
            "VALUES (%s, %s, 0, %s, %s, %s)"
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
        # Every head with its counts, ids as text (a ContextSummary holds text), in (type, name)
        # order as ContextId orders (collation "C": code points), from the covering index
        # contexts_listing alone.
        self.listing = (
            "SELECT context, substr(created_at, 1, 10), message_count, last_active, "
            f"created_at, updated_at, session_id::text, segment_id::text FROM {s}.contexts "
            '{where} ORDER BY type COLLATE "C", substr(context, length(type) + 2) COLLATE "C"'
        )
        self.move_head = (
            f"UPDATE {s}.contexts AS c SET segment_id = g.segment_id, updated_at = %s, "
            "message_count = g.base_items + g.items, last_active = g.last_ts "
            f"FROM {s}.segments AS g WHERE g.session_id = c.session_id AND g.segment_id = %s "
            "AND c.context = %s AND c.segment_id = %s"
        )
        self.segment_exists = (
            f"SELECT 1 FROM {s}.segments WHERE session_id = %s AND segment_id = %s"
        )
        self.insert_context = (
            f"INSERT INTO {s}.contexts (context, type, session_id, segment_id, created_at, "
            "updated_at) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (context) DO NOTHING"
        )
        self.insert_session = (
            f"INSERT INTO {s}.sessions (session_id, context, created_at) VALUES (%s, %s, %s) "
            "ON CONFLICT (session_id) DO NOTHING"
        )
        # A new segment: its header (seq 0) is indexed with it, and it starts with
        # ``base_items`` history items (see _base_items).
        self.insert_segment = (
            f"INSERT INTO {s}.segments (session_id, segment_id, created_at, type, base_items, "
            "last_ts) VALUES (%s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (session_id, segment_id) DO NOTHING"
        )
        self.session_type = (
            f"SELECT split_part(context, ':', 1) FROM {s}.sessions WHERE session_id = %s"
        )
        # The session's row first: its cascade deletes the segments' rows, waiting for the
        # appends and catch-ups that hold them (a catch-up locks segments, then heads: so
        # does a delete); then the head, and the entries and items those appends committed.
        self.delete_session = [
            f"DELETE FROM {s}.sessions WHERE session_id = %(session)s",
            f"DELETE FROM {s}.contexts WHERE context = %(context)s AND session_id = %(session)s",
            f"DELETE FROM {s}.entries WHERE session_id = %(session)s",
            f"DELETE FROM {s}.search_docs WHERE session_id = %(session)s",
        ]
        self.list_segments = f"SELECT segment_id FROM {s}.segments WHERE session_id = %s"
        self.append_trace = (
            f"INSERT INTO {s}.traces (session_id, segment_id, line) "
            "SELECT %s, %s, t.line FROM unnest(%s::text[]) WITH ORDINALITY AS t(line, n) "
            "ORDER BY t.n"
        )
        self.read_trace = (
            f"SELECT line FROM {s}.traces WHERE session_id = %s AND segment_id = %s ORDER BY n"
        )
        self.context_session = f"SELECT session_id FROM {s}.contexts WHERE context = %s"
        # The search index's catch-up (see "Search"): the segments with entries it has not
        # read, locked in one order (two catch-ups never deadlock), then those entries.
        self.dirty = (
            f"SELECT session_id, segment_id, indexed_seq, next_seq, type FROM {s}.segments "
            "WHERE dirty AND (session_id, segment_id) IN (SELECT * FROM unnest(%s::uuid[], "
            "%s::uuid[])) ORDER BY session_id, segment_id FOR UPDATE"
        )
        self.all_dirty = (
            f"SELECT session_id, segment_id FROM {s}.segments WHERE dirty "
            "ORDER BY session_id, segment_id"
        )
        self.unread = (
            "SELECT e.session_id, e.segment_id, e.seq, e.line FROM unnest(%s::uuid[], "
            "%s::uuid[], %s::int[], %s::int[]) AS x(session_id, segment_id, low, high) "
            f"JOIN {s}.entries AS e ON e.session_id = x.session_id "
            "AND e.segment_id = x.segment_id AND e.seq > x.low AND e.seq < x.high "
            f"AND (e.seq = 0 OR e.kind IN {HISTORY_KINDS_SQL})"
        )
        self.insert_docs = (
            f"INSERT INTO {s}.search_docs (session_id, segment_id, seq, n, type, role, ts, "
            "body, words) SELECT * FROM unnest(%b::uuid[], %b::uuid[], %b::int[], %b::int[], "
            "%b::text[], %b::text[], %b::text[], %b::text[], %b::text[]) "
            "ON CONFLICT DO NOTHING"
        )
        self.mark_read = (
            f"UPDATE {s}.segments AS g SET indexed_seq = x.high - 1, "
            "dirty = g.next_seq > x.high FROM unnest(%s::uuid[], %s::uuid[], %s::int[]) "
            "AS x(session_id, segment_id, high) "
            "WHERE g.session_id = x.session_id AND g.segment_id = x.segment_id"
        )
        # The listing counts of the heads among the segments read, copied from their rows.
        self.count_heads = (
            f"UPDATE {s}.contexts AS c SET message_count = g.base_items + g.items, "
            f"last_active = g.last_ts FROM {s}.segments AS g, unnest(%s::uuid[], %s::uuid[]) "
            "AS x(session_id, segment_id) WHERE g.session_id = x.session_id "
            "AND g.segment_id = x.segment_id AND c.session_id = g.session_id "
            "AND c.segment_id = g.segment_id AND (c.message_count, c.last_active) "
            "IS DISTINCT FROM (g.base_items + g.items, g.last_ts)"
        )
        self.set_counts = (
            f"UPDATE {s}.contexts SET message_count = %s, last_active = %s WHERE context = %s"
        )

    def search(self, terms: int, filters: str) -> str:
        """The search statement for ``terms`` query terms and ``filters`` (conditions on d)."""
        s = self.quoted
        # Each term is a phrase of its words; the user's text only ever travels as parameters.
        tsquery = " && ".join(f"phraseto_tsquery('simple', %(t{i})s)" for i in range(terms))
        return (
            "WITH w AS (SELECT d.session_id, d.segment_id, d.seq, d.n, d.id, d.tsv "
            f"FROM {s}.search_docs AS d WHERE d.tsv @@ ({tsquery}){filters} "
            "ORDER BY d.id DESC LIMIT %(window)s), "
            "top AS (SELECT w.session_id, w.segment_id, w.seq, w.n, w.id, "
            f"ts_rank(w.tsv, {tsquery}, 1) AS score FROM w "
            "ORDER BY score DESC, w.id DESC LIMIT %(limit)s) "
            "SELECT t.session_id, t.segment_id, t.seq, t.score, ses.context, ses.created_at, "
            f"d.role, d.ts, d.body, ts_headline('simple', d.words, {tsquery}, %(options)s) "
            f"FROM top AS t JOIN {s}.search_docs AS d USING (session_id, segment_id, seq, n) "
            f"JOIN {s}.sessions AS ses USING (session_id) ORDER BY t.score DESC, t.id DESC"
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
        self._seen: SeqGuesses[None] = SeqGuesses(_SEEN_CACHE)
        self._unindexed = 0  # entries this store appended since it last caught the index up
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
                cur = conn.execute(sql.move_head, (now, segment_id, str(context), expected))
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
        # (type, name), as ContextId orders, without parsing and validating every id again.
        return sorted(map(_head, rows), key=lambda h: h.context.partition(":")[::2])

    def list_contexts_fast(self, type: str | None = None) -> list[ContextSummary]:
        """Every context's summary (message count, last activity), without restoring any.

        The counts live on the heads, copied there from the segments' rows by the catch-up
        (see "Listing" in the module docstring), which runs first; then this is one scan of
        a covering index.
        """
        self.catch_up()
        where, params = ("WHERE type = %s", (type,)) if type is not None else ("", ())
        with self._pool.connection() as conn, conn.transaction():
            # The planner prices the wide covering index above a parallel scan and sort, which
            # spills 100k rows to disk and takes three times as long.
            conn.execute("SET LOCAL enable_sort = off")
            cursor = conn.cursor(row_factory=args_row(ContextSummary))
            return cursor.execute(self._sql.listing.replace("{where}", where), params).fetchall()

    # ---------------------------------------------------------------- search

    def search(self, query: SearchQuery) -> list[SearchHit]:
        """Ranked hits for ``query`` over every history item of every context.

        One statement: the matches (GIN index), the most recent ``RANK_WINDOW`` of them
        ranked by ``ts_rank``, and ``ts_headline`` snippets of the best ``query.limit``.

        Args:
            query: the words to find (data, never syntax) and the filters.

        Returns:
            Up to ``query.limit`` hits, best first, each with a snippet and highlight spans.

        Raises:
            InvalidQuery: nothing to search for, or an invalid ``limit``, ``role`` or ``since``.
            InvalidContextId: ``query.context`` is not ``type:name``.
        """
        q = check_query(query)
        prepared = query_terms(q.text)
        self.catch_up()
        terms = [search_words(term) for term in prepared]
        phrases = [tokenize(term) for term in prepared]
        params: dict[str, Any] = {f"t{i}": term for i, term in enumerate(terms)}
        params.update(window=max(RANK_WINDOW, q.limit), limit=q.limit, options=_HEADLINE_OPTIONS)
        filters = ""
        with self._pool.connection() as conn:
            if q.context is not None:
                row = conn.execute(self._sql.context_session, (q.context,)).fetchone()
                if row is None:
                    return []
                filters += " AND d.session_id = %(session)s"
                params["session"] = row[0]
            for name in ("type", "role", "since"):
                value = getattr(q, name)
                if value is not None:
                    column = "ts" if name == "since" else name
                    filters += f" AND d.{column} {'>=' if name == 'since' else '='} %({name})s"
                    params[name] = value
            # Never prepared: a generic plan cannot see how common the words are, and the
            # best plan differs (GIN bitmap for rare words, newest-first scan for common ones).
            sql = self._sql.search(len(terms), filters)
            rows = conn.execute(sql, params, prepare=False).fetchall()
        hits = []
        for session_id, segment_id, seq, score, context, created_at, role, ts, body, marked in rows:
            text, spans = _headline_spans(body, marked, phrases)
            hits.append(
                SearchHit(
                    context=context,
                    date=created_at[:10],
                    session_id=session_id,
                    segment_id=segment_id,
                    seq=seq,
                    role=role,
                    ts=ts,
                    snippet=text,
                    highlights=spans,
                    score=float(score),
                )
            )
        return hits

    # ---------------------------------------------------------------- contexts

    def create_context(self, context: ContextId, header: Mapping[str, Any]) -> PodMetadata:
        """Create the context's session, root segment (its header is entry 0) and head."""
        ctx = ContextId.parse(context)
        line = header_line(header)
        session_id = uuid.UUID(str(line["session_id"]))
        segment_id = uuid.UUID(str(line["segment_id"]))
        ts = str(line["ts"])
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
            base = self._insert_segment(conn, session_id, segment_id, ctx.type, line)
            conn.execute(sql.set_counts, (base, ts, str(ctx)))
        return PodMetadata(str(ctx), session_id, segment_id, ts, ts)

    def delete_context(self, context: ContextId) -> bool:
        """Delete the context and its whole session in one transaction."""
        with self._pool.connection() as conn, conn.transaction():
            row = conn.execute(self._sql.context_session, (str(context),)).fetchone()
            if row is None:
                return False
            params = {"session": row[0], "context": str(context)}
            deleted = 0
            for statement in self._sql.delete_session:
                deleted += conn.execute(statement, params).rowcount
        return deleted > 0

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
        line = header_line(header)
        segment_id = uuid.UUID(str(line["segment_id"]))
        with self._pool.connection() as conn, conn.transaction():
            row = conn.execute(self._sql.session_type, (session_id,)).fetchone()
            if row is None:
                raise SegmentNotFound(f"session {session_id} does not exist")
            self._insert_segment(conn, session_id, segment_id, row[0], line)
        self._seen.remember((session_id, segment_id), 1, None)

    def _insert_segment(
        self,
        conn: psycopg.Connection[Any],
        session_id: SessionId,
        segment_id: SegmentId,
        type: str,
        line: Mapping[str, Any],
    ) -> int:
        """A segment's row and header, its header's history indexed (in the caller's
        transaction); return the history items it starts with."""
        ts = str(line["ts"])
        base = _base_items(
            line, lambda parent, at: self._prefix_items(conn, session_id, parent, at)
        )
        try:
            cur = conn.execute(
                self._sql.insert_segment, (session_id, segment_id, ts, type, base, ts)
            )
        except pg_errors.ForeignKeyViolation:  # the session went while we looked
            raise SegmentNotFound(f"session {session_id} does not exist") from None
        if cur.rowcount != 1:
            raise ConflictError(f"segment {segment_id} already exists")
        text = codec.encode(line).decode()
        conn.execute(self._sql.insert_header, (session_id, segment_id, line["kind"], ts, text))
        docs = [(session_id, segment_id, ts, type, doc) for doc in _line_docs(0, line)]
        if docs:
            conn.execute(self._sql.insert_docs, _doc_columns(docs))
        return base

    def _prefix_items(
        self,
        conn: psycopg.Connection[Any],
        session_id: SessionId,
        parent: SegmentId,
        at: int | None,
    ) -> int | None:
        """The history items of the session's segment ``parent`` restored up to seq ``at``
        (None: all of it), or None when there is no such segment."""
        row = conn.execute(self._sql.segment_counts, (session_id, parent)).fetchone()
        if row is None:
            return None
        base, items, next_seq = row
        if at is None or at >= next_seq - 1:
            return int(base + items)
        found = conn.execute(self._sql.count_items, (session_id, parent, at)).fetchone()
        return int(base + (found[0] if found else 0))

    def append(
        self,
        session_id: SessionId,
        segment_id: SegmentId,
        entries: Sequence[NewEntry],
        *,
        expected_seq: int | None = None,
    ) -> int:
        """Append entries with one statement; return the first one's seq (see "Appends")."""
        if not entries:
            first = self.next_seq(session_id, segment_id)
            if expected_seq is not None and expected_seq != first:
                raise ConflictError.stale_seq(segment_id, first, expected_seq)
            return first
        key = (session_id, segment_id)
        seen = self._seen.get(key)
        proposal = expected_seq if expected_seq is not None else seen[0] if seen else None
        conn = self._pool.getconn()
        try:
            while True:
                if proposal is None:
                    proposal = self._next_seq(conn, session_id, segment_id)
                sql, params = self._append_params(session_id, segment_id, entries, proposal)
                if conn.execute(sql, params, prepare=True).fetchone() is not None:
                    break
                # The segment is not at the proposed seq (or gone): read where it is.
                at = self._next_seq(conn, session_id, segment_id)
                if expected_seq is not None:
                    raise ConflictError.stale_seq(segment_id, at, expected_seq)
                proposal = at
        finally:
            self._pool.putconn(conn)
        self._seen.remember(key, proposal + len(entries), None)
        with self._lock:
            self._unindexed += len(entries)
            due = self._unindexed >= SEARCH_BATCH
        if due:
            try:
                self.catch_up()
            except psycopg.Error as exc:  # the entries are in; the next search catches up
                log.warning("%s: search index catch-up deferred: %s", self._where, self._scrub(exc))
        return proposal

    def _append_params(
        self,
        session_id: SessionId,
        segment_id: SegmentId,
        entries: Sequence[NewEntry],
        first: int,
    ) -> tuple[str, dict[str, Any]]:
        """The append statement for ``entries`` from seq ``first``, and its parameters."""
        count = len(entries)
        params: dict[str, Any] = {
            "session": session_id,
            "segment": segment_id,
            "first": first,
            "next": first + count,
            "last_ts": entries[-1].ts,
            "items": sum(1 for entry in entries if entry.kind in HISTORY_KINDS),
        }
        if count == 1:
            line = next(iter_lines(entries, first))
            params.update(kind=line["kind"], ts=line["ts"], line=codec.encode(line).decode())
            return self._sql.append_one, params
        lines = list(iter_lines(entries, first))
        params["seqs"] = list(range(first, first + count))
        params["kinds"] = [line["kind"] for line in lines]
        params["tss"] = [line["ts"] for line in lines]
        params["lines"] = [codec.encode(line).decode() for line in lines]
        return self._sql.append_many, params

    def _next_seq(
        self, conn: psycopg.Connection[Any], session_id: SessionId, segment_id: SegmentId
    ) -> int:
        row = conn.execute(self._sql.next_seq, (session_id, segment_id)).fetchone()
        if row is None:
            raise SegmentNotFound(f"segment {segment_id} of session {session_id} does not exist")
        self._seen.remember((session_id, segment_id), int(row[0]), None)
        return int(row[0])

    # ---------------------------------------------------------------- the search index

    def catch_up(self) -> int:
        """Index every entry the search index has not read yet; return how many segments
        had such entries. Searches call it first; it is public for tools and tests."""
        with self._lock:
            self._unindexed = 0
        with self._pool.connection() as conn:
            dirty = conn.execute(self._sql.all_dirty).fetchall()
        for start in range(0, len(dirty), _CATCH_UP_SEGMENTS):
            self._index([(row[0], row[1]) for row in dirty[start : start + _CATCH_UP_SEGMENTS]])
        return len(dirty)

    def _index(self, segments: Sequence[tuple[SessionId, SegmentId]]) -> None:
        """Index the unread entries of ``segments`` in one transaction, holding their rows
        (their appends wait; another catch-up of them waits, then finds nothing to do)."""
        sql = self._sql
        with self._pool.connection() as conn, conn.transaction():
            rows = conn.execute(
                sql.dirty, ([s for s, _ in segments], [g for _, g in segments])
            ).fetchall()
            if not rows:
                return
            types = {(s, g): type for s, g, _, _, type in rows}
            unread = conn.execute(
                sql.unread,
                (
                    [row[0] for row in rows],
                    [row[1] for row in rows],
                    [row[2] for row in rows],
                    [row[3] for row in rows],
                ),
            ).fetchall()
            docs = []
            for s, g, seq, text in unread:
                try:
                    line = codec.decode(text)
                except msgspec.DecodeError:
                    continue  # a damaged line holds nothing to find; reading it reports it
                ts = str(line.get("ts", "")) if isinstance(line, dict) else ""
                docs += [(s, g, ts, types[s, g], doc) for doc in _line_docs(seq, line)]
            if docs:
                # In time order, so that ``id`` follows arrival within the batch too.
                docs.sort(key=lambda doc: doc[2])
                conn.execute(sql.insert_docs, _doc_columns(docs))
            conn.execute(
                sql.mark_read,
                ([row[0] for row in rows], [row[1] for row in rows], [row[3] for row in rows]),
            )
            conn.execute(sql.count_heads, ([row[0] for row in rows], [row[1] for row in rows]))

    def reindex(self) -> int:
        """Rebuild the search index from the entries; return the number of contexts."""
        s = self._sql.quoted
        with self._pool.connection() as conn:
            with conn.transaction():
                conn.execute(f"DELETE FROM {s}.search_docs")
                conn.execute(f"UPDATE {s}.segments SET indexed_seq = -1, dirty = true")
            (count,) = conn.execute(f"SELECT count(*) FROM {s}.contexts").fetchone() or (0,)
        self.catch_up()
        return int(count)

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
            return self._next_seq(conn, session_id, segment_id)

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


# --------------------------------------------------------------------------- listing


def _base_items(
    header: Mapping[str, Any], prefix: Callable[[SegmentId, int | None], int | None]
) -> int:
    """The history items a segment starts with, as a restore counts them: its header's
    history, or, for a fork that continues its parent, the parent's restored items up to the
    fork point, which ``prefix(parent, at_seq)`` gives (None: no such parent)."""
    history = header.get("history")
    if isinstance(history, list):
        return len(history)
    origin = header.get("origin")
    if not isinstance(origin, Mapping) or origin.get("kind") != "fork":
        return 0
    try:
        parent = uuid.UUID(str(origin.get("parent")))
    except ValueError:
        return 0
    at_seq = origin.get("at_seq")
    found = prefix(parent, at_seq if isinstance(at_seq, int) else None)
    return found or 0


# --------------------------------------------------------------------------- search

# A history item as indexed: (place in a header's history or 0, seq, role, body).
_Doc = tuple[int, int, str, str]


def _item_doc(n: int, seq: int, item: Any) -> _Doc | None:
    """The indexed form of one history item, or None when it has no text to find."""
    found = indexed_item(item)
    return None if found is None else (n, seq, found[0], _pg_text(found[1]))


def _pg_text(text: str) -> str:
    """``text`` as PostgreSQL can store it: no NUL, no lone surrogates (not UTF-8: ``?``).

    A NUL becomes the separator that ``prepare_text`` puts around CJK characters: it parts
    words, as in FTS5, and snippets leave it out, as FTS5's leave out the NUL.
    """
    if "\x00" in text:
        text = text.replace("\x00", SEPARATOR)
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            text = text.encode(errors="replace").decode()
    return text


def _line_docs(seq: int, line: Any) -> list[_Doc]:
    """The history items with text that an entry line holds: a header's history (all with
    seq 0: a compaction's summary, an import), or one item."""
    if not isinstance(line, Mapping):
        return []
    if seq == 0:
        history = line.get("history")
        if not isinstance(history, list):
            return []
        docs = (_item_doc(n, 0, item) for n, item in enumerate(history))
        return [doc for doc in docs if doc is not None]
    if line.get("kind") not in HISTORY_KINDS:
        return []
    doc = _item_doc(0, seq, line.get("item"))
    return [] if doc is None else [doc]


def _doc_columns(docs: Sequence[tuple[SessionId, SegmentId, str, str, _Doc]]) -> list[list[Any]]:
    """``insert_docs``'s arrays for (session, segment, ts, type, doc) tuples."""
    return [
        [session for session, _, _, _, _ in docs],
        [segment for _, segment, _, _, _ in docs],
        [doc[1] for _, _, _, _, doc in docs],
        [doc[0] for _, _, _, _, doc in docs],
        [type for _, _, _, type, _ in docs],
        [doc[2] for _, _, _, _, doc in docs],
        [ts for _, _, ts, _, _ in docs],
        [doc[3] for _, _, _, _, doc in docs],
        [search_words(doc[3]) for _, _, _, _, doc in docs],
    ]


class _FoldTable(dict[int, str]):
    """``str.translate`` table: a word character to its folded self, anything else to a space.

    Filled as characters are met (the table of all of Unicode would be large).
    """

    def __missing__(self, code: int) -> str:
        char = chr(code)
        if not TOKEN_RE.fullmatch(char):
            folded = " "
        else:
            folded = fold(char)
            if len(folded) != 1:  # keep the text's length: positions map back onto it
                lower = char.lower()
                folded = lower if len(lower) == 1 else char
        self[code] = folded
        return folded


_FOLD = _FoldTable()
_ASCII_FOLD = bytes(
    c + 32 if 65 <= c <= 90 else c if 48 <= c <= 57 or 97 <= c <= 122 else 32 for c in range(128)
) + bytes(128)


def search_words(text: str) -> str:
    """What PostgreSQL indexes of ``text`` (as ``prepare_text`` left it): its words.

    Word characters (as FsStore's FTS5 tokenizer sees them) lower-cased without accents,
    everything else a space, one character for one, so that a ``ts_headline`` of the words is
    a slice of the text at the same offsets. PostgreSQL's parser, which is locale-dependent
    and finds e-mail addresses, URLs and numbers, thus sees only plain words, and accents
    are folded without the ``unaccent`` extension. CJK characters are words of their own
    (``prepare_text`` set them apart).
    """
    if text.isascii():
        return text.encode().translate(_ASCII_FOLD).decode()
    return text.translate(_FOLD)


def _headline_spans(
    body: str, marked: str, phrases: Sequence[Sequence[str]]
) -> tuple[str, tuple[tuple[int, int], ...]]:
    """The snippet of ``body`` that ``ts_headline`` chose in its words, with highlights.

    ``ts_headline`` marks single words; FsStore's FTS5 snippets mark whole phrase matches
    (``don't``, a CJK word) and fold accents. So only the slice comes from the headline, and
    the phrase matches in it are found again here, with FsStore's tokens.
    """
    plain = marked.replace(HIGHLIGHT_OPEN, "").replace(HIGHLIGHT_CLOSE, "")
    words = search_words(body)
    start = words.find(plain)
    if start < 0:  # cannot happen for a headline of these words; show the words then
        return snippet_spans(marked)
    end = start + len(plain)
    fragment = body[start:end]
    merged = match_spans(fragment, phrases)
    out = [ELLIPSIS] if words[:start].strip() else []
    at = 0
    for first, last in merged:
        out += [fragment[at:first], HIGHLIGHT_OPEN, fragment[first:last], HIGHLIGHT_CLOSE]
        at = last
    out.append(fragment[at:])
    if words[end:].strip():
        out.append(ELLIPSIS)
    return snippet_spans("".join(out))


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
            for n, _, role, body in _line_docs(seq, line):
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
                _base_items(header, functools.partial(prefix, link[0]))
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
