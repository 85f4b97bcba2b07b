"""Store URLs: one string names a backend and where its data lives.

==========================================  ==========================================
URL                                         store
==========================================  ==========================================
``./sessions``, ``/srv/sessions``           :class:`FsStore` at that folder
``fs:./sessions``, ``file:///srv/sessions``  :class:`FsStore` (``?durability=fsync``)
``sqlite:///abs/path.db``                   :class:`SqliteStore` at ``/abs/path.db``
``sqlite:relative.db``                      :class:`SqliteStore` (``?synchronous=FULL``)
``postgresql://user@host/db``               :class:`PostgresStore` (also ``postgres://``)
==========================================  ==========================================

With no URL, ``$TERRARIUM_STORE`` is used, then ``./sessions``. A PostgreSQL URL goes to
libpq as it is (``sslmode`` and every other libpq parameter work, and so do several hosts).
Errors name what is wrong and show the URL with its password masked. ``fs:`` and ``sqlite:``
URLs also take ``?blob_threshold=BYTES`` (history strings longer than that go to blobs,
:mod:`terrarium.blobs`; ``0`` keeps them inline); a PostgreSQL store takes it as the
``PostgresStore(blob_threshold=...)`` argument.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote

from terrarium.blobrefs import DEFAULT_THRESHOLD
from terrarium.errors import StoreNotFound, StoreURLError, install_hint
from terrarium.stores._redact import password_of, redact_url
from terrarium.stores.base import ClosingStore

if TYPE_CHECKING:
    from terrarium.stores.base import Store

__all__ = ["DEFAULT_STORE", "ENV_VAR", "StoreUser", "open_store", "redact_url"]

ENV_VAR = "TERRARIUM_STORE"
DEFAULT_STORE = "./sessions"

_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):(.*)", re.DOTALL)


def open_store(url: str | os.PathLike[str] | None = None, *, create: bool = True) -> Store:
    """Open the store that ``url`` names (see the module docstring for the forms).

    Args:
        url: a store URL or a folder path; None means ``$TERRARIUM_STORE``, else
            ``./sessions``.
        create: create the folder or the SQLite file when it does not exist (default). With
            False, a missing one raises :class:`StoreNotFound` and nothing is created: what
            readers want, so a mistyped path is an error rather than an empty new store.
            (A PostgreSQL database is never created.)

    Raises:
        StoreURLError: the URL is malformed, names an unknown scheme, or names a file that
            is not a sessions folder or an SQLite database.
        StoreNotFound: ``create`` is False and there is nothing at the location.
        ImportError: a PostgreSQL URL was given but psycopg is not installed.
    """
    if url is None:
        url = os.environ.get(ENV_VAR) or DEFAULT_STORE
    if isinstance(url, os.PathLike):
        return _open_fs(os.fspath(url), os.fspath(url), create)
    if not isinstance(url, str):
        raise StoreURLError(f"a store URL must be a string or a path, not {type(url).__name__}")
    if not url.strip():
        raise StoreURLError("the store URL is empty")
    match = _SCHEME_RE.fullmatch(url)
    # A one-letter "scheme" is a Windows drive (C:\sessions): a path.
    if match is None or len(match.group(1)) == 1:
        return _open_fs(url, url, create)
    scheme, rest = match.group(1).lower(), match.group(2)
    shown = redact_url(url)
    if scheme in ("postgresql", "postgres"):
        return _open_postgres(url, shown)
    if scheme in ("fs", "file"):
        return _open_fs_url(rest, shown, scheme, create)
    if scheme == "sqlite":
        return _open_sqlite_url(rest, shown, create)
    raise StoreURLError(
        f"store URL {shown!r} has unknown scheme {scheme!r}: use a folder path, fs:, file:, "
        "sqlite: or postgresql:"
    )


class StoreUser(ClosingStore):
    """Mixin of what works on a store: one it is given (left open), or one it opens from a
    path or URL (None: the default) and closes in :meth:`close`."""

    store: Store
    _owns_store: bool

    def _use_store(self, store: Store | str | os.PathLike[str] | None) -> None:
        if store is None or isinstance(store, str | os.PathLike):
            self.store, self._owns_store = open_store(store), True
        else:
            self.store, self._owns_store = store, False

    def close(self) -> None:
        """Close the store if this opened it."""
        if self._owns_store:
            self.store.close()


def _open_fs_url(rest: str, shown: str, scheme: str, create: bool) -> Store:
    """An ``fs:`` or ``file:`` URL's store."""
    from terrarium.stores.fs import DURABILITIES

    path, options = _split(rest, shown, scheme, allowed={"durability", "blob_threshold"})
    durability = options.get("durability", "flush")
    if durability not in DURABILITIES:
        raise StoreURLError(
            f"store URL {shown!r}: unknown durability {durability!r}; use one of "
            f"{', '.join(DURABILITIES)}"
        )
    threshold = _threshold(options, shown)
    return _open_fs(path, shown, create, durability=durability, blob_threshold=threshold)


