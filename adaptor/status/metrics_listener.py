"""A listener that serves only `GET /metrics` (`--metrics-address`), apart from the status API, so
a PodMonitor can scrape the adaptor on the node's address while the status API (sandbox
listings, readiness) stays on loopback.

It answers one request per connection and nothing but the metrics text: no sandbox names or VM
ids. It keeps the status API's protections: a request whose Host names another site is refused
(the DNS rebinding guard of `adaptor.status.hosts`), at most `max_connections` are open (one more
is closed at once), and a request must arrive whole, head within 8 KiB, within
`request_timeout` seconds. A port it cannot bind is logged and never stops the daemon; with
SO_REUSEPORT the new process of an upgrade binds beside the old one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from adaptor.runtime import metrics
from adaptor.status.hosts import host_allowed
from adaptor.status.server import parse_address
from providers.core.errors import InvalidRequest

log = logging.getLogger(__name__)

MAX_HEAD = 8192


class MetricsListener:
    """`GET /metrics` on HOST:PORT; `refresh` brings the gauges up to date before each answer."""

    def __init__(
        self,
        address: str,
        refresh: Callable[[], Awaitable[None]] | None = None,
        host_names: Iterable[str] = (),
        max_connections: int = 32,
        request_timeout: float = 5.0,
    ) -> None:
        try:
            self.host, self._port = parse_address(address)
        except InvalidRequest:
            raise InvalidRequest(f"--metrics-address: want HOST:PORT, got {address!r}") from None
        self.refresh = refresh
        self.host_names = tuple(host_names)
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def listening(self) -> bool:
        return self._server is not None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0); 0 when not listening."""
        if self._server is None:
            return 0
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        """Listen; a bind failure is logged, and the daemon goes on without this listener."""
        try:
            self._server = await asyncio.start_server(
                self._handle, self.host, self._port, limit=MAX_HEAD, reuse_port=True
            )
        except OSError as exc:
            log.warning(
                "metrics: cannot listen on %s:%d (%s); metrics stay on the status API only",
                self.host,
                self._port,
                exc.strerror or exc,
            )
            return
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)

    async def stop(self) -> None:
        """Stop listening and end the connections in progress (awaited)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        for task in handlers:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if len(self._handlers) >= self.max_connections or task is None:
            writer.close()
            return
        self._handlers.add(task)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.request_timeout)
            status, body, kind = await self._answer(head)
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode("latin-1")
                + body
            )
            await asyncio.wait_for(writer.drain(), self.request_timeout)
        except (
            TimeoutError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
        ):
            pass  # a slow, oversized or vanished client: nothing to answer
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _answer(self, head: bytes) -> tuple[str, bytes, str]:
        """(status line, body, content type) for a request head."""
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return "400 Bad Request", b"bad request line\n", "text/plain"
        method, target, _ = parts
        hosts = [
            line.partition(":")[2].strip()
            for line in lines[1:]
            if line.partition(":")[0].strip().lower() == "host"
        ]
        if len(hosts) > 1 or (hosts and not host_allowed(hosts[0], self.host_names)):
            return "400 Bad Request", b"the Host header does not name this node\n", "text/plain"
        if target.split("?", 1)[0] != "/metrics":
            return "404 Not Found", b"only /metrics here\n", "text/plain"
        if method != "GET":
            return "405 Method Not Allowed", b"GET only\n", "text/plain"
        if self.refresh is not None:
            await self.refresh()
        return "200 OK", generate_latest(metrics.REGISTRY), CONTENT_TYPE_LATEST
