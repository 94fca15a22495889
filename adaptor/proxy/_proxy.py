"""The agent proxy: the shim's agent socket, relayed over one multiplexed upstream connection.

Request frames are forwarded as they arrived, only the stream id is remapped (the shim's ids are
per shim connection, the upstream's are ours); service and method are peeked without decoding the
payload. Response frames come back unchanged with the shim's stream id restored. No timeout is
added: long calls (WaitProcess, GetOOMEvent) simply stay in flight beside the others.

Only `grpc.AgentService/CreateContainer` is ever decoded, and only when a hook is installed.

The ttrpc stream rules (ids, size limits, which frames a stream takes) are the ones our server
keeps, from adaptor.ttrpc.streams: each shim connection serves through a `ServerStreams`, the
upstream calls through a `ClientStreams`.

When the pod VM is known to be gone for good (preempted), `fail` answers every call, in flight
or new, with one status that says so, so the shim fails the pod instead of waiting on a VM that
will never answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import cast

from adaptor.ttrpc.codec import (
    DecoderState,
    MalformedMessage,
    encode_request,
    encode_response,
    peek_call,
    peek_status_code,
)
from adaptor.ttrpc.connection import (
    LISTEN_BACKLOG,
    READ_CHUNK,
    bind_unix,
    close_writer,
    unlink_socket,
)
from adaptor.ttrpc.gen import ttrpc_pb2
from adaptor.ttrpc.status import Code, TtrpcError
from adaptor.ttrpc.streams import Call, ClientStreams, ServerStreams

from .dial import Dial
from .moved import INTERRUPTED, OUTPUT_READS, REPEATABLE, MovedCall, MovedProxy, MovedShim

log = logging.getLogger(__name__)

# Told the status code and message of the agent's answer to one rewritten CreateContainer.
Completion = Callable[[int, str], None]
# CreateContainerRequest payload -> new payload, optionally with a completion for its answer.
CreateContainerHook = Callable[[bytes], bytes | tuple[bytes, Completion]]
OnCall = Callable[[str, str, int], None]
# Told that the upstream connection dropped (the adaptor then asks the cloud whether the VM lives).
OnUpstreamLost = Callable[[], None]

CREATE_CONTAINER = ("grpc.AgentService", "CreateContainer")
MAX_IN_FLIGHT = 1024  # per shim connection; reading pauses beyond it
DIAL_ATTEMPT_SECONDS = 10.0  # one TCP/TLS connect attempt (a blackholed VM never refuses)
BACKOFF_FIRST_SECONDS = 0.1
BACKOFF_MAX_SECONDS = 5.0
# At a hand-off, how long answers already sent by the pod VM are still read after a half-close.
MOVE_LINGER_SECONDS = 1.0
# At a hand-off, an output read in flight on a stream that answered within OUTPUT_BUSY_SECONDS
# is awaited, up to OUTPUT_SETTLE_SECONDS, before the pod VM connection is half-closed: output
# is flowing, so its answer is near, and an agent whose TLS layer ends the whole session at the
# FIN (Python's does) would drop an answer it writes after it; the bytes would be gone.
OUTPUT_BUSY_SECONDS = 1.0
OUTPUT_SETTLE_SECONDS = 0.5
OUTPUT_STREAMS_KEPT = 64  # per shim connection, beyond which streams idle that long are forgotten


class AgentProxy:
    """One sandbox's proxy between the shim (unix socket) and the pod VM forwarder (TCP)."""

    def __init__(
        self,
        socket_path: str,
        dial: Dial,
        *,
        sandbox_id: str,
        create_container_hook: CreateContainerHook | None = None,
        on_call: OnCall | None = None,
        on_upstream_lost: OnUpstreamLost | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.sandbox_id = sandbox_id
        self._dial = dial
        self._hook = create_container_hook
        self._on_call = on_call
        self._on_upstream_lost = on_upstream_lost
        # (code, message) every call is answered with once the pod VM is gone for good
        self._failed: tuple[Code, str] | None = None
        # calls waiting for a dial: their task -> (shim, shim stream id, service, method)
        self._waiting: dict[asyncio.Task[None], tuple[_ShimConnection, int, str, str]] = {}
        self._server: asyncio.AbstractServer | None = None
        self._inode: int | None = None
        self._shims: dict[_ShimConnection, asyncio.Task[None]] = {}
        self._shim_came = asyncio.Event()  # set by the first shim connection served
        self._upstream: _Upstream | None = None
        self._dialing: asyncio.Future[_Upstream] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = False
        # shim connections stopped for a hand-off (their sockets move to the successor)
        self._frozen: list[_ShimConnection] = []
        self._finished: _Upstream | None = None  # the pod VM connection a hand-off finished
        self._listener: socket.socket | None = None
        self.last_error = "not connected yet"

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Serve the shim on the agent socket (mode 0600); listening when this returns."""
        if self._server is not None:
            raise RuntimeError("proxy already started")
        sock = bind_unix(self.socket_path, 0o600)
        self._inode = os.lstat(self.socket_path).st_ino
        self._listener = sock
        self._server = await asyncio.start_unix_server(
            self._accept, sock=sock, limit=READ_CHUNK, backlog=LISTEN_BACKLOG
        )

    async def connect(self, timeout_seconds: float) -> None:
        """Dial the forwarder, retrying with backoff (capped at 5 s) until `timeout_seconds`."""
        deadline = time.monotonic() + timeout_seconds
        delay = BACKOFF_FIRST_SECONDS
        while True:
            left = deadline - time.monotonic()
            try:
                await self._ensure_upstream(min(DIAL_ATTEMPT_SECONDS, max(left, 0.001)))
                return
            except TtrpcError:
                left = deadline - time.monotonic()
                if left <= 0 or self._stopped or self._failed is not None:
                    raise TtrpcError(
                        Code.UNAVAILABLE,
                        f"pod VM forwarder unreachable after {timeout_seconds:g}s: "
                        f"{self.last_error}",
                    ) from None
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 2, BACKOFF_MAX_SECONDS)

    async def fail(self, code: Code, message: str) -> None:
        """Answer every call from now on, and every call in flight, with `code` and `message`.

        For a pod VM that is gone for good: the upstream is closed and never dialed again; the
        agent socket stays served (so the shim gets an answer, not a refused connect) until
        `stop`.
        """
        if self._failed is not None:
            return
        self._failed = (code, message)
        log.warning(
            "sandbox %s: answering every agent call with %s: %s",
            self.sandbox_id,
            code.name,
            message,
        )
        for task, (shim, shim_id, service, method) in list(self._waiting.items()):
            shim.answer(shim_id, service, method, code, message)
            task.cancel()
        self._waiting.clear()
        if self._dialing is not None and not self._dialing.done():
            self._dialing.cancel()
        upstream, self._upstream = self._upstream, None
        if upstream is not None:
            for shim, shim_id, service, method in upstream.pending.values():
                shim.answer(shim_id, service, method, code, message)
            upstream.pending.clear()
            await upstream.close()

    @property
    def shims(self) -> int:
        """Shim connections open now (a shim that holds one will StopVM when it closes)."""
        return len(self._shims)

    async def wait_for_shim(self) -> None:
        """Until a shim has connected to the agent socket since `start` (at once if one did).

        After a restart this tells a shim that comes back from one that is gone for good.
        """
        await self._shim_came.wait()

    @property
    def connected(self) -> bool:
        """Whether an upstream connection is up now."""
        return self._upstream is not None and not self._upstream.closed

    async def stop(self) -> None:
        """Close the listener, shim connections and upstream; remove the socket. Idempotent."""
        self._stopped = True
        if self._server is not None:
            self._server.close()
        unlink_socket(self.socket_path, self._inode)
        tasks = [*self._tasks, *self._shims.values()]
        for task in tasks:
            task.cancel()
        if self._dialing is not None and not self._dialing.done():
            self._dialing.cancel()
        upstream, self._upstream = self._upstream, None
        finished, self._finished = self._finished, None  # a hand-off's, if it broke off
        for connection in (upstream, finished):
            if connection is not None:
                await connection.close()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    # --- hand-off to a successor process ----------------------------------------------------

    async def freeze(self, grace_seconds: float) -> MovedProxy:
        """Stop taking calls and make this proxy movable to another process.

        Reading from the shims stops (what they sent already is forwarded); calls that must not
        be sent twice get `grace_seconds` to finish here, and output reads of streams still
        printing get their answer (`OUTPUT_SETTLE_SECONDS`); then the pod VM connection is
        half-closed and read until the pod VM closes it, every answer already written is flushed
        to the shims, and the sockets are returned as duplicates (the originals stay open until
        `release`).
        """
        if self._server is None or self._listener is None:
            raise RuntimeError("proxy not started")
        shims = list(self._shims.items())
        for shim, _task in shims:
            shim.freeze()
        await asyncio.gather(*(task for _shim, task in shims), return_exceptions=True)
        self._frozen = [shim for shim, _task in shims if shim.frozen]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_seconds):
                for shim in self._frozen:
                    await shim.drained()
        await self._settle_output()
        self._stopped = True  # from here on a lost upstream is not news, and nothing dials
        for task in [*self._waiting, *self._tasks]:
            task.cancel()
        self._waiting.clear()
        if self._dialing is not None and not self._dialing.done():
            self._dialing.cancel()
        upstream, self._upstream = self._upstream, None
        if upstream is not None:
            await upstream.finish(MOVE_LINGER_SECONDS)
            upstream.pending.clear()  # the successor sends these again
            self._finished = upstream  # closed by `release`: the sockets need not wait for it
        await asyncio.gather(*(shim.flush(grace_seconds) for shim in self._frozen))
        listener = socket.socket(fileno=os.dup(self._listener.fileno()))
        moved = MovedProxy(listener)
        try:
            moved.shims = [shim.export() for shim in self._frozen if not shim.closing]
        except OSError:
            moved.close()
            raise
        return moved

    async def _settle_output(self) -> None:
        """Before the half-close: until no output read of a stream that is printing is in
        flight, so the agent has no read of it left to answer when the connection ends."""
        if self._upstream is None or self._upstream.closed:
            return  # nothing can answer them
        since = time.monotonic() - OUTPUT_BUSY_SECONDS
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(OUTPUT_SETTLE_SECONDS):
                for shim in self._frozen:
                    await shim.output_settled(since)

    async def adopt(self, moved: MovedProxy) -> None:
        """Serve inherited sockets (a hand-off): the listener, each shim connection from where
        its stream stood, and its calls in flight: the repeatable ones are sent again and
        answered on their original stream ids, the others answered UNAVAILABLE."""
        if self._server is not None:
            raise RuntimeError("proxy already started")
        moved.listener.setblocking(False)
        with contextlib.suppress(FileNotFoundError):
            self._inode = os.lstat(self.socket_path).st_ino
        self._listener = moved.listener
        self._server = await asyncio.start_unix_server(
            self._accept, sock=moved.listener, limit=READ_CHUNK, backlog=LISTEN_BACKLOG
        )
        for item in moved.shims:
            item.sock.setblocking(False)
            reader, writer = await asyncio.open_unix_connection(sock=item.sock, limit=READ_CHUNK)
            streams = ServerStreams.resume(
                peek_call,
                item.decoder,
                item.last_stream_id,
                (call.stream_id for call in item.calls),
            )
            shim = _ShimConnection(self, reader, writer, streams)
            for call in item.calls:
                if call.request:
                    self.forward(shim, call.stream_id, call.service, call.method, call.request)
                else:
                    shim.answer(
                        call.stream_id, call.service, call.method, Code.UNAVAILABLE, INTERRUPTED
                    )
            self._run_shim(shim)

    async def release(self) -> None:
        """After a hand-off: close this process's copies of the sockets. The successor holds
        them too, so no shim sees its connection close, and the socket file stays."""
        self._stopped = True
        if self._server is not None:
            self._server.close()
        for shim in self._frozen:
            shim.close_quietly()
        self._frozen = []
        finished, self._finished = self._finished, None
        if finished is not None:
            await finished.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    # --- upstream ----------------------------------------------------------------------------

    async def _ensure_upstream(self, attempt_seconds: float = DIAL_ATTEMPT_SECONDS) -> _Upstream:
        """The live upstream, dialing once if there is none (concurrent callers share a dial)."""
        upstream = self._upstream
        if upstream is not None and not upstream.closed:
            return upstream
        if self._stopped:
            raise TtrpcError(Code.UNAVAILABLE, "proxy stopped")
        if self._failed is not None:
            raise TtrpcError(*self._failed)
        if self._dialing is None:
            self._dialing = asyncio.get_running_loop().create_future()
            dialing = self._dialing
            try:
                async with asyncio.timeout(attempt_seconds):
                    reader, writer = await self._dial()
            except TtrpcError as exc:
                self.last_error = exc.message
                dialing.set_exception(exc)
            except TimeoutError:
                timed_out = f"dial timed out after {attempt_seconds:g}s"
                if self.last_error in ("not connected yet", "") or "dial timed out" in (
                    self.last_error
                ):
                    self.last_error = timed_out
                else:  # never hide a real reason (a certificate refused) behind a short last try
                    self.last_error = f"{self.last_error.split(' (then: ')[0]} (then: {timed_out})"
                dialing.set_exception(TtrpcError(Code.UNAVAILABLE, self.last_error))
            except (OSError, ValueError) as exc:
                self.last_error = str(exc) or type(exc).__name__
                dialing.set_exception(TtrpcError(Code.UNAVAILABLE, self.last_error))
            else:
                if self._stopped:
                    await close_writer(writer)
                    dialing.set_exception(TtrpcError(Code.UNAVAILABLE, "proxy stopped"))
                else:
                    self._upstream = _Upstream(self, reader, writer)
                    log.info("sandbox %s: connected to the pod VM forwarder", self.sandbox_id)
                    dialing.set_result(self._upstream)
            finally:
                self._dialing = None
                if not dialing.done():
                    dialing.cancel()
            return await dialing
        shared = self._dialing
        try:
            return await asyncio.shield(shared)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if shared.cancelled() and task is not None and not task.cancelling():
                raise TtrpcError(Code.UNAVAILABLE, "dial abandoned") from None
            raise

    def upstream_lost(self, upstream: _Upstream, why: str) -> None:
        """Called by the upstream reader: fail its in-flight calls; the next call re-dials."""
        if self._upstream is upstream:
            self._upstream = None
        self.last_error = why
        if not self._stopped and self._failed is None:
            log.warning("sandbox %s: pod VM connection lost: %s", self.sandbox_id, why)
            if self._on_upstream_lost is not None:
                try:
                    self._on_upstream_lost()
                except Exception:
                    log.exception("agent proxy on_upstream_lost callback failed")
        for shim, shim_id, service, method in upstream.pending.values():
            message = f"pod VM connection lost: {why}"
            shim.answer(shim_id, service, method, Code.UNAVAILABLE, message)
        upstream.pending.clear()

    # --- shim side ---------------------------------------------------------------------------

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._stopped:
            writer.close()
            return
        self._run_shim(_ShimConnection(self, reader, writer))

    def _run_shim(self, shim: _ShimConnection) -> None:
        task = asyncio.get_running_loop().create_task(shim.run(), name="agent-proxy-shim")
        self._shims[shim] = task
        self._shim_came.set()
        task.add_done_callback(lambda _t: self._shims.pop(shim, None))

    def forward(
        self, shim: _ShimConnection, shim_id: int, service: str, method: str, data: bytes
    ) -> None:
        """Route one Request frame's data from a shim upstream (or answer it here)."""
        if self._failed is not None:
            shim.answer(shim_id, service, method, *self._failed)
            return
        shim.calls[shim_id] = (service, method, data if (service, method) in REPEATABLE else b"")
        if self._hook is not None and (service, method) == CREATE_CONTAINER:
            try:
                data, completion = self._rewrite(data)
            except TtrpcError as exc:
                shim.answer(shim_id, service, method, exc.code, exc.message)
                return
            if completion is not None:
                shim.completions[shim_id] = completion
        upstream = self._upstream
        if upstream is not None and not upstream.closed:
            upstream.send(shim, shim_id, service, method, data)
            return
        task = asyncio.get_running_loop().create_task(
            self._forward_after_dial(shim, shim_id, service, method, data)
        )
        self._tasks.add(task)
        self._waiting[task] = (shim, shim_id, service, method)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda t: self._waiting.pop(t, None))

    async def _forward_after_dial(
        self, shim: _ShimConnection, shim_id: int, service: str, method: str, data: bytes
    ) -> None:
        try:
            upstream = await self._ensure_upstream()
        except TtrpcError as exc:
            self._no_longer_waiting()
            if self._failed is not None:
                shim.answer(shim_id, service, method, *self._failed)
                return
            message = f"pod VM unreachable: {exc.message}"
            shim.answer(shim_id, service, method, Code.UNAVAILABLE, message)
            return
        self._no_longer_waiting()
        upstream.send(shim, shim_id, service, method, data)

    def _no_longer_waiting(self) -> None:
        """The current call got its dial outcome: `fail` must not answer it a second time."""
        task = asyncio.current_task()
        if task is not None:
            self._waiting.pop(task, None)

    def _rewrite(self, data: bytes) -> tuple[bytes, Completion | None]:
        assert self._hook is not None
        request = ttrpc_pb2.Request.FromString(data)
        completion: Completion | None = None
        try:
            result = self._hook(bytes(request.payload))
            if isinstance(result, tuple):
                payload, completion = result
            else:
                payload = result
        except TtrpcError:
            raise
        except Exception as exc:
            log.exception("sandbox %s: CreateContainer hook failed", self.sandbox_id)
            raise TtrpcError(Code.INTERNAL, f"CreateContainer rewrite failed: {exc}") from exc
        rewritten = encode_request(
            request.service,
            request.method,
            payload,
            request.timeout_nano,
            [(kv.key, kv.value) for kv in request.metadata],
        )
        return rewritten, completion  # one grown over the size limit is refused when sent

    def report(self, service: str, method: str, code: int) -> None:
        if self._on_call is not None:
            try:
                self._on_call(service, method, code)
            except Exception:
                log.exception("agent proxy on_call callback failed")


