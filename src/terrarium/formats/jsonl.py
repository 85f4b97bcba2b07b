"""The native log as one JSONL file: a context's lineage, exported and imported losslessly.

The export is every line that replaying the context's head reads, as stored, header first:
for a fork the ancestors' prefixes then the head segment; for a compaction or a clear the head
segment alone (its header holds the history). :func:`import_context` recreates the context in
any store with the same ids, timestamps, seqs and every key and kind, so exporting it again
gives the same lines. A :class:`Transcript` (lines, restored state, messages) is what the
Markdown, HTML and OpenAI formats render.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from terrarium import codec, sessions
from terrarium.copy import SessionSource, complete_session
from terrarium.errors import InvalidEntry
from terrarium.model import ContextId, EntryKind, RestoredState, SegmentId, parse_timestamp
from terrarium.stores.base import PodMetadata, Store

DateBound: TypeAlias = dt.date | dt.datetime | str
"""A date filter bound: a date (a whole UTC day), a datetime (naive = UTC), or ISO text."""


@dataclass(frozen=True, slots=True)
class Transcript:
    """A context's lineage read once: its raw lines, its restored state, its messages."""

    context: ContextId
    head: PodMetadata
    """The context's head record (creation time, current segment)."""
    lines: list[dict[str, Any]]
    """Every line of the lineage as stored, oldest first (see the module docstring)."""
    state: RestoredState
    """What replaying ``lines`` yields."""
    items: list[sessions.Message]
    """``state.history`` item by item, with the time each was logged."""

    def active_between(self, since: DateBound | None, until: DateBound | None) -> bool:
        """Whether an item was logged in the window (inclusive; None open; a date its whole day)."""
        low = None if since is None else _bound(since, end=False)
        high = None if until is None else _bound(until, end=True)
        for timed in self.items:
            when = parse_timestamp(timed.ts)
            if (low is None or when >= low) and (high is None or when <= high):
                return True
        return False


def _bound(value: dt.date | dt.datetime | str, *, end: bool) -> dt.datetime:
    if isinstance(value, str):
        text = value.strip()  # a bare date is YYYY-MM-DD
        value = (dt.date if len(text) == 10 else dt.datetime).fromisoformat(text)
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
    day = dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC)
    return day + dt.timedelta(days=1, microseconds=-1) if end else day


def lineage_lines(store: Store, context: ContextId | str) -> list[dict[str, Any]]:
    """Every line that replaying the context's head reads, as stored, oldest first."""
    head = sessions.require_head(store, context)
    return sessions.lines_of(sessions.lineage(store, head.session_id, head.segment_id))


def load_transcript(store: Store, context: ContextId | str) -> Transcript:
    """Read the context's lineage once into a :class:`Transcript` (ContextNotFound if none)."""
    ctx = ContextId.parse(context)
    head = sessions.require_head(store, ctx)
    reads = sessions.lineage(store, head.session_id, head.segment_id)
    lines = sessions.lines_of(reads)
    return Transcript(ctx, head, lines, sessions.collect_state(lines), sessions.messages(reads))


def export_context(store: Store, context: ContextId | str) -> str:
    """The context's lineage as JSONL text, header first (ContextNotFound if there is none)."""
    return b"".join(codec.encode_line(line) for line in lineage_lines(store, context)).decode()


