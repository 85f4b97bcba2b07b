"""``MultiContextManager``: many isolated conversations over one OpenAI-compatible server.

Each context (``irc:#python``) is a session in the store, created by its first turn the model
answers. A turn appends the user input *before* the model is called, so a failed or cancelled
call never loses it; then the reply, its usage, ``run_completed`` and ``turn_end`` in one
atomic append. A failure, a cancellation or a stream closed early appends ``run_errored``
instead, synchronously, so no second cancellation can skip it. The failed input stays in the
history, marked failed, and is not sent again unless ``retry_with_context`` asks.

Turns on different contexts run at once (up to ``max_concurrency``). Turns on one context run
in arrival order: an ``asyncio.Lock`` per context and event loop, then the store's context lock
for the whole turn, across threads and processes. Every append names the seq it expects, so a
writer that bypasses the lock is detected and the state re-read, never overwritten.

The cache keeps up to ``cache_size`` contexts, each a ``PersistentSession`` holding the
messages it sends: a turn costs O(1) in history length, and turn n+1's messages start with
turn n's (vLLM's prefix cache). Before each turn the cached head and next seq are checked
against the store, so other processes' entries are seen. Eviction saves unsaved entries first.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from terrarium import contexts, legacy, sessions
from terrarium.agent import compaction
from terrarium.agent.session_manager import PersistentSession
from terrarium.errors import (
    ContextNotFound,
    LLMError,
    NothingToCompact,
    NothingToRetry,
)
from terrarium.index._query import SearchHit, SearchQuery
from terrarium.model import (
    ContextId,
    EntryKind,
    LoggedItem,
    RestoredState,
    TraceEntry,
    add_wire_message,
    check_text,
    item_role,
    item_text,
)
from terrarium.stores.base import PodMetadata, Store, context_lock, locked_head_and_tail
from terrarium.stores.url import open_store

log = logging.getLogger(__name__)

_Found = tuple[PodMetadata, int] | None
"""A context's head and tail as read under its lock (None: no such context)."""


class _Unread(enum.Enum):
    """The context's head and tail are not read yet."""

    UNREAD = enum.auto()


if TYPE_CHECKING:  # the openai client costs ~0.5 s to import; only annotations need it
    from terrarium.lifecycle import BackgroundMaintenance, Maintenance
    from terrarium.llm.vllm_client import ChatResult, VLLMClient

COMPACTION_PROMPT = (
    "Summarise the conversation so far for your own later use: the facts, decisions, open "
    "questions and the user's preferences. Be complete but concise. Reply with the summary only."
)


_LoopLocks = weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[ContextId, asyncio.Lock]]
"""Each event loop's lock per context (an asyncio lock serves one loop)."""
_LoopSemaphores = weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]
"""Each event loop's semaphore bounding its model calls in flight."""