def _open_sqlite_url(rest: str, shown: str, create: bool) -> Store:
    """A ``sqlite:`` URL's store."""
    from terrarium.stores.sqlite import SYNCHRONOUS_MODES, SqliteStore

    path, options = _split(rest, shown, "sqlite", allowed={"synchronous", "blob_threshold"})
    synchronous = options.get("synchronous", "NORMAL")
    if synchronous.upper() not in SYNCHRONOUS_MODES:
        raise StoreURLError(
            f"store URL {shown!r}: unknown synchronous mode {synchronous!r}; use one of "
            f"{', '.join(SYNCHRONOUS_MODES)}"
        )
    _check_place(path, shown, create, folder=False)
    return SqliteStore(path, synchronous=synchronous, blob_threshold=_threshold(options, shown))


def _threshold(options: dict[str, str], shown: str) -> int:
    """The ``blob_threshold`` option: bytes (0 keeps every output inline)."""
    text = options.get("blob_threshold", str(DEFAULT_THRESHOLD))
    if not text.isdigit():
        raise StoreURLError(
            f"store URL {shown!r}: blob_threshold must be a number of bytes (0: no blobs), "
            f"not {text!r}"
        )
    return int(text)


def _open_fs(path: str, shown: str, create: bool, **options: Any) -> Store:
    """A folder's store (``options``: FsStore's)."""
    _check_place(path, shown, create, folder=True)
    from terrarium.stores.fs import FsStore

    return FsStore(path, **options)


def _check_place(path: str, shown: str, create: bool, *, folder: bool) -> None:
    """Refuse a location of the wrong kind, and a missing one unless ``create``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if not create:
            raise StoreNotFound(f"no store at {shown}") from None
        return
    except OSError:
        return  # the store's own open reports it, with its reason
    if folder and not stat.S_ISDIR(st.st_mode):
        raise StoreURLError(f"{shown} is not a sessions folder or store URL")
    if not folder and stat.S_ISDIR(st.st_mode):
        raise StoreURLError(f"store URL {shown!r} names a folder, not an SQLite database")


def _split(rest: str, shown: str, scheme: str, *, allowed: set[str]) -> tuple[str, dict[str, str]]:
    """Split the part after ``scheme:`` into a local path and its query options."""
    rest, _, query = rest.partition("?")
    if "#" in rest:
        raise StoreURLError(f"store URL {shown!r}: a fragment ('#...') means nothing here")
    if rest.startswith("//"):
        host, slash, path = rest[2:].partition("/")
        if host not in ("", "localhost"):
            host = host.rpartition("@")[2]  # never the user info: it may hold a password
            raise StoreURLError(
                f"store URL {shown!r} names host {host!r}: {scheme}: URLs name a local file, "
                f"as in {scheme}:///absolute/path or {scheme}:relative/path"
            )
        rest = slash + path
    path = unquote(rest)
    if not path:
        raise StoreURLError(
            f"store URL {shown!r} names no path: write {scheme}:///absolute/path or "
            f"{scheme}:relative/path"
        )
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise StoreURLError(f"store URL {shown!r}: malformed query string") from None
    options: dict[str, str] = {}
    for key, value in pairs:
        if key not in allowed:
            raise StoreURLError(
                f"store URL {shown!r}: unknown option {key!r} for {scheme}: "
                f"(known: {', '.join(sorted(allowed))})"
            )
        options[key] = value
    return str(Path(path)), options


def _open_postgres(url: str, shown: str) -> Store:
    try:
        import psycopg
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"store URL {shown!r} needs PostgreSQL support: {install_hint('postgres')}"
        ) from exc
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        password = password_of(url)
        reason = " ".join(str(exc).replace(password or "\0", "***").split())  # libpq's: 2 lines
        raise StoreURLError(f"store URL {shown!r} is malformed: {reason}") from None
    from terrarium.stores.postgres import PostgresStore

    return PostgresStore(url)
