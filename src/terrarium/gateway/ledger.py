"""What the gateway keeps, written through the sessions layer only (no storage logic).

Every conversation the gateway serves is an ordinary context: a thread of responses
(``resp:{token}``), a conversation (``conv:conv_...``), a Chat Completions session
(``chat:{name}``). A turn is one atomic append: its input items, its output items, its usage,
``run_completed`` (or ``run_errored`` under the failed-turn rule), ``turn_end`` and one
``extension`` entry under :data:`RESPONSE_DOMAIN` that records the response (its id, status,
parameters). That entry is the response's point in the session tree: the state at it is
``restore_by_segment(..., stop_seq=its seq)``. Continuing from a point at the tail of its
segment appends there; from an older point it forks there (``fork_at``, nothing copied).
Writers never lock: each append names the seq it expects (the log's compare-and-set) and a
writer that lost the race decides again, so many clients on one conversation keep its order.

Deleting a response appends a tombstone (:data:`DELETED_DOMAIN`) after it in its segment; the
response's items stay in the tree until the context itself is deleted. Two caches, both
safe because a point's state never changes (the log is append-only): the state at a point
(:class:`Snapshot`, the messages sent upstream), and per context the responses found in its
tree, rebuilt by one walk of the tree when an id is not in it (after a restart, or a write
by another process); a tombstone written by another process is looked for after the
response itself, unless it is its segment's tail.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec

from terrarium import PodActiveSegmentRef, Store, sessions
from terrarium.errors import ConflictError, ContextExists, ContextNotFound
from terrarium.gateway.responses import listed, message_item
from terrarium.model import (
    HISTORY_KINDS,
    ContextId,
    EntryKind,
    LoggedItem,
    SegmentId,
    SegmentStartState,
    SessionId,
    add_wire_message,
    wire_message,
    wire_messages,
)

RESPONSE_DOMAIN = "terrarium.gateway.response"
"""The extension entry that records a response: its point in the tree."""
DELETED_DOMAIN = "terrarium.gateway.deleted"
"""A tombstone: the response named in its data was deleted."""
CONVERSATION_DOMAIN = "terrarium.gateway.conversation"
"""A conversation's own record (creation time, metadata); the latest wins."""

