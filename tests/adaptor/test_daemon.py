"""The daemon in-process with a fake cloud: the resolver hook maps the VM's private address to a
loopback forwarder, a failing delete is reported and kept for retry, shutdown keeps the VM.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptor.node.daemon import Daemon
from adaptor.state import SandboxState
from adaptor.ttrpc import Client, Code, TtrpcError
from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from providers.core.base import Instance
from tests.adaptor.daemon_proc import ANNOTATIONS, daemon_settings, exists, hypervisor_call
from tests.adaptor.fakes import FakeProvider
from tests.go.peers import GoServer

pytestmark = pytest.mark.go


async def test_fake_cloud_with_resolver_and_failed_delete(root: Path, pod_vm: GoServer) -> None:
    provider = FakeProvider()
    resolved: list[Instance] = []

    def resolve(instance: Instance) -> tuple[str, int]:
        resolved.append(instance)
        return pod_vm.host, pod_vm.port  # the VM's 10.0.0.7 is reached through loopback

    settings = daemon_settings(
        root,
        proxy_timeout_seconds=5,
        shutdown_grace_seconds=1,
        allowed_machine_types=("g5.2xlarge",),
    )
    daemon = Daemon(settings, provider=provider, resolve_endpoint=resolve)
    await daemon.start()
    socket = str(settings.socket)
    try:
        annotations = {
            **ANNOTATIONS,
            "io.katacontainers.config.hypervisor.machine_type": "g5.2xlarge",
        }
        await hypervisor_call(
            socket, "CreateVM", pb.CreateVMRequest(id="sb", annotations=annotations)
        )
        await hypervisor_call(socket, "StartVM", pb.StartVMRequest(id="sb"))
        assert [c.instance_type for c in provider.specs[0].candidates] == ["g5.2xlarge"]
        assert resolved and resolved[0].addresses == ("10.0.0.7",)
        async with await Client.connect_unix(str(root / "pods" / "sb" / "agent.ttrpc")) as agent:
            assert await agent.call("grpc.Health", "Check", b"") == b"\x08\x01"

        provider.fail_delete = True
        with pytest.raises(TtrpcError) as info:
            await hypervisor_call(socket, "StopVM", pb.StopVMRequest(id="sb"))
        assert info.value.code == Code.INTERNAL and "cloud said no" in info.value.message
        assert daemon.store is not None
        record = await daemon.store.get("sb")
        # the delete is owed, recorded and retried until the cloud confirms it
        assert record is not None and record.state is SandboxState.STOPPING
        assert record.instance is not None and record.instance.id in provider.vms

        provider.fail_delete = False
        await hypervisor_call(socket, "StopVM", pb.StopVMRequest(id="sb"))
        assert provider.vms == {} and await daemon.store.get("sb") is None
    finally:
        await daemon.close()
    assert not exists(socket)
