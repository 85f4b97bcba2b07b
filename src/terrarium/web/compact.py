"""The dashboard's compaction: one run, reaching the model as a :class:`ModelAccess` says.

Nothing here contacts the model server until a compaction is asked for, so a dashboard whose
model is down still serves everything else. The run gets a store of its own (``reopen``): the
manager holds the context lock for the whole model call, and through the dashboard's lock it
would deadlock with a dashboard write to the same context waiting for that context lock.

Usage::

    access = ModelAccess("http://localhost:8000/v1")
    summary = compact(lambda: open_store("./sessions", create=False), access, context)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from terrarium.errors import LLMError
from terrarium.llm import ModelAccess
from terrarium.model import ContextId
from terrarium.stores.base import Store


def compact(reopen: Callable[[], Store], access: ModelAccess, context: ContextId) -> str:
    """Compact ``context`` on a store opened by ``reopen`` (closed after); returns the summary.

    Blocking: it runs its own event loop, so call it from a worker thread.

    Raises:
        NothingToCompact: the summary would not make the context smaller.
        ContextNotFound: no such context.
        LLMError: the model server could not be reached or failed; the message names its URL.
    """
    store = reopen()
    try:
        return asyncio.run(_compact(store, access, context))
    finally:
        store.close()


async def _compact(store: Store, access: ModelAccess, context: ContextId) -> str:
    # Imported here: the openai client costs ~0.5 s, and only a compaction needs it.
    from terrarium.agent.multi_context_manager import MultiContextManager

    client = access.client()
    manager = MultiContextManager(client, store=store)
    try:
        return await manager.compact_context(str(context), only_if_smaller=True)
    except LLMError as exc:
        if client.base_url in str(exc):
            raise
        # Some failures (a context too long for the model) name no server: the page must.
        raise type(exc)(f"{exc} (model server {client.base_url})") from exc
    finally:
        await manager.aclose()
