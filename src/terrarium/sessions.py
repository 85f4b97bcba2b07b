"""The session log API: start, write, branch, compact and replay segments.

Free functions over a :class:`~terrarium.stores.base.Store`, named as in the Rust
``session_store`` crate. A segment reference is anything with ``session_id`` and
``segment_id`` (a :class:`PodActiveSegmentRef`, a head, a :class:`RestoredState`).

The replay rule (:func:`fold`): a header that carries ``history`` starts the state afresh; a
fork header without one continues its parent's state, replayed first up to the fork point.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import chain
from typing import Any, Protocol, TypeVar, cast, overload

import msgspec

from terrarium.blobs import (
    BLOBS_KEY,
    BlobMode,
    materialize,
    offload_data,
    offload_line,
    resolve_line,
    resolve_lines,
)
from terrarium.errors import (
    ConflictError,
    ContextExists,
    ContextNotFound,
    CorruptLog,
    InvalidEntry,
    SegmentNotFound,
    StoreError,
)
from terrarium.model import (
    FORMAT_VERSION,
    HISTORY_KINDS,
    POD_SCOPE_EXTENSION_DOMAIN,
    ContextId,
    EntryKind,
    Item,
    LogEntry,
    LoggedItem,
    PodScopeSnapshot,
    RestoredState,
    RunStatus,
    SegmentId,
    SegmentOrigin,
    SegmentStartState,
    SessionId,
    SystemItem,
    TraceEntry,
    UsageRecord,
    UsageTotals,
    as_logged,
    new_segment_id,
    new_session_id,
    render_pod_event,
    utc_now,
)
from terrarium.stores.base import (
    Lifecycle,
    NewEntry,
    PodActiveSegmentRef,
    PodMetadata,
    SegmentRead,
    Store,
    context_lock,
)


class SegmentRef(Protocol):
    """Anything that names a segment."""

    @property
    def session_id(self) -> SessionId: ...

    @property
    def segment_id(self) -> SegmentId: ...


def _header(
    session_id: SessionId,
    segment_id: SegmentId,
    origin: SegmentOrigin,
    *,
    context: ContextId | None,
    start: SegmentStartState | None,
    carry: RestoredState | None = None,
    figures: bool = True,
    ts: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A header line; ``start=None`` makes a fork header that continues its parent. ``carry``'s
    extensions (and, with ``figures``, usage and turns) go on; ``extra`` may not replace a key."""
    header: dict[str, Any] = {
        "v": FORMAT_VERSION,
        "seq": 0,
        "ts": ts or utc_now(),
        "kind": EntryKind.HEADER.value,
        "session_id": str(session_id),
        "segment_id": str(segment_id),
        "context": str(context) if context is not None else None,
        "origin": origin.to_dict(),
    }
    if start is None:
        header["history"] = None
    else:
        header["system_prompt"] = start.system_prompt
        header["config"] = dict(start.config)
        header["history"] = [as_logged(materialize(item)) for item in start.history]
        if carry is not None:
            header["extensions"] = dict(carry.extensions)
        if carry is not None and figures:  # the same context's: its figures go on
            header["usage"] = carry.usage.to_dict()
            header["usage_by_model"] = {m: u.to_dict() for m, u in carry.usage_by_model.items()}
            header["turns"] = carry.turns
    for key, value in (extra or {}).items():
        if key in header or key in ("usage", "usage_by_model", "turns", "extensions"):
            raise InvalidEntry(f"header key {key!r} is reserved")
        header[key] = value
    return header


