"""``TerrariumSession``: the OpenAI Agents SDK's ``Session`` over any terrarium store.

One SDK session is one context (``agents:{session_id}`` unless ``context=`` names another), so
``terrarium show agents:support-42`` prints it. Items are stored as given (docs/format.md §7a)
and given back equal. Against the SDK's ``SQLiteSession``: ``pop_item`` is
:func:`terrarium.sessions.rewind` and ``clear_session`` starts an empty segment, so nothing is
ever deleted; ``get_items`` replays the history (O(history), not O(limit)). Every method runs
the store in a worker thread; writes take the context's lock. Needs the ``openai-agents``
extra. Usage::

    with TerrariumSession("support-42", "sessions.db") as session:
        result = Runner.run_sync(agent, "Hello!", session=session)
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any, TypeVar, cast

from terrarium import codec, contexts, sessions
from terrarium.errors import InvalidEntry, install_hint
from terrarium.model import ContextId, LoggedItem, as_logged
from terrarium.stores.base import Store, context_lock
from terrarium.stores.url import StoreUser

try:
    from agents.items import TResponseInputItem
    from agents.memory.session_settings import (
        SessionSettings,
        coerce_session_settings,
        resolve_session_limit,
    )
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "terrarium.integrations.openai_agents needs the OpenAI Agents SDK: "
        + install_hint("openai-agents")
    ) from exc

__all__ = ["DEFAULT_CONTEXT_TYPE", "TerrariumSession"]

DEFAULT_CONTEXT_TYPE = "agents"
"""The context type of a session given no ``context=``: ``agents:{session_id}``."""

_T = TypeVar("_T")


class TerrariumSession(StoreUser):
    """An Agents SDK session kept in a terrarium context: ``Runner.run(..., session=...)``."""

    session_settings: SessionSettings | None
    """The SDK's session settings; ``limit`` is the default of :meth:`get_items`."""

    def __init__(
        self,
        session_id: str,
        store: Store | str | os.PathLike[str],
        *,
        context: ContextId | str | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        """Open the session.

        Args:
            session_id: The SDK's session id.
            store: A store object (left open), or a store path or URL (opened and closed here).
            context: The context that holds the items; ``agents:{session_id}`` by default.
            session_settings: The SDK's settings (``SessionSettings(limit=...)`` or a dict).

        Raises:
            InvalidContextId: the context id is not valid.
            StoreURLError: ``store`` is a malformed URL.
        """
        if not isinstance(session_id, str):
            raise TypeError(f"session_id must be a string, not {type(session_id).__name__}")
        self.session_id = session_id
        self.context = ContextId.parse(
            context if context is not None else f"{DEFAULT_CONTEXT_TYPE}:{session_id}"
        )
        self.session_settings = (
            SessionSettings()
            if session_settings is None
            else coerce_session_settings(session_settings)
        )
        self._use_store(store)
        self._closed = False

    def __repr__(self) -> str:
        return f"TerrariumSession({self.session_id!r}, context={str(self.context)!r})"

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The history, oldest first; the last ``limit`` items (default ``session_settings.limit``).

        0 gives none; a negative limit, or one past the length, every item (as the SDK's does).
        """
        limit = resolve_session_limit(limit, self.session_settings)
        items = await self._run(self._history)
        if limit is not None and limit >= 0:
            # items[-limit:], not items[len - limit:]: a limit past the length gives them all
            items = items[-limit:] if limit else []
        return cast("list[TResponseInputItem]", items)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` in one atomic write; InvalidEntry (nothing written) for a bad item."""
        self._check_open()
        if not items:
            return
        logged = [as_logged(cast("dict[str, Any]", item)) for item in items]
        for item in logged:
            codec.encode(item)  # refuse what cannot be stored before creating anything
        await self._run(lambda: self._append(logged))

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the latest item and return it; None when the session has no items.

        The context's head moves back one item (:func:`terrarium.sessions.rewind`): nothing
        is copied, and the popped item stays in the session tree.
        """
        return cast("TResponseInputItem | None", await self._run(self._pop))

    async def clear_session(self) -> None:
        """Empty the session; its old history stays in the context's session tree."""
        await self._run(self._clear)

    def close(self) -> None:
        """Close the store if this session opened it; the session is unusable afterwards."""
        if self._closed:
            return
        self._closed = True
        super().close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")

    async def _run(self, call: Callable[[], _T]) -> _T:
        self._check_open()
        return await asyncio.to_thread(call)

    def _history(self) -> list[LoggedItem]:
        if self.store.get_head(self.context) is None:
            return []
        return sessions.restore(self.store, self.context).history

    def _append(self, items: list[LoggedItem]) -> None:
        contexts.check_new_name(self.store, self.context)  # before its lock file is made
        with context_lock(self.store, self.context):
            head = self.store.get_head(self.context) or sessions.create_or_join(
                self.store, self.context
            )
            sessions.save_delta(self.store, head, items)

    def _pop(self) -> LoggedItem | None:
        if self.store.get_head(self.context) is None:
            return None
        try:
            dropped = sessions.rewind(self.store, self.context, 1)
        except InvalidEntry:
            if not self._history():  # an empty session, not a bad request
                return None
            raise
        return dropped[0]

    def _clear(self) -> None:
        with context_lock(self.store, self.context):
            if self.store.get_head(self.context) is None:
                return
            state = sessions.restore(self.store, self.context)
            if state.history:  # clearing an empty session starts no segment
                sessions.clear_segment(self.store, state, context=self.context)
