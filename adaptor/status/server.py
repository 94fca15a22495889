"""Serving the status API inside the daemon's event loop (uvicorn, no signal handling of its own:
the daemon owns SIGTERM/SIGINT and stops this server as part of its shutdown)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import uvicorn
from starlette.applications import Starlette

from providers.core.errors import InvalidRequest


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


class StatusServer:
    """The status API on HOST:PORT, started and stopped with the daemon."""

    def __init__(self, app: Starlette, address: str) -> None:
        host, port = parse_address(address)
        self._address = address
        self.host = host
        config = uvicorn.Config(
            app, host=host, port=port, log_level="warning", lifespan="off", access_log=False
        )
        self._server = _EmbeddedServer(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        servers = getattr(self._server, "servers", [])
        for server in servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return 0

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        """Listening when this returns; a bind failure raises."""
        self._task = asyncio.get_running_loop().create_task(
            self._server.serve(), name="status-server"
        )
        while not self._server.started:
            if self._task.done():
                # uvicorn reports a bind failure by logging it and exiting the task
                with contextlib.suppress(BaseException):
                    self._task.result()
                self._task = None
                raise InvalidRequest(f"--status-address: cannot listen on {self._address}")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError, SystemExit):
            await self._task
        self._task = None
