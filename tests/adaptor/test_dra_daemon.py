"""The DRA-driver mode in a running daemon: the VM of a pod whose claims the kubelet plugin
prepared is planned from them (CreateVM carries no GPUs), and at CreateContainer each container
gets exactly the GPUs its claims' CDI environment names."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adaptor.cdi import load_spec
from adaptor.devices import DevicePlan
from adaptor.dra import Checkpoint, PreparedClaim
from adaptor.dra.cdi import write_spec
from adaptor.hypervisor.dra_claims import DraClaimsHook
from adaptor.node.daemon import Daemon
from adaptor.ttrpc import Client, TtrpcError
from adaptor.ttrpc.gen import agent_pb2, ttrpc_pb2
from adaptor.ttrpc.gen import hypervisor_pb2 as pb
from providers.core import contract
from providers.core.base import Instance
from providers.core.snapshots import load_snapshot
from providers.dra.allocation import AllocatedDevice
from tests.adaptor.daemon_proc import ANNOTATIONS, daemon_settings, hypervisor_call
from tests.adaptor.fakes import FakeProvider
from tests.go.peers import echo_server

pytestmark = pytest.mark.go

POOL = "aws-us-east-1"


def h100(index: int, request: str = "gpu") -> AllocatedDevice:
    return AllocatedDevice(
        POOL, f"nvidia-h100-80gb-hbm3-{index}", "h100-80gb", "NVIDIA H100 80GB HBM3", 81920,
        request=request,
    )  # fmt: skip


def claim(uid: str, pod: str, *devices: AllocatedDevice) -> PreparedClaim:
    return PreparedClaim(uid, "default", f"claim-{uid}", (f"uid-{pod}",), devices, (), (pod,))


@pytest.fixture
async def daemon(root: Path) -> AsyncIterator[tuple[Daemon, FakeProvider, Checkpoint]]:
    async with echo_server() as pod_vm:
        provider = FakeProvider()

        def resolve(instance: Instance) -> tuple[str, int]:
            return pod_vm.host, pod_vm.port

        settings = daemon_settings(root, proxy_timeout_seconds=5, shutdown_grace_seconds=1)
        checkpoint = Checkpoint(root / "dra" / "checkpoint.json")
        node = Daemon(
            settings,
            provider=provider,
            resolve_endpoint=resolve,
            catalog=load_snapshot("aws", "us-east-1"),
            hooks=(DraClaimsHook(checkpoint),),
        )
        await node.start()
        try:
            yield node, provider, checkpoint
        finally:
            await node.close(grace_seconds=0)


async def hv(node: Daemon, method: str, message: object) -> bytes:
    return await hypervisor_call(str(node.settings.socket), method, message)


async def create_container(node: Daemon, sandbox: str, name: str, env: list[str]) -> dict[str, str]:
    request = agent_pb2.CreateContainerRequest(container_id=name)
    request.OCI.Annotations[contract.CONTAINER_NAME] = name
    request.OCI.Process.Env.extend(env)
    socket = str(Path(node.settings.pods_dir) / sandbox / "agent.ttrpc")
    async with await Client.connect_unix(socket) as agent:
        echoed = await agent.call(
            "grpc.AgentService", "CreateContainer", request.SerializeToString(), timeout_nano=10**10
        )
    seen = agent_pb2.CreateContainerRequest.FromString(ttrpc_pb2.Request.FromString(echoed).payload)
    return {k: v for k, v in seen.OCI.Annotations.items() if k.startswith("cdi.k8s.io/")}


def env_of(tmp: Path, uid: str, devices: tuple[AllocatedDevice, ...]) -> list[str]:
    """The environment containerd injects for a claim's CDI devices (the plugin's spec)."""
    write_spec(tmp, uid, devices)
    spec = next(load_spec(str(p)) for p in tmp.iterdir() if uid in p.name)
    return [e for d in spec.devices for e in d.edits.env]


async def test_the_vm_is_planned_from_allocated_devices_and_each_container_gets_its_own(
    daemon: tuple[Daemon, FakeProvider, Checkpoint], tmp_path: Path
) -> None:
    node, provider, checkpoint = daemon
    train = (h100(0), h100(1))
    infer = (h100(2, "infer"),)
    checkpoint.put(claim("a", "pod-a", *train))
    checkpoint.put(claim("b", "pod-a", *infer))
    # CreateVM as the shim sends it in the DRA-driver mode: no GPU keys at all
    await hv(node, "CreateVM", pb.CreateVMRequest(id="s1", annotations=ANNOTATIONS))
    await hv(node, "StartVM", pb.StartVMRequest(id="s1"))
    chosen = provider.specs[0].candidates[0].instance_type
    assert chosen == "p5.48xlarge"  # three H100s: no 1-GPU type holds them
    assert node.store is not None
    record = await node.store.get("s1")
    assert record is not None
    assert record.annotations[contract.DEFAULT_GPUS] == "3"
    plan = DevicePlan.from_json(record.device_plan)
    assert plan.model == "h100-80gb" and len(plan.gpus) >= 3

    trainer = await create_container(node, "s1", "train", env_of(tmp_path, "a", train))
    assert trainer == {"cdi.k8s.io/peerpods_train": f"{plan.gpus[0]},{plan.gpus[1]}"}
    server = await create_container(node, "s1", "infer", env_of(tmp_path, "b", infer))
    assert server == {"cdi.k8s.io/peerpods_infer": plan.gpus[2]}
    sidecar = await create_container(node, "s1", "log", ["PATH=/bin"])
    assert sidecar == {}  # a container without claims gets no GPU


async def test_one_h100_gets_the_one_gpu_type(
    daemon: tuple[Daemon, FakeProvider, Checkpoint],
) -> None:
    node, provider, checkpoint = daemon
    checkpoint.put(claim("a", "pod-a", h100(0)))
    await hv(node, "CreateVM", pb.CreateVMRequest(id="s1", annotations=ANNOTATIONS))
    await hv(node, "StartVM", pb.StartVMRequest(id="s1"))
    assert provider.specs[0].candidates[0].instance_type == "p5.4xlarge"


async def test_a_pod_without_claims_is_planned_as_before(
    daemon: tuple[Daemon, FakeProvider, Checkpoint],
) -> None:
    node, _, checkpoint = daemon
    checkpoint.put(claim("a", "another-pod", h100(0)))
    await hv(node, "CreateVM", pb.CreateVMRequest(id="s1", annotations=ANNOTATIONS))
    await hv(node, "StartVM", pb.StartVMRequest(id="s1"))
    assert node.store is not None
    record = await node.store.get("s1")
    assert record is not None and record.annotations == ANNOTATIONS
    assert DevicePlan.from_json(record.device_plan).gpus == ()


async def test_device_plugin_gpus_beside_allocated_ones_are_refused(
    daemon: tuple[Daemon, FakeProvider, Checkpoint],
) -> None:
    node, provider, checkpoint = daemon
    checkpoint.put(claim("a", "pod-a", h100(0)))
    mig = {**ANNOTATIONS, contract.DEFAULT_GPU_MODEL: "v1:m=h100;mig=1g.10gb:1"}
    with pytest.raises(TtrpcError, match="one pod VM is planned from one of them"):
        await hv(node, "CreateVM", pb.CreateVMRequest(id="s1", annotations=mig))
    assert provider.specs == []
