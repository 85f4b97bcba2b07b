"""Encoding and decoding of log lines: one JSON object per line, UTF-8, ``\\n``-terminated.

The entries of one append are written together (:func:`encode_lines`): every line of a batch
but its last ends in ``" \\n"`` rather than ``"\\n"``. JSON ignores the space, so every reader
(``jq``, ``grep``, an older terrarium) sees the same entries, while a reader of a file tail can
tell an append that a crash cut short after some of its lines (:func:`split_complete`) and set
the whole of it aside: an append is all or nothing.

msgspec is used for both directions: its ``decode_lines`` decodes a whole segment in one call,
a little faster than orjson line by line (``benchmarks/bench_log.py`` measures both), and
restore time is dominated by decoding.
"""

from __future__ import annotations

import gc
import mmap
from collections.abc import Sequence
from typing import Any

import msgspec

from terrarium.errors import CorruptLog, FormatVersionError
from terrarium.model import FORMAT_VERSION

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()
_entry_decoder = msgspec.json.Decoder(dict[str, Any])
_KNOWN_VERSIONS = frozenset(range(1, FORMAT_VERSION + 1))


def encode_line(obj: dict[str, Any]) -> bytes:
    """Encode one entry as a complete line (with its newline)."""
    return _encoder.encode(obj) + b"\n"


def encode_lines(objs: Sequence[dict[str, Any]]) -> bytes:
    """Encode the entries of one append; all lines but the last end in ``" \\n"``."""
    if not objs:
        return b""
    return b" \n".join([_encoder.encode(obj) for obj in objs]) + b"\n"


def encode(obj: Any) -> bytes:
    """Encode any JSON value compactly (no newline)."""
    return _encoder.encode(obj)


def decode(data: bytes | str) -> Any:
    """Decode one JSON value."""
    return _decoder.decode(data)


def split_complete(buf: bytes) -> tuple[bytes, bytes]:
    """Split ``buf`` into its complete appends and the torn bytes after them.

    The torn bytes are those after the last newline and, when the last complete lines belong
    to an append whose last line is missing (they end in ``" \\n"``), those lines too.
    """
    end = complete_end(buf)
    return buf[:end], buf[end:]


def complete_end(buf: bytes | mmap.mmap) -> int:
    """The offset just past the last complete append in ``buf`` (0 if there is none).

    When ``buf`` is the tail of a file, an answer below 2 is undecided: the append may have
    begun before ``buf``.
    """
    end = buf.rfind(b"\n") + 1
    while end >= 2 and buf[end - 2] == 0x20:  # a line continued by the next in its batch
        end = buf.rfind(b"\n", 0, end - 1) + 1
    return end


def decode_lines(
    complete: bytes | mmap.mmap, *, where: str, first_line: int = 1, first_seq: int | None = None
) -> list[dict[str, Any]]:
    """Decode newline-terminated lines into entry dicts and check their envelope.

    Args:
        complete: whole lines, each ending in ``\\n`` (see :func:`split_complete`).
        where: the file or segment named in error messages.
        first_line: the line number of the first line in ``complete``, for error messages.
        first_seq: if given, the seq the first line must have; each next line's is one more.

    Raises:
        CorruptLog: a line is not a JSON object with an integer ``seq`` and a string ``kind``.
        FormatVersionError: a line was written by a newer major format version.
    """
    if not complete:
        return []
    collecting = gc.isenabled()
    gc.disable()  # decoded lines hold no cycles; collecting while 100k dicts appear costs ~50%
    try:
        entries: list[dict[str, Any]] | None = _entry_decoder.decode_lines(complete)
    except msgspec.DecodeError:
        entries = None
    finally:
        if collecting:
            gc.enable()
    if entries is None or complete.find(b"\n\n") >= 0 or complete[:1] == b"\n":
        # decode_lines skips blank lines silently: only a line-by-line decode names the line.
        # (A line holding two entries, or one entry broken over two lines, decodes to the
        # same entries; the seq checks below still catch any entry lost, doubled or moved.)
        entries = _decode_slowly(bytes(complete), where=where, first_line=first_line)
    # Fast checks over the whole list; the line-by-line loop runs only to name what is wrong.
    seqs = [entry.get("seq") for entry in entries]
    versions = [entry.get("v", FORMAT_VERSION) for entry in entries]
    if (
        set(versions) <= _KNOWN_VERSIONS
        and {type(v) for v in versions} == {int}
        and {type(entry.get("kind")) for entry in entries} == {str}
        and {type(seq) for seq in seqs} == {int}
        and (first_seq is None or seqs == list(range(first_seq, first_seq + len(seqs))))
    ):
        return entries
    _check_envelopes(entries, where=where, first_line=first_line, first_seq=first_seq)
    return entries


def _check_envelopes(
    entries: list[dict[str, Any]], *, where: str, first_line: int, first_seq: int | None
) -> None:
    """Raise the error that names the first line whose envelope is wrong."""
    for index, entry in enumerate(entries):
        version = entry.get("v", FORMAT_VERSION)
        if type(version) is not int:
            raise CorruptLog(f"{where}:{first_line + index}: 'v' is not an integer: {version!r}")
        if version > FORMAT_VERSION:
            # Checked first: a newer format may have changed the rest of the envelope too.
            raise FormatVersionError(
                f"{where}:{first_line + index}: written by a newer terrarium (log format "
                f"version {version}; this one reads version {FORMAT_VERSION} and older): "
                "upgrade terrarium to read it"
            )
        seq = entry.get("seq")
        if type(seq) is not int or type(entry.get("kind")) is not str:
            raise CorruptLog(
                f"{where}:{first_line + index}: entry lacks an integer 'seq' or a string 'kind'"
            )
        if first_seq is not None and seq != first_seq + index:
            raise CorruptLog(
                f"{where}:{first_line + index}: seq {seq} out of order "
                f"(expected {first_seq + index})"
            )


def _decode_slowly(complete: bytes, *, where: str, first_line: int) -> list[dict[str, Any]]:
    """Decode line by line, to name the line that is corrupt."""
    out: list[dict[str, Any]] = []
    for number, line in enumerate(complete.split(b"\n")[:-1], start=first_line):
        if not line.strip():
            raise CorruptLog(f"{where}:{number}: empty line inside the log")
        try:
            value = _decoder.decode(line)
        except msgspec.DecodeError as exc:
            raise CorruptLog(f"{where}:{number}: not valid JSON ({exc})") from None
        if not isinstance(value, dict):
            raise CorruptLog(f"{where}:{number}: a log line must be a JSON object")
        out.append(value)
    return out
