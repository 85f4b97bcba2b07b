"""What every route of the gateway shares: the store's ledger and its one worker thread, the
upstream model server, the body limit (:class:`Core`; ``app.Gateway`` adds the Responses API).

Store calls run in one worker thread, in the order they are made (the store is synchronous;
one thread keeps the event loop free and this process's writes in order); model calls run on
the event loop and hold nothing, so a slow answer never holds another conversation up.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from terrarium import Store
from terrarium.gateway.http import MAX_BODY
from terrarium.gateway.ledger import Ledger
from terrarium.gateway.upstream import Upstream

T = TypeVar("T")


class Core:
    """The state the routes share: the ledger, its worker thread, the upstream."""

    def __init__(self, store: Store, upstream: Upstream, *, max_body: int = MAX_BODY) -> None:
        self.ledger = Ledger(store)
        self.upstream = upstream
        self.max_body = max_body
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="terrarium-gateway-store")

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call ``fn`` in the store's worker thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn`` in the store's worker thread without waiting for it."""
        self._pool.submit(fn, *args)

    async def close(self) -> None:
        """Finish the store calls under way, close the upstream client."""
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown)
        await self.upstream.close()
