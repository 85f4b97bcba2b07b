"""What the servers' guards share (``serve``, ``gateway``): a loopback ``--host`` needs no token;
without one, only a loopback ``Host`` is answered (no DNS rebinding); a token compares in
constant time."""

from __future__ import annotations

import hmac
import ipaddress


def is_loopback(host: str) -> bool:
    """Whether ``host`` (``localhost``, or an address: ``127.0.0.2``, ``::1``) is this machine."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback_header(host: str) -> bool:
    """Whether a ``Host`` header (``name:port``, ``[::1]:port``, or no port) is this machine."""
    return is_loopback(host[1:].partition("]")[0] if host[:1] == "[" else host.rsplit(":", 1)[0])


def token_matches(given: str | None, token: str | None) -> bool:
    """Whether ``given`` is ``token``, compared in constant time (an empty one matches none)."""
    return bool(given and token and hmac.compare_digest(given.encode(), token.encode()))
