"""Our server and client against each other, and our server against raw bytes."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from adaptor.ttrpc import Client, Code, Server, TtrpcError
from adaptor.ttrpc.codec import MAX_DATA_LENGTH, encode_frame, encode_request
from adaptor.ttrpc.gen import ttrpc_pb2

from .conftest import exchange, make_server, status_of


async def test_echo_carries_payload_metadata_and_timeout(server_path: str) -> None:
    async with await Client.connect_unix(server_path) as client:
        md = [("traceparent", "00-abc"), ("k", "1"), ("k", "2")]
        body = await client.call(
            "test.Echo", "Echo", b"\x00\x01", metadata=md, timeout_nano=7_000_000_000
        )
    echoed = ttrpc_pb2.Request.FromString(body)
    assert echoed.payload == b"\x00\x01"
    assert echoed.timeout_nano == 7_000_000_000
    assert [(kv.key, kv.value) for kv in echoed.metadata] == md


async def test_socket_mode_and_cleanup(sock_dir: Path) -> None:
    server = make_server()
    path = str(sock_dir / "sub" / "s.sock")
    await server.start_unix(path, mode=0o600)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    await server.close()
    assert not os.path.exists(path)  # noqa: ASYNC240
    # a stale socket from a dead process is replaced; a regular file is refused
    again = make_server()
    await again.start_unix(path)
    await again.close()
    Path(path).write_text("not a socket")  # noqa: ASYNC240
    with pytest.raises(FileExistsError):
        await make_server().start_unix(path)
    assert Path(path).read_text() == "not a socket"  # noqa: ASYNC240


@pytest.mark.parametrize(
    ("service", "method", "code", "message"),
    [
        ("nope.Service", "Echo", Code.UNIMPLEMENTED, "service nope.Service"),
        ("test.Echo", "Nope", Code.UNIMPLEMENTED, "method Nope"),
        ("test.Echo", "Fail", Code.NOT_FOUND, "no such thing"),
        ("test.Echo", "Crash", Code.UNKNOWN, "handler bug"),
    ],
)
async def test_statuses(
    server_path: str, service: str, method: str, code: Code, message: str
) -> None:
    async with await Client.connect_unix(server_path) as client:
        with pytest.raises(TtrpcError) as info:
            await client.call(service, method, b"")
        assert (info.value.code, info.value.message) == (code, message)
        # the connection is still usable afterwards
        assert await client.call("grpc.Health", "Check", b"") == b""


async def test_deadline_cancels_handler(server_path: str) -> None:
    # raw frames so the server's own deadline answers, not the client's
    data = encode_request("test.Echo", "Slow", b"30", timeout_nano=50_000_000)
    events = await exchange(server_path, encode_frame(1, 1, data), want=1)
    assert status_of(events[0])[:2] == (Code.DEADLINE_EXCEEDED, "context deadline exceeded")
    data = encode_request("test.Echo", "Slow", b"30", timeout_nano=-1)
    events = await exchange(server_path, encode_frame(1, 1, data), want=1)
    assert status_of(events[0])[0] == Code.DEADLINE_EXCEEDED


async def test_client_deadline(server_path: str) -> None:
    async with await Client.connect_unix(server_path) as client:
        with pytest.raises(TtrpcError) as info:
            await client.call("test.Echo", "Slow", b"30", timeout_nano=50_000_000)
        assert info.value.code == Code.DEADLINE_EXCEEDED
        assert await client.call("test.Echo", "Slow", b"0") == b"slept"


async def test_concurrent_calls_complete_out_of_order(server_path: str) -> None:
    async with await Client.connect_unix(server_path) as client:
        slow = asyncio.create_task(client.call("test.Echo", "Slow", b"0.5"))
        fast = await asyncio.gather(
            *(client.call("test.Echo", "Echo", str(i).encode()) for i in range(200))
        )
        assert not slow.done()
        assert [ttrpc_pb2.Request.FromString(b).payload for b in fast] == [
            str(i).encode() for i in range(200)
        ]
        assert await slow == b"slept"


async def test_oversized_frame_answers_resource_exhausted_and_connection_stays(
    server_path: str,
) -> None:
    big = MAX_DATA_LENGTH + 10
    oversized = big.to_bytes(4, "big") + (1).to_bytes(4, "big") + b"\x01\x00" + b"\x00" * big
    follow = encode_frame(3, 1, encode_request("grpc.Health", "Check", b""))
    events = await exchange(server_path, oversized + follow, want=2)
    assert [e.stream_id for e in events] == [1, 3]
    assert status_of(events[0])[0] == Code.RESOURCE_EXHAUSTED
    assert status_of(events[1]) == (Code.OK, "", b"")


async def test_stream_id_rules(server_path: str) -> None:
    check = encode_request("grpc.Health", "Check", b"")
    frames = [encode_frame(sid, 1, check) for sid in (2, 5, 5, 3, 7)]
    events = await exchange(server_path, b"".join(frames), want=5)
    codes: dict[int, list[int]] = {e.stream_id: [] for e in events}
    for e in events:
        codes[e.stream_id].append(status_of(e)[0])
    assert codes[2] == [Code.INVALID_ARGUMENT]
    assert sorted(codes[5]) == [Code.OK, Code.INVALID_ARGUMENT]
    assert codes[3] == [Code.INVALID_ARGUMENT]
    assert codes[7] == [Code.OK]


async def test_garbage_request_and_unknown_types(server_path: str) -> None:
    frames = (
        encode_frame(1, 1, b"\xff\xff\xff")  # undecodable Request
        + encode_frame(3, 2, b"ignored")  # a Response sent to a server
        + encode_frame(5, 9, b"ignored")  # an unknown type
        + encode_frame(7, 1, encode_request("grpc.Health", "Check", b""))
    )
    events = await exchange(server_path, frames, want=2)
    assert [e.stream_id for e in events] == [1, 7]
    code, message, _ = status_of(events[0])
    assert code == Code.INVALID_ARGUMENT and message.startswith("unmarshal request error")
    assert status_of(events[1])[0] == Code.OK


async def test_close_drains_in_flight_then_cancels(sock_dir: Path) -> None:
    server = make_server()
    path = str(sock_dir / "s.sock")
    await server.start_unix(path)
    client = await Client.connect_unix(path)
    quick = asyncio.create_task(client.call("test.Echo", "Slow", b"0.2"))
    stuck = asyncio.create_task(client.call("test.Echo", "Slow", b"30"))
    await asyncio.sleep(0.05)
    assert server.in_flight == 2
    await asyncio.wait_for(server.close(grace_seconds=1.0), 5)
    assert await quick == b"slept"
    with pytest.raises(TtrpcError) as info:
        await stuck
    assert info.value.code == Code.UNAVAILABLE
    assert server.in_flight == 0
    await client.close()
    with pytest.raises(TtrpcError) as info:
        await Client.connect_unix(path)
    assert info.value.code == Code.UNAVAILABLE


async def test_client_refuses_oversized_request(server_path: str) -> None:
    async with await Client.connect_unix(server_path) as client:
        with pytest.raises(TtrpcError) as info:
            await client.call("test.Echo", "Echo", b"x" * MAX_DATA_LENGTH)
        assert info.value.code == Code.RESOURCE_EXHAUSTED
        assert await client.call("grpc.Health", "Check", b"") == b""


async def test_client_fails_pending_calls_when_server_goes(sock_dir: Path) -> None:
    server = Server()
    server.register("test.Echo", {"Slow": make_server().lookup("test.Echo", "Slow")})
    path = str(sock_dir / "s.sock")
    await server.start_unix(path)
    client = await Client.connect_unix(path)
    pending = asyncio.create_task(client.call("test.Echo", "Slow", b"30"))
    await asyncio.sleep(0.05)
    await server.close(grace_seconds=0)
    with pytest.raises(TtrpcError) as info:
        await pending
    assert info.value.code == Code.UNAVAILABLE
    assert client.closed
    with pytest.raises(TtrpcError):
        await client.call("test.Echo", "Slow", b"0")
    await client.close()


async def test_a_burst_of_connections_is_queued_not_refused(server_path: str) -> None:
    # Shims connect once per call: a burst larger than asyncio's default backlog (100), all
    # arriving before the loop accepts any, must still be served.
    async def one(i: int) -> bytes:
        async with await Client.connect_unix(server_path) as client:
            return await client.call("test.Echo", "Echo", str(i).encode(), timeout_nano=10**10)

    answers = await asyncio.gather(*(one(i) for i in range(300)))
    assert [ttrpc_pb2.Request.FromString(a).payload for a in answers] == [
        str(i).encode() for i in range(300)
    ]


async def test_a_socket_path_of_the_maximum_length_binds() -> None:
    # sun_path holds 107 bytes and a NUL: the temporary name used while binding must fit too.
    import tempfile

    with tempfile.TemporaryDirectory(prefix="pp-") as root:
        path = os.path.join(root, "d" * (107 - len(root) - 1 - len("/agent.ttrpc")), "agent.ttrpc")
        assert len(path.encode()) == 107
        server = make_server()
        await server.start_unix(path)
        try:
            async with await Client.connect_unix(path) as client:
                assert await client.call("grpc.Health", "Check", b"", timeout_nano=10**10) == b""
        finally:
            await server.close(grace_seconds=0)
