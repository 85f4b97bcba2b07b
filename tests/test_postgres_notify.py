"""PostgreSQL's change notes (triggers ``*_notify``, ``PostgresStore.change_feed``) and
the dashboard's live stream over them: a write from another connection wakes the listener,
and the SSE endpoint sends ``change`` on the note (on PostgreSQL it never polls)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from helpers.web import head, seed, turn
from pg import fresh_schema, pg_database  # noqa: F401  (a fixture)
from terrarium import states
from terrarium.model import ContextId
from terrarium.sessions import save_user_input
from terrarium.stores.base import Notifying
from terrarium.stores.postgres import PostgresStore
from terrarium.web import create_app

pytestmark = pytest.mark.postgres


@pytest.fixture
def two(pg_database: str) -> Iterator[tuple[PostgresStore, PostgresStore]]:  # noqa: F811
    """Two stores on one schema: two processes' worth of connections."""
    schema = fresh_schema()
    with (
        PostgresStore(pg_database, schema=schema, pool_size=2) as a,
        PostgresStore(pg_database, schema=schema, pool_size=2) as b,
    ):
        yield a, b


def test_a_write_from_another_connection_wakes_the_feed(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    watcher, writer = two
    assert isinstance(watcher, Notifying)
    seed(writer)
    with watcher.change_feed() as feed:
        assert feed.wait(0.05) is None  # nothing since it started listening
        ref = head(writer, "cli:main")
        save_user_input(writer, ref, "are you there?")
        assert feed.wait(30) == f"session:{ref.session_id}"
        states.delete_context(writer, ContextId.parse("irc:#python"))
        assert feed.wait(30) == "context:irc:#python"


def test_a_feed_sees_only_its_own_schema(pg_database: str) -> None:  # noqa: F811
    with (
        PostgresStore(pg_database, schema=fresh_schema(), pool_size=1) as mine,
        PostgresStore(pg_database, schema=fresh_schema(), pool_size=1) as other,
    ):
        seed(mine)
        with mine.change_feed() as feed:
            seed(other)
            assert feed.wait(0.2) is None
            turn(mine, "cli:main", "q", "a")
            assert (feed.wait(30) or "").startswith("session:")


def test_the_live_stream_sends_change_on_a_note(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    import uvicorn

    served, writer = two
    seed(writer)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(create_app(served), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        with (
            httpx.Client(base_url=base, timeout=30) as http,
            http.stream("GET", "/api/events", params={"c": "cli:main"}) as events,
        ):
            lines = events.iter_lines()
            assert next(lines) == "retry: 1000"
            turn(writer, "cli:main", "another process chats", "and is seen")
            for line in lines:
                if line.startswith("event:"):
                    assert line == "event: change"
                    break
    finally:
        server.should_exit = True
        server.force_exit = True
        thread.join(10)
        sock.close()


def _notes_on(store: PostgresStore) -> bool:
    """Whether the appends' trigger (feeds switch it) is on."""
    import psycopg

    with psycopg.connect(store._dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT tgenabled FROM pg_trigger WHERE tgname = 'segments_notify' "
            "AND tgrelid = %s::regclass",
            (f'"{store.schema}".segments',),
        ).fetchone()
    assert row is not None
    return bool(row[0] != "D")


def test_appends_notify_only_while_a_feed_listens(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    """No feed, no notes from appends; the first feed to join switches them on, the last one
    to leave switches them off, and a feed that joins later hears the appends again."""
    watcher, writer = two
    seed(writer)
    assert not _notes_on(writer)
    first = watcher.change_feed()
    second = writer.change_feed()
    assert _notes_on(writer)
    first.close()
    assert _notes_on(writer)  # the second still listens
    ref = head(writer, "cli:main")
    save_user_input(writer, ref, "still heard?")
    assert second.wait(30) == f"session:{ref.session_id}"
    second.close()
    second.close()  # twice is harmless
    assert not _notes_on(writer)
    with watcher.change_feed() as feed:
        save_user_input(writer, ref, "heard again?")
        assert feed.wait(30) == f"session:{ref.session_id}"


def test_a_feed_that_dies_leaves_the_notes_on(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    """A feed whose connection goes without leaving keeps the notes on (never a listener
    short of one), until the next feed leaves."""
    watcher, writer = two
    seed(writer)
    import psycopg

    dead = watcher.change_feed()
    pid = dead._conn.info.backend_pid
    dead._conn.close()  # as a killed process's connection: its advisory lock goes with it
    dead.close()
    assert _notes_on(writer)
    with psycopg.connect(writer._dsn, autocommit=True) as conn:
        gone = "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = %s)"
        deadline = time.monotonic() + 30
        while not conn.execute(gone, (pid,)).fetchone()[0] and time.monotonic() < deadline:
            time.sleep(0.01)  # the server ends the backend (and drops its lock) soon after
    with writer.change_feed():
        pass
    assert not _notes_on(writer)


def test_a_feed_leaving_behind_a_long_transaction_leaves_the_notes_on(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    """The last feed to leave gives up switching the notes off while a transaction holds the
    appends' table (appends would queue behind it), and leaves them on."""
    import psycopg

    watcher, writer = two
    seed(writer)
    feed = watcher.change_feed()
    with psycopg.connect(writer._dsn) as long:  # a transaction, as an archive's
        long.execute(f'LOCK TABLE "{writer.schema}".segments IN ROW EXCLUSIVE MODE')
        started = time.monotonic()
        feed.close()
        assert time.monotonic() - started < 20
        long.rollback()
    assert _notes_on(writer)
    with writer.change_feed():
        pass
    assert not _notes_on(writer)
