"""Large outputs kept out of the log: content-addressed blobs and the references to them.

A history item's string longer than the store's ``blob_threshold`` (UTF-8 bytes, 64 KiB by
default) is written to its :class:`~terrarium.stores.base.BlobStore`, named by its sha256,
*before* the entry that refers to it. The entry keeps a preview in its place and lists its
blobs under the reserved key ``"_blobs"``::

    {"v": 1, "seq": 7, "ts": "...", "kind": "item",
     "item": {"role": "tool", "tool_call_id": "c1", "content": "first 2,000 characters..."},
     "_blobs": [{"path": ["item", "content"], "sha256": "9f86d0...", "bytes": 1048576,
                 "chars": 1048576}]}

A reader that does not know the key sees the preview, never a broken entry. :func:`resolve_line`
puts the text back (``"full"``), as a :class:`LazyBlob` (``"lazy"``) or not (``"stored"``);
:func:`collect_garbage` deletes unreferenced blobs. The part of the format the stores
read themselves (the key, digests, their scan) is :mod:`terrarium.blobrefs`. Usage::

    state = terrarium.restore(store, "cli:main", blobs="lazy")
    output = state.history[-1]["content"]  # a LazyBlob: .preview, .size, .read()
"""

from __future__ import annotations

import operator
import sys
import time
from collections.abc import Iterable, Mapping
from itertools import compress, repeat
from typing import Any, Literal

import msgspec

from terrarium.blobrefs import BLOBS_KEY as BLOBS_KEY
from terrarium.blobrefs import DEFAULT_THRESHOLD as DEFAULT_THRESHOLD
from terrarium.blobrefs import check_digest
from terrarium.blobrefs import digest_of as digest_of
from terrarium.codec import MAX_DEPTH
from terrarium.errors import BlobNotFound, CorruptLog, InvalidEntry
from terrarium.stores.base import BlobStore, Store

#: How many characters of a blob's text its entry keeps in the string's place.
PREVIEW_CHARS = 2000
#: Seconds a blob is kept after its last write even when nothing refers to it yet: the
#: window between writing a blob and appending the entry that refers to it.
GC_MIN_AGE = 3600.0

#: How :func:`resolve_line` treats references: the whole text, a :class:`LazyBlob`, or the
#: line as stored (the preview in place, the ``_blobs`` list kept).
BlobMode = Literal["full", "lazy", "stored"]


class LazyBlob(msgspec.Struct, frozen=True):
    """A large string left in its blob: what ``restore(..., blobs="lazy")`` puts in its place."""

    digest: str
    """The sha256 of the text's UTF-8 bytes."""
    size: int
    """The text's length in UTF-8 bytes."""
    chars: int
    """The text's length in characters."""
    preview: str
    """The string the entry holds: the text's first characters and a note of the rest."""
    store: BlobStore

    def read(self) -> str:
        """The whole text, read from the blob and checked against its digest.

        BlobNotFound if the store no longer holds the blob; CorruptBlob if its bytes do not
        match the digest.
        """
        return self.store.get_blob(self.digest).decode()

    def __str__(self) -> str:
        return self.preview


def threshold_of(store: Store) -> int | None:
    """The size above which ``store`` keeps strings in blobs; None when it keeps none."""
    kind = type(store)
    keeps = _KEEPS_BLOBS.get(kind)
    if keeps is None:  # a runtime Protocol check costs ~5 µs, a quarter of an append
        keeps = _KEEPS_BLOBS[kind] = isinstance(store, BlobStore)
    if not keeps:
        return None
    threshold: int | None = getattr(store, "blob_threshold", DEFAULT_THRESHOLD)
    return threshold if threshold else None


_KEEPS_BLOBS: dict[type, bool] = {}