def _is_count(value: object) -> bool:
    """Whether ``value`` is a count or an entry number: an int (not a bool), 0 or more."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def create_segment(
    store: Store, start: SegmentStartState | None = None, *, context: ContextId | str | None = None
) -> tuple[SessionId, SegmentId]:
    """Create a new session whose root segment starts from ``start``; its and the segment's ids.

    With ``context``, the session is that new context's, and its head is the root segment.
    Without, the session belongs to no context until :func:`attach_context`; the log API
    works on it by reference.

    Raises:
        InvalidContextId: ``context`` is not a valid ``type:name``.
        ContextExists: the context already exists.
    """
    session_id, segment_id = new_session_id(), new_segment_id()
    create_segment_with_ids(store, session_id, segment_id, start, context=context)
    return session_id, segment_id


@overload
def create_segment_with_ids(
    store: Store,
    session_id: SessionId,
    segment_id: SegmentId,
    start: SegmentStartState | None = None,
    *,
    context: ContextId | str,
    origin: SegmentOrigin | None = None,
    ts: str | None = None,
    header_extra: Mapping[str, Any] | None = None,
) -> PodMetadata: ...


@overload
def create_segment_with_ids(
    store: Store,
    session_id: SessionId,
    segment_id: SegmentId,
    start: SegmentStartState | None = None,
    *,
    context: None = None,
    origin: SegmentOrigin | None = None,
    ts: str | None = None,
    header_extra: Mapping[str, Any] | None = None,
) -> PodActiveSegmentRef: ...


def create_segment_with_ids(
    store: Store,
    session_id: SessionId,
    segment_id: SegmentId,
    start: SegmentStartState | None = None,
    *,
    context: ContextId | str | None = None,
    origin: SegmentOrigin | None = None,
    ts: str | None = None,
    header_extra: Mapping[str, Any] | None = None,
) -> PodMetadata | PodActiveSegmentRef:
    """Like :func:`create_segment` with chosen ids, origin and timestamp (imports, copies).

    ``header_extra`` adds keys of the caller's own to the root header; replay ignores them. A
    root origin needs a name fit for a new context; an import or copy keeps its data's name.
    Returns the new context's head, or without ``context`` a reference to the detached
    session's root segment (ConflictError if the session exists already).
    """
    if start is not None and not isinstance(start, SegmentStartState):
        raise InvalidEntry(
            f"start must be a SegmentStartState, not {type(start).__name__} "
            "(pass the context as context=...)"
        )
    ctx = ContextId.parse(context) if context is not None else None
    if ctx is not None and (origin is None or origin.kind == "root"):
        ctx.check_new()
    header = _header(
        session_id,
        segment_id,
        origin or SegmentOrigin.root(),
        context=ctx,
        start=start or SegmentStartState(),
        ts=ts,
        extra=header_extra,
    )
    header = offload_line(store, header)
    if ctx is None:
        store.create_session(header)
        return PodActiveSegmentRef(session_id, segment_id)
    return store.create_context(ctx, header)


def create_or_join(
    store: Store,
    context: ContextId,
    start: SegmentStartState | None = None,
    *,
    ids: tuple[SessionId, SegmentId] | None = None,
) -> PodMetadata:
    """Create ``context`` as a new session (``ids``: its session and root segment ids, else
    new ones) and return its head; if the context exists already, its head.

    For a caller holding the context's lock: a store without context locks lets another
    writer create the context meanwhile, and that writer's session is then continued.
    """
    session_id, segment_id = ids or (new_session_id(), new_segment_id())
    try:
        return create_segment_with_ids(store, session_id, segment_id, start, context=context)
    except ContextExists:
        return require_head(store, context)


def attach_context(store: Store, context: ContextId | str, ref: SegmentRef) -> PodMetadata:
    """Make ``context`` a new context whose head is ``ref``, any segment of a detached session.

    Raises:
        InvalidContextId: ``context`` is not a valid name for a new context.
        ContextExists: the context already exists.
        SessionAttached: the session already belongs to a context (nothing changed).
        SegmentNotFound: no such session, or no such segment in it.
    """
    ctx = ContextId.parse(context).check_new()
    return store.attach_context(ctx, ref.session_id, ref.segment_id)


def detached_sessions(store: Store) -> list[SessionId]:
    """The sessions of ``store`` that belong to no context yet, oldest first.

    A detached session with a state record is a deleted context's, not one of them.

    Raises:
        StoreError: the store has no state primitives to list its sessions with.
    """
    if not isinstance(store, Lifecycle):
        raise StoreError(f"{store!r} cannot list the sessions of no context")
    held = {r.session_id for r in store.session_records() if r.owner is None}
    return [s for s in store.unowned_sessions() if s not in held]


def fork(store: Store, ref: SegmentRef) -> SegmentId:
    """Branch a new segment off the current tail of ``ref``; the head does not move."""
    return fork_at(store, ref, store.next_seq(ref.session_id, ref.segment_id) - 1)


def fork_at(store: Store, ref: SegmentRef, at_seq: int) -> SegmentId:
    """Branch a new segment that continues ``ref`` after entry ``at_seq`` (0 = the header).

    The original segment is untouched and stays appendable; nothing is copied. InvalidEntry:
    ``at_seq`` is no entry number, or not one of the segment's.
    """
    _check_entry(store, ref, at_seq)
    segment_id = new_segment_id()
    origin = SegmentOrigin("fork", parent=ref.segment_id, at_seq=at_seq)
    header = _header(ref.session_id, segment_id, origin, context=None, start=None)
    store.create_segment(ref.session_id, header)
    return segment_id


def _check_entry(store: Store, ref: SegmentRef, at_seq: Any) -> None:
    """InvalidEntry unless ``at_seq`` is an entry number the segment has (0 = the header)."""
    if type(at_seq) is not int and not _is_count(at_seq):  # a negative int: out of range
        raise InvalidEntry(
            f"cannot fork segment {ref.segment_id} at {at_seq!r}: "
            "at_seq must be an entry number (0, 1, 2, ...)"
        )
    next_seq = store.next_seq(ref.session_id, ref.segment_id)
    if not 0 <= at_seq < next_seq:
        raise InvalidEntry(
            f"cannot fork segment {ref.segment_id} at entry {at_seq}: "
            f"it has entries 0..{next_seq - 1}"
        )


def _kept(store: Store, state: RestoredState, header: dict[str, Any]) -> list[Message | None]:
    """Count a compaction's summary, the items before the tail its history shares with
    ``state``'s, into ``header``; its history as messages: None for the summary, then the
    source's messages it kept (none if the log holds another history than ``state``)."""
    history, source = header["history"], state.history
    kept = 0
    while kept < min(len(history), len(source)) and history[-1 - kept] == source[-1 - kept]:
        kept += 1
    header["summary_items"] = summary = len(history) - kept
    found = messages(lineage(store, state.session_id, state.segment_id, blobs="stored"))
    if len(found) != len(source):
        return []
    return [None] * summary + list(found[len(found) - kept :])


