"""Copy sessions between any two stores, losslessly, and complete a copy that was cut short.

A context's whole session tree is copied, each line as stored (ids, timestamps, seqs, unknown
kinds and keys, traces); blobs are read whole and stored as the destination's
``blob_threshold`` says.

Each session is first compared with what the destination holds (:func:`complete_session`):
each segment there must be a prefix of the source's, and nothing the source lacks may be
there. Equal is ``ContextExists``; a prefix is completed; anything else is a
:class:`SessionConflict` and nothing is written. Every prefix of the writes is one a rerun
recognises: a new session is built detached, and only once every line and trace is in does
``attach_context`` give it its context and head; the pin and the archive come last. So a
killed copy leaves nothing, a detached part, or the whole, and a rerun completes it. Two
copies of one session at once (two processes), as a context's or detached, take turns under
one lock its id picks (:data:`SESSION_LOCKS`). Both end with the whole.

Archived contexts land archived, pinned ones pinned (where both stores have the
:class:`~terrarium.stores.base.Lifecycle`). The trash is not copied. Detached sessions are
copied with all contexts. One session: ``complete_session(dst, read_source(src, context))``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field, fields
from typing import Any

from terrarium import states
from terrarium.blobs import inline_line, offload_data, offload_line
from terrarium.errors import (
    ConflictError,
    ContextExists,
    ContextNotFound,
    CorruptLog,
    SegmentNotFound,
    SessionAttached,
    SessionConflict,
)
from terrarium.model import ENVELOPE_KEYS, ContextId, SegmentId, SessionId, TraceEntry
from terrarium.sessions import detached_sessions, holds_session
from terrarium.stores.base import (
    ATTEMPTS,
    Lifecycle,
    NewEntry,
    SessionStates,
    Store,
    context_lock,
)

BATCH = 1000
"""Entries per append: bounded memory and statement size on SQL stores."""

SESSION_LOCKS = 64
"""Locks the copies of sessions spread over, by session id (``terrarium:copy-00``...): a
bounded number of lock files, where one per session would pile up. Two sessions that share
one are copied in turn."""


@dataclass
class CopyReport:
    """What a copy did."""

    copied: list[str] = field(default_factory=list)
    """Contexts copied or completed (and detached sessions, as ``session {id}``)."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """Contexts not copied, each with the reason (conflicts and those already there too)."""
    present: list[str] = field(default_factory=list)
    """The skipped contexts that the destination already had, equal to the source's."""
    entries: int = 0
    """Lines copied (headers included)."""
    completed: list[str] = field(default_factory=list)
    """The copied contexts that the destination held in part (an interrupted copy's)."""
    conflicts: list[tuple[str, str]] = field(default_factory=list)
    """The skipped contexts the destination holds otherwise, each with what differs."""
    damaged: list[tuple[str, str]] = field(default_factory=list)
    """The skipped contexts whose log is damaged (in either store), each with the problem."""


@dataclass(frozen=True)
class SessionSource:
    """One session as its source holds it: what a copy makes the destination hold."""

    segments: list[list[dict[str, Any]]]
    """Each segment's lines (header first, blobs inline), every parent before its children."""
    context: ContextId | None = None
    """The context it belongs to; None for a detached session."""
    head: SegmentId | None = None
    """The context's head segment (None for a detached session)."""
    traces: Mapping[SegmentId, list[dict[str, Any]]] = field(default_factory=dict)
    """The debug traces, by segment (segments without one left out)."""
    archived: bool = False
    pinned: bool = False

    @property
    def session_id(self) -> SessionId:
        """The session's id (from its root header)."""
        return SessionId(self.segments[0][0]["session_id"])


def session_segments(store: Store, session_id: SessionId) -> list[list[dict[str, Any]]]:
    """Every segment of the session, parents first, blobs inline."""
    reads = {seg: store.read_segment(session_id, seg) for seg in store.list_segments(session_id)}
    children: dict[SegmentId | None, list[SegmentId]] = {}
    for segment_id, read in reads.items():
        parent_text = (read.header.get("origin") or {}).get("parent")
        parent = SegmentId(parent_text) if parent_text else None
        # A parent in another session (a fork into this context) is no parent here.
        children.setdefault(parent if parent in reads else None, []).append(segment_id)
    ordered = sorted(children.get(None, []))
    for segment_id in ordered:  # breadth first: the list grows as it is walked
        ordered.extend(sorted(children.get(segment_id, [])))
    # Blobs travel inline: the destination keeps them as its own threshold says.
    return [
        [inline_line(line, store) for line in [reads[s].header, *reads[s].entries]] for s in ordered
    ]


