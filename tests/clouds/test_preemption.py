"""A VM taken away under a running sandbox, per cloud: the real provider over moto / the fake ARM /
the fake Compute Engine, the real agent proxy, Go's ttrpc echo server as the pod VM's forwarder.

One watcher sweep (one detection interval) after the cloud takes the VM: the sandbox is
`preempted` with the cloud's reason, the agent call in flight and every later one fail with
FAILED_PRECONDITION naming the preemption, nothing of the VM is left, and StopVM succeeds.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from adaptor.hypervisor import ManagerConfig, SandboxManager, SandboxTable
from adaptor.hypervisor.preemption import InspectableProvider, PreemptionWatcher
from adaptor.node.daemon import agent_proxy_factory
from adaptor.planning.placement import Placement
from adaptor.runtime import metrics
from adaptor.state import SandboxState, StateStore
from adaptor.status import DeviceBook
from adaptor.status.app import sandbox_json
from adaptor.ttrpc import Client, Code, TtrpcError
from providers.clouds.retry import RetryPolicy
from providers.core.base import Instance
from providers.core.capacity import CapacityType
from tests.clouds.aws_faults import Faults
from tests.clouds.fake_arm import VMS, FakeArm
from tests.clouds.fake_gce import FakeGce, stockout
from tests.go.peers import GoServer, echo_server
from tests.providers.fakes.gcp import COMPUTE

pytestmark = pytest.mark.go

SID = "5e1f2d3c4b5a69788796a5b4c3d2e1f0"
AGENT = "grpc.AgentService"
ANNOTATIONS = {
    "io.kubernetes.cri.sandbox-name": "train-0",
    "io.kubernetes.cri.sandbox-namespace": "ml",
    "io.katacontainers.config.hypervisor.default_vcpus": "4",
    "io.katacontainers.config.hypervisor.default_memory": "8192",
}


@dataclass
class Cloud:
    """One cloud's provider and what the test does to, and asks of, its fake."""

    provider: InspectableProvider
    candidate: str
    take_vm_away: Callable[[Instance], None]
    leftovers: Callable[[], list[str]]
    # Make every Spot create fail on capacity; the market of every create sent, in order.
    refuse_spot: Callable[[], None]
    markets: Callable[[], list[str]]


@pytest.fixture
async def forwarder() -> AsyncIterator[GoServer]:
    async with echo_server() as server:
        yield server


def to_forwarder(go: GoServer) -> Callable[[Instance], Instance]:
    return lambda vm: replace(vm, addresses=(go.host,), port=go.port)


def aws_cloud(ec2: Any, policy: RetryPolicy, go: GoServer) -> Cloud:
    from providers.clouds.aws import AwsConfig, AwsProvider

    config = AwsConfig(
        region="us-east-1",
        image_id="ami-0a1b2c3d4e5f60718",
        zones=("us-east-1a",),
        poll_interval_seconds=0.001,
        policy=policy,
    )
    aws = AwsProvider(config, "owner-node-a", client=ec2, resolve=to_forwarder(go))

    def leftovers() -> list[str]:
        live = ec2.describe_instances(
            Filters=[{"Name": "instance-state-name", "Values": ["pending", "running", "stopped"]}]
        )
        volumes = ec2.describe_volumes(Filters=[{"Name": "tag:peerpods-sandbox", "Values": [SID]}])
        return [i["InstanceId"] for r in live["Reservations"] for i in r["Instances"]] + [
            v["VolumeId"] for v in volumes["Volumes"]
        ]

    def take(vm: Instance) -> None:
        # EC2 takes the Spot capacity back; a data volume is left behind, as after a detach.
        tags = [{"Key": k, "Value": v} for k, v in vm.tags.items() if k.startswith("peerpods-")]
        ec2.create_volume(
            AvailabilityZone=vm.zone,
            Size=8,
            TagSpecifications=[{"ResourceType": "volume", "Tags": tags}],
        )
        ec2.terminate_instances(InstanceIds=[vm.id])

    faults = Faults()
    faults.install(ec2)

    def refuse_spot() -> None:
        faults.rules.append(
            lambda action, params: (
                "InsufficientInstanceCapacity"
                if action == "RunInstances"
                and params.get("InstanceMarketOptions.MarketType") == "spot"
                else None
            )
        )

    def markets() -> list[str]:
        return [
            p.get("InstanceMarketOptions.MarketType", "on-demand")
            for a, p in faults.calls
            if a == "RunInstances"
        ]

    return Cloud(aws, "p5.48xlarge", take, leftovers, refuse_spot, markets)


