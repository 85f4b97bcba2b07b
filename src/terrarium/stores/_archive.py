"""The archive codec of every backend: a frozen segment as one zstandard frame of its JSONL.

The same bytes an FsStore ``.jsonl.zst`` holds (``zstd -d`` reads a blob copied out of a
database), split into lines at the byte ``\n`` alone (:func:`terrarium.codec.split_lines`).
A trace is a second frame of the same form. Nothing is decoded to freeze; a thaw decodes each
line's envelope only (:func:`envelopes`) to refill the hot columns.

Usage::

    blob = pack([line_text, ...])
    assert unpack(blob) == b"".join(text.encode() + b"\\n" for text in [line_text, ...])
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import groupby
from operator import itemgetter
from typing import Any

import msgspec

from terrarium.codec import split_lines
from terrarium.errors import CorruptLog

#: zstandard's level for archived segments: its default, ~4x smaller JSONL at ~300 MB/s.
LEVEL = 3


def compress(data: bytes) -> bytes:
    """One zstandard frame holding ``data`` (its size recorded in the frame)."""
    import zstandard  # not at import: 10-20 ms that `terrarium list` would wait for

    return zstandard.ZstdCompressor(level=LEVEL).compress(data)


def pack(lines: Iterable[str]) -> bytes:
    """``lines`` (JSON texts) as one compressed JSONL frame."""
    return compress("".join(f"{line}\n" for line in lines).encode())


def unpack(blob: bytes, *, where: str = "an archived segment") -> bytes:
    """The bytes of a frame made by :func:`compress` or :func:`pack`; CorruptLog if it is none."""
    import zstandard

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


class Frozen(msgspec.Struct, frozen=True):
    """A session's segments packed for ``archived_segments``, and its size hot and packed."""

    segments: dict[Any, tuple[int, bytes, bytes | None]]
    """Each segment's next seq, its lines' frame and its trace's frame (None: no trace)."""
    hot_bytes: int
    cold_bytes: int


def pack_session(lines: Iterable[Sequence[Any]], traces: Iterable[Sequence[Any]]) -> Frozen:
    """Pack a session's ``(segment, seq, line)`` rows and ``(segment, line)`` trace rows,
    each in segment order (then seq, then arrival)."""
    traced = {g: [row[1] for row in rows] for g, rows in groupby(traces, key=itemgetter(0))}
    segments: dict[Any, tuple[int, bytes, bytes | None]] = {}
    hot = cold = 0
    for g, found in groupby(lines, key=itemgetter(0)):
        rows = list(found)
        texts = [row[2] for row in rows]
        blob, trace = pack(texts), pack(traced[g]) if g in traced else None
        hot += sum(len(text.encode()) + 1 for text in texts)  # as a JSONL file
        cold += len(blob) + len(trace or b"")
        segments[g] = (rows[-1][1] + 1, blob, trace)
    return Frozen(segments, hot, cold)
