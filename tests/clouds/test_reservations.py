"""Reserved capacity is used only when the operator names it, and then the VM launches into it.

Sources: AWS EC2 Capacity Blocks for ML (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/
capacity-blocks-launch.html: RunInstances with `InstanceMarketOptions.MarketType`
`capacity-block` and `CapacityReservationSpecification.CapacityReservationTarget.
CapacityReservationId`); GCP consuming a specific reservation (https://cloud.google.com/compute/
docs/instances/reservations-consume: `reservationAffinity` `SPECIFIC_RESERVATION` with key
`compute.googleapis.com/reservation-name`). GCP sells A4 (B200) through reservations, Flex-start
and Spot, not on demand (docs/gpus.md, "How a type is sold").
"""

from __future__ import annotations

from typing import Any

import pytest

from adaptor.planning.placement import Placement
from providers.clouds.aws import AwsConfig, AwsProvider
from providers.clouds.gcp import GcpConfig, GcpProvider
from providers.clouds.retry import RetryPolicy
from providers.clouds.settings import AwsSettings, GcpSettings
from providers.core.capacity import CapacityType
from providers.core.contract import GpuIntent, VMIntent
from providers.core.errors import NoMatch
from providers.core.snapshots import load_catalog
from tests.clouds.conftest import loopback
from tests.clouds.fake_gce import FakeGce
from tests.clouds.scenarios import vm_spec
from tests.providers.fakes.gcp import COMPUTE, PROJECT


@pytest.fixture
def gce() -> FakeGce:
    return FakeGce()


B200 = VMIntent(pod_name="p", pod_namespace="n", gpu=GpuIntent(gpus=8, models=("b200",)))


def _gcp(gce: FakeGce, policy: RetryPolicy, reservation: str = "") -> GcpProvider:
    config = GcpConfig(
        project=PROJECT,
        zones=("us-central1-b",),
        image="projects/peerpods/global/images/podvm-gpu",
        policy=policy,
        capacity_reservation=reservation,
    )
    return GcpProvider(config, "owner", client=gce.client(), resolve=loopback)


async def test_without_a_named_reservation_an_a4_is_never_planned(
    gce: FakeGce, policy: RetryPolicy
) -> None:
    placement = Placement.for_provider(_gcp(gce, policy), load_catalog("gcp", "us-central1"))
    with pytest.raises(NoMatch, match="used only when the operator names it"):
        await placement.plan(B200, "s1")


async def test_a_named_reservation_plans_and_launches_the_a4_into_it(
    gce: FakeGce, policy: RetryPolicy
) -> None:
    gcp = _gcp(gce, policy, "b200-block")
    placement = Placement.for_provider(gcp, load_catalog("gcp", "us-central1"))
    plan = await placement.plan(B200, "s1")
    first = plan.candidates[0]
    assert (first.instance_type, first.vm.reservation) == ("a4-highgpu-8g", "b200-block")
    vm = await gcp.create(plan.vm_spec("#cloud-config\n"))
    assert vm.instance_type == "a4-highgpu-8g"
    [insert] = gce.cloud.seen("POST", rf"{COMPUTE}/zones/[^/]+/instances")
    body = insert.json()
    assert body["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["b200-block"],
    }
    assert body["scheduling"].get("provisioningModel", "STANDARD") != "SPOT"


async def test_a_spot_pod_buys_the_a4_as_spot_not_from_the_reservation(
    gce: FakeGce, policy: RetryPolicy
) -> None:
    placement = Placement.for_provider(
        _gcp(gce, policy, "b200-block"), load_catalog("gcp", "us-central1")
    )
    spot = B200.model_copy(update={"capacity_type": CapacityType.SPOT})
    plan = await placement.plan(spot, "s1")
    assert (plan.candidates[0].instance_type, plan.candidates[0].vm.reservation) == (
        "a4-highgpu-8g",
        "",
    )


async def test_aws_launches_a_capacity_block_type_into_the_block(
    ec2: Any, policy: RetryPolicy
) -> None:
    """RunInstances carries the block's id and the capacity-block market (moto accepts both;
    the parameters are checked as botocore sends them)."""
    sent: list[dict[str, Any]] = []
    ec2.meta.events.register(
        "provide-client-params.ec2.RunInstances", lambda params, **_: sent.append(dict(params))
    )
    config = AwsConfig(
        region="us-east-1",
        image_id="ami-0a1b2c3d4e5f60718",
        zones=("us-east-1a",),
        poll_interval_seconds=0.001,
        policy=policy,
        capacity_reservation="cr-0123456789abcdef0",
    )
    aws = AwsProvider(config, "owner", client=ec2, resolve=loopback)
    from providers.core.base import VMCandidate

    block = VMCandidate("p6e-gb200.36xlarge", reservation="cr-0123456789abcdef0")
    vm = await aws.create(vm_spec(1, candidates=(block,)))
    assert vm.instance_type == "p6e-gb200.36xlarge"
    assert sent[0]["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0123456789abcdef0"}
    }
    assert sent[0]["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    await aws.delete(vm.id)


def test_the_flag_reaches_the_providers() -> None:
    from providers.clouds import aws, gcp

    assert (
        aws.config_from_settings(
            AwsSettings(aws_region="us-east-1", capacity_reservation="cr-1")
        ).capacity_reservation
        == "cr-1"
    )
    assert (
        gcp.config_from_settings(
            GcpSettings(gcp_zones=("us-central1-b",), capacity_reservation="r")
        ).capacity_reservation
        == "r"
    )
