"""StartVM in a running daemon chooses by selection over a real catalog: ranked candidates reach
the provider, the device plan is stored with the sandbox and drives CreateContainer, and the GPU
quota pool refuses a sandbox before any cloud call."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adaptor.devices import DevicePlan
from adaptor.node.daemon import Daemon
from adaptor.ttrpc import Client, Code, TtrpcError
from adaptor.ttrpc.gen import agent_pb2, ttrpc_pb2
from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from providers.core import contract
from providers.core.base import Instance
from providers.core.snapshots import load_snapshot
from tests.adaptor.daemon_proc import ANNOTATIONS, daemon_settings, hypervisor_call
from tests.adaptor.fakes import FakeProvider
from tests.go.peers import GoServer, echo_server

pytestmark = pytest.mark.go

EIGHT_H100 = {
    **ANNOTATIONS,
    contract.DEFAULT_GPUS: "8",
    contract.DEFAULT_GPU_MODEL: "v1:m=h100",
}
MIG_POD = {**ANNOTATIONS, contract.DEFAULT_GPU_MODEL: "v1:m=h100;mig=1g.10gb:2,3g.40gb:1"}


@pytest.fixture
async def daemon(root: Path) -> AsyncIterator[tuple[Daemon, FakeProvider, GoServer]]:
    async with echo_server() as pod_vm:
        provider = FakeProvider()

        def resolve(instance: Instance) -> tuple[str, int]:
            return pod_vm.host, pod_vm.port

        settings = daemon_settings(
            root, proxy_timeout_seconds=5, shutdown_grace_seconds=1, gpu_quota="h100=8"
        )
        catalog = load_snapshot("aws", "us-east-1")
        daemon = Daemon(settings, provider=provider, resolve_endpoint=resolve, catalog=catalog)
        await daemon.start()
        try:
            yield daemon, provider, pod_vm
        finally:
            await daemon.close(grace_seconds=0)


async def hv(daemon: Daemon, method: str, message: object) -> bytes:
    return await hypervisor_call(str(daemon.settings.socket), method, message)


async def test_selection_quota_and_device_plan(
    daemon: tuple[Daemon, FakeProvider, GoServer],
) -> None:
    node, provider, _ = daemon
    await hv(node, "CreateVM", pb.CreateVMRequest(id="big", annotations=EIGHT_H100))
    await hv(node, "StartVM", pb.StartVMRequest(id="big"))
    assert provider.specs[0].candidates[0].instance_type == "p5.48xlarge"
    assert node.store is not None
    record = await node.store.get("big")
    assert record is not None and record.device_plan
    assert DevicePlan.from_json(record.device_plan).gpus == tuple(
        f"peerpods.io/gpu=gpu{i}" for i in range(8)
    )

    # The pool holds 8 H100s: a second 8-GPU sandbox is refused before any cloud call.
    await hv(node, "CreateVM", pb.CreateVMRequest(id="next", annotations=EIGHT_H100))
    with pytest.raises(TtrpcError) as refused:
        await hv(node, "StartVM", pb.StartVMRequest(id="next"))
    assert "quota for H100 exhausted (8/8)" in refused.value.message
    assert len(provider.specs) == 1

    # Stopping the first frees the pool.
    await hv(node, "StopVM", pb.StopVMRequest(id="big"))
    await hv(node, "StopVM", pb.StopVMRequest(id="next"))
    await hv(node, "CreateVM", pb.CreateVMRequest(id="next2", annotations=EIGHT_H100))
    await hv(node, "StartVM", pb.StartVMRequest(id="next2"))
    assert len(provider.specs) == 2


async def test_mig_plan_reaches_create_container(
    daemon: tuple[Daemon, FakeProvider, GoServer],
) -> None:
    node, provider, _ = daemon
    await hv(node, "CreateVM", pb.CreateVMRequest(id="mig", annotations=MIG_POD))
    await hv(node, "StartVM", pb.StartVMRequest(id="mig"))
    chosen = provider.specs[0].candidates[0].instance_type
    assert chosen.startswith("p5.")  # an H100 type with one GPU to slice
    assert node.store is not None
    record = await node.store.get("mig")
    assert record is not None
    plan = DevicePlan.from_json(record.device_plan)
    assert sorted(m.profile for m in plan.mig) == ["1g.10gb", "1g.10gb", "3g.40gb"]
    assert {m.gpu for m in plan.mig} == {0}

    request = agent_pb2.CreateContainerRequest(container_id="c1")
    request.OCI.Annotations[contract.CONTAINER_NAME] = "infer"
    request.OCI.Annotations["cdi.k8s.io/mine"] = "nvidia.com/gpu=all"  # a pod's own try
    request.OCI.Annotations[contract.DEVICES] = contract.ContainerPlan(
        units=(contract.DeviceUnit(id="m", kind="mig", profile="3g.40gb"),),
        containers={"infer": ("m",)},
    ).encode()
    socket = str(Path(node.settings.pods_dir) / "mig" / "agent.ttrpc")
    async with await Client.connect_unix(socket) as agent:
        echoed = await agent.call(
            "grpc.AgentService",
            "CreateContainer",
            request.SerializeToString(),
            timeout_nano=10**10,
        )
    seen = agent_pb2.CreateContainerRequest.FromString(ttrpc_pb2.Request.FromString(echoed).payload)
    cdi = {k: v for k, v in seen.OCI.Annotations.items() if k.startswith("cdi.k8s.io/")}
    three_g = next(m for m in plan.mig if m.profile == "3g.40gb")
    assert cdi == {"cdi.k8s.io/peerpods_infer": three_g.name}

    # The pod VM's health is still reachable; an unknown sandbox stays NOT_FOUND.
    with pytest.raises(TtrpcError) as missing:
        await hv(node, "StopVM", pb.StopVMRequest(id="nope"))
    assert missing.value.code == Code.NOT_FOUND


async def test_impossible_request_fails_with_selections_reason(
    daemon: tuple[Daemon, FakeProvider, GoServer],
) -> None:
    node, provider, _ = daemon
    sixteen = {**EIGHT_H100, contract.DEFAULT_GPUS: "16"}
    await hv(node, "CreateVM", pb.CreateVMRequest(id="huge", annotations=sixteen))
    with pytest.raises(TtrpcError) as refused:
        await hv(node, "StartVM", pb.StartVMRequest(id="huge"))
    assert "exceed the largest type, 8" in refused.value.message
    assert provider.specs == []
