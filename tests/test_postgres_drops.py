"""PostgresStore when the server drops its connections: a terminated backend, a server that
refuses new connections for a while (as during a restart).

Each test runs against a database of its own, so that terminating "the store's backends" is
terminating every backend of that database but the test's own. The server is the real one;
a call is caught in the middle by a table lock it waits on, never by a timer.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.pg_drops import PATIENCE, Server
from pg import as_url, fresh_schema, pg_database  # noqa: F401  (a fixture)

psycopg = pytest.importorskip("psycopg")

from psycopg.conninfo import make_conninfo  # noqa: E402

from terrarium import FsStore  # noqa: E402
from terrarium.blobs import digest_of  # noqa: E402
from terrarium.errors import StoreError, StoreUnavailable  # noqa: E402
from terrarium.index._query import SearchQuery  # noqa: E402
from terrarium.model import ContextId  # noqa: E402
from terrarium.search import search  # noqa: E402
from terrarium.sessions import create_segment, restore, save_user_input  # noqa: E402
from terrarium.stores.base import PodMetadata  # noqa: E402
from terrarium.stores.postgres import PostgresStore  # noqa: E402

pytestmark = pytest.mark.postgres

MAIN = ContextId("cli", "main")
DRIVER = Path(__file__).parent / "helpers" / "pg_drops.py"


@pytest.fixture
def server(pg_database: str) -> Iterator[Server]:  # noqa: F811
    """A database of the test's own on the test server, dropped afterwards."""
    name = f"terrarium_drop_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_database, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield Server(admin, name, make_conninfo(pg_database, dbname=name))
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _new(store: PostgresStore, context: str) -> PodMetadata:
    create_segment(store, context=context)
    head = store.get_head(ContextId.parse(context))
    assert head is not None
    return head


def _texts(store: PostgresStore) -> list[str]:
    return [str(item["content"]) for item in restore(store, MAIN).history]


def _grow_pool(store: PostgresStore, size: int) -> None:
    """Make the pool hold ``size`` idle connections (as a busy process's pool does)."""
    held = [store._pool.getconn() for _ in range(size)]
    for conn in held:
        store._pool.putconn(conn)


def test_calls_after_the_backends_were_terminated_reconnect(server: Server) -> None:
    """Every backend terminated between calls (three times over, the pool holding several
    idle connections): reads, appends, head moves, searches, blobs and locks all succeed on
    fresh connections, and every entry is there once."""
    with PostgresStore(server.dsn, schema=fresh_schema(), pool_size=4) as store:
        head = _new(store, str(MAIN))
        save_user_input(store, head.ref, "zero walrus")
        for round_ in range(3):
            _grow_pool(store, 3)
            with store.lock_context(MAIN):
                pass  # an idle lock connection too
            assert server.terminate() >= 4
            assert store.get_head(MAIN) is not None
            server.terminate()
            store.set_head(MAIN, head.segment_id, expected=head.segment_id)
            server.terminate()
            save_user_input(store, head.ref, f"round {round_} walrus")
            assert _texts(store)[-1] == f"round {round_} walrus"
            server.terminate()
            with store.lock_context(MAIN):
                digest = store.put_blob(f"blob {round_}".encode())
            server.terminate()
            assert store.get_blob(digest) == f"blob {round_}".encode()
            server.terminate()
            assert len(search(store, SearchQuery("walrus"))) == round_ + 2
            server.terminate()
            assert [h.context for h in store.list_contexts()] == [str(MAIN)]
        assert _texts(store) == [
            "zero walrus",
            "round 0 walrus",
            "round 1 walrus",
            "round 2 walrus",
        ]


