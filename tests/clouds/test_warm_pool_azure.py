"""Warm pools on Azure (the repository's fake ARM, azure-mgmt-compute's own pipeline), behind the
latency-modelled cloud: warm VMs are tagged as the pool's (never a sandbox's) and deallocated
once their guest powered off; an adoption PATCHes the deallocated VM's userData and tags (the
sandbox's replace the pool's, before the start) and starts it; no VM is adopted twice, and a
failed adoption deletes the VM and leaves the pod to a cold launch."""

from __future__ import annotations

import asyncio
import base64
import random
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from adaptor.hypervisor.gc import GarbageCollector
from adaptor.state import StateStore
from adaptor.warmpool import Pool, PoolRecord, SlotState, WarmConfig, WarmPool
from providers.clouds.azure import AzureConfig, AzureProvider, warm_vm_name
from providers.clouds.retry import RetryPolicy
from providers.core.base import TAG_OWNER, TAG_SANDBOX, VMCandidate, VMSpec
from providers.core.errors import ProviderError
from providers.core.warm import (
    RUNNING,
    STOPPED,
    STOPPING,
    TAG_WARM_POOL,
    TAG_WARM_SLOT,
    WarmCapable,
    WarmSpec,
)
from tests.clouds.conftest import loopback
from tests.clouds.fake_arm import RG, SUBNET, VMS, FakeArm, arm_error
from tests.clouds.latency import LatencyCloud, LatencyModel
from tests.clouds.warm_userdata import warm_request
from tests.providers.fakes.azure import SUBSCRIPTION

OWNER = "warm-azure-owner"
ZONE = "1"
TYPE = "Standard_NC24ads_A100_v4"
IMAGE = "/subscriptions/x/resourceGroups/img/providers/Microsoft.Compute/images/podvm-gpu"
MODEL = LatencyModel(scale=0.001)


def azure(arm: FakeArm, **kw: Any) -> AzureProvider:
    compute, network = arm.clients()
    config = AzureConfig(
        subscription_id=SUBSCRIPTION,
        resource_group=RG,
        location="eastus",
        subnet_id=SUBNET,
        image_id=IMAGE,
        zones=(ZONE,),
        policy=RetryPolicy(rng=random.Random(1), base_delay_seconds=0.001),
        **kw,
    )
    return AzureProvider(config, OWNER, compute=compute, network=network, resolve=loopback)


@pytest.fixture
async def store() -> AsyncIterator[StateStore]:
    with tempfile.TemporaryDirectory() as directory:
        opened = await StateStore.open(Path(directory))
        yield opened
        await opened.close()


def pool_of(cloud: Any, store: StateStore, size: int = 2) -> WarmPool:
    return WarmPool(
        cloud,
        PoolRecord(store),
        WarmConfig(pools=(Pool(TYPE, size, ZONE),), interval_seconds=0.05),
        default_image=IMAGE,
        zones=(ZONE,),
    )


def spec(sandbox: str, user_data: str = "") -> VMSpec:
    return VMSpec(
        sandbox_id=sandbox,
        pod_namespace="default",
        pod_name=f"pod-{sandbox}",
        candidates=(VMCandidate(TYPE),),
        user_data=user_data or f"#cloud-config\n# pod {sandbox}\n",
    )


async def warm(pool: WarmPool, count: int) -> None:
    deadline = time.monotonic() + 20
    while sum(s.state is SlotState.WARM for s in pool.slots.values()) < count:
        assert time.monotonic() < deadline, "pool not warm"
        await asyncio.sleep(0.02)


def user_data(vm: dict[str, Any]) -> str:
    return base64.b64decode(vm["properties"]["userData"]).decode()


async def _none() -> list[str]:
    return []