def _plain(value: Any, chars: int = sys.maxsize, depth: int = 0) -> bool:
    """Whether ``value`` holds no LazyBlob and no string over ``chars``: one pass, no copies.

    That is every ordinary message; the general walks below cost a fifth of an append.
    """
    if isinstance(value, str):
        return len(value) <= chars
    if type(value) is dict or isinstance(value, Mapping):
        values: Iterable[Any] = value.values()
    elif type(value) is list or type(value) is tuple:
        values = value
    else:
        return not isinstance(value, LazyBlob)
    if depth >= MAX_DEPTH:
        return False  # the slow walk and the codec say what is wrong
    for item in values:
        if type(item) is str:
            if len(item) > chars:
                return False
        elif item is not None and type(item) is not int and not _plain(item, chars, depth + 1):
            return False
    return True


def _preview(text: str, digest: str, size: int) -> str:
    rest = len(text) - PREVIEW_CHARS
    return f"{text[:PREVIEW_CHARS]}\n[... {rest} more characters ({size} bytes) in blob {digest}]"


def _offload(
    store: Store,
    value: Any,
    path: list[str | int],
    threshold: int | None,
    found: list[dict[str, Any]],
) -> Any:
    """``value`` with its large strings replaced by previews, their references in ``found``."""
    if isinstance(value, str):
        if threshold is None or 4 * len(value) <= threshold:
            return value
        data = value.encode()
        if len(data) <= threshold:
            return value
        assert isinstance(store, BlobStore)
        digest = store.put_blob(data)
        found.append(
            {"path": list(path), "sha256": digest, "bytes": len(data), "chars": len(value)}
        )
        return _preview(value, digest, len(data))
    if isinstance(value, LazyBlob):  # a lazily restored item written back
        return _offload(store, value.read(), path, threshold, found)
    if len(path) > MAX_DEPTH:  # the codec refuses it, with its own error
        return value
    if isinstance(value, Mapping):
        return {k: _offload(store, v, [*path, k], threshold, found) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_offload(store, v, [*path, i], threshold, found) for i, v in enumerate(value)]
    return value


