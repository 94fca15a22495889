"""An agent proxy's sockets move to another proxy (as between two processes at a hand-off) with
calls in flight, a half-sent request and a call that must not be sent twice."""

from __future__ import annotations

import asyncio
import socket
import struct
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adaptor.proxy import AgentProxy, tcp_dialer
from adaptor.proxy.moved import INTERRUPTED, MovedCall, MovedProxy, MovedShim
from adaptor.ttrpc import Client, Code
from adaptor.ttrpc.codec import (
    HEADER_LENGTH,
    DecoderState,
    MessageType,
    encode_frame,
    encode_request,
)
from adaptor.ttrpc.gen import agent_pb2, ttrpc_pb2
from adaptor.ttrpc.server import CallContext
from tests.adaptor.daemon_proc import exists
from tests.adaptor.fake_agent import (
    AGENT,
    PAUSE,
    WORKLOAD,
    FakeAgent,
    parse_read_stream_response,
    read_stream_request,
)


@pytest.fixture
async def agent() -> AsyncIterator[FakeAgent]:
    agent = FakeAgent()
    slow_started = asyncio.Event()

    async def slow(_ctx: CallContext, payload: bytes) -> bytes:
        slow_started.set()
        await asyncio.sleep(0.3)
        return payload

    agent.server.register(AGENT, {"StartContainer": slow})
    agent.slow_started = slow_started  # type: ignore[attr-defined]
    await agent.start()
    try:
        yield agent
    finally:
        await agent.stop()


@pytest.fixture
def sock_dir() -> AsyncIterator[Path]:
    with tempfile.TemporaryDirectory(prefix="pp-") as d:
        yield Path(d)  # type: ignore[misc]


def read_response(sock: socket.socket) -> tuple[int, ttrpc_pb2.Response]:
    """One Response frame read from a blocking socket: its stream id and message."""
    header = b""
    while len(header) < HEADER_LENGTH:
        header += sock.recv(HEADER_LENGTH - len(header))
    length, stream_id, msg_type, _flags = struct.unpack(">IIBB", header)
    assert msg_type == MessageType.RESPONSE
    data = b""
    while len(data) < length:
        data += sock.recv(length - len(data))
    return stream_id, ttrpc_pb2.Response.FromString(data)


def proxy_for(path: Path, agent: FakeAgent) -> AgentProxy:
    return AgentProxy(str(path), tcp_dialer("127.0.0.1", agent.port, None), sandbox_id="sb")


def wait_request(container: str) -> bytes:
    return bytes(
        agent_pb2.WaitProcessRequest(container_id=container, exec_id=container).SerializeToString()
    )


async def test_sockets_move_with_calls_in_flight(agent: FakeAgent, sock_dir: Path) -> None:
    path = sock_dir / "agent.ttrpc"
    old = proxy_for(path, agent)
    await old.start()
    await old.connect(5)
    client = await Client.connect_unix(str(path))
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.connect(str(path))
    try:
        wait = asyncio.create_task(client.call(AGENT, "WaitProcess", wait_request(PAUSE)))
        read = asyncio.create_task(client.call(AGENT, "ReadStdout", read_stream_request(WORKLOAD)))
        start = asyncio.create_task(client.call(AGENT, "StartContainer", b"\x0a\x01c"))
        await asyncio.wait_for(agent.slow_started.wait(), 5)  # type: ignore[attr-defined]
        # half a request on another connection: the rest comes after the move
        frame = encode_frame(1, MessageType.REQUEST, encode_request("grpc.Health", "Check", b""))
        raw.sendall(frame[:7])
        await asyncio.sleep(0.05)

        moved = await old.freeze(5)
        # the call that must not be sent twice was answered before anything moved
        assert start.done() and await start == b"\x0a\x01c"
        assert not wait.done() and not read.done()
        assert len(moved.shims) == 2
        methods = sorted(c.method for shim in moved.shims for c in shim.calls)
        assert methods == ["ReadStdout", "WaitProcess"]
        assert all(c.request for shim in moved.shims for c in shim.calls)
        partial = [s for s in moved.shims if s.decoder.partial]
        assert [s.decoder.partial for s in partial] == [frame[:7]]

        new = proxy_for(path, agent)
        await new.adopt(moved)
        await old.release()
        assert exists(path)  # the socket file stays, the same socket

        agent.containers[WORKLOAD].write(b"after the move")
        assert parse_read_stream_response(await asyncio.wait_for(read, 5)) == b"after the move"
        raw.sendall(frame[7:])  # the request completes on the new side
        raw.settimeout(5)
        stream_id, response = await asyncio.to_thread(read_response, raw)
        assert (stream_id, response.status.code) == (1, 0)
        agent.containers[PAUSE].end(137)
        reply = agent_pb2.WaitProcessResponse.FromString(await asyncio.wait_for(wait, 5))
        assert reply.status == 137
        assert not client.closed
        # new connections are taken by the new proxy on the same socket
        async with await Client.connect_unix(str(path)) as other:
            assert await other.call("grpc.Health", "Check", b"") == b"\x08\x01"
        await new.stop()
        assert not exists(path)
    finally:
        raw.close()
        await client.close()
        await old.stop()


async def test_a_call_that_cannot_move_is_answered_unavailable(
    agent: FakeAgent, sock_dir: Path
) -> None:
    """A call still unanswered after the grace is neither lost nor sent twice."""
    path = sock_dir / "agent.ttrpc"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    moved = MovedProxy(
        listener,
        [
            MovedShim(
                ours,
                5,
                DecoderState(),
                (
                    MovedCall(3, AGENT, "StartContainer"),
                    MovedCall(
                        5,
                        AGENT,
                        "WaitProcess",
                        encode_request(AGENT, "WaitProcess", wait_request(PAUSE)),
                    ),
                ),
            )
        ],
    )
    proxy = proxy_for(path, agent)
    try:
        await proxy.adopt(moved)
        theirs.settimeout(5)
        stream_id, response = await asyncio.to_thread(read_response, theirs)
        assert stream_id == 3
        assert (response.status.code, response.status.message) == (Code.UNAVAILABLE, INTERRUPTED)
        agent.containers[PAUSE].end(3)
        stream_id, response = await asyncio.to_thread(read_response, theirs)
        assert stream_id == 5 and response.status.code == 0
        assert agent_pb2.WaitProcessResponse.FromString(response.payload).status == 3
    finally:
        await proxy.stop()
        theirs.close()


async def test_freeze_before_start_is_refused(agent: FakeAgent, sock_dir: Path) -> None:
    proxy = proxy_for(sock_dir / "agent.ttrpc", agent)
    with pytest.raises(RuntimeError, match="not started"):
        await proxy.freeze(1)
