"""The statistics dashboard (``terrarium serve``): a local web app over any store.

Needs the ``web`` extra (``pip install 'terrarium[web]'``). Modules: ``app`` (the ASGI app,
its routes, the token guard and CSP, writes), ``data`` (what the pages and the JSON API show,
from the contexts, sessions, search and export layers), ``render`` (safe Markdown, highlighted
code, the SVG chart), ``openapi`` (the API's document from the route table); templates and
static files live beside them.

Usage::

    from terrarium.web import create_app
    app = create_app(store)            # any ASGI server: uvicorn.run(app, port=8765)
"""

from __future__ import annotations

try:
    from terrarium.web.app import create_app
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(
        f"the dashboard needs the 'web' extra: pip install 'terrarium[web]' ({exc})"
    ) from exc

__all__ = ["create_app"]
