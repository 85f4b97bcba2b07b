"""What counts as this machine, one rule for every server the command line starts.

``terrarium serve`` and ``terrarium gateway`` need no token on a loopback ``--host``; without
a token, the dashboard's and the gateway's guards answer only a loopback ``Host`` header, so
a web page cannot reach them by DNS rebinding.
"""

from __future__ import annotations

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
