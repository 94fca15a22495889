"""A pod VM's kata-agent as the hand-off tests need it, over plain TCP (the forwarder's side).

Containers whose exit and output the test drives: `WaitProcess` blocks until the test ends the
container, `ReadStdout` long-polls the container's output (an empty answer is EOF), `GetOOMEvent`
blocks for good, `Health.Check` answers SERVING. Calls on a connection that closes are cancelled
(as a ttrpc server cancels its handlers' context), so a read cancelled that way consumes nothing.

The shim side (`FakeShim`) holds one agent connection per sandbox as Kata's Go shim does: a
long-lived `WaitProcess` on the pause container, a blocking `GetOOMEvent`, a `ReadStdout` loop and
a `WaitProcess` on the workload container.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from adaptor.ttrpc import Client, TtrpcError
from adaptor.ttrpc.gen import agent_pb2, health_pb2
from adaptor.ttrpc.server import CallContext, Server

AGENT = "grpc.AgentService"
PAUSE = "pause"
WORKLOAD = "work"
READ_LEN = 32 * 1024


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def read_stream_request(container_id: str, length: int = READ_LEN) -> bytes:
    """ReadStreamRequest{container_id=1, exec_id=2, len=3}."""
    cid = container_id.encode()
    return (
        b"\x0a"
        + _varint(len(cid))
        + cid
        + b"\x12"
        + _varint(len(cid))
        + cid
        + b"\x18"
        + (_varint(length))
    )


def parse_read_stream_request(data: bytes) -> tuple[str, int]:
    """(container_id, len) of a ReadStreamRequest."""
    pos, cid, length = 0, "", READ_LEN
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        if key & 7 == 2:
            size, pos = _read_varint(data, pos)
            if key >> 3 == 1:
                cid = data[pos : pos + size].decode()
            pos += size
        else:
            value, pos = _read_varint(data, pos)
            if key >> 3 == 3:
                length = value
    return cid, length


def read_stream_response(data: bytes) -> bytes:
    """ReadStreamResponse{data=1}."""
    return b"\x0a" + _varint(len(data)) + data if data else b""


def parse_read_stream_response(payload: bytes) -> bytes:
    if not payload:
        return b""
    size, pos = _read_varint(payload, 1)
    return payload[pos : pos + size]


@dataclass
class Container:
    exit_code: asyncio.Future[int] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    output: bytearray = field(default_factory=bytearray)
    closed: bool = False
    readable: asyncio.Event = field(default_factory=asyncio.Event)

    def write(self, data: bytes) -> None:
        self.output += data
        self.readable.set()

    def end(self, code: int) -> None:
        self.closed = True
        self.readable.set()
        if not self.exit_code.done():
            self.exit_code.set_result(code)


class FakeAgent:
    """One pod VM's agent on 127.0.0.1:<port>; `connections` counts the ones accepted."""

    def __init__(self) -> None:
        self.containers = {PAUSE: Container(), WORKLOAD: Container()}
        self.server = Server()
        self.server.register(
            AGENT,
            {
                "WaitProcess": self._wait,
                "ReadStdout": self._read,
                "ReadStderr": self._read_stderr,
                "GetOOMEvent": self._oom,
            },
        )
        self.server.register("grpc.Health", {"Check": self._check})
        self._listener: asyncio.Server | None = None
        self.connections = 0
        self.port = 0

    async def start(self) -> None:
        def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            self.server._accept(reader, writer)  # the ttrpc server's own connection handling

        self._listener = await asyncio.start_server(accept, "127.0.0.1", 0)
        self.port = int(self._listener.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
        await self.server.close(0)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _check(self, _ctx: CallContext, _payload: bytes) -> bytes:
        return bytes(
            health_pb2.HealthCheckResponse(
                status=health_pb2.HealthCheckResponse.SERVING
            ).SerializeToString()
        )

    async def _wait(self, _ctx: CallContext, payload: bytes) -> bytes:
        request = agent_pb2.WaitProcessRequest.FromString(payload)
        code = await asyncio.shield(self.containers[request.container_id].exit_code)
        return bytes(agent_pb2.WaitProcessResponse(status=code).SerializeToString())

    async def _read(self, _ctx: CallContext, payload: bytes) -> bytes:
        cid, length = parse_read_stream_request(payload)
        container = self.containers[cid]
        while not container.output and not container.closed:
            container.readable.clear()
            await container.readable.wait()
        # nothing awaits from here on: a cancelled read never takes bytes
        data = bytes(container.output[:length])
        del container.output[:length]
        return read_stream_response(data)

    async def _read_stderr(self, _ctx: CallContext, _payload: bytes) -> bytes:
        await asyncio.Event().wait()
        return b""

    async def _oom(self, _ctx: CallContext, _payload: bytes) -> bytes:
        await asyncio.Event().wait()
        return b""


class FakeShim:
    """One sandbox's shim: one agent connection, the Go shim's long-lived calls on it."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.client: Client | None = None
        self.output = bytearray()
        self.errors: list[str] = []
        self.pause_wait: asyncio.Task[bytes] | None = None
        self.work_wait: asyncio.Task[bytes] | None = None
        self._tasks: list[asyncio.Task[object]] = []

    async def start(self) -> None:
        self.client = await Client.connect_unix(self.socket_path)
        client = self.client
        loop = asyncio.get_running_loop()
        self.pause_wait = loop.create_task(client.call(AGENT, "WaitProcess", _wait(PAUSE)))
        self.work_wait = loop.create_task(client.call(AGENT, "WaitProcess", _wait(WORKLOAD)))
        self._tasks = [
            loop.create_task(self._oom()),
            loop.create_task(self._read_loop()),
        ]

    async def _oom(self) -> None:
        assert self.client is not None
        try:
            await self.client.call(AGENT, "GetOOMEvent", b"")
        except TtrpcError as exc:
            self.errors.append(f"GetOOMEvent: {exc.code.name}: {exc.message}")

    async def _read_loop(self) -> None:
        assert self.client is not None
        await read_stdout(self.client, WORKLOAD, self.output, self.errors)

    @property
    def open(self) -> bool:
        return self.client is not None and not self.client.closed

    async def exit_code(self) -> int:
        assert self.work_wait is not None
        payload = await self.work_wait
        return int(agent_pb2.WaitProcessResponse.FromString(payload).status)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for waiting in (self.pause_wait, self.work_wait):
            if waiting is not None:
                waiting.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.client is not None:
            await self.client.close()


def _wait(container_id: str) -> bytes:
    request = agent_pb2.WaitProcessRequest(container_id=container_id, exec_id=container_id)
    return bytes(request.SerializeToString())


async def read_stdout(client: Client, container: str, output: bytearray, errors: list[str]) -> None:
    """Read a container's stdout into `output` as a shim does, one ReadStdout after another,
    until EOF (an empty answer) or a failed call (noted in `errors`)."""
    while True:
        try:
            payload = await client.call(AGENT, "ReadStdout", read_stream_request(container))
        except TtrpcError as exc:
            errors.append(f"ReadStdout: {exc.code.name}: {exc.message}")
            return
        data = parse_read_stream_response(payload)
        if not data:
            return  # EOF
        output += data
