"""The daemon driven exactly as Kata 4's runtime-rs drives it, and as the Go runtime does.

runtime-rs (docs/annotations.md, What the adaptor accepts at CreateVM): one ttrpc connection kept
for every call; CreateVM with all nine
keys, empty when unset, `default_vcpus` a Rust f32 ("1.5"), the sandbox name copied from CRI-O's
keys; StartVM with a deadline of 10,000 s; StopVM with a 1 s deadline whose errors it ignores.
The cloud here takes 5 s to delete a VM: StopVM must answer within its second (the server turns
a late answer into DEADLINE_EXCEEDED, so an OK reply is the proof), the sandbox shows `stopping`
in /v1/sandboxes meanwhile, and the VM is deleted anyway, with nothing left behind. The Go
runtime opens a connection per call (the real Go ttrpc client here), sends integer vCPUs and may
forward CRI-O's `k8s_<pod>_<ns>_<uid>_<n>` sandbox name; its StopVM has no deadline and returns
once the cloud confirmed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from adaptor.node.daemon import Daemon
from adaptor.runtime import metrics
from adaptor.ttrpc import Client
from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from providers.core import contract
from providers.core.base import Instance
from providers.core.errors import InvalidRequest
from tests.adaptor.daemon_proc import HYPERVISOR, daemon_settings, exists
from tests.adaptor.fakes import FakeProvider
from tests.go.peers import GoServer, go_call

pytestmark = pytest.mark.go

SECOND = 10**9
DELETE_SECONDS = 5.0

RUNTIME_RS = {
    contract.SANDBOX_NAME: "trainer-0",  # runtime-rs copies CRI-O's io.kubernetes.cri-o.KubeName
    contract.SANDBOX_NAMESPACE: "ml",
    contract.MACHINE_TYPE: "",
    contract.DEFAULT_VCPUS: "1.5",
    contract.DEFAULT_MEMORY: "2048",
    contract.IMAGE: "",
    contract.CC_INIT_DATA: "",
    contract.DEFAULT_GPUS: "0",
    contract.DEFAULT_GPU_MODEL: "",
}
GO_RUNTIME = {
    **RUNTIME_RS,
    contract.SANDBOX_NAME: "k8s_trainer-1_ml_6f1c2b9e-8a57-4c1d-9e0f-2b3c4d5e6f70_0",
    contract.SANDBOX_NAMESPACE: "",
    contract.DEFAULT_VCPUS: "2",
}


class SlowDeletes(FakeProvider):
    """A cloud whose delete takes DELETE_SECONDS to be confirmed."""

    def __init__(self) -> None:
        super().__init__()
        self.deleting: set[str] = set()

    async def delete(self, instance_id: str) -> None:
        self.deleting.add(instance_id)
        try:
            await asyncio.sleep(DELETE_SECONDS)
            await super().delete(instance_id)
        finally:
            self.deleting.discard(instance_id)


@pytest.fixture
async def node(root: Path, pod_vm: GoServer) -> AsyncIterator[tuple[Daemon, SlowDeletes]]:
    provider = SlowDeletes()

    def resolve(instance: Instance) -> tuple[str, int]:
        return pod_vm.host, pod_vm.port

    settings = daemon_settings(
        root, proxy_timeout_seconds=5, shutdown_grace_seconds=1, status_address="127.0.0.1:0"
    )
    daemon = Daemon(settings, provider=provider, resolve_endpoint=resolve)
    await daemon.start()
    try:
        yield daemon, provider
    finally:
        await daemon.close(grace_seconds=DELETE_SECONDS * 2)


async def status_of(daemon: Daemon, sandbox_id: str) -> dict[str, Any]:
    assert daemon.status is not None
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"{daemon.status.url}/v1/sandboxes/{sandbox_id}")
    return {"http": answer.status_code, **answer.json()}


async def gone(daemon: Daemon, sandbox_id: str) -> None:
    """Until the store no longer knows the sandbox (its delete confirmed), bounded."""
    assert daemon.store is not None
    for _ in range(400):
        if await daemon.store.get(sandbox_id) is None:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"sandbox {sandbox_id} still recorded")


async def test_runtime_rs_one_connection_float_vcpus_and_a_1s_stopvm(
    root: Path, node: tuple[Daemon, SlowDeletes]
) -> None:
    daemon, provider = node
    assert daemon.store is not None
    sandboxes = ("rs-a", "rs-b")
    async with await Client.connect_unix(str(daemon.settings.socket)) as shim:

        async def call(method: str, message: Any, timeout_nano: int = 0) -> bytes:
            payload = message.SerializeToString()
            return await shim.call(HYPERVISOR, method, payload, timeout_nano=timeout_nano)

        for sandbox_id in sandboxes:
            reply = pb.CreateVMResponse.FromString(
                await call(
                    "CreateVM",
                    pb.CreateVMRequest(
                        id=sandbox_id, annotations=RUNTIME_RS, networkNamespacePath=""
                    ),
                )
            )
            assert reply.agentSocketPath and ":" not in reply.agentSocketPath
            await call("StartVM", pb.StartVMRequest(id=sandbox_id), timeout_nano=10_000 * SECOND)
            async with await Client.connect_unix(reply.agentSocketPath) as agent:
                assert await agent.call("grpc.Health", "Check", b"") == b"\x08\x01"
        assert [spec.vcpus for spec in provider.specs] == [2, 2]  # 1.5 vCPUs: two whole ones
        record = await daemon.store.get("rs-a")
        assert record is not None and (record.pod_namespace, record.pod_name) == ("ml", "trainer-0")

        for sandbox_id in sandboxes:
            # Answered within the 1 s deadline (a late answer is DEADLINE_EXCEEDED) although
            # the cloud takes 5 s to delete: the delete goes on, recorded.
            await call("StopVM", pb.StopVMRequest(id=sandbox_id), timeout_nano=SECOND)
            shown = await status_of(daemon, sandbox_id)
            assert (shown["http"], shown["state"]) == (200, "stopping"), shown
            assert f"vm-{sandbox_id}" in provider.vms
        # The same connection still serves (runtime-rs never reconnects).
        version = await call("Version", pb.VersionRequest(version="0.0.0"))
        assert pb.VersionResponse.FromString(version).version

    for sandbox_id in sandboxes:
        await gone(daemon, sandbox_id)
        assert (await status_of(daemon, sandbox_id))["http"] == 404
        assert not exists(root / "pods" / sandbox_id)
    assert provider.vms == {} and sorted(provider.deleted) == ["vm-rs-a", "vm-rs-b"]
    assert await daemon.store.records() == []


async def test_go_runtime_connection_per_call_and_crio_name(
    root: Path, node: tuple[Daemon, SlowDeletes]
) -> None:
    daemon, provider = node
    socket = str(daemon.settings.socket)

    async def call(method: str, message: Any, deadline: str = "") -> dict[str, Any]:
        return await go_call(
            socket, HYPERVISOR, method, message.SerializeToString(), call_timeout=deadline
        )

    created = await call("CreateVM", pb.CreateVMRequest(id="go-a", annotations=GO_RUNTIME))
    path = pb.CreateVMResponse.FromString(created["payload"]).agentSocketPath
    await call("StartVM", pb.StartVMRequest(id="go-a"), deadline="600s")
    async with await Client.connect_unix(path) as agent:
        assert await agent.call("grpc.Health", "Check", b"") == b"\x08\x01"
    assert daemon.store is not None
    record = await daemon.store.get("go-a")
    assert record is not None and (record.pod_namespace, record.pod_name) == ("ml", "trainer-1")
    assert provider.specs[-1].vcpus == 2
    # No deadline: StopVM returns once the cloud confirmed the delete.
    await call("StopVM", pb.StopVMRequest(id="go-a"))
    assert await daemon.store.get("go-a") is None and provider.vms == {}
    assert not exists(root / "pods" / "go-a")


async def test_a_refused_startvm_is_visible(root: Path, node: tuple[Daemon, SlowDeletes]) -> None:
    daemon, provider = node
    before = metrics.START_FAILURES.labels(reason="invalid")._value.get()
    provider.fail_create = InvalidRequest("no such image")
    async with await Client.connect_unix(str(daemon.settings.socket)) as shim:
        request = pb.CreateVMRequest(id="bad", annotations=RUNTIME_RS)
        await shim.call(HYPERVISOR, "CreateVM", request.SerializeToString())
        with pytest.raises(Exception, match="no such image"):
            await shim.call(HYPERVISOR, "StartVM", pb.StartVMRequest(id="bad").SerializeToString())
    shown = await status_of(daemon, "bad")
    assert shown["state"] == "failed" and "no such image" in shown["reason"], shown
    assert metrics.START_FAILURES.labels(reason="invalid")._value.get() == before + 1
