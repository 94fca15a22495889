"""AWS Spot pod VMs against moto's EC2: the request's Spot fields, fallback as asked, preemption."""

from __future__ import annotations

from typing import Any

import pytest

from providers.clouds.retry import FallbackExhausted, RetryPolicy
from providers.core.base import TAG_OWNER, TAG_SANDBOX
from providers.core.capacity import TAG_CAPACITY_TYPE, CapacityType
from providers.core.markets import NoSpotCapacity
from tests.clouds.aws_faults import Faults
from tests.clouds.test_aws import OWNER, live, provider, spec

SPOT_FIELDS = {
    "InstanceMarketOptions.MarketType": "spot",
    "InstanceMarketOptions.SpotOptions.SpotInstanceType": "one-time",
    "InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior": "terminate",
}


def launches(faults: Faults) -> list[tuple[str, str, str]]:
    """(type, zone, market) of every RunInstances sent."""
    return [
        (
            p.get("InstanceType", ""),
            p.get("Placement.AvailabilityZone", ""),
            p.get("InstanceMarketOptions.MarketType", "on-demand"),
        )
        for a, p in faults.calls
        if a == "RunInstances"
    ]


def no_spot_capacity(action: str, params: dict[str, str]) -> str | None:
    if action == "RunInstances" and params.get("InstanceMarketOptions.MarketType") == "spot":
        return "InsufficientInstanceCapacity"
    return None


async def test_spot_request_carries_one_time_terminate(ec2: Any, policy: RetryPolicy) -> None:
    faults = Faults()
    faults.install(ec2)
    vm = await provider(ec2, policy).create(spec(1, capacity_type=CapacityType.SPOT))
    [(_, params)] = [c for c in faults.calls if c[0] == "RunInstances"]
    assert {k: params.get(k) for k in SPOT_FIELDS} == SPOT_FIELDS
    assert vm.capacity_type == "spot"
    [raw] = live(ec2)
    assert {t["Key"]: t["Value"] for t in raw["Tags"]}[TAG_CAPACITY_TYPE] == "spot"


async def test_on_demand_never_creates_spot(ec2: Any, policy: RetryPolicy) -> None:
    faults = Faults([lambda a, p: "InsufficientInstanceCapacity" if a == "RunInstances" else None])
    faults.install(ec2)
    with pytest.raises(FallbackExhausted):
        await provider(ec2, policy).create(spec(2))  # on-demand is the default
    sent = launches(faults)
    assert len(sent) == 4 and {market for _, _, market in sent} == {"on-demand"}
    assert not any(k.startswith("InstanceMarketOptions") for _, p in faults.calls for k in p)
    faults.rules.clear()
    vm = await provider(ec2, policy).create(spec(2, capacity_type=CapacityType.ON_DEMAND))
    assert vm.capacity_type == "on-demand"


async def test_spot_or_on_demand_tries_every_spot_placement_first(
    ec2: Any, policy: RetryPolicy
) -> None:
    faults = Faults([no_spot_capacity])
    faults.install(ec2)
    capacity = CapacityType.SPOT_OR_ON_DEMAND
    vm = await provider(ec2, policy).create(spec(3, capacity_type=capacity))
    assert launches(faults) == [
        ("p5.48xlarge", "us-east-1a", "spot"),
        ("p5.48xlarge", "us-east-1b", "spot"),
        ("p4d.24xlarge", "us-east-1a", "spot"),
        ("p4d.24xlarge", "us-east-1b", "spot"),
        ("p5.48xlarge", "us-east-1a", "on-demand"),
    ]
    assert (vm.instance_type, vm.zone, vm.capacity_type) == (
        "p5.48xlarge",
        "us-east-1a",
        "on-demand",
    )
    assert len(live(ec2)) == 1


async def test_spot_or_on_demand_takes_spot_when_there_is_some(
    ec2: Any, policy: RetryPolicy
) -> None:
    faults = Faults(
        [
            lambda a, p: (
                "UnfulfillableCapacity"
                if a == "RunInstances" and p.get("InstanceType") == "p5.48xlarge"
                else None
            )
        ]
    )
    faults.install(ec2)
    capacity = CapacityType.SPOT_OR_ON_DEMAND
    vm = await provider(ec2, policy).create(spec(4, capacity_type=capacity))
    assert (vm.instance_type, vm.capacity_type) == ("p4d.24xlarge", "spot")
    assert [m for _, _, m in launches(faults)] == ["spot"] * 3


async def test_spot_only_never_falls_back(ec2: Any, policy: RetryPolicy) -> None:
    faults = Faults([no_spot_capacity])
    faults.install(ec2)
    with pytest.raises(NoSpotCapacity, match="spot only") as info:
        await provider(ec2, policy).create(spec(5, capacity_type=CapacityType.SPOT))
    assert "p4d.24xlarge in us-east-1b" in str(info.value)
    assert [m for _, _, m in launches(faults)] == ["spot"] * 4
    assert live(ec2) == []


async def test_preempted_instance_is_reported_and_purged(ec2: Any, policy: RetryPolicy) -> None:
    aws = provider(ec2, policy)
    vm = await aws.create(spec(6, capacity_type=CapacityType.SPOT))
    assert (await aws.inspect(vm.id)).alive
    # A data volume the instance's termination does not take with it.
    tags = [{"Key": TAG_OWNER, "Value": OWNER}, {"Key": TAG_SANDBOX, "Value": f"{6:064x}"}]
    volume = ec2.create_volume(
        AvailabilityZone=vm.zone,
        Size=8,
        TagSpecifications=[{"ResourceType": "volume", "Tags": tags}],
    )["VolumeId"]
    ec2.terminate_instances(InstanceIds=[vm.id])  # EC2 takes the Spot capacity back
    condition = await aws.inspect(vm.id)
    assert not condition.alive and "terminated" in condition.reason and vm.id in condition.reason
    await aws.purge(vm)
    assert live(ec2) == []
    assert volume not in {v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]}
    await aws.purge(vm)  # nothing left: still fine
    missing = await aws.inspect("i-0123456789abcdef0")
    assert not missing.alive and "no longer exists" in missing.reason