class _Upstream:
    """The one connection to the forwarder; its stream ids are ours (a `ClientStreams`)."""

    def __init__(
        self, proxy: AgentProxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._proxy = proxy
        self._reader = reader
        self._writer = writer
        self._streams = ClientStreams()
        self.closed = False
        self.moving = False  # a hand-off: calls still pending are left to the successor
        # upstream stream id -> (shim connection, shim stream id, service, method)
        self.pending: dict[int, tuple[_ShimConnection, int, str, str]] = {}
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._read_loop(), name="agent-proxy-upstream")

    def send(
        self, shim: _ShimConnection, shim_id: int, service: str, method: str, data: bytes
    ) -> None:
        try:
            up_id = self._streams.call(data)
        except TtrpcError as exc:
            shim.answer(shim_id, service, method, exc.code, exc.message)
            if exc.code == Code.UNAVAILABLE:
                self._writer.close()  # ids used up: the next call dials a fresh connection
            return
        self.pending[up_id] = (shim, shim_id, service, method)
        self._writer.write(self._streams.data_to_send())

    async def drain(self) -> None:
        await self._writer.drain()

    async def _read_loop(self) -> None:
        streams = self._streams
        why = "connection closed by the pod VM"
        pending = self.pending
        try:
            while True:
                chunk = await self._reader.read(READ_CHUNK)
                if not chunk:
                    break
                for answer in streams.receive(chunk):
                    entry = pending.pop(answer.stream_id, None)
                    if entry is not None:
                        shim, shim_id, service, method = entry
                        shim.relay(shim_id, service, method, answer.data)
        except (ConnectionError, OSError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        except asyncio.CancelledError:
            why = "proxy stopped"
            raise
        finally:
            self.closed = True
            self._writer.close()
            if not self.moving:
                self._proxy.upstream_lost(self, why)

    async def finish(self, limit_seconds: float) -> None:
        """Before a hand-off: half-close, and relay the answers already on their way until the
        pod VM closes too. TLS has no half-close of its own, so under TLS the TCP connection's
        write side is shut (no close_notify): the forwarder sees its input end all the same."""
        self.moving = True
        if self.closed:
            return
        with contextlib.suppress(TimeoutError, ConnectionError, OSError):
            async with asyncio.timeout(limit_seconds):
                if self._writer.can_write_eof():
                    self._writer.write_eof()
                else:
                    await self._writer.drain()  # every request sent, then the TCP half-close
                    raw = self._writer.get_extra_info("socket")
                    if raw is None:
                        return
                    # asyncio's socket wrapper refuses shutdown(); a duplicate shuts the same one
                    with socket.socket(fileno=os.dup(raw.fileno())) as duplicate:
                        duplicate.shutdown(socket.SHUT_WR)
                await asyncio.shield(self._task)

    async def close(self) -> None:
        self.closed = True
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await close_writer(self._writer)


class _ShimConnection:
    """One connection from the shim: its streams (adaptor.ttrpc.streams keeps the protocol's
    rules, as for the server), each new call forwarded."""

    def __init__(
        self,
        proxy: AgentProxy,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        streams: ServerStreams[tuple[str, str]] | None = None,
    ) -> None:
        self._proxy = proxy
        self._reader = reader
        self._writer = writer
        self._streams = streams or ServerStreams(peek_call)
        self._room = asyncio.Event()
        # shim stream id -> completion of a rewritten CreateContainer awaiting its answer
        self.completions: dict[int, Completion] = {}
        # shim stream id -> (service, method, request data if safe to repeat else b"")
        self.calls: dict[int, tuple[str, str, bytes]] = {}
        self.frozen = False
        self._answered = asyncio.Event()  # set on each answer while frozen
        # output read request (container, exec, length) -> when one was last answered
        self._output_answered: dict[bytes, float] = {}

    @property
    def closing(self) -> bool:
        return self._writer.is_closing()

    @property
    def in_flight(self) -> int:
        """Calls taken from the shim and not answered yet."""
        return self._streams.in_flight

    def freeze(self) -> None:
        """Stop reading: the bytes already received are still dispatched, then `run` returns
        without closing the connection (its socket moves to another process)."""
        self.frozen = True
        transport = cast(asyncio.Transport, self._writer.transport)
        if not transport.is_closing():
            transport.pause_reading()
        self._reader.feed_eof()
        self._room.set()

    async def drained(self) -> None:
        """Until every call still in flight is one that is safe to send again."""
        while any(not data for _s, _m, data in self.calls.values()):
            self._answered.clear()
            await self._answered.wait()

    async def output_settled(self, since: float) -> None:
        """Until no output read is in flight for a stream that answered one at `since` or later
        (a stream still printing; an idle one's read may wait for good)."""
        while any(
            (service, method) in OUTPUT_READS and self._output_answered.get(data, 0.0) >= since
            for service, method, data in self.calls.values()
        ):
            self._answered.clear()
            await self._answered.wait()

    async def flush(self, limit_seconds: float) -> None:
        """Until every answer written here reached the shim's socket (or the limit)."""
        transport = self._writer.transport
        if transport.is_closing():
            return
        transport.set_write_buffer_limits(high=0)
        with contextlib.suppress(TimeoutError, ConnectionError, OSError):
            async with asyncio.timeout(limit_seconds):
                await self._writer.drain()

    def export(self) -> MovedShim:
        """A duplicate of the socket, with where its stream stands and its calls in flight."""
        sock = self._writer.get_extra_info("socket")
        calls = tuple(MovedCall(i, s, m, data) for i, (s, m, data) in self.calls.items())
        state: DecoderState = self._streams.export()
        return MovedShim(
            socket.socket(fileno=os.dup(sock.fileno())), self._streams.last_stream_id, state, calls
        )

    def close_quietly(self) -> None:
        """Close this process's socket; a copy lives on elsewhere, so the shim sees nothing."""
        self._writer.transport.close()

    async def run(self) -> None:
        streams = self._streams
        proxy = self._proxy
        try:
            while True:
                chunk = await self._reader.read(READ_CHUNK)
                if not chunk:
                    break
                for event in streams.receive(chunk):
                    if isinstance(event, Call):
                        service, method = event.request
                        proxy.forward(self, event.stream_id, service, method, event.data)
                self._write()  # refusals
                upstream = proxy._upstream
                if upstream is not None and not upstream.closed:
                    with contextlib.suppress(ConnectionError, OSError):
                        await upstream.drain()  # backpressure from the pod VM
                if streams.in_flight >= MAX_IN_FLIGHT:
                    self._room.clear()
                    await self._room.wait()
        except (ConnectionError, OSError):
            self.frozen = False  # broken: nothing worth moving
        finally:
            if not self.frozen:
                await close_writer(self._writer)

    def relay(self, shim_id: int, service: str, method: str, data: bytes) -> None:
        """Send an upstream Response's bytes back unchanged under the shim's stream id; one
        that is not a Response fails that call alone, with a status."""
        try:
            code = peek_status_code(data)
        except MalformedMessage as exc:
            log.warning("%s/%s: malformed response from the pod VM: %s", service, method, exc)
            self.answer(
                shim_id,
                service,
                method,
                Code.INTERNAL,
                f"malformed response from the pod VM ({len(data)} bytes): {exc}",
            )
            return
        if (service, method) in OUTPUT_READS:
            call = self.calls.get(shim_id)
            if call is not None:
                self._note_output(call[2])
        self._streams.respond(shim_id, data)
        self._done(shim_id)
        if self._proxy._on_call is not None or self.completions:
            self._proxy.report(service, method, code)
            self._complete(shim_id, code, data)
        self._write()

    def _note_output(self, request: bytes) -> None:
        now = time.monotonic()
        if len(self._output_answered) >= OUTPUT_STREAMS_KEPT:  # the execs that ended go
            busy = now - OUTPUT_BUSY_SECONDS
            kept = {r: t for r, t in self._output_answered.items() if t >= busy}
            self._output_answered = kept
        self._output_answered[request] = now

    def answer(self, shim_id: int, service: str, method: str, code: Code, message: str) -> None:
        """Answer a shim stream with a status produced by the proxy itself."""
        self._streams.respond(shim_id, encode_response(b"", code, message))
        self._done(shim_id)
        self._proxy.report(service, method, code)
        completion = self.completions.pop(shim_id, None)
        if completion is not None:
            _call_completion(completion, int(code), message)
        self._write()

    def _write(self) -> None:
        data = self._streams.data_to_send()
        if data and not self._writer.is_closing():
            self._writer.write(data)

    def _complete(self, shim_id: int, code: int, response: bytes) -> None:
        completion = self.completions.pop(shim_id, None)
        if completion is None:
            return
        message = ""
        if code:
            with contextlib.suppress(Exception):
                message = ttrpc_pb2.Response.FromString(response).status.message
        _call_completion(completion, code, message)

    def _done(self, shim_id: int) -> None:
        self.calls.pop(shim_id, None)
        if self._streams.in_flight < MAX_IN_FLIGHT:
            self._room.set()
        if self.frozen:
            self._answered.set()


def _call_completion(completion: Completion, code: int, message: str) -> None:
    try:
        completion(code, message)
    except Exception:
        log.exception("CreateContainer completion callback failed")