def _blocked(
    server: Server, store: PostgresStore, call: Callable[[], Any]
) -> tuple[Any, BaseException | None]:
    """Run ``call`` while the entries table is locked; terminate its backend as it waits for
    the lock; return what it returned or raised."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = call()
        except BaseException as exc:
            out["error"] = exc

    with psycopg.connect(server.dsn, autocommit=True) as blocker:
        with blocker.transaction():
            blocker.execute(f'LOCK TABLE "{store.schema}".entries IN ACCESS EXCLUSIVE MODE')
            thread = threading.Thread(target=run)
            thread.start()
            server.kill(server.waiting_backend())
        thread.join(PATIENCE)
    assert not thread.is_alive()
    return out.get("value"), out.get("error")


def test_a_call_whose_backend_is_terminated_mid_statement(server: Server) -> None:
    """A read whose backend is terminated while it runs is run again and answers; an append
    is a one-line StoreUnavailable (it was not done, and says it may not have been), and the
    store goes on: the next append lands once, at the next seq."""
    with PostgresStore(server.dsn, schema=fresh_schema(), pool_size=4) as store:
        head = _new(store, str(MAIN))
        save_user_input(store, head.ref, "one")
        value, error = _blocked(server, store, lambda: _texts(store))
        assert error is None and value == ["one"]
        value, error = _blocked(server, store, lambda: save_user_input(store, head.ref, "two"))
        assert isinstance(error, StoreUnavailable), error
        message = str(error)
        assert "\n" not in message and "connection" in message and server.name in message
        save_user_input(store, head.ref, "three")
        assert _texts(store) == ["one", "three"]
        assert store.next_seq(head.session_id, head.segment_id) == 3


def test_a_server_that_refuses_connections_is_a_store_unavailable(server: Server) -> None:
    """Backends terminated and new connections refused: a call is a one-line
    StoreUnavailable (a StoreError) naming the store, after the pool's timeout; once the
    server lets connections in again, the same store answers."""
    dsn = make_conninfo(server.dsn, password="s3cret-pw")
    with PostgresStore(dsn, schema=fresh_schema(), connect_timeout=1.5) as store:
        create_segment(store, context=MAIN)
        store._pool.timeout = 0.3  # opened within 1.5 s; each refused call waits this long
        server.refuse()
        try:
            server.terminate()
            for call in (
                lambda: store.get_head(MAIN),
                lambda: store.put_blob(b"x"),
                lambda: create_segment(store, context="cli:other"),
            ):
                with pytest.raises(StoreUnavailable) as caught:
                    call()
                message = str(caught.value)
                assert isinstance(caught.value, StoreError)
                assert "\n" not in message and server.name in message
                assert "s3cret-pw" not in message
        finally:
            server.refuse(False)
        assert store.get_head(MAIN) is not None
        assert not store.has_blob(digest_of(b"x"))


# --------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize(
    ("args", "method"),
    [
        (["stats"], "changes"),
        (["export", "--all", "--format", "jsonl", "-o", "{out}"], "read_segment"),
        (["copy", "{url}", "{out}"], "read_segment"),
        (["reindex"], "changes"),
        (["list"], "changes"),
    ],
    ids=["stats", "export-all", "copy", "reindex", "list"],
)
def test_cli_commands_whose_server_goes_away_print_one_line(
    server: Server,
    pg_database: str,  # noqa: F811
    tmp_path: Path,
    args: list[str],
    method: str,
) -> None:
    """``stats``, ``export --all``, ``copy``, ``reindex`` and ``list``, in a process of their
    own, on a store whose server goes away part way: exit 1, one line on stderr naming the
    store and the lost connection, no traceback."""
    url = as_url(server.dsn)
    with PostgresStore(url) as store:
        for name in ("a", "b", "c"):
            head = _new(store, f"cli:{name}")
            save_user_input(store, head.ref, f"hello {name}")
    out = tmp_path / "out"
    argv = [a.format(url=url, out=out) for a in args]
    if "{url}" not in args:
        argv += ["--storage-dir", url]
    try:
        result = subprocess.run(
            [sys.executable, str(DRIVER), pg_database, server.name, method, *argv],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.refuse(False)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ") and server.name in lines[0]
    assert "connect" in lines[0] and "PostgreSQL" in lines[0]
    if args[0] == "copy":
        with FsStore(out) as copied:  # whatever was copied is whole
            for head in copied.list_contexts():
                assert restore(copied, head.context).history