def _restart(
    store: Store,
    source: RestoredState | SegmentRef,
    kind: str,
    history: Sequence[Item | LoggedItem],
    context: ContextId | str | None,
    system_prompt: str | None,
    copied: Sequence[Message | None] = (),
) -> SegmentId:
    """Start a segment after ``source`` whose header holds ``history``; ``copied``: where its
    items come from (a compaction finds the turns it kept itself)."""
    state = source
    if not isinstance(state, RestoredState):
        state = restore_by_segment(store, state.session_id, state.segment_id)
    segment_id = new_segment_id()
    origin = SegmentOrigin(kind, parent=state.segment_id, at_seq=state.next_seq - 1)  # type: ignore[arg-type]
    start = SegmentStartState(
        system_prompt=state.system_prompt if system_prompt is None else system_prompt,
        config=state.config,
        history=history,
    )
    ctx = ContextId.parse(context) if context is not None else None
    header = _header(state.session_id, segment_id, origin, context=ctx, start=start, carry=state)
    if kind == "compaction":
        copied = _kept(store, state, header)
    _keep_provenance(header, copied, state.session_id)
    if ctx is None and state.context is not None:
        header["context"] = state.context
    store.create_segment(state.session_id, offload_line(store, header))
    if ctx is not None:
        store.set_head(ctx, segment_id, expected=state.segment_id)
    return segment_id


def create_compacted_segment(
    store: Store,
    source: RestoredState | SegmentRef,
    history: Sequence[Item | LoggedItem],
    *,
    context: ContextId | str | None = None,
    system_prompt: str | None = None,
) -> SegmentId:
    """Start a segment whose history is ``history`` (a summary of ``source``).

    Config, usage totals and extensions carry over. With ``context``, the context's head moves
    from ``source`` to the new segment (ConflictError if it was elsewhere).
    """
    return _restart(store, source, "compaction", history, context, system_prompt)


def clear_segment(
    store: Store, source: RestoredState | SegmentRef, *, context: ContextId | str | None = None
) -> SegmentId:
    """Start an empty segment after ``source``; the old history stays in the session tree."""
    return _restart(store, source, "clear", (), context, None)


def fork_context(
    store: Store, source: ContextId | str, target: ContextId | str, *, at_seq: int | None = None
) -> PodMetadata:
    """Create context ``target`` as a copy of ``source``'s head (up to ``at_seq``).

    The target is a new session: its root header holds the copied history and its origin
    names the source segment, so the two contexts stay isolated. Items of failed runs are not
    copied (``RestoredState.model_history``): no header can mark them failed.
    """
    src, dst = ContextId.parse(source), ContextId.parse(target).check_new()
    head = require_head(store, src)
    if at_seq is not None:
        _check_entry(store, head.ref, at_seq)
    reads = lineage(store, head.session_id, head.segment_id, stop_seq=at_seq)
    state = replay(reads)
    origin = SegmentOrigin(
        "fork", parent=head.segment_id, at_seq=state.next_seq - 1, source=str(src)
    )
    session_id, segment_id = new_session_id(), new_segment_id()
    start = SegmentStartState(state.system_prompt, state.config, state.model_history)
    header = _header(
        session_id, segment_id, origin, context=dst, start=start, carry=state, figures=False
    )
    kept = [m for i, m in enumerate(messages(reads)) if i not in state.failed]
    _keep_provenance(header, kept, head.session_id)
    return store.create_context(dst, offload_line(store, header))


def _keep_provenance(
    header: dict[str, Any], copied: Sequence[Message | None], session_id: SessionId
) -> None:
    """Name in ``header["history_from"]`` where each copied item of its history comes from."""
    if any(m is not None for m in copied):
        header["history_from"] = [m.provenance(session_id) if m else None for m in copied]


