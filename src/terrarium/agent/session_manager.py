"""``PersistentSession``: one conversation (a context) kept in a store, as the seed names it.

Each message is one appended entry; :meth:`PersistentSession.to_dict` gives the seed's session
file. A new session, or a legacy JSON file read in place, reaches the log on its first write.
A ``MultiContextManager`` holds the context lock for a whole turn and calls the unlocked ``_``
methods. Usage::

    session = PersistentSession(store, "irc:#python", system_prompt="Be concise.")
    session.add_message("user", "What's a decorator?")
    session.to_dict()["metadata"]["message_count"]  # 1
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from terrarium import legacy, sessions
from terrarium.errors import ConflictError, ContextNotFound
from terrarium.formats import terrarium_json
from terrarium.formats.openai import chat_messages
from terrarium.model import (
    ContextId,
    EntryKind,
    LogEntry,
    LoggedItem,
    RestoredState,
    SegmentStartState,
    add_wire_message,
    check_text,
    item_text,
    utc_now,
)
from terrarium.stores.base import (
    PodActiveSegmentRef,
    PodMetadata,
    Store,
    context_lock,
    head_and_tail,
)
from terrarium.stores.memory import MemoryStore
from terrarium.stores.url import StoreUser

MESSAGE_ROLES = ("user", "assistant")
"""The roles :meth:`PersistentSession.add_message` takes (the seed's message roles)."""

_Entries = list[tuple[str, dict[str, Any]]]


class PersistentSession(StoreUser):
    """One context's conversation over a store: load or create, add messages, save.

    ``session_id`` is the context's *name* (``main`` in ``cli:main``), as in the seed's format.
    Public methods take the store's context lock and append with the seq they expect, so a
    writer that bypasses the lock is detected and the session re-read.
    """

    def __init__(
        self,
        store: Store | str | os.PathLike[str],
        context_id: str | ContextId,
        *,
        system_prompt: str | None = None,
        autosave: bool = True,
    ) -> None:
        """Resume ``context_id``, or start it anew (created by its first message).

        Args:
            store: an open store, or a store URL or folder (opened here, closed by :meth:`close`).
            context_id: ``type:name``, as ``irc:#python``.
            system_prompt: the system prompt of a *new* session; an existing one keeps its own.
            autosave: write each message at once (default); False queues them until :meth:`save`.

        Raises:
            InvalidContextId: ``context_id`` is not ``type:name``.
            LegacyFormatError, OSError: only a legacy file holds it, and it cannot be read.
        """
        self._open(store, context_id, autosave, system_prompt, create=True)

    @classmethod
    def load(
        cls,
        store: Store | str | os.PathLike[str],
        context_id: str | ContextId,
        *,
        autosave: bool = True,
    ) -> PersistentSession:
        """Resume an existing context (in the log, or a legacy file); ContextNotFound if none."""
        self = cls.__new__(cls)
        self._open(store, context_id, autosave, None, create=False)
        return self

    def _setup(
        self, store: Store | str | os.PathLike[str], context_id: str | ContextId, autosave: bool
    ) -> None:
        self.context = ContextId.parse(context_id)
        self._use_store(store)
        self._autosave = autosave
        self._lock = threading.RLock()
        self._pending: list[LogEntry] = []
        self._held = False  # writes queued until the first turn is answered (_hold_new)
        self._source: Store | None = None
        """Where an unsaved session's state lives until its first write: a legacy file's
        copy, or a scratch store holding a new session's header."""
        self._legacy_path: Path | None = None

    def _open(
        self,
        store: Store | str | os.PathLike[str],
        context_id: str | ContextId,
        autosave: bool,
        system_prompt: str | None,
        *,
        create: bool,
    ) -> None:
        """Load the context from the log, else from its legacy file; else start it anew
        (``create``) or raise ContextNotFound. A store opened here is closed on failure."""
        self._setup(store, context_id, autosave)
        try:
            head = self.store.get_head(self.context)
            copy = legacy.read(self.store, self.context) if head is None else None
            if head is not None:
                self._load(self.store, head)
            elif copy is not None:
                self._unsaved(copy.store)
                self._legacy_path = copy.path
            elif create:
                self._start(system_prompt)
            else:
                raise ContextNotFound(f"context {self.context} does not exist")
        except BaseException:
            self.close()  # a store opened here is not left open
            raise

    def _start(self, system_prompt: str | None) -> None:
        """A new session: its header in a scratch store until the first write creates it."""
        scratch = MemoryStore()
        sessions.create_segment(scratch, SegmentStartState(system_prompt), context=self.context)
        self._unsaved(scratch)

    def _unsaved(self, source: Store) -> None:
        head = source.get_head(self.context)
        assert head is not None
        self._load(source, head)
        self._source = source

    @classmethod
    def _entry(
        cls,
        store: Store,
        context: ContextId,
        autosave: bool,
        head: PodMetadata | None,
        system_prompt: str | None = None,
    ) -> PersistentSession:
        """The manager's cache entry: the state of ``head``, just read from the log, or (None) a
        new session not yet in the store (no legacy lookup, no store opened)."""
        self = cls.__new__(cls)
        self._setup(store, context, autosave)
        if head is None:
            self._start(system_prompt)
        else:
            self._load(store, head)
        return self

    def _reset(self, state: RestoredState) -> None:
        """Take ``state`` as the session's, with the messages it sends (failed runs left out)."""
        self.state = state
        self._wire = chat_messages(state)
        self._chars = sum(len(item_text(item)) for item in state.model_history)

    def _load(self, store: Store, head: PodMetadata) -> None:
        """Take the state of ``head``, a head of ``store``."""
        self._reset(sessions.restore_by_segment(store, head.session_id, head.segment_id))
        self._created = head.created_at
        self._date = head.date

    def __repr__(self) -> str:
        return f"PersistentSession({str(self.context)!r}, message_count={self.message_count})"

    @property
    def context_id(self) -> str:
        """The context id, ``type:name``."""
        return str(self.context)

    @property
    def session_id(self) -> str:
        """The context's name (``main`` in ``cli:main``): the seed's ``session_id``."""
        return self.context.name

    @property
    def context_type(self) -> str:
        """The context's type (``cli``, ``irc``, ``game``, ``web``, ...)."""
        return self.context.type

    @property
    def created_at(self) -> str:
        """Creation time in the seed's form (naive UTC); for an unsaved session, this object's."""
        return terrarium_json.to_legacy_ts(self._created)

    @property
    def last_active(self) -> str:
        """When the last entry was logged (or queued), in the seed's form."""
        return terrarium_json.to_legacy_ts(self.state.last_active)

    @property
    def session_date(self) -> str:
        """The creation date, ``YYYY-MM-DD`` (UTC): the date folder of the seed's layout."""
        return self._date

    @property
    def message_count(self) -> int:
        """Every history item, as ``get_stats`` counts (``metadata["message_count"]``: fewer)."""
        return len(self.state.history)

    @property
    def system_prompt(self) -> str | None:
        """The system prompt (None when there is none). Setting it logs a config change."""
        return self.state.system_prompt

    @system_prompt.setter
    def system_prompt(self, prompt: str | None) -> None:
        with self._guard():
            self._require_fresh()
            if not self._is_new:  # a new session's prompt goes into its header
                self._prepare()
            self._set_system_prompt(prompt)

    @property
    def autosave(self) -> bool:
        """Whether each write goes to the store at once. Turning it on saves what is pending."""
        return self._autosave

    @autosave.setter
    def autosave(self, enabled: bool) -> None:
        with self._guard():
            self._autosave = enabled
            if enabled:
                self._flush()

    @property
    def in_store(self) -> bool:
        """Whether the log holds the context (not before a first write or a legacy import)."""
        return self._source is None

    @property
    def legacy_path(self) -> Path | None:
        """The legacy JSON file this session is read from until its first write, if any."""
        return self._legacy_path if self._source is not None else None

    @property
    def unsaved_entries(self) -> int:
        """Entries queued by a session with auto-save off, not saved yet."""
        return len(self._pending)

    @property
    def history(self) -> list[LoggedItem]:
        """The history items (a copy), oldest first, as OpenAI chat messages."""
        return list(self.state.history)

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The seed's ``messages``, ``{"role", "content", "timestamp"}``, as :meth:`to_dict`."""
        return list(self.to_dict()["messages"])

    @property
    def metadata(self) -> dict[str, Any]:
        """The seed's ``metadata``, as :meth:`to_dict` has it."""
        return dict(self.to_dict()["metadata"])

    def chat_messages(self) -> list[dict[str, Any]]:
        """A copy of the messages a model call sends: system prompt, then history, users folded."""
        return list(self._wire)

    def to_dict(self) -> dict[str, Any]:
        """The seed's session file as ``export -f terrarium-json`` writes it, unsaved entries in."""
        with self._lock:
            self._require_fresh()
            source = self._source if self._source is not None else self.store
            return terrarium_json.export_dict(source, self.context, pending=self._pending)

    def add_message(self, role: str, content: str) -> dict[str, Any]:
        """Add a message: written at once (auto-save) or queued until :meth:`save`.

        Returns:
            The message as the seed writes it: ``{"role", "content", "timestamp"}``.

        Raises:
            ValueError: ``role`` is not ``user`` or ``assistant``, or the text is not valid Unicode.
            TypeError: ``content`` is not a string.
            ContextNotFound: the context was deleted from the store.
        """
        if role not in MESSAGE_ROLES:
            raise ValueError(f"role must be 'user' or 'assistant', not {role!r}")
        if not isinstance(content, str):
            raise TypeError(f"content must be a string, not {type(content).__name__}")
        check_text(content, "content")
        item: LoggedItem = {"role": role, "content": content}
        kind = sessions.classify_history_item(item)
        with self._guard():
            self._prepare()
            self._write([(kind, {"item": item})])
            ts = self.state.last_active
        return {"role": role, "content": content, "timestamp": terrarium_json.to_legacy_ts(ts)}

    def save(self) -> int:
        """Write the queued entries; how many. If another writer moved on, they go onto a fork."""
        with self._guard():
            return self._flush()

    def refresh(self) -> None:
        """See what other writers logged (re-read only when the store moved on); queue kept."""
        with self._lock:
            self._require_fresh()

    def close(self) -> None:
        """Save what is queued, and close the store if this session opened it."""
        try:
            if self._pending:
                self.save()
        finally:
            super().close()

    # The unlocked internals: the caller holds the context lock (the manager, for a whole turn).

    @property
    def ref(self) -> PodActiveSegmentRef:
        """The segment this session writes to."""
        return PodActiveSegmentRef(self.state.session_id, self.state.segment_id)

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """This object's thread lock, then the store's lock on the context."""
        with self._lock, context_lock(self.store, self.context):
            yield

    @property
    def _is_new(self) -> bool:
        """Not in the store, and not read from a legacy file: created by its first write."""
        return self._source is not None and self._legacy_path is None

    def _refresh(self) -> bool:
        """Bring the state up to the store; False when the context was deleted from under it."""
        # Unsaved work is newer than the store by definition: no read.
        return bool(self._pending) or self._refresh_to(head_and_tail(self.store, self.context))

    def _refresh_to(self, found: tuple[PodMetadata, int] | None) -> bool:
        """:meth:`_refresh` to ``found``, the context's head and tail just read (under its lock,
        see :func:`~terrarium.stores.base.locked_head_and_tail`)."""
        if self._pending:
            return True
        if found is None:
            return self._source is not None
        head, tail = found
        if (
            self._source is None
            and head.segment_id == self.state.segment_id
            and tail == self.state.next_seq
        ):
            return True
        self._load(self.store, head)
        self._source = None  # another writer created or imported it meanwhile
        return True

    def _require_fresh(self) -> None:
        if not self._refresh():
            raise ContextNotFound(f"context {self.context} was deleted")

    def _prepare(self) -> None:
        """Before a write: fresh state, and (auto-save on) the context in the store."""
        self._require_fresh()
        if self._source is not None and self._autosave:
            self._materialise()

    def _materialise(self) -> None:
        """Put an unsaved session into the store (import its legacy file, or create it)."""
        if not self._is_new:
            legacy.import_legacy(self.store, self.context)
        else:
            self._create(join=True)
        self._reload()
        self._source = None
        pending, self._pending = self._pending, []
        for entry in pending:
            self._queue(entry.kind, entry.data, entry.ts)

    def _create(self, *, join: bool = False) -> None:
        """Create the context as a new session of this one's ids, prompt and config (``join``:
        if another writer created it first, continue theirs)."""
        start = SegmentStartState(self.state.system_prompt, self.state.config)
        ids = (self.state.session_id, self.state.segment_id)
        if join:
            sessions.create_or_join(self.store, self.context, start, ids=ids)
        else:
            sessions.create_segment_with_ids(self.store, *ids, start, context=self.context)

    def _reload(self) -> None:
        head = self.store.get_head(self.context)
        if head is None:
            raise ContextNotFound(f"context {self.context} was deleted")
        self._load(self.store, head)

    def _hold_new(self) -> bool:
        """Queue a new session's writes until :meth:`_release`; False if stored or queued."""
        if not self._is_new or self._pending:
            return False
        self._held = True
        return True

    def _release(self) -> None:
        """Stop holding: create the context and write what was held (queued if auto-save is off)."""
        self._held = False
        if self._autosave:
            self._flush()
        elif self._source is not None:
            self._materialise()

    def _discard(self) -> None:
        """Drop what was held: the session is new again, nothing of it in the store."""
        self._held = False
        self._pending = []
        self._start(self.state.system_prompt)

    def _write(self, entries: _Entries) -> None:
        """Append entries (or queue them: auto-save off, or a held first turn) and fold them in."""
        if not self._autosave or self._held:
            ts = utc_now()
            for kind, data in entries:
                self._queue(kind, data, ts)
            return
        self._append(entries)

    def _queue(self, kind: str, data: Mapping[str, Any], ts: str) -> None:
        self._pending.append(LogEntry(self.state.next_seq, kind, ts, data))
        self._apply(kind, data, self.state.next_seq, ts)

    def _append(self, entries: _Entries) -> None:
        try:
            written = sessions.append_entries(
                self.store, self.ref, entries, expected_seq=self.state.next_seq
            )
        except ConflictError:
            # Someone wrote without the context lock: re-read, then append after them.
            self._reload()
            written = sessions.append_entries(
                self.store, self.ref, entries, expected_seq=self.state.next_seq
            )
        for log_entry in sessions.whole_entries(self.store, written):
            self._apply(log_entry.kind, log_entry.data, log_entry.seq, log_entry.ts)

    def _flush(self) -> int:
        """Save queued entries; fork if the stored segment moved on meanwhile."""
        if not self._pending:
            return 0
        if self._source is not None:  # new, or a legacy file: into the store first
            self._materialise()
        entries = [(entry.kind, dict(entry.data)) for entry in self._pending]
        saved_seq = self._pending[0].seq
        head = self.store.get_head(self.context)
        if head is None:  # deleted meanwhile: saved into a new session of the same ids
            self._create()
            saved_seq = 1
        segment = sessions.ensure_head_or_fork(self.store, self.context, self.ref, saved_seq)
        ref = PodActiveSegmentRef(self.state.session_id, segment)
        written = sessions.append_entries(self.store, ref, entries)
        self._pending = []  # only once written: a failed save keeps them queued
        if head is not None and segment == self.state.segment_id:
            self.state.next_seq = written[-1].seq + 1
            self.state.last_active = written[-1].ts
        else:
            self._reload()  # onto a fork, or a new session: its state is the store's
        return len(entries)

    def _set_system_prompt(self, prompt: str | None) -> None:
        if prompt == self.state.system_prompt:
            return
        if self._is_new and not self._pending:
            self.state.system_prompt = prompt  # a new session: its header will hold it
            self._wire = chat_messages(self.state)
            return
        self._write(
            [(EntryKind.CONFIG_CHANGED, {"config": self.state.config, "system_prompt": prompt})]
        )

    def _apply(self, kind: str, data: Mapping[str, Any], seq: int, ts: str) -> None:
        """Fold one written entry into the state (:func:`sessions.fold`) and the sent messages."""
        state = self.state
        items, failed, prompt = len(state.history), len(state.failed), state.system_prompt
        sessions.fold(state, [{**data, "kind": kind, "seq": seq, "ts": ts}], {})
        if len(state.failed) != failed or state.system_prompt != prompt:
            self._reset(state)  # a failed run's items leave the messages; a new system one
            return
        for item in state.history[items:]:
            add_wire_message(self._wire, item)
            self._chars += len(item_text(item))


__all__ = ["MESSAGE_ROLES", "PersistentSession"]