def read_source(
    store: Store,
    context: ContextId | str | None = None,
    *,
    session_id: SessionId | None = None,
    pinned: frozenset[str] | None = None,
) -> SessionSource:
    """A context's session, or the detached session_id's (ContextNotFound, SegmentNotFound)."""
    if context is None:
        assert session_id is not None, "a context or a session id"
        segments = session_segments(store, session_id)
        return SessionSource(segments, traces=_traces(store, session_id, segments))
    ctx = ContextId.parse(context)
    head = store.get_head(ctx)
    if head is None:
        raise ContextNotFound(f"context {ctx} does not exist in the source store")
    segments = session_segments(store, head.session_id)
    archived = is_pinned = False
    if isinstance(store, Lifecycle):
        archived = states.is_archived(store, ctx)
        is_pinned = str(ctx) in (states.pinned_contexts(store) if pinned is None else pinned)
    traces = _traces(store, head.session_id, segments)
    return SessionSource(segments, ctx, head.segment_id, traces, archived, is_pinned)


def _traces(
    store: Store, session_id: SessionId, segments: list[list[dict[str, Any]]]
) -> dict[SegmentId, list[dict[str, Any]]]:
    ids = (SegmentId(segment[0]["segment_id"]) for segment in segments)
    return {s: trace for s in ids if (trace := store.read_trace(session_id, s))}


@dataclass
class _Plan:
    """What the destination lacks of a session; empty when it holds it all."""

    new_session: bool = False
    """Nothing of the session is there: it is created (detached) first."""
    lines_there: dict[SegmentId, int] = field(default_factory=dict)
    """Lines (the header included) each segment already has; 0: create the segment."""
    traces_there: dict[SegmentId, int] = field(default_factory=dict)
    """Trace entries each segment already has, where the source has more."""
    attach: bool = False
    move_head: SegmentId | None = None
    """The head to move from (to the source's)."""
    pin: bool = False
    archive: bool = False
    partial: bool = False
    """Something of the session was there already (an interrupted copy's)."""
    written: int = 0
    """Lines written so far by following the plan."""

    def empty(self) -> bool:
        """Whether there is nothing to write."""
        return not any(
            getattr(self, f.name) for f in fields(self) if f.name not in ("partial", "written")
        )


def _plan(dst: Store, source: SessionSource, name: str) -> _Plan:
    """What to write: ``dst``'s part of the session against its source (see the module)."""
    session_id, ctx = source.session_id, source.context
    head = dst.get_head(ctx) if ctx is not None else None
    if head is not None and head.session_id != session_id:
        raise SessionConflict(f"{name}: the destination holds another session under that id")
    try:
        have = dst.list_segments(session_id)
    except SegmentNotFound:
        plan = _Plan(new_session=True, attach=ctx is not None)
        plan.lines_there = {SegmentId(lines[0]["segment_id"]): 0 for lines in source.segments}
        plan.traces_there = dict.fromkeys(source.traces, 0)
    else:
        if head is None and session_id not in detached_sessions(dst):
            if isinstance(dst, SessionStates) and "trashed" in dst.session_state(session_id):
                raise SessionConflict(
                    f"{name}: its session {session_id} is in the destination's trash "
                    "(restore or purge it there first)"
                )
            if ctx is None:
                raise SessionAttached(f"{name} belongs to a context in the destination")
            raise SessionConflict(
                f"{name}: its session {session_id} is in the destination under another context"
            )
        plan = _Plan(attach=ctx is not None and head is None, partial=True)
        _compare_segments(dst, source, have, plan, name)
        if head is not None and head.segment_id != source.head:
            plan.move_head = head.segment_id
    if ctx is not None and isinstance(dst, Lifecycle):
        # A write to an archived context unarchives it first: it is archived again after.
        writes = bool(plan.lines_there or plan.traces_there or plan.move_head)
        plan.pin = source.pinned and (head is None or str(ctx) not in states.pinned_contexts(dst))
        plan.archive = source.archived and (
            head is None or writes or not states.is_archived(dst, ctx)
        )
    return plan