def ensure_head_or_fork(
    store: Store, context: ContextId | str, ref: SegmentRef, expected_seq: int
) -> SegmentId:
    """Return the segment a writer with view (``ref``, ``expected_seq``) may append to.

    If ``ref`` is still the context's head and its next seq is ``expected_seq``, that is
    ``ref`` itself. Otherwise another writer moved on: the writer's view is forked at
    ``expected_seq - 1`` and the head moves to the fork, so neither writer's entries are
    overwritten (the other branch stays in the session tree).
    """
    ctx = ContextId.parse(context)
    while True:
        head = require_head(store, ctx)
        if (
            head.segment_id == ref.segment_id
            and store.next_seq(ref.session_id, ref.segment_id) == expected_seq
        ):
            return ref.segment_id
        forked = fork_at(store, ref, expected_seq - 1)
        try:
            store.set_head(ctx, forked, expected=head.segment_id)
        except ConflictError:
            continue  # the head moved again while we forked: decide afresh
        return forked


def rewind(
    store: Store, context: ContextId | str, n: int = 1, *, expected_seq: int | None = None
) -> list[LoggedItem]:
    """Drop the last ``n`` history items of ``context`` by moving its head to a fork.

    The fork continues the segment that logged the first dropped item, just before it; the
    dropped items stay in the session tree. A cut inside a header's history copies its kept
    part into the new header. Runs under the context's lock. Returns the dropped items, oldest
    first. ``expected_seq``: the next seq the writer expects the head segment to have.

    Raises:
        ContextNotFound: no such context.
        InvalidEntry: ``n`` is not a count, or is larger than the history.
        ConflictError: the head moved, or its next seq is not ``expected_seq``.
    """
    if not _is_count(n):
        raise InvalidEntry(f"cannot rewind {n!r} items: n must be a count (0, 1, 2, ...)")
    ctx = ContextId.parse(context)
    with context_lock(store, ctx):
        head = require_head(store, ctx)
        reads = lineage(store, head.session_id, head.segment_id)
        next_seq = (reads[-1].entries[-1]["seq"] if reads[-1].entries else 0) + 1
        if expected_seq is not None and next_seq != expected_seq:
            raise ConflictError(
                f"cannot rewind {ctx}: its head segment is at entry {next_seq}, "
                f"not {expected_seq}; nothing changed"
            )
        found = messages(reads)
        if n > len(found):
            raise InvalidEntry(
                f"cannot rewind {ctx} by {n} item{'' if n == 1 else 's'}: its history has only "
                f"{len(found)}; nothing changed"
            )
        if n == 0:
            return []
        cut = found[len(found) - n]
        ref = PodActiveSegmentRef(head.session_id, SegmentId(cut.segment_id))
        if cut.index is None:
            segment_id = fork_at(store, ref, cut.seq - 1)
        else:
            segment_id = _fork_inside_header(store, ref, cut.index)
        store.set_head(ctx, segment_id, expected=head.segment_id)
        return [message.item for message in found[len(found) - n :]]


class Message(msgspec.Struct):
    """One history item of a conversation, where it is and where it comes from: what every
    view shows of a message (:func:`messages`)."""

    item: LoggedItem
    ts: str
    """When it was logged first: a copy (a fork into another context, the turns a compaction
    kept) keeps its original's time."""
    segment_id: str
    """The segment of this lineage that holds it."""
    seq: int
    """Its entry's seq; 0 for an item of a header's history."""
    index: int | None = None
    """Its place in that header's history, or None for an entry."""
    usage: dict[str, Any] | None = None
    """The (last) usage record logged after it (the model call that produced it), if any."""
    source: dict[str, Any] | None = None
    """A copy's origin as its header's ``history_from`` names it (``ts``, ``session_id``,
    ``segment_id``, ``seq``, ``usage``), or None."""
    summary: bool = False
    """Written by a compaction as its summary (not a turn it kept)."""
    event: str | None = None
    """For a runtime event's entry (``system_item``): the event's name; None for any other."""

    def provenance(self, session_id: SessionId) -> dict[str, Any]:
        """Where a copy of this message comes from, for a new header's ``history_from``."""
        if self.source is not None:
            return dict(self.source)
        found: dict[str, Any] = {"ts": self.ts, "session_id": str(session_id)}
        found.update(segment_id=self.segment_id, seq=self.seq)
        if self.index is not None:
            found["index"] = self.index
        if self.usage is not None:
            found["usage"] = self.usage
        return found

    def copied_from_elsewhere(self, session_id: SessionId) -> bool:
        """A copy from another session (a fork into another context): counted there."""
        return self.source is not None and self.source.get("session_id") != str(session_id)


def messages(reads: Sequence[SegmentRead]) -> list[Message]:
    """The conversation a lineage's reads hold, one :class:`Message` per history item:
    ``restore(...).history[i]`` is ``messages(...)[i].item``. A usage record belongs to the
    item logged before it."""
    found: list[Message] = []
    for read in reads:
        header = read.header
        segment = str(header.get("segment_id", ""))
        history = header.get("history")
        if history is not None:  # a fresh start: earlier items are not in this history
            found = _header_messages(header, segment)
        for line in read.entries:
            kind = line["kind"]
            if kind in HISTORY_KINDS:  # nearly every line: test it first
                event = str(line.get("event") or "") if kind == "system_item" else None
                seq = line["seq"]
                found.append(Message(line["item"], str(line["ts"]), segment, seq, event=event))
            elif kind == "usage" and found:
                found[-1].usage = {k: line[k] for k in _USAGE_KEYS if k in line}
    return found


