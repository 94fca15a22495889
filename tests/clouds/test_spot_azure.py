"""Azure Spot pod VMs over a fake ARM: the body's Spot fields, fallback as asked, eviction."""

from __future__ import annotations

from typing import Any

import pytest

from providers.clouds.retry import FallbackExhausted, RetryPolicy
from providers.core.capacity import TAG_CAPACITY_TYPE, CapacityType
from providers.core.markets import NoSpotCapacity
from tests.clouds.fake_arm import VMS, FakeArm, arm_error
from tests.clouds.test_azure import A100, H100, provider, spec


@pytest.fixture
def arm() -> FakeArm:
    return FakeArm()


def sent(arm: FakeArm) -> list[tuple[str, str, str]]:
    """(size, zone, priority) of every VM PUT."""
    out = []
    for request in arm.cloud.seen("PUT", VMS + r"/[^/]+"):
        body = request.json()
        props = body["properties"]
        priority = props.get("priority", "Regular")
        out.append((props["hardwareProfile"]["vmSize"], (body.get("zones") or [""])[0], priority))
    return out


def no_spot_capacity(action: str, body: dict[str, Any]) -> Any:
    if action == "put" and body["properties"].get("priority") == "Spot":
        return "ZonalAllocationFailed"  # ARM reports it through the async operation
    return None


async def test_spot_body_is_priority_spot_evict_delete_any_price(
    arm: FakeArm, policy: RetryPolicy
) -> None:
    vm = await provider(arm, policy).create(spec(1, capacity_type=CapacityType.SPOT))
    [put] = arm.cloud.seen("PUT", VMS + r"/[^/]+")
    body = put.json()
    props = body["properties"]
    assert props["priority"] == "Spot" and props["evictionPolicy"] == "Delete"
    assert props["billingProfile"] == {"maxPrice": -1}
    assert props["storageProfile"]["osDisk"]["name"] == f"{vm.id}-osdisk"
    assert body["tags"][TAG_CAPACITY_TYPE] == "spot" and vm.capacity_type == "spot"


async def test_on_demand_never_creates_spot(arm: FakeArm, policy: RetryPolicy) -> None:
    arm.faults.append(lambda action, body: "AllocationFailed" if action == "put" else None)
    with pytest.raises(FallbackExhausted):
        await provider(arm, policy).create(spec(2))
    assert len(sent(arm)) == 4 and {p for _, _, p in sent(arm)} == {"Regular"}
    for request in arm.cloud.seen("PUT", VMS + r"/[^/]+"):
        props = request.json()["properties"]
        assert not {"priority", "evictionPolicy", "billingProfile"} & set(props)
    assert arm.vms == {}


async def test_spot_or_on_demand_tries_every_spot_placement_first(
    arm: FakeArm, policy: RetryPolicy
) -> None:
    arm.faults.append(no_spot_capacity)
    azure = provider(arm, policy)
    vm = await azure.create(spec(3, capacity_type=CapacityType.SPOT_OR_ON_DEMAND))
    assert sent(arm) == [
        (H100, "1", "Spot"),
        (H100, "2", "Spot"),
        (A100, "1", "Spot"),
        (A100, "2", "Spot"),
        (H100, "1", "Regular"),
    ]
    assert vm.capacity_type == "on-demand" and list(arm.vms) == [vm.id]
    assert arm.vms[vm.id]["properties"]["provisioningState"] == "Succeeded"


async def test_spot_only_never_falls_back(arm: FakeArm, policy: RetryPolicy) -> None:
    arm.faults.append(
        lambda action, body: (
            arm_error(
                409,
                "OperationNotAllowed",
                "Operation could not be completed as it results in exceeding approved "
                "LowPriorityCores quota",
            )
            if action == "put"
            else None
        )
    )
    with pytest.raises(NoSpotCapacity, match="LowPriorityCores"):
        await provider(arm, policy).create(spec(4, capacity_type=CapacityType.SPOT))
    assert {p for _, _, p in sent(arm)} == {"Spot"} and arm.vms == {}


async def test_evicted_vm_is_reported_and_its_leftovers_purged(
    arm: FakeArm, policy: RetryPolicy
) -> None:
    azure = provider(arm, policy)
    vm = await azure.create(spec(5, capacity_type=CapacityType.SPOT))
    assert (await azure.inspect(vm.id)).alive
    assert arm.nics == {f"{vm.id}-nic"} and arm.disks == {f"{vm.id}-osdisk"}
    arm.evict(vm.id, leave_nic_and_disk=True)
    condition = await azure.inspect(vm.id)
    assert not condition.alive and "no longer exists" in condition.reason
    await azure.purge(vm)
    assert arm.vms == {} and arm.nics == set() and arm.disks == set()
    await azure.purge(vm)


async def test_deallocated_vm_is_not_alive_and_purge_deletes_all(
    arm: FakeArm, policy: RetryPolicy
) -> None:
    azure = provider(arm, policy)
    vm = await azure.create(spec(6, capacity_type=CapacityType.SPOT))
    arm.deallocate(vm.id)
    condition = await azure.inspect(vm.id)
    assert not condition.alive and "PowerState/deallocated" in condition.reason
    await azure.purge(vm)
    assert arm.vms == {} and arm.nics == set() and arm.disks == set()
