"""The agent proxy between real peers: Go's ttrpc client and server on either side."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adaptor.proxy import AgentProxy, client_tls_context, tcp_dialer
from adaptor.ttrpc import Client, Code, TtrpcError
from adaptor.ttrpc.gen import agent_pb2, ttrpc_pb2
from tests.go.peers import GoServer, echo_server, go_call, proxy_connected, start_echo_server

pytestmark = pytest.mark.go

AGENT = "grpc.AgentService"


@pytest.fixture
async def sock_dir() -> AsyncIterator[Path]:
    with tempfile.TemporaryDirectory(prefix="pp-") as d:
        yield Path(d)


@pytest.fixture
async def go() -> AsyncIterator[GoServer]:
    async with echo_server() as server:
        yield server


@pytest.fixture
async def proxy(go: GoServer, sock_dir: Path) -> AsyncIterator[AgentProxy]:
    calls: list[tuple[str, str, int]] = []
    p = AgentProxy(
        str(sock_dir / "sb" / "agent.ttrpc"),
        tcp_dialer(go.host, go.port, None),
        sandbox_id="sb",
        on_call=lambda s, m, c: calls.append((s, m, c)),
    )
    p.calls = calls  # type: ignore[attr-defined]
    async with proxy_connected(p):
        yield p


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_go_shim_through_proxy_to_go_agent(proxy: AgentProxy) -> None:
    assert stat.S_IMODE(os.stat(proxy.socket_path).st_mode) == 0o600
    check = await go_call(proxy.socket_path, "grpc.Health", "Check", b"", call_timeout="30s")
    assert (check["code"], check["payload"]) == (0, b"\x08\x01")

    request = agent_pb2.CreateContainerRequest(container_id="c1", exec_id="e1")
    request.OCI.Annotations["io.kubernetes.cri.container-name"] = "main"
    payload = request.SerializeToString() + b"\xf8\x01\x07"  # an unknown field too
    md = [("traceparent", "00-abc-01"), ("k", "v")]
    result = await go_call(
        proxy.socket_path, AGENT, "CreateContainer", payload, metadata=md, call_timeout="60s"
    )
    assert result["code"] == 0
    echoed = ttrpc_pb2.Request.FromString(result["payload"])
    assert (echoed.service, echoed.method) == (AGENT, "CreateContainer")
    assert echoed.payload == payload  # byte for byte
    assert sorted((kv.key, kv.value) for kv in echoed.metadata) == sorted(md)
    assert 50_000_000_000 < echoed.timeout_nano <= 60_000_000_000

    unknown = await go_call(proxy.socket_path, AGENT, "SomeFutureMethod")
    assert (unknown["code"], unknown["message"]) == (Code.UNIMPLEMENTED, "method SomeFutureMethod")
    unknown = await go_call(proxy.socket_path, "grpc.Other", "X")
    assert (unknown["code"], unknown["message"]) == (Code.UNIMPLEMENTED, "service grpc.Other")
    assert (AGENT, "CreateContainer", 0) in proxy.calls  # type: ignore[attr-defined]
    assert (AGENT, "SomeFutureMethod", Code.UNIMPLEMENTED) in proxy.calls  # type: ignore[attr-defined]


async def test_long_call_does_not_block_short_ones(proxy: AgentProxy) -> None:
    async with await Client.connect_unix(proxy.socket_path) as client:
        wait = asyncio.create_task(
            client.call(AGENT, "WaitProcess", b"", metadata=[("x-sleep", "1.5s")])
        )
        await asyncio.sleep(0.05)
        short = await asyncio.wait_for(
            asyncio.gather(*(client.call(AGENT, "StatsContainer", bytes([i])) for i in range(50))),
            1.0,
        )
        assert len(short) == 50 and not wait.done()
        assert ttrpc_pb2.Request.FromString(await wait).method == "WaitProcess"
        # deadlines travel to the agent; the proxy adds none of its own
        with pytest.raises(TtrpcError) as info:
            await client.call(
                AGENT, "WaitProcess", b"", metadata=[("x-sleep", "5s")], timeout_nano=200_000_000
            )
        assert info.value.code == Code.DEADLINE_EXCEEDED


async def test_forwarder_dies_mid_call_then_recovers(sock_dir: Path) -> None:
    port = free_port()
    go = await start_echo_server(f"tcp:127.0.0.1:{port}")
    proxy = AgentProxy(
        str(sock_dir / "agent.ttrpc"), tcp_dialer("127.0.0.1", port, None), sandbox_id="sb"
    )
    try:
        await proxy.start()
        await proxy.connect(5)
        async with await Client.connect_unix(proxy.socket_path) as client:
            in_flight = asyncio.create_task(
                client.call(AGENT, "WaitProcess", b"", metadata=[("x-sleep", "30s")])
            )
            await asyncio.sleep(0.1)
            await go.kill()
            with pytest.raises(TtrpcError) as info:
                await asyncio.wait_for(in_flight, 5)
            assert info.value.code == Code.UNAVAILABLE
            with pytest.raises(TtrpcError) as info:
                await client.call(AGENT, "StatsContainer", b"")
            assert info.value.code == Code.UNAVAILABLE
            assert not proxy.connected
            go = await start_echo_server(f"tcp:127.0.0.1:{port}")
            # the same shim connection works again: the proxy re-dials on demand
            body = await client.call(AGENT, "StatsContainer", b"again")
            assert ttrpc_pb2.Request.FromString(body).payload == b"again"
            assert proxy.connected
    finally:
        await proxy.stop()
        await go.kill()
    assert not os.path.exists(proxy.socket_path)  # noqa: ASYNC240


async def test_connect_retries_until_forwarder_is_up_or_times_out(sock_dir: Path) -> None:
    port = free_port()
    proxy = AgentProxy(
        str(sock_dir / "agent.ttrpc"), tcp_dialer("127.0.0.1", port, None), sandbox_id="sb"
    )
    await proxy.start()
    try:
        with pytest.raises(TtrpcError) as info:
            await asyncio.wait_for(proxy.connect(0.5), 5)
        assert info.value.code == Code.UNAVAILABLE
        assert "unreachable after 0.5s" in info.value.message
        # before the VM is reachable, calls are answered UNAVAILABLE, not hung
        async with await Client.connect_unix(proxy.socket_path) as client:
            with pytest.raises(TtrpcError) as info:
                await client.call("grpc.Health", "Check", b"")
            assert info.value.code == Code.UNAVAILABLE

        async def late_start() -> GoServer:
            await asyncio.sleep(0.4)
            return await start_echo_server(f"tcp:127.0.0.1:{port}")

        starter = asyncio.create_task(late_start())
        await asyncio.wait_for(proxy.connect(10), 10)
        go = await starter
        try:
            async with await Client.connect_unix(proxy.socket_path) as client:
                assert await client.call("grpc.Health", "Check", b"") == b"\x08\x01"
        finally:
            await go.kill()
    finally:
        await proxy.stop()


async def test_create_container_hook(go: GoServer, sock_dir: Path) -> None:
    seen: list[bytes] = []

    def hook(payload: bytes) -> bytes:
        seen.append(payload)
        request = agent_pb2.CreateContainerRequest.FromString(payload)
        if request.container_id == "bad":
            raise TtrpcError(Code.INVALID_ARGUMENT, "no devices for container bad")
        request.OCI.Annotations["cdi.k8s.io/peerpods"] = "nvidia.com/gpu=0"
        return bytes(request.SerializeToString())

    proxy = AgentProxy(
        str(sock_dir / "agent.ttrpc"),
        tcp_dialer(go.host, go.port, None),
        sandbox_id="sb",
        create_container_hook=hook,
    )
    async with proxy_connected(proxy), await Client.connect_unix(proxy.socket_path) as client:
        original = agent_pb2.CreateContainerRequest(container_id="c1").SerializeToString()
        body = await client.call(
            AGENT, "CreateContainer", original, metadata=[("k", "v")], timeout_nano=9 * 10**9
        )
        echoed = ttrpc_pb2.Request.FromString(body)
        got = agent_pb2.CreateContainerRequest.FromString(echoed.payload)
        assert got.OCI.Annotations["cdi.k8s.io/peerpods"] == "nvidia.com/gpu=0"
        assert [(kv.key, kv.value) for kv in echoed.metadata] == [("k", "v")]
        assert 0 < echoed.timeout_nano <= 9 * 10**9
        bad = agent_pb2.CreateContainerRequest(container_id="bad").SerializeToString()
        with pytest.raises(TtrpcError) as info:
            await client.call(AGENT, "CreateContainer", bad)
        assert (info.value.code, info.value.message) == (
            Code.INVALID_ARGUMENT,
            "no devices for container bad",
        )
        await client.call(AGENT, "StartContainer", b"\x0a\x02c1")
        assert seen == [original, bad]  # only CreateContainer reaches the hook


async def test_mutual_tls_to_the_forwarder(sock_dir: Path) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    server_cert = ca.issue_cert("127.0.0.1")
    client_cert = ca.issue_cert("peerpods-adaptor")
    files = {}
    for name, blob in {
        "ca.pem": ca.cert_pem.bytes(),
        "server.pem": server_cert.cert_chain_pems[0].bytes(),
        "server.key": server_cert.private_key_pem.bytes(),
        "client.pem": client_cert.cert_chain_pems[0].bytes(),
        "client.key": client_cert.private_key_pem.bytes(),
    }.items():
        (sock_dir / name).write_bytes(blob)
        files[name] = str(sock_dir / name)
    tls_args = (
        "-tls-cert",
        files["server.pem"],
        "-tls-key",
        files["server.key"],
        "-tls-client-ca",
        files["ca.pem"],
    )
    async with echo_server("tcp:127.0.0.1:0", *tls_args) as go:
        context = client_tls_context(files["ca.pem"], files["client.pem"], files["client.key"])
        proxy = AgentProxy(
            str(sock_dir / "agent.ttrpc"), tcp_dialer(go.host, go.port, context), sandbox_id="sb"
        )
        await proxy.start()
        try:
            await proxy.connect(5)
            check = await go_call(proxy.socket_path, "grpc.Health", "Check")
            assert check["payload"] == b"\x08\x01"
        finally:
            await proxy.stop()
        # a client without our certificate is refused by the forwarder
        other = trustme.CA().issue_cert("intruder")
        (sock_dir / "x.pem").write_bytes(other.cert_chain_pems[0].bytes())
        (sock_dir / "x.key").write_bytes(other.private_key_pem.bytes())
        x_pem, x_key = str(sock_dir / "x.pem"), str(sock_dir / "x.key")
        wrong = client_tls_context(files["ca.pem"], x_pem, x_key)
        intruder = AgentProxy(
            str(sock_dir / "i.ttrpc"), tcp_dialer(go.host, go.port, wrong), sandbox_id="sb2"
        )
        await intruder.start()
        try:
            async with await Client.connect_unix(intruder.socket_path) as client:
                with pytest.raises(TtrpcError) as info:
                    await intruder.connect(0.5)
                    await client.call("grpc.Health", "Check", b"")
                assert info.value.code == Code.UNAVAILABLE
        finally:
            await intruder.stop()


async def test_stop_closes_shims_and_leaks_nothing(proxy: AgentProxy) -> None:
    client = await Client.connect_unix(proxy.socket_path)
    pending = asyncio.create_task(
        client.call(AGENT, "WaitProcess", b"", metadata=[("x-sleep", "30s")])
    )
    await asyncio.sleep(0.05)
    before = len(asyncio.all_tasks())
    await asyncio.wait_for(proxy.stop(), 5)
    with pytest.raises(TtrpcError) as info:
        await asyncio.wait_for(pending, 5)
    assert info.value.code == Code.UNAVAILABLE
    await client.close()
    assert not os.path.exists(proxy.socket_path)  # noqa: ASYNC240
    assert len(asyncio.all_tasks()) < before
    await proxy.stop()  # idempotent


def test_bad_tls_files_are_a_clear_error(tmp_path: Path) -> None:
    from providers.core.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="agent TLS files"):
        client_tls_context(str(tmp_path / "no-ca.pem"), "c", "k")
