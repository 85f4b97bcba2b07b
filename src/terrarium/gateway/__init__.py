"""``terrarium gateway``: an OpenAI-compatible server in front of the model server that keeps
every conversation in a terrarium store (see docs/gateway.md).

The Responses API (stored responses are points in a context's session tree: continuing from
the newest appends, from an older one forks), the Conversations API (a conversation is a
context), and Chat Completions passed through, recorded when the request names a session.
Presentation only: it writes through :mod:`terrarium.sessions` and reads the store through
its protocol, like the dashboard. Needs the ``web`` extra (Starlette, uvicorn)::

    from terrarium.gateway import create_app
    app = create_app(open_store("./sessions"), "http://localhost:8000/v1")
"""

from __future__ import annotations

from terrarium.gateway.app import create_app
from terrarium.gateway.upstream import GatewayError, Upstream

__all__ = ["GatewayError", "Upstream", "create_app"]
