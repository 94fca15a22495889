"""Azure pod VM lifecycle through azure-mgmt-compute's own pipeline over a fake ARM."""

from __future__ import annotations

import base64
import random
from typing import Any

import pytest

from adaptor.hypervisor.gc import GarbageCollector
from providers.clouds.azure import AzureConfig, AzureProvider, vm_name
from providers.clouds.retry import FallbackExhausted, RetryPolicy
from providers.core.base import TAG_OWNER, TAG_POD_NAMESPACE, TAG_SANDBOX, VMSpec
from providers.core.errors import InvalidRequest, ProviderError
from tests.clouds.conftest import FORWARDER, Sleeps, loopback
from tests.clouds.fake_arm import RG, SUBNET, VMS, FakeArm, arm_error
from tests.clouds.scenarios import create_delete_cycles, sweep_unknown, vm_spec
from tests.providers.fakes.azure import SUBSCRIPTION

OWNER = "owner-node-a"
A100 = "Standard_NC24ads_A100_v4"
H100 = "Standard_NC40ads_H100_v5"


@pytest.fixture
def arm() -> FakeArm:
    return FakeArm()


def provider(arm: FakeArm, policy: RetryPolicy, owner: str = OWNER, **kw: Any) -> AzureProvider:
    settings: dict[str, Any] = {
        "subscription_id": SUBSCRIPTION,
        "resource_group": RG,
        "location": "eastus",
        "subnet_id": SUBNET,
        "image_id": "/subscriptions/x/resourceGroups/img/providers/Microsoft.Compute/images/podvm",
        "zones": ("1", "2"),
        "policy": policy,
    }
    settings.update(kw)
    compute, network = arm.clients()
    return AzureProvider(
        AzureConfig(**settings), owner, compute=compute, network=network, resolve=loopback
    )


def spec(n: int = 1, **kw: Any) -> VMSpec:
    return vm_spec(n, **{"candidates": (H100, A100), **kw})