_USAGE_KEYS = ("model", "prompt_tokens", "completion_tokens", "cached_tokens", "estimated")


def _header_messages(header: Mapping[str, Any], segment: str) -> list[Message]:
    """A header's history, each item at the time it was first logged (its ``history_from``
    entry's, else the header's); a compaction's summary items marked (all of its history, for
    one written before ``summary_items``)."""
    history, ts = header.get("history") or (), str(header.get("ts", ""))
    summary = 0
    if (header.get("origin") or {}).get("kind") == "compaction":
        count = header.get("summary_items")
        summary = count if type(count) is int else len(history)
    sources = header.get("history_from")
    sources = sources if isinstance(sources, list) else []
    found = []
    for index, item in enumerate(history):
        source = sources[index] if index < len(sources) else None
        source = dict(source) if isinstance(source, Mapping) else None
        when = str(source.get("ts", ts)) if source else ts
        usage = (source or {}).get("usage")
        usage = dict(usage) if isinstance(usage, Mapping) else None
        found.append(Message(item, when, segment, 0, index, usage, source, index < summary))
    return found


def _fork_inside_header(store: Store, ref: SegmentRef, keep: int) -> SegmentId:
    """A segment continuing ``ref``'s header with the first ``keep`` items of its history."""
    reads = lineage(store, ref.session_id, ref.segment_id, stop_seq=0)
    state = collect_state([reads[0].header])  # its next seq is 1: the fork is at the header
    return _restart(store, state, "fork", state.history[:keep], None, None, messages(reads)[:keep])


def append_entries(
    store: Store,
    ref: SegmentRef,
    entries: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    expected_seq: int | None = None,
) -> list[LogEntry]:
    """Append several ``(kind, data)`` entries of any kinds in one atomic write.

    Strings over the store's ``blob_threshold`` go to blobs first (:mod:`terrarium.blobs`).
    Values are logged as msgspec encodes them: sets and tuples as arrays, bytes as base64
    text, NaN and infinities as null. Refusing those would take a walk of every entry's data:
    0.4 us for a short message, 1.3 us with a tool call, against 11.7 us for the whole append
    to a local folder (measured with ``timeit``), so it is left to the caller.

    Raises:
        InvalidEntry: a kind that is no string (or a header's), data that is no mapping or
            holds a value JSON has no form for, a lone surrogate, nesting too deep.
        ConflictError: the segment's next seq is not ``expected_seq``.
    """
    for kind, data in entries:
        if not isinstance(kind, str) or not kind or kind == EntryKind.HEADER:
            raise InvalidEntry(f"invalid entry kind {kind!r}")
        if type(data) is not dict and not isinstance(data, Mapping):
            raise InvalidEntry(
                f"entry data of kind {kind!r} must be a mapping (a JSON object), "
                f"not {type(data).__name__}"
            )
    ts = utc_now()
    drafts = [NewEntry(kind, ts, offload_data(store, kind, data)) for kind, data in entries]
    first = store.append(ref.session_id, ref.segment_id, drafts, expected_seq=expected_seq)
    return [LogEntry(first + i, d.kind, ts, d.data) for i, d in enumerate(drafts)]


def whole_entries(store: Store, written: Sequence[LogEntry]) -> list[LogEntry]:
    """``written`` (as :func:`append_entries` returns it: as stored) with the strings kept in
    blobs read back whole, as a restore gives them: what a live state folds in."""
    cache: dict[str, str] = {}
    return [
        msgspec.structs.replace(e, data=resolve_line(dict(e.data), store, "full", cache))
        if BLOBS_KEY in e.data
        else e
        for e in written
    ]


def append_entry(
    store: Store,
    ref: SegmentRef,
    kind: str,
    data: Mapping[str, Any],
    *,
    expected_seq: int | None = None,
) -> LogEntry:
    """Append one entry of any kind (including kinds this version does not know)."""
    return append_entries(store, ref, [(kind, data)], expected_seq=expected_seq)[0]


def classify_history_item(item: Item | Mapping[str, Any]) -> EntryKind:
    """The entry kind of a history item: ``user_input`` for role ``user``, else ``item``."""
    role = item.role if isinstance(item, Item) else item.get("role")
    return EntryKind.USER_INPUT if role == "user" else EntryKind.ITEM


def save_user_input(
    store: Store,
    ref: SegmentRef,
    content: str | Item | LoggedItem,
    *,
    expected_seq: int | None = None,
) -> LogEntry:
    """Log what the user said (a string or a user item)."""
    item = (
        {"role": "user", "content": content}
        if isinstance(content, str)
        else as_logged(materialize(content))
    )
    if item["role"] != "user":
        raise InvalidEntry(f"user input must have role 'user', not {item['role']!r}")
    return append_entry(store, ref, EntryKind.USER_INPUT, {"item": item}, expected_seq=expected_seq)


