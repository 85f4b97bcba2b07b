"""SQLite plumbing that ``SqliteStore`` and the derived index share.

* :func:`create_private` makes the database file ``0600`` before SQLite opens it: SQLite gives
  ``-wal`` and ``-shm`` the database's mode, but creates a missing one ``0644`` minus the umask.
* :func:`connect` opens ``mode=ro`` when asked; a WAL database whose ``-shm`` file cannot be
  created is then opened ``immutable``, safe only while no ``-wal`` file holds data.
* :func:`kind` tells corruption from a busy, full or read-only database by the error's code,
  never its message: only corruption justifies rebuilding derived state.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from terrarium.stores._files import make_dirs, open_private

Kind = Literal["corrupt", "busy", "full", "readonly", "other"]

# Primary result codes (https://www.sqlite.org/rescode.html); extended codes keep them in the
# low byte.
_BUSY, _LOCKED, _READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN, _NOTADB = 5, 6, 8, 10, 11, 13, 14, 26
_PERM = 3
_KINDS: dict[int, Kind] = {
    _CORRUPT: "corrupt",
    _NOTADB: "corrupt",
    _BUSY: "busy",
    _LOCKED: "busy",
    _FULL: "full",
    _READONLY: "readonly",
    _PERM: "readonly",
    _CANTOPEN: "readonly",
}
_WORDS: dict[Kind, str] = {
    "corrupt": "corrupt",
    "busy": "busy: another process holds its lock",
    "full": "disk full",
    "readonly": "read-only",
    "other": "unusable",
}


def kind(exc: BaseException, where: Path | None = None) -> Kind:
    """What kind of failure ``exc`` is, from its SQLite result code, SQLSTATE or ``errno``.

    SQLite reports a ``-shm`` file that cannot grow as an I/O error without the ``errno``, so
    any error where ``where``'s file system has no space left is a full disk.
    """
    found: Kind = "other"
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        found = _KINDS.get(code & 0xFF, "other") if isinstance(code, int) else "other"
    elif getattr(exc, "sqlstate", None) == "53100":  # PostgreSQL's disk_full
        found = "full"
    elif isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            found = "full"
        elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            found = "readonly"
    if found == "other" and where is not None:
        try:
            if os.statvfs(where.parent).f_bavail == 0:
                found = "full"
        except OSError:
            pass
    return found


def describe(exc: BaseException, where: Path | None = None) -> str:
    """A one-line reason for ``exc``: its kind in words, then what SQLite or the OS said."""
    detail = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return f"{_WORDS[kind(exc, where)]} ({detail})"


def failure(exc: BaseException, path: Path, readonly_reason: str | None) -> str:
    """``path`` and why ``exc`` happened: ``readonly_reason`` for a write refused read-only."""
    refused = readonly_reason is not None and kind(exc) == "readonly"
    return f"{path}: {readonly_reason if refused else describe(exc, path)}"


def writable(path: Path) -> bool:
    """Whether this process may write ``path`` (if it exists) and create files beside it (or
    the folders missing on the way to it)."""
    folder = path.parent
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    return os.access(folder, os.W_OK | os.X_OK) and (not path.exists() or os.access(path, os.W_OK))


def create_private(path: Path) -> None:
    """Create the database file ``path`` empty and ``0600`` unless it exists (folders 0700)."""
    make_dirs(path.parent)
    os.close(open_private(path, os.O_RDWR | os.O_CREAT))


def connect(path: Path, *, timeout: float, readonly: bool) -> sqlite3.Connection:
    """An autocommit connection to ``path``, read-only if ``readonly`` (sqlite3.Error if the
    database cannot be opened or read)."""
    if not readonly:  # callers share a connection between threads under their own lock
        return _checked(sqlite3.connect(path, timeout=timeout, check_same_thread=False))
    uri = path.absolute().as_uri()

    def opened(mode: str) -> sqlite3.Connection:
        conn = sqlite3.connect(f"{uri}?{mode}", uri=True, timeout=timeout, check_same_thread=False)
        return _checked(conn)

    try:
        return opened("mode=ro")
    except sqlite3.Error as exc:
        wal = Path(f"{path}-wal")
        if kind(exc, path) not in ("readonly", "full") or (wal.exists() and wal.stat().st_size):
            raise
    return opened("immutable=1")


def _casefold(value: str | None) -> str | None:
    return value.casefold() if isinstance(value, str) else None


def _checked(conn: sqlite3.Connection) -> sqlite3.Connection:
    """``conn`` once it has read the schema (opening alone reads nothing), in autocommit mode,
    with ``casefold(text)`` for the listing's filter (SQLite's ``lower`` is ASCII only)."""
    conn.isolation_level = None
    conn.create_function("casefold", 1, _casefold, deterministic=True)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except BaseException:
        conn.close()
        raise
    return conn


def enable_wal(conn: sqlite3.Connection, timeout: float) -> str:
    """Switch to WAL and return the journal mode now in force, retrying a ``SQLITE_BUSY`` (its
    busy handler is not called for this change) for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if kind(exc) != "busy" or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One ``BEGIN IMMEDIATE`` transaction on the autocommit ``conn``: the write lock taken at
    once, so what the block reads no other writer changes before it commits."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # SQLite may have rolled back itself (a full disk)
            conn.execute("ROLLBACK")
        raise
