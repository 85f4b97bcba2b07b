"""``terrarium serve``: the statistics dashboard over a store (see docs/dashboard.md).

Loaded lazily: it imports Starlette, uvicorn and Jinja2. The store must exist. The socket is
bound before the URL is printed: a port in use is one line and exit 1, and ``--port 0`` prints
the port it got. No model server is contacted at start.
"""

from __future__ import annotations

import errno
import functools
import secrets
import socket
import threading
import webbrowser
from typing import Any

import click

from terrarium.cli.app import (
    cli,
    flag,
    model_options,
    open_store,
    state_of,
    storage_option,
)
from terrarium.errors import install_hint
from terrarium.guard import is_loopback
from terrarium.llm import ModelAccess


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port``; a ClickException of one line if it cannot."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose
    # protocol says TCP, and accepted sockets carry the listener's. With 0, every answer
    # written in two pieces (headers, body) waited 40 ms for the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        # As uvicorn: a restart may bind while the last run's connections are in TIME_WAIT
        # (Linux still refuses a port another socket listens on).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if exc.errno == errno.EADDRINUSE:
            reason = "the port is in use (stop what listens there, or pick another with --port)"
        else:
            reason = exc.strerror or str(exc)
        raise click.ClickException(f"cannot listen on {where}: {reason}") from None
    return sock


KEEP_ALIVE = 75
"""Seconds an idle connection is kept open. uvicorn's own 5 s equals the keep-alive expiry
of httpx (and so of the openai client): a client reusing a connection just under 5 s idle by
its clock sent its request as the server, which counts from its last write, closed it, and
got a reset (``httpx.ReadError``: the gateway benchmark's concurrent part, 2 runs in 4). A
server must keep connections longer than its clients do; 75 s is nginx's default."""


def required_token(token: str | None, host: str) -> str | None:
    """The token every request needs: ``--token``, else a new one off loopback, else None."""
    if token is not None and not token.strip():
        raise click.BadParameter("the token may not be empty", param_hint="--token")
    return secrets.token_urlsafe(24) if token is None and not is_loopback(host) else token


def run_server(app: Any, sock: socket.socket) -> None:
    """Serve ``app`` on ``sock`` with uvicorn until interrupted."""
    import uvicorn

    # Live pages hold an event stream open: give them a second, not forever, on Ctrl-C.
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=1,
        timeout_keep_alive=KEEP_ALIVE,
    )
    uvicorn.Server(config).run(sockets=[sock])


@cli.command("serve")
@storage_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="TCP port."
)
@flag("--open", "open_browser", help="Open the dashboard in a browser.")
@flag(
    "--allow-writes",
    help="Offer fork, clear, compact and delete (each behind a confirmation and a CSRF token).",
)
@click.option(
    "--token",
    default=None,
    metavar="T",
    help="Require this token on every request (one is generated when --host is not loopback).",
)
@model_options
@click.pass_context
def serve(
    ctx: click.Context,
    host: str,
    port: int,
    open_browser: bool,
    allow_writes: bool,
    token: str | None,
    server: ModelAccess,
) -> None:
    """Serve the statistics dashboard: overview, sessions, transcripts, search, JSON API.

    Read-only unless --allow-writes. Binds 127.0.0.1 by default; any other host needs a token
    (--token, or one generated and printed here), and every request without it gets 401.
    Compaction asks the model server at --base-url, only when a user confirms one.
    """
    try:
        import uvicorn  # noqa: F401  (run_server's, checked before anything starts)

        from terrarium.web import create_app
    except ImportError as exc:
        raise click.ClickException(
            f"terrarium serve needs the 'web' extra: {install_hint('web')} ({exc})"
        ) from exc
    state = state_of(ctx)
    state.reads_only = True  # the store must exist
    store = state.store()
    store.list_contexts()  # an unreadable store fails here, with one line, before listening
    token = required_token(token, host)
    app = create_app(
        store,
        token=token,
        allow_writes=allow_writes,
        location=state.shown_location,
        model=server,
        # Each compaction opens the store again (see terrarium.web.compact), never creating it.
        reopen=functools.partial(open_store, state.location, create=False),
    )
    sock = listen(host, port)
    with sock:
        shown = f"[{host}]" if ":" in host else host
        url = f"http://{shown}:{sock.getsockname()[1]}/" + (f"?token={token}" if token else "")
        click.echo(f"terrarium dashboard on {url}" + (" (writes allowed)" if allow_writes else ""))
        if token:
            click.echo(f"token: {token}")
        if open_browser:
            threading.Timer(0.5, webbrowser.open, (url,)).start()
        run_server(app, sock)