class MultiContextManager:
    """Serve many conversations ("contexts") from one model client, each kept in the store."""

    def __init__(
        self,
        client: VLLMClient,
        storage_dir: str | Path = "./sessions",
        *,
        store: Store | None = None,
        cache_size: int = 10,
        max_concurrency: int = 64,
        autosave: bool = True,
        token_budget: int | None = None,
        keep_after_compaction: int = 4,
        trace: bool = False,
        default_system_prompt: str | None = None,
        maintain: bool | Maintenance = False,
    ) -> None:
        """Create a manager.

        Args:
            client: the model client.
            storage_dir: a directory (the filesystem store) or a store URL; ignored given ``store``.
            store: an already opened store to use instead.
            cache_size: restored contexts kept in memory (least recently used evicted).
            max_concurrency: model calls in flight at once across contexts.
            autosave: save each turn as it happens (default); see :meth:`set_autosave`.
            token_budget: compact a context before a turn whose estimated prompt (characters / 4)
                would pass this many tokens. None: never.
            keep_after_compaction: recent messages kept verbatim after a compaction summary.
            trace: write raw stream events to each segment's debug trace.
            default_system_prompt: system prompt for new contexts when a call gives none.
            maintain: apply the store's retention policy (:mod:`terrarium.lifecycle`) in a
                background thread, at most once a day across processes; a
                :class:`~terrarium.lifecycle.Maintenance` chooses the policy.
        """
        if cache_size < 1:
            raise ValueError("cache_size must be at least 1")
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self.client = client
        self.store: Store = store if store is not None else open_store(storage_dir)
        self._owns_store = store is None
        self.cache_size = cache_size
        self.max_concurrency = max_concurrency
        self.autosave = autosave
        self.token_budget = token_budget
        self.keep_after_compaction = keep_after_compaction
        self.trace = trace
        self.default_system_prompt = default_system_prompt
        self._init_turn_state()
        if trace:
            self._hook_client_trace()
        self._maintenance = _start_maintenance(self.store, maintain)

    def _init_turn_state(self) -> None:
        """The cache, locks and per-turn buffers that concurrent turns share."""
        self._cache: OrderedDict[ContextId, PersistentSession] = OrderedDict()
        self._cache_lock = threading.RLock()
        self._autosave_overrides: dict[ContextId, bool] = {}
        self._busy: dict[ContextId, int] = {}
        """Turns under way or waiting, per context: the cache does not evict those."""
        self._loop_locks: _LoopLocks = weakref.WeakKeyDictionary()
        self._semaphores: _LoopSemaphores = weakref.WeakKeyDictionary()
        self._lock_pool = ThreadPoolExecutor(
            max_workers=self.max_concurrency, thread_name_prefix="terrarium-lock"
        )
        self._trace_sink: contextvars.ContextVar[list[TraceEntry] | None] = contextvars.ContextVar(
            "terrarium_trace_sink", default=None
        )

    def __repr__(self) -> str:
        return f"MultiContextManager({self.client!r}, store={self.store!r})"

    def _hook_client_trace(self) -> None:
        """Route the client's trace entries to the turn that made them (a context variable)."""
        previous = self.client.on_trace

        def sink(entry: TraceEntry) -> None:
            buffer = self._trace_sink.get()
            if buffer is not None:
                buffer.append(entry)
            if previous is not None:
                previous(entry)

        self.client.on_trace = sink

    # ------------------------------------------------------------------ the seed's API

    async def process_with_context(
        self,
        context_id: str,
        user_message: str,
        system_prompt: str | None = None,
        **params: Any,
    ) -> str:
        """Send ``user_message`` in ``context_id`` and return the reply text (auto-saved).

        ``params`` go to the model. A first turn that fails with no reply leaves no context.

        Raises:
            InvalidContextId: ``context_id`` is not ``type:name``.
            LLMError: the model call failed; the input is logged, marked failed, and later turns
                do not send it (:meth:`retry_with_context` does).
        """
        turn = self._turn(context_id, user_message, system_prompt, False, params)
        return "".join([delta async for delta in turn])

    def failed_input(self, context_id: str) -> str | None:
        """The last turn's user texts if it failed, else None (ContextNotFound: no context)."""
        context = ContextId.parse(context_id)
        with context_lock(self.store, context):
            state = self._existing(context).state
            items = [state.history[i] for i in _last_failed(state)]
        texts = [item_text(item) for item in items if item_role(item) == "user"]
        return "\n\n".join(texts) if texts else None

    async def retry_with_context(
        self, context_id: str, system_prompt: str | None = None, **params: Any
    ) -> str:
        """Send the failed last turn's input again, logged as a new turn, and return the reply.

        Raises:
            ContextNotFound: no such context in the log.
            NothingToRetry: the context's last turn did not fail.
            LLMError: the model call failed again (logged as any failed turn is).
        """
        text = self.failed_input(context_id)
        if text is None:
            raise NothingToRetry(f"nothing to retry in {context_id}: its last turn did not fail")
        return await self.process_with_context(context_id, text, system_prompt, **params)

    async def stream_with_context(
        self,
        context_id: str,
        user_message: str,
        system_prompt: str | None = None,
        **params: Any,
    ) -> AsyncIterator[str]:
        """Like :meth:`process_with_context`, yielding the reply's text as it arrives.

        Stopping early (``break``, then closing this iterator) logs the run as errored.
        """
        turn = self._turn(context_id, user_message, system_prompt, True, params)
        async with aclosing(turn):  # closing this closes the turn now, not when it is collected
            async for delta in turn:
                yield delta

    def list_all_contexts(self) -> dict[str, list[dict[str, Any]]]:
        """Every context grouped by type: ``{"cli": [{"session_id": "main", ...}], ...}``.

        ``session_id`` is the context's name, as in the Terrarium format. Legacy JSON files beside a
        filesystem store are listed too (``"legacy": True``) unless the log has their context.
        ``problem`` says why some of a context's log cannot be read (rows:
        :func:`terrarium.contexts.list_contexts`).
        """
        listing = contexts.list_contexts(self.store, restore=self._peek)
        with self._cache_lock:
            unsaved = {str(c): e.state for c, e in self._cache.items() if e.unsaved_entries}
        out: dict[str, list[dict[str, Any]]] = {}
        for row in listing.rows:
            count, last_active = row.message_count, row.last_active
            if row.context in unsaved:  # entries not saved yet are newer than any index
                state = unsaved[row.context]
                count, last_active = len(state.history), state.last_active
            out.setdefault(row.type, []).append(
                {
                    "session_id": row.name,
                    "context_id": row.context,
                    "date": row.date,
                    "message_count": count,
                    "created_at": row.created_at,
                    "last_active": last_active,
                    "legacy": row.legacy_path is not None,
                    "problem": row.problem,
                }
            )
        if unsaved:
            for items in out.values():
                items.sort(key=lambda i: i["last_active"], reverse=True)
        return out

    def get_stats(self, context_id: str) -> dict[str, Any]:
        """Statistics of one context (a legacy JSON file's read without importing it).

        Raises:
            ContextNotFound: no such context.
            LegacyFormatError, OSError: only a legacy file holds it, and it cannot be read.
        """
        context = ContextId.parse(context_id)
        cached = self._cached(context)
        data = contexts.get_stats(self.store, context, state=cached.state if cached else None)
        return data | {
            "cached": cached is not None,
            "autosave": self._autosave_for(context),
            "unsaved_entries": cached.unsaved_entries if cached is not None else 0,
        }

    def clear_context(self, context_id: str) -> None:
        """Empty the context's history (kept in its session tree); a legacy file imported first."""
        context = ContextId.parse(context_id)
        contexts.clear_context(self.store, context, current=self._saved_state)
        self._reload_cached(context)

    def rewind_context(self, context_id: str, n: int = 1) -> list[LoggedItem]:
        """Drop and return the last ``n`` history items, oldest first (:func:`sessions.rewind`).

        Raises:
            ContextNotFound: no such context.
            InvalidEntry: ``n`` is larger than the history (nothing changed).
        """
        context = ContextId.parse(context_id)
        dropped = contexts.rewind_context(self.store, context, n, current=self._saved_state)
        self._reload_cached(context)
        return dropped

    def delete_context(self, context_id: str) -> bool:
        """Delete the context (into the trash where the store has one); False if there was none.

        See :func:`terrarium.lifecycle.delete_context`. A legacy file goes to ``.trash/legacy/``.
        """
        from terrarium.lifecycle import delete_context  # the retention policy's module: lazily

        context = ContextId.parse(context_id)
        self._forget(context)
        return delete_context(self.store, context, why="MultiContextManager.delete_context")

    # ------------------------------------------------------------------ beyond the seed

    def fork_context(self, source: str, target: str, at: int | None = None) -> dict[str, Any]:
        """Create context ``target`` from ``source``'s history (up to entry ``at``); its stats."""
        src, dst = ContextId.parse(source), ContextId.parse(target)
        contexts.fork_context(self.store, src, dst, at, current=self._saved_state)
        return self.get_stats(target)

    def _saved_state(self, context: ContextId) -> RestoredState | None:
        """The context's state with its queued entries saved (the caller holds its lock)."""
        entry = self._fresh_or_legacy(context)
        if entry is None:
            return None
        entry._flush()
        return entry.state

    async def compact_context(
        self, context_id: str, *, only_if_smaller: bool = False, **params: Any
    ) -> str:
        """Ask the model to summarise the context, continue on a compacted segment; the summary.

        With ``only_if_smaller``, a summary that is not smaller raises :class:`NothingToCompact`.
        """
        context = ContextId.parse(context_id)
        async with self._turn_lock(context):
            return await self._compact(
                self._existing(context), params, refuse_growth=only_if_smaller
            )

    def get_session(self, context_id: str) -> PersistentSession:
        """The context's :class:`PersistentSession`: the cache entry the turns write through.

        Its ``add_message`` and ``save`` take the context's lock, so they wait for a turn under way:
        do not call them from the manager's event loop while one is. A new context's session is
        created by its first message; a legacy file is read in place until the first write. If the
        cache evicts it, the object keeps working alone.

        Raises:
            InvalidContextId: ``context_id`` is not ``type:name``.
            LegacyFormatError, OSError: only a legacy file holds it, and it cannot be read.
        """
        context = ContextId.parse(context_id)
        entry = self._fresh(context)
        if entry is None:
            entry = PersistentSession(
                self.store,
                context,
                system_prompt=self.default_system_prompt,
                autosave=self._autosave_for(context),
            )
            with self._cache_lock:
                cached = self._cache.get(context)  # a turn cached one meanwhile: theirs
            if cached is not None:
                return cached
            self._remember(entry)
        return entry

    def set_autosave(self, context_id: str, enabled: bool) -> None:
        """Turn auto-save on or off for one context; turning it on saves what is pending."""
        context = ContextId.parse(context_id)
        self._autosave_overrides[context] = enabled
        with self._cache_lock:
            entry = self._cache.get(context)
        if entry is not None:
            entry.autosave = enabled  # turning it on saves what is pending, under the lock

    def save(self, context_id: str | None = None) -> int:
        """Save unsaved entries of one context (or all); return how many were written."""
        wanted = ContextId.parse(context_id) if context_id is not None else None
        with self._cache_lock:
            entries = [e for c, e in self._cache.items() if wanted is None or c == wanted]
        return sum(entry.save() for entry in entries)

    def search(
        self,
        text: str,
        *,
        type: str | None = None,
        context: str | None = None,
        since: str | None = None,
        role: str | None = None,
        limit: int = 20,
    ) -> list[SearchHit]:
        """Search the text of every saved history item, best first.

        ``text`` is matched literally (quotes, ``*`` and SQL too); ``type``, ``context``, ``since``
        (UTC), ``role`` and ``limit`` narrow the hits.

        Raises:
            InvalidQuery: nothing to search for, or a filter that cannot be valid.
        """
        from terrarium.search import search

        return search(self.store, SearchQuery(text, type, context, since, role, limit))

    def history(self, context_id: str) -> list[LoggedItem]:
        """The context's history items (a copy), oldest first (a legacy file's, unimported)."""
        context = ContextId.parse(context_id)
        if self._cached(context) is None and self.store.get_head(context) is None:
            copy = legacy.read(self.store, context)
            if copy is not None:
                return list(sessions.restore(copy.store, context).history)
        return list(self._peek(context).history)

    def close(self) -> None:
        """Save what is pending, stop maintenance, and close a store the manager opened."""
        if self._maintenance is not None:
            self._maintenance.stop()
        self.save()
        self._lock_pool.shutdown(wait=False)
        if self._owns_store:
            self.store.close()

    async def aclose(self) -> None:
        """Close the manager and its model client."""
        self.close()
        await self.client.aclose()

    async def __aenter__(self) -> MultiContextManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ the turn

    async def _turn(
        self,
        context_id: str,
        user_message: str,
        system_prompt: str | None,
        stream: bool,
        params: dict[str, Any],
    ) -> AsyncGenerator[str, None]:
        context = ContextId.parse(context_id)
        if not isinstance(user_message, str):
            raise TypeError(f"user_message must be a string, not {type(user_message).__name__}")
        check_text(user_message, "user_message")  # before a new context is created for it
        contexts.check_new_name(self.store, context)  # before its lock file is made
        async with self._turn_lock(context, read=True) as found, self._semaphore():
            entry = self._open_context(context, system_prompt, found)
            new = entry._hold_new()  # a new context is created by its first reply only
            await self._log_input(entry, user_message)
            buffer: list[TraceEntry] | None = [] if self.trace else None
            token = self._trace_sink.set(buffer)
            result: ChatResult | None = None
            partial: list[str] = []
            try:
                try:
                    if stream:
                        async with aclosing(
                            self.client.stream(entry.chat_messages(), **params)
                        ) as events:
                            async for event in events:
                                if event.delta:
                                    partial.append(event.delta)
                                    yield event.delta
                                if event.result is not None:
                                    result = event.result
                    else:
                        result = await self.client.chat(entry.chat_messages(), **params)
                        yield result.text
                    if result is None:
                        raise LLMError("the model stream ended without a result")
                except BaseException as exc:  # cancellation and GeneratorExit included
                    _log_failure(entry, new, exc, partial)
                    raise
                entry._write(_reply_entries(result))
                if new:
                    entry._release()
            finally:
                self._trace_sink.reset(token)
                if buffer and entry.in_store:
                    sessions.save_trace(self.store, entry.ref, buffer)

    async def _log_input(self, entry: PersistentSession, text: str) -> None:
        """Log the input, compacting first past the token budget (even if the compaction fails)."""
        logged = (EntryKind.USER_INPUT, {"item": {"role": "user", "content": text}})
        try:
            if (
                self.token_budget is not None
                and entry.state.model_history  # an empty history has nothing to compact
                and self._estimate(entry, text) > self.token_budget
            ):
                await self._compact(entry, {})
        except BaseException as exc:
            entry = self._fresh(entry.context) or entry  # a flush before it may have moved on
            entry._write([logged, (EntryKind.RUN_ERRORED, _errored(exc, []))])
            raise
        entry._write([logged])

    def _open_context(
        self, context: ContextId, system_prompt: str | None, found: _Found
    ) -> PersistentSession:
        """The cached fresh context, or a new one (stored at its first reply); legacy imported.
        ``found``: its head and tail, read as its lock was taken."""
        entry = self._fresh_or_legacy(context, found)
        if entry is None:
            prompt = system_prompt if system_prompt is not None else self.default_system_prompt
            autosave = self._autosave_for(context)
            entry = PersistentSession._entry(self.store, context, autosave, None, prompt)
            self._remember(entry)
        if system_prompt is not None:
            entry._set_system_prompt(system_prompt)
        return entry

    async def _compact(
        self, entry: PersistentSession, params: Mapping[str, Any], refuse_growth: bool = False
    ) -> str:
        entry._flush()
        history = entry.state.model_history  # failed runs are not summarised or kept
        keep = _tail_from_user(history, self.keep_after_compaction)
        replaced = history[: len(history) - len(keep)]
        if refuse_growth:  # a requested compaction must shrink the context (agent/compaction.py)
            compaction.check_replaces(entry.context, replaced, len(keep))
        request = entry.chat_messages()
        add_wire_message(request, {"role": "user", "content": COMPACTION_PROMPT})
        result = await self.client.chat(request, **params)
        summary = result.text.strip()
        compacted: list[LoggedItem] = [
            {"role": "user", "content": f"[Summary of the conversation so far]\n{summary}"},
            {"role": "assistant", "content": "Understood. I will continue from this summary."},
            *keep,
        ]
        if refuse_growth:
            try:
                compaction.check_shrinks(entry.context, replaced, compacted[:2])
            except NothingToCompact:
                if result.usage is not None:  # the call was made: its tokens still count
                    entry._append([(EntryKind.USAGE, result.usage.to_dict())])
                raise
        # A failed last turn is still failed after, so a retry still finds it.
        after = _failed_run(entry.state)
        if result.usage is not None:
            after.append((EntryKind.USAGE, result.usage.to_dict()))
        sessions.create_compacted_segment(self.store, entry.state, compacted, context=entry.context)
        entry._reload()
        if after:  # read back, not folded in: the log holds a large text as a blob's preview
            sessions.append_entries(self.store, entry.ref, after)
            entry._reload()
        self._remember(entry)  # evicted during the model call? what the turn queues next is kept
        return summary

    def _estimate(self, entry: PersistentSession, message: str) -> int:
        system = len(entry.state.system_prompt or "")
        return (entry._chars + system + len(message)) // 4

    # ------------------------------------------------------------------ cache and locks

    def _fresh(
        self, context: ContextId, found: _Found | _Unread = _Unread.UNREAD
    ) -> PersistentSession | None:
        """The cached context brought up to the store, else restored; None if not in the log.
        ``found``: its head and tail if the caller just read them (under its lock)."""
        with self._cache_lock:
            entry = self._cache.get(context)
            if entry is not None:
                self._cache.move_to_end(context)
        if entry is not None:
            if entry._refresh() if found is _Unread.UNREAD else entry._refresh_to(found):
                return entry
            self._forget(context)  # deleted from under it
        if found is _Unread.UNREAD:
            head = self.store.get_head(context)
        else:
            head = found[0] if found is not None else None
        if head is None:
            return None
        entry = PersistentSession._entry(self.store, context, self._autosave_for(context), head)
        self._remember(entry)
        return entry

    def _fresh_or_legacy(
        self, context: ContextId, found: _Found | _Unread = _Unread.UNREAD
    ) -> PersistentSession | None:
        """:meth:`_fresh`, importing a legacy file first (once: the caller holds the lock)."""
        entry = self._fresh(context, found)
        if (entry is None or not entry.in_store) and legacy.import_legacy(self.store, context):
            entry = self._fresh(context)
        return entry

    def _existing(self, context: ContextId) -> PersistentSession:
        """:meth:`_fresh_or_legacy` of a context that must be in the log."""
        entry = self._fresh_or_legacy(context)
        if entry is None or not entry.in_store:
            raise ContextNotFound(f"context {context} does not exist")
        return entry

    def _cached(self, context: ContextId) -> PersistentSession | None:
        """The cached session of a context in the log (not one waiting for its first message)."""
        with self._cache_lock:
            entry = self._cache.get(context)
        return entry if entry is not None and entry.in_store else None

    def _reload_cached(self, context: ContextId) -> None:
        """Re-read a cached context: the object get_session handed out stays the context's."""
        entry = self._cached(context)
        if entry is not None:
            entry._reload()

    def _peek(self, context: ContextId) -> RestoredState:
        entry = self._cached(context)
        if entry is not None:
            return entry.state
        return sessions.restore(self.store, context)

    def _remember(self, entry: PersistentSession) -> None:
        with self._cache_lock:
            self._cache[entry.context] = entry
            self._cache.move_to_end(entry.context)
        self._trim()

    def _trim(self) -> None:
        """Evict the least recently used contexts past ``cache_size``, saving queued entries first.

        A context with a turn under way or waiting stays (saving takes the lock its turn holds); one
        whose save fails stays cached (logged), so its entries are not lost.
        """
        with self._cache_lock:
            excess = len(self._cache) - self.cache_size
            idle = [c for c in self._cache if c not in self._busy] if excess > 0 else []
            evicted = [self._cache.pop(context) for context in idle[:excess]]
        for old in evicted:
            if not old.unsaved_entries:
                continue
            try:
                old.save()  # eviction never loses data
            except Exception as exc:  # not the failure of the turn that evicts it
                log.warning("%s: unsaved entries kept in memory, not saved: %s", old.context, exc)
                with self._cache_lock:  # saved by a later eviction, save() or close()
                    if old.context not in self._cache:
                        self._cache[old.context] = old
                        self._cache.move_to_end(old.context, last=False)

    def _forget(self, context: ContextId) -> None:
        with self._cache_lock:
            self._cache.pop(context, None)

    def _autosave_for(self, context: ContextId) -> bool:
        return self._autosave_overrides.get(context, self.autosave)

    @asynccontextmanager
    async def _turn_lock(self, context: ContextId, *, read: bool = False) -> AsyncIterator[Any]:
        """FIFO within the event loop (an asyncio.Lock), then the store's lock taken off the loop.

        With ``read`` it gives the context's head and tail, read once the store's lock is held (in
        the same round trip where the store can). The context counts as busy (kept in the cache)
        from before the wait to the release.
        """
        locks = self._loop_locks.setdefault(asyncio.get_running_loop(), {})
        lock = locks.setdefault(context, asyncio.Lock())
        store_lock = (
            locked_head_and_tail(self.store, context) if read else context_lock(self.store, context)
        )

        def release(store_lock_held: bool) -> None:
            try:
                if store_lock_held:
                    store_lock.__exit__(None, None, None)
            finally:
                lock.release()
                self._leave_turn(context)

        def undo(job: asyncio.Future[Any]) -> None:
            release(not job.cancelled() and job.exception() is None)

        with self._cache_lock:
            self._busy[context] = self._busy.get(context, 0) + 1
        try:
            await lock.acquire()
        except BaseException:
            self._leave_turn(context)
            raise
        job = asyncio.get_running_loop().run_in_executor(self._lock_pool, store_lock.__enter__)
        try:
            found = await asyncio.shield(job)
        except BaseException:
            # Cancelled while the thread waits for the store lock: the thread goes on and may
            # still take it, so it is released once taken (else the context stays locked
            # for good and its next turn waits forever), and the loop's lock after it.
            if job.done():
                undo(job)
            else:
                job.add_done_callback(undo)
            raise
        try:
            yield found
        finally:
            release(True)

    def _leave_turn(self, context: ContextId) -> None:
        with self._cache_lock:
            left = self._busy.pop(context) - 1
            if left:
                self._busy[context] = left
        self._trim()

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        return self._semaphores.setdefault(loop, asyncio.Semaphore(self.max_concurrency))


