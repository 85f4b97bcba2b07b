"""The statistics dashboard (``terrarium serve``): a local web app over any store.

Needs the ``web`` extra (``pip install 'terrarium-sessions[web]'``). Modules: ``app`` (the ASGI app,
its routes, the token guard and CSP, writes), ``data`` (what the pages and the JSON API show,
from the contexts, sessions, search and export layers), ``render`` (safe Markdown, highlighted
code, the SVG chart), ``openapi`` (the API's document from the route table), ``compact`` (a
compaction through the model server, on a store of its own); templates and static files live
beside them.

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
    from terrarium.web.app import create_app
    from terrarium.web.compact import ModelAccess
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(
        f"the dashboard needs the 'web' extra: {install_hint('web')} ({exc})"
    ) from exc

__all__ = ["ModelAccess", "create_app"]