def azure_cloud(policy: RetryPolicy, go: GoServer) -> Cloud:
    from providers.clouds.azure import AzureConfig, AzureProvider
    from tests.clouds.test_azure import SUBNET
    from tests.providers.fakes.azure import SUBSCRIPTION

    arm = FakeArm()
    compute, network = arm.clients()
    config = AzureConfig(
        subscription_id=SUBSCRIPTION,
        resource_group="peerpods-rg",
        location="eastus",
        subnet_id=SUBNET,
        image_id="/subscriptions/x/resourceGroups/img/providers/Microsoft.Compute/images/podvm",
        zones=("1",),
        policy=policy,
    )
    azure = AzureProvider(
        config, "owner-node-a", compute=compute, network=network, resolve=to_forwarder(go)
    )

    def take(vm: Instance) -> None:
        arm.evict(vm.id, leave_nic_and_disk=True)  # evicted; its NIC and disk were left behind

    def refuse_spot() -> None:
        arm.faults.append(
            lambda action, body: (
                "AllocationFailed"
                if action == "put" and body["properties"].get("priority") == "Spot"
                else None
            )
        )

    def markets() -> list[str]:
        return [
            "spot" if r.json()["properties"].get("priority") == "Spot" else "on-demand"
            for r in arm.cloud.seen("PUT", VMS + r"/[^/]+")
        ]

    return Cloud(
        azure,
        "Standard_NC40ads_H100_v5",
        take,
        lambda: [*arm.vms, *sorted(arm.nics), *sorted(arm.disks)],
        refuse_spot,
        markets,
    )


def gcp_cloud(policy: RetryPolicy, go: GoServer) -> Cloud:
    from providers.clouds.gcp import GcpConfig, GcpProvider
    from tests.providers.fakes.gcp import PROJECT

    gce = FakeGce()
    config = GcpConfig(
        project=PROJECT,
        zones=("us-central1-a",),
        image="projects/peerpods/global/images/podvm-gpu",
        policy=policy,
    )
    gcp = GcpProvider(config, "owner-node-a", client=gce.client(), resolve=to_forwarder(go))

    def take(vm: Instance) -> None:
        zone, name = vm.id.split("/")
        gce.instances[(zone, name)]["status"] = "TERMINATED"  # preempted, stopped by the cloud

    def refuse_spot() -> None:
        def fault(action: str, zone: str, body: dict[str, Any]) -> Any:
            spot = (body.get("scheduling") or {}).get("provisioningModel") == "SPOT"
            return stockout(zone) if action == "insert" and spot else None

        gce.faults.append(fault)

    def markets() -> list[str]:
        return [
            "spot"
            if (r.json().get("scheduling") or {}).get("provisioningModel") == "SPOT"
            else "on-demand"
            for r in gce.cloud.seen("POST", rf"{COMPUTE}/zones/[^/]+/instances")
        ]

    return Cloud(
        gcp,
        "a3-highgpu-8g",
        take,
        lambda: [f"{z}/{n}" for z, n in gce.instances],
        refuse_spot,
        markets,
    )


class SpotProvider:
    """The cloud's provider, asked for Spot (StartVM's VMSpec is not what this test is about)."""

    def __init__(self, inner: InspectableProvider) -> None:
        self.inner = inner
        self.name = inner.name

    async def create(self, spec: Any) -> Instance:
        return await self.inner.create(replace(spec, capacity_type=CapacityType.SPOT))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture(params=["aws", "azure", "gcp"])
def cloud(request: pytest.FixtureRequest, policy: RetryPolicy, forwarder: GoServer) -> Cloud:
    if request.param == "aws":
        return aws_cloud(request.getfixturevalue("ec2"), policy, forwarder)
    if request.param == "azure":
        return azure_cloud(policy, forwarder)
    return gcp_cloud(policy, forwarder)