Entries = list[tuple[str, dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Point:
    """A place in a context's session tree: the state after entry ``seq`` of a segment."""

    context: ContextId
    session_id: SessionId
    segment_id: SegmentId
    seq: int

    @property
    def ref(self) -> PodActiveSegmentRef:
        """The segment, as the sessions API takes it."""
        return PodActiveSegmentRef(self.session_id, self.segment_id)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The state at a point, as the gateway uses it."""

    messages: list[dict[str, Any]]
    """The Chat messages sent upstream for the model history (failed runs left out)."""
    wire: list[msgspec.Raw]
    """:attr:`messages` as JSON, each encoded once (:func:`encoded_messages`)."""
    items: list[LoggedItem]
    """The model history's items."""
    kept: Sequence[int]
    """For each of :attr:`items`, its index in the whole history (failed items included):
    a ``range`` while no item failed, so a long history costs no list of indices."""
    history_len: int
    """Items in the whole history."""
    extensions: dict[str, Any] = field(default_factory=dict)

    def extended(
        self, items: Sequence[LoggedItem], extensions: Mapping[str, Any] | None = None
    ) -> Snapshot:
        """The snapshot after a completed turn logged ``items`` (and ``extensions``)."""
        messages = list(self.messages)
        for item in items:
            add_wire_message(messages, item)
        start = self.history_len
        return Snapshot(
            messages,
            encoded_messages(messages, self),
            [*self.items, *items],
            range(start + len(items))
            if isinstance(self.kept, range)
            else [*self.kept, *range(start, start + len(items))],
            start + len(items),
            {**self.extensions, **extensions} if extensions else self.extensions,
        )


EMPTY = Snapshot([], [], [], range(0), 0)

_ENCODER = msgspec.json.Encoder()


def encoded_messages(messages: list[dict[str, Any]], base: Snapshot) -> list[msgspec.Raw]:
    """``messages`` as JSON, one ``msgspec.Raw`` each: ``base.messages`` with more added by
    ``model.add_wire_message``, so only the added ones and a replaced last one (a fold) are
    encoded; the rest are ``base.wire``'s. An upstream body that holds these is encoded
    without encoding the history again (at 1,000 messages: 0.12 ms, not 0.42)."""
    keep = min(len(base.messages), len(messages))
    if keep and messages[keep - 1] is not base.messages[keep - 1]:
        keep -= 1  # add_wire_message replaces the last message, never changes it in place
    return [*base.wire[:keep], *(msgspec.Raw(_ENCODER.encode(m)) for m in messages[keep:])]


class Found(NamedTuple):
    """A stored response as :meth:`Ledger.find` finds it."""

    point: Point
    record: dict[str, Any]
    head: SegmentId
    """The context's head segment, as read to find it."""


@dataclass(slots=True)
class _Index:
    """The responses found in one context's tree."""

    session_id: SessionId
    responses: dict[str, tuple[SegmentId, int, dict[str, Any]]]
    deleted: set[str]


def history_entries(items: Sequence[LoggedItem]) -> Entries:
    """The entries that log ``items`` as history."""
    return [(sessions.classify_history_item(item).value, {"item": item}) for item in items]


def turn_entries(
    inputs: Sequence[LoggedItem],
    outputs: Sequence[LoggedItem],
    *,
    usage: Mapping[str, Any] | None,
    finish: str | None,
    error: Mapping[str, Any] | None,
    record: Mapping[str, Any] | None,
) -> Entries:
    """The entries of one turn, in the order the chat loop writes them; with ``error`` the
    run is failed (``run_errored``), and its outputs are the partial reply, if any."""
    entries = history_entries(inputs)
    entries += [(EntryKind.ITEM.value, {"item": item}) for item in outputs]
    if usage is not None:
        entries.append((EntryKind.USAGE.value, dict(usage)))
    if error is not None:
        entries.append((EntryKind.RUN_ERRORED.value, dict(error)))
    else:
        entries.append((EntryKind.RUN_COMPLETED.value, {"finish_reason": finish}))
        entries.append((EntryKind.TURN_END.value, {}))
    if record is not None:
        data = {**record, "entries": len(entries)}
        entries.append((EntryKind.EXTENSION.value, {"domain": RESPONSE_DOMAIN, "data": data}))
    return entries


class Ledger:
    """The gateway's reads and writes over one store. Not thread-safe: the app calls it
    from one thread at a time (``gateway/core.py``)."""

    def __init__(self, store: Store, *, cache: int = 256) -> None:
        self.store = store
        self._snapshots: OrderedDict[tuple[SegmentId, int], Snapshot] = OrderedDict()
        self._indexes: OrderedDict[ContextId, _Index] = OrderedDict()
        self._cache = cache

    # ------------------------------------------------------------------ states

    def snapshot(self, point: Point) -> Snapshot:
        """The state at ``point``, from the cache or by replay."""
        key = (point.segment_id, point.seq)
        cached = self._snapshots.get(key)
        if cached is not None:
            self._snapshots.move_to_end(key)
            return cached
        state = sessions.restore_by_segment(
            self.store, point.session_id, point.segment_id, stop_seq=point.seq
        )
        items = state.model_history
        kept: Sequence[int] = (
            [i for i in range(len(state.history)) if i not in state.failed]
            if state.failed
            else range(len(items))
        )
        messages = wire_messages(None, items)
        snap = Snapshot(
            messages,
            encoded_messages(messages, EMPTY),
            list(items),
            kept,
            len(state.history),
            state.extensions,
        )
        self._remember(key, snap)
        return snap

    def _remember(self, key: tuple[SegmentId, int], snap: Snapshot) -> None:
        self._snapshots[key] = snap
        while len(self._snapshots) > self._cache:
            self._snapshots.popitem(last=False)

    def head(self, context: ContextId) -> Point | None:
        """The point at the tail of the context's head segment, or None with no context."""
        head = self.store.get_head(context)
        if head is None:
            return None
        seq = self.store.next_seq(head.session_id, head.segment_id) - 1
        return Point(context, head.session_id, head.segment_id, seq)

    # ------------------------------------------------------------------ responses

    def find(self, response_id: str, context: ContextId) -> Found | None:
        """The point and record of a stored, undeleted response, or None."""
        head = self.store.get_head(context)
        if head is None:
            return None
        index = self._indexes.get(context)
        if (
            index is None
            or index.session_id != head.session_id
            or (response_id not in index.responses and response_id not in index.deleted)
        ):
            index = self._walk(context, head.session_id)
        found = index.responses.get(response_id)
        if found is None or response_id in index.deleted:
            return None
        segment_id, seq, record = found
        point = Point(context, head.session_id, segment_id, seq)
        if self._deleted_since(point, response_id):
            index.deleted.add(response_id)
            return None
        return Found(point, record, head.segment_id)

    def _deleted_since(self, point: Point, response_id: str) -> bool:
        """Whether a tombstone follows the response in its segment (written by another
        process since this one looked). A response at its segment's tail has none: the
        common case, continuing the newest response, costs one ``next_seq``."""
        if self.store.next_seq(point.session_id, point.segment_id) == point.seq + 1:
            return False
        read = self.store.read_segment(point.session_id, point.segment_id)
        return any(
            e["seq"] > point.seq
            and e["kind"] == EntryKind.EXTENSION
            and e.get("domain") == DELETED_DOMAIN
            and (e.get("data") or {}).get("id") == response_id
            for e in read.entries
        )

    def _walk(self, context: ContextId, session_id: SessionId) -> _Index:
        """Find every response and tombstone in the context's tree."""
        index = _Index(session_id, {}, set())
        for segment_id in self.store.list_segments(session_id):
            for entry in self.store.read_segment(session_id, segment_id).entries:
                self._note(index, segment_id, entry)
        self._indexes[context] = index
        self._indexes.move_to_end(context)
        while len(self._indexes) > self._cache:
            self._indexes.popitem(last=False)
        return index

    @staticmethod
    def _note(index: _Index, segment_id: SegmentId, entry: Mapping[str, Any]) -> None:
        if entry.get("kind") != EntryKind.EXTENSION:
            return
        data = entry.get("data")
        if not isinstance(data, Mapping) or not isinstance(data.get("id"), str):
            return
        if entry.get("domain") == RESPONSE_DOMAIN:
            index.responses[data["id"]] = (segment_id, entry["seq"], dict(data))
        elif entry.get("domain") == DELETED_DOMAIN:
            index.deleted.add(data["id"])

    def response_items(
        self, point: Point, record: Mapping[str, Any]
    ) -> tuple[list[LoggedItem], list[LoggedItem]]:
        """A stored response's input items and output items. A failed stream's output is
        the text it sent before it failed (its ``run_errored`` entry's ``partial``), as an
        ``incomplete`` message under the id the stream gave it, as OpenAI returns it."""
        reads = sessions.lineage(self.store, point.session_id, point.segment_id, stop_seq=point.seq)
        first = point.seq - int(record.get("entries", 0))
        entries = [e for e in reads[-1].entries if first <= e["seq"] < point.seq]
        items = [e["item"] for e in entries if e["kind"] in HISTORY_KINDS]
        inputs = int(record.get("inputs", 0))
        partial = next((e.get("partial") for e in entries if e["kind"] == "run_errored"), None)
        if len(items) == inputs and isinstance(partial, str) and partial:
            items.append(message_item(partial, "incomplete", record.get("partial_id")))
        return items[:inputs], items[inputs:]

    def delete_response(self, response_id: str, context: ContextId) -> bool:
        """Tombstone a stored response; False when there is none (or it is deleted)."""
        found = self.find(response_id, context)
        if found is None:
            return False
        point = found.point
        data = {"domain": DELETED_DOMAIN, "data": {"id": response_id}}
        sessions.append_entries(self.store, point.ref, [(EntryKind.EXTENSION.value, data)])
        index = self._indexes.get(context)
        if index is not None:
            index.deleted.add(response_id)
        return True

    # ------------------------------------------------------------------ writing turns

    def start_thread(self, context: ContextId, entries: Entries) -> Point:
        """A new thread whose first turn is ``entries``."""
        session_id, segment_id = sessions.create_segment(
            self.store, SegmentStartState(), context=context
        )
        return self._append(Point(context, session_id, segment_id, 0), entries, 1, base=EMPTY)

    def continue_from(
        self,
        point: Point,
        entries: Entries,
        *,
        move_head: bool,
        base: Snapshot | None,
        head: SegmentId | None = None,
    ) -> Point:
        """Write a turn after ``point``: appended when nothing but tombstones follows it in
        its segment, else in a fork made there. With ``move_head`` the context's head moves
        to the segment written (a thread's head is its newest response); without it (a
        conversation's response continued outside the conversation) the turn never goes into
        the head's segment, so the conversation holds only what was sent to it.

        ``head`` is the head's segment as the caller read it this turn (:meth:`find`), or None
        to read it here. The head moves only from that segment: a writer that moved it since
        keeps it. The usual turn, after its segment's tail, is one append: the append's
        expected seq is the check that ``point`` is still the tail.
        """
        if head is None:
            read = self.store.get_head(point.context)
            head = read.segment_id if read is not None else None
        written = None
        if move_head or head != point.segment_id:
            try:
                written = self._append(point, entries, point.seq + 1, base=base, after=point.seq)
            except ConflictError:
                pass  # something follows it now: decide below
        if written is None:
            written = self._write_after(point, entries, move_head=move_head, base=base)
        if move_head and head is not None and head != written.segment_id:
            try:
                self.store.set_head(point.context, written.segment_id, expected=head)
            except ConflictError:
                pass  # another writer moved it to its own newer response meanwhile
        return written

    def _write_after(
        self, point: Point, entries: Entries, *, move_head: bool, base: Snapshot | None
    ) -> Point:
        """Append after ``point`` at its segment's tail, else in a fork made there."""
        while True:
            nxt = self.store.next_seq(point.session_id, point.segment_id)
            tail = nxt == point.seq + 1 or self._only_tombstones_after(point)
            if tail and not move_head:
                head = self.store.get_head(point.context)
                tail = head is None or head.segment_id != point.segment_id
            if tail:
                target, expected = point, nxt
            else:
                forked = sessions.fork_at(self.store, point.ref, point.seq)
                target, expected = Point(point.context, point.session_id, forked, 0), 1
            try:
                return self._append(target, entries, expected, base=base, after=point.seq)
            except ConflictError:
                continue  # another writer appended there first: decide again

    def _only_tombstones_after(self, point: Point) -> bool:
        read = self.store.read_segment(point.session_id, point.segment_id)
        return all(
            e["kind"] == EntryKind.EXTENSION and e.get("domain") == DELETED_DOMAIN
            for e in read.entries
            if e["seq"] > point.seq
        )

    def append_to_head(self, context: ContextId, entries: Entries) -> Point:
        """Append ``entries`` at the tail of the context's head, after whatever other writers
        appended meanwhile: a conversation's order."""
        while True:
            head = self.head(context)
            if head is None:
                raise ContextNotFound(f"context {context} does not exist")
            try:
                return self._append(head, entries, head.seq + 1, base=None, after=head.seq)
            except ConflictError:
                continue

    def _append(
        self,
        target: Point,
        entries: Entries,
        expected: int,
        *,
        base: Snapshot | None,
        after: int | None = None,
    ) -> Point:
        """Append at ``target``'s segment expecting seq ``expected``; note responses and the
        new point's snapshot (from ``base``, the state the entries follow, when known)."""
        logged = sessions.append_entries(self.store, target.ref, entries, expected_seq=expected)
        point = Point(target.context, target.session_id, target.segment_id, logged[-1].seq)
        index = self._indexes.get(target.context)
        if index is not None and index.session_id == target.session_id:
            for entry in logged:
                self._note(index, target.segment_id, entry.to_dict())
        failed = any(e.kind == EntryKind.RUN_ERRORED for e in logged)
        if base is None and after is not None and expected == after + 1:
            base = self._snapshots.get((target.segment_id, after))
        if base is not None and not failed:
            whole = sessions.whole_entries(self.store, logged)
            items = [dict(e.data)["item"] for e in whole if e.kind in HISTORY_KINDS]
            extensions = {
                e.data["domain"]: e.data.get("data")
                for e in logged
                if e.kind == EntryKind.EXTENSION
            }
            self._remember((point.segment_id, point.seq), base.extended(items, extensions))
        return point

    # ------------------------------------------------------------------ conversations

    def create_conversation(
        self, context: ContextId, record: Mapping[str, Any], items: Sequence[LoggedItem]
    ) -> Point:
        """A new conversation context holding its record and its first items."""
        sessions.create_segment(self.store, SegmentStartState(), context=context)
        entries: Entries = [
            (EntryKind.EXTENSION.value, {"domain": CONVERSATION_DOMAIN, "data": dict(record)})
        ]
        return self.append_to_head(context, entries + history_entries(items))

    def add_items(self, context: ContextId, items: Sequence[LoggedItem]) -> Point:
        """Append items to a conversation."""
        return self.append_to_head(context, history_entries(items))

    def conversation(self, context: ContextId) -> tuple[Point, Snapshot] | None:
        """The conversation's head and its state, or None when it does not exist."""
        head = self.head(context)
        if head is None:
            return None
        return head, self.snapshot(head)

    def set_conversation(self, context: ContextId, record: Mapping[str, Any]) -> None:
        """Replace the conversation's record (its metadata)."""
        data = {"domain": CONVERSATION_DOMAIN, "data": dict(record)}
        self.append_to_head(context, [(EntryKind.EXTENSION.value, data)])

    def delete_item(self, context: ContextId, item_id: str) -> bool:
        """Drop one item from the conversation; False when it holds none with that id.

        The last item goes by ``rewind`` (the head moves to a fork before it: nothing
        copied); another starts a segment holding the rest (the old one stays in the tree).
        """
        while True:
            head = self.head(context)
            if head is None:
                return False
            snap = self.snapshot(head)
            ids = [item.get("id") for item in listed(snap.items)]
            if item_id not in ids:
                return False
            where = ids.index(item_id)
            try:
                if snap.kept[where] == snap.history_len - 1:
                    sessions.rewind(self.store, context, 1, expected_seq=head.seq + 1)
                else:
                    rest = snap.items[:where] + snap.items[where + 1 :]
                    state = sessions.restore_by_segment(
                        self.store, head.session_id, head.segment_id, stop_seq=head.seq
                    )
                    sessions.create_compacted_segment(self.store, state, rest, context=context)
            except ConflictError:
                continue
            return True

    # ------------------------------------------------------------------ chat sessions

    def read_chat(self, context: ContextId) -> None:
        """Read a Chat Completions session's state before its model call, as the Responses
        API reads what it continues: a damaged log (CorruptLog) is refused before the model
        is asked, and :meth:`record_chat` finds the state cached."""
        head = self.head(context)
        if head is not None:
            self.snapshot(head)

    def record_chat(
        self, context: ContextId, messages: Sequence[Mapping[str, Any]], tail: Entries
    ) -> Point:
        """Record a Chat Completions turn of ``context``: the request's ``messages`` matched
        against the head's history; the new ones and ``tail`` (the reply, the run's end)
        appended; a request that diverges forks at the first message that differs."""
        while True:
            head = self.head(context)
            if head is None:
                try:
                    sessions.create_segment(self.store, SegmentStartState(), context=context)
                except ContextExists:
                    pass  # made by another request meanwhile
                continue
            snap = self.snapshot(head)
            same = _common_prefix(snap.items, messages)
            try:
                if same < len(snap.items):
                    dropped = snap.history_len - snap.kept[same]
                    sessions.rewind(self.store, context, dropped, expected_seq=head.seq + 1)
                    continue
                entries = history_entries([dict(m) for m in messages[same:]])
                return self._append(head, entries + tail, head.seq + 1, base=snap, after=head.seq)
            except ConflictError:
                continue


def _common_prefix(items: Sequence[LoggedItem], messages: Sequence[Mapping[str, Any]]) -> int:
    """How many leading messages are the stored items (compared as :func:`_key` says)."""
    same = 0
    for item, message in zip(items, messages, strict=False):
        if _key(item) != _key(message):
            break
        same += 1
    return same


def _key(item: Mapping[str, Any]) -> Any:
    """What a message is compared by: its wire form (``model.wire_message``), text content
    stripped and tool calls reduced to id, name and arguments, since chat UIs send back an
    answer trimmed, or its calls without their ``type``; a reply is not a new branch for it."""
    message = wire_message(item) or {}
    content = message.get("content")
    calls = tuple(
        (
            c.get("id"),
            (c.get("function") or {}).get("name"),
            (c.get("function") or {}).get("arguments"),
        )
        for c in message.get("tool_calls") or ()
        if isinstance(c, Mapping)
    )
    text = content.strip() if isinstance(content, str) else content
    return (
        message.get("role"),
        text or None,
        message.get("name"),
        message.get("tool_call_id"),
        calls,
    )


__all__ = [
    "CONVERSATION_DOMAIN",
    "DELETED_DOMAIN",
    "RESPONSE_DOMAIN",
    "Found",
    "Ledger",
    "Point",
    "Snapshot",
    "turn_entries",
]
