"""Masking the password in a store URL or libpq connection string before it is shown.

Error messages and a store's ``repr`` name where the data lives; this keeps secrets out of
them. It imports nothing of the stores, so the URL opener and every backend can use it.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

_KV_PASSWORD_RE = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S+)", re.IGNORECASE)
_QUERY_PASSWORD_RE = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


def _userinfo(url: str) -> tuple[str, str, str] | None:
    """Split ``scheme://userinfo@rest`` into its three parts; None when there is no user info.

    It ends at the last ``@`` before any ``?`` or ``#``: masking errs on the side of too much.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    at = re.split("[?#]", rest, maxsplit=1)[0].rfind("@")
    if at < 0:
        return None
    return f"{scheme}://", rest[:at], rest[at:]


def redact_url(url: str) -> str:
    """Return ``url`` (or a libpq ``key=value`` string) with any password replaced by ``***``."""
    if "://" not in url:
        return _QUERY_PASSWORD_RE.sub(r"\1***", _KV_PASSWORD_RE.sub(r"\1***", url))
    parts = _userinfo(url)
    if parts is not None:
        prefix, userinfo, rest = parts
        user, colon, _ = userinfo.partition(":")
        url = f"{prefix}{user}:***{rest}" if colon else url
    return _QUERY_PASSWORD_RE.sub(r"\1***", url)


def password_of(url: str) -> str:
    """The password in a URL's user info, unquoted ('' if none): to scrub it from messages."""
    parts = _userinfo(url)
    if parts is None or ":" not in parts[1]:
        return ""
    return unquote(parts[1].split(":", 1)[1])
