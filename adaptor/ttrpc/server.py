"""ttrpc server on a unix socket: one task per request, deadlines enforced, graceful close."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from .codec import MalformedMessage, encode_response
from .connection import LISTEN_BACKLOG, READ_CHUNK, bind_unix, close_writer, unlink_socket
from .gen import ttrpc_pb2
from .status import Code, TtrpcError
from .streams import Call, ServerStreams

log = logging.getLogger(__name__)

# Requests one connection may have in flight before the server stops reading from it.
MAX_IN_FLIGHT = 1024


@dataclass(frozen=True)
class CallContext:
    """What a handler knows about its call besides the payload."""

    service: str
    method: str
    metadata: tuple[tuple[str, str], ...]
    timeout_nano: int


Handler = Callable[[CallContext, bytes], Awaitable[bytes]]


class Server:
    """Serves registered services; unknown ones get UNIMPLEMENTED like Go's ttrpc."""

    def __init__(self) -> None:
        self._services: dict[str, dict[str, Handler]] = {}
        self._server: asyncio.AbstractServer | None = None
        self._path: str | None = None
        self._inode: int | None = None
        self._connections: dict[_ServerConnection, asyncio.Task[None]] = {}
        self._listener: socket.socket | None = None

    def register(self, service: str, methods: Mapping[str, Handler]) -> None:
        """Add (or extend) a service's methods."""
        self._services.setdefault(service, {}).update(methods)

    def lookup(self, service: str, method: str) -> Handler:
        """The handler for a call, or the status Go sends for an unknown one."""
        methods = self._services.get(service)
        if methods is None:
            raise TtrpcError(Code.UNIMPLEMENTED, f"service {service}")
        handler = methods.get(method)
        if handler is None:
            raise TtrpcError(Code.UNIMPLEMENTED, f"method {method}")
        return handler

    async def start_unix(self, path: str, mode: int = 0o600) -> None:
        """Listen on `path` (created with `mode`); accepting when this returns."""
        if self._server is not None:
            raise RuntimeError("server already started")
        sock = bind_unix(path, mode)
        self._inode = os.lstat(path).st_ino
        self._path = path
        self._listener = sock
        self._server = await asyncio.start_unix_server(
            self._accept, sock=sock, limit=READ_CHUNK, backlog=LISTEN_BACKLOG
        )

    async def adopt_unix(self, sock: socket.socket, path: str) -> None:
        """Serve on an inherited listening socket already bound at `path` (a hand-off between
        processes): nothing is bound again, so connects queued in its backlog are accepted here."""
        if self._server is not None:
            raise RuntimeError("server already started")
        sock.setblocking(False)
        try:
            self._inode = os.lstat(path).st_ino
        except FileNotFoundError:
            self._inode = None
        self._path = path
        self._listener = sock
        self._server = await asyncio.start_unix_server(
            self._accept, sock=sock, limit=READ_CHUNK, backlog=LISTEN_BACKLOG
        )

    async def detach(
        self, grace_seconds: float, patient: Collection[str] = (), patient_seconds: float = 0.0
    ) -> socket.socket:
        """Stop accepting and return the listening socket, still listening, for another process
        to serve (connects queue in its backlog meanwhile); the calls in flight finish within
        the grace, then every connection here is closed. The socket file stays where it is."""
        if self._server is None or self._listener is None:
            raise RuntimeError("server not started")
        listener = socket.socket(fileno=os.dup(self._listener.fileno()))
        self._path = None  # the successor serves it: never unlinked here
        try:
            await self.close(grace_seconds, patient, patient_seconds)
        except BaseException:
            listener.close()
            raise
        return listener

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _ServerConnection(self, reader, writer)
        task = asyncio.get_running_loop().create_task(conn.run(), name="ttrpc-server-conn")
        self._connections[conn] = task
        task.add_done_callback(lambda _t: self._connections.pop(conn, None))

    @property
    def in_flight(self) -> int:
        """Requests being handled now, over all connections."""
        return sum(len(c.tasks) for c in self._connections)

    async def close(
        self,
        grace_seconds: float = 5.0,
        patient: Collection[str] = (),
        patient_seconds: float = 0.0,
    ) -> None:
        """Stop accepting, let in-flight calls finish for `grace_seconds`, then cancel the rest;
        calls of the methods in `patient` get `patient_seconds` in all instead, when longer."""
        if self._server is not None:
            self._server.close()
        if self._path is not None:
            unlink_socket(self._path, self._inode)
            self._path = None
        for conn in list(self._connections):
            conn.stop_reading()
        pending = [t for c in self._connections for t in c.tasks]
        started = time.monotonic()
        if pending and grace_seconds > 0:
            await asyncio.wait(pending, timeout=grace_seconds)
        names = {f"ttrpc:{method}" for method in patient}
        longer = [t for t in pending if not t.done() and t.get_name() in names]
        left = patient_seconds - (time.monotonic() - started)
        if longer and left > 0:
            await asyncio.wait(longer, timeout=left)
        tasks = list(self._connections.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None


def _parse_request(data: bytes) -> ttrpc_pb2.Request:
    try:
        request: ttrpc_pb2.Request = ttrpc_pb2.Request.FromString(data)
    except DecodeError as exc:
        raise MalformedMessage(str(exc)) from exc
    return request


class _ServerConnection:
    """One accepted connection: its streams (adaptor.ttrpc.streams keeps the protocol's rules),
    one task per request, responses written as they come."""

    def __init__(
        self, server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._server = server
        self._reader = reader
        self._writer = writer
        self._streams = ServerStreams(_parse_request)
        self._room = asyncio.Event()
        self._room.set()
        self._reading = True
        self.tasks: set[asyncio.Task[None]] = set()

    def stop_reading(self) -> None:
        """Take no new requests (shutdown); in-flight ones still answer."""
        self._reading = False

    async def run(self) -> None:
        streams = self._streams
        try:
            while self._reading:
                data = await self._reader.read(READ_CHUNK)
                if not data or not self._reading:
                    break
                for event in streams.receive(data):
                    if isinstance(event, Call):
                        self._start(event.stream_id, event.request)
                self._flush()  # refusals
                if len(self.tasks) >= MAX_IN_FLIGHT:
                    self._room.clear()
                    await self._room.wait()
            if self.tasks and not self._reading:
                # graceful shutdown: answer what was accepted; Server.close bounds the wait
                await asyncio.gather(*self.tasks, return_exceptions=True)
        except (ConnectionError, OSError):
            pass
        finally:
            for task in self.tasks:
                task.cancel()
            if self.tasks:
                await asyncio.gather(*self.tasks, return_exceptions=True)
            await close_writer(self._writer)

    def _start(self, stream_id: int, request: ttrpc_pb2.Request) -> None:
        task = asyncio.get_running_loop().create_task(
            self._handle(stream_id, request), name=f"ttrpc:{request.method}"
        )
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if len(self.tasks) < MAX_IN_FLIGHT:
            self._room.set()

    async def _handle(self, stream_id: int, request: ttrpc_pb2.Request) -> None:
        ctx = CallContext(
            service=request.service,
            method=request.method,
            metadata=tuple((kv.key, kv.value) for kv in request.metadata),
            timeout_nano=request.timeout_nano,
        )
        try:
            handler = self._server.lookup(ctx.service, ctx.method)
            if ctx.timeout_nano < 0:
                raise TtrpcError(Code.DEADLINE_EXCEEDED, "context deadline exceeded")
            if ctx.timeout_nano > 0:
                deadline = asyncio.timeout(ctx.timeout_nano / 1e9)
                try:
                    async with deadline:
                        payload = await handler(ctx, request.payload)
                except TimeoutError:
                    if not deadline.expired():
                        raise
                    raise TtrpcError(Code.DEADLINE_EXCEEDED, "context deadline exceeded") from None
            else:
                payload = await handler(ctx, request.payload)
            data = encode_response(payload)
        except TtrpcError as exc:
            data = encode_response(b"", exc.code, exc.message)
        except Exception as exc:
            log.exception("ttrpc handler %s/%s failed", ctx.service, ctx.method)
            data = encode_response(b"", Code.UNKNOWN, str(exc) or type(exc).__name__)
        self._streams.respond(stream_id, data)
        self._flush()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.drain()

    def _flush(self) -> None:
        data = self._streams.data_to_send()
        if data and not self._writer.is_closing():
            self._writer.write(data)
