"""The archive codec of every backend, and what ``SqliteStore`` and ``PostgresStore`` share to
keep their lifecycle: :class:`SqlStates`, the state primitives over ``sessions.state``.

A frozen segment leaves the hot tables as one zstandard frame of its JSONL (each ``line`` as
stored, ``\n`` after each, header first): the same bytes an FsStore ``.jsonl.zst`` holds, made
by the same :func:`compress`, so a blob copied out of the database decompresses with
``zstd -d``. A frame splits into lines at the byte ``\n`` alone
(:func:`terrarium.codec.split_lines`). Its debug trace, if it has one, is a second frame of the
same form. Nothing is decoded to freeze; thawing decodes each line's envelope only
(:func:`envelopes`) to refill the hot columns ``seq``, ``kind`` and ``ts``.

The archive has no search index of its own, so hot appends and hot searches never pay for
it; :func:`terrarium.search.search` reads the archived contexts when a query asks for them.

Usage::

    blob = pack([line_text, ...])
    assert unpack(blob) == b"".join(text.encode() + b"\\n" for text in [line_text, ...])
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from itertools import groupby
from operator import itemgetter
from pathlib import Path
from typing import Any

import msgspec

from terrarium.codec import decode, decode_lines, encode, split_lines
from terrarium.errors import (
    ConflictError,
    ContextNotFound,
    CorruptLog,
    SegmentNotFound,
    SessionAttached,
)
from terrarium.model import ContextId, SegmentId, SessionId
from terrarium.stores.base import (
    SegmentRead,
    SessionRecord,
    refuse_files,
)

#: zstandard's level for archived segments: its default, ~4x smaller JSONL at ~300 MB/s.
LEVEL = 3


# --------------------------------------------------------------------------- statements
# What both database stores run, in SQLite's placeholders (``?``); PostgreSQL's store turns
# them into its own (:func:`pyformat`, through :meth:`SqlStates._q`). The tables: ``sessions``
# with its ``state`` column, ``archived_contexts`` (the heads of frozen attached sessions) and
# ``archived_segments`` (the frozen segments), as each backend's ``m001_initial`` makes
# them.


def pyformat(statement: str) -> str:
    """``statement`` with psycopg's placeholders (``%s``) for SQLite's (``?``)."""
    return statement.replace("?", "%s")


_HEAD_COLUMNS = "context, session_id, segment_id, created_at, updated_at"
#: The head of an archived context (its session frozen), by id.
ARCHIVED_HEAD = f"SELECT {_HEAD_COLUMNS} FROM archived_contexts WHERE context = ?"
#: A context's head, hot or archived, in one statement: one snapshot, so a context that a
#: freeze or a thaw moves between the two tables meanwhile is found in one of them (two
#: statements could miss it in both).
HEAD_ANY = (
    f"SELECT {_HEAD_COLUMNS} FROM contexts WHERE context = ? "
    f"UNION ALL SELECT {_HEAD_COLUMNS} FROM archived_contexts WHERE context = ?"
)
#: A frozen segment's columns, read by reference.
COLD_SEGMENT = "SELECT {columns} FROM archived_segments WHERE session_id = ? AND segment_id = ?"
COLD_SEGMENT_IDS = "SELECT segment_id FROM archived_segments WHERE session_id = ?"
STATE = "SELECT state, context FROM sessions WHERE session_id = ?"
SET_STATE = "UPDATE sessions SET state = ? WHERE session_id = ?"
DETACH_SESSION = "UPDATE sessions SET context = NULL, state = ? WHERE session_id = ?"
#: From the partial index ``sessions_stated``.
RECORDS = "SELECT session_id, context, state FROM sessions WHERE state IS NOT NULL"
#: From the partial index ``sessions_detached``.
UNOWNED = "SELECT session_id FROM sessions WHERE context IS NULL"
DROP_SESSION = (
    "DELETE FROM archived_segments WHERE session_id = ?",
    "DELETE FROM sessions WHERE session_id = ?",
)


def compress(data: bytes) -> bytes:
    """One zstandard frame holding ``data`` (its size recorded in the frame)."""
    import zstandard  # not at import: 10-20 ms that `terrarium list` would wait for

    return zstandard.ZstdCompressor(level=LEVEL).compress(data)


def pack(lines: Iterable[str]) -> bytes:
    """``lines`` (JSON texts) as one compressed JSONL frame."""
    return compress("".join(f"{line}\n" for line in lines).encode())


def unpack(blob: bytes, *, where: str = "an archived segment") -> bytes:
    """The bytes of a frame made by :func:`compress` or :func:`pack`.

    Raises:
        CorruptLog: ``blob`` is not a zstandard frame (damaged); the message names ``where``.
    """
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


def jsonl_bytes(lines: Iterable[str]) -> int:
    """Bytes ``lines`` take as a JSONL file (what a hot log's size is measured in)."""
    return sum(len(line.encode()) + 1 for line in lines)


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
        hot += jsonl_bytes(texts)
        cold += len(blob) + len(trace or b"")
        segments[g] = (rows[-1][1] + 1, blob, trace)
    return Frozen(segments, hot, cold)


class SqlStates(ABC):
    """:class:`~terrarium.stores.base.SessionStates` over ``sessions.state`` (JSON text, NULL
    for ``{}``), which :mod:`terrarium.states` moves contexts with: what both database stores
    share (each inherits it first).

    Each primitive is one write transaction: the record is read (its row locked), compared
    with the one expected, and written together with the physical move, which the store
    supplies (:meth:`_freeze_rows`, :meth:`_thaw_rows`, :meth:`_detach_rows`,
    :meth:`_drop_rows`). A frozen session's segments are ``archived_segments`` rows, one
    zstandard frame each, and its head, while attached, an ``archived_contexts`` row.
    """

    #: Appended to the read of a record that is to change: locks its row (PostgreSQL). A
    #: SQLite write transaction holds the database's one write lock already.
    _FOR_UPDATE = ""

    def _q(self, statement: str) -> str:
        """``statement`` in this database's placeholders."""
        return statement

    def _sid(self, id: uuid.UUID) -> Any:
        """A session or segment id as this database's id columns hold it."""
        return str(id)

    @abstractmethod
    def _read(self) -> AbstractContextManager[Any]:
        """A connection for reads."""

    @abstractmethod
    def _write(self) -> AbstractContextManager[Any]:
        """A connection in one write transaction."""

    @abstractmethod
    def _freeze_rows(self, conn: Any, session: Any) -> tuple[int, int]:
        """Move a hot session's rows to their frozen form; return its bytes hot and frozen."""

    @abstractmethod
    def _thaw_rows(self, conn: Any, session: Any) -> None:
        """Move a frozen session's rows back to the hot tables."""

    @abstractmethod
    def _detach_rows(self, conn: Any, context: str, session: Any) -> bool:
        """Drop the head of ``context`` if it is on ``session``; whether it was."""

    @abstractmethod
    def _drop_rows(self, conn: Any, session: Any) -> None:
        """Delete a detached session's hot rows (its frozen ones go with its record)."""

    def session_state(self, session_id: SessionId) -> dict[str, Any]:
        """The session's state record (``{}`` if none)."""
        with self._read() as conn:
            row = conn.execute(self._q(STATE), (self._sid(session_id),)).fetchone()
        if row is None:
            raise SegmentNotFound(f"session {session_id} does not exist")
        return state_record(row[0])

    def set_session_state(
        self, session_id: SessionId, state: Mapping[str, Any], *, expected: Mapping[str, Any]
    ) -> None:
        """Replace the record if it is ``expected`` now."""
        with self._write() as conn:
            self._check(conn, session_id, expected)
            self._put(conn, session_id, state)

    def session_records(self) -> list[SessionRecord]:
        """Every session whose record is not empty, with its owner."""
        with self._read() as conn:
            rows = conn.execute(self._q(RECORDS)).fetchall()
        found = [
            SessionRecord(uuid.UUID(str(s)), owner, state_record(text)) for s, owner, text in rows
        ]
        return [record for record in found if record.state]

    def session_owner(self, session_id: SessionId) -> str | None:
        """The context the session belongs to, None if detached."""
        with self._read() as conn:
            row = conn.execute(self._q(STATE), (self._sid(session_id),)).fetchone()
        if row is None:
            raise SegmentNotFound(f"session {session_id} does not exist")
        return None if row[1] is None else str(row[1])

    def unowned_sessions(self) -> list[SessionId]:
        """Every session that belongs to no context, oldest first (UUIDv7 order)."""
        with self._read() as conn:
            return sorted(uuid.UUID(str(row[0])) for row in conn.execute(self._q(UNOWNED)))

    def freeze_session(
        self,
        session_id: SessionId,
        *,
        expected: Mapping[str, Any],
        state: Mapping[str, Any],
        along: Sequence[Path] = (),
    ) -> dict[str, Any]:
        """Move the session to its frozen form and set its record, in one transaction."""
        refuse_files(along)
        with self._write() as conn:
            now = self._check(conn, session_id, expected)
            if "cold" in now:  # frozen already: the record changes, the rows stay
                cold = now["cold"]
            else:
                hot, packed = self._freeze_rows(conn, self._sid(session_id))
                cold = {"hot_bytes": hot, "cold_bytes": packed}
            stored = state_record(encode({**state, "cold": cold}).decode())
            self._put(conn, session_id, stored)
        return stored

    def thaw_session(
        self, session_id: SessionId, *, expected: Mapping[str, Any], state: Mapping[str, Any]
    ) -> None:
        """Move a frozen session back to the hot tables and set its record."""
        with self._write() as conn:
            if "cold" in self._check(conn, session_id, expected):
                self._thaw_rows(conn, self._sid(session_id))
            self._put(conn, session_id, {k: v for k, v in state.items() if k != "cold"})

    def detach_context(
        self,
        context: ContextId,
        session_id: SessionId,
        *,
        expected: Mapping[str, Any],
        state: Mapping[str, Any],
    ) -> None:
        """Drop the context's head, leave its session detached and set its record."""
        with self._write() as conn:
            self._check(conn, session_id, expected)
            if not self._detach_rows(conn, str(context), self._sid(session_id)):
                raise ContextNotFound(f"context {context} is not on session {session_id}")
            conn.execute(self._q(DETACH_SESSION), (_text(state), self._sid(session_id)))

    def delete_session(self, session_id: SessionId) -> bool:
        """Delete a detached session, its record and its rows, for ever."""
        sid = self._sid(session_id)
        with self._write() as conn:
            row = conn.execute(self._q(STATE + self._FOR_UPDATE), (sid,)).fetchone()
            if row is None:
                return False
            if row[1] is not None:
                raise SessionAttached(f"session {session_id} belongs to context {row[1]}")
            self._drop_rows(conn, sid)
            for statement in DROP_SESSION:
                conn.execute(self._q(statement), (sid,))
        return True

    def _check(
        self, conn: Any, session_id: SessionId, expected: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The session's record, locked; ConflictError unless it is ``expected``."""
        row = conn.execute(self._q(STATE + self._FOR_UPDATE), (self._sid(session_id),)).fetchone()
        if row is None:
            raise SegmentNotFound(f"session {session_id} does not exist")
        now = state_record(row[0])
        if now != dict(expected):
            raise ConflictError(f"the state of session {session_id} changed meanwhile")
        return now

    def _put(self, conn: Any, session_id: SessionId, state: Mapping[str, Any]) -> None:
        conn.execute(self._q(SET_STATE), (_text(state), self._sid(session_id)))

    def _cold(self, conn: Any, column: str, session_id: SessionId, segment_id: SegmentId) -> Any:
        """One column of a frozen segment's row (``lines``, ``next_seq``, ``trace``), or None
        if there is no such row (``trace`` may be NULL: look at ``next_seq`` first)."""
        ids = (self._sid(session_id), self._sid(segment_id))
        row = conn.execute(self._q(COLD_SEGMENT.format(columns=column)), ids).fetchone()
        return None if row is None else row[0]

    def _cold_read(
        self, conn: Any, session_id: SessionId, segment_id: SegmentId, stop_seq: int | None
    ) -> SegmentRead | None:
        """Read a frozen segment (decompressing it), or None if there is none."""
        blob = self._cold(conn, "lines", session_id, segment_id)
        if blob is None:
            return None
        where = f"{self!r} frozen segment {segment_id}"
        lines = decode_lines(unpack(blob, where=where), where=where, first_line=0)
        stop = len(lines) if stop_seq is None else max(stop_seq, 0) + 1
        return SegmentRead(header=lines[0], entries=lines[1:stop], next_seq=len(lines))

    def _cold_ids(self, conn: Any, session_id: SessionId) -> list[SegmentId]:
        """The segments of a frozen session, oldest first (none if it is not frozen)."""
        rows = conn.execute(self._q(COLD_SEGMENT_IDS), (self._sid(session_id),))
        return sorted(uuid.UUID(str(row[0])) for row in rows)

    def _cold_trace(
        self, conn: Any, session_id: SessionId, segment_id: SegmentId
    ) -> list[dict[str, Any]] | None:
        """A frozen segment's trace, or None if there is no such segment."""
        if self._cold(conn, "next_seq", session_id, segment_id) is None:
            return None
        trace = self._cold(conn, "trace", session_id, segment_id)
        return [decode(line) for line in unpack_lines(trace)]

    def _frozen(self, conn: Any, session_id: SessionId) -> bool:
        """Whether the session exists and is frozen: the miss path of a write."""
        row = conn.execute(self._q(STATE), (self._sid(session_id),)).fetchone()
        return row is not None and "cold" in state_record(row[0])


def state_record(text: str | None) -> dict[str, Any]:
    """A ``state`` column's record (NULL: ``{}``)."""
    if text is None:
        return {}
    found: dict[str, Any] = decode(text)
    return found


def _text(state: Mapping[str, Any]) -> str | None:
    """A record as the ``state`` column holds it (``{}``: NULL)."""
    return encode(dict(state)).decode() if state else None
