"""GCP Spot pod VMs over a fake Compute Engine: SPOT + DELETE, fallback as asked, preemption."""

from __future__ import annotations

import pytest

from providers.clouds.retry import FallbackExhausted, RetryPolicy
from providers.core.capacity import TAG_CAPACITY_TYPE, CapacityType
from providers.core.errors import CapacityError
from providers.core.markets import NoSpotCapacity
from tests.clouds.fake_gce import FakeGce, quota_exceeded, stockout
from tests.clouds.test_gcp import INSERT, provider, spec


@pytest.fixture
def gce() -> FakeGce:
    return FakeGce()


BOTH_WAYS = ("a3-highgpu-8g", "a2-ultragpu-1g")  # sold on-demand and as Spot


def sent(gce: FakeGce) -> list[tuple[str, str, str]]:
    """(machine type, zone, provisioning model) of every insert."""
    out = []
    for request in gce.cloud.seen("POST", INSERT):
        body = request.json()
        model = body.get("scheduling", {}).get("provisioningModel", "STANDARD")
        machine = body["machineType"].rsplit("/", 1)[-1]
        out.append((machine, body["machineType"].split("/")[1], model))
    return out


async def test_spot_insert_is_spot_with_delete_on_termination(
    gce: FakeGce, policy: RetryPolicy
) -> None:
    vm = await provider(gce, policy).create(spec(1, capacity_type=CapacityType.SPOT))
    [insert] = gce.cloud.seen("POST", INSERT)
    body = insert.json()
    assert body["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    }
    assert body["disks"][0]["autoDelete"] is True
    assert body["labels"][TAG_CAPACITY_TYPE] == "spot" and vm.capacity_type == "spot"


async def test_on_demand_never_creates_spot(gce: FakeGce, policy: RetryPolicy) -> None:
    gce.faults.append(lambda action, zone, body: stockout(zone) if action == "insert" else None)
    with pytest.raises(FallbackExhausted):
        await provider(gce, policy).create(spec(2))
    assert len(sent(gce)) == 4 and {m for _, _, m in sent(gce)} == {"STANDARD"}
    assert gce.instances == {}


async def test_spot_or_on_demand_tries_every_spot_placement_first(
    gce: FakeGce, policy: RetryPolicy
) -> None:
    def no_spot(action: str, zone: str, body: dict[str, object]) -> object:
        scheduling = body.get("scheduling") or {}
        assert isinstance(scheduling, dict)
        if action == "insert" and scheduling.get("provisioningModel") == "SPOT":
            return stockout(zone) if zone.endswith("a") else quota_exceeded("PREEMPTIBLE_GPUS")
        return None

    gce.faults.append(no_spot)  # type: ignore[arg-type]
    either = CapacityType.SPOT_OR_ON_DEMAND
    vm = await provider(gce, policy).create(spec(3, capacity_type=either, candidates=BOTH_WAYS))
    assert sent(gce) == [
        ("a3-highgpu-8g", "us-central1-a", "SPOT"),
        ("a3-highgpu-8g", "us-central1-b", "SPOT"),
        ("a2-ultragpu-1g", "us-central1-a", "SPOT"),
        ("a2-ultragpu-1g", "us-central1-b", "SPOT"),
        ("a3-highgpu-8g", "us-central1-a", "STANDARD"),
    ]
    assert vm.capacity_type == "on-demand" and len(gce.instances) == 1


async def test_spot_only_never_falls_back(gce: FakeGce, policy: RetryPolicy) -> None:
    gce.faults.append(lambda action, zone, body: stockout(zone) if action == "insert" else None)
    with pytest.raises(NoSpotCapacity, match="ZONE_RESOURCE_POOL_EXHAUSTED"):
        await provider(gce, policy).create(spec(4, capacity_type=CapacityType.SPOT))
    assert {m for _, _, m in sent(gce)} == {"SPOT"} and gce.instances == {}


async def test_vm_stopped_by_the_cloud_is_reported_and_deleted(
    gce: FakeGce, policy: RetryPolicy
) -> None:
    gcp = provider(gce, policy)
    vm = await gcp.create(spec(5, capacity_type=CapacityType.SPOT))
    assert (await gcp.inspect(vm.id)).alive
    zone, name = vm.id.split("/")
    gce.instances[(zone, name)]["status"] = "TERMINATED"  # preempted with action STOP
    condition = await gcp.inspect(vm.id)
    assert not condition.alive
    assert "TERMINATED, stopped by the cloud (Spot preemption)" in condition.reason
    await gcp.purge(vm)
    assert gce.instances == {}  # the record, and with it its auto-delete boot disk
    gone = await gcp.inspect(vm.id)
    assert not gone.alive and "no longer exists" in gone.reason
    await gcp.purge(vm)


async def test_on_demand_fallback_skips_shapes_sold_only_as_spot(
    gce: FakeGce, policy: RetryPolicy
) -> None:
    # a3-highgpu-1g is Spot or Flex-start only: the fallback never asks for it on-demand.
    gce.faults.append(
        lambda action, zone, body: (
            stockout(zone)
            if action == "insert"
            and (body.get("scheduling") or {}).get("provisioningModel") == "SPOT"
            else None
        )
    )
    either = CapacityType.SPOT_OR_ON_DEMAND
    vm = await provider(gce, policy).create(spec(6, capacity_type=either))
    assert [m for _, _, m in sent(gce)] == ["SPOT"] * 4 + ["STANDARD"]
    assert sent(gce)[-1][0] == "a2-ultragpu-1g" and vm.capacity_type == "on-demand"
    with pytest.raises(CapacityError, match="cannot be created on-demand"):
        await provider(gce, policy).create(
            spec(7, capacity_type=either, candidates=("a3-highgpu-1g",))
        )
    assert gce.instances.keys() == {(vm.zone, vm.name)}