def _compare_segments(
    dst: Store, source: SessionSource, have: list[SegmentId], plan: _Plan, name: str
) -> None:
    """Fill ``plan`` with what each segment and trace lacks in ``dst`` (each a prefix there)."""
    session_id = source.session_id
    ids = [SegmentId(lines[0]["segment_id"]) for lines in source.segments]
    extra = sorted(set(have) - set(ids))
    if extra:
        raise SessionConflict(f"{name}: the destination has segment {extra[0]}, the source not")
    for segment_id, lines in zip(ids, source.segments, strict=True):
        want = source.traces.get(segment_id, [])
        if segment_id not in have:
            plan.lines_there[segment_id] = 0
            if want:
                plan.traces_there[segment_id] = 0
            continue
        read = dst.read_segment(session_id, segment_id)
        there = [inline_line(line, dst) for line in [read.header, *read.entries]]
        _check_prefix(there, lines, f"{name}: segment {segment_id}", "line")
        if len(there) < len(lines):
            plan.lines_there[segment_id] = len(there)
        trace = dst.read_trace(session_id, segment_id)
        _check_prefix(trace, want, f"{name}: the trace of segment {segment_id}", "entry")
        if len(trace) < len(want):
            plan.traces_there[segment_id] = len(trace)


def _check_prefix(there: list[Any], want: list[Any], where: str, unit: str) -> None:
    """``there`` (the destination's) must be ``want`` (the source's) or a prefix of it."""
    if len(there) > len(want):
        more = len(there) - len(want)
        units = unit if more == 1 else f"{unit}s" if unit == "line" else "entries"
        raise SessionConflict(f"{where} has {more} more {units} in the destination than the source")
    for number, (found, expected) in enumerate(zip(there, want, strict=False)):
        if found != expected:
            raise SessionConflict(f"{where}: {unit} {number} differs from the source's")


def _write(dst: Store, source: SessionSource, plan: _Plan, name: str) -> int:
    """Write what ``plan`` says is missing, the head and state last; the lines written."""
    session_id, ctx = source.session_id, source.context
    for number, lines in enumerate(source.segments):
        segment_id = SegmentId(lines[0]["segment_id"])
        there = plan.lines_there.get(segment_id)
        if there is None:
            continue
        if there == 0:
            header = offload_line(dst, lines[0])
            if plan.new_session and number == 0:
                try:
                    dst.create_session(header)  # detached: no context names it yet
                except ConflictError:
                    if holds_session(dst, session_id):  # another copy made it meanwhile
                        raise
                    raise SessionConflict(
                        f"{name}: its session {session_id} is in the destination, not readable "
                        "(in its trash?)"
                    ) from None
            else:
                dst.create_segment(session_id, header)
            plan.written += 1
            there = 1
        plan.written += _append(dst, session_id, segment_id, lines, there)
    for segment_id, count in plan.traces_there.items():
        trace = source.traces[segment_id][count:]
        entries = [TraceEntry(t["ts"], t["event"], t.get("data") or {}) for t in trace]
        dst.append_trace(session_id, segment_id, entries)
    if ctx is not None and source.head is not None:
        if plan.attach:
            dst.attach_context(ctx, session_id, source.head)
        elif plan.move_head is not None:
            dst.set_head(ctx, source.head, expected=plan.move_head)
        if isinstance(dst, Lifecycle) and plan.pin:
            states.pin_context(dst, ctx)
        if isinstance(dst, Lifecycle) and plan.archive:
            states.archive_context(dst, ctx)
    return plan.written