async def test_create_and_delete_with_checked_request_body(
    arm: FakeArm, policy: RetryPolicy
) -> None:
    azure = provider(arm, policy)
    vm = await azure.create(spec(1))
    assert vm.addresses == (FORWARDER[0],) and vm.extra["cloud_address"].startswith("10.0.")
    assert vm.id == vm_name(f"{1:064x}") and vm.instance_type == H100 and vm.zone == "1"
    [put] = arm.cloud.seen("PUT", VMS + r"/[^/]+")
    body = put.json()
    assert body["tags"][TAG_OWNER] == OWNER and body["tags"][TAG_SANDBOX] == f"{1:064x}"
    assert body["tags"][TAG_POD_NAMESPACE] == "ml"
    props = body["properties"]
    # userData (read by the pod VM from IMDS, replaceable later), never the fixed customData
    assert base64.b64decode(props["userData"]).decode() == spec(1).user_data
    assert "customData" not in props["osProfile"]
    assert props["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
    nic = props["networkProfile"]["networkInterfaceConfigurations"][0]["properties"]
    assert nic["deleteOption"] == "Delete"
    assert nic["ipConfigurations"][0]["properties"]["subnet"]["id"] == SUBNET
    assert props["osProfile"]["linuxConfiguration"]["disablePasswordAuthentication"] is True
    assert [i.id for i in await azure.list_owned()] == [vm.id]
    await azure.delete(vm.id)
    assert arm.vms == {} and await azure.list_owned() == []
    await azure.delete(vm.id)


async def test_retried_create_finds_the_vm(arm: FakeArm, policy: RetryPolicy) -> None:
    azure = provider(arm, policy)
    first = await azure.create(spec(2))
    again = await azure.create(spec(2))
    assert again.id == first.id and len(arm.vms) == 1 and len(arm.puts()) == 1


async def test_allocation_failure_moves_zone_then_size_and_leaves_no_failed_vm(
    arm: FakeArm, policy: RetryPolicy
) -> None:
    azure = provider(arm, policy)

    def fault(action: str, body: dict[str, Any]) -> Any:
        if action != "put" or body["properties"]["hardwareProfile"]["vmSize"] != H100:
            return None
        if body["zones"] == ["1"]:
            return "AllocationFailed"  # async: the VM is left in Failed state
        return arm_error(409, "SkuNotAvailable", f"{H100} is not available in zone 2")

    arm.faults.append(fault)
    vm = await azure.create(spec(3))
    assert (vm.instance_type, vm.zone) == (A100, "1")
    assert arm.puts() == [(H100, "1"), (H100, "2"), (A100, "1")]
    assert list(arm.vms) == [vm.id]
    assert arm.vms[vm.id]["properties"]["provisioningState"] == "Succeeded"


async def test_quota_everywhere_lists_what_was_tried(arm: FakeArm, policy: RetryPolicy) -> None:
    azure = provider(arm, policy)
    arm.faults.append(
        lambda action, body: (
            arm_error(
                409,
                "QuotaExceeded",
                "Operation could not be completed as it results in exceeding approved quota",
            )
            if action == "put"
            else None
        )
    )
    with pytest.raises(FallbackExhausted) as info:
        await azure.create(spec(4))
    assert "4 attempt(s)" in str(info.value) and "QuotaExceeded" in str(info.value)
    assert f"{A100} in 2" in str(info.value)
    assert arm.vms == {}


async def test_throttling_retried(arm: FakeArm, policy: RetryPolicy, sleeps: Sleeps) -> None:
    azure = provider(arm, policy)
    left = [2]

    def fault(action: str, body: dict[str, Any]) -> Any:
        if action == "put" and left[0]:
            left[0] -= 1
            return arm_error(429, "TooManyRequests", "throttled")
        return None

    arm.faults.append(fault)
    vm = await azure.create(spec(5))
    assert vm.zone == "1" and len(sleeps.delays) == 2 and len(arm.vms) == 1


async def test_failure_after_create_deletes_the_vm(arm: FakeArm, policy: RetryPolicy) -> None:
    azure = provider(arm, policy)
    arm.faults.append(
        lambda action, body: (
            arm_error(400, "InvalidParameter", "custom data rejected") if action == "put" else None
        )
    )
    with pytest.raises(ProviderError, match="InvalidParameter"):
        await azure.create(spec(6))
    assert arm.vms == {}


async def test_custom_data_limit_counts_base64(arm: FakeArm, policy: RetryPolicy) -> None:
    azure = provider(arm, policy)
    with pytest.raises(InvalidRequest, match="65536"):
        await azure.create(spec(7, user_data="x" * (48 * 1024 + 1)))
    assert arm.puts() == []


async def test_gc_removes_only_our_orphans(arm: FakeArm, policy: RetryPolicy) -> None:
    azure = provider(arm, policy)
    kept = await azure.create(spec(20))
    await azure.create(spec(21))
    other = await provider(arm, policy, owner="owner-node-b").create(spec(22))

    async def known() -> set[str]:
        return {f"{20:064x}"}

    result = await GarbageCollector(provider(arm, policy), OWNER, known).sweep()
    assert len(result.deleted) == 1
    assert set(arm.vms) == {kept.id, other.id}


async def test_random_fault_cycles_leave_nothing(arm: FakeArm, sleeps: Sleeps) -> None:
    rng = random.Random(5)
    policy = RetryPolicy(rng=random.Random(3), sleep=sleeps, transient_retries=2)
    azure = provider(arm, policy)

    def chaos(action: str, body: dict[str, Any]) -> Any:
        roll = rng.random()
        if action == "put" and roll < 0.15:
            return "AllocationFailed"
        if roll < 0.3:
            return arm_error(429, "TooManyRequests", "throttled")
        return None

    arm.faults.append(chaos)
    created = await create_delete_cycles(azure, (spec(100 + n) for n in range(120)))
    assert created > 40
    arm.faults.clear()
    await sweep_unknown(azure, OWNER)
    assert arm.vms == {}