async def test_azure_warm_vms_deallocate_and_are_adopted(store: StateStore) -> None:
    arm = FakeArm()
    cloud = LatencyCloud(azure(arm), MODEL)
    pool = pool_of(cloud, store)
    pool.start()
    try:
        await warm(pool, 2)
        assert len(arm.vms) == 2
        for name, vm in arm.vms.items():
            assert vm["_power"] == "PowerState/deallocated"
            assert vm["tags"][TAG_WARM_POOL] == OWNER and TAG_SANDBOX not in vm["tags"]
            assert name == warm_vm_name(vm["tags"][TAG_WARM_SLOT])
            assert vm["tags"][TAG_WARM_SLOT] in pool.slots
            assert vm["zones"] == [ZONE]
            assert vm["properties"]["hardwareProfile"]["vmSize"] == TYPE
            # no images listed: the warm boot pulls nothing and still powers off
            assert warm_request(user_data(vm)).images == ()
            assert "customData" not in vm["properties"]["osProfile"]
        # the sandbox orphan collector leaves them alone
        assert (await GarbageCollector(azure(arm), OWNER, _none).sweep()).deleted == []
        listed = await azure(arm).warm_vms()
        assert len(listed) == 2 and {vm.extra["power"] for vm in listed} == {STOPPED}
        pod = spec("sb-azure")
        instance = await pool.adopt(pod)
        assert instance is not None
        vm = arm.vms[instance.id]
        assert vm["_power"] == "PowerState/running"
        assert vm["tags"][TAG_SANDBOX] == "sb-azure" and vm["tags"][TAG_OWNER] == OWNER
        assert TAG_WARM_POOL not in vm["tags"] and TAG_WARM_SLOT not in vm["tags"]
        assert user_data(vm) == pod.user_data
        assert instance.tags[TAG_SANDBOX] == "sb-azure" and instance.addresses
        # userData and tags in one PATCH, before the start
        order = [
            (r.method, r.path.rsplit("/", 1)[-1])
            for r in arm.cloud.requests
            if r.method in ("PATCH", "POST") and instance.id in r.path
        ]
        # (the modelled guest's power-off is a deallocation too: ARM takes a second one)
        assert set(order[:-2]) == {("POST", "deallocate")}
        assert order[-2:] == [("PATCH", instance.id), ("POST", "start")]
        await warm(pool, 2)  # refilled
        assert cloud.warm_launches == 3
    finally:
        await pool.stop()
        await cloud.close()


async def test_no_azure_warm_vm_is_adopted_twice(store: StateStore) -> None:
    arm = FakeArm()
    cloud = LatencyCloud(azure(arm), MODEL)
    pool = pool_of(cloud, store)
    pool.start()
    try:
        await warm(pool, 2)
        await pool.stop()  # no refill: exactly two to hand out
        got = await asyncio.gather(*(pool.adopt(spec(f"c-{n}")) for n in range(6)))
    finally:
        await cloud.close()
    adopted = [i.id for i in got if i is not None]
    assert len(adopted) == 2 and len(set(adopted)) == 2
    sandboxes = sorted(vm["tags"][TAG_SANDBOX] for vm in arm.vms.values())
    assert len(sandboxes) == 2 and len(set(sandboxes)) == 2
    assert len(arm.cloud.seen("POST", VMS + r"/[^/]+/start")) == 2


async def test_failed_azure_adoptions_delete_the_vm_and_fall_back_cold(store: StateStore) -> None:
    arm = FakeArm()
    cloud = LatencyCloud(azure(arm), MODEL)
    pool = pool_of(cloud, store)
    pool.start()
    try:
        await warm(pool, 2)
        await pool.stop()
        # over Azure's 64 KiB of base64: refused before any call changes the VM
        assert await pool.adopt(spec("big", "x" * 60000)) is None
        assert arm.cloud.seen("PATCH", VMS + r"/[^/]+") == []
        # no capacity when the deallocated VM starts: its start fails, the VM is deleted
        arm.faults.append(lambda action, _body: "AllocationFailed" if action == "start" else None)
        assert await pool.adopt(spec("no-room")) is None
        assert arm.vms == {} and pool.slots == {}
        assert await PoolRecord(store).members() == {}
        # the pod's cold launch, as StartVM makes it after a miss
        arm.faults.clear()
        pod = spec("no-room")
        instance = await cloud.create(pod)
        assert cloud.creates == 1 and cloud.adoptions == 2
        vm = arm.vms[instance.id]
        assert vm["tags"][TAG_SANDBOX] == "no-room" and user_data(vm) == pod.user_data
    finally:
        await cloud.close()


