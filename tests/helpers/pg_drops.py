"""A PostgreSQL server that goes away, for tests: terminated backends, refused connections.

:class:`Server` is a test's view of a database of its own on the test server. Run as a
script, this module is the ``terrarium`` command line in a process whose server goes away
part way (see :func:`main`); the test reads its exit status and output as a user would.
"""

from __future__ import annotations

import sys
import time
from typing import Any

#: How long a test waits for a condition on the server (a backend to block) before failing.
PATIENCE = 30.0


class Server:
    """The test's view of the server: its own database, and ways to drop the store's
    connections to it."""

    def __init__(self, admin: Any, name: str, dsn: str) -> None:
        self.admin = admin
        self.name = name
        self.dsn = dsn

    def terminate(self) -> int:
        """Terminate every backend of the database; return how many, once all have gone.

        A backend sends its client the FATAL message before it leaves the server's process
        list, so once they are gone every client has it to read.
        """
        # The list first, then the terminations: in one WHERE clause the server may call
        # pg_terminate_backend before it filters by database.
        pids = [
            int(pid)
            for (pid,) in self.admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (self.name,),
            )
        ]
        self.admin.execute(
            "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,)
        )
        self._until("the terminated backends to go", "pid = ANY(%s)", pids, gone=True)
        return len(pids)

    def _until(self, what: str, where: str, arg: Any, *, gone: bool) -> int | None:
        """Wait until the database has no backend matching ``where`` (``gone``), or has one
        (return its pid)."""
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            row = self.admin.execute(
                f"SELECT pid FROM pg_stat_activity WHERE datname = %s AND {where}",
                (self.name, arg),
            ).fetchone()
            if (row is None) == gone:
                return None if row is None else int(row[0])
            time.sleep(0.005)
        raise AssertionError(f"waited {PATIENCE:g} s for {what}")

    def refuse(self, refusing: bool = True) -> None:
        """Let no new connection in (as a server that is restarting), or let them in again."""
        self.admin.execute(
            f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS {"false" if refusing else "true"}'
        )

    def waiting_backend(self) -> int:
        """The pid of the database's backend that waits for a lock (waits until one does)."""
        pid = self._until(
            "a backend to wait for the lock", "wait_event_type = %s", "Lock", gone=False
        )
        assert pid is not None
        return pid

    def kill(self, pid: int) -> None:
        """Terminate one backend, once it has gone."""
        self.admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        self._until("the terminated backend to go", "pid = %s", pid, gone=True)


def main(argv: list[str]) -> None:
    """``pg_drops.py ADMIN_DSN DATABASE METHOD ARGS...``: run ``terrarium ARGS...``; the first
    call of ``PostgresStore.METHOD`` finds the database refusing connections and its
    backends terminated (the store's pool opens within 2 s, not 30, and that call waits 0.5 s
    for a connection)."""
    import psycopg

    from terrarium.cli import main as terrarium
    from terrarium.stores import postgres

    admin_dsn, database, method, *args = argv
    admin = psycopg.connect(admin_dsn, autocommit=True)
    server = Server(admin, database, "")
    base = postgres.PostgresStore

    class Doomed(base):
        def __init__(self, dsn: str, **options: Any) -> None:
            super().__init__(dsn, **{**options, "connect_timeout": 2})
            self._doomed = False

    def doom_then(self: Doomed, *a: Any, **k: Any) -> Any:
        if not self._doomed:
            self._doomed = True
            # Opened within 2 s; the call that finds the server gone need not wait that long.
            self._pool.timeout = 0.5
            server.refuse()
            server.terminate()
        return getattr(base, method)(self, *a, **k)

    setattr(Doomed, method, doom_then)
    postgres.PostgresStore = Doomed
    sys.argv = ["terrarium", *args]
    terrarium()


if __name__ == "__main__":
    main(sys.argv[1:])