def _log_failure(
    entry: PersistentSession, new: bool, exc: BaseException, partial: list[str]
) -> None:
    """Log a failed turn; a new context's first turn with no reply at all leaves nothing."""
    if new and not partial:
        entry._discard()
        return
    entry._write([(EntryKind.RUN_ERRORED, _errored(exc, partial))])
    if new:
        entry._release()


def _errored(exc: BaseException, partial: list[str]) -> dict[str, Any]:
    """The ``run_errored`` entry for a failure: its reason, its type, any partial reply text."""
    reason = exc if isinstance(exc, Exception) else "cancelled"
    data: dict[str, Any] = {
        "error": str(reason) or type(exc).__name__,
        "error_type": type(exc).__name__,
    }
    if partial:
        data["partial"] = "".join(partial)
    return data


def _last_failed(state: RestoredState) -> list[int]:
    """The history indices of the last run when it failed (nothing when it did not)."""
    last = len(state.history) - 1
    if last < 0 or last not in state.failed:
        return []
    errored = state.failed[last]
    first = last
    while first > 0 and state.failed.get(first - 1) is errored:
        first -= 1
    return list(range(first, last + 1))


def _failed_run(state: RestoredState) -> list[tuple[str, dict[str, Any]]]:
    """The last run's items and ``run_errored`` if it failed, to log again after a compaction."""
    indices = _last_failed(state)
    if not indices:
        return []
    entries: list[tuple[str, dict[str, Any]]] = [
        (sessions.classify_history_item(state.history[i]), {"item": state.history[i]})
        for i in indices
    ]
    errored = state.failed[indices[0]]
    data = {k: v for k, v in errored.items() if k not in ("v", "seq", "ts", "kind")}
    entries.append((EntryKind.RUN_ERRORED, data))
    return entries