@dataclass
class Node:
    manager: SandboxManager
    watcher: PreemptionWatcher
    store: StateStore
    lost: list[str]
    heard: asyncio.Event


@pytest.fixture
async def node(cloud: Cloud) -> AsyncIterator[Node]:
    lost: list[str] = []
    heard = asyncio.Event()
    watchers: list[PreemptionWatcher] = []

    def upstream_lost(sandbox_id: str) -> None:  # as the daemon wires it
        lost.append(sandbox_id)
        heard.set()
        watchers[0].nudge(sandbox_id)

    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as root:
        store = await StateStore.open(Path(root) / "state")
        provider: Any = SpotProvider(cloud.provider)
        manager = SandboxManager(
            SandboxTable(
                ManagerConfig(pods_dir=Path(root) / "pods", proxy_timeout_seconds=10),
                store,
                provider,
                Placement(default_type=cloud.candidate),
                agent_proxy_factory(None, on_upstream_lost=upstream_lost),
            )
        )
        watchers.append(PreemptionWatcher(manager, provider, interval_seconds=0))
        try:
            yield Node(manager, watchers[0], store, lost, heard)
        finally:
            await watchers[0].stop()
            await manager.close(0)
            await store.close()


async def settled(node: Node, drops: int) -> None:
    """Wait until `drops` connection losses were heard and the checks they started finished
    (bounded, never a timing claim)."""
    async with asyncio.timeout(60):
        while len(node.lost) < drops:
            node.heard.clear()
            await node.heard.wait()
        while node.watcher._checks:
            await asyncio.gather(*node.watcher._checks.values(), return_exceptions=True)


def preempted_count(provider: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "peerpods_sandboxes_preempted_total", {"provider": provider, "capacity_type": "spot"}
    )
    return value or 0.0


async def test_vm_taken_away_under_a_running_sandbox(cloud: Cloud, node: Node) -> None:
    socket = await node.manager.create_vm(SID, ANNOTATIONS)
    await node.manager.start_vm(SID)
    record = await node.store.get(SID)
    assert record is not None and record.state is SandboxState.RUNNING
    assert record.instance is not None and record.instance.capacity_type == "spot"
    assert await node.watcher.sweep() == []  # the VM runs: nothing happens
    before = preempted_count(cloud.provider.name)

    async with await Client.connect_unix(socket) as shim:
        waiting = asyncio.create_task(
            shim.call(AGENT, "WaitProcess", b"", metadata=[("x-sleep", "120s")])
        )
        await shim.call("grpc.Health", "Check", b"")  # WaitProcess is in flight upstream
        cloud.take_vm_away(record.instance)

        assert await node.watcher.sweep() == [SID]  # one detection interval

        with pytest.raises(TtrpcError) as info:
            await waiting
        assert info.value.code == Code.FAILED_PRECONDITION
        assert "preempted or deleted by the cloud" in info.value.message
        assert "ml/train-0" in info.value.message
        with pytest.raises(TtrpcError) as later:
            await shim.call(AGENT, "StatsContainer", b"")
        assert later.value.code == Code.FAILED_PRECONDITION

    marked = await node.store.get(SID)
    assert marked is not None and marked.state is SandboxState.PREEMPTED
    assert record.instance.id in marked.reason and "deleted" in marked.reason
    shown = sandbox_json(marked, DeviceBook())
    assert shown["state"] == "preempted" and shown["capacity_type"] == "spot"
    assert preempted_count(cloud.provider.name) == before + 1
    assert cloud.leftovers() == []  # the VM, its disks and NICs: nothing billed after it
    assert await node.watcher.sweep() == []  # counted once

    await node.manager.stop_vm(SID)
    assert await node.store.get(SID) is None
    assert not os.path.exists(socket)  # noqa: ASYNC240


