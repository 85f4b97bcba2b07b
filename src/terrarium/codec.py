"""Encoding and decoding of log lines: one JSON object per line, UTF-8, ``\\n``-terminated.

The entries of one append are written together (:func:`encode_lines`): every line of a batch
but its last ends in ``" \\n"`` rather than ``"\\n"``. JSON ignores the space, so every reader
(``jq``, ``grep``, an older terrarium) sees the same entries, while a reader of a file tail can
tell an append that a crash cut short after some of its lines (:func:`split_complete`) and set
the whole of it aside: an append is all or nothing.

msgspec is used for both directions: it decodes a 10k-line segment about 3x faster than orjson
on this workload (see ``benchmarks/``), and restore time is dominated by decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from terrarium.errors import CorruptLog, FormatVersionError
from terrarium.model import FORMAT_VERSION

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()
_list_decoder = msgspec.json.Decoder(list[dict[str, Any]])


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


def complete_end(buf: bytes) -> int:
    """The offset just past the last complete append in ``buf`` (0 if there is none).

    When ``buf`` is the tail of a file, an answer below 2 is undecided: the append may have
    begun before ``buf``.
    """
    end = buf.rfind(b"\n") + 1
    while end >= 2 and buf[end - 2] == 0x20:  # a line continued by the next in its batch
        end = buf.rfind(b"\n", 0, end - 1) + 1
    return end


def decode_lines(complete: bytes, *, where: str, first_line: int = 1) -> list[dict[str, Any]]:
    """Decode newline-terminated lines into entry dicts and check their envelope.

    Args:
        complete: whole lines, each ending in ``\\n`` (see :func:`split_complete`).
        where: the file or segment named in error messages.
        first_line: the line number of the first line in ``complete``, for error messages.

    Raises:
        CorruptLog: a line is not a JSON object with an integer ``seq`` and a string ``kind``.
        FormatVersionError: a line was written by a newer major format version.
    """
    if not complete:
        return []
    try:
        # One C-level decode of the whole buffer: a JSON line never contains a raw newline.
        entries = _list_decoder.decode(b"[" + complete[:-1].replace(b"\n", b",") + b"]")
    except msgspec.DecodeError:
        entries = None
    if entries is None or len(entries) != complete.count(b"\n"):
        # A line holding two objects, or one object broken over two lines, also joins into
        # valid JSON: only a line-by-line decode names the line that is wrong.
        entries = _decode_slowly(complete, where=where, first_line=first_line)
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
        if type(entry.get("seq")) is not int or type(entry.get("kind")) is not str:
            raise CorruptLog(
                f"{where}:{first_line + index}: entry lacks an integer 'seq' or a string 'kind'"
            )
    return entries


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