def _reply_entries(result: ChatResult) -> list[tuple[str, dict[str, Any]]]:
    entries: list[tuple[str, dict[str, Any]]] = [(EntryKind.ITEM, {"item": result.message})]
    if result.usage is not None:
        entries.append((EntryKind.USAGE, result.usage.to_dict()))
    entries.append((EntryKind.RUN_COMPLETED, {"finish_reason": result.finish_reason}))
    entries.append((EntryKind.TURN_END, {}))
    return entries


def _tail_from_user(history: list[LoggedItem], keep: int) -> list[LoggedItem]:
    """The last ``keep`` or so items, starting at a user message so roles still alternate."""
    if keep <= 0:
        return []
    start = max(0, len(history) - keep)
    while start < len(history) and history[start].get("role") != "user":
        start += 1
    return list(history[start:])


__all__ = ["MultiContextManager"]


def _start_maintenance(store: Store, maintain: bool | Maintenance) -> BackgroundMaintenance | None:
    """The manager's background maintenance thread, started; None if it has none."""
    if maintain is False:
        return None
    from terrarium.lifecycle import BackgroundMaintenance, Maintenance
    from terrarium.stores.base import Lifecycle

    if not isinstance(store, Lifecycle):
        log.warning("maintain=True: %r cannot archive or trash; no maintenance", store)
        return None
    worker = BackgroundMaintenance(
        maintain if isinstance(maintain, Maintenance) else Maintenance(store)
    )
    worker.start()
    return worker
