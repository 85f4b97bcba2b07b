"""The blob references of the log format (docs/format.md §15), as the stores read them: the
``_blobs`` key of a line, the sha256 digests that name blobs, their scan in stored bytes.
:mod:`terrarium.blobs`, above the stores, writes and resolves them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from terrarium.errors import InvalidEntry

#: The reserved key of a line that lists its blob references.
BLOBS_KEY = "_blobs"
#: Strings longer than this many UTF-8 bytes go to a blob, unless the store says otherwise.
DEFAULT_THRESHOLD = 64 * 1024

_DIGEST = re.compile(r"[0-9a-f]{64}")
#: A reference's digest in stored JSON (any log file, compressed or not): GC's scan.
_REFERENCE = re.compile(rb'"sha256"\s*:\s*"([0-9a-f]{64})"')


def digest_of(data: bytes) -> str:
    """The sha256 hex digest that names ``data``."""
    # Imported here: hashlib loads OpenSSL (~10 % of a bare interpreter's start), which
    # commands that write no blob (`terrarium list`) need not wait for.
    import hashlib

    return hashlib.sha256(data).hexdigest()


def check_digest(digest: str) -> str:
    """``digest`` if it is a sha256 hex digest (64 lowercase hex digits); else InvalidEntry."""
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise InvalidEntry(f"invalid blob digest {digest!r}: expected 64 lowercase hex digits")
    return digest


def line_digests(line: Mapping[str, Any]) -> list[str]:
    """The digests of the blobs a stored line (or an entry's data) refers to."""
    refs = line.get(BLOBS_KEY)
    if not isinstance(refs, list):
        return []
    return [ref["sha256"] for ref in refs if isinstance(ref, Mapping) and "sha256" in ref]


def scan_digests(chunks: Iterable[bytes]) -> set[str]:
    """Every ``"sha256": "<digest>"`` in stored JSON, chunk by chunk; a false match keeps a blob."""
    found: set[str] = set()
    tail = b""
    for chunk in chunks:
        data = tail + chunk
        found.update(m.decode() for m in _REFERENCE.findall(data))
        tail = data[-100:]
    return found
