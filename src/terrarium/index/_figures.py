"""The figures the derived index keeps per session, by the one replay rule.

They are sums, so a head segment that only grew adds the figures of its new lines
(:func:`of_lines`); a head that moved is folded afresh (:func:`of_lineage`). A fork's copy of
another session's message is listed as a copy, counted once (``sql.COPIES_PER_DAY``, see
docs/architecture.md).
"""

from __future__ import annotations

import sqlite3
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

import msgspec

from terrarium import sessions
from terrarium.index import _sql as sql
from terrarium.model import SessionId, UsageTotals
from terrarium.stores.base import SegmentRead

Identity = tuple[str, str, int, int]
"""A message's original: session id, segment id, seq, place in its header's history (-1
for an entry)."""


class Figures(msgspec.Struct):
    """What one session adds to the overview (or, from :func:`of_lines`, what it gained)."""

    turns: int = 0
    usage: dict[str, UsageTotals] = msgspec.field(default_factory=dict)
    """Per model."""
    days: Counter[str] = msgspec.field(default_factory=Counter)
    """Messages per day, the copies from other sessions apart."""
    copies: list[tuple[Identity, str]] = msgspec.field(default_factory=list)
    """The copies from other sessions: each original's identity and day."""
    held: list[Identity] = msgspec.field(default_factory=list)
    """The identities of the items its conversation holds from a header's history."""
    ranges: dict[str, tuple[int, int]] = msgspec.field(default_factory=dict)
    """The entries its conversation holds: per segment, the first and last seq."""

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens over every model."""
        return sum(u.total_tokens for u in self.usage.values())


def of_lineage(reads: Sequence[SegmentRead], session_id: SessionId) -> Figures:
    """The figures of a whole head lineage (its reads oldest first, blobs as stored)."""
    state = sessions.replay(reads)
    found = Figures(state.turns, dict(state.usage_by_model))
    _count(found, sessions.messages(reads), session_id)
    return found


def of_lines(lines: Sequence[dict[str, Any]], session_id: str, segment_id: str) -> Figures:
    """What the lines a head segment gained add to its session's figures.

    They are folded after a header that carries nothing (no history, usage or turns), so
    the state they make is exactly what they add.
    """
    first = int(lines[0]["seq"]) - 1 if lines else 0
    header = {"kind": "header", "seq": first, "ts": "", "session_id": session_id}
    header["segment_id"] = segment_id
    state = sessions.collect_state([header, *lines])
    found = Figures(state.turns, dict(state.usage_by_model))
    read = SegmentRead({"segment_id": segment_id}, list(lines), first + 1 + len(lines), None)
    _count(found, sessions.messages([read]), uuid.UUID(session_id))
    return found


def _count(found: Figures, messages: list[sessions.Message], session_id: SessionId) -> None:
    for m in messages:
        if m.copied_from_elsewhere(session_id):
            found.copies.append((identity(m, session_id), m.ts[:10]))
            continue
        found.days[m.ts[:10]] += 1
        if m.index is not None or m.source is not None:
            found.held.append(identity(m, session_id))
        else:
            lo, _ = found.ranges.get(m.segment_id, (m.seq, m.seq))
            found.ranges[m.segment_id] = (lo, m.seq)


def identity(message: sessions.Message, session_id: SessionId) -> Identity:
    """Where ``message`` was first logged (its :data:`Identity`)."""
    origin = message.provenance(session_id)
    index = origin.get("index")
    ids = str(origin.get("session_id")), str(origin.get("segment_id"))
    return (*ids, int(origin.get("seq", 0)), index if type(index) is int else -1)


def write(conn: sqlite3.Connection, session: int, tid: int, found: Figures) -> None:
    """Add ``found`` to the figure tables' rows of the session row ``session`` (of type row
    ``tid``); its turns and tokens go to its ``sessions`` row (the caller's)."""
    usage = [(session, model, *msgspec.structs.astuple(u)) for model, u in found.usage.items()]
    conn.executemany(sql.ADD_USAGE, usage)
    conn.executemany(sql.ADD_DAY, [(session, day, tid, n) for day, n in found.days.items()])
    conn.executemany(sql.INSERT_COPY, [(session, tid, *i, day) for i, day in found.copies])
    conn.executemany(sql.INSERT_HELD, [(session, *i) for i in found.held])
    ranges = [(session, seg, lo, hi) for seg, (lo, hi) in found.ranges.items()]
    conn.executemany(sql.SET_RANGE, ranges)
