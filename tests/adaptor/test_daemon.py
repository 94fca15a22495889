"""The daemon in-process with a fake cloud: the resolver hook maps the VM's private address to a
loopback forwarder, a failing delete is reported and kept for retry, shutdown keeps the VM.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from adaptor.daemon import Daemon
from adaptor.settings import ServeSettings
from adaptor.state import SandboxState
from adaptor.ttrpc import Client, Code, TtrpcError
from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from providers.base import Instance
from tests.adaptor.daemon_proc import ANNOTATIONS, HYPERVISOR, exists
from tests.adaptor.fakes import FakeProvider
from tests.go.peers import GoServer, echo_server

pytestmark = pytest.mark.go


@pytest.fixture
async def pod_vm() -> AsyncIterator[GoServer]:
    async with echo_server() as server:
        yield server


@pytest.fixture
def root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as directory:
        yield Path(directory)


async def call(socket: str, method: str, message: object) -> bytes:
    async with await Client.connect_unix(socket) as client:
        return await client.call(
            HYPERVISOR,
            method,
            message.SerializeToString(),  # type: ignore[attr-defined]
            timeout_nano=30 * 10**9,
        )


async def test_fake_cloud_with_resolver_and_failed_delete(root: Path, pod_vm: GoServer) -> None:
    provider = FakeProvider()
    resolved: list[Instance] = []

    def resolve(instance: Instance) -> tuple[str, int]:
        resolved.append(instance)
        return pod_vm.host, pod_vm.port  # the VM's 10.0.0.7 is reached through loopback

    settings = ServeSettings.build(
        socket=root / "hv.sock",
        pods_dir=root / "pods",
        state_dir=root / "state",
        agent_tls={"enabled": False},
        proxy_timeout_seconds=5,
        shutdown_grace_seconds=1,
    )
    daemon = Daemon(settings, provider=provider, resolve_endpoint=resolve)
    await daemon.start()
    socket = str(settings.socket)
    try:
        annotations = {
            **ANNOTATIONS,
            "io.katacontainers.config.hypervisor.machine_type": "g5.2xlarge",
        }
        await call(socket, "CreateVM", pb.CreateVMRequest(id="sb", annotations=annotations))
        await call(socket, "StartVM", pb.StartVMRequest(id="sb"))
        assert provider.specs[0].candidates == ("g5.2xlarge",)
        assert resolved and resolved[0].addresses == ("10.0.0.7",)
        async with await Client.connect_unix(str(root / "pods" / "sb" / "agent.ttrpc")) as agent:
            assert await agent.call("grpc.Health", "Check", b"") == b"\x08\x01"

        provider.fail_delete = True
        with pytest.raises(TtrpcError) as info:
            await call(socket, "StopVM", pb.StopVMRequest(id="sb"))
        assert info.value.code == Code.INTERNAL and "cloud said no" in info.value.message
        assert daemon.store is not None
        record = await daemon.store.get("sb")
        assert record is not None and record.state is SandboxState.FAILED
        assert record.instance is not None and record.instance.id in provider.vms

        provider.fail_delete = False
        await call(socket, "StopVM", pb.StopVMRequest(id="sb"))
        assert provider.vms == {} and await daemon.store.get("sb") is None
    finally:
        await daemon.close()
    assert not exists(socket)
