"""``terrarium serve``: the statistics dashboard over a store (see docs/dashboard.md).

Loaded lazily (``cli.add_lazy``): it imports Starlette, uvicorn and Jinja2, which no other
command needs. The store is opened read-only-style (``create=False``): a store that does not
exist or cannot be read ends the command with one line and a non-zero exit before anything
listens. The model options only say where ``compact`` (with ``--allow-writes``) will ask: no
model server is contacted at start.
"""

from __future__ import annotations

import functools
import ipaddress
import secrets
import threading
import webbrowser

import click

from terrarium.cli.app import (
    cli,
    model_options,
    open_store,
    reads_store,
    state_of,
    storage_option,
)
from terrarium.errors import install_hint

LOOPBACK_NAMES = frozenset(("localhost", "127.0.0.1", "::1"))


def is_loopback(host: str) -> bool:
    """Whether ``host`` only ever answers this machine."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@reads_store
@cli.command("serve")
@storage_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="TCP port."
)
@click.option("--open", "open_browser", is_flag=True, help="Open the dashboard in a browser.")
@click.option(
    "--allow-writes",
    is_flag=True,
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
    base_url: str,
    model: str | None,
    retries: int,
    timeout: float,
) -> None:
    """Serve the statistics dashboard: overview, sessions, transcripts, search, JSON API.

    Read-only unless --allow-writes. Binds 127.0.0.1 by default; any other host needs a token
    (--token, or one generated and printed here), and every request without it gets 401.
    Compaction asks the model server at --base-url, only when a user confirms one.
    """
    try:
        import uvicorn

        from terrarium.web import ModelAccess, create_app
    except ImportError as exc:
        raise click.ClickException(
            f"terrarium serve needs the 'web' extra: {install_hint('web')} ({exc})"
        ) from exc
    state = state_of(ctx)
    store = state.store()
    store.list_contexts()  # an unreadable store fails here, with one line, before listening
    if token is not None and not token.strip():
        raise click.BadParameter("the token may not be empty", param_hint="--token")
    if token is None and not is_loopback(host):
        token = secrets.token_urlsafe(24)
    app = create_app(
        store,
        token=token,
        allow_writes=allow_writes,
        location=state.shown_location,
        model=ModelAccess(base_url, model=model, retries=retries, timeout=timeout),
        # Each compaction opens the store again (see terrarium.web.compact), never creating it.
        reopen=functools.partial(open_store, state.location, create=False),
    )
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/" + (f"?token={token}" if token else "")
    click.echo(f"terrarium dashboard on {url}" + (" (writes allowed)" if allow_writes else ""))
    if token:
        click.echo(f"token: {token}")
    if open_browser:
        threading.Timer(0.5, webbrowser.open, (url,)).start()
    # Live pages hold an event stream open: give them a second, not forever, on Ctrl-C.
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=1,
    )
