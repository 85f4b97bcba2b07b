"""Encoding and decoding of log lines: one JSON object per line, UTF-8, ``\\n``-terminated.

The entries of one append are written together (:func:`encode_lines`): every line of a batch
but its last ends in ``" \\n"``. JSON ignores the space, so every reader sees the same entries,
while a reader of a file's tail can tell an append a crash cut short (:func:`split_complete`)
and set the whole of it aside: an append is all or nothing.

msgspec does both directions: its ``decode_lines`` decodes a segment in one call, a little
faster than orjson line by line (``benchmarks/bench_log.py``), and decoding dominates restore.

Encoding refuses bad values as :class:`InvalidEntry` before anything is written: a lone
surrogate, and lines nested more than :data:`MAX_DEPTH` deep. The bound is fixed because
msgspec's own is the recursion limit minus the caller's depth: a line a shallow writer could
encode might not decode in a deeper reader. Reading a file past it gives :class:`CorruptLog`
naming the file and line, never a ``RecursionError``.
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import re
from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import Any

import msgspec

from terrarium.errors import CorruptLog, FormatVersionError, InvalidEntry
from terrarium.model import FORMAT_VERSION, not_unicode, short_repr

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()
_entry_decoder = msgspec.json.Decoder(dict[str, Any])
_KNOWN_VERSIONS = frozenset(range(1, FORMAT_VERSION + 1))

MAX_DEPTH = 256
"""Deepest nesting of arrays and objects in one line (the entry's own object is level 1).

Python's default recursion limit (1000) leaves the decoder ample room below this even when
it runs under a deep stack (a web server, a test runner)."""

TOO_DEEP = f"arrays and objects nest more than {MAX_DEPTH} levels deep"
"""Why a value too deep for the log is refused."""

# A JSON string, unrolled so that long strings cost no backtracking.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# A \u escape of a lone surrogate, high without low after it or low without high before it
# (after an even run of backslashes, so not escaped itself). msgspec refuses one saying only
# that the input was truncated.
_SURROGATE_ESCAPE = re.compile(
    rb"(?<!\\)(?:\\\\)*(?:\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)
_SURROGATE_PROBLEM = "a \\u escape of a lone surrogate, which is not valid Unicode"


def encode_line(obj: dict[str, Any]) -> bytes:
    """Encode one entry as a complete line, with its newline (InvalidEntry: see :func:`encode`)."""
    return encode(obj) + b"\n"


def encode_lines(objs: Sequence[dict[str, Any]]) -> bytes:
    """Encode the entries of one append; all lines but the last end in ``" \\n"``."""
    return b" \n".join(map(encode, objs)) + b"\n" if objs else b""


def encode(obj: Any) -> bytes:
    """Encode any JSON value compactly (no newline).

    InvalidEntry: a lone surrogate, nesting past :data:`MAX_DEPTH`, or a value JSON has no form
    for (an ``object()``).
    """
    try:
        data = _encoder.encode(obj)
    except UnicodeEncodeError as exc:
        raise InvalidEntry(f"text {short_repr(exc.object, ascii)} {not_unicode(exc)}") from None
    except TypeError as exc:  # msgspec: "Encoding objects of type object is unsupported"
        raise InvalidEntry(f"a value JSON has no form for: {exc}") from None
    except RecursionError:
        raise InvalidEntry(TOO_DEEP) from None
    if _may_be_too_deep(data) and deeper_than(obj, MAX_DEPTH):
        raise InvalidEntry(TOO_DEEP)
    return data


# Bracket counts cost ~0.75 ns a byte, the walk ~0.3 us a container (0.8 us for a message,
# 1.5 us with a tool call; measured on the bench machine): count short lines, walk long ones.
_COUNT_UP_TO = 2048


def _may_be_too_deep(data: bytes) -> bool:
    """False for the usual line, cheaply: too short, or too few brackets, to nest that deep."""
    if len(data) <= 2 * MAX_DEPTH:
        return False
    return len(data) > _COUNT_UP_TO or data.count(b"[") + data.count(b"{") > MAX_DEPTH


def deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value``, an encodable value, nests arrays and objects more than ``limit`` deep."""
    walked = _walk_deeper(value, limit)
    return nesting_depth(_encoder.encode(value)) > limit if walked is None else walked


_SCALARS = (str, int, float, type(None))
_CONTAINERS = (dict, list, tuple, set, frozenset)


def _walk_deeper(value: Any, limit: int) -> bool | None:
    """Walk the containers (iteratively, never their text); None for a type it cannot judge."""
    todo = [(value, 1)] if isinstance(value, _CONTAINERS) else []
    while todo:
        container, depth = todo.pop()
        if depth > limit:
            return True
        for child in container.values() if isinstance(container, dict) else container:
            if isinstance(child, _CONTAINERS):
                todo.append((child, depth + 1))
            elif not isinstance(child, _SCALARS):
                return None  # a Struct or dataclass, say: the encoded text decides
    return False


def nesting_depth(data: bytes) -> int:
    """How deep arrays and objects nest in the JSON text ``data``, measured without recursion."""
    brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    depth = deepest = 0
    for byte in brackets:
        if byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def decode(data: bytes | str) -> Any:
    """Decode one JSON value; msgspec.DecodeError if not JSON or too deep (no RecursionError)."""
    try:
        return _decoder.decode(data)
    except RecursionError:
        raw = data.encode() if isinstance(data, str) else data
        raise msgspec.DecodeError(_too_deep_to_read(raw)) from None


def _too_deep_to_read(line: bytes) -> str:
    return (
        f"nested {nesting_depth(line)} levels deep, too deep to decode "
        f"(terrarium writes at most {MAX_DEPTH})"
    )


def split_complete(buf: bytes) -> tuple[bytes, bytes]:
    """Split ``buf`` into its complete appends and the torn bytes after them (a cut append's)."""
    end = complete_end(buf)
    return buf[:end], buf[end:]


def split_lines(data: bytes) -> list[bytes]:
    """The non-blank lines of JSONL ``data``, split at ``\\n`` alone.

    ``str.splitlines`` would also break at U+0085, U+2028 and U+2029, which JSON keeps raw.
    """
    return [line for line in data.split(b"\n") if line.strip()]


def complete_end(buf: bytes | mmap.mmap) -> int:
    """The offset past the last complete append in ``buf`` (0: none; in a tail, under 2: unsure)."""
    end = buf.rfind(b"\n") + 1
    while end >= 2 and buf[end - 2] == 0x20:  # a line continued by the next in its batch
        end = buf.rfind(b"\n", 0, end - 1) + 1
    return end


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic GC off while a bulk decode builds many cycle-free containers (100k entry dicts).

    Not for rows of strings: a listing of 100k rows measured 10 % slower with it paused.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


PROMOTE_AT = 10_000
"""Entries decoded at once from which they go straight to the collector's oldest generation."""


def promote_young() -> None:
    """Move every object the cyclic GC tracks to its oldest generation, unless the program
    froze some (``gc.freeze``, which this would undo).

    For a bulk decode: its 100k entries are cycle-free, so the young collections that would
    otherwise each walk all of them (20 ms of a 100k restore, and a later one as long) free
    nothing; refcounting frees them when dropped. The program's other young objects (those
    since its last collections) wait for the next full collection instead.
    """
    if gc.get_freeze_count() == 0:
        gc.freeze()  # the tracked objects of every generation to the permanent one
        gc.unfreeze()  # and all of them back into the oldest


def decode_lines(
    complete: bytes | mmap.mmap,
    *,
    where: str,
    first_line: int = 1,
    first_seq: int | None = None,
    strict: bool = False,
) -> list[dict[str, Any]]:
    """Decode whole lines into entry dicts and check their envelope.

    ``where`` and ``first_line`` name the line in errors; from ``first_seq``, if given, seqs run
    up one a line. ``strict`` also refuses blank lines (restore skips them; finding them costs a
    scan of the whole buffer, 20% of a restore, which ``fsck`` pays). CorruptLog: a line is not an
    object with an integer ``seq`` and a string ``kind``; FormatVersionError: a newer format's.
    """
    if not complete:
        return []
    entries: list[dict[str, Any]] | None
    with paused_gc():  # collecting while 100k dicts appear costs ~50%
        try:
            entries = _entry_decoder.decode_lines(complete)
        except (msgspec.DecodeError, RecursionError):
            entries = None
        if entries is not None and len(entries) >= PROMOTE_AT:
            promote_young()
    if entries is not None and not (strict and len(entries) != bytes(complete).count(b"\n")):
        # Fast checks over the whole list; the line-by-line loop runs only to name the problem.
        # map over dict.get runs in C: half the cost of comprehensions over 100k entries.
        seqs = list(map(dict.get, entries, repeat("seq")))
        try:
            versions = set(map(dict.get, entries, repeat("v"), repeat(FORMAT_VERSION)))
            kinds = set(map(dict.get, entries, repeat("kind")))
        except TypeError:  # an unhashable v or kind
            versions = kinds = {None}
        if (
            versions <= _KNOWN_VERSIONS
            and all(type(v) is int for v in versions)
            and all(type(kind) is str for kind in kinds)
            and (
                seqs == list(range(first_seq, first_seq + len(seqs)))
                if first_seq is not None
                else all(type(seq) is int for seq in seqs)
            )
        ):
            return entries
    # Something is wrong: decode line by line, so that the error names the file's own line.
    # (A line holding two entries, or one entry broken over two lines, can decode to the same
    # entries as the good lines; the seq checks still catch any entry lost, doubled or moved.)
    numbered = _decode_slowly(bytes(complete), where=where, first_line=first_line, strict=strict)
    _check_envelopes(numbered, where=where, first_seq=first_seq)
    return [entry for _, entry in numbered]


def _check_envelopes(
    numbered: list[tuple[int, dict[str, Any]]], *, where: str, first_seq: int | None
) -> None:
    """Raise the error that names the first line whose envelope is wrong."""
    for index, (number, entry) in enumerate(numbered):
        version = entry.get("v", FORMAT_VERSION)
        if type(version) is not int:
            raise CorruptLog(f"{where}:{number}: 'v' is not an integer: {version!r}")
        if version > FORMAT_VERSION:
            # Checked first: a newer format may have changed the rest of the envelope too.
            raise FormatVersionError(
                f"{where}:{number}: written by a newer terrarium (log format "
                f"version {version}; this one reads version {FORMAT_VERSION} and older): "
                "upgrade terrarium to read it"
            )
        seq = entry.get("seq")
        if type(seq) is not int or type(entry.get("kind")) is not str:
            raise CorruptLog(f"{where}:{number}: entry lacks an integer 'seq' or a string 'kind'")
        if first_seq is not None and seq != first_seq + index:
            raise CorruptLog.seq_out_of_order(f"{where}:{number}", seq, first_seq + index)


def _decode_slowly(
    complete: bytes, *, where: str, first_line: int, strict: bool
) -> list[tuple[int, dict[str, Any]]]:
    """Decode line by line, each entry with its line number, to name the line that is bad."""
    out: list[tuple[int, dict[str, Any]]] = []
    for number, line in enumerate(complete.split(b"\n")[:-1], start=first_line):
        if not line.strip():
            if strict:
                raise CorruptLog(f"{where}:{number}: empty line inside the log")
            continue
        try:
            value = _decoder.decode(line)
        except msgspec.DecodeError as exc:
            reason = _SURROGATE_PROBLEM if _SURROGATE_ESCAPE.search(line) else exc
            raise CorruptLog(f"{where}:{number}: not valid JSON ({reason})") from None
        except RecursionError:
            raise CorruptLog(f"{where}:{number}: {_too_deep_to_read(line)}") from None
        if not isinstance(value, dict):
            raise CorruptLog(f"{where}:{number}: a log line must be a JSON object")
        out.append((number, value))
    return out
