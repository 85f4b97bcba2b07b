"""What every route of the gateway shares: the store's ledger and where its calls run, the
upstream model server, the body limit (:class:`Core`; ``app.Gateway`` adds the Responses API).

Store calls run one at a time, in the order they are made (the store is synchronous and the
ledger not thread-safe): in one worker thread, so that a slow call never stalls the other
requests, or on the event loop when the caller knows the store answers in microseconds
(``cli/gateway.py`` decides by the store it opened), which saves a thread's two hand-overs
per call. Model calls run on the event loop and hold nothing, so a slow answer never holds
another conversation up.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from terrarium import Store
from terrarium.gateway.http import MAX_BODY
from terrarium.gateway.ledger import Ledger
from terrarium.gateway.upstream import Upstream

T = TypeVar("T")
log = logging.getLogger("terrarium.gateway")


class Core:
    """The state the routes share: the ledger, where its calls run, the upstream."""

    def __init__(
        self,
        store: Store,
        upstream: Upstream,
        *,
        max_body: int = MAX_BODY,
        store_thread: bool = True,
    ) -> None:
        """``store_thread``: call the store in a worker thread (True), or on the event loop
        (False: only for a store whose every call takes microseconds)."""
        self.ledger = Ledger(store)
        self.upstream = upstream
        self.max_body = max_body
        self._pool = (
            ThreadPoolExecutor(1, thread_name_prefix="terrarium-gateway-store")
            if store_thread
            else None
        )

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call ``fn`` where store calls run, and wait for it."""
        if self._pool is None:
            return fn(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn`` where store calls run, without waiting for it (a cancelled task may
        await nothing): its failure is logged, as nobody is left to answer."""
        if self._pool is not None:
            self._pool.submit(_logged, fn, *args)
        else:
            _logged(fn, *args)

    async def close(self) -> None:
        """Finish the store calls under way, close the upstream client."""
        if self._pool is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown)
        await self.upstream.close()


def _logged(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("gateway: a store call nobody waited for failed")
