"""Change notifications of ``PostgresStore`` (LISTEN/NOTIFY), for live views.

The schema (``m001_initial``) makes every append, new segment and head change send a notification
on the channel ``terrarium.<schema>``; :class:`ChangeFeed` listens on a dedicated connection
(never a pooled one: a listening connection must stay open and idle between waits). Appends and
new segments notify only while a feed listens (``feed_join``, ``feed_leave``): a feed joins as
it starts listening, which switches their trigger on, and the last one to leave switches it
off, so that a store no one watches pays nothing for it.

Usage::

    with store.change_feed() as feed:
        while feed.wait(1.0) is not None:  # a payload per committed write, or None on timeout
            ...
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from terrarium.errors import StoreUnavailable
from terrarium.stores.base import ClosingStore
from terrarium.stores.postgres._sql import lock_key


class ChangeFeed(ClosingStore):
    """Notifications of one store's writes, received on a connection of its own."""

    def __init__(self, dsn: str, schema: str) -> None:
        """Connect and LISTEN (psycopg.OperationalError if the server cannot be reached)."""
        self._conn: psycopg.Connection[Any] = psycopg.connect(dsn, autocommit=True)
        self._leave = sql.SQL("SELECT {}.feed_leave(%s, %s)").format(sql.Identifier(schema))
        self._keys = (lock_key(schema, "feed toggle"), lock_key(schema, "feed listening"))
        try:
            # Listening and joining commit together: the appends committed after this do
            # notify, and this connection hears them.
            with self._conn.transaction():
                listen = sql.SQL("LISTEN {}").format(sql.Identifier(f"terrarium.{schema}"))
                self._conn.execute(listen)
                join = sql.SQL("SELECT {}.feed_join(%s, %s)").format(sql.Identifier(schema))
                self._conn.execute(join, self._keys)
        except BaseException:
            self._conn.close()
            raise

    def wait(self, timeout: float) -> str | None:
        """The next note's payload, or None after ``timeout`` seconds; StoreUnavailable if the
        connection was lost (open a new feed)."""
        try:
            for note in self._conn.notifies(timeout=timeout, stop_after=1):
                return note.payload
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise StoreUnavailable(
                f"lost the change feed's connection to PostgreSQL: {' '.join(str(exc).split())}"
            ) from exc
        return None

    def close(self) -> None:
        """Leave (the last feed to leave switches the appends' notes off), then close the
        connection (the server forgets the LISTEN)."""
        if self._conn.closed:
            return
        try:
            self._conn.execute(self._leave, self._keys)
        except psycopg.Error:
            # The connection is gone, and its lock with it: the notes stay on until the next
            # feed leaves, which costs the appends, never a listener.
            pass
        finally:
            self._conn.close()