def save_delta(
    store: Store,
    ref: SegmentRef,
    items: Sequence[Item | LoggedItem],
    *,
    expected_seq: int | None = None,
) -> list[LogEntry]:
    """Log the history items a step added, in one atomic write."""
    logged = [as_logged(materialize(item)) for item in items]
    entries = [(classify_history_item(item).value, {"item": item}) for item in logged]
    return append_entries(store, ref, entries, expected_seq=expected_seq)


def append_system_item(
    store: Store, ref: SegmentRef, item: SystemItem, *, expected_seq: int | None = None
) -> LogEntry:
    """Log a runtime event and its rendering into history (a system message)."""
    data = {
        "event": item.event,
        "detail": dict(item.detail),
        "item": {"role": "system", "content": render_pod_event(item)},
    }
    return append_entry(store, ref, EntryKind.SYSTEM_ITEM, data, expected_seq=expected_seq)


def save_turn_end(store: Store, ref: SegmentRef, *, expected_seq: int | None = None) -> LogEntry:
    """Mark the end of a turn."""
    return append_entry(store, ref, EntryKind.TURN_END, {}, expected_seq=expected_seq)


def save_run_completed(
    store: Store,
    ref: SegmentRef,
    *,
    finish_reason: str | None = None,
    expected_seq: int | None = None,
) -> LogEntry:
    """Log that a model run finished normally."""
    data = {"finish_reason": finish_reason}
    return append_entry(store, ref, EntryKind.RUN_COMPLETED, data, expected_seq=expected_seq)


def save_run_errored(
    store: Store, ref: SegmentRef, error: str | BaseException, *, expected_seq: int | None = None
) -> LogEntry:
    """Log that a model run failed, with the reason."""
    data = (
        {"error": str(error) or type(error).__name__, "error_type": type(error).__name__}
        if isinstance(error, BaseException)
        else {"error": error, "error_type": None}
    )
    return append_entry(store, ref, EntryKind.RUN_ERRORED, data, expected_seq=expected_seq)


def save_usage(
    store: Store, ref: SegmentRef, usage: UsageRecord, *, expected_seq: int | None = None
) -> LogEntry:
    """Log the token usage of one model call."""
    return append_entry(store, ref, EntryKind.USAGE, usage.to_dict(), expected_seq=expected_seq)


_KEEP: Any = object()


def save_config_changed(
    store: Store,
    ref: SegmentRef,
    config: Mapping[str, Any],
    *,
    system_prompt: str | None = _KEEP,
    expected_seq: int | None = None,
) -> LogEntry:
    """Log a new runtime config (it replaces the old one), and optionally a new system prompt."""
    data: dict[str, Any] = {"config": dict(config)}
    if system_prompt is not _KEEP:
        data["system_prompt"] = system_prompt
    return append_entry(store, ref, EntryKind.CONFIG_CHANGED, data, expected_seq=expected_seq)


def save_extension(
    store: Store, ref: SegmentRef, domain: str, data: Any, *, expected_seq: int | None = None
) -> LogEntry:
    """Log extension data under ``domain``; restore keeps the latest value per domain."""
    if not isinstance(domain, str) or not domain:
        raise InvalidEntry(f"invalid extension domain {domain!r}")
    return append_entry(
        store, ref, EntryKind.EXTENSION, {"domain": domain, "data": data}, expected_seq=expected_seq
    )


def save_pod_scope(
    store: Store, ref: SegmentRef, snapshot: PodScopeSnapshot, *, expected_seq: int | None = None
) -> LogEntry:
    """Log a pod scope snapshot (an extension under ``POD_SCOPE_EXTENSION_DOMAIN``)."""
    return save_extension(
        store, ref, POD_SCOPE_EXTENSION_DOMAIN, snapshot.to_dict(), expected_seq=expected_seq
    )


def save_trace(store: Store, ref: SegmentRef, entries: Sequence[TraceEntry]) -> None:
    """Write raw stream events to the segment's debug trace."""
    store.append_trace(ref.session_id, ref.segment_id, entries)


def require_head(store: Store, context: ContextId | str) -> PodMetadata:
    """The context's head; raise :class:`ContextNotFound` (``no session 'cli:x'``) if none."""
    head = store.get_head(ContextId.parse(context))
    if head is None:
        raise ContextNotFound(f"no session '{context}'")
    return head


