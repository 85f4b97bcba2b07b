"""The archive codec of every backend, and what ``SqliteStore`` and ``PostgresStore`` share to
keep archived and trashed contexts out of their hot tables.

A segment leaves the hot tables as one zstandard frame of its JSONL (each ``line`` as stored,
``\\n`` after each, header first): the same bytes an FsStore ``.jsonl.zst`` holds, made by the
same :func:`compress`, so a blob copied out of the database decompresses with ``zstd -d``. A
frame splits into lines at the byte ``\\n`` alone (:func:`terrarium.codec.split_lines`). Its
debug trace, if it has one, is a second frame of the same form. Nothing is decoded to archive;
unarchiving decodes each line's envelope only (:func:`envelopes`) to refill the hot columns
``seq``, ``kind`` and ``ts``.

``search`` over the archive (``SearchQuery.archived``) reads it: :func:`archived_hits` runs
:func:`terrarium.search.scan` over the archived contexts, which a database store then merges
with its index's hits by score. The archive has no index of its own, so hot appends and hot
searches never pay for it; a search that asks for the archive decompresses all of it.

Usage::

    blob = pack([line_text, ...])
    assert unpack(blob) == b"".join(text.encode() + b"\\n" for text in [line_text, ...])
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, cast

import msgspec
import zstandard

from terrarium.codec import split_lines
from terrarium.errors import CorruptLog
from terrarium.model import SegmentId, SessionId
from terrarium.stores.base import PodMetadata, SearchHit, SearchQuery, SegmentRead, Store

#: zstandard's level for archived segments: its default, ~4x smaller JSONL at ~300 MB/s.
LEVEL = 3


# --------------------------------------------------------------------------- statements
# What both database stores run, in SQLite's placeholders (``?``); PostgreSQL's module turns
# them into its own with :func:`pyformat`. The tables are ``m007_lifecycle``'s.


def pyformat(statement: str) -> str:
    """``statement`` with psycopg's placeholders (``%s``) for SQLite's (``?``)."""
    return statement.replace("?", "%s")


# Archived (not trashed) contexts, by id (the partial unique index archived_contexts_live).
ARCHIVED_SESSION = "SELECT session_id FROM archived_contexts WHERE context = ? AND trash_id IS NULL"
ARCHIVED_HEAD = (
    "SELECT context, session_id, segment_id, created_at, updated_at FROM archived_contexts "
    "WHERE context = ? AND trash_id IS NULL"
)
# A context's head, hot or archived, in one statement: one snapshot, so a context that an archive
# or a wake moves between the two tables meanwhile is found in one of them (two statements
# could miss it in both).
HEAD_ANY = (
    "SELECT context, session_id, segment_id, created_at, updated_at FROM contexts "
    "WHERE context = ? UNION ALL SELECT context, session_id, segment_id, created_at, "
    "updated_at FROM archived_contexts WHERE context = ? AND trash_id IS NULL"
)
# NULL: not in the archive; 1 (true): archived; 0 (false): trashed.
SESSION_STATE = "SELECT trash_id IS NULL FROM archived_contexts WHERE session_id = ?"
# PostgreSQL's alone: SQLite's entries name their segment by its key (m013), so SQLite reads
# them with a statement of its own (``sqlite/_lifecycle.SESSION_LINES``).
SESSION_LINES = (
    "SELECT segment_id, seq, line FROM entries WHERE session_id = ? ORDER BY segment_id, seq"
)
INSERT_ARCHIVED = (
    "INSERT INTO archived_contexts (session_id, context, type, segment_id, created_at, "
    "updated_at, archived_at, last_active, message_count, hot_bytes, archived_bytes) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
DROP_COLD = tuple(
    f"DELETE FROM {table} WHERE session_id = ?"
    for table in ("archived_segments", "archived_contexts")
)
PURGE = (
    *DROP_COLD,
    "DELETE FROM pins WHERE session_id = ?",
    "DELETE FROM sessions WHERE session_id = ?",
)
# The archived (not trashed) segment's columns, read by reference.
ARCHIVED_SEGMENT = (
    "SELECT {columns} FROM archived_segments AS g JOIN archived_contexts AS c "
    "USING (session_id) WHERE g.session_id = ? AND g.segment_id = ? AND c.trash_id IS NULL"
)
ARCHIVED_SEGMENT_IDS = (
    "SELECT g.segment_id FROM archived_segments AS g JOIN archived_contexts AS c "
    "USING (session_id) WHERE g.session_id = ? AND c.trash_id IS NULL"
)
PINNED_COLUMN = "EXISTS (SELECT 1 FROM pins AS p WHERE p.session_id = a.session_id)"
ARCHIVED_LIST = (
    "SELECT context, substr(created_at, 1, 10), archived_at, last_active, message_count, "
    f"hot_bytes, archived_bytes, {PINNED_COLUMN} FROM archived_contexts AS a "
    "WHERE trash_id IS NULL {where}"
)
TRASH_LIST = (
    "SELECT trash_id, context, substr(created_at, 1, 10), deleted_at, deleted_from = 'archived', "
    f"message_count, archived_bytes, {PINNED_COLUMN} FROM archived_contexts AS a "
    "WHERE trash_id IS NOT NULL ORDER BY deleted_at DESC, trash_id DESC"
)
TRASH = (
    "UPDATE archived_contexts SET trash_id = ?, deleted_at = ?, deleted_from = ? "
    "WHERE session_id = ?"
)
UNTRASH = (
    "UPDATE archived_contexts SET trash_id = NULL, deleted_at = NULL, deleted_from = NULL, "
    "context = ?, type = ? WHERE session_id = ?"
)
RENAME_SESSION = "UPDATE sessions SET context = ? WHERE session_id = ?"
UNPIN = "DELETE FROM pins WHERE session_id = ?"
PINNED = (
    "SELECT c.context FROM pins JOIN contexts AS c USING (session_id) UNION ALL "
    "SELECT a.context FROM pins JOIN archived_contexts AS a USING (session_id) "
    "WHERE a.trash_id IS NULL"
)


def compress(data: bytes) -> bytes:
    """One zstandard frame holding ``data`` (its size recorded in the frame)."""
    return zstandard.ZstdCompressor(level=LEVEL).compress(data)


def pack(lines: Iterable[str]) -> bytes:
    """``lines`` (JSON texts) as one compressed JSONL frame."""
    return compress("".join(f"{line}\n" for line in lines).encode())


def unpack(blob: bytes, *, where: str = "an archived segment") -> bytes:
    """The bytes of a frame made by :func:`compress` or :func:`pack`.

    Raises:
        CorruptLog: ``blob`` is not a zstandard frame (damaged); the message names ``where``.
    """
    try:
        out: bytes = zstandard.ZstdDecompressor().decompressobj().decompress(bytes(blob))
    except zstandard.ZstdError as exc:
        raise CorruptLog(f"{where}: not a readable zstd frame ({exc})") from None
    return out


def unpack_lines(blob: bytes | None) -> list[str]:
    """The JSON texts of a frame made by :func:`pack` (none for None)."""
    if blob is None:
        return []
    return [line.decode() for line in split_lines(unpack(blob))]


class Envelope(msgspec.Struct, frozen=True):
    """The columns an entry line fills in a hot table, besides the line itself."""

    seq: int
    kind: str = "header"
    ts: Any = ""


_envelope = msgspec.json.Decoder(Envelope)


def envelopes(lines: Sequence[str]) -> list[Envelope]:
    """Each line's envelope (``seq``, ``kind``, ``ts``), decoding nothing else."""
    return [_envelope.decode(line) for line in lines]


