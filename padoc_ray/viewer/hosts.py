"""The Host names a local web server answers to: the DNS-rebinding guard of the viewer and of Serve.

A web page the user opens can point its own name at 127.0.0.1 (DNS rebinding); the browser then
sends that name in the Host header, and the page reads whatever a local server answers. A server
that answers only to the names it was started for (loopback's, its listen address, and names the
user lists) gives such a page nothing. Pure: the standard library only.
"""

from __future__ import annotations

LOCAL_NAMES = ("127.0.0.1", "localhost")
#: listening addresses that are no name a browser sends
WILDCARDS = ("0.0.0.0", "::", "")


def answered_hosts(host: str | None, extra=()) -> list[str]:
    """The Host names (port left out) of a server listening on ``host``: loopback's, ``host`` itself
    unless it is a wildcard address, and ``extra``."""
    return list(dict.fromkeys([*LOCAL_NAMES, *([] if host in WILDCARDS or host is None else [host]), *extra]))


def host_name(value: str) -> str:
    """A Host header's name without its port (``[::1]:8000`` -> ``[::1]``), lowercased."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value