def restore(store: Store, context: ContextId | str, *, blobs: BlobMode = "full") -> RestoredState:
    """Replay the context's head segment (and the fork prefixes it continues).

    Large outputs kept in blobs come back whole (``blobs="full"``, the default), as
    :class:`~terrarium.blobs.LazyBlob` values that read the text when asked (``"lazy"``, for
    callers that page), or as the previews the log holds (``"stored"``).

    Raises:
        ContextNotFound: no such context.
        CorruptLog: a line in the middle of a log is not a valid entry (file and line named).
        FormatVersionError: a log was written by a newer terrarium.
    """
    head = require_head(store, context)
    return restore_by_segment(store, head.session_id, head.segment_id, blobs=blobs)


def lineage(
    store: Store,
    session_id: SessionId,
    segment_id: SegmentId,
    *,
    stop_seq: int | None = None,
    blobs: BlobMode = "full",
) -> list[SegmentRead]:
    """The reads that replaying a segment needs, oldest first, blobs resolved as ``blobs`` says.

    SegmentNotFound if there is no such segment; CorruptLog if one it continues is lost.
    """
    reads: list[SegmentRead] = []
    current, stop = segment_id, stop_seq
    while True:
        try:
            read = store.read_segment(session_id, current, stop_seq=stop)
        except SegmentNotFound as exc:
            if reads and holds_session(store, session_id):  # a file lost, not a session purged
                child = reads[-1].header.get("segment_id")
                raise CorruptLog(
                    f"segment {child} continues a segment that is lost: {exc}"
                ) from None
            raise
        reads.append(read)
        origin = read.header.get("origin") or {}
        if origin.get("kind") != "fork" or read.header.get("history") is not None:
            break
        current, stop = SegmentId(origin["parent"]), origin["at_seq"]
    reads.reverse()
    if blobs == "stored":
        return reads
    cache: dict[str, str] = {}
    return [
        SegmentRead(
            resolve_line(read.header, store, blobs, cache),
            resolve_lines(read.entries, store, blobs, cache),
            read.next_seq,
            read.torn,
        )
        for read in reads
    ]


def holds_session(store: Store, session_id: SessionId) -> bool:
    """Whether ``store`` holds the session: lists its segments (it may be purged meanwhile)."""
    try:
        store.list_segments(session_id)
    except SegmentNotFound:
        return False
    return True


K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")


def readable(
    chosen: Mapping[K, V], damaged: list[tuple[str, str]], make: Callable[[K, V], T]
) -> dict[K, T]:
    """``make(key, value)`` of each of ``chosen`` (a context and its store, say); one whose log
    is damaged (CorruptLog) is noted in ``damaged`` with its problem and left out, so that it
    stops none of the others."""
    made: dict[K, T] = {}
    for key, value in chosen.items():
        try:
            made[key] = make(key, value)
        except CorruptLog as exc:
            damaged.append((str(key), str(exc)))
    return made


def lines_of(reads: Iterable[SegmentRead]) -> list[dict[str, Any]]:
    """The lines of ``reads`` in replay order: each segment's header, then its entries."""
    return [line for read in reads for line in (read.header, *read.entries)]


def replay(reads: Iterable[SegmentRead]) -> RestoredState:
    """The state ``reads`` (oldest first) fold into: :func:`collect_state` of their lines,
    chained rather than copied into one list (8-10 ms of a 100k restore)."""
    return collect_state(
        chain.from_iterable(part for read in reads for part in ([read.header], read.entries))
    )


def tree_reads(
    store: Store, session_id: SessionId
) -> list[tuple[SegmentId, SegmentRead | None, SegmentId | None]]:
    """Every segment of the session, oldest first: its header's read (``stop_seq=0``; None for
    a damaged one that ``fsck --repair --salvage`` replaced) and the segment salvaging it.
    CorruptLog for a damaged segment that no salvage replaced."""
    reads: dict[SegmentId, SegmentRead] = {}
    damaged: dict[SegmentId, CorruptLog] = {}
    order = store.list_segments(session_id)
    for segment_id in order:
        try:
            reads[segment_id] = store.read_segment(session_id, segment_id, stop_seq=0)
        except CorruptLog as exc:
            damaged[segment_id] = exc
    salvaged = {
        str(read.header.get("salvaged_from")): segment_id for segment_id, read in reads.items()
    }
    for segment_id, error in damaged.items():
        if str(segment_id) not in salvaged:
            raise error
    return [(s, reads.get(s), salvaged.get(str(s))) for s in order]


def restore_by_segment(
    store: Store,
    session_id: SessionId,
    segment_id: SegmentId,
    *,
    stop_seq: int | None = None,
    blobs: BlobMode = "full",
) -> RestoredState:
    """Replay one segment (up to ``stop_seq`` if given); ``blobs`` as in :func:`restore`."""
    reads = lineage(store, session_id, segment_id, stop_seq=stop_seq, blobs=blobs)
    state = replay(reads)
    state.torn = [read.torn for read in reads if read.torn is not None]
    return state


_KNOWN = frozenset(EntryKind)
_NO_USAGE = UsageTotals()
#: The model a usage record without one is counted under.
UNKNOWN_MODEL = "unknown"