async def test_a_powered_off_azure_vm_is_deallocated_before_it_counts_as_warm() -> None:
    """The guest's own power-off leaves the VM allocated (billed): the pool sees it stopped,
    deallocates it, and never adopts one that is not deallocated."""
    arm = FakeArm()
    provider = azure(arm)
    launched = await provider.launch_warm(WarmSpec("slot-a", TYPE, ZONE, IMAGE, "#cloud-config\n"))
    again = await provider.launch_warm(WarmSpec("slot-a", TYPE, ZONE, IMAGE))
    assert again.id == launched.id and again.extra["power"] == RUNNING  # found, not made twice
    assert len(arm.cloud.seen("PUT", VMS + r"/[^/]+")) == 1
    assert len(arm.vms) == 1
    with pytest.raises(ProviderError, match="running, not deallocated"):
        await provider.adopt_warm(launched.id, spec("early"))
    assert arm.cloud.seen("PATCH", VMS + r"/[^/]+") == []
    arm.power_off(launched.id)
    assert await provider.power_state(launched.id) == STOPPED
    [listed] = await provider.warm_vms()
    assert listed.extra["power"] == STOPPING  # a restarted pool watches it again
    await provider.stop_warm(launched.id)
    assert arm.vms[launched.id]["_power"] == "PowerState/deallocated"
    [listed] = await provider.warm_vms()
    assert listed.extra["power"] == STOPPED
    # a deallocation ARM refuses is the provider's error, not a warm VM
    arm.faults.append(
        lambda action, _body: (
            arm_error(409, "OperationNotAllowed", "busy") if action == "deallocate" else None
        )
    )
    arm.power_off(launched.id)
    with pytest.raises(ProviderError, match="OperationNotAllowed"):
        await provider.stop_warm(launched.id)


def test_a_deallocated_vm_bills_its_os_disk_tier() -> None:
    arm = FakeArm()
    # 30 GiB (the image's own): the E4 tier, $2.40 a month; 100 GiB: E10 (128 GiB), $9.60
    assert azure(arm).stopped_cost_per_hour(TYPE) == pytest.approx(2.40 / 730)
    assert azure(arm, os_disk_gib=100).stopped_cost_per_hour(TYPE) == pytest.approx(9.60 / 730)
    assert azure(arm).cannot_stop(TYPE) == ""
    # what `serve` checks before it keeps a pool (static and local are refused)
    assert isinstance(azure(arm), WarmCapable)


async def test_a_restart_deallocates_vms_that_powered_off_while_serve_was_down(
    store: StateStore,
) -> None:
    """serve gone between a warm VM's power-off and its deallocation: the next serve finds the
    VM powered off but allocated (still billing compute), deallocates it, launches nothing."""
    arm = FakeArm()
    first = LatencyCloud(azure(arm), MODEL, guests=False)  # the guests power off below
    pool = pool_of(first, store)
    pool.start()
    try:
        deadline = time.monotonic() + 20
        while len(arm.vms) < 2 or not all(s.instance_id for s in pool.slots.values()):
            assert time.monotonic() < deadline, "not launched"
            await asyncio.sleep(0.02)
    finally:
        await pool.stop()
        await first.close()
    names = set(arm.vms)
    for name in names:
        arm.power_off(name)
    second = LatencyCloud(azure(arm), MODEL, guests=False)
    again = pool_of(second, store)
    again.start()
    try:
        await warm(again, 2)
    finally:
        await again.stop()
        await second.close()
    assert set(arm.vms) == names and second.warm_launches == 0
    assert {vm["_power"] for vm in arm.vms.values()} == {"PowerState/deallocated"}
    assert {s.instance_id for s in again.slots.values()} == names