def parse_lines(data: str | bytes, *, where: str = "<jsonl>") -> list[dict[str, Any]]:
    """Decode a JSONL export into its lines, checking each entry's envelope (CorruptLog: a line
    is not an entry, or the last is torn; FormatVersionError: a newer terrarium wrote it)."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if raw and not raw.endswith(b"\n"):
        raw += b"\n"
    return codec.decode_lines(raw, where=where)


def _split_segments(lines: list[dict[str, Any]], where: str) -> list[list[dict[str, Any]]]:
    """Split lineage lines into segments (header first), checking that seqs run 0, 1, 2, ...
    (InvalidEntry naming ``where`` and the line)."""
    segments: list[list[dict[str, Any]]] = []
    for number, line in enumerate(lines, start=1):
        if line["kind"] == EntryKind.HEADER:
            if line["seq"] != 0:
                raise InvalidEntry(f"{where}:{number}: a header must have seq 0, not {line['seq']}")
            segments.append([line])
            continue
        if not segments:
            raise InvalidEntry(f"{where}:1: a lineage must start with a segment header")
        expected = len(segments[-1])
        if line["seq"] != expected:
            raise InvalidEntry(f"{where}:{number}: expected seq {expected}, found {line['seq']}")
        segments[-1].append(line)
    if not segments:
        raise InvalidEntry(f"{where}: nothing to import: the file has no lines")
    session_ids = {str(segment[0].get("session_id")) for segment in segments}
    if len(session_ids) != 1:
        raise InvalidEntry(
            f"{where}: a lineage belongs to one session, found {sorted(session_ids)}"
        )
    return segments


def read_segments(
    data: str | bytes | Iterable[Mapping[str, Any]], *, where: str = "<jsonl>"
) -> list[list[dict[str, Any]]]:
    """Decode a JSONL export into its segments, checked as :func:`import_context` needs them.

    Every line loggable, seqs 0, 1, 2, ... in each segment, one session, ids and times in every
    header. Raises InvalidEntry naming ``where`` and the line, or :func:`parse_lines`' errors.
    """
    if isinstance(data, str | bytes):
        lines = parse_lines(data, where=where)
    else:
        lines = [dict(line) for line in data]
    for number, line in enumerate(lines, start=1):
        try:
            codec.encode(line)  # refused here, before anything is created
        except InvalidEntry as exc:
            raise InvalidEntry(f"{where}:{number}: {exc}") from None
    segments = _split_segments(lines, where)
    _check_segments(segments, where)
    return segments


def import_context(
    store: Store,
    data: str | bytes | Iterable[Mapping[str, Any]],
    *,
    context: ContextId | str | None = None,
    where: str = "<jsonl>",
) -> PodMetadata:
    """Recreate a context from an :func:`export_context` file (or its decoded lines); its head.

    Ids, timestamps, seqs, unknown keys and kinds are kept, so the context restores to the same
    state and exports the same lines; what an interrupted import left is completed. ``context``
    (default: the file's own) is written into the headers and must be fit for a new context.
    ``where`` names the file in errors: ContextExists (there, the same), SessionConflict (there,
    otherwise), InvalidEntry (not a lineage, or not loggable), and :func:`parse_lines`' errors.
    """
    segments = read_segments(data, where=where)
    named = next((s[0]["context"] for s in reversed(segments) if s[0].get("context")), None)
    target = context if context is not None else named
    if target is None:
        raise InvalidEntry(f"{where}: the file names no context: pass the context to create")
    ctx = ContextId.parse(target)
    if str(ctx) != named:
        ctx.check_new()  # a name of the caller's, not the file's own
        for segment in segments:
            if segment[0].get("context"):
                segment[0] = {**segment[0], "context": str(ctx)}
    head = SegmentId(segments[-1][0]["segment_id"])
    complete_session(store, SessionSource(segments, ctx, head))
    found = store.get_head(ctx)
    assert found is not None, "complete_session attached it"
    return found


def _check_segments(segments: list[list[dict[str, Any]]], where: str) -> None:
    """Every header names its session and segment and has a time, as every entry does."""
    for segment in segments:
        header = segment[0]
        for key in ("session_id", "segment_id", "ts"):
            if not isinstance(header.get(key), str):
                raise InvalidEntry(f"{where}: a segment header lacks a string {key!r}")
        for key in ("session_id", "segment_id"):
            try:
                uuid.UUID(header[key])
            except ValueError:
                raise InvalidEntry(
                    f"{where}: invalid {key.replace('_', ' ')} {header[key]!r}"
                ) from None
        if not all(isinstance(line.get("ts"), str) for line in segment):
            raise InvalidEntry(
                f"{where}: segment {header['segment_id']} has an entry without a 'ts'"
            )