def collect_state(entries: Iterable[LogEntry | Mapping[str, Any]]) -> RestoredState:
    """Fold entries (a header first, then its entries; fork lineages concatenated) into state.

    Raises:
        InvalidEntry: there is no entry, or the first is not a header.
    """
    given = iter(entries)
    head = next(given, None)
    if head is None:
        raise InvalidEntry("no header: nothing to restore")
    lines: Iterator[Mapping[str, Any]]
    if isinstance(head, LogEntry):  # converted only when given entries rather than lines
        first: Mapping[str, Any] = head.to_dict()
        lines = (e.to_dict() if isinstance(e, LogEntry) else e for e in given)
    else:
        first, lines = head, cast(Iterator[Mapping[str, Any]], given)
    if first["kind"] != "header":
        raise InvalidEntry("a segment must start with its header")
    return fold(_from_header(first), lines, first)


def fold(
    state: RestoredState, lines: Iterable[Mapping[str, Any]], last: Mapping[str, Any]
) -> RestoredState:
    """The replay rule: fold log lines into ``state``, in place unless a header starts the
    history afresh (then the state it starts is returned). ``last`` is the line folded last
    (the header, for a fresh state). Every view of a conversation goes through here."""
    history = state.history
    usage, turns, by_model = state.usage, state.turns, state.usage_by_model
    line: Mapping[str, Any] = last
    for line in lines:
        kind = line["kind"]
        if kind in HISTORY_KINDS:  # nearly every line: test it first
            history.append(line["item"])
        elif kind == "usage":
            usage = usage.add(line)
            model = str(line.get("model") or UNKNOWN_MODEL)
            by_model[model] = by_model.get(model, _NO_USAGE).add(line)
        elif kind == "turn_end":
            turns += 1
            state.end_run()
        elif kind == "run_completed":
            state.last_run = RunStatus("completed", line["seq"])
            state.end_run()
        elif kind == "run_errored":
            state.last_run = RunStatus("errored", line["seq"], line.get("error"))
            state.end_run(line)
        elif kind == "config_changed":
            state.config = dict(line.get("config") or {})
            if "system_prompt" in line:
                state.system_prompt = line["system_prompt"]
        elif kind == "extension":
            state.extensions[line["domain"]] = line.get("data")
        elif kind == "header":
            if line.get("history") is not None:  # a fresh start (not a fork continuing)
                state = _from_header(line)
                history = state.history
                usage, turns, by_model = state.usage, state.turns, state.usage_by_model
            else:
                _continue_fork(state, line)
        elif kind not in _KNOWN:
            state.unknown.append(dict(line))
    state.next_seq = line["seq"] + 1
    state.last_active = line["ts"]
    state.usage = usage
    state.turns = turns
    return state


def _continue_fork(state: RestoredState, header: Mapping[str, Any]) -> None:
    """A fork's header: the parent's prefix so far is its state; the ids are its own."""
    state.segment_id = SegmentId(header["segment_id"])
    state.origin = SegmentOrigin.from_dict(header.get("origin") or {"kind": "root"})
    state.created_at = header["ts"]
    if header.get("context"):
        state.context = header["context"]


def _carried(header: Mapping[str, Any]) -> tuple[UsageTotals, dict[str, UsageTotals]]:
    """The usage a header carries over (compaction, clear): in all and per model. A header
    written before ``usage_by_model`` has its totals under :data:`UNKNOWN_MODEL`."""
    usage = UsageTotals.from_dict(header.get("usage") or {})
    by_model = header.get("usage_by_model")
    if isinstance(by_model, Mapping):
        return usage, {str(m): UsageTotals.from_dict(u) for m, u in by_model.items()}
    return usage, ({UNKNOWN_MODEL: usage} if usage.calls else {})


def _from_header(line: Mapping[str, Any]) -> RestoredState:
    """The state a header that carries its history starts with."""
    usage, by_model = _carried(line)
    return RestoredState(
        session_id=SessionId(line["session_id"]),
        segment_id=SegmentId(line["segment_id"]),
        context=line.get("context"),
        origin=SegmentOrigin.from_dict(line.get("origin") or {"kind": "root"}),
        system_prompt=line.get("system_prompt"),
        config=dict(line.get("config") or {}),
        history=list(line.get("history") or ()),
        usage=usage,
        extensions=dict(line.get("extensions") or {}),
        last_run=None,
        next_seq=1,
        created_at=line["ts"],
        last_active=line["ts"],
        turns=line.get("turns", 0),
        usage_by_model=by_model,
    )


def read_entries(store: Store, ref: SegmentRef, *, stop_seq: int | None = None) -> list[LogEntry]:
    """The segment's own lines (header first) as :class:`LogEntry` values."""
    read = store.read_segment(ref.session_id, ref.segment_id, stop_seq=stop_seq)
    return [LogEntry.from_dict(line) for line in [read.header, *read.entries]]
