"""The statistics dashboard (``terrarium serve``): a local web app over any store.

Needs the ``web`` extra (``pip install 'terrarium-sessions[web]'``); docs/dashboard.md tells
what each module does.

Usage::

    from terrarium.stores.url import open_store
    from terrarium.web import ModelAccess, create_app

    store = open_store("./sessions", create=False)
    app = create_app(store)            # any ASGI server: uvicorn.run(app, port=8765)
    app = create_app(                  # with writes, compact included
        store,
        allow_writes=True,
        model=ModelAccess("http://localhost:8000/v1"),
        reopen=lambda: open_store("./sessions", create=False),
    )
"""

from __future__ import annotations

from terrarium.errors import install_hint

try:
    from terrarium.llm import ModelAccess
    from terrarium.web.app import create_app
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(
        f"the dashboard needs the 'web' extra: {install_hint('web')} ({exc})"
    ) from exc

__all__ = ["ModelAccess", "create_app"]
