"""Interop with Go's ttrpc 1.1.1 (Debian's containerd/ttrpc): both directions, real processes."""

from __future__ import annotations

import asyncio

import pytest

from adaptor.ttrpc import Client, Code, TtrpcError
from adaptor.ttrpc.codec import Frame, encode_frame
from adaptor.ttrpc.gen import health_pb2, ttrpc_pb2
from tests.go.peers import echo_server, go_call

from .conftest import exchange
from .test_codec import CHECK_REQUEST, OK_RESPONSE

pytestmark = pytest.mark.go


async def test_our_client_to_go_server() -> None:
    async with echo_server() as go, await Client.connect_tcp(go.host, go.port) as client:
        check = await client.call(
            "grpc.Health", "Check", health_pb2.CheckRequest().SerializeToString()
        )
        assert health_pb2.HealthCheckResponse.FromString(check).status == 1
        md = [("traceparent", "00-1"), ("k", "a"), ("k", "b")]
        body = await client.call(
            "grpc.AgentService",
            "WaitProcess",
            b"\x0a\x01c",
            metadata=md,
            timeout_nano=20_000_000_000,
        )
        echoed = ttrpc_pb2.Request.FromString(body)
        assert (echoed.service, echoed.method, echoed.payload) == (
            "grpc.AgentService",
            "WaitProcess",
            b"\x0a\x01c",
        )
        assert sorted((kv.key, kv.value) for kv in echoed.metadata) == sorted(md)
        assert 10_000_000_000 < echoed.timeout_nano <= 20_000_000_000
        for service, method, message in [
            ("grpc.AgentService", "NoSuchMethod", "method NoSuchMethod"),
            ("no.Service", "Check", "service no.Service"),
        ]:
            with pytest.raises(TtrpcError) as info:
                await client.call(service, method, b"")
            assert (info.value.code, info.value.message) == (Code.UNIMPLEMENTED, message)
        with pytest.raises(TtrpcError) as info:
            await client.call(
                "grpc.AgentService", "StartContainer", b"", metadata=[("x-fail", "7:nope")]
            )
        assert (info.value.code, info.value.message) == (Code.PERMISSION_DENIED, "nope")
        # the Go server enforces our timeout_nano
        with pytest.raises(TtrpcError) as info:
            await client.call(
                "grpc.AgentService",
                "WaitProcess",
                b"",
                metadata=[("x-sleep", "10s")],
                timeout_nano=100_000_000,
            )
        assert info.value.code == Code.DEADLINE_EXCEEDED
        # many concurrent streams on one connection
        many = await asyncio.gather(
            *(client.call("grpc.AgentService", "StatsContainer", bytes([i])) for i in range(64))
        )
        assert [ttrpc_pb2.Request.FromString(b).payload for b in many] == [
            bytes([i]) for i in range(64)
        ]


async def test_facts_frame_against_go_server_and_ours(server_path: str) -> None:
    async with echo_server() as go:
        reader, writer = await asyncio.open_connection(go.host, go.port)
        try:
            writer.write(CHECK_REQUEST)
            header = await asyncio.wait_for(reader.readexactly(10), 5)
            body = await asyncio.wait_for(reader.readexactly(int.from_bytes(header[:4], "big")), 5)
        finally:
            writer.close()
            await writer.wait_closed()
    # Go 1.1.1 omits the status on success (newer Go and Rust send an empty one); both mean OK
    assert header == bytes.fromhex("00000004000000010200")
    response = ttrpc_pb2.Response.FromString(body)
    assert response.status.code == Code.OK and response.payload == b"\x08\x01"
    # our server answers the reference request with the reference bytes, as Go >= 1.2 does
    events = await exchange(server_path, CHECK_REQUEST, want=1)
    assert isinstance(events[0], Frame)
    assert encode_frame(1, 2, events[0].data) == OK_RESPONSE


async def test_go_client_to_our_server(server_path: str) -> None:
    result = await go_call(
        server_path,
        "test.Echo",
        "Echo",
        b"\x01\x02",
        metadata=[("traceparent", "t1"), ("k", "v")],
        call_timeout="30s",
    )
    assert result["code"] == 0
    echoed = ttrpc_pb2.Request.FromString(result["payload"])
    assert (echoed.service, echoed.method, echoed.payload) == ("test.Echo", "Echo", b"\x01\x02")
    pairs = sorted((kv.key, kv.value) for kv in echoed.metadata)
    assert pairs == [("k", "v"), ("traceparent", "t1")]
    assert 29_000_000_000 < echoed.timeout_nano <= 30_000_000_000

    unknown = await go_call(server_path, "test.Echo", "Nope")
    assert (unknown["code"], unknown["message"]) == (Code.UNIMPLEMENTED, "method Nope")
    unknown = await go_call(server_path, "hypervisor.Hypervisor", "CreateVM")
    assert unknown["code"] == Code.UNIMPLEMENTED
    assert unknown["message"] == "service hypervisor.Hypervisor"
    failed = await go_call(server_path, "test.Echo", "Fail")
    assert (failed["code"], failed["message"]) == (Code.NOT_FOUND, "no such thing")
    late = await go_call(server_path, "test.Echo", "Slow", b"5", call_timeout="100ms")
    assert late["code"] == Code.DEADLINE_EXCEEDED