async def test_connection_drop_asks_the_cloud_and_only_the_cloud_decides(
    cloud: Cloud, node: Node, forwarder: GoServer
) -> None:
    socket = await node.manager.create_vm(SID, ANNOTATIONS)
    await node.manager.start_vm(SID)
    proxy: Any = node.manager.proxy_of(SID)
    # The forwarder connection drops while the VM lives: the cloud says it runs, nothing changes.
    await proxy._upstream.close()
    await settled(node, 1)
    assert node.lost == [SID]
    record = await node.store.get(SID)
    assert record is not None and record.state is SandboxState.RUNNING
    assert record.instance is not None
    async with await Client.connect_unix(socket) as shim:
        await shim.call("grpc.Health", "Check", b"")  # re-dialed on demand
        # Now the cloud takes the VM, and with it the connection: no sweep is needed.
        cloud.take_vm_away(record.instance)
        await forwarder.kill()
        await settled(node, 2)
        marked = await node.store.get(SID)
        assert marked is not None and marked.state is SandboxState.PREEMPTED
        with pytest.raises(TtrpcError) as info:
            await shim.call("grpc.Health", "Check", b"")
        assert info.value.code == Code.FAILED_PRECONDITION
    assert cloud.leftovers() == []
    await node.manager.stop_vm(SID)
    assert await node.store.get(SID) is None


@pytest.mark.parametrize(
    ("capacity", "spot_refused", "sent", "got"),
    [
        ("", True, ["on-demand"], "on-demand"),
        ("v1:cap=spot", False, ["spot"], "spot"),
        ("v1:cap=spot-or-on-demand", False, ["spot"], "spot"),
        ("v1:cap=spot-or-on-demand", True, ["spot", "on-demand"], "on-demand"),
    ],
)
async def test_startvm_creates_the_capacity_the_contract_asks_for(
    cloud: Cloud, capacity: str, spot_refused: bool, sent: list[str], got: str
) -> None:
    if spot_refused:
        cloud.refuse_spot()
    annotations = {**ANNOTATIONS, "io.katacontainers.config.hypervisor.default_gpu_model": capacity}
    with tempfile.TemporaryDirectory(prefix="pp", dir="/tmp") as root:
        store = await StateStore.open(Path(root) / "state")
        manager = SandboxManager(
            SandboxTable(
                ManagerConfig(pods_dir=Path(root) / "pods", proxy_timeout_seconds=10),
                store,
                cloud.provider,
                Placement(default_type=cloud.candidate),
                agent_proxy_factory(None),
            )
        )
        try:
            await manager.create_vm(SID, annotations)
            await manager.start_vm(SID)
            record = await store.get(SID)
            assert record is not None and record.instance is not None
            assert sandbox_json(record, DeviceBook())["capacity_type"] == got
            assert cloud.markets() == sent  # one zone, one type: each pass tries it once
            await manager.stop_vm(SID)
        finally:
            await manager.close(0)
            await store.close()
    assert cloud.leftovers() == []


async def test_a_restarted_daemon_keeps_answering_why(cloud: Cloud, node: Node) -> None:
    socket = await node.manager.create_vm(SID, ANNOTATIONS)
    await node.manager.start_vm(SID)
    record = await node.store.get(SID)
    assert record is not None and record.instance is not None
    cloud.take_vm_away(record.instance)
    assert await node.watcher.sweep() == [SID]
    await node.manager.close(0)  # the daemon stops; the record stays
    manager = SandboxManager(
        SandboxTable(
            ManagerConfig(pods_dir=Path(socket).parent.parent, proxy_timeout_seconds=10),
            node.store,
            node.manager.provider,
            Placement(),
            agent_proxy_factory(None),
        )
    )
    watcher = PreemptionWatcher(manager, node.watcher.provider, interval_seconds=0)
    try:
        await manager.recover()
        await watcher.fail_preempted()
        async with await Client.connect_unix(socket) as shim:
            with pytest.raises(TtrpcError) as info:
                await shim.call("grpc.Health", "Check", b"")
        assert info.value.code == Code.FAILED_PRECONDITION
        assert "preempted or deleted by the cloud" in info.value.message
        await manager.stop_vm(SID)
        assert await node.store.get(SID) is None
    finally:
        await watcher.stop()
        await manager.close(0)
    assert cloud.leftovers() == []
