"""The status API answers only requests addressed to this node (a DNS rebinding guard).

A web page a browser on the node opens can resolve its own name to 127.0.0.1 and then read the
status API as if it were that site: the request still carries the page's name in its Host
header. So a request is served only when its Host is an IP address (a rebinding attack always
names a host), `localhost`, or one of the node's names the daemon was configured with (its
hostname, `--node-name`); anything else is 400 with a JSON error. A request without a Host
header (HTTP/1.0 tools) is served: browsers always send one.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_NAMES = ("localhost",)


def _name(host: str) -> str:
    """The host part of a Host header value, lower case, without port or trailing dot."""
    host = host.strip()
    if host.startswith("["):
        end = host.find("]")
        return host[1:end] if end > 0 else host
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.lower().rstrip(".")


def host_allowed(value: str, names: Iterable[str]) -> bool:
    """Whether a request with Host `value` is addressed to this node (see the module doc)."""
    host = _name(value)
    if not host:
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return True
    allowed = {n.strip().lower().rstrip(".") for n in (*LOOPBACK_NAMES, *names)}
    return host in allowed - {""}


class HostCheck:
    """ASGI middleware: 400 for an HTTP request whose Host is not one of this node's."""

    def __init__(self, app: ASGIApp, names: Iterable[str] = ()) -> None:
        self.app = app
        self.names = tuple(names)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            hosts = [v for k, v in scope.get("headers", ()) if k == b"host"]
            value = hosts[0].decode("latin-1") if len(hosts) == 1 else None
            if len(hosts) > 1 or (value is not None and not host_allowed(value, self.names)):
                response = JSONResponse(
                    {"code": "bad_host", "message": "the Host header does not name this node"},
                    status_code=400,
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