def offload_data(store: Store, kind: str, data: Mapping[str, Any]) -> Mapping[str, Any]:
    """An entry's data, its item's large strings moved into blobs written first (InvalidEntry:
    ``data`` sets ``_blobs``)."""
    if BLOBS_KEY in data:
        raise InvalidEntry(
            f"entry data of kind {kind!r} may not set the reserved key {BLOBS_KEY!r}"
        )
    item = data.get("item")
    if not isinstance(item, Mapping):
        return data
    threshold = threshold_of(store)
    # A string of n characters has at most 4n UTF-8 bytes: one under threshold // 4 stays.
    if _plain(item, sys.maxsize if threshold is None else threshold // 4):
        return data
    found: list[dict[str, Any]] = []
    new_item = _offload(store, item, ["item"], threshold, found)
    if not found:
        return {**data, "item": new_item} if _has_lazy(item) else data
    return {**data, "item": new_item, BLOBS_KEY: found}


def offload_line(store: Store, header: Mapping[str, Any]) -> dict[str, Any]:
    """A header with its history's large strings moved into blobs (InvalidEntry: sets _blobs)."""
    if BLOBS_KEY in header:
        raise InvalidEntry(f"a header may not set the reserved key {BLOBS_KEY!r}")
    line = dict(header)
    history = line.get("history")
    if not history:
        return line
    found: list[dict[str, Any]] = []
    line["history"] = _offload(store, history, ["history"], threshold_of(store), found)
    if found:
        line[BLOBS_KEY] = found
    return line


def materialize(value: Any) -> Any:
    """``value`` with every :class:`LazyBlob` read into its text (``value`` itself if none)."""
    if _plain(value) or not _has_lazy(value):
        return value
    if isinstance(value, LazyBlob):
        return value.read()
    if isinstance(value, Mapping):
        return {k: materialize(v) for k, v in value.items()}
    return [materialize(v) for v in value]


def _has_lazy(value: Any, depth: int = 0) -> bool:
    if isinstance(value, LazyBlob):
        return True
    if depth > MAX_DEPTH:  # the codec refuses it, with its own error
        return False
    if isinstance(value, Mapping):
        return any(_has_lazy(v, depth + 1) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_lazy(v, depth + 1) for v in value)
    return False


def _references(line: Mapping[str, Any]) -> list[tuple[list[str | int], str, int, int]]:
    """The line's references as (path, digest, bytes, chars); CorruptLog if malformed."""
    refs = line.get(BLOBS_KEY)
    bad = CorruptLog(f"entry {line.get('seq')!r} has a malformed {BLOBS_KEY!r} list: {refs!r:.200}")
    if not isinstance(refs, list):
        raise bad
    out = []
    for ref in refs:
        try:
            path, digest = list(ref["path"]), check_digest(ref["sha256"])
            size, chars = int(ref["bytes"]), int(ref["chars"])
        except (KeyError, TypeError, ValueError):
            raise bad from None
        if not path or not all(isinstance(p, str | int) for p in path):
            raise bad
        out.append((path, digest, size, chars))
    return out


def resolve_line(
    line: dict[str, Any], store: Store, mode: BlobMode, cache: dict[str, str] | None = None
) -> dict[str, Any]:
    """``line`` with its references resolved as ``mode`` says (a copy; ``line`` is untouched).

    ``"stored"``, and a line without references, return ``line`` itself. ``cache`` holds texts
    already read, so one restore reads each blob once. BlobNotFound, CorruptBlob, or CorruptLog
    (a malformed ``_blobs`` list) when a blob cannot be read back.
    """
    if mode == "stored" or BLOBS_KEY not in line:
        return line
    out = dict(line)
    del out[BLOBS_KEY]
    for path, digest, size, chars in _references(line):
        value: str | LazyBlob
        if mode == "lazy":
            if not isinstance(store, BlobStore):
                raise BlobNotFound(f"blob {digest} cannot be read: {store!r} holds no blobs")
            value = LazyBlob(digest, size, chars, str(_get(line, path)), store)
        else:
            value = _read_text(store, digest, cache)
        _put(out, path, value, line)
    return out


def resolve_lines(
    lines: list[dict[str, Any]], store: Store, mode: BlobMode, cache: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """:func:`resolve_line` of each line; ``lines`` itself when none refers to a blob.

    Lines with references are found in C (``map`` over ``in``): 5 ms instead of 11 ms for 100k.
    """
    if mode == "stored":
        return lines
    marked = list(compress(range(len(lines)), map(operator.contains, lines, repeat(BLOBS_KEY))))
    if not marked:
        return lines
    out = list(lines)
    for index in marked:
        out[index] = resolve_line(lines[index], store, mode, cache)
    return out


def _read_text(store: Store, digest: str, cache: dict[str, str] | None) -> str:
    if cache is not None and digest in cache:
        return cache[digest]
    if not isinstance(store, BlobStore):
        raise BlobNotFound(f"blob {digest} cannot be read: {store!r} holds no blobs")
    text = store.get_blob(digest).decode()
    if cache is not None:
        cache[digest] = text
    return text


def _get(line: Mapping[str, Any], path: list[str | int]) -> Any:
    node: Any = line
    try:
        for key in path:
            node = node[key]
    except (KeyError, IndexError, TypeError):
        raise CorruptLog(
            f"entry {line.get('seq')!r}: blob path {path!r} leads nowhere in the entry"
        ) from None
    return node


def _put(out: dict[str, Any], path: list[str | int], value: Any, line: Mapping[str, Any]) -> None:
    """Set ``out[path] = value``, copying every container on the way (``line`` stays as is)."""
    _get(line, path)  # the path must lead somewhere in the stored line
    node: Any = out
    for key in path[:-1]:
        child = node[key]
        child = dict(child) if isinstance(child, Mapping) else list(child)
        node[key] = child
        node = child
    node[path[-1]] = value


def inline_line(line: dict[str, Any], store: Store) -> dict[str, Any]:
    """``line`` with every blob's text back in place and no ``_blobs``: a self-contained line."""
    return resolve_line(line, store, "full")


def collect_garbage(store: Store, *, min_age: float = GC_MIN_AGE) -> int:
    """Delete the blobs no log of ``store`` refers to (hot, archived or trashed); how many.

    A blob younger than ``min_age`` seconds stays: an append may be about to name it.
    """
    if not isinstance(store, BlobStore):
        return 0
    return store.delete_unreferenced_blobs(stored_before=time.time() - min_age)