def jsonl_bytes(lines: Iterable[str]) -> int:
    """Bytes ``lines`` take as a JSONL file (what a hot log's size is measured in)."""
    return sum(len(line.encode()) + 1 for line in lines)


def new_trash_id() -> str:
    """A fresh trash entry id."""
    return str(uuid.uuid4())


class _ArchiveView:
    """The archived contexts of a store, as :func:`terrarium.search.scan` reads a store."""

    def __init__(
        self,
        heads: list[PodMetadata],
        list_segments: Callable[[SessionId], list[SegmentId]],
        read_segment: Callable[[SessionId, SegmentId], SegmentRead],
    ) -> None:
        self._heads = heads
        self.list_segments = list_segments
        self._read = read_segment

    def list_contexts(self, type: str | None = None) -> list[PodMetadata]:
        return self._heads

    def read_segment(
        self, session_id: SessionId, segment_id: SegmentId, *, stop_seq: int | None = None
    ) -> SegmentRead:
        return self._read(session_id, segment_id)


def archived_hits(
    heads: list[PodMetadata],
    list_segments: Callable[[SessionId], list[SegmentId]],
    read_segment: Callable[[SessionId, SegmentId], SegmentRead],
    query: SearchQuery,
) -> list[SearchHit]:
    """Hits for ``query`` among the archived contexts ``heads``, by reading each one.

    Ranked by bm25 over the archive's items alone, so their scores are of the same measure
    as an index's, not the same statistics.
    """
    from terrarium.search import scan  # the search layer sits above the stores

    view = _ArchiveView(heads, list_segments, read_segment)
    return scan(cast(Store, view), replace(query, archived=False))


def merge_hits(hot: list[SearchHit], cold: list[SearchHit], limit: int) -> list[SearchHit]:
    """The best ``limit`` of two ranked lists of hits, best first."""
    if not cold:
        return hot
    return sorted(hot + cold, key=lambda hit: hit.score, reverse=True)[:limit]
