"""Serving the status API inside the daemon's event loop (uvicorn, no signal handling of its own:
the daemon owns SIGTERM/SIGINT and stops this server as part of its shutdown).

The status API must never cost the pods anything:
- a port it cannot bind (a local user took it first) is not fatal: the daemon serves its pods
  without it, logs, and binds again every few seconds in the background;
- on a take-over the successor serves the listener its predecessor hands over (`detach`), so no
  one can take the port in between;
- what one client may hold is bounded (`StatusLimits`): past the connection cap, the oldest
  connection with no request being answered makes room (so idle connections never keep the
  kubelet's probe out), or, when every one has a request, the new one is closed as it is
  accepted; request headers must be complete within a deadline after the connection
  (or the previous answer), idle keep-alive connections are closed, so the daemon's file
  descriptors and event loop stay the hypervisor socket's and the agent connections'.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import h11
import uvicorn
from starlette.applications import Starlette
from uvicorn.protocols.http.h11_impl import H11Protocol

from providers.core.errors import InvalidRequest

log = logging.getLogger(__name__)

BIND_RETRY_SECONDS = 5.0


@dataclass(frozen=True)
class StatusLimits:
    """What clients of the status API may hold at once (the kubelet's probes and a scraper
    need a handful)."""

    # open connections; each has at most one request in flight (HTTP/1.1 without pipelining
    # in uvicorn), so this caps requests too
    max_connections: int = 64
    header_timeout_seconds: float = 5.0  # connection (or last answer) to complete headers
    idle_timeout_seconds: float = 5.0  # keep-alive between requests


class _EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def parse_address(address: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 as `[::1]:8006`); InvalidRequest naming the flag otherwise."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidRequest(f"--status-address: want HOST:PORT, got {address!r}")
    return host, int(port)


def bind_tcp(host: str, port: int, backlog: int = 128) -> socket.socket:
    """A listening, non-blocking TCP socket on HOST:PORT (OSError when taken)."""
    family, kind, proto, _name, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICSERV
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        # TIME_WAIT of our own last run only: Linux never lets this share a live listener
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class _Bounded(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a connection cap and a deadline for request headers;
    `limits` is set on the subclass `_bounded` makes for one server."""

    limits: StatusLimits
    _timer: asyncio.TimerHandle | None = None
    _since = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._since = time.monotonic()
        if len(self.connections) > self.limits.max_connections and not self._evict():
            self.connections.discard(self)
            transport.abort()  # its descriptor is free again at once
            return
        self._arm()

    @property
    def _waiting(self) -> bool:
        """Whether no request of its own is being answered (nothing, or half a request)."""
        return self.conn.their_state is h11.IDLE and (
            self.cycle is None or self.cycle.response_complete
        )

    def _evict(self) -> bool:
        """Make room by dropping the oldest connection that has no request being answered:
        idle connections never keep a probe out. False when every one has a request."""
        idle = [c for c in self.connections if isinstance(c, _Bounded) and c is not self]
        idle = [c for c in idle if c._waiting and not c.transport.is_closing()]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c._since)
        oldest.connections.discard(oldest)
        oldest.transport.abort()
        return True

    def _arm(self) -> None:
        self._disarm()
        self._timer = self.loop.call_later(self.limits.header_timeout_seconds, self._late)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _late(self) -> None:
        self._timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.abort()  # nothing or half a request in time: dropped

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()  # headers complete: the app answers

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def _bounded(limits: StatusLimits) -> type[H11Protocol]:
    """The bounded protocol for one server's limits (uvicorn takes a class, not an instance)."""
    return type("Bounded", (_Bounded,), {"limits": limits})


class StatusServer:
    """The status API on HOST:PORT, started and stopped with the daemon."""

    def __init__(self, app: Starlette, address: str, limits: StatusLimits | None = None) -> None:
        host, port = parse_address(address)
        self._address = address
        self.host = host
        self._port = port
        self.limits = limits = limits or StatusLimits()
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            lifespan="off",
            access_log=False,
            http=_bounded(limits),
            limit_concurrency=limits.max_connections + 1,  # 503 past it (never, by the cap)
            timeout_keep_alive=int(max(1, limits.idle_timeout_seconds)),
            timeout_graceful_shutdown=1,
        )
        self._server = _EmbeddedServer(config)
        self._task: asyncio.Task[None] | None = None
        self._retry: asyncio.Task[None] | None = None
        self._listener: socket.socket | None = None

    @property
    def listening(self) -> bool:
        return self._listener is not None and self._task is not None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0); 0 while not listening."""
        if self._listener is None:
            return 0
        return int(self._listener.getsockname()[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self, inherited: socket.socket | None = None) -> None:
        """Serve on `inherited` (a predecessor's listener) or bind the address; a bind that
        fails is logged and retried in the background, never raised."""
        if inherited is not None:
            if _is_tcp_listener(inherited):
                await self._serve(inherited)
                return
            log.error("status API: the listener handed over is not a listening TCP socket")
            inherited.close()
        if not await self._try_bind():
            self._retry = asyncio.get_running_loop().create_task(
                self._bind_later(), name="status-bind"
            )

    async def _try_bind(self) -> bool:
        try:
            sock = bind_tcp(self.host, self._port)
        except OSError as exc:
            log.error(
                "status API: cannot listen on %s (%s); serving pods without it, retrying every %gs",
                self._address,
                exc.strerror or exc,
                BIND_RETRY_SECONDS,
            )
            return False
        await self._serve(sock)
        return True

    async def _bind_later(self) -> None:
        while True:
            await asyncio.sleep(BIND_RETRY_SECONDS)
            try:
                sock = bind_tcp(self.host, self._port)
            except OSError:
                continue
            await self._serve(sock)
            log.info("status API on %s (bound after a retry)", self.url)
            return

    async def _serve(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._listener = sock
        self._task = asyncio.get_running_loop().create_task(
            self._server.serve(sockets=[sock]), name="status-server"
        )
        while not self._server.started:
            if self._task.done():
                with contextlib.suppress(BaseException):
                    self._task.result()
                self._task = None
                self._listener = None
                sock.close()
                log.error("status API: cannot serve on %s", self._address)
                return
            await asyncio.sleep(0.01)

    async def detach(self) -> socket.socket | None:
        """Stop serving and return a duplicate of the listener, still listening (a hand-off:
        connects wait in its backlog for the successor); None when not listening."""
        listener = self._listener
        copy = socket.socket(fileno=os.dup(listener.fileno())) if listener is not None else None
        await self.stop()
        return copy

    async def stop(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retry
            self._retry = None
        if self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError, SystemExit):
            await self._task
        self._task = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None


def _is_tcp_listener(sock: socket.socket) -> bool:
    try:
        return (
            sock.family in (socket.AF_INET, socket.AF_INET6)
            and sock.type == socket.SOCK_STREAM
            and bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
        )
    except OSError:
        return False
