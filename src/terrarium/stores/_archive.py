"""What ``SqliteStore`` and ``PostgresStore`` share to keep archived and trashed contexts out
of their hot tables: the compressed form of a segment, and search over the archive.

A segment leaves the hot tables as one zstandard frame of its JSONL (each ``line`` as stored,
``\\n`` after each, header first): the same bytes an FsStore ``.jsonl.zst`` holds, so a blob
copied out of the database decompresses with ``zstd -d``. Its debug trace, if it has one, is a
second frame of the same form. Nothing is decoded to archive; unarchiving decodes each line's
envelope only (:func:`envelopes`) to refill the hot columns ``seq``, ``kind`` and ``ts``.

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

from terrarium.model import SegmentId, SessionId
from terrarium.stores.base import PodMetadata, SearchHit, SearchQuery, SegmentRead, Store

#: zstandard's level for archived segments: its default, ~4x smaller JSONL at ~300 MB/s.
LEVEL = 3


def pack(lines: Iterable[str]) -> bytes:
    """``lines`` (JSON texts) as one compressed JSONL frame."""
    data = "".join(f"{line}\n" for line in lines).encode()
    return zstandard.ZstdCompressor(level=LEVEL).compress(data)


def unpack(blob: bytes) -> bytes:
    """The JSONL bytes of a frame made by :func:`pack`."""
    return zstandard.ZstdDecompressor().decompress(bytes(blob))


def unpack_lines(blob: bytes | None) -> list[str]:
    """The JSON texts of a frame made by :func:`pack` (none for None)."""
    if blob is None:
        return []
    return unpack(blob).decode().splitlines()


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
