"""Change notifications of ``PostgresStore`` (LISTEN/NOTIFY), for live views.

Migration ``m009_notify`` makes every append, new segment and head change send a notification
on :func:`channel`; :class:`ChangeFeed` listens on a dedicated connection (never a pooled
one: a listening connection must stay open and idle between waits).

Usage::

    with store.change_feed() as feed:
        while feed.wait(1.0) is not None:  # a payload per committed write, or None on timeout
            ...
"""

from __future__ import annotations

from typing import Any, Self

import psycopg
from psycopg import sql


def channel(schema: str) -> str:
    """The notification channel of the store in ``schema``."""
    return f"terrarium.{schema}"


class ChangeFeed:
    """Notifications of one store's writes, received on a connection of its own."""

    def __init__(self, dsn: str, schema: str) -> None:
        """Connect and LISTEN.

        Raises:
            psycopg.OperationalError: the server cannot be reached (``PostgresStore``
                turns it into a ``StoreError`` without the password).
        """
        self._conn: psycopg.Connection[Any] = psycopg.connect(dsn, autocommit=True)
        try:
            self._conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(schema))))
        except BaseException:
            self._conn.close()
            raise

    def wait(self, timeout: float) -> str | None:
        """The payload of the next notification (``session:<id>`` or ``context:<id>``), or
        None when none came within ``timeout`` seconds."""
        for note in self._conn.notifies(timeout=timeout, stop_after=1):
            return note.payload
        return None

    def close(self) -> None:
        """Close the connection (the server forgets the LISTEN)."""
        self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