def _append(
    dst: Store, session_id: SessionId, segment_id: SegmentId, lines: list[dict[str, Any]], at: int
) -> int:
    """Append ``lines[at:]`` to the segment, which holds ``at`` lines; how many."""
    entries = []
    for line in lines[at:]:
        data = {k: v for k, v in line.items() if k not in ENVELOPE_KEYS}  # the data: no envelope
        entries.append(NewEntry(line["kind"], line["ts"], offload_data(dst, line["kind"], data)))
    for start in range(0, len(entries), BATCH):
        batch = entries[start : start + BATCH]
        dst.append(session_id, segment_id, batch, expected_seq=at + start)
    return len(entries)


def _complete(dst: Store, source: SessionSource) -> tuple[int, bool] | None:
    """Make ``dst`` hold the session: (lines written, part there?), or None if it had it all.

    A write that finds its part there already (a stale seq, a segment or session that exists, a
    context attached) plans again from what is there now.
    """
    ctx = source.context
    name = str(ctx) if ctx is not None else f"session {source.session_id}"
    # A trace has no seq to compare and set: two copies of one session take turns under the
    # lock its id picks, whether it comes as a context's or detached. A context's copy also
    # holds the context's lock, taken first, as its other writers do.
    shared = ContextId("terrarium", f"copy-{source.session_id.int % SESSION_LOCKS:02d}")
    written, partial = 0, None
    with (
        context_lock(dst, ctx) if ctx is not None and ctx != shared else nullcontext(),
        context_lock(dst, shared),
    ):
        for _ in range(ATTEMPTS):
            plan = _plan(dst, source, name)
            partial = plan.partial if partial is None else partial
            if plan.empty():
                return (written, partial) if written else None
            try:
                return written + _write(dst, source, plan, name), partial
            except (ConflictError, ContextExists, SessionAttached):
                written += plan.written
    raise SessionConflict(f"{name}: the destination kept changing while it was copied")


def complete_session(dst: Store, source: SessionSource) -> int:
    """Make ``dst`` hold ``source``'s session, created or completed; the lines written.

    ContextExists: it is there, equal. SessionConflict: it is there otherwise (nothing written).
    SessionAttached: a detached source's session belongs to a context in ``dst``.
    """
    done = _complete(dst, source)
    if done is None:
        where = source.context if source.context is not None else source.session_id
        raise ContextExists(f"{where} already exists, with the same lines")
    return done[0]


def source_contexts(src: Store) -> list[ContextId]:
    """What a copy of all of ``src`` copies: its hot contexts, then its archived ones."""
    wanted = [ContextId.parse(h.context) for h in src.list_contexts()]
    if isinstance(src, Lifecycle):
        wanted += [ContextId.parse(a.context) for a in states.archived_contexts(src)]
    return wanted


def copy_store(
    src: Store,
    dst: Store,
    contexts: Iterable[ContextId | str] | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    detached: bool | None = None,
) -> CopyReport:
    """Copy the given contexts (all by default) from ``src`` to ``dst``, completing partial ones.

    ``progress`` gets each context id (or ``session {id}``) once done. ``detached`` also copies
    the detached sessions; by default when copying all contexts.
    """
    wanted = source_contexts(src) if contexts is None else [ContextId.parse(c) for c in contexts]
    pinned = states.pinned_contexts(src) if isinstance(src, Lifecycle) else frozenset()
    todo: list[ContextId | SessionId] = list(wanted)
    if detached if detached is not None else contexts is None:
        todo += detached_sessions(src)
    report = CopyReport()
    for what in todo:
        name = str(what) if isinstance(what, ContextId) else f"session {what}"
        try:
            if isinstance(what, ContextId):
                done = _complete(dst, read_source(src, what, pinned=pinned))
            else:
                done = _complete(dst, read_source(src, session_id=what))
        except (ContextNotFound, SessionAttached, SessionConflict, CorruptLog) as exc:
            report.skipped.append((name, str(exc)))
            if isinstance(exc, SessionConflict):
                report.conflicts.append((name, str(exc)))
            if isinstance(exc, CorruptLog):
                report.damaged.append((name, str(exc)))
        else:
            if done is None:
                report.skipped.append((name, "already in the destination"))
                report.present.append(name)
            else:
                report.entries += done[0]
                report.copied.append(name)
                if done[1]:
                    report.completed.append(name)
        if progress is not None:
            progress(name)
    return report
