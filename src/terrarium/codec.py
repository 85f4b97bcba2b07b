"""Encoding and decoding of log lines: one JSON object per line, UTF-8, ``\\n``-terminated.

msgspec is used for both directions: it decodes a 10k-line segment about 3x faster than orjson
on this workload (see ``benchmarks/``), and restore time is dominated by decoding.
"""

from __future__ import annotations

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


def encode(obj: Any) -> bytes:
    """Encode any JSON value compactly (no newline)."""
    return _encoder.encode(obj)


def decode(data: bytes | str) -> Any:
    """Decode one JSON value."""
    return _decoder.decode(data)


def split_complete(buf: bytes) -> tuple[bytes, bytes]:
    """Split ``buf`` into its complete lines and the torn bytes after the last newline."""
    end = buf.rfind(b"\n") + 1
    return buf[:end], buf[end:]


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
        entries = _decode_slowly(complete, where=where, first_line=first_line)
    for index, entry in enumerate(entries):
        version = entry.get("v", FORMAT_VERSION)
        if type(entry.get("seq")) is not int or type(entry.get("kind")) is not str:
            raise CorruptLog(
                f"{where}:{first_line + index}: entry lacks an integer 'seq' or a string 'kind'"
            )
        if type(version) is not int or version > FORMAT_VERSION:
            raise FormatVersionError(
                f"{where} was written in log format version {version}; this terrarium reads "
                f"version {FORMAT_VERSION} and older: upgrade terrarium to read it"
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
