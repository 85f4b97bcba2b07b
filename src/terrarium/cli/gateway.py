"""``terrarium gateway``: an OpenAI-compatible server that keeps every conversation in the store.

Loaded lazily: it imports Starlette and uvicorn. The host and token rules are ``serve``'s, and
the socket is bound before the URL is printed. No model server is contacted at start. A quick
store is called on the event loop (:func:`quick_store`), any other in a worker thread.
"""

from __future__ import annotations

import os

import click

from terrarium import Store
from terrarium.cli.app import cli, state_of, storage_option
from terrarium.cli.serve import listen, required_token, run_server
from terrarium.errors import install_hint
from terrarium.stores.fs import FsStore
from terrarium.stores.memory import MemoryStore
from terrarium.stores.sqlite import SqliteStore

UPSTREAM_KEY_ENV = "TERRARIUM_UPSTREAM_API_KEY"


def quick_store(store: Store) -> bool:
    """Whether ``store``'s calls take microseconds: in memory, or local disk with no sync per write.

    Measured (``bench_gateway.py``): a hand-over to a worker thread and back costs more than such
    a store's call, twice per turn, and far more on a busy machine.
    """
    return (
        isinstance(store, MemoryStore)
        or (isinstance(store, FsStore) and store.durability != "fsync")
        or (isinstance(store, SqliteStore) and store.synchronous in ("OFF", "NORMAL"))
    )


@cli.command("gateway")
@storage_option
@click.option(
    "--upstream",
    required=True,
    metavar="URL",
    help="The OpenAI-compatible model server (vLLM, llama.cpp, ...): http://localhost:8000/v1 "
    "(/v1 is added when missing).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8100, show_default=True, help="TCP port."
)
@click.option(
    "--token",
    default=None,
    metavar="T",
    help="Require this token as the API key (one is generated when --host is not loopback).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds to wait for the upstream to connect or send the next piece (then 504).",
)
@click.option(
    "--max-body",
    type=click.IntRange(1024),
    default=32 * 1024 * 1024,
    show_default=True,
    help="The largest request body taken, in bytes.",
)
@click.pass_context
def gateway(
    ctx: click.Context,
    upstream: str,
    host: str,
    port: int,
    token: str | None,
    timeout: float,
    max_body: int,
) -> None:
    """Serve the OpenAI Responses, Conversations and Chat Completions APIs in front of a model
    server, keeping every conversation in the store (forkable, searchable, durable).

    Clients point their base URL at http://HOST:PORT/v1. Binds 127.0.0.1 by default; any
    other host needs a token (--token, or one generated and printed here), which clients send
    as their API key. The upstream's own key, if it needs one, comes from
    $TERRARIUM_UPSTREAM_API_KEY.
    """
    try:
        from terrarium.gateway import Upstream, create_app
    except ImportError as exc:
        raise click.ClickException(
            f"terrarium gateway needs the 'web' extra: {install_hint('web')} ({exc})"
        ) from exc
    from terrarium.llm.vllm_client import normalize_base_url  # as chat reads --base-url

    upstream = normalize_base_url(upstream)
    if not upstream.startswith(("http://", "https://")):
        raise click.BadParameter("use an http:// or https:// URL", param_hint="--upstream")
    token = required_token(token, host)
    try:
        model_server = Upstream(upstream, api_key=os.environ.get(UPSTREAM_KEY_ENV), timeout=timeout)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    store = state_of(ctx).store()
    app = create_app(
        store, model_server, token=token, max_body=max_body, store_thread=not quick_store(store)
    )
    sock = listen(host, port)
    with sock:
        shown = f"[{host}]" if ":" in host else host
        click.echo(f"terrarium gateway on http://{shown}:{sock.getsockname()[1]}/v1 -> {upstream}")
        if token:
            click.echo(f"token: {token}")
        run_server(app, sock)
